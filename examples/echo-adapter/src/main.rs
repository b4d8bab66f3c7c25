//! `herald-echo`: herald with its three adapters plus the echo adapter,
//! the one line a fourth protocol adds.

fn main() -> std::process::ExitCode {
    let mut adapters = herald::adapters();
    adapters.push(std::sync::Arc::new(herald_echo_adapter::Echo));
    herald::cli::main(adapters)
}
