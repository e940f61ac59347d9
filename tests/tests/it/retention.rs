//! Retention: settled tasks' histories removed from a real ledger, what is kept of them, and
//! what is never removed. The engine over real RocksDB, the simulated remote over real
//! sockets; checked on the remote's records, the ledger's log and the audit.

use std::time::Duration;

use sendledger_core::decide::OperatorResolution;
use sendledger_core::{CheckConfig, EventBody, Limits, Phase, ResultStatus, TaskId, UnknownCause};
use sendledger_sim::{Sim, SimConfig};
use sendledger_store::Ledger;
use sendledger_tests::engine::*;
use sendledger_tests::kafka::{local_service, start_local_service};

const WAIT: Duration = Duration::from_secs(20);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn accepted(key: &str, offset: i64) -> EventBody {
    let request = request(key).accept(&Limits::default()).unwrap();
    EventBody::TaskAccepted {
        payload_hash: request.payload_hash(),
        request,
        source: source(offset),
    }
}

fn audit(dir: &std::path::Path) -> sendledger_core::audit::AuditReport {
    let ledger = Ledger::open_read_only(dir).unwrap();
    sendledger_store::audit(&ledger, CheckConfig::default(), |_| {}).unwrap()
}

/// The audit's findings about anything but the task whose history breaks a rule on purpose;
/// panics unless that task's violation is among them (it was kept for the audit to see).
fn findings_besides_broken(report: &sendledger_core::audit::AuditReport) -> Vec<String> {
    let broken = task_id("broken").to_string();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.task_id.as_deref() == Some(broken.as_str())),
        "the broken task's violation is not reported: {:#?}",
        report.violations
    );
    (report.violations.iter())
        .filter(|v| v.task_id.as_deref() != Some(broken.as_str()))
        .map(|v| format!("{} {:?}: {}", v.rule, v.task_id, v.detail))
        .collect()
}

/// Twelve tasks succeed; a task whose outcome is unknown and one whose history breaks a rule
/// are in the ledger beside them. Retention removes the twelve only once their events are
/// published, keeps the other two whole, answers a redelivery of a removed task with its
/// result (nothing sent), a different payload with a conflict, refuses a retry, never gives
/// a removed LSN again after a restart, and the audit accounts for every removed event and
/// finds an event removed behind retention's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_tasks_are_removed_and_answered_from_what_is_kept() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // In the ledger before the engine starts: an attempt whose outcome is unknown (the lookup
    // finds nothing, so it stays unknown, then goes to review), and a settled task that sent
    // twice without an outcome between (a rule broken).
    write_history(
        dir.path(),
        "unknown",
        vec![
            accepted("unknown", 100),
            EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
            EventBody::SendUnknown {
                attempt: 1,
                cause: UnknownCause::Timeout,
            },
        ],
    )
    .await;
    let intent = |attempt| EventBody::SendIntended {
        attempt,
        idempotency_key: None,
    };
    write_history(
        dir.path(),
        "broken",
        vec![
            accepted("broken", 101),
            intent(1),
            intent(2),
            EventBody::Confirmed {
                remote_id: "x".into(),
                evidence: sendledger_core::Evidence::Response { status: 201 },
            },
        ],
    )
    .await;
    let engine = tokio::task::block_in_place(|| start(dir.path(), target(&sim.base_url(), |_| {})));
    let keys: Vec<String> = (0..12).map(|i| format!("k-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in &keys {
        wait_for(&engine, task_id(key), WAIT, settled).await;
    }
    let ledger = engine.ledger().clone();
    let last_of = |task: TaskId| {
        let ledger = ledger.clone();
        async move {
            let events = ledger.read(move |l| l.task_events(task)).await.unwrap();
            events.iter().map(|e| e.lsn).max().unwrap()
        }
    };
    let mut lasts = Vec::new();
    for key in &keys {
        lasts.push(last_of(task_id(key)).await);
    }
    let mut sorted = lasts.clone();
    sorted.sort_unstable();
    let published = sorted[5];
    let cutoff = now_ms() + 1;

    // Published up to the sixth task's last event: those six only.
    let pruned = engine.prune_settled(cutoff, Some(published)).await.unwrap();
    assert_eq!(pruned, 6);
    for (key, last) in keys.iter().zip(&lasts) {
        let events = engine.events(task_id(key)).await.unwrap();
        let removed = matches!(events[0].body, EventBody::Pruned { .. });
        assert_eq!(removed, *last <= published, "{key}: last event {last}");
    }
    // Everything published: the other six; never the unknown task nor the broken one.
    assert_eq!(engine.prune_settled(cutoff, None).await.unwrap(), 6);
    assert_eq!(engine.prune_settled(cutoff, None).await.unwrap(), 0);
    for key in ["unknown", "broken"] {
        let events = engine.events(task_id(key)).await.unwrap();
        assert!(
            matches!(events[0].body, EventBody::TaskAccepted { .. }),
            "{key} removed"
        );
    }
    let records_before = sim.stats().posts;
    for (i, key) in keys.iter().enumerate() {
        let events = engine.events(task_id(key)).await.unwrap();
        assert_eq!(events.len(), 1, "{key}: {events:?}");
        let EventBody::Pruned { retained } = &events[0].body else {
            panic!("{key}: {events:?}");
        };
        let records = sim.records_with_identity(key);
        assert_eq!(records.len(), 1);
        assert_eq!(retained.result_status(), ResultStatus::Succeeded);
        assert_eq!(retained.remote_id.as_deref(), Some(records[0].id.as_str()));
        // The identity still deduplicates: the same request is a duplicate, another payload
        // a conflict, and nothing reaches the remote.
        let again = engine
            .submit(request(key), source(1000 + i as i64))
            .await
            .unwrap();
        assert_eq!(again.events, ["DuplicateDelivery"]);
        assert_eq!(again.phase, Phase::Succeeded);
        let mut other = request(key);
        other.payload = serde_json::json!({ "amount": 1 });
        let conflict = engine.submit(other, source(2000 + i as i64)).await.unwrap();
        assert_eq!(conflict.events, ["RequestConflict"]);
    }
    let retry = engine
        .resolve(
            task_id("k-0"),
            OperatorResolution::Retry {
                by: "ana".into(),
                reason: "again".into(),
            },
        )
        .await;
    assert!(retry.is_err(), "{retry:?}");
    assert_eq!(sim.stats().posts, records_before);
    let last_lsn = engine.ledger().last_lsn();
    drop(ledger);
    engine.shutdown(Duration::from_secs(5)).await;

    let report = audit(dir.path());
    assert_eq!(findings_besides_broken(&report), Vec::<String>::new());
    assert_eq!(report.pruned_tasks, 12);
    // Each success is three events: accepted, intended, confirmed.
    assert_eq!(report.pruned_events, 12 * 3, "{report:?}");
    assert_eq!(report.events + report.pruned_events, report.last_lsn);

    // After a restart: the removed tasks are still known, and new events get new LSNs.
    let engine = tokio::task::block_in_place(|| start(dir.path(), target(&sim.base_url(), |_| {})));
    assert_eq!(engine.ledger().last_lsn(), last_lsn);
    let again = engine.submit(request("k-3"), source(3000)).await.unwrap();
    assert_eq!(again.events, ["DuplicateDelivery"]);
    assert!(again.lsns.start > last_lsn);
    let state = engine.state(task_id("k-3")).await.unwrap();
    assert_eq!(state.phase, Phase::Succeeded);
    engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(sim.stats().posts, records_before);
    assert_eq!(
        findings_besides_broken(&audit(dir.path())),
        Vec::<String>::new()
    );

    // An event removed behind retention's back is found.
    {
        let ledger = Ledger::open(dir.path(), Default::default()).unwrap();
        let events = ledger.task_events(task_id("unknown")).unwrap();
        ledger.delete_log_entry(events[1].lsn).unwrap();
    }
    let found = findings_besides_broken(&audit(dir.path()));
    assert!(
        found
            .iter()
            .any(|f| f.contains("no retention accounts for")),
        "{found:#?}"
    );
}

/// The service with `storage.retention = "1s"` on the embedded cluster: 40 requests are
/// executed and their results published, then their histories removed by retention's own
/// loop. The same 40 requests delivered again are answered on the results topic with each
/// task's result under its first event id (nothing sent again), 5 of them with another
/// payload with a conflict; those events are removed in turn, and the audit of the ledger
/// accounts for every removed event, the archive's for every removed history.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_removes_settled_histories_and_still_answers_their_redeliveries() {
    use sendledger_tests::kafka::{
        embedded, produce, read_until, request_messages, results_for, task_ids,
    };
    let kafka = embedded();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = tempfile::tempdir().unwrap();
    let mut config = local_service(dir.path(), &kafka, &sim);
    config.storage.retention = Some(Duration::from_secs(1));
    config.storage.archive = Some(archive.path().to_path_buf());
    config.engine.timer_tick = Duration::from_millis(5);
    let service = start_local_service(config, &kafka).await.unwrap();

    let keys: Vec<String> = (0..40).map(|i| format!("kept-{i}")).collect();
    produce(&kafka, request_messages(keys.iter())).await;
    let (_, first) = results_for(&kafka, task_ids(&keys)).await;
    assert_eq!(first.len(), 40);
    // Until every task's history is what retention kept of it, and nothing since.
    let all_removed = |keys: Vec<String>| {
        let engine = service.engine().clone();
        async move {
            let deadline = std::time::Instant::now() + WAIT;
            for key in &keys {
                loop {
                    let events = engine.events(task_id(key)).await.unwrap();
                    if events.len() == 1 && matches!(events[0].body, EventBody::Pruned { .. }) {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{key} kept: {events:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    };
    all_removed(keys.clone()).await;

    produce(&kafka, request_messages(keys.iter())).await;
    let conflicting: Vec<_> = keys[..5]
        .iter()
        .map(|k| {
            let mut r = request(k);
            r.payload = serde_json::json!({ "amount": 1 });
            (
                None,
                sendledger_tests::kafka::identity_key(k),
                Some(serde_json::to_vec(&r).unwrap()),
            )
        })
        .collect();
    produce(&kafka, conflicting).await;
    let topic = kafka.config().results_topic.clone();
    let records = read_until(&kafka, &topic, |recs| recs.len() >= 40 * 2 + 5).await;
    for result in &first {
        let again: Vec<_> = records
            .iter()
            .filter(|r| r.event_id == result.event_id)
            .collect();
        assert_eq!(again.len(), 2, "{}: {again:?}", result.event_id);
        let v = &again[1].value;
        assert_eq!(v["status"], "succeeded");
        assert_eq!(v["remote_id"].as_str(), result.remote_id.as_deref());
        assert_eq!(v["lsn"], result.lsn);
    }
    let conflicts = records
        .iter()
        .filter(|r| r.value["status"] == "conflict")
        .count();
    assert_eq!(conflicts, 5);
    assert_eq!(sim.stats().posts, 40);
    for key in &keys {
        assert_eq!(sim.records_with_identity(key).len(), 1);
    }
    // The duplicates and conflicts recorded since are removed in turn.
    all_removed(keys.clone()).await;
    service.shutdown().await.unwrap();
    let report = audit(dir.path());
    assert!(report.is_clean(), "{:#?}", report.violations);
    // Each task removed, then its duplicate (and a conflict: in the same pass or the next).
    assert!((80..=85).contains(&report.pruned_tasks), "{report:?}");
    assert_eq!(report.pruned_events, 40 * 3 + 40 + 5);
    assert_eq!(report.events, 0);

    // The command line audits the archive with the ledger, and shows a removed task's events.
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
            .args(args)
            .args(["--data", dir.path().to_str().unwrap()])
            .args(["--archive", archive.path().to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = cli(&["audit", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reports["ledger"]["pruned_tasks"], report.pruned_tasks);
    assert_eq!(reports["archive"]["tasks"], 40);
    assert_eq!(reports["archive"]["tasks_by_state"]["succeeded"], 40);
    assert_eq!(reports["archive"]["violations"], serde_json::json!([]));
    let out = cli(&["inspect", &task_id("kept-7").to_string()]);
    let timeline = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<_> = timeline
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        names,
        [
            Some("TaskAccepted"),
            Some("SendIntended"),
            Some("Confirmed"),
            Some("DuplicateDelivery")
        ],
        "{timeline}"
    );
}

/// Past the identity retention, what retention kept of a task is forgotten with whatever was
/// recorded after it: the ledger holds nothing of the task, the audit still accounts for every
/// removed event, and the same request is then a new task, executed again (the consequence the
/// configuration's check against the requests topic's retention guards against).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_identity_is_a_new_task() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start(dir.path(), target(&sim.base_url(), |_| {})));
    let keys = ["f-0", "f-1", "f-2"];
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in keys {
        wait_for(&engine, task_id(key), WAIT, settled).await;
    }
    let settled_by = now_ms() + 1;
    assert_eq!(
        engine.forget_expired(settled_by).await.unwrap(),
        0,
        "nothing removed yet"
    );
    assert_eq!(engine.prune_settled(settled_by, None).await.unwrap(), 3);
    let again = engine.submit(request("f-0"), source(10)).await.unwrap();
    assert_eq!(again.events, ["DuplicateDelivery"]);
    assert_eq!(
        engine.forget_expired(1).await.unwrap(),
        0,
        "settled after the cutoff"
    );
    assert_eq!(engine.forget_expired(settled_by).await.unwrap(), 3);
    let ledger = engine.ledger().clone();
    for key in keys {
        let task = task_id(key);
        assert!(engine.events(task).await.unwrap().is_empty());
        assert_eq!(ledger.retained(task).unwrap(), None);
        assert_eq!(ledger.task_summary(task).unwrap(), None);
    }
    assert_eq!(ledger.pruned_totals().unwrap().forgotten, 3);
    let new = engine.submit(request("f-0"), source(11)).await.unwrap();
    assert_eq!(new.events[0], "TaskAccepted");
    wait_for(&engine, task_id("f-0"), WAIT, settled).await;
    assert_eq!(sim.records_with_identity("f-0").len(), 2);
    drop(ledger);
    engine.shutdown(Duration::from_secs(5)).await;
    let report = audit(dir.path());
    assert!(report.is_clean(), "{:#?}", report.violations);
    // Three histories of three events, and the duplicate recorded after one of them.
    assert_eq!(report.pruned_events, 3 * 3 + 1);
    assert_eq!(report.events + report.pruned_events, report.last_lsn);
}

/// `storage.identity_retention` shorter than the requests topic keeps its messages is refused
/// at start, naming both (a redelivery from the topic could come after its identity was
/// forgotten); one at least as long starts. Against Apache Kafka, whose requests topic
/// is created with a retention of 7 days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_retention_shorter_than_the_requests_topics_is_refused() {
    use sendledger_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use sendledger_kafka::rdkafka::client::DefaultClientContext;
    let broker = sendledger_tests::kafka::Broker::single();
    let kafka =
        sendledger_kafka::Kafka::connect(sendledger_tests::kafka::config_for_process(&broker))
            .unwrap();
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config(sendledger_kafka::Role::Admin)
        .create()
        .unwrap();
    let topic = NewTopic::new(
        &kafka.config().requests_topic,
        kafka.config().partitions,
        TopicReplication::Fixed(1),
    )
    .set("retention.ms", "604800000");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for created in admin.create_topics(&[topic], &opts).await.unwrap() {
        created.unwrap();
    }
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let start = |identities: Duration| {
        let mut config = local_service(dir.path(), &kafka, &sim);
        config.storage.retention = Some(Duration::from_secs(86_400));
        config.storage.identity_retention = Some(identities);
        start_local_service(config, &kafka)
    };
    let err = start(Duration::from_secs(86_400)).await.err().unwrap();
    let text = sendledger_core::error::Chain(&err).to_string();
    assert!(
        text.contains("storage.identity_retention: is 1day, and the requests topic sendledger.requests keeps messages for 7days"),
        "{text}"
    );
    let service = start(Duration::from_secs(8 * 86_400)).await.unwrap();
    service.shutdown().await.unwrap();
}

/// An engine on `dir` with the test target at `sim`, archiving what retention removes in
/// `archive`.
fn start_archiving(
    dir: &std::path::Path,
    archive: &std::path::Path,
    sim: &Sim,
) -> sendledger_actors::Engine {
    tokio::task::block_in_place(|| {
        let mut config = sendledger_actors::EngineConfig::new(dir);
        config.timer_tick = Duration::from_millis(5);
        config.archive = Some(archive.to_path_buf());
        let remote =
            sendledger_node::wiring::HttpRemote::new(targets(target(&sim.base_url(), |_| {})));
        sendledger_actors::Engine::start(config, std::sync::Arc::new(remote)).unwrap()
    })
}

/// Retention with an archive (`storage.archive`): every history removed and every identity
/// forgotten is in the archive before it leaves the ledger, and so are the events recorded
/// after a removal, removed by the next pass or with the identity. The archive's audit checks each history against the rules and the
/// digest the ledger kept of it, and its chain against the ledger's record; `inspect`'s reader
/// gives a removed task's events back. An entry retention kept, changed behind its back, is
/// found by the ledger's audit and named by the archive's; a changed byte of the archive is
/// found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_histories_are_archived_and_audited_against_the_ledger() {
    use sendledger_store::archive::archived_history;
    use sendledger_store::archive_audit::audit_archive;
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let archive = tempfile::tempdir().unwrap();
    let archive_dir = archive.path().join("removed");
    let engine = start_archiving(dir.path(), &archive_dir, &sim);
    // Two waves: the first one's identities are forgotten later, the second's kept.
    let first: Vec<String> = (0..4).map(|i| format!("a-{i}")).collect();
    let second: Vec<String> = (0..4).map(|i| format!("b-{i}")).collect();
    for (i, key) in first.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in &first {
        wait_for(&engine, task_id(key), WAIT, settled).await;
    }
    let first_settled_by = now_ms() + 1;
    tokio::time::sleep(Duration::from_millis(20)).await;
    for (i, key) in second.iter().enumerate() {
        engine
            .submit(request(key), source(10 + i as i64))
            .await
            .unwrap();
    }
    for key in &second {
        wait_for(&engine, task_id(key), WAIT, settled).await;
    }
    let cutoff = now_ms() + 1;
    assert_eq!(engine.prune_settled(cutoff, None).await.unwrap(), 8);
    // A redelivery after the removal: the next pass removes its event in turn.
    let again = engine.submit(request("b-0"), source(20)).await.unwrap();
    assert_eq!(again.events, ["DuplicateDelivery"]);
    assert_eq!(engine.prune_settled(now_ms() + 1, None).await.unwrap(), 1);
    let events = engine.events(task_id("b-0")).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(matches!(&events[0].body, EventBody::Pruned { retained } if retained.events == 4));
    // Another one: its event goes when the identity is forgotten.
    let again = engine.submit(request("a-0"), source(21)).await.unwrap();
    assert_eq!(again.events, ["DuplicateDelivery"]);
    assert_eq!(engine.forget_expired(first_settled_by).await.unwrap(), 4);
    engine.shutdown(Duration::from_secs(5)).await;

    let ledger_report = audit(dir.path());
    assert!(ledger_report.is_clean(), "{:#?}", ledger_report.violations);
    assert_eq!(ledger_report.pruned_events, 8 * 3 + 2);
    let archive_audit = || {
        let ledger = Ledger::open_read_only(dir.path()).unwrap();
        audit_archive(&archive_dir, Some(&ledger), CheckConfig::default()).unwrap()
    };
    let report = archive_audit();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.skipped_checks, Vec::<String>::new());
    // Every removed history, whole: eight tasks, their 24 events and the two duplicates.
    assert_eq!((report.tasks, report.events), (8, 8 * 3 + 2));
    assert_eq!(report.tasks_by_state.get("succeeded"), Some(&8));
    let names = |task| -> Vec<&'static str> {
        let events = archived_history(&archive_dir, task).unwrap();
        events.iter().map(|e| e.body.name()).collect()
    };
    assert_eq!(
        names(task_id("a-0")),
        [
            "TaskAccepted",
            "SendIntended",
            "Confirmed",
            "DuplicateDelivery"
        ]
    );
    assert_eq!(
        names(task_id("b-0")),
        [
            "TaskAccepted",
            "SendIntended",
            "Confirmed",
            "DuplicateDelivery"
        ]
    );
    assert_eq!(
        names(task_id("b-1")),
        ["TaskAccepted", "SendIntended", "Confirmed"]
    );
    let files = std::fs::read_dir(&archive_dir).unwrap().count();
    assert!(files >= 1, "{files} files");

    // What retention kept of b-2, changed (its settlement time's last byte).
    let b2 = task_id("b-2");
    let original = {
        let ledger = Ledger::open(dir.path(), Default::default()).unwrap();
        let original = ledger.stored_retained(b2).unwrap().unwrap();
        let mut changed = original.clone();
        *changed.last_mut().unwrap() ^= 1;
        ledger.inject_retained(b2, &changed).unwrap();
        original
    };
    let found: Vec<_> = audit(dir.path())
        .violations
        .into_iter()
        .map(|v| (v.rule, v.task_id))
        .collect();
    assert_eq!(found, [("retained-intact", None)]);
    let found: Vec<_> = archive_audit()
        .violations
        .into_iter()
        .map(|v| (v.rule, v.task_id))
        .collect();
    assert_eq!(found, [("retained-intact", Some(b2.to_string()))]);
    {
        let ledger = Ledger::open(dir.path(), Default::default()).unwrap();
        ledger.inject_retained(b2, &original).unwrap();
    }
    assert!(audit(dir.path()).is_clean());
    assert!(archive_audit().is_clean());

    // A byte of the archive changed.
    let file = std::fs::read_dir(&archive_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let report = archive_audit();
    assert!(
        report.violations.iter().any(|v| v.rule == "archive-intact"),
        "{:#?}",
        report.violations
    );
}

/// An archive that cannot be written (its directory is a file) removes nothing: the settled
/// tasks stay whole in the ledger, and the audit finds nothing missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_that_cannot_be_written_removes_nothing() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let blocked = tempfile::NamedTempFile::new().unwrap();
    let engine = start_archiving(dir.path(), &blocked.path().join("archive"), &sim);
    let keys: Vec<String> = (0..3).map(|i| format!("c-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in &keys {
        wait_for(&engine, task_id(key), WAIT, settled).await;
    }
    assert_eq!(engine.prune_settled(now_ms() + 1, None).await.unwrap(), 0);
    for key in &keys {
        let events = engine.events(task_id(key)).await.unwrap();
        assert!(
            matches!(events[0].body, EventBody::TaskAccepted { .. }),
            "{events:?}"
        );
        assert_eq!(events.len(), 3);
    }
    engine.shutdown(Duration::from_secs(5)).await;
    let report = audit(dir.path());
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!((report.pruned_tasks, report.events), (0, 9));
}
