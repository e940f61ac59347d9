//! The engine SIGKILLed mid-flight, restarted, killed again: no identity ever gets a second
//! record, every task ends settled (terminal, or in review with a reason), and the log obeys
//! every rule.

use std::time::Duration;

use sendledger_core::{check_task, EventBody, Phase, UnknownCause};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::engine::{target, task_id};
use sendledger_tests::kill::{kill_and_restart, Kills};

struct Run {
    seed: u64,
    tasks: usize,
    kills: usize,
    /// After the remote sees the first create of a run, the kill comes within this many ms.
    kill_within_ms: u64,
    sim: SimConfig,
}

/// Summary of a finished run, for the assertions and the test output.
#[derive(Debug, Default)]
struct Outcome {
    kills: usize,
    succeeded: usize,
    review: usize,
    failed: usize,
    recovered_unknowns: usize,
    resolved_by_lookup: usize,
}

async fn run(r: Run) -> Outcome {
    let sim = Sim::start(r.sim.clone()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = serde_json::to_string(&target(&sim.base_url(), |t| {
        t["retry"]["max_attempts"] = 10.into()
    }))
    .unwrap();
    let prefix = format!("k{}", r.seed);
    let kills = Kills {
        exe: env!("CARGO_BIN_EXE_engine_child"),
        args: vec![
            dir.path().to_str().unwrap().to_string(),
            target,
            prefix.clone(),
            r.tasks.to_string(),
            r.seed.to_string(),
        ],
        seed: r.seed,
        kills: r.kills,
        kill_within_ms: r.kill_within_ms,
    };
    let kills = match kill_and_restart(kills, || sim.stats().requests).await {
        Ok(kills) => kills,
        Err(e) => panic!("{e}; ledger kept at {}", dir.keep().display()),
    };

    let stats = sim.stats();
    assert_eq!(
        stats.duplicates, 0,
        "an identity got a second record: {stats:?}"
    );
    let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
    // The whole log replays clean: contiguous LSNs, every event indexed, summaries agree.
    let audit = sendledger_store::audit(&ledger, Default::default(), |_| {}).unwrap();
    assert!(audit.is_clean(), "audit: {:?}", audit.violations);
    let mut outcome = Outcome {
        kills,
        ..Outcome::default()
    };
    for i in 0..r.tasks {
        let key = format!("{prefix}-{i}");
        let events = ledger.task_events(task_id(&key)).unwrap();
        let (state, violations) = check_task(&events, Default::default());
        assert!(violations.is_empty(), "{key}: {violations:?}");
        let records = sim.records_with_identity(&key);
        assert!(records.len() <= 1, "{key}: {} records", records.len());
        match state.phase {
            Phase::Succeeded => {
                outcome.succeeded += 1;
                assert_eq!(records.len(), 1, "{key} succeeded without a record");
                assert_eq!(
                    state.remote_id.as_deref(),
                    Some(records[0].id.as_str()),
                    "{key}"
                );
            }
            Phase::ManualReview => {
                outcome.review += 1;
                assert!(
                    state.review_reason.is_some(),
                    "{key}: review without a reason"
                );
            }
            Phase::Failed => {
                outcome.failed += 1;
                assert!(
                    records.is_empty(),
                    "{key} failed but the remote holds its record"
                );
            }
            other => panic!("{key} ended {other:?}"),
        }
        for e in &events {
            match &e.body {
                EventBody::SendUnknown {
                    cause: UnknownCause::Recovery,
                    ..
                } => outcome.recovered_unknowns += 1,
                EventBody::Confirmed {
                    evidence: sendledger_core::Evidence::Lookup,
                    ..
                } => outcome.resolved_by_lookup += 1,
                _ => {}
            }
        }
    }
    eprintln!("seed {}: {outcome:?}; remote: {stats:?}", r.seed);
    outcome
}

/// Kills land between `SendIntended` and the remote's answer: the slow remote keeps every
/// attempt in flight for 200–400 ms. On restart those tasks are reconciled, never resent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_flight_never_duplicates() {
    let base = crate::seed(7);
    for seed in base..base + 3 {
        let sim = SimConfig {
            seed,
            faults: Faults {
                latency: Duration::from_millis(200),
                latency_jitter: Duration::from_millis(200),
                ..Faults::default()
            },
            ..SimConfig::default()
        };
        let outcome = run(Run {
            seed,
            tasks: 60,
            kills: 2,
            kill_within_ms: 150,
            sim,
        })
        .await;
        assert!(
            outcome.recovered_unknowns >= 1,
            "no kill landed between intent and answer: {outcome:?}"
        );
        assert_eq!(outcome.succeeded + outcome.review, 60, "{outcome:?}");
    }
}

/// 2,000 tasks against a remote that drops 10% of answers after committing, hangs on 5%,
/// throttles 5%, and shows records only after a lag — with three SIGKILL restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_faults_and_restarts() {
    let seed = crate::seed(2_000);
    let sim = SimConfig {
        seed,
        lookup_lag: Duration::from_millis(300),
        faults: Faults {
            commit_then_drop: 0.10,
            commit_then_hang: 0.05,
            throttle: 0.05,
            retry_after: Duration::from_secs(1),
            latency_jitter: Duration::from_millis(20),
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let outcome = run(Run {
        seed,
        tasks: 2_000,
        kills: 3,
        kill_within_ms: 400,
        sim,
    })
    .await;
    assert_eq!(outcome.kills, 3, "{outcome:?}");
    assert!(outcome.resolved_by_lookup >= 100, "{outcome:?}");
    assert_eq!(outcome.succeeded + outcome.review + outcome.failed, 2_000);
}
