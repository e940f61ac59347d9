//! Templates that read fields of an earlier step's answer (`{steps.NAME.response./pointer}`):
//! the field is kept in the log when the step is confirmed, whether by the remote's 2xx or by
//! the one record a lookup found after the answer was lost, and later calls (the next step, and
//! the step's own compensation) send it.

use std::time::Duration;

use sendledger_core::{EventBody, Evidence, Phase};
use sendledger_effects::{TargetConfig, Targets};
use sendledger_sim::Faults;
use sendledger_tests::engine::*;

use super::{sagas, submit_orders, Remotes, WAIT};

/// The shipment and the release both carry `reserved_at`, the reservation's `created_at` as
/// the stock remote answered it (the simulated remote answers a create with its id and
/// creation time, and lists records with both).
fn targets(remotes: &Remotes) -> Targets {
    let mut configs = remotes.configs();
    for name in ["shipments", "release"] {
        let config = configs.get_mut(name).unwrap();
        let mut value = serde_json::to_value(&*config).unwrap();
        value["body_fields"]["reserved_at"] = "{steps.reserve.response./created_at}".into();
        *config = serde_json::from_value::<TargetConfig>(value).unwrap();
    }
    Targets::from_config(&configs)
        .unwrap()
        .with_sagas(&sagas())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_calls_send_a_field_of_an_earlier_steps_answer_answered_or_found() {
    let remotes = Remotes::start(|name| match name {
        "stock" => Faults {
            commit_then_drop: 0.5,
            ..Faults::default()
        },
        "shipments" => Faults {
            reject: 0.3,
            ..Faults::default()
        },
        _ => Faults::default(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets(&remotes)));
    let keys = submit_orders(&engine, "ans", 30).await;
    let (mut found, mut answered, mut shipped, mut released) = (0, 0, 0, 0);
    for key in &keys {
        let state = wait_for(&engine, task_id(key), WAIT, |s| s.phase.is_terminal()).await;
        let reservation = &remotes.stock.records_with_identity(key)[0];
        let reserved_at = reservation.created_at.to_string();
        let events = engine.events(task_id(key)).await.unwrap();
        let kept = events.iter().position(|e| {
            matches!(&e.body, EventBody::StepAnswer { fields }
                if fields.get("/created_at") == Some(&reserved_at))
        });
        let kept = kept.unwrap_or_else(|| panic!("{key}: no StepAnswer of the reservation"));
        match &events[kept + 1].body {
            EventBody::Confirmed {
                evidence: Evidence::Lookup,
                ..
            } => found += 1,
            EventBody::Confirmed {
                evidence: Evidence::Response { .. },
                ..
            } => answered += 1,
            other => panic!("{key}: {other:?} after the StepAnswer"),
        }
        let sent = |sim: &sendledger_sim::Sim| {
            let records = sim.records_with_identity(key);
            records.first().map(|r| r.body["reserved_at"].clone())
        };
        match state.phase {
            Phase::Succeeded => {
                assert_eq!(sent(&remotes.shipments), Some(reserved_at.clone().into()));
                shipped += 1;
            }
            Phase::Compensated => {
                assert_eq!(sent(&remotes.release), Some(reserved_at.clone().into()));
                released += 1;
            }
            other => panic!("{key} ended {other:?}"),
        }
    }
    eprintln!(
        "answered {answered}, found by lookup {found}; shipped {shipped}, released {released}"
    );
    assert!(found >= 5 && answered >= 5, "{found}/{answered}");
    assert!(shipped >= 5 && released >= 3, "{shipped}/{released}");
    super::audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}
