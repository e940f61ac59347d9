//! The RocksDB ledger through its public API: appends and reads, group commit, reopen, and
//! the on-disk encoding pinned by golden fixtures.

use std::os::unix::fs::PermissionsExt;

use sendledger_core::*;
use sendledger_store::envelope::{decode_event, encode_event};
use sendledger_store::{
    Append, Durability, Ledger, LedgerOptions, Processed, TaskSummary, TimerKind,
};

fn request(key: &str) -> AcceptedRequest {
    TaskRequest {
        tenant: "acme".into(),
        operation: "payment.create".into(),
        request_key: key.into(),
        target: "payments".into(),
        payload: serde_json::json!({"amount": 1250, "currency": "EUR"}),
        payload_text: None,
        metadata: [("trace".to_string(), "abc".to_string())].into(),
        version: 0,
    }
    .accept(&Limits::default())
    .unwrap()
}

fn source(offset: i64) -> Source {
    Source {
        topic: "sendledger.requests".into(),
        partition: 2,
        offset,
    }
}

/// A task's first two events, as the engine writes them.
fn accept_append(key: &str, offset: i64) -> (TaskId, Append) {
    let req = request(key);
    let task = req.task_id();
    let hash = req.payload_hash();
    let identity = req.identity.clone();
    let events = vec![
        NewEvent {
            task_id: task,
            task_seq: 0,
            at: 1_000,
            body: EventBody::TaskAccepted {
                request: req,
                payload_hash: hash,
                source: source(offset),
            },
        },
        NewEvent {
            task_id: task,
            task_seq: 1,
            at: 1_000,
            body: EventBody::SendIntended {
                attempt: 1,
                idempotency_key: None,
            },
        },
    ];
    let append = Append {
        events,
        tasks: vec![(
            task,
            TaskSummary {
                phase: Phase::Sending,
                next_seq: 2,
            },
        )],
        identities: vec![(identity, task, hash)],
        offsets: vec![("sendledger.requests".into(), 2, offset)],
        set_timers: vec![(5_000, task, TimerKind::Check)],
        cursors: vec![("test".into(), offset as u64)],
        ..Append::default()
    };
    (task, append)
}

#[tokio::test]
async fn append_then_read_everything_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let ledger = Ledger::open(&path, LedgerOptions::default()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(ledger.last_lsn(), 0);

    let (a, append_a) = accept_append("ord-1", 10);
    let (b, append_b) = accept_append("ord-2", 11);
    assert_eq!(ledger.append(append_a).await.unwrap(), 1..3);
    assert_eq!(ledger.append(append_b).await.unwrap(), 3..5);
    let done = Append {
        events: vec![NewEvent {
            task_id: a,
            task_seq: 2,
            at: 2_000,
            body: EventBody::Confirmed {
                remote_id: "r-1".into(),
                evidence: Evidence::Response { status: 201 },
            },
        }],
        tasks: vec![(
            a,
            TaskSummary {
                phase: Phase::Succeeded,
                next_seq: 3,
            },
        )],
        clear_timers: vec![(5_000, a)],
        ..Append::default()
    };
    assert_eq!(ledger.append(done).await.unwrap(), 5..6);

    let events_a = ledger.task_events(a).unwrap();
    assert_eq!(
        events_a.iter().map(|e| e.lsn).collect::<Vec<_>>(),
        [1, 2, 5]
    );
    let state = fold(&events_a);
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.remote_id.as_deref(), Some("r-1"));
    assert_eq!(
        ledger
            .read_log(2, 10)
            .unwrap()
            .iter()
            .map(|e| e.lsn)
            .collect::<Vec<_>>(),
        [2, 3, 4, 5]
    );

    let active = ledger.active_tasks().unwrap();
    assert_eq!(
        active,
        vec![(
            b,
            TaskSummary {
                phase: Phase::Sending,
                next_seq: 2
            }
        )]
    );
    let req = request("ord-2");
    assert_eq!(
        ledger.latest_version(&req.identity).unwrap(),
        Some(sendledger_store::Latest {
            version: 0,
            task_id: b,
            payload_hash: req.payload_hash()
        })
    );
    let processed = ledger.processed("sendledger.requests", 2).unwrap();
    assert_eq!(
        processed.above.iter().copied().collect::<Vec<_>>(),
        [10, 11]
    );
    assert_eq!(processed.watermark, None);
    assert!(processed.contains(10) && processed.contains(11) && !processed.contains(9));
    assert_eq!(
        ledger.processed("sendledger.requests", 3).unwrap(),
        Processed::default()
    );
    assert_eq!(ledger.cursor("test").unwrap(), Some(11));
    assert_eq!(ledger.due_timers(4_999, 10).unwrap(), vec![]);
    assert_eq!(
        ledger.due_timers(5_000, 10).unwrap(),
        vec![(5_000, b, TimerKind::Check)]
    );
    assert_eq!(ledger.next_timer().unwrap(), Some(5_000));

    // Raising the watermark folds the markers it covers.
    let raise = Append {
        offset_watermarks: vec![("sendledger.requests".into(), 2, 10)],
        ..Append::default()
    };
    ledger.append(raise).await.unwrap();
    let processed = ledger.processed("sendledger.requests", 2).unwrap();
    assert_eq!(
        (
            processed.watermark,
            processed.above.iter().copied().collect::<Vec<_>>()
        ),
        (Some(10), vec![11])
    );
    assert_eq!(processed.contiguous(), Some(11));

    // Reopen: everything is still there and LSNs continue without a gap.
    drop(ledger);
    let ledger = Ledger::open(
        &path,
        LedgerOptions {
            durability: Durability::Buffered,
            ..LedgerOptions::default()
        },
    )
    .unwrap();
    assert_eq!(ledger.last_lsn(), 5);
    let (_, append_c) = accept_append("ord-3", 12);
    let blocking = ledger.clone();
    let lsns = tokio::task::spawn_blocking(move || blocking.append_blocking(append_c))
        .await
        .unwrap();
    assert_eq!(lsns.unwrap(), 6..8);
    assert_eq!(ledger.task_events(a).unwrap(), events_a);
}

#[tokio::test]
async fn concurrent_appends_get_contiguous_lsns_and_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
    let mut handles = Vec::new();
    for w in 0..64u32 {
        let ledger = ledger.clone();
        handles.push(tokio::spawn(async move {
            let task = TaskId::derive("t", "op", &w.to_string());
            let mut lsns = Vec::new();
            for seq in 0..20 {
                let body = EventBody::OperatorNote {
                    who: format!("w{w}"),
                    text: seq.to_string(),
                };
                let append = Append {
                    events: vec![NewEvent {
                        task_id: task,
                        task_seq: seq,
                        at: 0,
                        body,
                    }],
                    ..Append::default()
                };
                lsns.extend(ledger.append(append).await.unwrap());
            }
            (task, lsns)
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        let (task, lsns) = h.await.unwrap();
        // Each writer's appends are in its own order in the log.
        assert!(lsns.windows(2).all(|w| w[0] < w[1]));
        let seqs: Vec<u32> = ledger
            .task_events(task)
            .unwrap()
            .iter()
            .map(|e| e.task_seq)
            .collect();
        assert_eq!(seqs, (0..20).collect::<Vec<_>>());
        all.extend(lsns);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=1280).collect::<Vec<u64>>());
    let stats = ledger.stats();
    let batches = stats.batches.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        stats.appends.load(std::sync::atomic::Ordering::Relaxed),
        1280
    );
    assert!((1..=1280).contains(&batches), "{batches}");
}

/// The events whose encodings are pinned in `tests/fixtures/events-v1.txt`.
fn golden_events() -> Vec<Event> {
    let req = request("ord-42");
    let task = req.task_id();
    let hash = req.payload_hash();
    let bodies = vec![
        EventBody::TaskAccepted {
            request: req,
            payload_hash: hash,
            source: source(7),
        },
        EventBody::DuplicateDelivery { source: source(8) },
        EventBody::SendIntended {
            attempt: 1,
            idempotency_key: Some("k-1".into()),
        },
        EventBody::SendNotSent {
            attempt: 1,
            cause: NotSentCause::Throttled { status: 429 },
            retry_at: 1_700_000_002_000,
        },
        EventBody::SendIntended {
            attempt: 2,
            idempotency_key: Some("k-1".into()),
        },
        EventBody::SendUnknown {
            attempt: 2,
            cause: UnknownCause::Recovery,
        },
        EventBody::LookupPerformed {
            matches: vec!["r-1".into(), "r-2".into()],
            next_check_at: None,
        },
        EventBody::ManualReviewRequired {
            reason: ReviewReason::MultipleMatches {
                remote_ids: vec!["r-1".into(), "r-2".into()],
            },
        },
        EventBody::OperatorNote {
            who: "ana".into(),
            text: "checked with the remote".into(),
        },
        EventBody::Confirmed {
            remote_id: "r-1".into(),
            evidence: Evidence::Operator {
                by: "ana".into(),
                reason: "r-2 refunded".into(),
            },
        },
        EventBody::RequestConflict {
            source: source(9),
            payload_hash: PayloadHash([0xab; 32]),
        },
        EventBody::Rejected {
            status: 422,
            detail: "amount invalid".into(),
        },
        EventBody::ResendAuthorized {
            by: "policy:resend_when_absent".into(),
            reason: "none found".into(),
        },
        EventBody::Failed {
            reason: "attempts exhausted".into(),
        },
        EventBody::SendUnknown {
            attempt: 3,
            cause: UnknownCause::ResetAfterWrite("connection reset".into()),
        },
    ];
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event {
            lsn: 100 + i as u64,
            task_id: task,
            task_seq: i as u32,
            at: 1_700_000_000_000 + i as u64,
            body,
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The events of envelope version 2: version 1's and the variants it added
/// (`ReviewReason::LookupsFailed`, `NotSentCause::LocalResources`).
fn golden_events_v2() -> Vec<Event> {
    let mut events = golden_events();
    let last = events.last().unwrap().clone();
    events.push(Event {
        lsn: last.lsn + 1,
        task_seq: last.task_seq + 1,
        at: last.at + 1,
        body: EventBody::ManualReviewRequired {
            reason: ReviewReason::LookupsFailed {
                lookups: 4,
                last_error: "lookup answered 503".into(),
            },
        },
        ..last.clone()
    });
    events.push(Event {
        lsn: last.lsn + 2,
        task_seq: last.task_seq + 2,
        at: last.at + 2,
        body: EventBody::SendNotSent {
            attempt: 4,
            cause: NotSentCause::LocalResources("out of file descriptors".into()),
            retry_at: 1_700_000_009_000,
        },
        ..last
    });
    events
}

/// `events` with `body` after them, as the same task's next event.
fn followed_by(mut events: Vec<Event>, body: EventBody) -> Vec<Event> {
    let last = events.last().unwrap().clone();
    events.push(Event {
        lsn: last.lsn + 1,
        task_seq: last.task_seq + 1,
        at: last.at + 1,
        body,
        ..last
    });
    events
}

/// Version 3 adds the wait before an intent (`SendDeferred`, `WaitReason`).
fn golden_events_v3() -> Vec<Event> {
    followed_by(
        golden_events_v2(),
        EventBody::SendDeferred {
            until: 1_700_000_015_000,
            reason: WaitReason::BreakerOpen {
                target: "payments".into(),
            },
        },
    )
}

/// Version 4 adds the retry of a failed task (`TaskRetried`).
fn golden_events_v4() -> Vec<Event> {
    followed_by(
        golden_events_v3(),
        EventBody::TaskRetried {
            by: "ana".into(),
            reason: "the remote is back".into(),
        },
    )
}

/// Version 5 adds the attempt at a fallback target (`SendIntendedAt`).
fn golden_events_v5() -> Vec<Event> {
    followed_by(
        golden_events_v4(),
        EventBody::SendIntendedAt {
            attempt: 5,
            idempotency_key: Some("key-5".into()),
            target: "payments-backup".into(),
        },
    )
}

/// Version 6 adds the review of a task with two histories in its log
/// (`ReviewReason::DivergentHistory`).
fn golden_events_v6() -> Vec<Event> {
    followed_by(
        golden_events_v5(),
        EventBody::ManualReviewRequired {
            reason: ReviewReason::DivergentHistory {
                task_seq: 3,
                replaced: vec![
                    "SendIntended: attempt 2".into(),
                    "SendUnknown: attempt 2 outcome unknown (Timeout)".into(),
                ],
            },
        },
    )
}

/// Version 7 adds multi-step tasks: their plan (`StepsPlanned`), the start of a compensation
/// (`CompensationStarted`) and the reviews of compensations refused or never sent.
fn golden_events_v7() -> Vec<Event> {
    let mut events = golden_events_v6();
    for body in sendledger_core::fixtures::saga_bodies() {
        events = followed_by(events, body);
    }
    events
}

/// Version 8 adds the fields of a step's answer (`StepAnswer`) and an operator's order to undo
/// records (`CompensationOrdered`).
fn golden_events_v8() -> Vec<Event> {
    let mut events = golden_events_v7();
    for body in sendledger_core::fixtures::v8_bodies() {
        events = followed_by(events, body);
    }
    events
}

/// Version 9 adds the named credential of an operator's decision (`OperatorCredential`).
fn golden_events_v9() -> Vec<Event> {
    let mut events = golden_events_v8();
    for body in sendledger_core::fixtures::v9_bodies() {
        events = followed_by(events, body);
    }
    events
}

/// Version 10 adds a request's version (`RequestVersion`) and the wait for an earlier one
/// (`WaitReason::EarlierVersion`).
fn golden_events_v10() -> Vec<Event> {
    let mut events = golden_events_v9();
    for body in sendledger_core::fixtures::v10_bodies() {
        events = followed_by(events, body);
    }
    events
}

/// Reads a fixture of `lsn name hex` lines.
fn fixture(name: &str, events: &[Event]) -> Vec<(u64, Vec<u8>)> {
    let path = format!("{}/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), events.len());
    lines
        .iter()
        .zip(events)
        .map(|(line, event)| {
            let mut parts = line.split(' ');
            let lsn: u64 = parts.next().unwrap().parse().unwrap();
            assert_eq!(parts.next().unwrap(), event.body.name());
            (lsn, unhex(parts.next().unwrap()))
        })
        .collect()
}

/// The stored encoding of events never changes by accident: the bytes of every version on disk
/// still decode to the same events, and today's encoder writes the current version's bytes.
/// To re-bless the current version after a deliberate change (which needs a new envelope
/// version): `SENDLEDGER_BLESS=1`.
#[test]
fn event_encoding_matches_golden_fixtures() {
    let old: [(u8, Vec<Event>); 9] = [
        (1, golden_events()),
        (2, golden_events_v2()),
        (3, golden_events_v3()),
        (4, golden_events_v4()),
        (5, golden_events_v5()),
        (6, golden_events_v6()),
        (7, golden_events_v7()),
        (8, golden_events_v8()),
        (9, golden_events_v9()),
    ];
    for (version, events) in &old {
        let name = format!("events-v{version}.txt");
        for ((lsn, bytes), event) in fixture(&name, events).iter().zip(events) {
            assert_eq!(bytes[0], *version);
            assert_eq!(
                &decode_event(*lsn, bytes).unwrap(),
                event,
                "decoding v{version} {}",
                event.body.name()
            );
        }
    }
    let current = golden_events_v10();
    if std::env::var_os("SENDLEDGER_BLESS").is_some() {
        let encoded: Vec<String> = current
            .iter()
            .map(|e| format!("{} {} {}", e.lsn, e.body.name(), hex(&encode_event(e))))
            .collect();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/events-v10.txt");
        std::fs::write(path, encoded.join("\n") + "\n").unwrap();
    }
    for ((lsn, bytes), event) in fixture("events-v10.txt", &current).iter().zip(&current) {
        let name = event.body.name();
        assert_eq!(
            &decode_event(*lsn, bytes).unwrap(),
            event,
            "decoding v10 {name}"
        );
        assert_eq!(
            hex(&encode_event(event)),
            hex(bytes),
            "encoding of {name} changed"
        );
    }
}

#[test]
fn damaged_or_unknown_envelopes_are_errors() {
    let event = &golden_events()[2];
    let mut bytes = encode_event(event);
    assert!(decode_event(event.lsn + 1, &bytes)
        .unwrap_err()
        .to_string()
        .contains("says lsn"));
    bytes[0] = 11;
    assert!(decode_event(event.lsn, &bytes)
        .unwrap_err()
        .to_string()
        .contains("format version 11"));
    let bytes = encode_event(event);
    assert!(decode_event(event.lsn, &bytes[..bytes.len() - 3]).is_err());
    assert!(decode_event(event.lsn, &[]).is_err());
}

/// RocksDB's memory for a ledger stays within its budget while far more than the budget is
/// written and read back: one block cache for every column family, the write buffers charged
/// to it.
#[test]
fn memory_stays_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 8 * 1024 * 1024;
    let ledger = Ledger::open(
        dir.path(),
        LedgerOptions {
            durability: Durability::Buffered,
            memory: sendledger_store::Memory { bytes: budget },
            ..LedgerOptions::default()
        },
    )
    .unwrap();
    let filler = "x".repeat(2_000);
    let mut peak = (0, 0);
    // About 80 MB of events: ten times the budget.
    for batch in 0..200 {
        let mut append = Append::default();
        for i in 0..200 {
            let key = format!("mem-{batch}-{i}");
            let (_, one) = accept_append(&key, batch * 200 + i);
            append.events.extend(one.events.into_iter().map(|mut e| {
                if let EventBody::TaskAccepted { request, .. } = &mut e.body {
                    request.metadata.insert("filler".into(), filler.clone());
                }
                e
            }));
            append.tasks.extend(one.tasks);
            append.identities.extend(one.identities);
        }
        ledger.append_blocking(append).unwrap();
        let usage = ledger.memory_usage().unwrap();
        peak = (peak.0.max(usage.cached), peak.1.max(usage.write_buffers));
    }
    for event in ledger.log_from(1) {
        event.unwrap();
    }
    let usage = ledger.memory_usage().unwrap();
    peak = (peak.0.max(usage.cached), peak.1.max(usage.write_buffers));
    assert_eq!(usage.budget, budget);
    assert!(ledger.last_lsn() == 80_000);
    // The write buffers are flushed once they pass half the budget; they count in the cache.
    assert!(peak.0 <= budget + budget / 8, "cache peaked at {}", peak.0);
    assert!(peak.1 <= budget, "write buffers peaked at {}", peak.1);
}
