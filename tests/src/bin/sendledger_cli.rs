//! The `sendledger` command, built with the tests' features (the store's fault injection):
//! what the tests run as a child process wherever a user would run `sendledger`.

fn main() -> std::process::ExitCode {
    sendledger::cli::main()
}
