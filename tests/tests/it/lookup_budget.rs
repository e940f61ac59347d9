//! Lookups have a budget (issue #37): they take their slot from the target's `max_in_flight`
//! and `rate_limit` (each page one request), or from `lookup.limits` when it is configured, and
//! a lookup the remote throttles (429, or 503 with `Retry-After`) is not followed by another
//! before the remote's delay. Over real sockets against the simulated remote, which records
//! the peak of requests it worked on at once and when each lookup arrived.

use std::time::{Duration, Instant};

use sendledger_core::{Evidence, Phase};
use sendledger_effects::{Error, Target, TargetConfig};
use sendledger_sim::{Faults, LookupPaging, Sim, SimConfig};
use sendledger_tests::effects::{config, request, start_sim};
use serde_json::json;

/// A target at `sim` looking tasks up by reference, with `extra` TOML keys (replacing the
/// defaults of [`config`]).
fn target(sim: &Sim, extra: &str) -> Target {
    Target::from_config("payments", &config(sim, extra)).expect("valid test target")
}

/// The `lookup` key of a target at `sim`, with `more` keys added to its table
/// (`, key = value...`).
fn lookup(sim: &Sim, more: &str) -> String {
    format!(
        r#"lookup = {{ url = "{}?reference={{task_id}}"{more} }}"#,
        sim.lookup_url()
    )
}

/// A sim with `latency` on every request, and a target at it whose send slot is held: a
/// lookup must find room elsewhere, or wait.
async fn busy_target(
    latency: Duration,
    extra: &str,
) -> (Sim, Target, sendledger_effects::SendSlot) {
    let sim = start_sim(Faults {
        latency,
        ..Faults::default()
    })
    .await;
    let target = target(&sim, extra);
    let slot = target.reserve(None).await.expect("the breaker is closed");
    (sim, target, slot)
}

/// With `max_in_flight = 1` a lookup waits while an attempt holds the slot (nothing reaches the
/// remote), goes as soon as it is free, and gives up after `request_timeout`: an error that
/// may pass, not sent, no evidence either way.
#[tokio::test]
async fn a_lookup_waits_for_the_send_slot_and_gives_up_after_request_timeout() {
    let (sim, target, slot) = busy_target(
        Duration::ZERO,
        "max_in_flight = 1\nrequest_timeout = \"300ms\"",
    )
    .await;
    let req = request("ord-1", json!({}));
    let started = Instant::now();
    let err = target.lookup(&req, None).await.unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, Error::LookupNotSent { .. }), "{err}");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("max_in_flight"), "{err}");
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(sim.stats().lookups, 0);

    let target = std::sync::Arc::new(target);
    let waiting = tokio::spawn({
        let (target, req) = (target.clone(), req.clone());
        async move { target.lookup(&req, None).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the lookup waits for the slot");
    assert_eq!(sim.stats().lookups, 0);
    drop(slot);
    assert_eq!(waiting.await.unwrap(), Ok(vec![]));
    assert_eq!(sim.stats().lookups, 1);
}

/// `lookup.limits` gives lookups a limiter of their own: with the target's only send slot
/// held, three lookups still go, at most two at a time at the remote.
#[tokio::test]
async fn own_lookup_limits_are_used_instead_of_the_targets() {
    let latency = Duration::from_millis(150);
    let extra = |sim: &Sim| {
        format!(
            "max_in_flight = 1\n{}",
            lookup(sim, ", limits = { max_in_flight = 2 }")
        )
    };
    let sim = start_sim(Faults {
        latency,
        ..Faults::default()
    })
    .await;
    let target = target(&sim, &extra(&sim));
    let _slot = target.reserve(None).await.expect("the breaker is closed");
    let req = request("ord-1", json!({}));
    let started = Instant::now();
    let (a, b, c) = tokio::join!(
        target.lookup(&req, None),
        target.lookup(&req, None),
        target.lookup(&req, None)
    );
    assert_eq!((a, b, c), (Ok(vec![]), Ok(vec![]), Ok(vec![])));
    let stats = sim.stats();
    assert_eq!((stats.lookups, stats.peak_in_flight), (3, 2));
    // Two rounds of the remote's latency: the third lookup waited for one of the first two.
    assert!(started.elapsed() >= latency * 2, "{:?}", started.elapsed());
}

/// Each page of a paged lookup is one request against the target's `rate_limit` (2 per second:
/// two at once, then one every half second): four pages take a second.
#[tokio::test]
async fn each_page_of_a_lookup_counts_against_the_rate_limit() {
    let sim = Sim::start(SimConfig {
        lookup_page_size: Some(1),
        lookup_paging: LookupPaging::Body,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let req = request("ord-1", json!({}));
    let writer = target(&sim, "");
    for attempt in 1..=4 {
        writer.execute(&req, attempt, None).await;
    }
    let paged = target(
        &sim,
        &format!(
            "rate_limit = 2.0\n{}",
            lookup(
                &sim,
                r#", results_pointer = "/items", paging = { next_pointer = "/next" }"#
            )
        ),
    );
    let found = paged.lookup(&req, None).await.expect("four pages read");
    assert_eq!(found.len(), 4);
    let received = sim.lookups_received();
    assert_eq!(received.len(), 4);
    let spread = received[3].at - received[0].at;
    assert!(spread >= Duration::from_millis(950), "{spread:?}");
}

/// A lookup answered 429 (or 503) with `Retry-After` is a transient error naming the delay,
/// and the next lookup of the target is not sent before it has passed.
#[tokio::test]
async fn a_throttled_lookup_holds_the_next_until_retry_after() {
    for status in [429, 503] {
        let sim = start_sim(Faults {
            lookup_throttle: 1.0,
            throttle_status: status,
            retry_after: Duration::from_secs(1),
            ..Faults::default()
        })
        .await;
        let target = target(&sim, "");
        let req = request("ord-1", json!({}));
        let err = target.lookup(&req, None).await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, Error::LookupThrottled { status: s, .. } if s == status),
            "{text}"
        );
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)), "{text}");
        assert!(err.is_transient(), "{text}");
        assert!(text.contains("retry after 1s"), "{text}");
        sim.set_faults(Faults::default()).unwrap();
        assert_eq!(target.lookup(&req, None).await, Ok(vec![]));
        let received = sim.lookups_received();
        let statuses: Vec<u16> = received.iter().map(|l| l.status).collect();
        assert_eq!(statuses, [status, 200]);
        let gap = received[1].at - received[0].at;
        assert!(gap >= Duration::from_secs(1), "{status}: {gap:?}");
    }
}

/// A `Retry-After` that ends after the lookup's longest wait (`request_timeout`) fails the next
/// lookup at once, unsent: nothing reaches the remote before the delay.
#[tokio::test]
async fn a_lookup_is_not_sent_before_a_retry_after_longer_than_its_wait() {
    let sim = start_sim(Faults {
        lookup_throttle: 1.0,
        retry_after: Duration::from_secs(3),
        ..Faults::default()
    })
    .await;
    let target = target(&sim, "request_timeout = \"500ms\"");
    let req = request("ord-1", json!({}));
    let throttled = target.lookup(&req, None).await.unwrap_err();
    assert_eq!(throttled.retry_after(), Some(Duration::from_secs(3)));
    sim.set_faults(Faults::default()).unwrap();
    let started = Instant::now();
    let err = target.lookup(&req, None).await.unwrap_err();
    assert!(matches!(err, Error::LookupNotSent { .. }), "{err}");
    assert!(err.to_string().contains("Retry-After"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(sim.stats().lookups, 1);
}

/// Settings of `lookup.limits` that cannot work are refused naming the field; an unknown key
/// is refused by name.
#[tokio::test]
async fn lookup_limits_that_cannot_work_are_refused_naming_the_field() {
    let sim = start_sim(Faults::default()).await;
    let parse = |limits: &str| -> Result<TargetConfig, toml::de::Error> {
        toml::from_str(&format!(
            "url = \"{}\"\n{}",
            sim.create_url(),
            lookup(&sim, &format!(", limits = {{ {limits} }}"))
        ))
    };
    for (limits, field, says) in [
        ("max_in_flight = 0", "max_in_flight", "at least 1"),
        ("rate_limit = 0.0", "rate_limit", "positive"),
        ("rate_limit = -2.0", "rate_limit", "positive"),
        ("rate_limit = nan", "rate_limit", "positive"),
    ] {
        let config = parse(limits).unwrap_or_else(|e| panic!("{limits}: {e}"));
        match Target::from_config("payments", &config) {
            Err(Error::Config { field: f, reason }) => {
                assert_eq!(
                    f,
                    format!("targets.payments.lookup.limits.{field}"),
                    "{limits}"
                );
                assert!(reason.contains(says), "{limits}: {reason}");
            }
            other => panic!(
                "{limits}: expected a configuration error, got {:?}",
                other.err()
            ),
        }
    }
    let unknown = parse("burst = 3").unwrap_err().to_string();
    assert!(unknown.contains("unknown field `burst`"), "{unknown}");
    // Either limit alone, or neither (a limiter of its own with the defaults), is valid.
    for limits in ["max_in_flight = 4", "rate_limit = 10.0", ""] {
        let config = parse(limits).unwrap();
        Target::from_config("payments", &config).unwrap_or_else(|e| panic!("{limits}: {e}"));
    }
}

/// The engine end to end with `max_in_flight = 1`: a third of the creates are committed and
/// their answers dropped, so lookups run while other tasks send. The remote never works on two
/// requests at once, and every task succeeds with one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_and_lookups_together_never_exceed_max_in_flight() {
    use sendledger_tests::engine::{self, settled, source, task_id, wait_for};

    let sim = Sim::start(SimConfig {
        seed: crate::seed(37),
        faults: Faults {
            commit_then_drop: 0.35,
            latency: Duration::from_millis(10),
            latency_jitter: Duration::from_millis(10),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let config = engine::target(&sim.base_url(), |t| {
        t["max_in_flight"] = 1.into();
        t["lookup"]["deadline"] = "30s".into();
    });
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| engine::start(dir.path(), config));
    let keys: Vec<String> = (0..24).map(|i| format!("ord-{i}")).collect();
    let submits: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(offset, key)| {
            let (engine, request) = (engine.clone(), engine::request(key));
            tokio::spawn(async move { engine.submit(request, source(offset as i64)).await })
        })
        .collect();
    for submit in submits {
        submit.await.unwrap().unwrap();
    }
    for key in &keys {
        let state = wait_for(&engine, task_id(key), Duration::from_secs(60), settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    let stats = sim.stats();
    assert!(stats.dropped >= 1 && stats.lookups >= 1, "{stats:?}");
    assert_eq!(stats.duplicates, 0, "{stats:?}");
    assert_eq!(stats.peak_in_flight, 1, "{stats:?}");
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The engine end to end: the task's answer is dropped, its first lookup is answered
/// `429 Retry-After: 2`. No lookup reaches the remote within the next 2 s (the reconciler's
/// own backoff would ask after 1 s), and once the remote answers, the lookup finds the record
/// and the task succeeds on it, never resent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_answered_429_is_not_followed_by_another_within_retry_after() {
    use sendledger_tests::engine::{self, settled, source, task_id, wait_for};

    let sim = start_sim(Faults {
        commit_then_drop: 1.0,
        lookup_throttle: 1.0,
        retry_after: Duration::from_secs(2),
        ..Faults::default()
    })
    .await;
    let config = engine::target(&sim.base_url(), |t| {
        t["lookup"]["deadline"] = "30s".into();
    });
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| engine::start(dir.path(), config));
    engine
        .submit(engine::request("ord-1"), source(0))
        .await
        .unwrap();
    let throttled_by = Instant::now() + Duration::from_secs(10);
    while sim.lookups_received().is_empty() {
        assert!(Instant::now() < throttled_by, "no lookup was asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sim.set_faults(Faults::default()).unwrap();
    let state = wait_for(&engine, task_id("ord-1"), Duration::from_secs(30), settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.evidence, Some(Evidence::Lookup));
    assert_eq!(state.attempts, 1);
    let records = sim.records_with_identity("ord-1");
    assert_eq!(records.len(), 1);
    assert_eq!(state.remote_id.as_deref(), Some(records[0].id.as_str()));
    let received = sim.lookups_received();
    assert_eq!(received[0].status, 429, "{received:?}");
    assert_eq!(sim.stats().lookups_throttled, 1);
    let gap = received[1].at - received[0].at;
    assert!(gap >= Duration::from_secs(2), "asked again after {gap:?}");
    engine.shutdown(Duration::from_secs(5)).await;
}
