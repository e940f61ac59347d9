//! One module per command of the `sendledger` binary: each parses its arguments with clap and
//! calls the libraries (the service itself is `sendledger_node`).

use std::io::Write;
use std::path::Path;

use sendledger_store::{Error as StoreError, Ledger};

pub mod audit;
pub mod check_broker;
pub mod demo;
pub mod inspect;
pub mod offsets;
pub mod produce;
pub mod review;
pub mod run;
pub mod sim_remote;

/// A `--kafka-property KEY=VALUE` argument.
pub fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// Opens the ledger read-only: these commands create and change nothing where they point.
pub fn open_read_only(data: &Path) -> anyhow::Result<Ledger> {
    Ledger::open_read_only(data).map_err(|e| match e {
        StoreError::NoLedger { .. } => anyhow::anyhow!("{e}; pass --data DIR"),
        e => anyhow::Error::new(e).context(format!("opening the ledger at {}", data.display())),
    })
}

/// Writes `line` on stdout for whoever waits for it. A server must not stop because nobody
/// reads its stdout (a closed pipe is EPIPE, since Rust ignores SIGPIPE; `println!` would
/// panic), so a failed write is logged and the server goes on.
pub fn print_line(line: &str) {
    if let Err(e) = writeln!(std::io::stdout(), "{line}") {
        tracing::warn!(error = %e, "cannot write to stdout; going on without it");
    }
}
