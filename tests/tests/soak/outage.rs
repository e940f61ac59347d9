//! A remote down for a minute in the middle of 2,000 tasks, in the four kinds of
//! `sendledger_tests::outage`, each run twice: without the breaker and `complete_after` (what
//! the service did before they existed) and with them. Prints one JSON line per run and a table
//! (`SENDLEDGER_REMOTE_OUTAGE_SECS`, `SENDLEDGER_REMOTE_OUTAGE_TASKS` change the size). With the breaker,
//! the same promises as the short integration tests hold; without it, only exactness is
//! asserted (the point of the run is the numbers).

use std::time::Duration;

use sendledger_tests::outage::{run, Outage, OutageRun};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: run by scripts/soak-cluster, or alone with `--ignored outage`"]
async fn a_remote_down_for_a_minute_before_and_after_the_breaker() {
    let outage_for = Duration::from_secs(env_or("SENDLEDGER_REMOTE_OUTAGE_SECS", 60));
    let tasks = env_or("SENDLEDGER_REMOTE_OUTAGE_TASKS", 2_000) as usize;
    // The outage sits in the middle of the submissions: a third of them before it.
    let submit_for = outage_for * 5 / 3;
    let outage_at = outage_for / 3;
    let mut rows = Vec::new();
    for kind in Outage::ALL {
        for breaker in [false, true] {
            let spec = OutageRun {
                kind,
                tasks,
                submit_for,
                outage_at,
                outage_for,
                breaker,
                settle_within: Duration::from_secs(60),
            };
            let report = run(&spec).await;
            println!("{}", serde_json::json!({ "run": spec, "report": report }));
            assert_eq!(
                report.duplicates, 0,
                "{kind:?} breaker={breaker}: {report:?}"
            );
            assert_eq!(
                report.wrong_remote_id, 0,
                "{kind:?} breaker={breaker}: {report:?}"
            );
            if breaker {
                assert_eq!(report.unsettled, 0, "{kind:?}: {report:?}");
                assert_eq!(report.failed, 0, "{kind:?}: {report:?}");
                assert!(report.manual_review <= 5, "{kind:?}: {report:?}");
                assert!(
                    report.drain_ms
                        <= (submit_for - outage_at - outage_for).as_millis() as u64 + 30_000,
                    "{kind:?}: every task settled within 30 s of the last submission: {report:?}"
                );
            }
            rows.push((kind, breaker, report));
        }
    }
    println!("| outage | breaker | succeeded | failed | manual review | unsettled | duplicates | POSTs during outage | tasks that waited | breaker opened | drain after recovery |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (kind, breaker, r) in rows {
        println!(
            "| {kind:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |",
            if breaker { "on" } else { "off" },
            r.succeeded,
            r.failed,
            r.manual_review,
            r.unsettled,
            r.duplicates,
            r.posts_during_outage,
            r.tasks_that_waited,
            r.breaker_opened,
            r.drain_ms as f64 / 1000.0
        );
    }
}
