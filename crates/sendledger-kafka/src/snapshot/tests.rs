use super::*;
use sendledger_core::event::Evidence;
use sendledger_core::fixtures::accepted;
use sendledger_core::{EventBody, Source};

fn event(task: TaskId, seq: u32, at: u64, body: EventBody) -> Event {
    Event {
        lsn: u64::from(seq) + 100,
        task_id: task,
        task_seq: seq,
        at,
        body,
    }
}

fn intent(attempt: u32) -> EventBody {
    EventBody::SendIntended {
        attempt,
        idempotency_key: None,
    }
}

fn confirmed() -> EventBody {
    EventBody::Confirmed {
        remote_id: "rec-1".into(),
        evidence: Evidence::Response { status: 201 },
    }
}

/// A settled task is kept by what retention keeps of it, one in progress by its events; the
/// next snapshot made from this one and the log after it (read again from an earlier offset)
/// continues both, and a duplicate delivery of the settled task is folded into it.
#[test]
fn a_snapshot_keeps_settled_tasks_compactly_and_continues_from_the_previous_one() {
    let (settled, body) = accepted();
    let sending = TaskId([9; 16]);
    let log = vec![
        event(settled, 0, 10, body.clone()),
        event(sending, 0, 11, body.clone()),
        event(settled, 1, 20, intent(1)),
        event(sending, 1, 21, intent(1)),
        event(settled, 2, 30, confirmed()),
    ];
    let mut first = Compactor::default();
    for e in log.clone() {
        first.event(e).unwrap();
    }
    let Compacted { entries, kept, .. } = first.entries();
    assert_eq!(kept, 1);
    assert_eq!(entries.len(), 2);
    let by_task =
        |entries: &[Entry], task| entries.iter().find(|e| e.task == task).cloned().unwrap();
    let s = by_task(&entries, settled);
    assert_eq!(s.kept.as_ref().map(|r| r.events), Some(3));
    assert!(s.events.is_empty());
    let p = by_task(&entries, sending);
    assert!(p.kept.is_none());
    assert_eq!(p.history().unwrap().len(), 2);

    // The chunks carry the entries through their encoding.
    let values = chunks(7, entries.clone());
    let mut decoded = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match decode(v).unwrap() {
            Record::Chunk(c) => {
                assert_eq!((c.id, c.index as usize), (7, i));
                decoded.extend(c.entries);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(decoded, entries);

    // The next snapshot: the previous one, then the log from an earlier offset on.
    let source = body.source().unwrap().clone();
    let mut next = Compactor::default();
    for e in decoded {
        next.previous(e).unwrap();
    }
    let mut tail = log[3..].to_vec();
    tail.push(event(sending, 2, 40, confirmed()));
    tail.push(event(
        settled,
        3,
        50,
        EventBody::DuplicateDelivery { source },
    ));
    for e in tail {
        next.event(e).unwrap();
    }
    let Compacted { entries, kept, .. } = next.entries();
    assert_eq!(kept, 2, "both settled now");
    let s = by_task(&entries, settled);
    assert_eq!(
        s.kept.as_ref().map(|r| r.events),
        Some(4),
        "the duplicate folded in"
    );
    assert!(s.events.is_empty());
    let p = by_task(&entries, sending);
    assert_eq!(p.kept.as_ref().map(|r| r.events), Some(3));
}

/// With an identity retention, a task settled before its cutoff is left out, a redelivery
/// recorded since notwithstanding (as local mode's identity retention forgets it), and so is
/// a message that was not a valid request, rejected before it; one settled or rejected after
/// the cutoff, or in progress, stays.
#[test]
fn a_snapshot_forgets_identities_past_their_retention() {
    let (old, body) = accepted();
    let (redelivered, recent, running) = (TaskId([1; 16]), TaskId([2; 16]), TaskId([3; 16]));
    let mut c = Compactor::forgetting(1_000);
    for (task, at) in [(old, 100), (redelivered, 200), (recent, 2_000)] {
        c.event(event(task, 0, at, body.clone())).unwrap();
        c.event(event(task, 1, at + 1, intent(1))).unwrap();
        c.event(event(task, 2, at + 2, confirmed())).unwrap();
    }
    let source = body.source().unwrap().clone();
    c.event(event(
        redelivered,
        3,
        3_000,
        EventBody::DuplicateDelivery {
            source: source.clone(),
        },
    ))
    .unwrap();
    c.event(event(running, 0, 10, body.clone())).unwrap();
    // Two messages that were not valid requests, rejected before the cutoff and after it.
    let rejected = |offset, at| {
        let source = Source {
            offset,
            ..source.clone()
        };
        let task = TaskId::for_rejected_input(&source.topic, source.partition, offset);
        let reason = "not json".to_string();
        let raw = b"{".to_vec();
        (
            task,
            event(
                task,
                0,
                at,
                EventBody::InputRejected {
                    source,
                    reason,
                    raw,
                },
            ),
        )
    };
    let (old_input, rejected_old) = rejected(7, 500);
    let (new_input, rejected_new) = rejected(8, 1_500);
    c.event(rejected_old).unwrap();
    c.event(rejected_new).unwrap();
    let compacted = c.entries();
    let left: Vec<TaskId> = compacted.entries.iter().map(|e| e.task).collect();
    let mut expected = vec![recent, running, new_input];
    expected.sort();
    assert_eq!(left, expected);
    assert!(!left.contains(&old_input));
    assert_eq!((compacted.kept, compacted.forgotten), (1, 3));
}

/// Two different events at one sequence number, or a gap, refuse the snapshot.
#[test]
fn two_histories_or_a_gap_refuse_a_snapshot() {
    let (task, body) = accepted();
    let mut c = Compactor::default();
    c.event(event(task, 0, 10, body.clone())).unwrap();
    c.event(event(task, 1, 20, intent(1))).unwrap();
    assert!(
        c.event(event(task, 1, 20, intent(1))).is_ok(),
        "the same event again"
    );
    let err = c.event(event(task, 1, 25, intent(2))).unwrap_err();
    assert!(err.contains("two different events"), "{err}");
    let err = c.event(event(task, 5, 30, confirmed())).unwrap_err();
    assert!(err.contains("missing"), "{err}");
}

/// The record encodings, byte for byte: a change of format fails here.
#[test]
fn snapshot_records_keep_their_encoding() {
    let manifest = Manifest {
        id: 0x0102,
        partition: 3,
        next: 10,
        tail_first: 8,
        last: vec![1, 2],
        first_chunk: 4,
        chunks: vec![[7; 32]],
        tasks: 2,
        kept: 1,
        forgotten: 9,
        written_at: 5,
    };
    let value = encode_manifest(&manifest);
    assert!(is_manifest(&value));
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let chunk_digests = "07".repeat(32);
    assert_eq!(
        hex,
        format!(
            "0101020100000000000003000000\
             0a00000000000000080000000000000002000000000000000102\
             04000000000000000100000000000000{chunk_digests}\
             0200000000000000010000000000000009000000000000000500000000000000"
        )
    );
    assert_eq!(decode(&value).unwrap(), Record::Manifest(manifest));
    let err = decode(&[2, 1]).unwrap_err();
    assert!(err.contains("newer"), "{err}");
    assert!(!is_manifest(&encode_chunk(&Chunk {
        id: 1,
        index: 0,
        entries: vec![],
    })));
}
