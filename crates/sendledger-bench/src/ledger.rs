//! `sendledger-bench ledger`: durable appends per second, and the request every benchmark uses.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sendledger_core::{EventBody, Limits, NewEvent, Source, TaskRequest};
use sendledger_store::{Append, Durability, Ledger, LedgerOptions};

#[derive(Args)]
pub struct LedgerArgs {
    /// Concurrent appenders in the group-commit run.
    #[arg(long, default_value_t = 256)]
    appenders: usize,
    /// Length of each measured run, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Directory for the benchmark ledgers (a temporary directory by default). Use the disk
    /// the service will run on: fsync latency is what is measured.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The `n`-th request of every benchmark, for `target`.
pub fn bench_request(n: u64, target: &str) -> TaskRequest {
    TaskRequest {
        tenant: "bench".into(),
        operation: "payment.create".into(),
        request_key: format!("ord-{n}"),
        target: target.into(),
        payload: serde_json::json!({"order": n, "amount": 1250, "currency": "EUR", "customer": "c-8812"}),
        payload_text: None,
        metadata: Default::default(),
        version: 0,
    }
}

/// A realistic first append of a task: its acceptance and its first intent.
fn task_append(n: u64) -> Append {
    let request = bench_request(n, "payments")
        .accept(&Limits::default())
        .expect("valid bench request");
    let task_id = request.task_id();
    let payload_hash = request.payload_hash();
    let source = Source {
        topic: "sendledger.requests".into(),
        partition: 0,
        offset: n as i64,
    };
    Append {
        events: vec![NewEvent {
            task_id,
            task_seq: 0,
            at: 0,
            body: EventBody::TaskAccepted {
                request,
                payload_hash,
                source,
            },
        }],
        offsets: vec![("sendledger.requests".into(), 0, n as i64)],
        ..Append::default()
    }
}

struct Run {
    appends: u64,
    per_sec: f64,
    fsyncs_per_append: f64,
}

fn measure(
    dir: &std::path::Path,
    durability: Durability,
    appenders: usize,
    seconds: f64,
) -> anyhow::Result<Run> {
    let ledger = Ledger::open(
        dir,
        LedgerOptions {
            durability,
            ..LedgerOptions::default()
        },
    )
    .context("opening the bench ledger")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let appends: u64 = runtime.block_on(async {
        let mut handles = Vec::new();
        for w in 0..appenders as u64 {
            let ledger = ledger.clone();
            handles.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    ledger.append(task_append(w << 32 | n)).await?;
                    n += 1;
                }
                anyhow::Ok(n)
            }));
        }
        let mut total = 0;
        for h in handles {
            total += h.await??;
        }
        anyhow::Ok(total)
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let batches = ledger.stats().batches.load(Ordering::Relaxed);
    Ok(Run {
        appends,
        per_sec: appends as f64 / elapsed,
        fsyncs_per_append: batches as f64 / appends.max(1) as f64,
    })
}

/// `sendledger-bench ledger`: group commit against one fsync per append, and no fsync.
pub fn run(args: LedgerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.appenders > 0, "--appenders must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let group = measure(
        &base.path().join("group"),
        Durability::Sync,
        args.appenders,
        args.seconds,
    )?;
    let single = measure(
        &base.path().join("single"),
        Durability::Sync,
        1,
        args.seconds,
    )?;
    let buffered = measure(
        &base.path().join("buffered"),
        Durability::Buffered,
        args.appenders,
        args.seconds,
    )?;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let report = serde_json::json!({
        "bench": "ledger",
        "appenders": args.appenders,
        "seconds_per_run": args.seconds,
        "appends_per_sec_group_commit": round(group.per_sec),
        "appends_per_sec_one_sync_each": round(single.per_sec),
        "ratio": round(group.per_sec / single.per_sec),
        "fsyncs_per_append": (group.fsyncs_per_append * 10_000.0).round() / 10_000.0,
        "fsyncs_per_append_one_sync_each": round(single.fsyncs_per_append),
        "fsync_ms_one_sync_each": round(1_000.0 / single.per_sec),
        "appends_per_sec_buffered_no_fsync": round(buffered.per_sec),
        "appends_measured": { "group_commit": group.appends, "one_sync_each": single.appends, "buffered": buffered.appends },
    });
    println!("{report}");
    Ok(())
}
