//! The audit: ledgers written through the store API with each kind of violation are reported
//! with the right rule, task and LSNs, and `sendledger audit` exits 2 on them and 0 on a clean
//! ledger; the events topic, published by the real publisher to the embedded cluster, audits
//! to the same findings with `--from-kafka`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sendledger_core::*;
use sendledger_kafka::{Kafka, KafkaConfig, Publisher};
use sendledger_store::{Append, Ledger, LedgerOptions, TaskSummary};

fn open(dir: &Path) -> Ledger {
    Ledger::open(dir, LedgerOptions::default()).unwrap()
}

fn accepted(key: &str) -> (TaskId, EventBody) {
    let request = TaskRequest {
        tenant: "acme".into(),
        operation: "payment.create".into(),
        request_key: key.into(),
        target: "payments".into(),
        payload: serde_json::json!({"amount": 1250}),
        payload_text: None,
        metadata: Default::default(),
        version: 0,
    }
    .accept(&Limits::default())
    .unwrap();
    let hash = request.payload_hash();
    (
        request.task_id(),
        EventBody::TaskAccepted {
            request,
            payload_hash: hash,
            source: Source {
                topic: "sendledger.requests".into(),
                partition: 0,
                offset: 0,
            },
        },
    )
}

fn intend(attempt: u32, key: Option<&str>) -> EventBody {
    EventBody::SendIntended {
        attempt,
        idempotency_key: key.map(String::from),
    }
}

fn unknown(attempt: u32) -> EventBody {
    EventBody::SendUnknown {
        attempt,
        cause: UnknownCause::Timeout,
    }
}

fn ok() -> EventBody {
    EventBody::Confirmed {
        remote_id: "r-1".into(),
        evidence: Evidence::Response { status: 201 },
    }
}

/// Appends task `key`'s events after its acceptance, as the engine would (summary and
/// identity included), and returns the task and the LSN of each event.
fn write_task(ledger: &Ledger, key: &str, bodies: Vec<EventBody>) -> (TaskId, Vec<u64>) {
    let (task, accept) = accepted(key);
    let events: Vec<NewEvent> = std::iter::once(accept)
        .chain(bodies)
        .enumerate()
        .map(|(seq, body)| NewEvent {
            task_id: task,
            task_seq: seq as u32,
            at: 1_000 + seq as u64,
            body,
        })
        .collect();
    let mut state = State::default();
    for e in &events {
        state.apply(e.task_id, e.at, &e.body);
    }
    let mut append = Append {
        events,
        tasks: vec![(
            task,
            TaskSummary {
                phase: state.phase,
                next_seq: state.next_seq,
            },
        )],
        ..Append::default()
    };
    append.reindex(task, &State::default(), &state);
    let lsns = ledger.append_blocking(append).unwrap();
    (task, lsns.collect())
}

/// Well-behaved tasks: a success, an unknown confirmed by lookup, a same-key resend after an
/// unknown, an authorized resend, and a duplicate delivery after the result.
fn write_clean_tasks(ledger: &Ledger) {
    write_task(ledger, "ok", vec![intend(1, None), ok()]);
    write_task(
        ledger,
        "lookup",
        vec![
            intend(1, None),
            unknown(1),
            EventBody::LookupPerformed {
                matches: vec!["r-1".into()],
                next_check_at: None,
            },
            EventBody::Confirmed {
                remote_id: "r-1".into(),
                evidence: Evidence::Lookup,
            },
        ],
    );
    write_task(
        ledger,
        "same-key",
        vec![intend(1, Some("k")), unknown(1), intend(2, Some("k")), ok()],
    );
    write_task(
        ledger,
        "authorized",
        vec![
            intend(1, None),
            unknown(1),
            EventBody::ManualReviewRequired {
                reason: ReviewReason::DeadlinePassed { lookups: 3 },
            },
            EventBody::ResendAuthorized {
                by: "ann".into(),
                reason: "not at the remote".into(),
            },
            intend(2, None),
            ok(),
        ],
    );
    write_task(
        ledger,
        "dup",
        vec![
            intend(1, None),
            ok(),
            EventBody::DuplicateDelivery {
                source: Source {
                    topic: "sendledger.requests".into(),
                    partition: 0,
                    offset: 9,
                },
            },
        ],
    );
}

/// `sendledger audit --json` as a separate process: its exit code and its report.
fn run_audit(args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
        .arg("audit")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().expect("exited"), report)
}

fn audit_dir(dir: &Path) -> (i32, serde_json::Value) {
    run_audit(&["--data", dir.to_str().unwrap()])
}

/// The findings of a JSON report as `(rule, task, lsns)`.
fn findings(report: &serde_json::Value) -> Vec<(String, Option<String>, Vec<u64>)> {
    report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["rule"].as_str().unwrap().to_string(),
                v["task_id"].as_str().map(String::from),
                v["lsns"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_u64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

fn finding(rule: &str, task: Option<TaskId>, lsns: &[u64]) -> (String, Option<String>, Vec<u64>) {
    (rule.into(), task.map(|t| t.to_string()), lsns.to_vec())
}

#[test]
fn a_clean_ledger_has_no_violation_and_exit_code_zero() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    write_clean_tasks(&ledger);
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    assert_eq!(findings(&report), vec![]);
    assert_eq!(code, 0);
    assert_eq!(report["tasks"], 5);
    assert_eq!(report["events"], 24);
    assert_eq!(report["tasks_by_state"]["succeeded"], 5);
    assert_eq!(report["unknown_outcomes"], 3);
    assert_eq!(report["unknowns_resolved_by_lookup"], 1);
    assert_eq!(report["unknowns_resolved_by_same_key_resend"], 1);
    assert_eq!(report["unknowns_resolved_by_authorized_resend"], 1);
    assert_eq!(report["duplicates_dropped"], 1);
}

/// The names, sizes and modes of a directory's entries, and the directory's own mode.
fn snapshot(dir: &Path) -> (u32, Vec<(String, u64, u32)>) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |m: std::fs::Metadata| m.permissions().mode();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                meta.len(),
                mode(meta),
            )
        })
        .collect();
    entries.sort();
    (mode(std::fs::metadata(dir).unwrap()), entries)
}

/// `audit` and `inspect` only read: pointed at an empty directory (mode 0755, or reached
/// through a symlink) they create nothing, change no mode and say there is no ledger; a
/// missing directory is not created; on a ledger they work and leave its files as they were.
#[test]
fn audit_and_inspect_create_and_change_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&empty, &link).unwrap();
    let missing = root.path().join("missing");
    let cli = |args: &[&str], data: &Path| {
        Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
            .args(args)
            .arg("--data")
            .arg(data)
            .output()
            .unwrap()
    };
    for data in [&empty, &link, &missing] {
        for args in [&["audit"][..], &["inspect", "acme/payment.create/k"]] {
            let out = cli(args, data);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("no ledger at {}", data.display())),
                "{args:?}: {stderr}"
            );
        }
    }
    assert_eq!(snapshot(&empty), (0o40755, vec![]));
    assert!(!missing.exists());

    let dir = root.path().join("ledger");
    let ledger = open(&dir);
    let (task, _) = write_task(&ledger, "k", vec![intend(1, None), ok()]);
    drop(ledger);
    let before = snapshot(&dir);
    let (code, report) = audit_dir(&dir);
    assert_eq!((code, &report["events"]), (0, &serde_json::json!(3)));
    let out = cli(&["inspect", &task.to_string()], &dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("succeeded after 3 events"));
    assert_eq!(snapshot(&dir), before);
}

/// `inspect` addresses a request key containing `/` as `%2F`; the unescaped address, which
/// could also mean operation `payment.create/ord`, is refused as ambiguous.
#[test]
fn inspect_addresses_an_identity_with_a_slash() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    let (task, _) = write_task(&ledger, "ord/7", vec![intend(1, None), ok()]);
    drop(ledger);
    let inspect = |address: &str| {
        Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
            .args(["inspect", address, "--data"])
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = inspect("acme/payment.create/ord%2F7");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("task {task}: succeeded")),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("acme/payment.create/ord%2F7 target=payments"),
        "{stdout}"
    );
    let out = inspect("acme/payment.create/ord/7");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("4 `/`-separated parts"), "{stderr}");
}

/// Rule 2: a second attempt after an unknown outcome, with neither the same idempotency key
/// nor a recorded authorization.
#[test]
fn a_resend_after_an_unknown_without_authorization_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    write_clean_tasks(&ledger);
    let (task, lsns) = write_task(
        &ledger,
        "blind",
        vec![intend(1, None), unknown(1), intend(2, None), ok()],
    );
    // A new key is not the same key either.
    let (keyed, keyed_lsns) = write_task(
        &ledger,
        "new-key",
        vec![intend(1, Some("k1")), unknown(1), intend(2, Some("k2"))],
    );
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    assert_eq!(
        findings(&report),
        vec![
            finding("no-blind-resend", Some(task), &[lsns[2], lsns[3]]),
            finding(
                "no-blind-resend",
                Some(keyed),
                &[keyed_lsns[2], keyed_lsns[3]]
            ),
        ]
    );
    assert_eq!(code, 2);
}

/// Rule 1: an attempt's outcome with no recorded intent for that attempt.
#[test]
fn an_attempt_outcome_without_an_intent_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    let (unknown_task, a) = write_task(&ledger, "no-intent", vec![unknown(1)]);
    let (response_task, b) = write_task(&ledger, "no-intent-2", vec![ok()]);
    let (other_attempt, c) =
        write_task(&ledger, "wrong-attempt", vec![intend(1, None), unknown(2)]);
    write_clean_tasks(&ledger);
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    assert_eq!(
        findings(&report),
        vec![
            finding("intent-before-attempt", Some(unknown_task), &[a[1]]),
            finding("intent-before-attempt", Some(response_task), &[b[1]]),
            finding("intent-before-attempt", Some(other_attempt), &[c[2]]),
        ]
    );
    assert!(report["violations"][0]["detail"]
        .as_str()
        .unwrap()
        .contains("SendUnknown for attempt 1, which has no open intent"));
    assert_eq!(code, 2);
}

/// Rule 5: nothing but duplicates, conflicts and notes after a terminal state.
#[test]
fn an_event_after_a_terminal_state_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    write_clean_tasks(&ledger);
    let (task, lsns) = write_task(
        &ledger,
        "after-end",
        vec![
            intend(1, None),
            ok(),
            EventBody::Failed {
                reason: "late".into(),
            },
        ],
    );
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    assert_eq!(
        findings(&report),
        vec![finding(
            "terminal-is-final",
            Some(task),
            &[lsns[2], lsns[3]]
        )]
    );
    assert_eq!(code, 2);
}

/// The unsettled index (what start-up resumes) must list exactly the tasks not settled: a
/// task in it that settled, and a task left out of it that is waiting for a lookup, are both
/// named.
#[test]
fn an_unsettled_index_that_disagrees_with_the_summaries_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    write_clean_tasks(&ledger);
    let (waiting, _) = write_task(&ledger, "waiting", vec![intend(1, None), unknown(1)]);
    let (done, _) = write_task(&ledger, "done", vec![intend(1, None), ok()]);
    assert_eq!(
        ledger
            .active_tasks()
            .unwrap()
            .iter()
            .map(|(t, _)| *t)
            .collect::<Vec<_>>(),
        vec![waiting]
    );
    let (code, report) = audit_dir(dir.path());
    assert_eq!((code, findings(&report)), (0, vec![]), "{report:#}");

    ledger.set_unsettled_entry(waiting, false).unwrap();
    ledger.set_unsettled_entry(done, true).unwrap();
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    let mut found = findings(&report);
    found.sort();
    let mut expected = vec![
        finding("index-consistent", Some(waiting), &[]),
        finding("index-consistent", Some(done), &[]),
    ];
    expected.sort();
    assert_eq!(found, expected, "{report:#}");
    let details: Vec<&str> = report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["detail"].as_str().unwrap())
        .collect();
    assert!(
        details.contains(
            &format!("the unsettled index lists task {done}, whose summary is succeeded").as_str()
        ),
        "{details:?}"
    );
    assert!(
        details.contains(&format!("task {waiting} is unknown but missing from the unsettled index: a restart would not resume it").as_str()),
        "{details:?}"
    );
    assert_eq!(code, 2);
}

/// A lost log entry: the gap is named by the LSNs around it, and the index names the task
/// that lost it.
#[test]
fn an_lsn_gap_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    let (task, lsns) = write_task(&ledger, "gap", vec![intend(1, None), ok()]);
    write_clean_tasks(&ledger);
    ledger.delete_log_entry(lsns[1]).unwrap();
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    let found = findings(&report);
    assert_eq!(
        found[0],
        finding("lsn-contiguous", None, &[lsns[0], lsns[2]]),
        "{report:#}"
    );
    assert_eq!(report["violations"][0]["detail"], "LSN gap: 2 missing");
    assert!(
        found.contains(&finding("index-consistent", Some(task), &[lsns[1]])),
        "the index names the task: {report:#}"
    );
    // Everything else is about that task, whose events now skip its intent.
    let mut rules: Vec<&str> = found[1..]
        .iter()
        .inspect(|f| assert_eq!(f.1, Some(task.to_string()), "{report:#}"))
        .map(|f| f.0.as_str())
        .collect();
    rules.sort();
    assert_eq!(
        rules,
        [
            "index-consistent",
            "index-consistent",
            "intent-before-attempt",
            "sequence"
        ],
        "{report:#}"
    );
    assert_eq!(code, 2);
}

/// Damaged bytes: an event that does not decode is named with its LSN, and with its task
/// when the index knows it.
#[test]
fn an_undecodable_event_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(dir.path());
    write_clean_tasks(&ledger);
    let (task, lsns) = write_task(&ledger, "damaged", vec![intend(1, None), ok()]);
    let last = *lsns.last().unwrap();
    // Envelope version 1, then bytes that are no event.
    ledger
        .inject_raw_log_entry(lsns[2], &[1, 0xff, 0xff, 0xff])
        .unwrap();
    // An entry nobody indexed, in an envelope version that does not exist.
    ledger.inject_raw_log_entry(last + 1, &[9, 0, 0]).unwrap();
    drop(ledger);
    let (code, report) = audit_dir(dir.path());
    let found = findings(&report);
    assert!(
        found.contains(&finding("event-decodable", Some(task), &[lsns[2]])),
        "{report:#}"
    );
    assert!(
        found.contains(&finding("event-decodable", None, &[last + 1])),
        "{report:#}"
    );
    // The damaged task's remaining events, and its summary, disagree with the damage; nothing
    // else is reported.
    for f in &found {
        assert!(
            f.1.as_deref() == Some(&task.to_string()) || f.2 == [last + 1],
            "unexpected finding {f:?}"
        );
    }
    assert_eq!(code, 2);
}

fn kafka() -> Kafka {
    tokio::task::block_in_place(|| {
        Kafka::connect(KafkaConfig {
            partitions: 3,
            ..KafkaConfig::default()
        })
        .expect("embedded cluster")
    })
}

/// Publishes the whole ledger in `dir` to the events topic with the real publisher.
async fn publish(kafka: &Kafka, dir: &Path) {
    let ledger = open(dir);
    let last = ledger.last_lsn();
    let publisher = Publisher::start(kafka, ledger).unwrap();
    assert!(
        publisher.wait_for(last, Duration::from_secs(60)).await,
        "published up to {} of {last}",
        publisher.cursor()
    );
    publisher.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// The events topic audits to the same report as the ledger it came from, clean or not, and
/// `--from-kafka` exits accordingly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_topic_audits_like_the_ledger() {
    for violation in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let blind = tokio::task::block_in_place(|| {
            let ledger = open(dir.path());
            write_clean_tasks(&ledger);
            violation.then(|| {
                write_task(
                    &ledger,
                    "blind",
                    vec![intend(1, None), unknown(1), intend(2, None), ok()],
                )
            })
        });
        let kafka = kafka();
        publish(&kafka, dir.path()).await;
        let topic = kafka.config().events_topic.clone();

        let from_kafka = {
            let (kafka, topic) = (kafka.clone(), topic.clone());
            tokio::task::spawn_blocking(move || {
                sendledger_kafka::audit_topic(&kafka, &topic, Default::default(), |_, _| {})
            })
            .await
            .unwrap()
            .unwrap()
        };
        let from_ledger = tokio::task::block_in_place(|| {
            sendledger_store::audit(&open(dir.path()), Default::default(), |_| {}).unwrap()
        });
        assert_eq!(from_kafka.events, from_ledger.events);
        assert_eq!(from_kafka.last_lsn, from_ledger.last_lsn);
        assert_eq!(from_kafka.tasks_by_state, from_ledger.tasks_by_state);
        assert_eq!(from_kafka.unknown_outcomes, from_ledger.unknown_outcomes);
        assert_eq!(
            from_kafka.unknowns_resolved_by_authorized_resend,
            from_ledger.unknowns_resolved_by_authorized_resend
        );
        assert_eq!(from_kafka.violations, from_ledger.violations);
        assert_eq!(from_kafka.skipped_checks.len(), 1);
        match blind {
            Some((task, lsns)) => assert_eq!(
                from_kafka
                    .violations
                    .iter()
                    .map(|v| (v.rule, v.task_id.clone(), v.lsns.clone()))
                    .collect::<Vec<_>>(),
                vec![(
                    "no-blind-resend",
                    Some(task.to_string()),
                    vec![lsns[2], lsns[3]]
                )]
            ),
            None => assert!(from_kafka.is_clean(), "{:?}", from_kafka.violations),
        }

        // The command, as a separate process, against the same cluster.
        let brokers = kafka.bootstrap_servers().to_string();
        let (code, report) = tokio::task::spawn_blocking(move || {
            run_audit(&["--from-kafka", &topic, "--brokers", &brokers])
        })
        .await
        .unwrap();
        assert_eq!(code, if violation { 2 } else { 0 }, "{report:#}");
        assert_eq!(report["tasks"], from_ledger.tasks);
    }
}
