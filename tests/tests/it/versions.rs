//! Task versions: a request naming a higher version of the same identity runs again, once,
//! after the versions before it settled; a lower version is a redelivery of that version or
//! refused, never executed. The engine over real RocksDB, the simulated remote over real
//! sockets; checked on the remote's records, the tasks' events and the audit.

use std::time::Duration;

use sendledger_actors::Engine;
use sendledger_core::decide::OperatorResolution;
use sendledger_core::result::Projection;
use sendledger_core::{
    CheckConfig, EventBody, Phase, PreviousVersion, ResultStatus, TaskId, TaskRequest, WaitReason,
};
use sendledger_sim::{Sim, SimConfig};
use sendledger_store::Ledger;
use sendledger_tests::engine::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn versioned(key: &str, version: u32, amount: u64) -> TaskRequest {
    let mut request = request(key);
    request.version = version;
    request.payload = json!({ "amount": amount, "currency": "EUR" });
    request
}

fn version_id(key: &str, version: u32) -> TaskId {
    TaskId::derive_version("acme", "payment.create", key, version)
}

/// The result a task's events announce last, as the results topic carries it.
async fn result(engine: &Engine, task: TaskId) -> sendledger_core::TaskResult {
    let events = engine.events(task).await.unwrap();
    Projection::of(&events)
        .announced()
        .cloned()
        .expect("a result")
}

fn audit_clean(dir: &std::path::Path) {
    let ledger = Ledger::open_read_only(dir).unwrap();
    let report = sendledger_store::audit(&ledger, CheckConfig::default(), |_| {}).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// Version 1 fails (the remote refuses every connection); version 2, with a fixed payload, runs
/// and succeeds: one record at the remote. A redelivery of version 1 gets version 1's result
/// again, another payload under version 1 is a conflict, version 0 (never accepted) is refused,
/// and version 1 is not retried now that version 2 exists. Under another key, version 1
/// arriving after version 2 is refused, never executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_version_runs_again_once_and_lower_ones_never_do() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = target(&sim.base_url(), |t| {
        t["retry"] = json!({ "max_attempts": 2, "initial_backoff": "5ms", "max_backoff": "10ms", "multiplier": 2.0 });
        t["breaker"] = json!({ "enabled": false });
    });
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));

    sim.set_offline(true).await.unwrap();
    engine
        .submit(versioned("ord-1", 1, 100), source(0))
        .await
        .unwrap();
    let v1 = version_id("ord-1", 1);
    let state = wait_for(&engine, v1, WAIT, settled).await;
    assert_eq!(state.phase, Phase::Failed);
    sim.set_offline(false).await.unwrap();

    let reply = engine
        .submit(versioned("ord-1", 2, 120), source(1))
        .await
        .unwrap();
    let v2 = version_id("ord-1", 2);
    assert_eq!(reply.task_id, v2);
    assert_eq!(
        reply.events,
        ["TaskAccepted", "RequestVersion", "SendIntended"]
    );
    let state = wait_for(&engine, v2, WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    let records = sim.records_with_identity("ord-1");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body["amount"], 120);
    assert_eq!(records[0].body["reference"], v2.to_string());
    let events = engine.events(v2).await.unwrap();
    assert_eq!(
        events[1].body,
        EventBody::RequestVersion {
            version: 2,
            previous: Some(PreviousVersion {
                version: 1,
                task_id: v1
            })
        }
    );
    let announced = result(&engine, v2).await;
    assert_eq!(announced.status, ResultStatus::Succeeded);
    assert_eq!(announced.request_version, 2);
    assert_eq!(announced.task_id, v2.to_string());

    // Version 1 again: its own result, re-announced; another payload: a conflict.
    let again = engine
        .submit(versioned("ord-1", 1, 100), source(2))
        .await
        .unwrap();
    assert_eq!(
        (again.task_id, again.events.clone()),
        (v1, vec!["DuplicateDelivery"])
    );
    let failed = result(&engine, v1).await;
    assert_eq!(
        (failed.status, failed.request_version),
        (ResultStatus::Failed, 1)
    );
    let other = engine
        .submit(versioned("ord-1", 1, 999), source(3))
        .await
        .unwrap();
    assert_eq!(other.events, ["RequestConflict"]);
    // Version 0 was never accepted: refused, and nothing is recorded for it.
    let stale = engine.submit(versioned("ord-1", 0, 100), source(4)).await;
    let message = stale.expect_err("refused").to_string();
    assert!(
        message.contains("version 0 of this request was never accepted"),
        "{message}"
    );
    assert!(engine
        .events(version_id("ord-1", 0))
        .await
        .unwrap()
        .is_empty());
    // Version 1 is settled for good: version 2 ran after it.
    let retry = engine
        .resolve(
            v1,
            OperatorResolution::Retry {
                by: "ana".into(),
                reason: "the remote is back".into(),
            },
        )
        .await;
    let message = retry.expect_err("refused").to_string();
    assert!(message.contains("a later version"), "{message}");

    // Another key: version 2 first, then version 1, which never runs.
    engine
        .submit(versioned("ord-2", 2, 50), source(5))
        .await
        .unwrap();
    wait_for(&engine, version_id("ord-2", 2), WAIT, settled).await;
    let stale = engine.submit(versioned("ord-2", 1, 50), source(6)).await;
    assert!(stale.is_err(), "{stale:?}");
    assert!(engine
        .events(version_id("ord-2", 1))
        .await
        .unwrap()
        .is_empty());
    // A version above the latest runs, naming the latest as the one before it.
    engine
        .submit(versioned("ord-2", 7, 50), source(7))
        .await
        .unwrap();
    let state = wait_for(&engine, version_id("ord-2", 7), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.previous_version.map(|p| p.version), Some(2));
    assert_eq!(sim.records_with_identity("ord-2").len(), 2);
    assert_eq!(sim.stats().posts, 3);
    engine.shutdown(Duration::from_secs(5)).await;
    audit_clean(dir.path());
}

/// Version 2 arrives while version 1 is still being retried: it is recorded, waits (one
/// `SendDeferred` naming version 1) and sends nothing, also across a restart. Once version 1
/// succeeds, version 2 goes on at once (long before its own next look), and its record is
/// created after version 1's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_waits_for_the_one_before_it_across_a_restart() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        target(&sim.base_url(), |t| {
            t["retry"] = json!({ "max_attempts": 1000, "initial_backoff": "50ms", "max_backoff": "100ms", "multiplier": 2.0 });
            t["breaker"] = json!({ "enabled": false });
        })
    };
    let engine = tokio::task::block_in_place(|| start(dir.path(), config()));
    sim.set_offline(true).await.unwrap();
    engine
        .submit(versioned("ord-9", 1, 100), source(0))
        .await
        .unwrap();
    let (v1, v2) = (version_id("ord-9", 1), version_id("ord-9", 2));
    let reply = engine
        .submit(versioned("ord-9", 2, 200), source(1))
        .await
        .unwrap();
    assert_eq!(
        reply.events,
        ["TaskAccepted", "RequestVersion", "SendDeferred"]
    );
    let waiting = |events: &[sendledger_core::Event]| {
        events
            .iter()
            .filter(|e| {
                matches!(
                    &e.body,
                    EventBody::SendDeferred {
                        reason: WaitReason::EarlierVersion { version: 1, task_id },
                        ..
                    } if *task_id == v1
                )
            })
            .count()
    };
    assert_eq!(waiting(&engine.events(v2).await.unwrap()), 1);
    // Restarted while both wait: version 1 keeps trying, version 2 keeps waiting.
    engine.shutdown(Duration::from_secs(5)).await;
    let engine = tokio::task::block_in_place(|| start(dir.path(), config()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!engine.state(v1).await.unwrap().phase.is_terminal());
    let events = engine.events(v2).await.unwrap();
    assert_eq!(waiting(&events), 1, "{events:#?}");
    assert!(events
        .iter()
        .all(|e| !matches!(e.body, EventBody::SendIntended { .. })));

    sim.set_offline(false).await.unwrap();
    let first = wait_for(&engine, v1, WAIT, settled).await;
    assert_eq!(first.phase, Phase::Succeeded);
    // Woken by version 1's settling, not by its own look a minute later.
    let second = wait_for(&engine, v2, Duration::from_secs(10), settled).await;
    assert_eq!(second.phase, Phase::Succeeded);
    let records = sim.records_with_identity("ord-9");
    assert_eq!(records.len(), 2);
    assert_eq!(
        (
            records[0].body["amount"].clone(),
            records[1].body["amount"].clone()
        ),
        (json!(100), json!(200))
    );
    engine.shutdown(Duration::from_secs(5)).await;
    audit_clean(dir.path());
}

/// The audit finds a version that began before the one before it settled, and an earlier
/// version that sent again after a later one began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_finds_versions_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), Default::default()).unwrap();
    let accept = |version: u32, previous: Option<PreviousVersion>, offset: i64| {
        let request = versioned("ord-5", version, 10)
            .accept(&Default::default())
            .unwrap();
        vec![
            EventBody::TaskAccepted {
                payload_hash: request.payload_hash(),
                request,
                source: source(offset),
            },
            EventBody::RequestVersion { version, previous },
        ]
    };
    let intent = |attempt| EventBody::SendIntended {
        attempt,
        idempotency_key: None,
    };
    let (v1, v2) = (version_id("ord-5", 1), version_id("ord-5", 2));
    let mut states = std::collections::BTreeMap::new();
    let mut write = |task: TaskId, bodies: Vec<EventBody>| {
        let state = states
            .entry(task)
            .or_insert_with(sendledger_core::State::default);
        let decision = sendledger_core::Decision {
            events: bodies,
            action: sendledger_core::Action::None,
        };
        let (next, append) = sendledger_actors::task::record(task, state, &decision, 1);
        *state = next;
        append
    };
    let previous = PreviousVersion {
        version: 1,
        task_id: v1,
    };
    let appends = [
        write(v1, [accept(1, None, 0), vec![intent(1)]].concat()),
        // Version 2 sends while version 1's attempt is in flight...
        write(v2, [accept(2, Some(previous), 1), vec![intent(1)]].concat()),
        // ...and version 1, not sent, tries again after it.
        write(
            v1,
            vec![
                EventBody::SendNotSent {
                    attempt: 1,
                    cause: sendledger_core::NotSentCause::Connect("refused".into()),
                    retry_at: 2,
                },
                intent(2),
            ],
        ),
    ];
    for append in appends {
        ledger.append(append).await.unwrap();
    }
    drop(ledger);
    let ledger = Ledger::open_read_only(dir.path()).unwrap();
    let report = sendledger_store::audit(&ledger, CheckConfig::default(), |_| {}).unwrap();
    let found: Vec<(&str, Option<String>, String)> = (report.violations.iter())
        .map(|v| (v.rule, v.task_id.clone(), v.detail.clone()))
        .collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found
        .iter()
        .all(|(rule, task, _)| *rule == "versions-in-order"
            && task.as_deref() == Some(v2.to_string().as_str())));
    assert!(found[0].2.contains("while version 1"), "{found:#?}");
    assert!(
        found[1].2.contains("recorded an intent after"),
        "{found:#?}"
    );
}

/// Through the service on the embedded cluster: version 1 and version 2 of one request,
/// produced together, run one after the other; version 1 again is answered with its result,
/// and version 0, never accepted, with a `rejected` result. Every result names its request's
/// version; the remote holds one record of each version that ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_versions_in_order_and_answers_each_with_its_own_result() {
    use sendledger_tests::kafka::{
        embedded, identity_key, local_service, produce, read_until, start_local_service,
    };
    let kafka = embedded();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_service(dir.path(), &kafka, &sim);
    config.engine.timer_tick = Duration::from_millis(5);
    let service = start_local_service(config, &kafka).await.unwrap();
    let message = |version: u32, amount: u64| {
        let bytes = serde_json::to_vec(&versioned("ord-4", version, amount)).unwrap();
        (None, identity_key("ord-4"), Some(bytes))
    };
    produce(&kafka, vec![message(1, 100), message(2, 200)]).await;
    let topic = kafka.config().results_topic.clone();
    let first = read_until(&kafka, &topic, |recs| recs.len() >= 2).await;
    produce(&kafka, vec![message(1, 100), message(0, 100)]).await;
    let records = read_until(&kafka, &topic, |recs| recs.len() >= 4).await;
    // The results of the identity's tasks are keyed by it, so in order; the rejected message's
    // may be on another partition.
    let (rejected, results): (Vec<_>, Vec<_>) = records
        .iter()
        .partition(|r| r.value["status"] == "rejected");
    let seen: Vec<_> = results
        .iter()
        .map(|r| {
            (
                r.value["request_version"].as_u64().unwrap(),
                r.value["status"].as_str().unwrap(),
                r.value["task_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let (v1, v2) = (
        version_id("ord-4", 1).to_string(),
        version_id("ord-4", 2).to_string(),
    );
    assert_eq!(
        seen,
        [
            (1, "succeeded", v1.clone()),
            (2, "succeeded", v2),
            (1, "succeeded", v1)
        ],
        "{records:#?}"
    );
    // Version 1 again: its first result, under the same event id.
    assert_eq!(results[2].event_id, first[0].event_id);
    assert_eq!(rejected.len(), 1, "{records:#?}");
    assert_eq!(rejected[0].value["request_version"], 0);
    let reason = rejected[0].value["reason"].as_str().unwrap();
    assert!(
        reason.contains("version 0 of this request was never accepted"),
        "{reason}"
    );
    let remote = sim.records_with_identity("ord-4");
    assert_eq!(remote.len(), 2);
    assert_eq!(remote[0].body["amount"], 100);
    assert_eq!(remote[1].body["amount"], 200);
    service.shutdown().await.unwrap();
    audit_clean(dir.path());
}
