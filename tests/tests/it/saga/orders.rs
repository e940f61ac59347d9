//! An operator's orders to undo records of a saga in review: a duplicate charge the lookup
//! found next to the task's own (the one case a lookup cannot settle), and a whole order,
//! recorded on a stopped ledger and carried out when the service starts again. What a user
//! checks: the records at the remotes, the task's result and the audit.

use std::time::Duration;

use sendledger_core::decide::OperatorResolution;
use sendledger_core::result::ResultStatus;
use sendledger_core::saga::{CompensationOutcome, StepOutcome};
use sendledger_core::{EventBody, Phase, ReviewReason};
use sendledger_sim::Faults;
use sendledger_tests::engine::*;

use super::{last_result, order, Remotes, WAIT};

/// The charge's answer is lost while the payments remote already holds a charge of the same
/// order (a sender this ledger does not know made it): the lookup finds two and the task goes
/// to review. The operator keeps one and orders the other undone: one refund, of that
/// record, then the shipment; the task succeeds with the kept charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_undoes_a_duplicate_charge_the_lookup_found_and_the_order_goes_on() {
    let remotes = Remotes::start(|_| Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let targets = remotes.targets();
    let earlier_charge = remotes.charged_elsewhere("dup-1").await;
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets));
    engine.submit(order("dup-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("dup-1"), WAIT, settled).await;
    let Some(ReviewReason::MultipleMatches { remote_ids }) = state.review_reason.clone() else {
        panic!("{state:?}")
    };
    assert_eq!(remote_ids.len(), 2);
    let ours = remote_ids.iter().find(|id| **id != earlier_charge).unwrap();
    remotes.payments.set_faults(Faults::default()).unwrap();

    // A record the lookup did not find cannot be undone as a duplicate: refused, nothing kept.
    let events = engine.events(task_id("dup-1")).await.unwrap().len();
    let wrong = OperatorResolution::Compensate {
        record: Some(ours.clone()),
        duplicates: vec!["someone-elses-charge".into()],
        whole_task: false,
        by: "ana".into(),
        reason: "typo".into(),
    };
    let err = engine.resolve(task_id("dup-1"), wrong).await.unwrap_err();
    assert!(err.to_string().contains("not a record the lookup"), "{err}");
    assert_eq!(engine.events(task_id("dup-1")).await.unwrap().len(), events);

    let resolution = OperatorResolution::Compensate {
        record: Some(ours.clone()),
        duplicates: vec![earlier_charge.clone()],
        whole_task: false,
        by: "ana".into(),
        reason: "the customer was charged twice".into(),
    };
    engine.resolve(task_id("dup-1"), resolution).await.unwrap();
    let state = wait_for(&engine, task_id("dup-1"), WAIT, |s| s.phase.is_terminal()).await;
    assert_eq!(state.phase, Phase::Succeeded);

    let refunds = remotes.refunds.records_with_identity("dup-1");
    assert_eq!(refunds.len(), 1, "one refund");
    assert_eq!(refunds[0].body["undoes"], earlier_charge.as_str());
    assert_eq!(remotes.payments.records_with_identity("dup-1").len(), 2);
    assert_eq!(remotes.shipments.records_with_identity("dup-1").len(), 1);
    assert!(remotes.release.records_with_identity("dup-1").is_empty());

    let result = last_result(&engine, "dup-1").await;
    assert_eq!(result.status, ResultStatus::Succeeded);
    let charge = &result.steps[1];
    assert_eq!(
        charge.outcome,
        StepOutcome::Succeeded {
            remote_id: ours.clone()
        }
    );
    assert_eq!(charge.duplicates.len(), 1);
    assert_eq!(charge.duplicates[0].undoes, earlier_charge);
    assert_eq!(charge.duplicates[0].by, "ana");
    assert_eq!(
        charge.duplicates[0].outcome,
        CompensationOutcome::Done {
            remote_id: refunds[0].id.clone()
        }
    );
    super::audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The charge's remote answers 500 and its lookups find nothing until the deadline: review.
/// With the service stopped, an operator orders the whole order undone from the command line
/// (`review resolve --as compensated`); when the service starts again it releases the
/// reservation, and the task ends compensated with the operator's name on the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_order_undone_on_a_stopped_ledger_is_carried_out_at_start_up() {
    let remotes = Remotes::start(|name| Faults {
        error: if name == "payments" { 1.0 } else { 0.0 },
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), remotes.targets()));
    engine.submit(order("cancel-1"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("cancel-1"), WAIT, settled).await;
    assert!(
        matches!(
            state.review_reason,
            Some(ReviewReason::DeadlinePassed { .. })
        ),
        "{state:?}"
    );
    engine.shutdown(Duration::from_secs(5)).await;

    let out = crate::sendledger()
        .args([
            "review",
            "resolve",
            "acme/payment.create/cancel-1",
            "--data",
        ])
        .arg(dir.path())
        .args([
            "--as",
            "compensated",
            "--by",
            "ana",
            "--reason",
            "the customer cancelled",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("compensating"));
    assert!(remotes.release.records_with_identity("cancel-1").is_empty());

    let engine = tokio::task::block_in_place(|| start_with(dir.path(), remotes.targets()));
    let state = wait_for(&engine, task_id("cancel-1"), WAIT, |s| {
        s.phase.is_terminal()
    })
    .await;
    assert_eq!(state.phase, Phase::Compensated);
    let reservation = remotes.stock.records_with_identity("cancel-1");
    let releases = remotes.release.records_with_identity("cancel-1");
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].body["undoes"], reservation[0].id.as_str());
    assert!(remotes.refunds.records_with_identity("cancel-1").is_empty());
    let events = engine.events(task_id("cancel-1")).await.unwrap();
    assert!(events.iter().any(|e| matches!(
        &e.body,
        EventBody::Failed { reason } if reason.contains("ana") && reason.contains("cancelled")
    )));
    let result = last_result(&engine, "cancel-1").await;
    assert_eq!(result.status, ResultStatus::Compensated);
    super::audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}
