//! Failures that can be retried: tasks that failed while their remote refused every connection
//! are listed from the task index and retried in bulk through the admin endpoint (real
//! sockets, real RocksDB, the simulated remote); each is sent once more, and its new result
//! supersedes the failed one.

use std::collections::BTreeSet;
use std::time::Duration;

use sendledger_core::result::Projection;
use sendledger_core::{Phase, ResultStatus};
use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::engine::*;
use sendledger_tests::http::{get_json, request as http, TOKEN};
use serde_json::{json, Value};

const TASKS: usize = 1_000;
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_failed_by_an_outage_are_retried_in_bulk_once_each() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // No breaker: every task spends its two attempts on refused connections and fails.
    let config = target(&sim.base_url(), |t| {
        t["retry"] = json!({ "max_attempts": 2, "initial_backoff": "5ms", "max_backoff": "10ms", "multiplier": 2.0 });
        t["breaker"] = json!({ "enabled": false });
    });
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let admin_config = sendledger_node::config::AdminConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        token: Some(TOKEN.into()),
        ..Default::default()
    };
    let admin = sendledger_node::admin::Admin::start(&admin_config, engine.clone(), handle)
        .await
        .unwrap();
    let addr = admin.local_addr().to_string();

    // One task succeeds before the outage: it is not retried.
    engine.submit(request("ok"), source(0)).await.unwrap();
    wait_for(&engine, task_id("ok"), WAIT, settled).await;
    sim.set_offline(true).await.unwrap();
    let keys: Vec<String> = (0..TASKS).map(|i| format!("out-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        engine
            .submit(request(key), source(1 + i as i64))
            .await
            .unwrap();
    }
    for key in &keys {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Failed, "{key}");
    }

    // The index lists them: page by page, each once, with why they failed.
    let mut listed = BTreeSet::new();
    let mut after = String::new();
    loop {
        let page = get_json(
            &addr,
            &format!("/tasks?phase=failed&target=sim&failure=connect&limit=300{after}"),
        )
        .await;
        for t in page["tasks"].as_array().unwrap() {
            assert_eq!(
                (t["state"].as_str(), t["failure"].as_str()),
                (Some("failed"), Some("connect")),
                "{t}"
            );
            assert!(
                listed.insert(t["task_id"].as_str().unwrap().to_string()),
                "listed twice: {t}"
            );
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    let expected: BTreeSet<String> = keys.iter().map(|k| task_id(k).to_string()).collect();
    assert_eq!(listed, expected);
    let ok = get_json(&addr, "/tasks?phase=succeeded").await;
    assert_eq!(ok["tasks"].as_array().unwrap().len(), 1, "{ok}");

    // A task that did not fail is not retried; bad bodies name the field.
    let (status, body) = http(
        &addr,
        "POST",
        &format!("/tasks/{}/retry", task_ref("ok")),
        Some(TOKEN),
        Some(json!({ "by": "ana", "reason": "again" })),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("did not fail"), "{body}");
    let (status, body) = http(
        &addr,
        "POST",
        "/tasks/retry",
        Some(TOKEN),
        Some(json!({ "by": "ana", "reason": "x", "failure": "gone" })),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("failure"), "{body}");
    let (status, _) = http(
        &addr,
        "POST",
        "/tasks/retry",
        None,
        Some(json!({ "by": "ana", "reason": "x" })),
    )
    .await;
    assert_eq!(status, 401);

    // The remote is back: three bulk calls of at most 400 retry all of them.
    sim.set_offline(false).await.unwrap();
    let posts_before = sim.stats().posts;
    let mut body =
        json!({ "by": "ana", "reason": "the payments API is back", "target": "sim", "limit": 400 });
    let (mut calls, mut retried) = (0, 0);
    loop {
        let (status, answer) = http(
            &addr,
            "POST",
            "/tasks/retry",
            Some(TOKEN),
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["refused"], 0, "{answer}");
        retried += answer["retried"].as_u64().unwrap();
        calls += 1;
        match answer["next"].as_str() {
            Some(next) => body["after"] = json!(next),
            None => break,
        }
    }
    assert_eq!((calls, retried), (3, TASKS as u64));

    for key in &keys {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!((state.phase, state.version), (Phase::Succeeded, 2), "{key}");
        assert_eq!(
            sim.records_with_identity(key).len(),
            1,
            "{key}: one record at the remote"
        );
        // Two results: the failed one of version 1, superseded by the success of version 2.
        let events = engine.events(task_id(key)).await.unwrap();
        let mut projection = Projection::default();
        let results: Vec<_> = events
            .iter()
            .filter_map(|e| projection.apply(e))
            .map(|r| (r.status, r.version))
            .collect();
        assert_eq!(
            results,
            [(ResultStatus::Failed, 1), (ResultStatus::Succeeded, 2)],
            "{key}"
        );
        let retried = events
            .iter()
            .filter(|e| matches!(&e.body, sendledger_core::EventBody::TaskRetried { by, .. } if by == "ana"))
            .count();
        assert_eq!(retried, 1, "{key}");
    }
    assert_eq!(
        sim.stats().posts - posts_before,
        TASKS as u64,
        "each sent once more"
    );
    assert_eq!(sim.stats().duplicates, 0);
    // Retried tasks are no longer failed.
    let failed = get_json(&addr, "/tasks?phase=failed").await;
    assert!(failed["tasks"].as_array().unwrap().is_empty(), "{failed}");

    let report = sendledger_store::audit(engine.ledger(), Default::default(), |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
    assert_eq!(report.retries, TASKS as u64);
    admin.shutdown().await;
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A retry recorded on a stopped ledger (the CLI's `--data`) is sent when the service starts:
/// the retried task is unsettled again, so the engine resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_recorded_on_a_stopped_ledger_is_sent_at_the_next_start() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.set_offline(true).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        target(&sim.base_url(), |t| {
            t["retry"] = json!({ "max_attempts": 1, "initial_backoff": "5ms", "max_backoff": "10ms", "multiplier": 2.0 });
            t["breaker"] = json!({ "enabled": false });
        })
    };
    let engine = tokio::task::block_in_place(|| start(dir.path(), config()));
    engine.submit(request("later"), source(0)).await.unwrap();
    let state = wait_for(&engine, task_id("later"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Failed);
    engine.shutdown(Duration::from_secs(5)).await;

    // What `sendledger tasks retry --data` does, outside any async runtime.
    let path = dir.path().to_path_buf();
    let reply = std::thread::spawn(move || {
        let ledger = sendledger_store::Ledger::open(&path, Default::default()).unwrap();
        let retry = sendledger_core::OperatorResolution::Retry {
            by: "ana".into(),
            reason: "back".into(),
        };
        sendledger_actors::Engine::resolve_stopped(&ledger, task_id("later"), retry).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(reply.phase, Phase::RetryWait);

    sim.set_offline(false).await.unwrap();
    let engine = tokio::task::block_in_place(|| start(dir.path(), config()));
    let state = wait_for(&engine, task_id("later"), WAIT, settled).await;
    assert_eq!((state.phase, state.version), (Phase::Succeeded, 2));
    assert_eq!(sim.records_with_identity("later").len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A target with `breaker.retry_failed_within`: the tasks an outage failed before the breaker
/// opened are retried when it closes again, with no operator, each sent once more and recorded
/// as the policy's retry; tasks that arrived while it was open waited and are sent then too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_breaker_retries_the_tasks_the_outage_failed() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.set_offline(true).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // 30 outcomes before the breaker may open: the first 10 tasks (2 refused attempts each)
    // fail; the later ones open it and wait.
    let config = target(&sim.base_url(), |t| {
        t["retry"] = json!({ "max_attempts": 2, "initial_backoff": "5ms", "max_backoff": "10ms", "multiplier": 2.0 });
        t["breaker"] = json!({
            "window_calls": 30, "minimum_calls": 30, "failure_rate": 0.5, "open_for": "1s",
            "health_url": sim.stats_url(), "retry_failed_within": "10m"
        });
    });
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    let first: Vec<String> = (0..10).map(|i| format!("first-{i}")).collect();
    for (i, key) in first.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    for key in &first {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Failed, "{key}");
    }
    let later: Vec<String> = (0..10).map(|i| format!("later-{i}")).collect();
    for (i, key) in later.iter().enumerate() {
        engine
            .submit(request(key), source(100 + i as i64))
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + WAIT;
    while !engine
        .target_health()
        .iter()
        .any(|h| h.state == "open" && h.opened == 1)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker never opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sim.set_offline(false).await.unwrap();
    let mut policy_retries = 0;
    for key in first.iter().chain(&later) {
        let state = wait_for(&engine, task_id(key), WAIT, |s| s.phase == Phase::Succeeded).await;
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
        let events = engine.events(task_id(key)).await.unwrap();
        let retries: Vec<&str> = events
            .iter()
            .filter_map(|e| match &e.body {
                sendledger_core::EventBody::TaskRetried { by, .. } => Some(by.as_str()),
                _ => None,
            })
            .collect();
        // A later task may have failed too, before the breaker opened on its attempts.
        if key.starts_with("first") || !retries.is_empty() {
            assert_eq!(retries, ["policy:breaker_closed"], "{key}");
            assert_eq!(state.version, 2, "{key}");
            policy_retries += 1;
        }
    }
    assert_eq!(sim.stats().duplicates, 0);
    let report = sendledger_store::audit(engine.ledger(), Default::default(), |_| {}).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.retries, policy_retries);
    assert!(policy_retries >= 10);
    engine.shutdown(Duration::from_secs(5)).await;
}
