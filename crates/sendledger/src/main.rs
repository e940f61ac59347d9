//! The `sendledger` binary: everything is in the library ([`sendledger::cli`]).

fn main() -> std::process::ExitCode {
    sendledger::cli::main()
}
