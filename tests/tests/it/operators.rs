//! Named operators of the admin endpoint (`[admin.operators]`), through `sendledger run` on an
//! embedded cluster and a simulated remote answering 500, so requests of two tenants end in
//! manual review: who may read, who may resolve what, `by` taken from the credential, the
//! decision recorded under the credential's id; `sendledger audit --operators` over the
//! result; and the console signed in as an operator of one tenant.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sendledger_core::TaskId;
use sendledger_kafka::Kafka;
use sendledger_node::config::Config;
use sendledger_node::credentials::token_credential_id;
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::browser::Browser;
use sendledger_tests::http::{request as http, resolve};
use sendledger_tests::kafka::{config, produce, service_config};
use serde_json::{json, Value};
use sha2::Digest;

const ANA: &str = "ana-token-0123456789abcdef0123456789abcdef";
const BO: &str = "bo-token-0123456789abcdef0123456789abcdef0";
const ROOT: &str = "root-token-0123456789abcdef0123456789abcdef";
const READER: &str = "reader-token-0123456789abcdef0123456789abc";

/// The operators: ana resolves acme's reviews, bo (configured by the hash of his token)
/// globex's, root does everything, reader only reads.
fn operators_toml() -> String {
    let bo_hash: String = (sha2::Sha256::digest(BO.as_bytes()).iter())
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        r#"
[admin.operators.ana]
roles = ["resolve"]
tenants = ["acme"]
tokens_env = ["ANA_TOKEN"]

[admin.operators.bo]
roles = ["resolve", "retry", "compensate"]
tenants = ["globex"]
token_sha256 = ["{bo_hash}"]

[admin.operators.root]
roles = ["admin"]
tokens_env = ["ROOT_TOKEN"]

[admin.operators.reader]
roles = ["read"]
tokens_env = ["READER_TOKEN"]
"#
    )
}

fn env() -> Vec<(&'static str, String)> {
    vec![
        ("ANA_TOKEN", ANA.to_string()),
        ("ROOT_TOKEN", ROOT.to_string()),
        ("READER_TOKEN", READER.to_string()),
    ]
}

/// A running `sendledger run` whose reads need a credential, with tasks of acme and globex in
/// review.
struct Setup {
    run: std::process::Child,
    admin: String,
    config_file: PathBuf,
    dir: tempfile::TempDir,
    sim: Sim,
    _kafka: Kafka,
}

fn id(tenant: &str, key: &str) -> String {
    TaskId::derive(tenant, "payment.create", key).to_string()
}

impl Setup {
    async fn start(keys: &[(&str, &str)]) -> Setup {
        let kafka = tokio::task::block_in_place(|| Kafka::connect(config("embedded"))).unwrap();
        let brokers = kafka.bootstrap_servers().to_string();
        let sim = Sim::start(SimConfig::default()).await.unwrap();
        sim.set_faults(Faults {
            error: 1.0,
            ..Faults::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut service: Config =
            toml::from_str(&service_config(dir.path(), &brokers, &sim)).unwrap();
        service.admin.enabled = true;
        service.admin.listen = "127.0.0.1:0".parse().unwrap();
        service.admin.reads_need_credential = Some(true);
        service.targets.insert(
            "sim".into(),
            sendledger_tests::engine::target(&sim.base_url(), |t| {
                t["lookup"]["deadline"] = "400ms".into()
            }),
        );
        let config_file = dir.path().join("sendledger.toml");
        let text = toml::to_string(&service).unwrap() + &operators_toml();
        std::fs::write(&config_file, text).unwrap();
        let (run, ready) = tokio::task::block_in_place(|| crate::start_run(&config_file, &env()));
        let admin = sendledger_tests::ready_field(&ready, "admin=http://");
        let messages = (keys.iter())
            .map(|(tenant, key)| {
                let mut r = sendledger_tests::engine::request(key);
                r.tenant = tenant.to_string();
                let value = serde_json::to_vec(&r).unwrap();
                (None, format!("{tenant}/payment.create/{key}"), Some(value))
            })
            .collect();
        produce(&kafka, messages).await;
        let setup = Setup {
            run,
            admin,
            config_file,
            dir,
            sim,
            _kafka: kafka,
        };
        for (tenant, key) in keys {
            setup.wait_state(&id(tenant, key), "manual_review").await;
        }
        setup.sim.set_faults(Faults::default()).unwrap();
        setup
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let (status, body) = http(&self.admin, "GET", path, token, None).await;
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    async fn wait_state(&self, task: &str, phase: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self.get(&format!("/tasks/{task}"), Some(ROOT)).await;
            if status == 200 && body["state"] == phase {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{task} never {phase}: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The task's events, read as root.
    async fn events(&self, task: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/tasks/{task}"), Some(ROOT)).await;
        assert_eq!(status, 200, "{body}");
        body["events"].as_array().unwrap().clone()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Stops the service (SIGTERM) and waits for a clean exit.
    async fn stop(mut self) -> (tempfile::TempDir, PathBuf) {
        tokio::task::block_in_place(|| sendledger_tests::process::stop_run(&mut self.run));
        (self.dir, self.config_file)
    }
}

/// The task ids a `GET /reviews` answer lists.
fn listed(reviews: &Value) -> Vec<String> {
    let mut ids: Vec<String> = (reviews.as_array().unwrap().iter())
        .map(|r| r["task_id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// Reads need a credential; each operator sees their tenants' tasks only and acts within
/// their roles; `by` is the credential's operator and cannot be forged; the decision is
/// recorded under the credential's id; a refused call records nothing. Then `sendledger
/// audit --operators` finds the decisions clean, and reports them once the credential is
/// revoked before them, or unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operators_see_and_resolve_their_tenants_reviews_under_their_own_name() {
    let setup = Setup::start(&[("acme", "op-a1"), ("acme", "op-a2"), ("globex", "op-g1")]).await;
    let (a1, a2, g1) = (
        id("acme", "op-a1"),
        id("acme", "op-a2"),
        id("globex", "op-g1"),
    );

    // Who may read what.
    for path in [
        "/reviews",
        "/tasks?phase=manual_review",
        &format!("/tasks/{a1}"),
    ] {
        let (status, body) = setup.get(path, None).await;
        assert_eq!(status, 401, "{path}: {body}");
        let (status, body) = setup.get(path, Some("not-a-token")).await;
        assert_eq!(status, 401, "{path}: {body}");
    }
    let (_, reviews) = setup.get("/reviews", Some(ANA)).await;
    assert_eq!(listed(&reviews), sorted([&a1, &a2]));
    let (_, reviews) = setup.get("/reviews", Some(BO)).await;
    assert_eq!(listed(&reviews), vec![g1.clone()]);
    let (_, reviews) = setup.get("/reviews", Some(READER)).await;
    assert_eq!(listed(&reviews), sorted([&a1, &a2, &g1]));
    let (_, page) = setup.get("/tasks?phase=manual_review", Some(ANA)).await;
    let ids: Vec<&str> = (page["tasks"].as_array().unwrap().iter())
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{page}");
    assert!(!ids.contains(&g1.as_str()), "{page}");
    let (status, body) = setup.get(&format!("/tasks/{g1}"), Some(ANA)).await;
    assert_eq!(
        status, 404,
        "another tenant's task is not there for ana: {body}"
    );
    let (status, _) = setup.get(&format!("/tasks/{g1}"), Some(BO)).await;
    assert_eq!(status, 200);
    let (status, body) = http(&setup.admin, "GET", "/metrics", Some(ANA), None).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = http(&setup.admin, "GET", "/metrics", Some(READER), None).await;
    assert_eq!(status, 200, "{body}");
    let (_, who) = setup.get("/whoami", Some(ANA)).await;
    assert_eq!(
        who,
        json!({ "operator": "ana", "credential": token_credential_id(ANA), "roles": ["resolve"], "tenants": ["acme"] })
    );

    // Refused, each with nothing recorded.
    let failed = |by: &str| json!({ "as": "failed", "by": by, "reason": "checked the remote" });
    let before = (setup.events(&a1).await.len(), setup.events(&g1).await.len());
    for (task, token, body, status) in [
        (
            &g1,
            Some(ANA),
            json!({ "as": "failed", "reason": "not hers" }),
            404,
        ),
        (&a1, Some(ANA), failed("root"), 403),
        (&a1, Some(READER), failed("reader"), 403),
        (&a1, None, failed("ana"), 401),
        (&a1, Some(BO), failed("bo"), 404),
    ] {
        let (got, answer) = resolve(&setup.admin, task, token, body.clone()).await;
        assert_eq!(got, status, "{body} with {token:?}: {answer}");
    }
    let (got, answer) = resolve(&setup.admin, &a1, Some(ANA), failed("root")).await;
    assert!(
        answer["error"].as_str().unwrap().contains("is ana's"),
        "{got} {answer}"
    );
    let after = (setup.events(&a1).await.len(), setup.events(&g1).await.len());
    assert_eq!(before, after, "nothing recorded by a refused call");

    // Resolved by ana, who names no one: the ledger says ana, under her credential.
    let body = json!({ "as": "failed", "reason": "the customer cancelled" });
    let (status, answer) = resolve(&setup.admin, &a1, Some(ANA), body).await;
    assert_eq!(status, 200, "{answer}");
    let events = setup.events(&a1).await;
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let at = names
        .iter()
        .position(|n| *n == "OperatorCredential")
        .unwrap();
    assert_eq!(
        names[at..],
        ["OperatorCredential", "OperatorNote", "Failed"]
    );
    assert_eq!(
        events[at]["data"],
        json!({ "operator": "ana", "credential": token_credential_id(ANA) })
    );
    assert_eq!(events[at + 1]["data"]["who"], "ana");
    // bo resolves globex's; root, acme's other one, naming himself.
    let body = json!({ "as": "succeeded", "remote_id": "rec-9", "reason": "found by hand" });
    assert_eq!(resolve(&setup.admin, &g1, Some(BO), body).await.0, 200);
    assert_eq!(
        resolve(&setup.admin, &a2, Some(ROOT), failed("root"))
            .await
            .0,
        200
    );
    assert!(setup.sim.records().is_empty(), "nothing was sent");

    // The audit checks every decision against the operators configured.
    let (dir, config_file) = setup.stop().await;
    let audit = |config_file: &Path| {
        let mut audit = crate::sendledger();
        audit
            .args(["audit", "--json", "--data"])
            .arg(dir.path().join("ledger"))
            .arg("--operators")
            .arg(config_file)
            .envs(env());
        let out = audit.output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        (out.status.success(), report)
    };
    let (clean, report) = audit(&config_file);
    assert!(clean, "{report}");
    assert_eq!(report["operator_decisions"], 3, "{report}");
    assert_eq!(report["decisions_without_credential"], 0, "{report}");
    // Ana's token revoked an hour ago: her decision came after it.
    let text = std::fs::read_to_string(&config_file).unwrap();
    let ana_revoked = text.replace(
        "tokens_env = [\"ANA_TOKEN\"]",
        &format!(
            "token_sha256 = [\"{}\"]\nrevoked = {{ \"{}\" = \"{}\" }}",
            "ab".repeat(32),
            token_credential_id(ANA),
            humantime::format_rfc3339(std::time::SystemTime::now() - Duration::from_secs(3600))
        ),
    );
    let revoked_file = dir.path().join("revoked.toml");
    std::fs::write(&revoked_file, ana_revoked).unwrap();
    let (clean, report) = audit(&revoked_file);
    assert!(!clean);
    let rules: Vec<&str> = (report["violations"].as_array().unwrap().iter())
        .map(|v| v["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["operator-revoked"], "{report}");
    // Bo no longer configured at all: his decision's credential is unknown.
    let start = text.find("[admin.operators.bo]").unwrap();
    let end = text.find("[admin.operators.root]").unwrap();
    let without_bo = format!("{}{}", &text[..start], &text[end..]);
    let unknown_file = dir.path().join("unknown.toml");
    std::fs::write(&unknown_file, without_bo).unwrap();
    let (clean, report) = audit(&unknown_file);
    assert!(!clean);
    assert_eq!(
        report["violations"][0]["rule"], "operator-unknown",
        "{report}"
    );
    assert_eq!(report["violations"][0]["task_id"], g1.as_str(), "{report}");
}

fn sorted<'a>(ids: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut ids: Vec<String> = ids.into_iter().cloned().collect();
    ids.sort();
    ids
}

/// In the console, signed in as ana (acme only): the queue lists acme's reviews only, a
/// globex task's page cannot be read, and her resolution of an acme task is recorded under
/// her name without her typing it. Before signing in, nothing is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_shows_a_scoped_operator_their_tenants_reviews_only() {
    let setup = Setup::start(&[("acme", "cn-a1"), ("globex", "cn-g1")]).await;
    let (a1, g1) = (id("acme", "cn-a1"), id("globex", "cn-g1"));
    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url("/console"));
        let status = browser.wait_for(
            "document.querySelector('#queue-status').textContent.startsWith('Cannot') && document.querySelector('#queue-status').textContent",
        );
        assert!(status.as_str().unwrap().contains("(401)"), "{status}");
        assert_eq!(
            browser.text("#mode"),
            json!("sign in to read and to change")
        );
        let who = crate::console::sign_in(&mut browser, ANA);
        assert_eq!(who, "ana (resolve · tenants acme)");
        browser.wait_for("document.querySelectorAll('#queue tbody tr').length === 1");
        let rows = browser
            .eval("[...document.querySelectorAll('#queue tbody tr')].map(r => r.dataset.task)");
        assert_eq!(rows, json!([a1]));

        browser.goto(&setup.url(&format!("/console/task/{g1}")));
        let error = browser.wait_for("document.querySelector('#page-error') && document.querySelector('#page-error').textContent");
        assert!(error.as_str().unwrap().contains("(404)"), "{error}");

        browser.goto(&setup.url(&format!("/console/task/{a1}")));
        browser.wait_for("document.querySelector('#resolve-form')");
        assert_eq!(browser.eval("document.querySelector('#by')"), Value::Null);
        assert_eq!(
            browser.text("#by-operator"),
            json!("Recorded as decided by ana.")
        );
        browser.click("#as-failed");
        browser.fill("#reason", "the customer cancelled");
        browser.click("#review");
        let says = browser.wait_for("document.querySelector('#preview-says').textContent");
        assert!(says.as_str().unwrap().contains("by operator ana"), "{says}");
        browser.click("#send");
        browser.wait_for("document.querySelector('#task-state').textContent === 'failed'");
    });
    let events = setup.events(&a1).await;
    let credential = (events.iter())
        .find(|e| e["event"] == "OperatorCredential")
        .expect("recorded under her credential");
    assert_eq!(credential["data"]["operator"], "ana");
    let note = events
        .iter()
        .find(|e| e["event"] == "OperatorNote")
        .unwrap();
    assert_eq!(note["data"]["who"], "ana");
    let (_, g) = setup.get(&format!("/tasks/{g1}"), Some(ROOT)).await;
    assert_eq!(
        g["state"], "manual_review",
        "the other tenant's task is untouched"
    );
    drop(browser);
    setup.stop().await;
}
