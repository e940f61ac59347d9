//! A target with a backup (`fallback`): two simulated remotes over real sockets, the engine on
//! real RocksDB. A task's attempts move to the backup only when nothing of the task can exist
//! at its own target; each task ends with exactly one record, at one remote, and its result
//! names the target that holds it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sendledger_core::result::{Projection, ResultStatus};
use sendledger_core::{EventBody, Evidence, Phase};
use sendledger_effects::{TargetConfig, Targets};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::engine::*;

const WAIT: Duration = Duration::from_secs(30);

/// Targets `sim` (the tasks' own, at `primary`, with `fallback = "backup"`) and `backup`.
fn two_targets(primary: &Sim, backup: &Sim, tweak: impl FnOnce(&mut serde_json::Value)) -> Targets {
    let own = target(&primary.base_url(), |t| {
        t["fallback"] = "backup".into();
        tweak(t);
    });
    let backup = target(&backup.base_url(), |_| {});
    Targets::from_config(&BTreeMap::from([
        ("sim".to_string(), own),
        ("backup".to_string(), backup),
    ]))
    .expect("valid targets")
}

/// What a task's last result says, projected from its events as the publisher does.
fn last_result(events: &[sendledger_core::Event]) -> sendledger_core::result::TaskResult {
    let (last, before) = events.split_last().expect("events");
    let mut projection = Projection::of(before);
    projection
        .apply(last)
        .expect("the last event announces a result")
}

fn audit_clean(engine: &sendledger_actors::Engine) {
    let report = sendledger_store::audit(engine.ledger(), Default::default(), |_| {}).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

/// The primary refuses every connection: each task spends its attempts there (each proven not
/// sent), then moves to the backup, which creates its one record. Nothing reaches the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_refuses_everything_hands_its_tasks_to_the_backup() {
    let primary = Sim::start(SimConfig::default()).await.unwrap();
    primary.set_offline(true).await.unwrap();
    let backup = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let targets = two_targets(&primary, &backup, |t| {
        t["retry"] = serde_json::json!({ "max_attempts": 2, "initial_backoff": "20ms", "max_backoff": "50ms" });
        // The attempt budget, not the breaker, moves these tasks.
        t["breaker"] = serde_json::json!({ "enabled": false });
    });
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets));
    let keys: Vec<String> = (0..30).map(|i| format!("fb-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in &keys {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        assert_eq!(state.fallback_target.as_deref(), Some("backup"));
        assert_eq!(backup.records_with_identity(key).len(), 1, "{key}");
        let events = engine.events(task_id(key)).await.unwrap();
        let intents: Vec<&EventBody> = events
            .iter()
            .map(|e| &e.body)
            .filter(|b| {
                matches!(
                    b,
                    EventBody::SendIntended { .. } | EventBody::SendIntendedAt { .. }
                )
            })
            .collect();
        assert_eq!(
            intents.len(),
            3,
            "{key}: two at its own target, then the backup"
        );
        assert!(matches!(
            intents[2],
            EventBody::SendIntendedAt { attempt: 3, target, .. } if target == "backup"
        ));
        let result = last_result(&events);
        assert_eq!(result.status, ResultStatus::Succeeded);
        assert_eq!(result.target.as_deref(), Some("sim"));
        assert_eq!(result.remote_target.as_deref(), Some("backup"));
    }
    primary.set_offline(false).await.unwrap();
    assert_eq!(primary.stats().posts, 0);
    assert_eq!(backup.stats().posts, 30, "one POST per task at the backup");
    assert_eq!(backup.stats().duplicates, 0);
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The primary creates each record and drops its answer: those attempts are unknown, so their
/// tasks are reconciled at the primary (where the lookup finds the record) and never go to the
/// backup, even after the breaker opens. Tasks that arrive while it is open, having sent
/// nothing to the primary, go to the backup at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_unknown_at_the_primary_never_go_to_the_backup() {
    let primary = Sim::start(SimConfig {
        faults: Faults {
            commit_then_drop: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let backup = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let targets = two_targets(&primary, &backup, |t| {
        t["breaker"] = serde_json::json!({ "window_calls": 10, "minimum_calls": 5, "failure_rate": 0.5, "open_for": "60s" });
    });
    let engine = tokio::task::block_in_place(|| start_with(dir.path(), targets));
    let early: Vec<String> = (0..8).map(|i| format!("early-{i}")).collect();
    for (i, key) in early.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    let until = Instant::now() + WAIT;
    while !engine
        .target_health()
        .iter()
        .any(|h| h.target == "sim" && h.state == "open")
    {
        assert!(Instant::now() < until, "the primary's breaker never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late: Vec<String> = (0..20).map(|i| format!("late-{i}")).collect();
    for (i, key) in late.iter().enumerate() {
        engine
            .submit(request(key), source(100 + i as i64))
            .await
            .unwrap();
    }
    let mut unknown_at_primary = 0;
    for key in &early {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        let events = engine.events(task_id(key)).await.unwrap();
        let has = |f: fn(&EventBody) -> bool| events.iter().any(|e| f(&e.body));
        let at_primary = primary.records_with_identity(key).len();
        let at_backup = backup.records_with_identity(key).len();
        assert_eq!(at_primary + at_backup, 1, "{key}: one record in all");
        if has(|b| matches!(b, EventBody::SendUnknown { .. })) {
            unknown_at_primary += 1;
            assert!(
                !has(|b| matches!(b, EventBody::SendIntendedAt { .. })),
                "{key} went to the backup after an unknown outcome at the primary"
            );
            assert_eq!((at_primary, at_backup), (1, 0), "{key}");
            assert_eq!(state.evidence, Some(Evidence::Lookup), "{key}");
            assert_eq!(last_result(&events).remote_target.as_deref(), Some("sim"));
        } else {
            // Submitted with the others, it found the breaker already open: it never sent a
            // byte to the primary.
            assert!(
                !has(|b| matches!(b, EventBody::SendIntended { .. })),
                "{key}"
            );
            assert_eq!((at_primary, at_backup), (0, 1), "{key}");
        }
    }
    assert!(
        unknown_at_primary >= 5,
        "the breaker opened on unknown outcomes"
    );
    for key in &late {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        let events = engine.events(task_id(key)).await.unwrap();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e.body, EventBody::SendIntended { .. })),
            "{key} was sent to the primary while its breaker was open"
        );
        assert!(primary.records_with_identity(key).is_empty(), "{key}");
        assert_eq!(backup.records_with_identity(key).len(), 1, "{key}");
        assert_eq!(
            last_result(&events).remote_target.as_deref(),
            Some("backup")
        );
    }
    assert_eq!(
        backup.stats().posts,
        20 + (early.len() as u64 - unknown_at_primary),
        "one POST at the backup per task that went there"
    );
    assert_eq!(primary.stats().duplicates + backup.stats().duplicates, 0);
    audit_clean(&engine);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A fallback must be another configured target, with none of its own; each mistake is refused
/// at load, naming the field.
#[test]
fn a_fallback_is_one_step_to_another_configured_target() {
    let config = |fallbacks: &[(&str, Option<&str>)]| -> BTreeMap<String, TargetConfig> {
        fallbacks
            .iter()
            .map(|(name, fallback)| {
                let t = target("http://127.0.0.1:9", |t| {
                    if let Some(f) = fallback {
                        t["fallback"] = (*f).into();
                    }
                });
                (name.to_string(), t)
            })
            .collect()
    };
    let refused = |fallbacks: &[(&str, Option<&str>)]| {
        Targets::from_config(&config(fallbacks))
            .expect_err("refused")
            .to_string()
    };
    let e = refused(&[("a", Some("nowhere"))]);
    assert!(
        e.contains("targets.a.fallback") && e.contains("`nowhere` is not a configured target"),
        "{e}"
    );
    let e = refused(&[("a", Some("a"))]);
    assert!(
        e.contains("targets.a.fallback") && e.contains("its own fallback"),
        "{e}"
    );
    let e = refused(&[("a", Some("b")), ("b", Some("c")), ("c", None)]);
    assert!(
        e.contains("targets.a.fallback") && e.contains("`b` has a fallback of its own"),
        "{e}"
    );
    let ok = Targets::from_config(&config(&[("a", Some("b")), ("b", None)])).unwrap();
    let policy = ok.policy("a").unwrap();
    assert_eq!(
        policy.fallback.as_ref().map(|f| f.target.as_str()),
        Some("b")
    );
    assert_eq!(ok.policy("b").unwrap().fallback, None);
}
