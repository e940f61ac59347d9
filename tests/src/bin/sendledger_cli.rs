fn main() -> std::process::ExitCode {
    sendledger::cli::main()
}
