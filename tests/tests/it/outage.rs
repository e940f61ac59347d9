//! A remote that is down for a while in the middle of a stream of tasks, in four kinds
//! (connections refused; each POST dropped unanswered; each POST answered 503; each POST hung
//! until the request timeout). With the target's circuit breaker, tasks that arrive during the
//! outage wait before their intent instead of being sent into it; the few sent before the
//! breaker opened are proven not performed by `lookup.complete_after` and resent. Every task
//! succeeds once the remote is back, with exactly one record, none fails and (almost) none
//! needs a person. `tests/soak/outage.rs` runs the same for a minute, with and without the
//! breaker, and reports the numbers.

use std::time::Duration;

use sendledger_tests::outage::{run, Outage, OutageReport, OutageRun, Remote};

async fn outage(remote: Remote, kind: Outage) -> OutageReport {
    let report = run(&OutageRun {
        remote,
        kind,
        tasks: 240,
        submit_for: Duration::from_secs(12),
        outage_at: Duration::from_secs(3),
        outage_for: Duration::from_secs(6),
        breaker: true,
        settle_within: Duration::from_secs(30),
    })
    .await;
    eprintln!(
        "{remote:?} {kind:?}: {}",
        serde_json::to_string(&report).unwrap()
    );
    assert_eq!(report.duplicates, 0, "{report:?}");
    assert_eq!(report.wrong_remote_id, 0, "{report:?}");
    assert_eq!(
        report.unsettled, 0,
        "every task settles once the remote is back: {report:?}"
    );
    assert_eq!(report.failed, 0, "an outage fails no task: {report:?}");
    assert!(
        report.manual_review <= 3,
        "a review only when a task was a probe more often than its resends allow: {report:?}"
    );
    assert!(report.breaker_opened >= 1, "{report:?}");
    assert!(
        report.tasks_that_waited >= 60,
        "tasks that arrived during the outage waited: {report:?}"
    );
    // About 120 tasks arrive during the outage; with the breaker open only those sent before
    // it opened, and its probes, reach the remote.
    assert!(
        report.posts_during_outage <= 40,
        "the breaker keeps tasks from being sent into the outage: {report:?}"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_with_refused_connections_becomes_a_delay() {
    let report = outage(Remote::Sim, Outage::Refused).await;
    assert_eq!(report.posts_during_outage, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_drops_each_post_becomes_a_delay() {
    outage(Remote::Sim, Outage::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_answers_503_becomes_a_delay() {
    outage(Remote::Sim, Outage::Unavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_that_hangs_each_post_becomes_a_delay() {
    outage(Remote::Sim, Outage::Hung).await;
}

// The same against a real HTTP server in a separate process: json-server (installed by
// `scripts/prereqs`) behind a fault proxy that refuses connections, or drops, answers 503 to,
// or hangs each POST (forwarding none of them) while GETs, the lookups, pass. Records and
// duplicates are counted from json-server's own store.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_behind_refused_connections_becomes_a_delay() {
    let report = outage(Remote::JsonServer, Outage::Refused).await;
    assert_eq!(report.posts_during_outage, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_with_each_post_dropped_becomes_a_delay() {
    outage(Remote::JsonServer, Outage::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_with_each_post_answered_503_becomes_a_delay() {
    outage(Remote::JsonServer, Outage::Unavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_server_with_each_post_hung_becomes_a_delay() {
    outage(Remote::JsonServer, Outage::Hung).await;
}
