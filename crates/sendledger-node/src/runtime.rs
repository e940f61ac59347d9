//! The process a service runs in: its tokio runtime, its allocator setting and its stop
//! signals. `run`, `sim-remote`, the demo and the benchmarks that run a service in their own
//! process all use these, so a measured service has the same threads as a deployed one.

use crate::error::{Error, Result};

/// The runtime a service runs on.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
        .map_err(|source| Error::Process {
            what: "starting the runtime",
            source,
        })
}

/// Threads for blocking work (ledger reads, broker calls), at most. Ledger reads are short
/// and bound by the CPU: more threads than this only queue for the cores, and each keeps a
/// stack and allocator pages of its own (with tokio's default, 512, a service taking 3,000
/// requests per second ran 147 of them).
const MAX_BLOCKING_THREADS: usize = 16;

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h`; the Rust bindings have no constant
/// for it): how many milliseconds freed memory is kept before it is returned to the OS.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A long-running service returns freed memory to the OS at once instead of 10 ms later
/// (mimalloc's default), so its resident memory follows what it holds: measured with 300,000
/// tasks through Kafka at 3,000 per second, a peak RSS of 209 MiB against 250 to 296 MiB,
/// at the same throughput. Only meaningful in a process whose allocator is mimalloc.
pub fn return_freed_memory_at_once() {
    // SAFETY: sets one of mimalloc's runtime options, which it reads atomically.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0)
    };
}

/// Installs the SIGINT and SIGTERM handlers, and returns what resolves on the first of them
/// with its name. The handlers are in place when this returns, before "ready" is printed: a
/// signal sent right after it is never met by the default action (the process killed
/// without a clean stop).
pub fn shutdown_signal() -> Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind, what| signal(kind).map_err(|source| Error::Process { what, source });
    let mut term = handler(SignalKind::terminate(), "installing the SIGTERM handler")?;
    let mut int = handler(SignalKind::interrupt(), "installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Turns transparent huge pages off for this process (and the children it starts). mimalloc
/// asks for them on its memory and returns freed parts of it to the OS, so each touch of such
/// a part again faulted in and zeroed a whole 2 MiB page, and every page touched counted 2 MiB
/// of RSS. Measured, one binary with and one without, alternating: `sendledger-bench kafka` (20,000
/// tasks, three pairs) peaked at 257-279 MiB against 326-406 MiB, with 1.3-1.5 s of system
/// CPU against 2.3-3.3 s; the service alone (300,000 tasks at 3,000/s) at 128 MiB against 190.
pub fn no_transparent_huge_pages() {
    // SAFETY: prctl(PR_SET_THP_DISABLE) sets a flag of this process's memory and takes no
    // pointers. A kernel without it (before 3.15) refuses, and the process runs as before.
    #[allow(unsafe_code)]
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0)
    };
}
