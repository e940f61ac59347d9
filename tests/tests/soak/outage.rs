//! A remote down for a minute in the middle of 2,000 tasks, in the four kinds of
//! `sendledger_tests::outage`, against the simulated remote and against json-server (a real
//! HTTP server in a separate process, behind the fault proxy), each run twice: without the breaker and `complete_after` (what
//! the service did before they existed) and with them. Prints one JSON line per run and a table
//! (`SENDLEDGER_REMOTE_OUTAGE_SECS`, `SENDLEDGER_REMOTE_OUTAGE_TASKS` change the size). With the breaker,
//! the same promises as the short integration tests hold; without it, only exactness is
//! asserted (the point of the run is the numbers).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sendledger_tests::outage::{run, Outage, OutageRun, Remote};

/// This process's metrics, as the service's admin endpoint would serve them: the breaker's
/// transitions are read from `sendledger_target_transitions_total`. Installed once for the
/// process; a run's transitions are the difference before and after it, so the outage soaks
/// must run one at a time (`--test-threads 1`, as `scripts/soak-cluster` runs them).
fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("a metrics recorder")
    })
}

/// `sendledger_target_transitions_total` by the state it went to (`open`, `half_open`,
/// `closed`), summed over targets.
fn transitions() -> BTreeMap<String, u64> {
    let mut by_state = BTreeMap::new();
    for line in metrics().render().lines() {
        let Some(rest) = line.strip_prefix("sendledger_target_transitions_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let to = labels
            .split(',')
            .find_map(|l| l.strip_prefix("to=\""))
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or_default();
        let value: u64 = value.trim().parse().unwrap_or_default();
        *by_state.entry(to.to_string()).or_default() += value;
    }
    by_state
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: run by scripts/soak-cluster, or alone with `--ignored outage`"]
async fn a_remote_down_for_a_minute_before_and_after_the_breaker() {
    before_and_after(Remote::Sim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: run by scripts/soak-cluster, or alone with `--ignored outage::json_server`"]
async fn json_server_down_for_a_minute_before_and_after_the_breaker() {
    before_and_after(Remote::JsonServer).await;
}

async fn before_and_after(remote: Remote) {
    let outage_for = Duration::from_secs(env_or("SENDLEDGER_REMOTE_OUTAGE_SECS", 60));
    let tasks = env_or("SENDLEDGER_REMOTE_OUTAGE_TASKS", 2_000) as usize;
    // The outage sits in the middle of the submissions: a third of them before it.
    let submit_for = outage_for * 5 / 3;
    let outage_at = outage_for / 3;
    let mut rows = Vec::new();
    for kind in Outage::ALL {
        for breaker in [false, true] {
            let spec = OutageRun {
                remote,
                kind,
                tasks,
                submit_for,
                outage_at,
                outage_for,
                breaker,
                settle_within: Duration::from_secs(60),
            };
            let before = transitions();
            let report = run(&spec).await;
            let after = transitions();
            let moved: BTreeMap<&str, u64> = ["open", "half_open", "closed"]
                .into_iter()
                .map(|to| {
                    let n = |m: &BTreeMap<String, u64>| m.get(to).copied().unwrap_or_default();
                    (to, n(&after) - n(&before))
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({ "run": spec, "report": report, "transitions": moved })
            );
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
                    report.settled_after_return_ms <= 30_000,
                    "{kind:?}: every task submitted before the return settled within 30 s of it: {report:?}"
                );
                assert!(
                    report.drain_ms
                        <= (submit_for - outage_at - outage_for).as_millis() as u64 + 30_000,
                    "{kind:?}: every task settled within 30 s of the last submission: {report:?}"
                );
            }
            if breaker {
                assert_eq!(
                    moved["open"], report.breaker_opened,
                    "{kind:?}: the metrics count every opening: {moved:?}"
                );
            }
            rows.push((kind, breaker, report, moved));
        }
    }
    println!("{remote:?}:");
    println!("| outage | breaker | succeeded | failed | manual review | unsettled | duplicates | POSTs during outage | tasks that waited | breaker opened | transitions to open / half-open / closed | settled after the return | drain after recovery |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (kind, breaker, r, moved) in rows {
        println!(
            "| {kind:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {:.1} s | {:.1} s |",
            if breaker { "on" } else { "off" },
            r.succeeded,
            r.failed,
            r.manual_review,
            r.unsettled,
            r.duplicates,
            r.posts_during_outage,
            r.tasks_that_waited,
            r.breaker_opened,
            moved["open"],
            moved["half_open"],
            moved["closed"],
            r.settled_after_return_ms as f64 / 1000.0,
            r.drain_ms as f64 / 1000.0
        );
    }
}
