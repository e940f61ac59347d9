//! The `sendledger-bench` command, built with the tests' features (see `sendledger_cli.rs`).

fn main() -> std::process::ExitCode {
    sendledger_bench::main()
}
