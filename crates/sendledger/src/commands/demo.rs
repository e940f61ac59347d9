//! `sendledger demo`: the whole pipeline on embedded defaults (see [`sendledger_node::demo`]).

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct DemoArgs {
    /// Distinct requests (tasks).
    #[arg(long, default_value_t = 10_000)]
    tasks: u64,
    /// Share of requests delivered twice.
    #[arg(long, default_value_t = 0.2)]
    duplicates: f64,
    /// Seed of the remote's faults and of the delivery order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Ledger directory (a temporary one by default). Inspect or audit it afterwards.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Run a three-step operation (reserve, charge, ship) at five simulated remotes instead,
    /// the shipment refused for one task in five: those tasks' reservation and charge are
    /// undone (released, refunded) once each.
    #[arg(long)]
    saga: bool,
}

/// Runs the demo; `Ok(false)` when an invariant failed.
pub fn run(args: DemoArgs) -> anyhow::Result<bool> {
    sendledger_node::demo::run(sendledger_node::demo::DemoArgs {
        tasks: args.tasks,
        duplicates: args.duplicates,
        seed: args.seed,
        data: args.data,
        saga: args.saga,
    })
}
