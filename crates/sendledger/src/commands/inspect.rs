//! `sendledger inspect`: a task's timeline, from a ledger directory.

use std::path::PathBuf;

use anyhow::Context;
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
    /// Retention's archive (`storage.archive`): the events retention removed of the task are
    /// read from it and shown in place of what the ledger kept of them.
    #[arg(long, value_name = "DIR")]
    archive: Option<PathBuf>,
}

/// Prints the timeline of one task.
pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let ledger = open_read_only(&args.data)?;
    let task = parse_task(&args.task)?;
    let mut events = ledger.task_events(task)?;
    if let Some(dir) = &args.archive {
        let archived = sendledger_store::archive::archived_history(dir, task)
            .with_context(|| format!("reading the archive in {}", dir.display()))?;
        // What the ledger kept of a removed task stands for the archived events; a task
        // forgotten and then run again has a history of its own.
        let removed = events
            .first()
            .is_none_or(|e| matches!(e.body, sendledger_core::EventBody::Pruned { .. }));
        if removed && !archived.is_empty() {
            events.splice(0..events.len().min(1), archived);
        }
    }
    anyhow::ensure!(
        !events.is_empty(),
        "task {task} is not in the ledger at {}{}",
        args.data.display(),
        args.archive.as_ref().map_or(String::new(), |a| format!(
            " nor in the archive at {}",
            a.display()
        ))
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
