//! A remote that goes down in the middle of a steady stream of tasks, and what the tasks end
//! as: the engine (real RocksDB) against the simulated remote over real sockets, the outage
//! switched on and off at run time. The integration tests run it short and assert; the
//! outage soak (`tests/soak/outage.rs`) runs it for minutes, with and without the breaker,
//! and reports the numbers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sendledger_core::{EventBody, Phase};
use sendledger_sim::{Faults, Sim, SimConfig};
use serde::Serialize;

use crate::engine::{request, settled, source, start, target, task_id};

/// What the remote does during the outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outage {
    /// Connections are refused: nothing listens.
    Refused,
    /// Each POST is read and its connection closed, unanswered (nothing created).
    Dropped,
    /// Each POST is answered 503 without `Retry-After` (nothing created).
    Unavailable,
    /// Each POST is read and never answered, until the client's request timeout (nothing
    /// created).
    Hung,
}

impl Outage {
    pub const ALL: [Outage; 4] = [
        Outage::Refused,
        Outage::Dropped,
        Outage::Unavailable,
        Outage::Hung,
    ];
}

/// One run: `tasks` submitted evenly over `submit_for`; the outage starts `outage_at` after
/// the first and lasts `outage_for`.
#[derive(Debug, Clone, Serialize)]
pub struct OutageRun {
    pub kind: Outage,
    pub tasks: usize,
    pub submit_for: Duration,
    pub outage_at: Duration,
    pub outage_for: Duration,
    /// The target's breaker and `lookup.complete_after` (off: what the service did before
    /// either existed).
    pub breaker: bool,
    /// How long after the remote is back every task must have settled.
    pub settle_within: Duration,
}

/// What the tasks ended as.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OutageReport {
    pub tasks: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub manual_review: usize,
    /// Neither settled nor terminal when the run gave up waiting.
    pub unsettled: usize,
    /// Identities with more than one record at the remote.
    pub duplicates: usize,
    /// Succeeded tasks without a record at the remote, or naming another one.
    pub wrong_remote_id: usize,
    /// POSTs the remote received while it was down.
    pub posts_during_outage: u64,
    /// From the remote's return until every task settled (or the run gave up).
    pub drain_ms: u64,
    /// Waits recorded before an intent (`SendDeferred`), and tasks with at least one.
    pub waits: usize,
    pub tasks_that_waited: usize,
    /// Times the target's breaker opened.
    pub breaker_opened: u64,
    pub attempts: u64,
}

/// The target of a run: the test target with the default retry policy (8 attempts from
/// 100 ms), a 1 s request timeout, a 20 s observation window, and, with `breaker`, a breaker
/// that opens after 5 calls, probes every second, and takes an attempt running for 500 ms as
/// failing, and lookups declared complete after 2 s (at most 3 resends on that proof).
fn outage_target(base: &str, breaker: bool) -> sendledger_effects::TargetConfig {
    target(base, |t| {
        t["request_timeout"] = "1s".into();
        t["retry"] = serde_json::json!({});
        t["lookup"]["deadline"] = "20s".into();
        t["lookup"]["check_interval"] = "500ms".into();
        if breaker {
            t["breaker"] = serde_json::json!({
                "window_calls": 10,
                "minimum_calls": 5,
                "open_for": "1s",
                "slow_after": "500ms",
            });
            t["lookup"]["complete_after"] = "2s".into();
            // A task can be the half-open probe of an outage more than once.
            t["lookup"]["max_policy_resends"] = 3.into();
        } else {
            t["breaker"] = serde_json::json!({ "enabled": false });
        }
    })
}

pub async fn run(run: &OutageRun) -> OutageReport {
    let sim = Sim::start(SimConfig::default())
        .await
        .expect("simulated remote");
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = outage_target(&sim.base_url(), run.breaker);
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    let keys: Vec<String> = (0..run.tasks).map(|i| format!("o-{i}")).collect();
    let gap = run.submit_for / run.tasks.max(1) as u32;
    let started = Instant::now();
    let (mut down, mut back) = (false, None);
    let mut posts_before = 0;
    let mut posts_during_outage = 0;
    for (i, key) in keys.iter().enumerate() {
        let elapsed = started.elapsed();
        if !down && elapsed >= run.outage_at {
            posts_before = sim.stats().posts;
            begin(&sim, run.kind).await;
            down = true;
        }
        if down && back.is_none() && elapsed >= run.outage_at + run.outage_for {
            posts_during_outage = sim.stats().posts - posts_before;
            end(&sim, run.kind).await;
            back = Some(Instant::now());
        }
        engine
            .submit(request(key), source(i as i64))
            .await
            .expect("request recorded");
        let next = started + gap * (i as u32 + 1);
        tokio::time::sleep_until(next.into()).await;
    }
    if back.is_none() {
        tokio::time::sleep_until((started + run.outage_at + run.outage_for).into()).await;
        posts_during_outage = sim.stats().posts - posts_before;
        end(&sim, run.kind).await;
        back = Some(Instant::now());
    }
    let back = back.expect("the remote came back");
    let give_up = back + run.settle_within;
    let mut report = OutageReport {
        tasks: run.tasks,
        posts_during_outage,
        ..OutageReport::default()
    };
    let mut states = BTreeMap::new();
    for key in &keys {
        loop {
            let state = engine.state(task_id(key)).await.expect("read task");
            if settled(&state) || Instant::now() > give_up {
                states.insert(key.clone(), state);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    report.drain_ms = back.elapsed().as_millis() as u64;
    for (key, state) in &states {
        match state.phase {
            Phase::Succeeded => report.succeeded += 1,
            Phase::Failed => report.failed += 1,
            Phase::ManualReview => report.manual_review += 1,
            _ => report.unsettled += 1,
        }
        report.attempts += u64::from(state.attempts);
        let records = sim.records_with_identity(key);
        if records.len() > 1 {
            report.duplicates += 1;
        }
        if state.phase == Phase::Succeeded
            && (records.len() != 1 || state.remote_id.as_deref() != Some(records[0].id.as_str()))
        {
            report.wrong_remote_id += 1;
        }
        let events = engine.events(task_id(key)).await.expect("read events");
        let waits = events
            .iter()
            .filter(|e| matches!(e.body, EventBody::SendDeferred { .. }))
            .count();
        report.waits += waits;
        report.tasks_that_waited += usize::from(waits > 0);
    }
    report.breaker_opened = engine.target_health().iter().map(|t| t.opened).sum::<u64>();
    engine.shutdown(Duration::from_secs(5)).await;
    sim.shutdown().await;
    report
}

async fn begin(sim: &Sim, kind: Outage) {
    let faults = match kind {
        Outage::Refused => {
            sim.set_offline(true).await.expect("remote offline");
            return;
        }
        Outage::Dropped => Faults {
            drop: 1.0,
            ..Faults::default()
        },
        Outage::Unavailable => Faults {
            error: 1.0,
            error_status: 503,
            ..Faults::default()
        },
        Outage::Hung => Faults {
            hang: 1.0,
            ..Faults::default()
        },
    };
    sim.set_faults(faults).expect("valid faults");
}

async fn end(sim: &Sim, kind: Outage) {
    match kind {
        Outage::Refused => sim.set_offline(false).await.expect("remote back online"),
        _ => sim.set_faults(Faults::default()).expect("valid faults"),
    }
}
