//! `sendledger inspect`: a task's timeline, from a ledger directory.

use std::path::PathBuf;

use clap::Args;
use sendledger_core::fold;
use sendledger_node::timeline::{parse_task, task_json, time};

use super::open_read_only;

#[derive(Args)]
pub struct InspectArgs {
    /// Task id (32 hex digits), or `tenant/operation/request_key` (a `/` inside a part
    /// written `%2F`, a `%` as `%25`).
    task: String,
    /// Ledger directory.
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// Print JSON instead of a timeline.
    #[arg(long)]
    json: bool,
}

/// Prints the timeline of one task.
pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let ledger = open_read_only(&args.data)?;
    let task = parse_task(&args.task)?;
    let events = ledger.task_events(task)?;
    anyhow::ensure!(
        !events.is_empty(),
        "task {task} is not in the ledger at {}",
        args.data.display()
    );
    let state = fold(&events);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&task_json(task, &state, &events))?
        );
        return Ok(());
    }
    println!(
        "task {task}: {} after {} events, {} attempts",
        state.phase.name(),
        events.len(),
        state.attempts
    );
    for e in &events {
        println!(
            "{}  #{:<3} {:<21} {}",
            time(e.at),
            e.task_seq,
            e.body.name(),
            e.body.summary(e.at)
        );
    }
    Ok(())
}
