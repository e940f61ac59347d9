//! The review console in a real browser: a headless Chromium (DevTools protocol) against a
//! running service (the admin tests' `admin_child`) that consumes an embedded Kafka cluster
//! and sends to a simulated remote answering 500, so the requests end in manual review.
//!
//! `console_screenshots` (ignored; `scripts/screenshots` runs it) saves the pages shown in the
//! README and `docs/operating/review.md` under `docs/console/`.

use std::time::Duration;

use sendledger_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_kafka::{Kafka, KafkaConfig, Role};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::browser::Browser;
use sendledger_tests::engine::*;
use serde_json::{json, Value};

use sendledger_tests::http::{get_json, request as http, resolve, TOKEN};

use sendledger_tests::process::AdminChild;

/// A payload that would run script if the console inserted it as HTML.
const HOSTILE: &str = "<script>window.injected = 'payload script'</script><img src=x onerror=\"window.injected = 'payload img'\"><b id=\"injected\">bold</b>";

/// A service with tasks in manual review, requested through Kafka; the cluster and the
/// remote live as long as it does.
struct Setup {
    service: AdminChild,
    sim: Sim,
    kafka: Kafka,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Requests `keys` (with the payload `payload_of(key)`) through Kafka while the remote
    /// answers 500, and waits until each is in manual review; then the remote answers again.
    async fn with_reviews(keys: &[&str], payload_of: impl Fn(&str) -> Value) -> Setup {
        Setup::with_reviews_and_token(keys, payload_of, TOKEN).await
    }

    /// As [`Setup::with_reviews`], with the admin token `token` (`""`: none configured).
    async fn with_reviews_and_token(
        keys: &[&str],
        payload_of: impl Fn(&str) -> Value,
        token: &str,
    ) -> Setup {
        let setup = Setup::start(token, |t| t["lookup"]["deadline"] = "400ms".into()).await;
        setup
            .sim
            .set_faults(Faults {
                error: 1.0,
                ..Faults::default()
            })
            .unwrap();
        setup.produce(keys, payload_of).await;
        for key in keys {
            wait_state(&setup.service.addr, key, "manual_review").await;
        }
        setup.sim.set_faults(Faults::default()).unwrap();
        setup
    }

    /// A service on an embedded cluster with the admin token `token`, sending to a simulated
    /// remote through the target `tweak` adjusts.
    async fn start(token: &str, tweak: impl FnOnce(&mut Value)) -> Setup {
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
        let target_json = serde_json::to_string(&target(&sim.base_url(), tweak)).unwrap();
        let service = tokio::task::block_in_place(|| {
            AdminChild::start(
                crate::ADMIN_CHILD,
                dir.path(),
                &target_json,
                Some(kafka.bootstrap_servers()),
                token,
            )
        });
        Setup {
            service,
            sim,
            kafka,
            _dir: dir,
        }
    }

    /// Requests `keys` (with the payload `payload_of(key)`) through Kafka.
    async fn produce(&self, keys: &[&str], payload_of: impl Fn(&str) -> Value) {
        let producer: FutureProducer = self.kafka.client_config(Role::Producer).create().unwrap();
        let topic = self.kafka.config().requests_topic.clone();
        for key in keys {
            let mut req = request(key);
            req.payload = payload_of(key);
            let value = serde_json::to_vec(&req).unwrap();
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
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.service.addr)
    }

    fn stop(self) {
        tokio::task::block_in_place(|| self.service.stop());
    }
}

/// Waits until the task is in the ledger (consumed from Kafka) and in `phase`.
async fn wait_state(addr: &str, key: &str, phase: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = http(
            addr,
            "GET",
            &format!("/tasks/{}", task_ref(key)),
            None,
            None,
        )
        .await;
        if status == 200 && serde_json::from_str::<Value>(&body).unwrap()["state"] == phase {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key} never {phase}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The task's events as the ledger holds them (`GET /tasks/{id}`).
async fn events(addr: &str, key: &str) -> (String, Vec<Value>) {
    let task = get_json(addr, &format!("/tasks/{}", task_ref(key))).await;
    let state = task["state"].as_str().unwrap().to_owned();
    (state, task["events"].as_array().unwrap().clone())
}

/// Signs the open page in with `token` (signing out first when signed in): who is signed in,
/// or why the token was refused.
pub fn sign_in(browser: &mut Browser, token: &str) -> String {
    let corner = "document.querySelector('#signin-form') || document.querySelector('#signed-in')";
    browser.wait_for(corner);
    if browser.eval("!!document.querySelector('#signout')") == json!(true) {
        browser.click("#signout");
        browser.wait_for("document.querySelector('#signin-form')");
    }
    browser.fill("#signin-token", token);
    browser.click("#signin-button");
    let outcome = browser.wait_for(
        "(document.querySelector('#signed-in') || {}).textContent || (document.querySelector('#signin-error') || {}).textContent",
    );
    outcome.as_str().unwrap().to_owned()
}

/// Fills the resolve form of the open task page (signed in with the shared token, so the
/// form asks for a name) and sends it, after checking the preview.
fn resolve_in_page(browser: &mut Browser, choice: &str, remote_id: &str, by: &str) {
    browser.wait_for("document.querySelector('#resolve-form')");
    browser.click(&format!("#as-{choice}"));
    browser.fill("#remote-id", remote_id);
    browser.fill("#by", by);
    browser.fill("#reason", "checked the remote's dashboard");
    browser.click("#review");
    let says = browser.wait_for("document.querySelector('#preview-says').textContent");
    assert!(says.as_str().unwrap().contains(by), "{says}");
    let body = browser.text("#preview-body");
    assert!(
        !body.as_str().unwrap().contains(TOKEN),
        "the preview never shows the token: {body}"
    );
    browser.click("#send");
}

/// The queue lists the tasks in review; a task page shows the request and timeline; resolving
/// there records the operator's name in the ledger and the page shows the new state. A wrong
/// token cannot sign in, and the page then offers no form; a task resolved meanwhile answers 409
/// and the page shows the ledger's state. Unknown tasks get a 404 page; the dashboard draws
/// the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_resolves_reviews_and_the_ledger_records_the_operator() {
    let keys = ["cs-1", "cs-2", "cs-3"];
    let setup = Setup::with_reviews(&keys, |_| json!({ "amount": 1250, "currency": "EUR" })).await;
    let addr = setup.service.addr.clone();
    let mut browser = tokio::task::block_in_place(Browser::launch);

    // The queue: one row per task in review, with its reason and evidence.
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url("/console"));
        browser.wait_for("document.querySelectorAll('#queue tbody tr').length === 3");
        let table = browser.text("#queue").as_str().unwrap().to_owned();
        for key in keys {
            assert!(
                table.contains(&format!("acme/payment.create/{key}")),
                "{table}"
            );
        }
        assert!(
            table.contains("no remote record found by the deadline"),
            "{table}"
        );
        assert_eq!(
            browser.text("#mode"),
            json!("changes need a signed-in operator")
        );
        assert_eq!(
            sign_in(&mut browser, TOKEN),
            "signed in (shared admin token)"
        );
        // Filtering by reason keeps all three; by another tenant, none would show.
        let reasons = browser
            .eval("[...document.querySelectorAll('#filter-reason option')].map(o => o.value)");
        assert_eq!(reasons, json!(["", "DeadlinePassed"]));
    });

    // A task page, opened from the queue, then resolved as failed.
    tokio::task::block_in_place(|| {
        browser.click(&format!("tr[data-task='{}'] a", task_id("cs-1")));
        browser.wait_for("document.querySelector('#task-state').textContent === 'manual_review'");
        let payload = browser.text("#payload");
        assert!(
            payload.as_str().unwrap().contains("\"amount\": 1250"),
            "{payload}"
        );
        let lookup = browser.text("#task-lookup-url");
        assert!(
            lookup
                .as_str()
                .unwrap()
                .ends_with(&format!("/records?reference={}", task_id("cs-1"))),
            "{lookup}"
        );
        let timeline = browser
            .eval("[...document.querySelectorAll('#timeline tbody tr')].map(r => r.dataset.event)");
        assert!(
            timeline
                .as_array()
                .unwrap()
                .contains(&json!("ManualReviewRequired")),
            "{timeline}"
        );
        let attempt = browser.eval(
            "document.querySelector('#timeline tr[data-event=SendIntended] td:nth-child(4)').textContent",
        );
        assert_eq!(attempt, json!("1"));
        resolve_in_page(&mut browser, "failed", "", "Ada Operator");
        browser.wait_for("document.querySelector('#task-state').textContent === 'failed'");
        let result = browser.text("#result");
        assert!(
            result.as_str().unwrap().starts_with("Recorded:"),
            "{result}"
        );
        assert!(
            browser.wait_for("document.querySelector('#not-in-review')") != Value::Null,
            "the form is gone once resolved"
        );
    });
    let (state, recorded) = events(&addr, "cs-1").await;
    assert_eq!(state, "failed");
    let note = recorded
        .iter()
        .find(|e| e["event"] == "OperatorNote")
        .expect("the resolution is recorded");
    assert_eq!(note["data"]["who"], "Ada Operator");
    assert!(recorded.iter().any(|e| e["event"] == "Failed"));

    // A wrong token: refused (401) at sign-in; the page offers no form; nothing recorded.
    let (_, before) = events(&addr, "cs-2").await;
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url(&format!("/console/task/{}", task_ref("cs-2"))));
        let refused = sign_in(&mut browser, "not-the-token");
        assert!(refused.starts_with("Refused (401)"), "{refused}");
        browser.wait_for("document.querySelector('#sign-in-first')");
        assert_eq!(
            browser.eval("document.querySelector('#resolve-form')"),
            Value::Null
        );
        assert_eq!(
            sign_in(&mut browser, TOKEN),
            "signed in (shared admin token)"
        );
    });
    let (state, after) = events(&addr, "cs-2").await;
    assert_eq!(
        (state.as_str(), after.len()),
        ("manual_review", before.len())
    );

    // Resolved elsewhere while the page was open: 409 shown, and the page shows the ledger.
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url(&format!("/console/task/{}", task_id("cs-3"))));
        browser.wait_for("document.querySelector('#resolve-form')");
    });
    let (status, _) = resolve(
        &addr,
        &task_ref("cs-3"),
        Some(TOKEN),
        json!({ "as": "failed", "by": "Grace", "reason": "from the CLI" }),
    )
    .await;
    assert_eq!(status, 200);
    tokio::task::block_in_place(|| {
        resolve_in_page(&mut browser, "succeeded", "rec-123", "Ada Operator");
        let result = browser.wait_for("document.querySelector('#result[data-status]') && document.querySelector('#result').textContent");
        assert!(
            result.as_str().unwrap().starts_with("Refused (409)"),
            "{result}"
        );
        assert!(
            result.as_str().unwrap().contains("not in manual review"),
            "{result}"
        );
        browser.wait_for("document.querySelector('#task-state').textContent === 'failed'");
    });
    let (_, recorded) = events(&addr, "cs-3").await;
    let notes: Vec<&Value> = recorded
        .iter()
        .filter(|e| e["event"] == "OperatorNote")
        .collect();
    assert_eq!(notes.len(), 1, "one resolution: {recorded:?}");
    assert_eq!(notes[0]["data"]["who"], "Grace");

    // An unknown task: a 404 page.
    let (status, body) = http(&addr, "GET", "/console/task/acme%2Fnope%2Fx", None, None).await;
    assert_eq!(status, 404);
    assert!(body.contains("No such task"), "{body}");
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url("/console/task/acme%2Fnope%2Fx"));
        let text = browser.text("#page-error");
        assert!(text.as_str().unwrap().contains("No such task"), "{text}");
    });

    // The dashboard: the ledger's counts and the consumer's lag, drawn.
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url("/console/dashboard"));
        let failed = browser
            .wait_for("document.querySelector('#chart-tasks text[data-label=failed]').textContent");
        // The ledger gauges may be up to LEDGER_GAUGES_TTL old: at least cs-1 is counted.
        assert!(["1", "2"].contains(&failed.as_str().unwrap()), "{failed}");
        let unknown_attempts = browser.wait_for(
            "document.querySelector('#chart-attempts text[data-label=unknown]').textContent",
        );
        assert_eq!(unknown_attempts, json!("3"));
        browser.wait_for("document.querySelectorAll('#chart-lag text.value').length >= 1");
    });
    assert_eq!(setup.sim.records().len(), 0, "nothing was sent again");
    drop(browser);
    setup.stop();
}

/// Authorizing a resend from the task page records it with the operator's name; the task
/// sends one new attempt, which the remote (answering again) takes: one record, succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_authorizes_one_resend_and_the_task_sends_it() {
    let setup = Setup::with_reviews(&["rs-1"], |_| json!({ "amount": 5 })).await;
    let addr = setup.service.addr.clone();
    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url(&format!("/console/task/{}", task_ref("rs-1"))));
        sign_in(&mut browser, TOKEN);
        resolve_in_page(&mut browser, "resend", "", "Ada Operator");
        let result = browser.wait_for("document.querySelector('#result[data-status]') && document.querySelector('#result').textContent");
        assert!(
            result.as_str().unwrap().starts_with("Recorded:"),
            "{result}"
        );
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let recorded = loop {
        let (state, recorded) = events(&addr, "rs-1").await;
        if state == "succeeded" {
            break recorded;
        }
        assert!(std::time::Instant::now() < deadline, "still {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let authorized = recorded
        .iter()
        .find(|e| e["event"] == "ResendAuthorized")
        .expect("the resend is recorded");
    assert!(
        authorized.to_string().contains("Ada Operator"),
        "{authorized}"
    );
    let intents = recorded
        .iter()
        .filter(|e| e["event"] == "SendIntended")
        .count();
    assert!(intents >= 2, "{recorded:?}");
    assert_eq!(setup.sim.records_with_identity("rs-1").len(), 1);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url(&format!("/console/task/{}", task_ref("rs-1"))));
        browser.wait_for("document.querySelector('#task-state').textContent === 'succeeded'");
    });
    drop(browser);
    setup.stop();
}

/// The tasks page lists failed tasks with why they failed, beside each target's breaker; its
/// retry form retries every failed task the filters select, each is sent once more, and the
/// ledger records the operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_lists_failed_tasks_and_retries_them() {
    let setup = Setup::start(TOKEN, |t| {
        // Two failed attempts are far below the breaker's minimum_calls: it stays closed.
        t["retry"] = json!({ "max_attempts": 1, "initial_backoff": "5ms", "max_backoff": "10ms", "multiplier": 2.0 });
    })
    .await;
    setup.sim.set_offline(true).await.unwrap();
    let keys = ["fl-1", "fl-2"];
    setup.produce(&keys, |_| json!({ "amount": 7 })).await;
    for key in keys {
        wait_state(&setup.service.addr, key, "failed").await;
    }
    setup.sim.set_offline(false).await.unwrap();
    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url("/console/tasks?phase=failed"));
        browser.wait_for("document.querySelectorAll('#tasks tbody tr').length === 2");
        let failures = browser.eval("[...document.querySelectorAll('#tasks tbody tr td:last-child')].map(td => td.textContent).join(',')");
        assert_eq!(failures, "connect,connect");
        let breaker = browser.wait_for("document.querySelector('[data-target=\"sim\"]') && document.querySelector('[data-target=\"sim\"]').textContent");
        assert!(
            breaker.as_str().unwrap().contains("breaker closed"),
            "{breaker}"
        );
        browser.wait_for("document.querySelector('#retry-sign-in')");
        sign_in(&mut browser, TOKEN);
        browser.wait_for("document.querySelector('#retry-form')");
        browser.fill("#by", "Ada Operator");
        browser.fill("#reason", "the remote is back");
        browser.click("#send-retry");
        let result = browser.wait_for("document.querySelector('#retry-result[data-status]') && document.querySelector('#retry-result').textContent");
        assert_eq!(result, "Retried 2 of 2 selected task(s).");
    });
    for key in keys {
        wait_state(&setup.service.addr, key, "succeeded").await;
        let (_, recorded) = events(&setup.service.addr, key).await;
        let retried = recorded
            .iter()
            .find(|e| e["event"] == "TaskRetried")
            .expect("the retry is recorded");
        assert!(retried.to_string().contains("Ada Operator"), "{retried}");
        assert_eq!(setup.sim.records_with_identity(key).len(), 1, "{key}");
    }
    drop(browser);
    setup.stop();
}

/// With no admin token configured the console is read-only and says why: a task in review
/// shows no form, and a resolution sent anyway is refused (403) with nothing recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_without_a_token_is_read_only_and_says_why() {
    let setup = Setup::with_reviews_and_token(&["ro-1"], |_| json!({ "amount": 5 }), "").await;
    let addr = setup.service.addr.clone();
    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url(&format!("/console/task/{}", task_ref("ro-1"))));
        let text = browser.wait_for("document.querySelector('#read-only') && document.querySelector('#read-only').textContent");
        assert!(
            text.as_str()
                .unwrap()
                .contains("no operators or admin.token configured"),
            "{text}"
        );
        assert_eq!(
            browser.eval("document.querySelector('#resolve-form')"),
            Value::Null
        );
    });
    let (_, before) = events(&addr, "ro-1").await;
    let (status, _) = resolve(
        &addr,
        &task_ref("ro-1"),
        Some("anything"),
        json!({ "as": "failed", "by": "Mallory", "reason": "no token here" }),
    )
    .await;
    assert_eq!(status, 403);
    let (state, after) = events(&addr, "ro-1").await;
    assert_eq!(
        (state.as_str(), after.len()),
        ("manual_review", before.len())
    );
    drop(browser);
    setup.stop();
}

/// Markup in a payload and in an operator's reason shows as text: no element is created from
/// it and no script of it runs, on the queue and on the task page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_markup_in_data_as_text() {
    let setup = Setup::with_reviews(&["html-1"], |_| json!({ "note": HOSTILE })).await;
    let addr = setup.service.addr.clone();
    let (status, _) = resolve(
        &addr,
        &task_ref("html-1"),
        Some(TOKEN),
        json!({ "resend": false, "as": "failed", "by": "<i id=\"injected\">Eve</i>", "reason": HOSTILE }),
    )
    .await;
    assert_eq!(status, 200);
    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url(&format!("/console/task/{}", task_ref("html-1"))));
        browser.wait_for("document.querySelector('#task-state').textContent === 'failed'");
        let payload = browser.text("#payload");
        assert!(
            payload
                .as_str()
                .unwrap()
                .contains("<script>window.injected"),
            "{payload}"
        );
        let timeline = browser.text("#timeline");
        assert!(timeline.as_str().unwrap().contains(HOSTILE), "{timeline}");
        assert!(
            timeline
                .as_str()
                .unwrap()
                .contains("<i id=\"injected\">Eve</i>"),
            "{timeline}"
        );
        let injected = browser.eval(
            "[document.querySelectorAll('#injected, main img, main script, main b, main i').length, typeof window.injected]",
        );
        assert_eq!(injected, json!([0, "undefined"]));
    });
    drop(browser);
    setup.stop();
}

/// Saves the console's pages as PNGs under `docs/console/` (run by `scripts/screenshots`):
/// a queue of tasks in review, one task's page with its resolve form, and the dashboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/console/*.png; run by scripts/screenshots"]
async fn console_screenshots() {
    let keys = ["inv-2041", "inv-2042", "refund-77", "inv-2043"];
    let setup = Setup::with_reviews(&keys, |key| {
        json!({ "amount": 1250 + key.len() * 10, "currency": "EUR", "customer": "cus_4821", "reference": key })
    })
    .await;
    // One resolved, so the dashboard shows more than one state.
    let (status, _) = resolve(
        &setup.service.addr,
        &task_ref("inv-2043"),
        Some(TOKEN),
        json!({ "as": "failed", "by": "Ada Operator", "reason": "duplicate invoice, cancelled upstream" }),
    )
    .await;
    assert_eq!(status, 200);
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console");
    std::fs::create_dir_all(&out).unwrap();
    let mut browser = tokio::task::block_in_place(Browser::launch);
    tokio::task::block_in_place(|| {
        browser.goto(&setup.url("/console"));
        browser.wait_for("document.querySelectorAll('#queue tbody tr').length === 3");
        browser.screenshot(&out.join("queue.png"));
        browser.goto(&setup.url(&format!("/console/task/{}", task_ref("inv-2041"))));
        sign_in(&mut browser, TOKEN);
        browser.wait_for("document.querySelector('#resolve-form')");
        browser.click("#as-failed");
        browser.fill("#by", "Ada Operator");
        browser.fill(
            "#reason",
            "the remote holds no record; customer asked to cancel",
        );
        browser.screenshot(&out.join("task.png"));
        browser.goto(&setup.url("/console/dashboard"));
        browser.wait_for("document.querySelectorAll('#chart-lag text.value').length >= 1");
        // The ledger gauges are recomputed at most every 5 s: wait for the resolution to show.
        std::thread::sleep(Duration::from_secs(6));
        browser.goto(&setup.url("/console/dashboard"));
        browser.wait_for("document.querySelector('#chart-tasks text[data-label=failed]')");
        browser.screenshot(&out.join("dashboard.png"));
    });
    drop(browser);
    setup.stop();
}
