//! The engine SIGKILLed mid-flight, restarted, killed again: no identity ever gets a second
//! record, every task ends settled (terminal, or in review with a reason), and the log obeys
//! every rule.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use sendledger_core::{check_task, EventBody, Phase, UnknownCause};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::engine::{target, task_id};

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
    let mut rng = rand::rngs::StdRng::seed_from_u64(r.seed);
    let sim = Sim::start(r.sim.clone()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = serde_json::to_string(&target(&sim.base_url(), |t| {
        t["retry"]["max_attempts"] = 10.into()
    }))
    .unwrap();
    let prefix = format!("k{}", r.seed);
    let mut kills = 0;
    for round in 0..=r.kills {
        let mut child = Command::new(env!("CARGO_BIN_EXE_engine_child"))
            .args([
                dir.path().to_str().unwrap(),
                &target,
                &prefix,
                &r.tasks.to_string(),
                &r.seed.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        assert_eq!(
            rx.recv().await.as_deref(),
            Some("started"),
            "round {round}: engine did not start"
        );
        // Kill while requests (creates or lookups) are in flight at the remote; a run that
        // has nothing left to send is let finish.
        let requests = sim.stats().requests;
        let busy = async {
            while sim.stats().requests == requests {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
        };
        let busy = round < r.kills
            && tokio::time::timeout(Duration::from_secs(10), busy)
                .await
                .is_ok();
        if busy {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..r.kill_within_ms))).await;
            child.kill().unwrap();
            child.wait().unwrap();
            kills += 1;
        } else {
            let pid = child.id();
            let wait = tokio::task::spawn_blocking(move || child.wait().unwrap());
            let Ok(status) = tokio::time::timeout(Duration::from_secs(120), wait).await else {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!(
                    "final run did not settle within 120 s; ledger kept at {}",
                    dir.keep().display()
                );
            };
            let status = status.unwrap();
            assert!(status.success(), "final run failed: {status}");
            let mut lines = Vec::new();
            while let Ok(line) = rx.try_recv() {
                lines.push(line);
            }
            assert!(
                lines.iter().any(|l| l == "settled"),
                "final run did not settle: {lines:?}"
            );
        }
    }

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
