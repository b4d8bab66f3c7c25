//! The `herald` binary: the command (src/cli.rs) with Herald's adapters.

/// jemalloc, not the system's malloc: after a spike (clients asking for
/// large history answers, a burst of connections) glibc's malloc kept the
/// peak resident with nothing left using it; jemalloc's background thread
/// hands freed pages back to the system within seconds, idle or not
/// (bench/RESULTS.md, "Memory after a history spike"). The settings: purge dirty
/// pages a second after they are freed, without a second "muzzy" stage,
/// from a background thread rather than on the next allocation (an idle
/// server allocates nothing). `_RJEM_MALLOC_CONF` overrides them.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options (a C string it reads at start).
#[cfg(not(target_env = "msvc"))]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: Conf =
    Conf(c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

#[cfg(not(target_env = "msvc"))]
#[repr(transparent)]
struct Conf(*const std::ffi::c_char);

// SAFETY: a pointer to a constant string, never written.
#[cfg(not(target_env = "msvc"))]
unsafe impl Sync for Conf {}

fn main() -> std::process::ExitCode {
    herald::cli::main(herald::adapters())
}
