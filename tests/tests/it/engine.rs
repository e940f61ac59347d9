//! The engine end to end without Kafka: real RocksDB in a temporary directory, the simulated
//! remote over real sockets. Every test checks the remote's records and the task's events.

use std::time::Duration;

use sendledger_core::decide::OperatorResolution;
use sendledger_core::{EventBody, Evidence, NotSentCause, Phase, ReviewReason, UnknownCause};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::engine::*;

const WAIT: Duration = Duration::from_secs(20);

fn names(events: &[sendledger_core::Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.body.name()).collect()
}

async fn sim(faults: Faults) -> Sim {
    Sim::start(SimConfig {
        faults,
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

fn start_engine(
    dir: &std::path::Path,
    target: sendledger_effects::TargetConfig,
) -> sendledger_actors::Engine {
    tokio::task::block_in_place(|| start(dir, target))
}

/// The remote refuses connections (nothing listens): the attempt certainly did not reach it,
/// so it is retried with backoff, and succeeds once the remote is up — one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_retried_until_the_remote_is_up() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&base, |t| t["retry"]["max_attempts"] = 50.into()),
    );
    engine.submit(request("r-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("r-1"), WAIT, |s| s.attempts >= 2).await;
    let sim = Sim::start(SimConfig {
        listen: ([127, 0, 0, 1], port).into(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let state = wait_for(&engine, task_id("r-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    let records = sim.records_with_identity("r-1");
    assert_eq!(records.len(), 1);
    assert_eq!(state.remote_id.as_deref(), Some(records[0].id.as_str()));
    let events = engine.events(task_id("r-1")).await.unwrap();
    assert!(events.iter().any(|e| matches!(
        &e.body,
        EventBody::SendNotSent {
            cause: NotSentCause::Connect(_),
            ..
        }
    )));
    assert!(!events
        .iter()
        .any(|e| matches!(e.body, EventBody::SendUnknown { .. })));
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The remote commits, then drops the connection: unknown, reconciled by lookup to the one
/// record it holds. Never resent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_response_is_confirmed_by_lookup() {
    let sim = sim(Faults {
        commit_then_drop: 1.0,
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("d-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("d-1"), WAIT, settled).await;
    let records = sim.records_with_identity("d-1");
    assert_eq!(records.len(), 1);
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.remote_id.as_deref(), Some(records[0].id.as_str()));
    assert_eq!(state.evidence, Some(Evidence::Lookup));
    let events = engine.events(task_id("d-1")).await.unwrap();
    assert_eq!(
        names(&events),
        [
            "TaskAccepted",
            "SendIntended",
            "SendUnknown",
            "LookupPerformed",
            "Confirmed"
        ]
    );
    assert!(matches!(
        events[2].body,
        EventBody::SendUnknown {
            attempt: 1,
            cause: UnknownCause::ResetAfterWrite(_)
        }
    ));
    assert_eq!(sim.stats().posts, 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The same request ten times at once: one task, one record, nine recorded duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_execute_once() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    let submits: Vec<_> = (0..10)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.submit(request("dup-1"), source(i)).await })
        })
        .collect();
    for s in submits {
        s.await.unwrap().unwrap();
    }
    let state = wait_for(&engine, task_id("dup-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.duplicates, 9);
    assert_eq!(sim.records_with_identity("dup-1").len(), 1);
    assert_eq!(sim.stats().posts, 1);
    // Same identity, different payload: a conflict, nothing executed.
    let mut other = request("dup-1");
    other.payload = serde_json::json!({ "amount": 99 });
    let reply = engine.submit(other, source(10)).await.unwrap();
    assert_eq!(reply.events, ["RequestConflict"]);
    assert_eq!(sim.stats().posts, 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Records appear at lookups only after a lag: the first lookups find nothing, the task stays
/// unknown, and a later one confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_lag_keeps_the_task_unknown_until_the_record_shows() {
    let sim = Sim::start(SimConfig {
        lookup_lag: Duration::from_millis(600),
        faults: Faults {
            commit_then_drop: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("lag-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("lag-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    let events = engine.events(task_id("lag-1")).await.unwrap();
    let lookups: Vec<usize> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::LookupPerformed { matches, .. } => Some(matches.len()),
            _ => None,
        })
        .collect();
    assert!(
        lookups.len() >= 2 && lookups[0] == 0 && *lookups.last().unwrap() == 1,
        "{lookups:?}"
    );
    assert_eq!(sim.records_with_identity("lag-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Two records exist for the task: manual review listing both; an operator resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_matches_go_to_review_and_an_operator_resolves() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = target(&sim.base_url(), |_| {});
    // The remote already holds a record of the task, from a sender this ledger does not know.
    let earlier = request("m-1")
        .accept(&sendledger_core::Limits::default())
        .unwrap();
    let outcome = targets(config.clone())
        .get("sim")
        .unwrap()
        .execute(&earlier, 1, None)
        .await;
    assert!(matches!(
        outcome,
        sendledger_core::decide::AttemptOutcome::Succeeded { .. }
    ));
    let engine = start_engine(dir.path(), config);
    sim.set_faults(Faults {
        commit_then_drop: 1.0,
        ..Faults::default()
    })
    .unwrap();
    engine.submit(request("m-1"), source(1)).await.unwrap();
    let state = wait_for(&engine, task_id("m-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::ManualReview);
    let ids: Vec<String> = sim
        .records_with_identity("m-1")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(
        state.review_reason,
        Some(ReviewReason::MultipleMatches {
            remote_ids: ids.clone()
        })
    );
    let reviews = engine.reviews().await.unwrap();
    assert!(reviews.iter().any(|r| r.task_id == task_id("m-1")));
    let resolution = OperatorResolution::Succeeded {
        remote_id: ids[1].clone(),
        by: "ana".into(),
        reason: "second is ours".into(),
    };
    engine.resolve(task_id("m-1"), resolution).await.unwrap();
    let state = engine.state(task_id("m-1")).await.unwrap();
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(
        state.evidence,
        Some(Evidence::Operator {
            by: "ana".into(),
            reason: "second is ours".into()
        })
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A 5xx without a record: unknown, nothing found by the deadline → manual review. With the
/// resend-when-absent policy, a recorded authorization, then a new attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_without_record_reviews_or_resends_by_policy() {
    let sim = sim(Faults {
        error: 1.0,
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&sim.base_url(), |t| {
            t["lookup"]["deadline"] = "400ms".into()
        }),
    );
    engine.submit(request("dl-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("dl-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::ManualReview);
    assert!(matches!(
        state.review_reason,
        Some(ReviewReason::DeadlinePassed { .. })
    ));
    assert_eq!(sim.stats().posts, 1);
    assert_eq!(sim.records().len(), 0);
    engine.shutdown(Duration::from_secs(5)).await;

    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&sim.base_url(), |t| {
            t["lookup"]["deadline"] = "400ms".into();
            t["lookup"]["resend_when_absent"] = true.into();
        }),
    );
    engine.submit(request("dl-2"), source(0)).await.unwrap();
    wait_for(&engine, task_id("dl-2"), WAIT, |s| s.lookups >= 1).await;
    sim.set_faults(Faults::default()).unwrap();
    let state = wait_for(&engine, task_id("dl-2"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    let events = engine.events(task_id("dl-2")).await.unwrap();
    let auth = events.iter().position(|e| matches!(&e.body, EventBody::ResendAuthorized { by, .. } if by == "policy:resend_when_absent")).expect("authorization recorded");
    assert!(matches!(
        events[auth + 1].body,
        EventBody::SendIntended { attempt: 2, .. }
    ));
    assert_eq!(sim.records_with_identity("dl-2").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// 429 with `Retry-After: 1`: not sent; the next attempt comes no earlier than a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_attempts_wait_for_retry_after() {
    let sim = sim(Faults {
        throttle: 1.0,
        retry_after: Duration::from_secs(1),
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("t-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("t-1"), WAIT, |s| {
        s.phase == Phase::RetryWait
    })
    .await;
    sim.set_faults(Faults::default()).unwrap();
    let state = wait_for(&engine, task_id("t-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    let events = engine.events(task_id("t-1")).await.unwrap();
    let (not_sent_at, retry_at) = events
        .iter()
        .find_map(|e| match e.body {
            EventBody::SendNotSent {
                cause: NotSentCause::Throttled { status: 429 },
                retry_at,
                ..
            } => Some((e.at, retry_at)),
            _ => None,
        })
        .expect("throttled attempt recorded");
    assert!(
        retry_at >= not_sent_at + 1_000,
        "Retry-After honoured in the schedule"
    );
    let second = events
        .iter()
        .find(|e| matches!(e.body, EventBody::SendIntended { attempt: 2, .. }))
        .unwrap();
    assert!(
        second.at >= retry_at,
        "second attempt at {} before {retry_at}",
        second.at
    );
    assert_eq!(sim.records_with_identity("t-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// 422 is rejected at once; refused connections until attempts run out end failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_final_and_exhausted_retries_fail() {
    let sim = sim(Faults {
        reject: 1.0,
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("x-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("x-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Rejected);
    assert_eq!(state.rejection.as_ref().map(|r| r.0), Some(422));
    assert_eq!(state.attempts, 1);
    assert_eq!(sim.stats().posts, 1);
    engine.shutdown(Duration::from_secs(5)).await;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&format!("http://127.0.0.1:{port}"), |t| {
            t["retry"]["max_attempts"] = 3.into()
        }),
    );
    engine.submit(request("x-2"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("x-2"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Failed);
    assert_eq!(state.attempts, 3);
    let events = engine.events(task_id("x-2")).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e.body, EventBody::SendNotSent { .. }))
            .count(),
        3
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A remote that honours idempotency keys: an unknown outcome is resolved by resending with the
/// same key, and the remote keeps one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_target_resends_with_the_same_key() {
    let sim = Sim::start(SimConfig {
        idempotency_header: Some("Idempotency-Key".into()),
        faults: Faults {
            commit_then_drop: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&sim.base_url(), |t| {
            t["idempotency"] = serde_json::json!({ "header": "Idempotency-Key", "ttl": "1h" });
            t.as_object_mut().unwrap().remove("lookup");
        }),
    );
    engine.submit(request("k-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("k-1"), WAIT, |s| s.attempts >= 2).await;
    sim.set_faults(Faults::default()).unwrap();
    let state = wait_for(&engine, task_id("k-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    let events = engine.events(task_id("k-1")).await.unwrap();
    let keys: Vec<Option<String>> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::SendIntended {
                idempotency_key, ..
            } => Some(idempotency_key.clone()),
            _ => None,
        })
        .collect();
    assert!(
        keys.len() >= 2 && keys.iter().all(|k| k.is_some() && *k == keys[0]),
        "{keys:?}"
    );
    assert_eq!(sim.records_with_identity("k-1").len(), 1);
    assert!(sim.stats().replays >= 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The resend-when-absent policy gives each unknown attempt its own observation window and
/// authorizes at most `max_policy_resends` resends: a remote that answers 5xx (no record) to
/// every attempt gets two attempts, then a person decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_resends_are_bounded_and_each_attempt_is_observed() {
    let sim = sim(Faults {
        error: 1.0,
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&sim.base_url(), |t| {
            t["lookup"]["deadline"] = "400ms".into();
            t["lookup"]["resend_when_absent"] = true.into();
        }),
    );
    engine.submit(request("pr-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("pr-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::ManualReview);
    assert!(matches!(
        state.review_reason,
        Some(ReviewReason::DeadlinePassed { .. })
    ));
    assert_eq!(sim.stats().posts, 2, "one policy resend, no more");
    let events = engine.events(task_id("pr-1")).await.unwrap();
    let unknown_at = |attempt: u32| {
        events
            .iter()
            .find(|e| matches!(e.body, EventBody::SendUnknown { attempt: a, .. } if a == attempt))
            .map(|e| e.at)
            .unwrap()
    };
    // Attempt 2 was observed for its whole window before the review.
    let review_at = events.last().unwrap().at;
    assert!(review_at >= unknown_at(2) + 400, "{events:#?}");
    let report = tokio::task::block_in_place(|| {
        sendledger_store::audit(engine.ledger(), Default::default(), |_| {})
    })
    .unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// After a restart, an unknown task whose first check is past due gets its stored timer and
/// recovery's wake at once: one lookup goes out, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_task_has_one_lookup_in_flight() {
    let sim = Sim::start(SimConfig {
        faults: Faults {
            commit_then_drop: 1.0,
            ..Faults::default()
        },
        lookup_lag: Duration::ZERO,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let slow_first_check = |t: &mut serde_json::Value| t["lookup"]["first_check"] = "1s".into();
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), slow_first_check));
    engine.submit(request("one-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("one-1"), WAIT, |s| {
        s.phase == Phase::Unknown
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(sim.stats().lookups, 0, "stopped before the first check");
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let engine = start_engine(dir.path(), target(&sim.base_url(), slow_first_check));
    let state = wait_for(&engine, task_id("one-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.evidence, Some(Evidence::Lookup));
    // Give a second lookup, had one been issued, the time to arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sim.stats().lookups, 1);
    assert_eq!(sim.records_with_identity("one-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A producer repeating one request: past `MAX_RECORDED_DUPLICATES` a redelivery records no
/// event (the history stays bounded), yet it is still dropped and its offset still processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_past_the_limit_are_dropped_without_growing_the_history() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("many-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("many-1"), WAIT, settled).await;
    let limit = i64::from(sendledger_core::decide::MAX_RECORDED_DUPLICATES);
    for offset in 1..=limit + 200 {
        let reply = engine
            .submit(request("many-1"), source(offset))
            .await
            .unwrap();
        let expected: &[&str] = if offset <= limit {
            &["DuplicateDelivery"]
        } else {
            &[]
        };
        assert_eq!(reply.events, expected, "delivery at offset {offset}");
    }
    let events = engine.ledger().task_events(task_id("many-1")).unwrap();
    let duplicates = events
        .iter()
        .filter(|e| matches!(e.body, EventBody::DuplicateDelivery { .. }))
        .count();
    assert_eq!(duplicates as i64, limit);
    let processed = engine.ledger().processed("test", 0).unwrap();
    assert!(
        (0..=limit + 200).all(|o| processed.contains(o)),
        "{processed:?}"
    );
    assert_eq!(sim.stats().posts, 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A redelivery of an identity the ledger knows is a duplicate (or a conflict) even after its
/// target was removed and a limit tightened: never a new rejected task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_identity_stays_a_duplicate_when_the_configuration_changes() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("kn-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("kn-1"), WAIT, settled).await;
    engine.shutdown(Duration::from_secs(5)).await;

    // The target is now called something else, and payloads are limited to 8 bytes.
    let mut config = sendledger_actors::EngineConfig::new(dir.path());
    config.limits.max_payload_bytes = 8;
    let targets = sendledger_effects::Targets::from_config(&std::collections::BTreeMap::from([(
        "elsewhere".to_string(),
        target(&sim.base_url(), |_| {}),
    )]))
    .unwrap();
    let remote = std::sync::Arc::new(sendledger_node::wiring::HttpRemote::new(targets));
    let engine =
        tokio::task::block_in_place(|| sendledger_actors::Engine::start(config, remote)).unwrap();
    let reply = engine.submit(request("kn-1"), source(1)).await.unwrap();
    assert_eq!(reply.events, ["DuplicateDelivery"]);
    assert_eq!(reply.task_id, task_id("kn-1"));
    let mut changed = request("kn-1");
    changed.payload = serde_json::json!({ "amount": 1 });
    let reply = engine.submit(changed, source(2)).await.unwrap();
    assert_eq!(reply.events, ["RequestConflict"]);
    // A new identity is judged by today's configuration.
    let err = engine.submit(request("kn-2"), source(3)).await.unwrap_err();
    assert!(err.to_string().contains("payload"), "{err}");
    let log = engine.ledger().read_log(1, 1_000).unwrap();
    assert!(!log
        .iter()
        .any(|e| matches!(e.body, EventBody::InputRejected { .. })));
    assert_eq!(sim.records_with_identity("kn-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A task whose recorded events cannot be read (one damaged on disk) is refused with an error
/// that names the damage, and says it is permanent: delivering the request again cannot help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_events_cannot_be_read_is_refused_naming_the_damage() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    engine.submit(request("dmg-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("dmg-1"), WAIT, settled).await;
    let first = engine.events(task_id("dmg-1")).await.unwrap()[0].lsn;
    engine.shutdown(Duration::from_secs(5)).await;
    tokio::task::block_in_place(|| {
        let ledger = sendledger_store::Ledger::open(dir.path(), Default::default()).unwrap();
        ledger
            .inject_raw_log_entry(first, &[1, 0xff, 0xff, 0xff])
            .unwrap();
    });

    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    let err = engine
        .submit(request("dmg-1"), source(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, sendledger_actors::Error::Load { task_id: t, .. } if *t == task_id("dmg-1")),
        "{err:?}"
    );
    assert!(!err.is_transient(), "{err:?}");
    let message = sendledger_core::error::Chain(&err).to_string();
    assert!(
        message.contains(&format!("event at lsn {first} cannot be decoded")),
        "{message}"
    );
    assert_eq!(sim.records_with_identity("dmg-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Two jobs rejecting the same message at once (a redelivery racing a slow first job) record
/// it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rejections_of_one_message_record_it_once() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    let jobs: Vec<_> = (0..16)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine
                    .reject_input(source(5), format!("not JSON ({i})"), b"{oops")
                    .await
            })
        })
        .collect();
    for job in jobs {
        job.await.unwrap().unwrap();
    }
    let log = engine.ledger().read_log(1, 1_000).unwrap();
    let rejected = log
        .iter()
        .filter(|e| matches!(e.body, EventBody::InputRejected { .. }))
        .count();
    assert_eq!(rejected, 1, "{log:#?}");
    let task = sendledger_core::TaskId::for_rejected_input("test", 0, 5);
    assert_eq!(engine.events(task).await.unwrap().len(), 1);
    let processed = engine.ledger().processed("test", 0).unwrap();
    assert!(processed.contains(5));
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A backlog far beyond what the remote serves at once: a remote that works on 4 creates at a
/// time, 25 ms each, gets 400 tasks. Unlimited, the queue at the remote outlasts the request
/// timeout and attempts end unknown by our own doing; with `max_in_flight = 4`, tasks wait for
/// a slot before recording their intent, and every attempt gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_keeps_a_backlog_from_timing_out_at_a_modest_remote() {
    async fn run(max_in_flight: usize, wait_settled: bool) -> (usize, Sim) {
        let sim = Sim::start(SimConfig {
            capacity: Some(4),
            faults: Faults {
                latency: Duration::from_millis(25),
                ..Faults::default()
            },
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let engine = start_engine(
            dir.path(),
            target(&sim.base_url(), |t| {
                t["max_in_flight"] = max_in_flight.into()
            }),
        );
        let keys: Vec<String> = (0..400).map(|i| format!("bl-{i}")).collect();
        let submits: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let engine = engine.clone();
                let k = k.clone();
                tokio::spawn(async move { engine.submit(request(&k), source(i as i64)).await })
            })
            .collect();
        for s in submits {
            s.await.unwrap().unwrap();
        }
        if wait_settled {
            for k in &keys {
                let state = wait_for(&engine, task_id(k), Duration::from_secs(60), settled).await;
                assert_eq!(state.phase, Phase::Succeeded, "{k}");
            }
        } else {
            // Long enough for the queue at the remote to outlast the 400 ms request timeout.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
        let log = engine.ledger().read_log(1, usize::MAX).unwrap();
        let unknowns = log
            .iter()
            .filter(|e| matches!(e.body, EventBody::SendUnknown { .. }))
            .count();
        engine.shutdown(Duration::from_secs(5)).await;
        (unknowns, sim)
    }
    let (unknowns, _) = run(10_000, false).await;
    assert!(
        unknowns > 0,
        "the unlimited backlog should overload the remote"
    );
    let (unknowns, sim) = run(4, true).await;
    assert_eq!(unknowns, 0);
    assert_eq!(sim.stats().posts, 400);
    assert_eq!(sim.stats().duplicates, 0);
}

/// The ledger's disk fills up mid-run (a small tmpfs; mounting one needs root, otherwise the
/// test says it skipped). Writes fail, so nothing more is accepted or sent, and the ledger
/// says why (what `/healthz` reports). Nothing acknowledged is lost: after space is freed and
/// the engine restarts, every acknowledged task is in the ledger, and with every request
/// delivered again (as the consumer would), every task succeeds with exactly one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_work_and_loses_nothing_acknowledged() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED a_full_disk_stops_the_work_and_loses_nothing_acknowledged: mounting a size-limited tmpfs needs root");
        return;
    }
    struct Mounted(std::path::PathBuf);
    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let mount = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(mount.path())
        .status()
        .unwrap();
    assert!(status.success(), "mount a tmpfs");
    let _mounted = Mounted(mount.path().to_path_buf());
    let sim = sim(Faults::default()).await;
    let ledger = mount.path().join("ledger");
    let engine = start_engine(&ledger, target(&sim.base_url(), |_| {}));
    // Leave about 2 MiB.
    let filler = mount.path().join("filler");
    std::fs::write(&filler, vec![0u8; 14 * 1024 * 1024 - 2 * 1024 * 1024]).ok();
    let pad = "x".repeat(8_000);
    let padded = |key: &str| {
        let mut r = request(key);
        r.payload = serde_json::json!({ "amount": 1, "pad": pad });
        r
    };
    let keys: Vec<String> = (0..2_000).map(|i| format!("df-{i}")).collect();
    let mut acked = Vec::new();
    let mut refusal = None;
    for (i, key) in keys.iter().enumerate() {
        match engine.submit(padded(key), source(i as i64)).await {
            Ok(_) => acked.push(key.clone()),
            Err(e) => {
                refusal = Some(e.to_string());
                break;
            }
        }
    }
    let refusal = refusal.expect("the disk filled up");
    assert!(refusal.contains("ledger"), "{refusal}");
    let why = engine
        .ledger()
        .stats()
        .failing()
        .expect("the ledger says why");
    assert!(why.to_lowercase().contains("space"), "{why}");
    // Nothing more goes out while nothing can be recorded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let posts = sim.stats().posts;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        sim.stats().posts,
        posts,
        "attempts went out without a durable intent"
    );
    assert!(posts <= acked.len() as u64);
    engine.shutdown(Duration::from_secs(5)).await;

    std::fs::remove_file(&filler).unwrap();
    let engine = start_engine(&ledger, target(&sim.base_url(), |_| {}));
    for key in &acked {
        let state = engine.state(task_id(key)).await.unwrap();
        assert!(state.request.is_some(), "acknowledged {key} was lost");
    }
    let delivered = acked.len() + 1;
    for (i, key) in keys[..delivered].iter().enumerate() {
        engine
            .submit(padded(key), source(10_000 + i as i64))
            .await
            .unwrap();
    }
    for key in &keys[..delivered] {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    assert!(engine.ledger().stats().failing().is_none());
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A slow remote: with 0–500 ms of latency per create against a 400 ms request timeout, about
/// a fifth of the attempts time out while the remote goes on and creates the record. Those
/// unknowns are reconciled by lookup; nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_remote_is_reconciled_without_duplicates() {
    let sim = Sim::start(SimConfig {
        seed: crate::seed(0x510e),
        faults: Faults {
            latency_jitter: Duration::from_millis(500),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(dir.path(), target(&sim.base_url(), |_| {}));
    let keys: Vec<String> = (0..200).map(|i| format!("slow-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    let mut by_lookup = 0;
    for key in &keys {
        let state = wait_for(&engine, task_id(key), Duration::from_secs(60), settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        by_lookup += usize::from(state.evidence == Some(Evidence::Lookup));
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    assert!(
        by_lookup >= 10,
        "only {by_lookup} of 200 timed out; the remote was not slow"
    );
    assert_eq!(sim.stats().posts, 200, "no attempt was sent twice");
    assert_eq!(sim.stats().duplicates, 0);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The remote is down for a while (connection refused; 20 s here, `SENDLEDGER_REMOTE_DOWN_SECS`
/// for minutes) and the target has no breaker: attempts are certainly not sent, so they are retried with capped backoff
/// within `max_attempts`; when the remote returns, every task succeeds with one record, and no
/// unknown outcome was ever recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_down_for_a_while_is_waited_out_without_unknowns() {
    let down = Duration::from_secs(
        std::env::var("SENDLEDGER_REMOTE_DOWN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let max_backoff = Duration::from_secs(2);
    // Enough attempts to outlast the outage: with full jitter under a 2 s cap, a retry comes
    // about every second.
    let max_attempts = down.as_secs() as u32 * 2 + 20;
    let engine = start_engine(
        dir.path(),
        target(&format!("http://127.0.0.1:{port}"), |t| {
            t["retry"]["max_attempts"] = max_attempts.into();
            t["retry"]["max_backoff"] = "2s".into();
            // The retry path alone: with the breaker, tasks would wait instead
            // (`outage::an_outage_with_refused_connections_becomes_a_delay`).
            t["breaker"]["enabled"] = false.into();
        }),
    );
    let keys: Vec<String> = (0..50).map(|i| format!("down-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    tokio::time::sleep(down).await;
    let sim = Sim::start(SimConfig {
        listen: ([127, 0, 0, 1], port).into(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    for key in &keys {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
        let events = engine.events(task_id(key)).await.unwrap();
        assert!(!events
            .iter()
            .any(|e| matches!(e.body, EventBody::SendUnknown { .. })));
        let retries: Vec<(u64, u64)> = events
            .iter()
            .filter_map(|e| match e.body {
                EventBody::SendNotSent { retry_at, .. } => Some((e.at, retry_at)),
                _ => None,
            })
            .collect();
        assert!(
            retries.len() >= 2,
            "{key} was retried while the remote was down"
        );
        for (at, retry_at) in retries {
            assert!(
                retry_at - at <= max_backoff.as_millis() as u64,
                "{key}: backoff over the cap"
            );
        }
        assert!(state.attempts <= max_attempts);
    }
    assert_eq!(sim.stats().posts, 50);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Kafka mode's send lease, seen from the engine: an attempt whose first byte cannot leave
/// within the lease of its intent (here 1µs: recording the intent alone takes longer) is
/// recorded not sent, with the lease named, and nothing reaches the remote. It is this
/// process's delay, so it uses up none of the target's attempts: the same task, resumed by an
/// engine whose lease it can keep, sends once and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_misses_its_send_lease_is_not_sent_and_tried_again() {
    let sim = sim(Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let start = |lease: Duration| {
        let mut config = sendledger_actors::EngineConfig::new(dir.path());
        config.timer_tick = Duration::from_millis(5);
        config.send_lease = Some(lease);
        let remote = std::sync::Arc::new(sendledger_node::wiring::HttpRemote::new(targets(
            target(&sim.base_url(), |_| {}),
        )));
        tokio::task::block_in_place(|| sendledger_actors::Engine::start(config, remote)).unwrap()
    };
    let expired = |events: &[sendledger_core::Event]| {
        events
            .iter()
            .filter(|e| {
                matches!(&e.body, EventBody::SendNotSent {
                    cause: NotSentCause::LocalResources(reason), ..
                } if reason.starts_with("send lease expired"))
            })
            .count()
    };

    let engine = start(Duration::from_micros(1));
    engine.submit(request("lease-1"), source(0)).await.unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    // More lapsed attempts than `max_attempts` (5): they do not use the target's attempts up.
    while expired(&engine.events(task_id("lease-1")).await.unwrap()) < 6 {
        assert!(std::time::Instant::now() < deadline, "no lapsed attempts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let state = engine.state(task_id("lease-1")).await.unwrap();
    assert!(!state.phase.is_terminal(), "{:?}", state.phase);
    engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(sim.stats().posts, 0, "a request left after its lease");

    let engine = start(Duration::from_secs(10));
    let state = wait_for(&engine, task_id("lease-1"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(sim.records_with_identity("lease-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Lookups at a remote that fails them back off per target: 20 unknown tasks looked up every
/// 50 ms for 4 s would ask about 1,600 times; the target's lookups wait 1 s after the first
/// failures, then one probes at a time (2 s, 4 s...). Each task keeps waiting (a failed lookup
/// is no evidence either way); once the lookups answer, they are asked at the tasks' own pace
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_lookups_back_off_instead_of_hammering_the_remote() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let sim = sim(Faults {
        commit_then_drop: 1.0,
        ..Faults::default()
    })
    .await;
    // The lookups go to a server that counts them and answers 503 while `down`, then `[]`.
    let lookups = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let lookups_addr = lookups.local_addr().unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicBool::new(true));
    let (counter, is_down) = (asked.clone(), down.clone());
    let server = tokio::spawn(async move {
        while let Ok((mut stream, _)) = lookups.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let answer: &[u8] = if is_down.load(Ordering::SeqCst) {
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]"
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(answer).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let engine = start_engine(
        dir.path(),
        target(&sim.base_url(), |t| {
            t["lookup"]["url"] =
                format!("http://{lookups_addr}/records?reference={{task_id}}").into();
            t["lookup"]["check_interval"] = "50ms".into();
            t["lookup"]["deadline"] = "30s".into();
            t["breaker"]["enabled"] = false.into();
        }),
    );
    let keys: Vec<String> = (0..20).map(|i| format!("lb-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = asked.load(Ordering::SeqCst);
    assert!(
        (1..=60).contains(&during),
        "{during} lookups in 4 s: the target's lookups back off"
    );
    for key in &keys {
        let state = engine.state(task_id(key)).await.unwrap();
        assert_eq!(
            state.phase,
            Phase::Unknown,
            "{key}: still waiting, no evidence"
        );
    }
    down.store(false, Ordering::SeqCst);
    // The probe after the current backoff (at most 8 s by now) answers; then every task asks
    // again every 50 ms.
    let before = asked.load(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while asked.load(Ordering::SeqCst) < before + 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "lookups did not resume after the remote answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.abort();
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A class of "not sent" with a timeout of its own: the attempt that retries a 5xx declared
/// not performed waits for its answer `retry.server_error.timeout`, not the target's
/// `request_timeout`. Here the retry hangs (the remote commits and never answers): its outcome
/// is unknown after the class's 300 ms, and the lookup confirms it, long before the target's
/// 60 s request timeout would have ended it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_its_answer_within_its_class_timeout() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.set_faults(Faults {
        error: 1.0,
        error_status: 503,
        ..Faults::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = target(&sim.base_url(), |t| {
        t["request_timeout"] = "60s".into();
        t["on_5xx"] = "not_sent".into();
        t["retry"] = serde_json::json!({
            "max_attempts": 3, "initial_backoff": "1s", "max_backoff": "1s", "multiplier": 1.0, "jitter": false,
            "server_error": { "timeout": "300ms" }
        });
        t["breaker"] = serde_json::json!({ "enabled": false });
    });
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    engine.submit(request("cls-1"), source(0)).await.unwrap();
    // The first attempt is answered 503 (not performed); its retry comes 1 s later.
    wait_for(&engine, task_id("cls-1"), WAIT, |s| {
        s.phase == Phase::RetryWait
    })
    .await;
    sim.set_faults(Faults {
        commit_then_hang: 1.0,
        ..Faults::default()
    })
    .unwrap();
    let state = wait_for(&engine, task_id("cls-1"), Duration::from_secs(20), settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.evidence, Some(Evidence::Lookup));
    let events = engine.events(task_id("cls-1")).await.unwrap();
    assert!(events.iter().any(|e| matches!(
        e.body,
        EventBody::SendUnknown {
            attempt: 2,
            cause: UnknownCause::Timeout
        }
    )));
    assert_eq!(sim.records_with_identity("cls-1").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}
