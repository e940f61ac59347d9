use std::process::ExitCode;

fn main() -> ExitCode {
    sendledger::cli::main()
}
