//! The `sendledger` command: the clap command line ([`cli`]) and one module per command. The
//! service and everything it runs live in the libraries (`sendledger_node` first); a command
//! parses its arguments, calls them and prints.
//!
//! The library target exists only so the workspace tests can run this very command line as a
//! child process built with their features (`tests/src/bin/sendledger_cli.rs`); nothing else
//! depends on it.

pub mod cli;
mod commands;
