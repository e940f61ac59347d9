//! Multi-step tasks (sagas) on the engine over real RocksDB, each step and compensation at a
//! simulated remote of its own over real sockets: reserve (undone by release), charge (undone
//! by refund), ship. What a user checks: the records at each remote, the task's result, the
//! audit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sendledger_core::result::{Projection, ResultStatus, TaskResult};
use sendledger_core::saga::{CompensationOutcome, StepOutcome};
use sendledger_core::{EventBody, Phase, UnknownCause};
use sendledger_effects::{SagaConfig, SagaStepConfig, TargetConfig, Targets};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_store::{Ledger, LedgerOptions};
use sendledger_tests::cluster::{
    read_and_audit_log, start_broker, Group, Instance, KeptOnFailure, ResultsFollower, Stream,
    Timeline,
};
use sendledger_tests::engine::*;
use sendledger_tests::kafka::{dedupe, task_ids, terminal_by_task, validate_all};
use sendledger_tests::kill::{kill_and_restart, Kills};

mod answers;
mod console;
mod orders;

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
        Remotes::start_seeded(crate::seed(38), faults).await
    }

    async fn start_seeded(seed: u64, faults: impl Fn(&str) -> Faults) -> Remotes {
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
        Remotes {
            stock: sim("stock", seed).await,
            payments: sim("payments", seed + 1).await,
            shipments: sim("shipments", seed + 2).await,
            refunds: sim("refunds", seed + 3).await,
            release: sim("release", seed + 4).await,
        }
    }

    /// The targets of the saga `order`. The refund carries the charge's id and the release
    /// the reservation's, read from the steps they undo.
    fn configs(&self) -> BTreeMap<String, TargetConfig> {
        let plain = |sim: &Sim| target(&sim.base_url(), |_| {});
        let undo = |sim: &Sim, step: &str| {
            target(&sim.base_url(), |t| {
                t["body_fields"]["undoes"] = format!("{{steps.{step}.remote_id}}").into();
            })
        };
        BTreeMap::from([
            ("stock".to_string(), plain(&self.stock)),
            ("payments".to_string(), plain(&self.payments)),
            ("shipments".to_string(), plain(&self.shipments)),
            ("refunds".to_string(), undo(&self.refunds, "charge")),
            ("release".to_string(), undo(&self.release, "reserve")),
        ])
    }

    fn targets(&self) -> Targets {
        let targets = Targets::from_config(&self.configs()).unwrap();
        targets.with_sagas(&sagas()).unwrap()
    }

    fn all(&self) -> [&Sim; 5] {
        [
            &self.stock,
            &self.payments,
            &self.shipments,
            &self.refunds,
            &self.release,
        ]
    }
}

impl Remotes {
    /// Makes a charge of order `key` at the payments remote as a sender this ledger does not
    /// know would, then makes that remote lose its answers (it still creates the record):
    /// the order's own charge will be found next to this one. Returns this one's id.
    async fn charged_elsewhere(&self, key: &str) -> String {
        let request = order(key)
            .accept(&sendledger_core::Limits::default())
            .unwrap();
        let outcome = (self.targets().get("payments").unwrap())
            .execute(&request, 1, None)
            .await;
        let sendledger_core::decide::AttemptOutcome::Succeeded { remote_id, .. } = outcome else {
            panic!("{outcome:?}")
        };
        self.payments
            .set_faults(Faults {
                commit_then_drop: 1.0,
                ..Faults::default()
            })
            .unwrap();
        remote_id
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

/// Submits orders `<prefix>-0 .. <prefix>-<count-1>`; returns their request keys.
async fn submit_orders(
    engine: &sendledger_actors::Engine,
    prefix: &str,
    count: usize,
) -> Vec<String> {
    let keys: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(order(key), source(i as i64)).await.unwrap();
    }
    keys
}

/// The task's last result, as the publisher announces it; every result it announced is valid
/// against the results topic's schema, and at most one is terminal.
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
    assert!(terminal <= 1, "{key}: {results:?}");
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

/// The records at the remotes agree with how the task ended: succeeded, one record per step
/// and nothing undone; compensated, no shipment and the reservation and charge undone once
/// each, by compensations naming those very records; in review, a reason. At most one record
/// per remote either way. Returns whether the task ended succeeded or compensated.
fn records_agree(remotes: &Remotes, key: &str, state: &sendledger_core::State) -> bool {
    let (reserved, charged) = (
        record_id(&remotes.stock, key),
        record_id(&remotes.payments, key),
    );
    let (refunded, released) = (undoes(&remotes.refunds, key), undoes(&remotes.release, key));
    match state.phase {
        Phase::Succeeded => {
            assert!(reserved.is_some() && charged.is_some(), "{key}");
            assert!(record_id(&remotes.shipments, key).is_some(), "{key}");
            assert_eq!((refunded, released), (None, None), "{key}");
            true
        }
        Phase::Compensated => {
            assert_eq!(record_id(&remotes.shipments, key), None, "{key}");
            assert!(charged.is_some(), "{key}");
            assert_eq!((refunded, released), (charged, reserved), "{key}");
            true
        }
        Phase::ManualReview => {
            assert!(
                state.review_reason.is_some(),
                "{key}: review without a reason"
            );
            false
        }
        other => panic!("{key} ended {other:?}"),
    }
}

/// Waits for every task to end, and checks it against the records at the remotes
/// ([`records_agree`]) and its result: the steps, what undid what. Returns (succeeded,
/// compensated).
async fn check_outcomes(
    engine: &sendledger_actors::Engine,
    remotes: &Remotes,
    keys: &[String],
) -> (usize, usize) {
    let (mut succeeded, mut compensated) = (0, 0);
    for key in keys {
        let state = wait_for(engine, task_id(key), WAIT, |s| s.phase.is_terminal()).await;
        assert!(records_agree(remotes, key, &state), "{key}");
        let result = last_result(engine, key).await;
        assert_eq!(result.steps.len(), 3, "{key}");
        if state.phase == Phase::Succeeded {
            succeeded += 1;
            let shipment = record_id(&remotes.shipments, key);
            assert_eq!(result.status, ResultStatus::Succeeded);
            assert_eq!(result.remote_id, shipment);
            continue;
        }
        compensated += 1;
        assert_eq!(result.status, ResultStatus::Compensated);
        assert!(matches!(
            result.steps[2].outcome,
            StepOutcome::Rejected {
                http_status: 422,
                ..
            }
        ));
        let undone = [&remotes.stock, &remotes.payments].map(|sim| record_id(sim, key).unwrap());
        for (step, undone) in undone.iter().enumerate() {
            let c = result.steps[step].compensation.as_ref().unwrap();
            assert_eq!(&c.undoes, undone);
            assert!(matches!(c.outcome, CompensationOutcome::Done { .. }));
        }
        assert!(result.reason.unwrap().contains("step ship was refused"));
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
    let keys = submit_orders(&engine, "order", 60).await;
    let (succeeded, compensated) = check_outcomes(&engine, &remotes, &keys).await;
    eprintln!("succeeded {succeeded}, compensated {compensated}");
    assert!(
        compensated >= 3 && succeeded >= 30,
        "{succeeded}/{compensated}"
    );
    assert_eq!(remotes.shipments.stats().records as usize, succeeded);
    for sim in remotes.all() {
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
    let keys = submit_orders(&engine, "lost", 40).await;
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
/// its leg and nothing is sent twice. (A kill -9 mid-saga:
/// `kill_9_mid_saga_and_mid_compensation_performs_nothing_twice`.)
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
    let keys = submit_orders(&engine, "restart", 30).await;
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
            && err.contains("step `ship`'s record")
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

/// kill -9 mid-saga and mid-compensation: an engine child runs 40 sagas against slow remotes
/// (100 to 300 ms an answer; the shipment refused for a third, a payment's answer dropped for
/// one in ten) and is SIGKILLed three times while requests are in flight, then runs to the end.
/// No step and no compensation is performed twice, every task obeys the rules, and each ends
/// succeeded or compensated with the records that says, or in review with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_saga_and_mid_compensation_performs_nothing_twice() {
    let base = crate::seed(380);
    let (mut mid_compensation, mut settled) = (0, 0);
    for seed in base..base + 2 {
        let remotes = Remotes::start_seeded(seed, |name| Faults {
            latency: Duration::from_millis(100),
            latency_jitter: Duration::from_millis(200),
            reject: if name == "shipments" { 0.5 } else { 0.0 },
            commit_then_drop: if name == "payments" { 0.1 } else { 0.0 },
            ..Faults::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let setup = serde_json::json!({ "targets": remotes.configs(), "sagas": sagas(), "target": "order" });
        let prefix = format!("s{seed}");
        let kills = Kills {
            exe: env!("CARGO_BIN_EXE_engine_child"),
            args: vec![
                dir.path().to_str().unwrap().to_string(),
                setup.to_string(),
                prefix.clone(),
                "40".into(),
                seed.to_string(),
            ],
            seed,
            kills: 3,
            kill_within_ms: 1_200,
        };
        let requests = || remotes.all().iter().map(|s| s.stats().requests).sum();
        let kills = match kill_and_restart(kills, requests).await {
            Ok(kills) => kills,
            Err(e) => panic!("{e}; ledger kept at {}", dir.keep().display()),
        };
        assert!(kills >= 2, "seed {seed}: {kills} kills");
        let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        let audit = sendledger_store::audit(&ledger, Default::default(), |_| {}).unwrap();
        assert!(audit.is_clean(), "seed {seed}: {:?}", audit.violations);
        for sim in remotes.all() {
            assert_eq!(sim.stats().duplicates, 0, "seed {seed}: {:?}", sim.stats());
        }
        for i in 0..40 {
            let key = format!("{prefix}-{i}");
            let events = ledger.task_events(task_id(&key)).unwrap();
            let state = sendledger_core::fold(&events);
            settled += usize::from(records_agree(&remotes, &key, &state));
            let compensation_began = events
                .iter()
                .position(|e| matches!(e.body, EventBody::CompensationStarted { .. }));
            if let Some(at) = compensation_began {
                mid_compensation += events[at..]
                    .iter()
                    .filter(|e| {
                        matches!(
                            e.body,
                            EventBody::SendUnknown {
                                cause: UnknownCause::Recovery,
                                ..
                            }
                        )
                    })
                    .count();
            }
        }
    }
    eprintln!(
        "{settled} of 80 sagas settled, {mid_compensation} compensations interrupted by a kill"
    );
    assert!(settled >= 40, "{settled} of 80 settled");
    assert!(
        mid_compensation >= 1,
        "no kill landed in the middle of a compensation"
    );
}

/// Kafka mode: sagas whose partitions move between instances in the middle of their steps and
/// compensations, first as B joins the group, then as A is killed (`kill -9`), resume at their
/// leg on the new owner and send nothing twice: the records at the five remotes agree with
/// each task's end, each task has one terminal result on the results topic, and the events
/// topic (the log of record) audits clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_mode_a_saga_whose_partition_moves_resumes_at_its_leg_on_the_new_owner() {
    let root = KeptOnFailure::new();
    let (broker, kafka_config, kafka) = start_broker().await;
    let remotes = Remotes::start(|name| Faults {
        latency: Duration::from_millis(150),
        reject: if name == "shipments" { 0.3 } else { 0.0 },
        ..Faults::default()
    })
    .await;
    let timeline = Timeline::default();
    let configs = remotes.configs();
    let mut group = Group {
        instances: (0..2)
            .map(|id| {
                Instance::configured(crate::SENDLEDGER, root.path(), id, &kafka_config, |c| {
                    c.targets = configs.clone();
                    c.sagas = sagas();
                })
            })
            .collect(),
        timeline: timeline.clone(),
    };
    let results = ResultsFollower::start(&kafka);
    let stream = Stream::start_to(&kafka, "order", "moved", 4, Duration::from_millis(50));
    let answered_more = |n: usize| {
        let (results, before) = (&results, results.answered().len());
        async move {
            let limit = Instant::now() + Duration::from_secs(90);
            while results.answered().len() < before + n {
                assert!(Instant::now() < limit, "fewer than {n} more tasks answered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::task::block_in_place(|| group.instances[0].start(&timeline));
    answered_more(20).await;
    tokio::task::block_in_place(|| group.instances[1].start(&timeline));
    let split = group.wait_settled(Duration::from_secs(60)).await;
    assert!(
        split.is_some(),
        "the partitions were not split: {}",
        group.owners()
    );
    answered_more(20).await;
    let killed_at = sendledger_core::event::Millis::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    tokio::task::block_in_place(|| group.instances[0].kill());
    answered_more(20).await;
    let produced = stream.stop().await;
    let keys: Vec<String> = produced.iter().map(|(k, _)| k.clone()).collect();
    group
        .wait_answered(&results, &task_ids(&keys), Duration::from_secs(90))
        .await;
    group.stop_all();
    let raw = results.stop();
    let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    validate_all(&raw, "task-result.schema.json");
    let results = dedupe(&raw);
    let terminal = terminal_by_task(&results);
    let mut by_task: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for e in &events {
        by_task.entry(e.task_id).or_default().push(e.clone());
    }
    let (mut settled, mut across_the_kill) = (0, 0);
    for key in &keys {
        let history = &by_task[&task_id(key)];
        let state = sendledger_core::fold(history);
        settled += usize::from(records_agree(&remotes, key, &state));
        let ends = terminal.get(&task_id(key).to_string()).map_or(0, Vec::len);
        assert_eq!(ends, usize::from(state.phase.is_terminal()), "{key}");
        // A leg ended before the kill and another began after it: the saga moved on to its
        // next leg on the instance that took its partition over.
        let leg_ended_before = history.iter().any(|e| {
            e.at < killed_at
                && matches!(
                    e.body,
                    EventBody::Confirmed { .. } | EventBody::Rejected { .. }
                )
        });
        let intent_after = history
            .iter()
            .any(|e| e.at > killed_at && matches!(e.body, EventBody::SendIntended { .. }));
        across_the_kill += usize::from(leg_ended_before && intent_after);
    }
    for sim in remotes.all() {
        assert_eq!(sim.stats().duplicates, 0, "{:?}", sim.stats());
    }
    eprintln!(
        "{} sagas, {settled} succeeded or compensated, {across_the_kill} moved on to their \
         next leg after the kill",
        keys.len()
    );
    assert!(
        across_the_kill >= 1,
        "no saga was between two legs when A was killed"
    );
    drop(broker);
}

/// A saga the process left owing a compensation (its shipment refused, the compensation not
/// started yet: it stopped between those two decisions, which follow each other at once) is
/// resumed at start-up: it refunds the charge and releases the reservation, each undoing the
/// step's own record, and ends compensated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_left_owing_its_compensation_is_resumed_at_start_up() {
    let remotes = Remotes::start(|_| Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let key = "left-1";
    let request = order(key).accept(&Default::default()).unwrap();
    let steps = remotes.targets().steps("order").unwrap().to_vec();
    let created = |remote_id: &str| EventBody::Confirmed {
        remote_id: remote_id.into(),
        evidence: sendledger_core::Evidence::Response { status: 201 },
    };
    let intent = |attempt| EventBody::SendIntended {
        attempt,
        idempotency_key: None,
    };
    let history = vec![
        EventBody::TaskAccepted {
            payload_hash: request.payload_hash(),
            request,
            source: source(0),
        },
        EventBody::StepsPlanned { steps },
        intent(1),
        created("res-x"),
        intent(2),
        created("ch-x"),
        intent(3),
        EventBody::Rejected {
            status: 422,
            detail: "no courier".into(),
        },
    ];
    let state = write_history(dir.path(), key, history).await;
    assert_eq!(state.phase, Phase::Compensating);
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), remotes.targets()));
    let state = wait_for(&engine, task_id(key), WAIT, |s| s.phase.is_terminal()).await;
    assert_eq!(state.phase, Phase::Compensated);
    assert_eq!(undoes(&remotes.refunds, key).as_deref(), Some("ch-x"));
    assert_eq!(undoes(&remotes.release, key).as_deref(), Some("res-x"));
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A step whose template cannot be rendered when its turn comes (the configuration changed
/// under a running saga: its target now reads a step the task's recorded plan does not have)
/// goes to review without sending anything, with the reason named, and nothing is undone: a
/// configuration mistake is no reason to release the reservation. Once the configuration is
/// fixed, the operator's resend sends the step and the task succeeds. Never a panic, never a
/// stuck task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_cannot_be_built_goes_to_review_unsent_and_is_resent_once_fixed() {
    let remotes = Remotes::start(|_| Faults::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let key = "changed-1";
    let request = order(key).accept(&Default::default()).unwrap();
    let mut configs = remotes.configs();
    configs.insert(
        "ghostly".into(),
        target(&remotes.payments.base_url(), |t| {
            t["body_fields"]["ghost"] = "{steps.ghost.remote_id}".into();
        }),
    );
    let targets = Targets::from_config(&configs)
        .unwrap()
        .with_sagas(&sagas())
        .unwrap();
    let mut steps = targets.steps("order").unwrap().to_vec();
    steps[1].target = "ghostly".into();
    steps.truncate(2);
    let history = vec![
        EventBody::TaskAccepted {
            payload_hash: request.payload_hash(),
            request,
            source: source(0),
        },
        EventBody::StepsPlanned { steps },
        EventBody::SendIntended {
            attempt: 1,
            idempotency_key: None,
        },
        EventBody::Confirmed {
            remote_id: "res-x".into(),
            evidence: sendledger_core::Evidence::Response { status: 201 },
        },
    ];
    let state = write_history(dir.path(), key, history).await;
    assert_eq!(state.phase, Phase::Accepted, "between its two steps");
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets));
    let state = wait_for(&engine, task_id(key), WAIT, settled).await;
    assert_eq!(state.phase, Phase::ManualReview);
    let result = last_result(&engine, key).await;
    assert_eq!(result.status, ResultStatus::ManualReview);
    let reason = result.reason.unwrap();
    assert!(reason.contains("step `ghost` has no remote id"), "{reason}");
    assert_eq!(
        remotes.payments.stats().posts,
        0,
        "nothing sent for the step"
    );
    assert_eq!(undoes(&remotes.release, key), None, "nothing undone");
    engine.shutdown(Duration::from_secs(5)).await;

    // The configuration fixed, an operator authorizes the step's resend.
    configs.insert(
        "ghostly".into(),
        target(&remotes.payments.base_url(), |_| {}),
    );
    let fixed = Targets::from_config(&configs)
        .unwrap()
        .with_sagas(&sagas())
        .unwrap();
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), fixed));
    let resend = sendledger_core::decide::OperatorResolution::Resend {
        by: "ana".into(),
        reason: "targets.ghostly fixed".into(),
    };
    engine.resolve(task_id(key), resend).await.unwrap();
    let state = wait_for(&engine, task_id(key), WAIT, |s| s.phase.is_terminal()).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(remotes.payments.records_with_identity(key).len(), 1);
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}
