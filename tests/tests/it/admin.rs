//! The admin endpoint and the review command: real sockets, real RocksDB, the simulated remote.
//!
//! The service runs as a child process (`admin_child`) because the metrics recorder is
//! process-wide: the other tests of this binary run engines concurrently, and their attempts
//! would show in a recorder installed here. In the child the recorder sees one engine, so the
//! scraped values must equal what happened, exactly.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use sendledger_core::{EventBody, Evidence, Phase};
use sendledger_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_kafka::{Kafka, KafkaConfig, Role};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::engine::*;
use sendledger_tests::http::{get_json, request as http, resolve, TOKEN};
use sendledger_tests::process::AdminChild;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(crate) const WAIT: Duration = Duration::from_secs(20);
pub(crate) async fn wait_state(addr: &str, key: &str, state: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let task = get_json(addr, &format!("/tasks/{}", task_ref(key))).await;
        if task["state"] == state {
            return task;
        }
        assert!(Instant::now() < deadline, "{key} never {state}: {task:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One sample of a scrape.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A strict parser of the Prometheus text format (0.0.4): `# HELP` and `# TYPE` lines, and
/// samples `name{label="value",...} value [timestamp]`. Panics on anything malformed, on a
/// sample before its family's `TYPE`, and on a family typed twice. Returns the samples and
/// the type of each family.
fn parse_prometheus(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    fn value(v: &str) -> f64 {
        match v {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("bad value {v:?}")),
        }
    }
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(valid_name(name), "bad family name in {line:?}");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "bad type in {line:?}"
                    );
                    assert!(
                        types.insert(name.to_string(), kind.to_string()).is_none(),
                        "{name} typed twice"
                    );
                }
                (Some("HELP"), Some(name), _) => assert!(valid_name(name), "{line:?}"),
                _ => panic!("bad comment line {line:?}"),
            }
            continue;
        }
        assert!(!line.starts_with('#'), "bad comment line {line:?}");
        let name_end = line.find(['{', ' ']).expect("a sample value");
        let name = &line[..name_end];
        assert!(valid_name(name), "bad metric name in {line:?}");
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices().peekable();
            let end = loop {
                let (i, c) = chars.next().expect("unterminated labels");
                if c == '}' {
                    break i;
                }
                if c == ',' {
                    continue;
                }
                let key_start = i;
                let mut key_end = i;
                for (j, c) in chars.by_ref() {
                    if c == '=' {
                        key_end = j;
                        break;
                    }
                }
                let key = &inner[key_start..key_end];
                assert!(valid_name(key), "bad label name {key:?} in {line:?}");
                assert_eq!(chars.next().map(|c| c.1), Some('"'), "{line:?}");
                let mut val = String::new();
                loop {
                    match chars.next().expect("unterminated label value").1 {
                        '"' => break,
                        '\\' => match chars.next().expect("bad escape").1 {
                            'n' => val.push('\n'),
                            c @ ('\\' | '"') => val.push(c),
                            c => panic!("bad escape \\{c} in {line:?}"),
                        },
                        c => val.push(c),
                    }
                }
                assert!(
                    labels.insert(key.to_string(), val).is_none(),
                    "label {key} twice in {line:?}"
                );
            };
            rest = &inner[end + 1..];
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        assert!(
            rest.starts_with(' ') && (1..=2).contains(&fields.len()),
            "bad sample {line:?}"
        );
        if let Some(ts) = fields.get(1) {
            ts.parse::<i64>()
                .unwrap_or_else(|_| panic!("bad timestamp in {line:?}"));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "{name} sampled before its TYPE");
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value: value(fields[0]),
        });
    }
    (samples, types)
}

struct Scrape {
    samples: Vec<Sample>,
    types: BTreeMap<String, String>,
}

impl Scrape {
    async fn take(addr: &str) -> Scrape {
        let (status, text) = http(addr, "GET", "/metrics", None, None).await;
        assert_eq!(status, 200, "{text}");
        let (samples, types) = parse_prometheus(&text);
        Scrape { samples, types }
    }

    /// The value of the series with exactly these labels (0 when absent, as a counter that
    /// never moved).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} appears twice");
        found.first().copied()
    }

    /// Checks a histogram's buckets: cumulative, ending in `+Inf` equal to the count. Returns
    /// the count.
    fn histogram_count(&self, name: &str) -> f64 {
        assert_eq!(
            self.types.get(name).map(String::as_str),
            Some("histogram"),
            "{name}"
        );
        let buckets: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter(|s| s.name == format!("{name}_bucket"))
            .map(|s| {
                let le = &s.labels["le"];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s.value)
            })
            .collect();
        assert!(buckets.len() >= 2, "{name} has buckets: {buckets:?}");
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{name} buckets cumulative: {buckets:?}"
        );
        let count = self.value(&format!("{name}_count"), &[]);
        assert_eq!(buckets.last().copied(), Some((f64::INFINITY, count)));
        count
    }
}

/// Runs `sendledger` with these arguments; its success, stdout and stderr.
fn cli(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sendledger_cli"))
        .args(args)
        .env_remove("SENDLEDGER_ADMIN_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Tasks succeed, redeliver, and go to manual review (5xx, no record by the deadline); the
/// metrics say exactly that; reviews are resolved through the endpoint (token required) and
/// through the command on the running service; then, with the service stopped, a resend is
/// authorized on the ledger and performed exactly once by the next engine start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_metrics_and_review_round_trips() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target_config = target(&sim.base_url(), |t| {
        t["lookup"]["deadline"] = "400ms".into()
    });
    let target_json = serde_json::to_string(&target_config).unwrap();
    let mut service = tokio::task::block_in_place(|| {
        AdminChild::start(crate::ADMIN_CHILD, dir.path(), &target_json, None, TOKEN)
    });
    let addr = service.addr.clone();

    // Three tasks succeed; one is delivered twice.
    for key in ["ok-1", "ok-2", "ok-3"] {
        service.submit(key);
    }
    for key in ["ok-1", "ok-2", "ok-3"] {
        wait_state(&addr, key, "succeeded").await;
    }
    assert_eq!(service.submit("ok-1"), "DuplicateDelivery");
    // Four end in review: the remote answers 500 and holds no record.
    sim.set_faults(Faults {
        error: 1.0,
        ..Faults::default()
    })
    .unwrap();
    for key in ["rv-1", "rv-2", "rv-3", "rv-4"] {
        service.submit(key);
    }
    for key in ["rv-1", "rv-2", "rv-3", "rv-4"] {
        wait_state(&addr, key, "manual_review").await;
    }
    sim.set_faults(Faults::default()).unwrap();
    assert_eq!(sim.records().len(), 3);

    // Metrics, parsed strictly, equal to what happened.
    let m = Scrape::take(&addr).await;
    let attempts = |class| m.value("sendledger_attempts_total", &[("class", class)]);
    assert_eq!(attempts("succeeded"), 3.0);
    assert_eq!(attempts("unknown"), 4.0);
    assert_eq!(attempts("rejected") + attempts("not_sent"), 0.0);
    assert_eq!(
        m.value("sendledger_duplicates_dropped_total", &[("by", "identity")]),
        1.0
    );
    let lookups_none = m.value("sendledger_lookups_total", &[("outcome", "none")]);
    assert!(
        lookups_none >= 4.0,
        "each review looked at least once: {lookups_none}"
    );
    assert_eq!(
        m.value("sendledger_lookups_total", &[("outcome", "one")]),
        0.0
    );
    let tasks = |state| m.value("sendledger_tasks", &[("state", state)]);
    assert_eq!(tasks("succeeded"), 3.0);
    assert_eq!(tasks("manual_review"), 4.0);
    assert_eq!(tasks("unknown") + tasks("sending") + tasks("failed"), 0.0);
    assert_eq!(m.value("sendledger_unknowns_open", &[]), 0.0);
    assert_eq!(m.value("sendledger_unknown_oldest_age_seconds", &[]), 0.0);
    assert_eq!(m.types["sendledger_attempts_total"], "counter");
    assert_eq!(m.types["sendledger_tasks"], "gauge");
    assert!(m.histogram_count("sendledger_journal_fsync_seconds") > 0.0);
    let batches = m.histogram_count("sendledger_journal_batch_appends");
    // Every batch holds at least one append: the sum of sizes is at least the count.
    assert!(m.value("sendledger_journal_batch_appends_sum", &[]) >= batches);

    // Health and a task's timeline.
    let health = get_json(&addr, "/healthz").await;
    assert_eq!(health["ok"], true);
    assert!(health["last_lsn"].as_u64().unwrap() > 0);
    assert!(health["live_tasks"].is_u64() && health["waiting"] == 0);
    let ok1 = get_json(&addr, &format!("/tasks/{}", task_id("ok-1"))).await;
    assert_eq!(ok1["state"], "succeeded");
    assert_eq!(ok1["attempts"], 1);
    let record = &sim.records_with_identity("ok-1")[0];
    assert_eq!(ok1["remote_id"], record.id.as_str());
    assert_eq!(
        ok1["lookup_url"],
        format!("{}/records?reference={}", sim.base_url(), task_id("ok-1"))
    );
    let names: Vec<&str> = ok1["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "TaskAccepted",
            "SendIntended",
            "Confirmed",
            "DuplicateDelivery"
        ]
    );
    assert_eq!(
        (ok1["more"].clone(), ok1["next_after"].clone()),
        (json!(false), Value::Null)
    );
    // The timeline in pages: the state is the whole task's, the events a page of them.
    let page = |query: &str| format!("/tasks/{}?{query}", task_id("ok-1"));
    let first = get_json(&addr, &page("limit=3")).await;
    assert_eq!(first["state"], "succeeded");
    assert_eq!(first["events"].as_array().unwrap().len(), 3);
    assert_eq!(
        (first["more"].clone(), first["next_after"].clone()),
        (json!(true), json!(2))
    );
    let rest = get_json(&addr, &page("after=2&limit=3")).await;
    let rest_names: Vec<&Value> = rest["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["event"])
        .collect();
    assert_eq!(rest_names, ["DuplicateDelivery"]);
    assert_eq!(
        (rest["more"].clone(), rest["next_after"].clone()),
        (json!(false), Value::Null)
    );
    assert_eq!(rest["remote_id"], record.id.as_str());
    for (query, field) in [
        ("limit=0", "`limit`"),
        ("after=x", "`after`"),
        ("page=2", "`page`"),
    ] {
        let (status, body) = http(&addr, "GET", &page(query), None, None).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(field), "{query}: {body}");
    }
    let (status, body) = http(&addr, "GET", "/tasks/acme%2Fnope%2Fx", None, None).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(&addr, "GET", "/tasks/not-a-task", None, None).await;
    assert_eq!(status, 400, "{body}");

    // The review list: the four tasks, each with its reason.
    let reviews = get_json(&addr, "/reviews").await;
    let listed: BTreeMap<String, &Value> = reviews
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["identity"]["request_key"].as_str().unwrap().to_string(),
                r,
            )
        })
        .collect();
    assert_eq!(
        listed.keys().collect::<Vec<_>>(),
        ["rv-1", "rv-2", "rv-3", "rv-4"]
    );
    let rv1 = listed["rv-1"];
    assert_eq!(rv1["task_id"], task_id("rv-1").to_string());
    assert!(
        rv1["review_reason"]["DeadlinePassed"].is_object(),
        "{rv1:#}"
    );
    assert!(
        rv1["reason"].as_str().unwrap().contains("deadline"),
        "{rv1:#}"
    );
    assert_eq!(rv1["evidence"]["attempts"], 1);

    // Mutations need the token.
    let succeeded = json!({ "as": "succeeded", "remote_id": "rec-manual-1", "by": "ana", "reason": "found it in their dashboard" });
    let rv1_ref = task_ref("rv-1");
    let (status, err) = resolve(&addr, &rv1_ref, None, succeeded.clone()).await;
    assert_eq!(status, 401, "{err}");
    let (status, err) = resolve(&addr, &rv1_ref, Some("wrong"), succeeded.clone()).await;
    assert_eq!(status, 401, "{err}");
    assert!(
        err["error"].as_str().unwrap().contains("admin.token"),
        "{err}"
    );
    // A bad body names the field.
    let (status, err) = resolve(
        &addr,
        &rv1_ref,
        Some(TOKEN),
        json!({ "as": "succeeded", "by": "ana", "reason": "x" }),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        err["error"].as_str().unwrap().contains("remote_id"),
        "{err}"
    );
    let (status, err) = resolve(
        &addr,
        &rv1_ref,
        Some(TOKEN),
        json!({ "as": "failed", "reason": "x" }),
    )
    .await;
    assert_eq!(status, 400);
    assert!(err["error"].as_str().unwrap().contains("`by`"), "{err}");
    let (status, err) = resolve(&addr, &task_ref("nope"), Some(TOKEN), succeeded.clone()).await;
    assert_eq!(status, 404, "{err}");
    // Resolved as succeeded: the operator's evidence is recorded.
    let (status, answer) = resolve(&addr, &rv1_ref, Some(TOKEN), succeeded.clone()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["state"], "succeeded");
    assert_eq!(answer["recorded"], json!(["Confirmed"]));
    let rv1 = get_json(&addr, &format!("/tasks/{rv1_ref}")).await;
    assert_eq!(rv1["state"], "succeeded");
    assert_eq!(rv1["remote_id"], "rec-manual-1");
    let confirmed = rv1["events"].as_array().unwrap().last().unwrap();
    assert_eq!(confirmed["event"], "Confirmed");
    assert!(
        confirmed["detail"].as_str().unwrap().contains("ana"),
        "{confirmed}"
    );
    // Not in review any more.
    let (status, err) = resolve(&addr, &rv1_ref, Some(TOKEN), succeeded).await;
    assert_eq!(status, 409, "{err}");
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .contains("not in manual review"),
        "{err}"
    );

    // A resend through the running service: one new attempt, one record at the remote.
    let (status, answer) = resolve(
        &addr,
        &task_ref("rv-4"),
        Some(TOKEN),
        json!({ "resend": true, "by": "ana", "reason": "no record at the remote" }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["recorded"], json!(["ResendAuthorized"]));
    let rv4 = wait_state(&addr, "rv-4", "succeeded").await;
    assert_eq!(rv4["attempts"], 2);
    assert_eq!(sim.records_with_identity("rv-4").len(), 1);

    // The command against the running service: list, and resolve as failed with the token
    // from the environment; a stopped-ledger command is refused while the service runs.
    let url = format!("http://{addr}");
    let (ok, out, err) = cli(&["review", "list", "--admin", &url], &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("2 task(s) in manual review") && out.contains("rv-2") && out.contains("rv-3"),
        "{out}"
    );
    let rv3 = "acme/payment.create/rv-3";
    let resolve_rv3 = [
        "review",
        "resolve",
        rv3,
        "--admin",
        &url,
        "--as",
        "failed",
        "--by",
        "bo",
        "--reason",
        "customer cancelled",
    ];
    let (ok, _, err) = cli(&resolve_rv3, &[]);
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, out, err) = cli(&resolve_rv3, &[("SENDLEDGER_ADMIN_TOKEN", TOKEN)]);
    assert!(ok, "{err}");
    assert!(out.contains("\"failed\""), "{out}");
    let data = dir.path().to_str().unwrap();
    let (ok, _, err) = cli(&["review", "list", "--data", data], &[]);
    assert!(!ok);
    assert!(
        err.contains("in use by a running service; use --admin URL"),
        "{err}"
    );

    // Metrics after the resolutions: the resend's attempt, and the gauges still consistent
    // with the ledger (they are cached for a few seconds).
    tokio::time::sleep(sendledger_node::admin::LEDGER_GAUGES_TTL).await;
    let m = Scrape::take(&addr).await;
    assert_eq!(
        m.value("sendledger_attempts_total", &[("class", "succeeded")]),
        4.0
    );
    assert_eq!(m.value("sendledger_tasks", &[("state", "succeeded")]), 5.0);
    assert_eq!(m.value("sendledger_tasks", &[("state", "failed")]), 1.0);
    assert_eq!(
        m.value("sendledger_tasks", &[("state", "manual_review")]),
        1.0
    );
    tokio::task::block_in_place(|| service.stop());

    // The service is stopped: review rv-2 on the ledger itself.
    let (ok, out, err) = cli(&["review", "list", "--data", data, "--json"], &[]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["task_id"], task_id("rv-2").to_string());
    let rv2 = task_id("rv-2").to_string();
    let resend = [
        "review",
        "resolve",
        &rv2,
        "--data",
        data,
        "--resend",
        "--by",
        "cy",
        "--reason",
        "checked: no record",
    ];
    let (ok, out, err) = cli(&resend, &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("ResendAuthorized") && err.contains("when it next starts"),
        "{out}\n{err}"
    );
    let (ok, _, err) = cli(&resend, &[]);
    assert!(!ok, "a second resend is refused");
    assert!(err.contains("not in manual review"), "{err}");
    assert_eq!(
        sim.records_with_identity("rv-2").len(),
        0,
        "nothing sent while stopped"
    );
    let posts_before = sim.stats().posts;

    // The next start performs the authorized attempt, exactly once.
    let engine = tokio::task::block_in_place(|| start(dir.path(), target_config));
    let state = wait_for(&engine, task_id("rv-2"), WAIT, settled).await;
    assert_eq!(state.phase, Phase::Succeeded);
    assert_eq!(state.attempts, 2);
    assert_eq!(
        state
            .evidence
            .as_ref()
            .map(|e| matches!(e, Evidence::Response { .. })),
        Some(true)
    );
    let records = sim.records_with_identity("rv-2");
    assert_eq!(records.len(), 1);
    assert_eq!(state.remote_id.as_deref(), Some(records[0].id.as_str()));
    assert_eq!(sim.stats().posts, posts_before + 1);
    let events = engine.events(task_id("rv-2")).await.unwrap();
    let auth = events
        .iter()
        .position(|e| matches!(&e.body, EventBody::ResendAuthorized { by, .. } if by == "cy"))
        .expect("authorization recorded");
    assert!(matches!(
        events[auth + 1].body,
        EventBody::SendIntended { attempt: 2, .. }
    ));
    let report = sendledger_store::audit(engine.ledger(), Default::default(), |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// One request to the admin routes in process (`tower::ServiceExt::oneshot`): status,
/// headers and body.
async fn in_process(
    routes: &axum::Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, http::HeaderMap, String) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let mut request = http::Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let response = routes.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// The admin routes answered in process, with no socket (`tower::ServiceExt::oneshot`): a
/// task's timeline, health, the console's pages and headers, and every error as JSON with its
/// status (a bad reference, a bad page, a missing or wrong token, a bad body, a task not in
/// review, a method a route does not take, a route that does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_routes_answer_in_process() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start(dir.path(), target(&sim.base_url(), |_| {})));
    engine.submit(request("ip-1"), source(0)).await.unwrap();
    wait_for(&engine, task_id("ip-1"), WAIT, settled).await;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let config = sendledger_node::config::AdminConfig {
        token: Some("s3cret".into()),
        ..Default::default()
    };
    let routes = sendledger_node::admin::routes(&config, engine.clone(), handle).unwrap();
    let call = |method: &str, path: &str, token: Option<&str>, body: &str| {
        let (method, path, body) = (method.to_string(), path.to_string(), body.to_string());
        let token = token.map(str::to_string);
        let routes = routes.clone();
        async move { in_process(&routes, &method, &path, token.as_deref(), &body).await }
    };
    let error_of = |body: &str| -> String {
        let value: Value = serde_json::from_str(body).expect("a JSON error");
        value["error"]
            .as_str()
            .expect("an error message")
            .to_string()
    };

    let (status, _, body) = call("GET", &format!("/tasks/{}", task_ref("ip-1")), None, "").await;
    assert_eq!(status, 200, "{body}");
    let task: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(task["state"], "succeeded", "{task}");
    assert_eq!(task["task_id"], task_id("ip-1").to_string(), "{task}");
    let (status, _, body) = call("GET", "/healthz", None, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["token_configured"],
        true
    );

    let (status, headers, body) = call("GET", "/console", None, "").await;
    assert_eq!(status, 200);
    assert!(body.contains("/console/assets/queue.js"), "{body}");
    assert!(headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("script-src 'self'"));
    let (status, _, _) = call("GET", "/console/assets/nope.js", None, "").await;
    assert_eq!(status, 404);
    let (status, _, body) = call("GET", "/console/task/acme%2Fnope%2Fx", None, "").await;
    assert_eq!(status, 404);
    assert!(body.contains("No such task"), "{body}");

    let (status, _, body) = call("GET", "/tasks/not-a-task", None, "").await;
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = call("GET", "/tasks/acme%2Fnope%2Fx", None, "").await;
    assert_eq!(status, 404, "{body}");
    assert!(error_of(&body).contains("not in the ledger"), "{body}");
    let page = format!("/tasks/{}?limit=0", task_ref("ip-1"));
    let (status, _, body) = call("GET", &page, None, "").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("`limit`"), "{body}");

    let review = format!("/reviews/{}", task_ref("ip-1"));
    let failed = r#"{"as": "failed", "by": "op", "reason": "test"}"#;
    let (status, _, body) = call("POST", &review, None, failed).await;
    assert_eq!(status, 401, "{body}");
    assert!(error_of(&body).contains("missing"), "{body}");
    let (status, _, body) = call("POST", &review, Some("wrong"), failed).await;
    assert_eq!(status, 401, "{body}");
    assert!(error_of(&body).contains("wrong admin token"), "{body}");
    let (status, _, body) = call("POST", &review, Some("s3cret"), "{\"as\": 1}").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).starts_with("bad body"), "{body}");
    let (status, _, body) = call("POST", &review, Some("s3cret"), failed).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        engine.state(task_id("ip-1")).await.unwrap().phase,
        Phase::Succeeded
    );

    let (status, _, body) = call("DELETE", "/metrics", None, "").await;
    assert_eq!(status, 405, "{body}");
    assert_eq!(error_of(&body), "DELETE is not allowed on /metrics");
    let (status, _, body) = call("POST", "/console/dashboard", None, "").await;
    assert_eq!(status, 405, "{body}");
    assert!(error_of(&body).contains("read with GET"), "{body}");
    let (status, _, body) = call("GET", "/nothing", None, "").await;
    assert_eq!(status, 404, "{body}");
    assert!(error_of(&body).starts_with("no route /nothing"), "{body}");
    engine.shutdown(Duration::from_secs(5)).await;
}

/// A target whose breaker is open shows in `/healthz`, and a task waiting for it says why in
/// `GET /tasks/{id}` (and records one `SendDeferred`, no intent); once the remote is back the
/// breaker closes and every task succeeds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_shows_in_health_and_waiting_tasks_say_why() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.set_offline(true).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = target(&sim.base_url(), |t| {
        t["breaker"] = json!({ "window_calls": 2, "minimum_calls": 2, "open_for": "2s" });
    });
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    let keys = ["br-1", "br-2", "br-3"];
    for (i, key) in keys.iter().enumerate() {
        engine.submit(request(key), source(i as i64)).await.unwrap();
    }
    let waiting = wait_for(&engine, task_id("br-3"), WAIT, |s| s.waiting.is_some()).await;
    assert_eq!(waiting.attempts, 0, "a task that waits spent no attempt");
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let routes =
        sendledger_node::admin::routes(&Default::default(), engine.clone(), handle).unwrap();
    let get = |path: String| {
        let routes = routes.clone();
        async move {
            let (status, _, body) = in_process(&routes, "GET", &path, None, "").await;
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<Value>(&body).unwrap()
        }
    };
    let health = get("/healthz".into()).await;
    assert_eq!(
        health["ok"], true,
        "a remote that is down is not the service failing"
    );
    let breaker = &health["targets"]["sim"];
    assert!(
        ["open", "half_open"].contains(&breaker["breaker"].as_str().unwrap()),
        "{health}"
    );
    assert!(breaker["opened"].as_u64().unwrap() >= 1, "{health}");
    let task = get(format!("/tasks/{}", task_ref("br-3"))).await;
    let reason = task["waiting"]["reason"].as_str().unwrap();
    assert_eq!(
        reason, "the circuit breaker of target sim is open",
        "{task}"
    );
    assert!(task["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["event"] == "SendDeferred"));

    sim.set_offline(false).await.unwrap();
    for key in keys {
        let state = wait_for(&engine, task_id(key), WAIT, settled).await;
        assert_eq!(state.phase, Phase::Succeeded, "{key}");
        assert_eq!(state.waiting, None);
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    let health = get("/healthz".into()).await;
    assert_eq!(health["targets"]["sim"]["breaker"], "closed", "{health}");
    engine.shutdown(Duration::from_secs(5)).await;
}

/// With no token configured, mutations are refused with a message that says what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_mutations_are_refused() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start(dir.path(), target(&sim.base_url(), |_| {})));
    // A handle of a recorder that is not installed: this process's metrics are not asserted.
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let config = sendledger_node::config::AdminConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        ..Default::default()
    };
    let admin = sendledger_node::admin::Admin::start(&config, engine.clone(), handle)
        .await
        .unwrap();
    let addr = admin.local_addr().to_string();
    assert!(admin.local_addr().ip().is_loopback());
    let (status, body) = resolve(
        &addr,
        &task_ref("x"),
        Some("anything"),
        json!({ "as": "failed", "by": "a", "reason": "b" }),
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("configure operators ([admin.operators.NAME]) or `admin.token`"),
        "{body}"
    );
    let (status, _) = http(&addr, "DELETE", "/reviews", None, None).await;
    assert_eq!(status, 405);
    let (status, _) = http(&addr, "GET", "/nothing", None, None).await;
    assert_eq!(status, 404);
    // The scrape works without an installed recorder too (the ledger gauges go nowhere).
    let (status, _) = http(&addr, "GET", "/metrics", None, None).await;
    assert_eq!(status, 200);
    admin.shutdown().await;
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Waits until the server closes `stream` (end of stream or reset), or panics after `within`.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => continue,
            Err(_) => panic!("connection still open after {within:?}"),
        }
    }
}

/// The first line of the answer to `request`, sent on a fresh connection that stays open.
async fn status_line(addr: &str, request: &str) -> (tokio::net::TcpStream, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering {request:?}");
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    (stream, head.lines().next().unwrap().to_string())
}

/// More connections than `admin.max_connections`: the extra one is closed at once while the
/// others stay open; idle connections (new, or kept alive after an answer) and a half-sent
/// request head are closed after their timeouts; then requests are served again, and a
/// lowercase `bearer` scheme is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_capped_and_stalled_ones_closed() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| start(dir.path(), target(&sim.base_url(), |_| {})));
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let config = sendledger_node::config::AdminConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        token: Some(TOKEN.into()),
        idle_timeout: Duration::from_secs(2),
        header_read_timeout: Duration::from_millis(500),
        max_connections: 3,
        ..Default::default()
    };
    let admin = sendledger_node::admin::Admin::start(&config, engine.clone(), handle)
        .await
        .unwrap();
    let addr = admin.local_addr().to_string();
    let connect = || tokio::net::TcpStream::connect(addr.clone());

    let mut idle_a = connect().await.unwrap();
    let mut idle_b = connect().await.unwrap();
    let mut half = connect().await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut over = connect().await.unwrap();
    closed_within(&mut over, Duration::from_secs(1)).await;
    let mut probe = [0u8; 1];
    assert!(
        matches!(idle_a.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the connections within the limit stay open"
    );
    closed_within(&mut half, Duration::from_secs(5)).await;
    closed_within(&mut idle_a, Duration::from_secs(5)).await;
    closed_within(&mut idle_b, Duration::from_secs(5)).await;

    // A kept-alive connection, idle after its answer, is closed too.
    let (mut kept, status) = status_line(&addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    closed_within(&mut kept, Duration::from_secs(5)).await;

    // Served again; the token's scheme in any case.
    assert_eq!(get_json(&addr, "/healthz").await["ok"], true);
    let post = |auth: &str| {
        format!(
            "POST /reviews/{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
            task_ref("nope")
        )
    };
    let (_, lower) = status_line(&addr, &post(&format!("bearer {TOKEN}"))).await;
    assert_eq!(
        lower, "HTTP/1.1 400 Bad Request",
        "authorized, then the body is refused"
    );
    let (_, wrong) = status_line(&addr, &post("Bearer wrong")).await;
    assert_eq!(wrong, "HTTP/1.1 401 Unauthorized");
    admin.shutdown().await;
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Through Kafka: requests consumed from the topic, their results published, and the consumer
/// lag of every partition (from librdkafka's statistics) down to zero once all is consumed;
/// then a restart that gets every message again drops each one by its processed offset.
/// Everything scraped from the service's endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_metrics_count_published_results_and_report_lag() {
    const N: usize = 30;
    let kafka = tokio::task::block_in_place(|| {
        Kafka::connect(KafkaConfig {
            brokers: "embedded".into(),
            partitions: 3,
            ..KafkaConfig::default()
        })
        .expect("embedded cluster")
    });
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target_json = serde_json::to_string(&target(&sim.base_url(), |_| {})).unwrap();
    let service = tokio::task::block_in_place(|| {
        AdminChild::start(
            crate::ADMIN_CHILD,
            dir.path(),
            &target_json,
            Some(kafka.bootstrap_servers()),
            TOKEN,
        )
    });
    let producer: FutureProducer = kafka.client_config(Role::Producer).create().unwrap();
    let topic = kafka.config().requests_topic.clone();
    for i in 0..N {
        let key = format!("kf-{i}");
        let value = serde_json::to_vec(&request(&key)).unwrap();
        let identity = format!("acme/payment.create/{key}");
        producer
            .send(
                FutureRecord::to(&topic).key(&identity).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("request produced");
    }

    let lag = |m: &Scrape, p: &str| {
        let labels = [("topic", topic.as_str()), ("partition", p)];
        m.get("sendledger_consumer_lag_messages", &labels)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let m = loop {
        let m = Scrape::take(&service.addr).await;
        let published = m.value("sendledger_results_published_total", &[]);
        if published >= N as f64 && ["0", "1", "2"].iter().all(|p| lag(&m, p) == Some(0.0)) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "published {published} of {N}, lags {:?}",
            ["0", "1", "2"].map(|p| lag(&m, p))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(m.types["sendledger_consumer_lag_messages"], "gauge");
    assert_eq!(m.value("sendledger_results_published_total", &[]), N as f64);
    assert_eq!(
        m.value("sendledger_attempts_total", &[("class", "succeeded")]),
        N as f64
    );
    assert_eq!(
        m.value("sendledger_duplicates_dropped_total", &[("by", "offset")]),
        0.0
    );
    assert_eq!(sim.records().len(), N);
    tokio::task::block_in_place(|| service.stop());

    // A second service on the ledger, in a new consumer group: every request comes again from
    // the start of the topic, and every one is dropped by the ledger's processed offsets.
    let service = tokio::task::block_in_place(|| {
        AdminChild::start(
            crate::ADMIN_CHILD,
            dir.path(),
            &target_json,
            Some(kafka.bootstrap_servers()),
            TOKEN,
        )
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let m = loop {
        let m = Scrape::take(&service.addr).await;
        let dropped = m.value("sendledger_duplicates_dropped_total", &[("by", "offset")]);
        if dropped >= N as f64 && ["0", "1", "2"].iter().all(|p| lag(&m, p) == Some(0.0)) {
            break m;
        }
        assert!(Instant::now() < deadline, "dropped {dropped} of {N}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        m.value("sendledger_duplicates_dropped_total", &[("by", "offset")]),
        N as f64
    );
    assert_eq!(m.value("sendledger_results_published_total", &[]), 0.0);
    assert_eq!(
        m.value("sendledger_attempts_total", &[("class", "succeeded")]),
        0.0
    );
    assert_eq!(
        m.value("sendledger_tasks", &[("state", "succeeded")]),
        N as f64
    );
    assert_eq!(sim.records().len(), N);
    tokio::task::block_in_place(|| service.stop());
}

/// A ledger with `buffered` durability is never silent: `/healthz` says so with a warning
/// (and stays 200: the service works, it is only not crash-proof); `sync` says `sync`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_durability_shows_in_health() {
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let config = sendledger_node::config::AdminConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        ..Default::default()
    };
    for (durability, name) in [
        (sendledger_store::Durability::Buffered, "buffered"),
        (sendledger_store::Durability::Sync, "sync"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut engine_config = sendledger_actors::EngineConfig::new(dir.path());
        engine_config.durability = durability;
        let remote = std::sync::Arc::new(sendledger_node::wiring::HttpRemote::new(
            sendledger_tests::engine::targets(target(&sim.base_url(), |_| {})),
        ));
        let engine =
            tokio::task::block_in_place(|| sendledger_actors::Engine::start(engine_config, remote))
                .unwrap();
        let admin = sendledger_node::admin::Admin::start(&config, engine.clone(), handle.clone())
            .await
            .unwrap();
        let health = get_json(&admin.local_addr().to_string(), "/healthz").await;
        assert_eq!(health["ok"], true, "{health}");
        assert_eq!(health["durability"], name, "{health}");
        assert_eq!(
            health["warning"]
                .as_str()
                .is_some_and(|w| w.contains("not fsynced")),
            name == "buffered",
            "{health}"
        );
        admin.shutdown().await;
        engine.shutdown(Duration::from_secs(5)).await;
    }
}
