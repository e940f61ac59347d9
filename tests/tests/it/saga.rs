//! Multi-step tasks (sagas) on the engine over real RocksDB, each step and compensation at a
//! simulated remote of its own over real sockets: reserve (undone by release), charge (undone
//! by refund), ship. What a user checks: the records at each remote, the task's result, the
//! audit.

use std::collections::BTreeMap;
use std::time::Duration;

use sendledger_core::result::{Projection, ResultStatus, TaskResult};
use sendledger_core::saga::{CompensationOutcome, StepOutcome};
use sendledger_core::{EventBody, Phase};
use sendledger_effects::{SagaConfig, SagaStepConfig, Targets};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::engine::*;

const WAIT: Duration = Duration::from_secs(60);

/// The five remotes of the order saga.
struct Remotes {
    stock: Sim,
    payments: Sim,
    shipments: Sim,
    refunds: Sim,
    release: Sim,
}

impl Remotes {
    async fn start(faults: impl Fn(&str) -> Faults) -> Remotes {
        let sim = |name: &'static str, seed: u64| {
            let faults = faults(name);
            async move {
                Sim::start(SimConfig {
                    seed,
                    faults,
                    ..SimConfig::default()
                })
                .await
                .unwrap()
            }
        };
        let seed = crate::seed(38);
        Remotes {
            stock: sim("stock", seed).await,
            payments: sim("payments", seed + 1).await,
            shipments: sim("shipments", seed + 2).await,
            refunds: sim("refunds", seed + 3).await,
            release: sim("release", seed + 4).await,
        }
    }

    /// The targets and the saga `order`. The refund carries the charge's id and the release
    /// the reservation's, read from the steps they undo.
    fn targets(&self) -> Targets {
        let plain = |sim: &Sim| target(&sim.base_url(), |_| {});
        let undo = |sim: &Sim, step: &str| {
            target(&sim.base_url(), |t| {
                t["body_fields"]["undoes"] = format!("{{steps.{step}.remote_id}}").into();
            })
        };
        let targets = Targets::from_config(&BTreeMap::from([
            ("stock".to_string(), plain(&self.stock)),
            ("payments".to_string(), plain(&self.payments)),
            ("shipments".to_string(), plain(&self.shipments)),
            ("refunds".to_string(), undo(&self.refunds, "charge")),
            ("release".to_string(), undo(&self.release, "reserve")),
        ]))
        .unwrap();
        targets.with_sagas(&sagas()).unwrap()
    }
}

fn sagas() -> BTreeMap<String, SagaConfig> {
    let step = |name: &str, target: &str, undo: Option<&str>| SagaStepConfig {
        name: name.into(),
        target: target.into(),
        compensate: undo.map(Into::into),
    };
    BTreeMap::from([(
        "order".to_string(),
        SagaConfig {
            steps: vec![
                step("reserve", "stock", Some("release")),
                step("charge", "payments", Some("refunds")),
                step("ship", "shipments", None),
            ],
        },
    )])
}

fn order(key: &str) -> sendledger_core::TaskRequest {
    let mut request = request(key);
    request.target = "order".into();
    request
}

/// The task's last result, as the publisher announces it; every result it announced is valid
/// against the results topic's schema, and only the last is terminal.
async fn last_result(engine: &sendledger_actors::Engine, key: &str) -> TaskResult {
    let events = engine.events(task_id(key)).await.unwrap();
    let mut projection = Projection::default();
    let validator = sendledger_tests::kafka::schema("task-result.schema.json");
    let mut results = Vec::new();
    for event in &events {
        if let Some(result) = projection.apply(event) {
            let json = serde_json::to_value(&result).unwrap();
            if let Err(e) = validator.validate(&json) {
                panic!("{key}: {e}\n{json}");
            }
            results.push(result);
        }
    }
    let terminal = results.iter().filter(|r| r.status.is_terminal()).count();
    assert_eq!(terminal, 1, "{key}: {results:?}");
    results.pop().expect("a result")
}

fn audit_clean(engine: &sendledger_actors::Engine) {
    let report = sendledger_store::audit(engine.ledger(), Default::default(), |_| {}).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

/// The one record of `key` at `sim`, or none.
fn record_id(sim: &Sim, key: &str) -> Option<String> {
    let records = sim.records_with_identity(key);
    assert!(
        records.len() <= 1,
        "{key}: {} records at one remote",
        records.len()
    );
    records.first().map(|r| r.id.clone())
}

fn undoes(sim: &Sim, key: &str) -> Option<String> {
    let records = sim.records_with_identity(key);
    assert!(records.len() <= 1, "{key}: {} compensations", records.len());
    records
        .first()
        .map(|r| r.body["undoes"].as_str().unwrap().to_string())
}

/// Checks every task against the records at the remotes: a succeeded task has one record per
/// step and no compensation; a compensated one has its reservation released and its charge
/// refunded, once each, and no shipment. Returns (succeeded, compensated).
async fn check_outcomes(
    engine: &sendledger_actors::Engine,
    remotes: &Remotes,
    keys: &[String],
) -> (usize, usize) {
    let (mut succeeded, mut compensated) = (0, 0);
    for key in keys {
        let state = wait_for(engine, task_id(key), WAIT, |s| s.phase.is_terminal()).await;
        let reservation = record_id(&remotes.stock, key).expect("reserved");
        let charge = record_id(&remotes.payments, key).expect("charged");
        let result = last_result(engine, key).await;
        assert_eq!(result.steps.len(), 3, "{key}");
        match state.phase {
            Phase::Succeeded => {
                succeeded += 1;
                let shipment = record_id(&remotes.shipments, key).expect("shipped");
                assert_eq!(result.status, ResultStatus::Succeeded);
                assert_eq!(result.remote_id.as_deref(), Some(shipment.as_str()));
                assert_eq!(undoes(&remotes.refunds, key), None, "{key}: refunded");
                assert_eq!(undoes(&remotes.release, key), None, "{key}: released");
            }
            Phase::Compensated => {
                compensated += 1;
                assert_eq!(record_id(&remotes.shipments, key), None, "{key}");
                assert_eq!(undoes(&remotes.refunds, key), Some(charge.clone()));
                assert_eq!(undoes(&remotes.release, key), Some(reservation.clone()));
                assert_eq!(result.status, ResultStatus::Compensated);
                assert!(matches!(
                    result.steps[2].outcome,
                    StepOutcome::Rejected {
                        http_status: 422,
                        ..
                    }
                ));
                for (step, undone) in [(0, &reservation), (1, &charge)] {
                    let c = result.steps[step].compensation.as_ref().unwrap();
                    assert_eq!(&c.undoes, undone);
                    assert!(matches!(c.outcome, CompensationOutcome::Done { .. }));
                }
                assert!(result.reason.unwrap().contains("step ship was refused"));
            }
            other => panic!("{key} ended {other:?}"),
        }
    }
    (succeeded, compensated)
}

/// The acceptance case: three steps, the third refused for about one task in five. Every
/// refused task ends compensated with one refund and one release at the remotes, undoing the
/// step's own record; the others succeed with one record per step; nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_last_step_is_compensated_once_per_earlier_step() {
    let remotes = Remotes::start(|name| Faults {
        reject: if name == "shipments" { 0.2 } else { 0.0 },
        ..Faults::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let targets = remotes.targets();
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets));
    let keys: Vec<String> = (0..60).map(|i| format!("order-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(order(key), source(i as i64)).await.unwrap();
    }
    let (succeeded, compensated) = check_outcomes(&engine, &remotes, &keys).await;
    eprintln!("succeeded {succeeded}, compensated {compensated}");
    assert!(
        compensated >= 3 && succeeded >= 30,
        "{succeeded}/{compensated}"
    );
    assert_eq!(remotes.shipments.stats().records as usize, succeeded);
    for sim in [
        &remotes.stock,
        &remotes.payments,
        &remotes.refunds,
        &remotes.release,
    ] {
        assert_eq!(sim.stats().duplicates, 0);
    }
    assert_eq!(remotes.refunds.stats().posts as usize, compensated);
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Unknown outcomes everywhere: the payment and refund remotes create their record and drop
/// the answer for a third of the requests, the stock remote hangs some. Each is reconciled by
/// a lookup, never resent: one record per step and per compensation, whatever was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcomes_in_steps_and_compensations_are_looked_up_never_resent() {
    let remotes = Remotes::start(|name| match name {
        "payments" | "refunds" => Faults {
            commit_then_drop: 0.3,
            ..Faults::default()
        },
        "stock" => Faults {
            commit_then_hang: 0.2,
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
    let targets = remotes.targets();
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets));
    let keys: Vec<String> = (0..40).map(|i| format!("lost-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(order(key), source(i as i64)).await.unwrap();
    }
    let (succeeded, compensated) = check_outcomes(&engine, &remotes, &keys).await;
    assert!(
        compensated >= 3 && succeeded >= 10,
        "{succeeded}/{compensated}"
    );
    let mut looked_up = 0;
    for key in &keys {
        let events = engine.events(task_id(key)).await.unwrap();
        let unknowns = events
            .iter()
            .filter(|e| matches!(e.body, EventBody::SendUnknown { .. }))
            .count();
        let lookups_confirmed = events
            .iter()
            .filter(|e| {
                matches!(
                    e.body,
                    EventBody::Confirmed {
                        evidence: sendledger_core::Evidence::Lookup,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(
            unknowns, lookups_confirmed,
            "{key}: every unknown was found"
        );
        looked_up += unknowns;
    }
    assert!(looked_up >= 10, "only {looked_up} unknown outcomes");
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The engine stops in the middle of sagas (steps and compensations hanging at their
/// remotes, tasks between two legs) and starts again on the same ledger: each task resumes at
/// its leg and nothing is sent twice. (A kill -9 mid-saga: `saga_kill.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_saga_resumes_each_task_at_its_leg() {
    let remotes = Remotes::start(|name| match name {
        "payments" | "release" => Faults {
            commit_then_hang: 0.5,
            ..Faults::default()
        },
        "shipments" => Faults {
            reject: 0.5,
            ..Faults::default()
        },
        _ => Faults::default(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), remotes.targets()));
    let keys: Vec<String> = (0..30).map(|i| format!("restart-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(order(key), source(i as i64)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut unsettled = 0;
    for key in &keys {
        unsettled += usize::from(
            !engine
                .state(task_id(key))
                .await
                .unwrap()
                .phase
                .is_terminal(),
        );
    }
    assert!(unsettled > 0, "every saga ended before the restart");
    engine.shutdown(Duration::from_secs(5)).await;
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), remotes.targets()));
    let (succeeded, compensated) = check_outcomes(&engine, &remotes, &keys).await;
    assert_eq!(succeeded + compensated, keys.len());
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A template that reads a step which has not run when it is rendered is refused at load,
/// naming the field; so is a saga that names a missing target or shares a target's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_reading_steps_that_have_not_run_are_refused_at_load() {
    let remotes = Remotes::start(|_| Faults::default()).await;
    let reads_ship = target(&remotes.refunds.base_url(), |t| {
        t["body_fields"]["undoes"] = "{steps.ship.remote_id}".into();
    });
    let base = |extra: (&str, sendledger_effects::TargetConfig)| {
        let plain = |sim: &Sim| target(&sim.base_url(), |_| {});
        Targets::from_config(&BTreeMap::from([
            ("stock".to_string(), plain(&remotes.stock)),
            ("payments".to_string(), plain(&remotes.payments)),
            ("shipments".to_string(), plain(&remotes.shipments)),
            ("release".to_string(), plain(&remotes.release)),
            (extra.0.to_string(), extra.1),
        ]))
        .unwrap()
    };
    let err = base(("refunds", reads_ship))
        .with_sagas(&sagas())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sagas.order.steps[1].compensate")
            && err.contains("{steps.ship.remote_id}")
            && err.contains("reserve, charge"),
        "{err}"
    );
    let plain = target(&remotes.refunds.base_url(), |_| {});
    let mut missing = sagas();
    missing.get_mut("order").unwrap().steps[2].target = "nowhere".into();
    let err = base(("refunds", plain.clone()))
        .with_sagas(&missing)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sagas.order.steps[2].target") && err.contains("`nowhere`"),
        "{err}"
    );
    let mut clash = sagas();
    let order = clash.remove("order").unwrap();
    clash.insert("stock".into(), order);
    let err = base(("refunds", plain))
        .with_sagas(&clash)
        .unwrap_err()
        .to_string();
    assert!(err.contains("also a target"), "{err}");
}
