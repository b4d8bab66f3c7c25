//! The `herald` binary: the command (src/cli.rs) with Herald's adapters.

fn main() -> std::process::ExitCode {
    herald::cli::main(herald::adapters())
}
