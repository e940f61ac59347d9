//! A ledger written by earlier versions is read, resumed and audited by this one: tasks whose
//! events are stored in every older envelope version (1 to 7, mixed in one log), a settled
//! one-step task, one whose attempt was in flight when its process stopped, and one waiting to
//! retry an attempt that was not sent. The open ones finish, once each at the remote; the
//! settled one keeps its result byte for byte; the audit is clean.

use std::time::Duration;

use sendledger_core::decide::AttemptOutcome;
use sendledger_core::result::Projection;
use sendledger_core::{EventBody, Evidence, NotSentCause, Phase};
use sendledger_sim::{Sim, SimConfig};
use sendledger_store::envelope::encode_event;
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::engine::*;

const WAIT: Duration = Duration::from_secs(30);

/// The results the task's events announce, as JSON.
fn results(events: &[sendledger_core::Event]) -> Vec<String> {
    let mut projection = Projection::default();
    (events.iter())
        .filter_map(|e| projection.apply(e))
        .map(|r| serde_json::to_string(&r).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_written_by_earlier_versions_is_read_resumed_and_audited() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = target(&sim.base_url(), |_| {});
    let accepted = |key: &str| {
        let request = request(key).accept(&Default::default()).unwrap();
        EventBody::TaskAccepted {
            payload_hash: request.payload_hash(),
            request,
            source: source(0),
        }
    };
    let intent = EventBody::SendIntended {
        attempt: 1,
        idempotency_key: None,
    };
    // The in-flight task's request did reach the remote before the process stopped.
    let in_flight = request("old-open").accept(&Default::default()).unwrap();
    let outcome = targets(config.clone())
        .get("sim")
        .unwrap()
        .execute(&in_flight, 1, None)
        .await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let histories = [
        (
            "old-done",
            vec![
                accepted("old-done"),
                intent.clone(),
                EventBody::Confirmed {
                    remote_id: "r-old".into(),
                    evidence: Evidence::Response { status: 201 },
                },
            ],
        ),
        ("old-open", vec![accepted("old-open"), intent.clone()]),
        (
            "old-retry",
            vec![
                accepted("old-retry"),
                intent,
                EventBody::SendNotSent {
                    attempt: 1,
                    cause: NotSentCause::Connect("connection refused".into()),
                    retry_at: 0,
                },
            ],
        ),
    ];
    for (key, history) in histories {
        write_history(dir.path(), key, history).await;
    }
    // Every event rewritten in an older envelope, versions 1 to 7 in turn.
    let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
    let events = ledger.read_log(1, 100).unwrap();
    let done_before = results(
        &events
            .iter()
            .filter(|e| e.task_id == task_id("old-done"))
            .cloned()
            .collect::<Vec<_>>(),
    );
    for (i, event) in events.iter().enumerate() {
        let mut bytes = encode_event(event);
        bytes[0] = 1 + (i % 7) as u8;
        ledger.inject_raw_log_entry(event.lsn, &bytes).unwrap();
    }
    assert_eq!(
        ledger.read_log(1, 100).unwrap(),
        events,
        "older envelopes read as written"
    );
    drop(ledger);

    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    for key in ["old-open", "old-retry"] {
        let state = wait_for(&engine, task_id(key), WAIT, |s| s.phase.is_terminal()).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}: one record");
    }
    let open = engine.events(task_id("old-open")).await.unwrap();
    assert!(
        open.iter().any(|e| matches!(
            e.body,
            EventBody::Confirmed {
                evidence: Evidence::Lookup,
                ..
            }
        )),
        "the in-flight attempt was looked up, not resent"
    );
    let done = engine.events(task_id("old-done")).await.unwrap();
    assert_eq!(
        results(&done),
        done_before,
        "the settled task's result is unchanged"
    );
    let report = sendledger_store::audit(engine.ledger(), Default::default(), |_| {}).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    engine.shutdown(Duration::from_secs(5)).await;
}
