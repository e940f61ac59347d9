//! The `sendledger-bench` command: everything is in the library ([`sendledger_bench::main`]).

// The allocator of the `sendledger` binary, so that a service measured in this process
// allocates as a deployed one does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sendledger_bench::main()
}
