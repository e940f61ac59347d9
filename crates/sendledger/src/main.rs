//! The `sendledger` binary: everything is in the library ([`sendledger::cli`]).

// Replay (audit, recovery) allocates and frees many small strings per event; mimalloc does
// that markedly faster than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sendledger::cli::main()
}
