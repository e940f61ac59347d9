//! The engine killed (`kill -9`) mid-run against an https remote, measured: how many tasks end
//! in manual review, and what those reviews are. An engine child (`engine_child`) submits the
//! tasks to one https target at the simulated remote, which commits creates and then drops
//! (10%) or never sends (5%) the answer; the child is SIGKILLed once the remote has received a
//! seeded number of the round's creates (while creates are being sent), restarted on its
//! intact ledger (every task submitted again), and after the last kill left to settle every
//! task. Prints one JSON line per run: the tasks succeeded, in review and failed; the remote's
//! duplicates; the reviews whose task has no record at the remote (with only commit faults,
//! every create the remote receives commits a record, so no record means no create was
//! received: `posts_without_record` counts the exceptions); the unknown outcomes of recovery
//! (`SendUnknown{Recovery}`); and the audit of the ledger. The timelines of the first few
//! reviews of each run go to stderr.
//!
//! `SENDLEDGER_KILL_REVIEW_SEEDS` (a comma-separated list, default `37`),
//! `SENDLEDGER_KILL_REVIEW_RUNS` (runs per seed, default 4), `SENDLEDGER_KILL_REVIEW_TASKS`
//! (default 400), `SENDLEDGER_KILL_REVIEW_KILLS` (default 3) and
//! `SENDLEDGER_KILL_REVIEW_TIMELINES` (review timelines printed per run, default 3) change it.
//! Asserts what must hold whatever the numbers: no duplicate, no task outside succeeded,
//! review and failed, no task whose events break a rule, a clean audit.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use sendledger_core::{check_task, EventBody, Phase, ReviewReason, UnknownCause};
use sendledger_sim::{Faults, Sim, SimConfig, SimTlsConfig};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::engine::{target, task_id};
use sendledger_tests::pki::Ca;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The tasks of the ledger in `dir` (the engine not running) that have no intent yet: those
/// that will send a create when the engine starts.
fn without_intent(dir: &std::path::Path, prefix: &str, tasks: usize) -> u64 {
    let ledger = Ledger::open(dir, LedgerOptions::default()).unwrap();
    (0..tasks)
        .filter(|i| {
            let events = ledger
                .task_events(task_id(&format!("{prefix}-{i}")))
                .unwrap();
            !events
                .iter()
                .any(|e| matches!(e.body, EventBody::SendIntended { .. }))
        })
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: a measurement, run alone with `--ignored --nocapture kill_review`"]
async fn kills_against_an_https_remote_and_the_reviews_they_leave() {
    let seeds: Vec<u64> = std::env::var("SENDLEDGER_KILL_REVIEW_SEEDS")
        .unwrap_or_else(|_| "37".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("SENDLEDGER_KILL_REVIEW_SEEDS: numbers")
        })
        .collect();
    let runs = env_or("SENDLEDGER_KILL_REVIEW_RUNS", 4);
    let tasks = env_or("SENDLEDGER_KILL_REVIEW_TASKS", 400) as usize;
    let kills = env_or("SENDLEDGER_KILL_REVIEW_KILLS", 3) as usize;
    let timelines = env_or("SENDLEDGER_KILL_REVIEW_TIMELINES", 3) as usize;
    for &seed in &seeds {
        for run in 0..runs {
            run_once(seed, run, tasks, kills, timelines).await;
        }
    }
}

async fn run_once(seed: u64, run: u64, tasks: usize, kills: usize, timelines: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new(pki.path(), "remote");
    let server = ca.issue("server", &["localhost", "127.0.0.1"]);
    let sim = Sim::start(SimConfig {
        seed,
        faults: Faults {
            commit_then_drop: 0.10,
            commit_then_hang: 0.05,
            latency_jitter: Duration::from_millis(20),
            ..Faults::default()
        },
        tls: Some(SimTlsConfig {
            cert_file: server.cert,
            key_file: server.key,
            client_ca_file: None,
        }),
        ..SimConfig::default()
    })
    .await
    .expect("sim starts with tls");
    assert!(sim.base_url().starts_with("https://"));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.ca_file();
    let target = serde_json::to_string(&target(&sim.base_url(), |t| {
        t["retry"]["max_attempts"] = 10.into();
        t["tls"] = serde_json::json!({ "ca_file": ca_file });
    }))
    .unwrap();
    let prefix = format!("k{seed}");
    let started = now_ms();
    let mut killed_at = Vec::new();
    // At each kill: the remote's creates received until then.
    let mut posts_at_kill = Vec::new();
    let mut creates_left = tasks as u64;
    for round in 0..=kills {
        let mut child = Command::new(env!("CARGO_BIN_EXE_engine_child"))
            .args([
                dir.path().to_str().unwrap(),
                &target,
                &prefix,
                &tasks.to_string(),
                &seed.to_string(),
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
        // The kill lands while creates are being sent: once the remote has received a seeded
        // number of this round's creates, from 1 to the number of tasks with no intent yet (the
        // creates this round will send; read from the ledger between rounds). A round with no
        // create left to send is killed within 400 ms of the remote seeing a request of it (a
        // lookup), as in `engine_kill`. When the count is not reached within 10 s, the kill
        // comes then if the round sent any request; a round that sent none is let finish.
        let at_start = sim.stats();
        let creates = (creates_left > 0).then(|| rng.random_range(1..=creates_left));
        let reached = || {
            let now = sim.stats();
            match creates {
                Some(n) => now.posts >= at_start.posts + n,
                None => now.requests > at_start.requests,
            }
        };
        let busy = async {
            while !reached() {
                tokio::time::sleep(Duration::from_millis(1)).await
            }
        };
        let busy = round < kills
            && (tokio::time::timeout(Duration::from_secs(10), busy)
                .await
                .is_ok()
                || sim.stats().requests > at_start.requests);
        if busy {
            if creates.is_none() {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
            }
            child.kill().unwrap();
            killed_at.push(now_ms());
            posts_at_kill.push(sim.stats().posts);
            child.wait().unwrap();
            creates_left = without_intent(dir.path(), &prefix, tasks);
        } else {
            let pid = child.id();
            let wait = tokio::task::spawn_blocking(move || child.wait().unwrap());
            let Ok(status) = tokio::time::timeout(Duration::from_secs(180), wait).await else {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!(
                    "final round did not settle within 180 s; ledger kept at {}",
                    dir.keep().display()
                );
            };
            assert!(status.unwrap().success(), "final round failed");
        }
    }
    let took = now_ms() - started;

    let stats = sim.stats();
    let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
    let audit = sendledger_store::audit(&ledger, Default::default(), |_| {}).unwrap();
    let (mut succeeded, mut review, mut failed, mut other) = (0, 0, 0, 0);
    let (mut review_no_record, mut review_with_record) = (0, 0);
    let mut review_by_unknown: BTreeMap<String, u64> = BTreeMap::new();
    let mut review_by_reason: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut recovered_unknowns, mut intents, mut check_violations) = (0, 0, 0);
    let mut printed = 0;
    // At each kill: the intents recorded until then.
    let mut intents_at_kill = vec![0u64; killed_at.len()];
    // Reviews after recovery: how long before the kill that cut it off the intent was recorded.
    let mut intent_to_kill_ms: Vec<u64> = Vec::new();
    for i in 0..tasks {
        let key = format!("{prefix}-{i}");
        let events = ledger.task_events(task_id(&key)).unwrap();
        let (state, violations) = check_task(&events, Default::default());
        check_violations += violations.len();
        let records = sim.records_with_identity(&key);
        let mut last_unknown = None;
        let mut last_intent = None;
        for e in &events {
            match &e.body {
                EventBody::SendIntended { .. } => {
                    intents += 1;
                    last_intent = Some(e.at);
                    for (n, &k) in killed_at.iter().enumerate() {
                        if e.at <= k {
                            intents_at_kill[n] += 1;
                        }
                    }
                }
                EventBody::SendUnknown { cause, .. } => {
                    if *cause == UnknownCause::Recovery {
                        recovered_unknowns += 1;
                    }
                    last_unknown = Some(cause.clone());
                }
                _ => {}
            }
        }
        match state.phase {
            Phase::Succeeded => succeeded += 1,
            Phase::Failed => failed += 1,
            Phase::ManualReview => {
                review += 1;
                if records.is_empty() {
                    review_no_record += 1;
                } else {
                    review_with_record += 1;
                }
                let unknown = match &last_unknown {
                    Some(UnknownCause::Recovery) => "recovery",
                    Some(UnknownCause::Timeout) => "timeout",
                    Some(UnknownCause::ResetAfterWrite(_)) => "reset_after_write",
                    Some(UnknownCause::Status(_)) => "status",
                    None => "none",
                };
                if let (Some(UnknownCause::Recovery), Some(at)) = (&last_unknown, last_intent) {
                    if let Some(&k) = killed_at.iter().find(|&&k| k >= at) {
                        intent_to_kill_ms.push(k - at);
                    }
                }
                let record = if records.is_empty() {
                    "no_record"
                } else {
                    "record"
                };
                *review_by_unknown
                    .entry(format!("{unknown}/{record}"))
                    .or_default() += 1;
                let reason = match &state.review_reason {
                    Some(ReviewReason::DeadlinePassed { .. }) => "deadline_passed",
                    Some(ReviewReason::LookupsFailed { .. }) => "lookups_failed",
                    Some(ReviewReason::MultipleMatches { .. }) => "multiple_matches",
                    Some(ReviewReason::NoLookup) => "no_lookup",
                    Some(ReviewReason::DivergentHistory { .. }) => "divergent_history",
                    Some(_) => "compensation",
                    None => "none",
                };
                *review_by_reason.entry(reason).or_default() += 1;
                if printed < timelines {
                    printed += 1;
                    let t0 = events.first().map(|e| e.at).unwrap_or(started);
                    let kills: Vec<i64> = killed_at.iter().map(|&k| k as i64 - t0 as i64).collect();
                    eprintln!(
                        "seed {seed} run {run}: review {key}; kills at {kills:?} ms; records at \
                         the remote created at {:?} ms",
                        records
                            .iter()
                            .map(|r| r.created_at as i64 - t0 as i64)
                            .collect::<Vec<_>>()
                    );
                    for e in &events {
                        eprintln!("  {:>7} ms  {:?}", e.at as i64 - t0 as i64, e.body);
                    }
                }
            }
            _ => other += 1,
        }
    }
    intent_to_kill_ms.sort();
    let spread = |v: &[u64]| match v {
        [] => serde_json::Value::Null,
        v => serde_json::json!([v[0], v[v.len() / 2], v[v.len() - 1]]),
    };
    let line = serde_json::json!({
        "seed": seed,
        "run": run,
        "tasks": tasks,
        "kills": killed_at.len(),
        "kills_at_ms": killed_at.iter().map(|k| k - started).collect::<Vec<_>>(),
        "intents_at_kill": intents_at_kill,
        "posts_at_kill": posts_at_kill,
        "succeeded": succeeded,
        "review": review,
        "failed": failed,
        "unsettled": other,
        "duplicates": stats.duplicates,
        "review_no_record": review_no_record,
        "review_with_record": review_with_record,
        "review_by_last_unknown": review_by_unknown,
        "review_by_reason": review_by_reason,
        "review_intent_to_kill_ms_min_median_max": spread(&intent_to_kill_ms),
        "recovered_unknowns": recovered_unknowns,
        "intents": intents,
        "posts": stats.posts,
        "records": stats.records,
        "posts_without_record": stats.posts.saturating_sub(stats.records),
        "dropped": stats.dropped,
        "hung": stats.hung,
        "connections": stats.connections,
        "handshakes_failed": stats.handshakes_failed,
        "check_violations": check_violations,
        "audit_clean": audit.is_clean(),
        "audit_violations": audit.violations.len(),
        "audit_recovered_after_crash": audit.recovered_after_crash,
        "ms": took,
    });
    println!("{line}");
    assert_eq!(stats.duplicates, 0, "an identity got a second record");
    assert_eq!(other, 0, "tasks not settled");
    assert_eq!(check_violations, 0, "a task's events break a rule");
    assert!(audit.is_clean(), "audit: {:?}", audit.violations);
    sim.shutdown().await;
}
