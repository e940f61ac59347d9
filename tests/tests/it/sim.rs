//! The simulated remote itself: seeded faults, ground-truth counters, configuration, load.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sendledger_effects::AttemptOutcome;
use sendledger_sim::{Faults, Sim, SimConfig, Stats};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use sendledger_tests::effects::{request, target};

/// A plain `GET` over a fresh connection: the status and the body.
async fn get(sim: &Sim, path_and_query: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let head = format!("GET {path_and_query} HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn kind(outcome: &AttemptOutcome) -> String {
    match outcome {
        AttemptOutcome::Succeeded { status, .. } => format!("ok{status}"),
        AttemptOutcome::NotSent { .. } => "not_sent".into(),
        AttemptOutcome::Rejected { status, .. } => format!("rejected{status}"),
        AttemptOutcome::Unknown { .. } => "unknown".into(),
    }
}

fn mixed_faults() -> Faults {
    Faults {
        error: 0.15,
        throttle: 0.15,
        reject: 0.15,
        commit_then_error: 0.15,
        ..Faults::default()
    }
}

/// The outcomes of 60 sequential creates against a fresh sim with this seed, and its stats.
async fn run_seeded(seed: u64) -> (Vec<String>, Stats) {
    let sim = Sim::start(SimConfig {
        seed,
        faults: mixed_faults(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let target = target(&sim, "");
    let mut kinds = Vec::new();
    for i in 0..60 {
        kinds.push(kind(
            &target
                .execute(&request(&format!("k-{i}"), json!({})), 1, None)
                .await,
        ));
    }
    (kinds, sim.stats())
}

#[tokio::test]
async fn faults_are_seeded_and_reproducible() {
    let seed = crate::seed(42);
    let (a, stats_a) = run_seeded(seed).await;
    let (b, stats_b) = run_seeded(seed).await;
    assert_eq!(a, b, "same seed, same faults");
    assert_eq!(stats_a, stats_b);
    let (c, _) = run_seeded(seed.wrapping_add(1)).await;
    assert_ne!(a, c, "another seed, other faults");
    let mut counts = BTreeMap::new();
    for k in &a {
        *counts.entry(k.as_str()).or_insert(0u64) += 1;
    }
    for expected in ["ok201", "not_sent", "rejected422", "unknown"] {
        assert!(
            counts.contains_key(expected),
            "{expected} never drawn: {counts:?}"
        );
    }
    // Ground truth agrees with what the client saw: every success created one record, every
    // 5xx is unknown (some of them committed), throttles and rejections created nothing.
    let count = |k: &str| counts.get(k).copied().unwrap_or(0u64);
    assert_eq!(stats_a.posts, 60);
    assert_eq!(stats_a.errors, count("unknown"));
    assert_eq!(stats_a.throttled, count("not_sent"));
    assert_eq!(stats_a.rejected, count("rejected422"));
    let committed_then_failed = stats_a.records - count("ok201");
    assert!(
        committed_then_failed > 0 && committed_then_failed < count("unknown"),
        "{stats_a:?}"
    );
}

#[tokio::test]
async fn stats_endpoint_reports_posts_records_and_duplicates() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = target(&sim, "");
    target.execute(&request("dup", json!({})), 1, None).await;
    target.execute(&request("dup", json!({})), 2, None).await;
    target.execute(&request("single", json!({})), 1, None).await;
    let stats = sim.stats();
    assert_eq!(
        (
            stats.posts,
            stats.records,
            stats.identities,
            stats.duplicates
        ),
        (3, 3, 2, 1)
    );
    let (status, body) = get(&sim, &sim.config().stats_path.clone()).await;
    assert_eq!(status, 200);
    let over_http: Stats = serde_json::from_str(&body).unwrap();
    assert_eq!(over_http.duplicates, 1);
    assert_eq!(over_http.records, 3);
    let (status, body) = get(&sim, "/records?request_key=dup").await;
    assert_eq!(status, 200);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["body"]["request_key"], "dup");
    assert_eq!(get(&sim, "/nowhere").await.0, 404);
}

#[tokio::test]
async fn configuration_is_strict_and_names_the_field() {
    let cfg: SimConfig = toml::from_str(
        r#"
listen = "127.0.0.1:0"
lookup_lag = "250ms"
idempotency_header = "Idempotency-Key"
seed = 7
[faults]
commit_then_drop = 0.01
throttle = 0.02
retry_after = "2s"
latency = "1ms"
latency_jitter = "5ms"
"#,
    )
    .unwrap();
    assert_eq!(cfg.lookup_lag, Duration::from_millis(250));
    assert_eq!(cfg.faults.retry_after, Duration::from_secs(2));
    cfg.validate().unwrap();
    let err = toml::from_str::<SimConfig>("[faults]\nexplode = 1.0").unwrap_err();
    assert!(err.to_string().contains("unknown field `explode`"), "{err}");
    for (faults, field) in [
        (
            Faults {
                error: 1.5,
                ..Faults::default()
            },
            "faults.error:",
        ),
        (
            Faults {
                error: 0.6,
                reject: 0.6,
                ..Faults::default()
            },
            "faults:",
        ),
        (
            Faults {
                throttle_status: 500,
                ..Faults::default()
            },
            "faults.throttle_status:",
        ),
        (
            Faults {
                reject_status: 500,
                ..Faults::default()
            },
            "faults.reject_status:",
        ),
    ] {
        let err = Sim::start(SimConfig {
            faults,
            ..SimConfig::default()
        })
        .await
        .err()
        .unwrap();
        assert!(err.to_string().starts_with(field), "{err}");
    }
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let err = sim
        .set_faults(Faults {
            refuse: -0.1,
            ..Faults::default()
        })
        .unwrap_err();
    assert!(err.to_string().starts_with("faults.refuse:"), "{err}");
}

/// Thousands of concurrent creates: every one is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_are_all_recorded_once() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let target = Arc::new(target(&sim, "request_timeout = \"10s\""));
    let mut workers = Vec::new();
    for w in 0..64 {
        let target = target.clone();
        workers.push(tokio::spawn(async move {
            for i in 0..40 {
                let outcome = target
                    .execute(&request(&format!("w{w}-{i}"), json!({})), 1, None)
                    .await;
                assert!(
                    matches!(outcome, AttemptOutcome::Succeeded { .. }),
                    "{outcome:?}"
                );
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let stats = sim.stats();
    assert_eq!(
        (
            stats.posts,
            stats.records,
            stats.identities,
            stats.duplicates
        ),
        (2560, 2560, 2560, 0)
    );
    assert!(
        stats.connections <= 64 + 8,
        "connections are pooled: {}",
        stats.connections
    );
}
