//! Operator commands on a ledger directory: `inspect` and `audit`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sendledger_core::fold;
use sendledger_store::{Ledger, LedgerOptions};

use crate::timeline::{parse_task, task_json, time};

#[derive(Args)]
pub struct InspectArgs {
    /// Task id (32 hex digits), or `tenant/operation/request_key`.
    task: String,
    /// Ledger directory.
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// Print JSON instead of a timeline.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AuditArgs {
    /// Ledger directory.
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn open(data: &PathBuf) -> anyhow::Result<Ledger> {
    anyhow::ensure!(
        data.exists(),
        "no ledger at {}; pass --data DIR",
        data.display()
    );
    Ledger::open(data, LedgerOptions::default())
        .with_context(|| format!("opening the ledger at {}", data.display()))
}

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let ledger = open(&args.data)?;
    let task = parse_task(&args.task)?;
    let events = ledger.task_events(task)?;
    anyhow::ensure!(
        !events.is_empty(),
        "task {task} is not in the ledger at {}",
        args.data.display()
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&task_json(task, &events))?
        );
        return Ok(());
    }
    let state = fold(&events);
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

/// Returns whether the ledger is clean.
pub fn audit(args: AuditArgs) -> anyhow::Result<bool> {
    let ledger = open(&args.data)?;
    let last = ledger.last_lsn().max(1);
    let report = sendledger_store::audit(&ledger, |n| {
        if !args.json {
            eprint!(
                "\raudit: {n} of {last} events ({:.0}%)",
                n as f64 * 100.0 / last as f64
            );
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(report.is_clean());
    }
    eprintln!();
    println!(
        "events {}   tasks {}   attempts {}",
        report.events, report.tasks, report.attempts
    );
    for (state, n) in &report.tasks_by_state {
        println!("  {state:<14} {n}");
    }
    println!(
        "unknown outcomes {} (after a crash {}): by lookup {}, by same-key resend {}, by authorized resend {}, by operator {}, open {}",
        report.unknown_outcomes,
        report.recovered_after_crash,
        report.unknowns_resolved_by_lookup,
        report.unknowns_resolved_by_same_key_resend,
        report.unknowns_resolved_by_authorized_resend,
        report.unknowns_resolved_by_operator,
        report.unknowns_open
    );
    println!(
        "manual reviews open {}   duplicates dropped {}   conflicts {}   rejected inputs {}",
        report.manual_reviews_open,
        report.duplicates_dropped,
        report.conflicts,
        report.rejected_inputs
    );
    if report.is_clean() {
        println!("violations: none");
    } else {
        println!("violations: {}", report.violations.len());
        for v in &report.violations {
            println!(
                "  {} task={} lsns={:?}: {}",
                v.rule,
                v.task_id.as_deref().unwrap_or("-"),
                v.lsns,
                v.detail
            );
        }
    }
    Ok(report.is_clean())
}
