//! The HTTP front door (`[front]`), driven by curl against `sendledger run` on an embedded
//! cluster and a simulated remote: one key, one task, one record, the same answer for every
//! retry; a key reused with another payload is 422, no key 400; `Prefer: wait` returns the
//! result in time, or 202 and the GET later; an unknown outcome is reported as such and later
//! confirmed by lookup; a service killed right after its 202 completes the task once after a
//! restart. [`callers`]: callers' credentials, tenants and TLS. [`kafka`]: kafka mode, a POST
//! to any instance. Every answer is checked against the OpenAPI document ([`openapi`]).

mod callers;
mod kafka;
mod openapi;

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use sendledger_kafka::Kafka;
use sendledger_node::config::Config;
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::kafka::{config, service_config};
use serde_json::{json, Value};

/// An answer as curl saw it: status, headers (lowercase names), body.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("not JSON: {self:?}"))
    }
}

/// One request with curl, `options` (`--cacert`, `--cert`...) first; `headers` as `Name:
/// value`.
fn curl_with(
    options: &[String],
    method: &str,
    url: &str,
    headers: &[&str],
    body: Option<&Value>,
) -> Answer {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(options);
    cmd.args(["-s", "-i", "--max-time", "60", "-X", method, url]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    if let Some(body) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(body.to_string());
    }
    let out = cmd.output().expect("curl runs");
    assert!(out.status.success(), "curl failed: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.lines();
    let status = (lines.next().unwrap().split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A task request without its key (the header gives it).
fn task(amount: u64) -> Value {
    json!({ "tenant": "acme", "operation": "payment.create", "target": "sim", "payload": { "amount": amount, "currency": "EUR" } })
}

/// Target `sim`: the simulated remote, a 300 ms timeout, then `tweak`.
fn sim_target(sim: &Sim, tweak: impl FnOnce(&mut Value)) -> sendledger_effects::TargetConfig {
    sendledger_tests::engine::target(&sim.base_url(), |t| {
        t["request_timeout"] = "300ms".into();
        t["lookup"]["deadline"] = "20s".into();
        tweak(t);
    })
}

struct Front {
    run: Child,
    /// `http://` or `https://`, the address.
    url: String,
    /// curl's options for every request (TLS).
    options: Vec<String>,
    /// The service's `ready` line.
    ready: String,
}

impl Front {
    /// `sendledger run` with the front door on, on `dir`'s ledger.
    fn start(dir: &Path, brokers: &str, sim: &Sim) -> Front {
        Front::start_with(dir, brokers, sim, |_| {})
    }

    /// As [`Front::start`], the target's settings adjusted by `tweak`.
    fn start_with(dir: &Path, brokers: &str, sim: &Sim, tweak: impl FnOnce(&mut Value)) -> Front {
        Front::launch(dir, brokers, sim, &[], |service| {
            service.targets.insert("sim".into(), sim_target(sim, tweak));
        })
    }

    /// `sendledger run` with the front door on loopback, target `sim` the simulated remote,
    /// the configuration then adjusted by `adjust`, and `env` set.
    fn launch(
        dir: &Path,
        brokers: &str,
        sim: &Sim,
        env: &[(&str, String)],
        adjust: impl FnOnce(&mut Config),
    ) -> Front {
        let mut service: Config = toml::from_str(&service_config(dir, brokers, sim)).unwrap();
        service.front.enabled = true;
        service.front.listen = "127.0.0.1:0".parse().unwrap();
        service
            .targets
            .insert("sim".into(), sim_target(sim, |_| {}));
        adjust(&mut service);
        let file = dir.join("sendledger.toml");
        std::fs::write(&file, toml::to_string(&service).unwrap()).unwrap();
        let (run, ready) = crate::start_run(&file, env);
        let url = sendledger_tests::ready_field(&ready, "front=");
        Front {
            run,
            url,
            options: Vec::new(),
            ready,
        }
    }

    fn post(&self, key: Option<&str>, body: &Value, wait: Option<u64>) -> Answer {
        let key = key.map(|k| format!("Idempotency-Key: \"{k}\""));
        let wait = wait.map(|w| format!("Prefer: wait={w}"));
        let headers: Vec<&str> = key.iter().chain(wait.iter()).map(String::as_str).collect();
        self.request("POST", "/v1/tasks", &headers, Some(body))
    }

    fn get(&self, location: &str) -> Answer {
        self.request("GET", location, &[], None)
    }

    fn request(&self, method: &str, path: &str, headers: &[&str], body: Option<&Value>) -> Answer {
        let url = format!("{}{path}", self.url);
        let answer = curl_with(&self.options, method, &url, headers, body);
        openapi::check(method, path, body, &answer);
        answer
    }

    fn stop(mut self) {
        sendledger_tests::process::stop_run(&mut self.run);
    }
}

impl Drop for Front {
    /// A test that failed leaves no service running (a stopped one is reaped already).
    fn drop(&mut self) {
        let _ = self.run.kill();
        let _ = self.run.wait();
    }
}

async fn setup(faults: Faults) -> (Kafka, Sim, tempfile::TempDir) {
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config("embedded"))).unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.set_faults(faults).unwrap();
    (kafka, sim, tempfile::tempdir().unwrap())
}

/// 50 concurrent POSTs with one key: one task, one record at the remote, and every answer the
/// same result record; a later retry is a replay with the same record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_posts_with_one_key_make_one_task_and_one_answer() {
    let (kafka, sim, dir) = setup(Faults::default()).await;
    let front =
        tokio::task::block_in_place(|| Front::start(dir.path(), kafka.bootstrap_servers(), &sim));
    let answers: Vec<Answer> = tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let posts: Vec<_> = (0..50)
                .map(|_| s.spawn(|| front.post(Some("order-50"), &task(50), Some(20))))
                .collect();
            posts.into_iter().map(|p| p.join().unwrap()).collect()
        })
    });
    let first = answers[0].json();
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(first["request_key"], "order-50");
    for answer in &answers {
        assert!([200, 201].contains(&answer.status), "{answer:?}");
        assert_eq!(answer.json(), first, "every answer is the same result");
    }
    assert_eq!(sim.records_with_identity("order-50").len(), 1);
    let again = tokio::task::block_in_place(|| front.post(Some("order-50"), &task(50), None));
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.header("idempotency-replayed"), Some("true"));
    assert_eq!(again.json(), first);
    assert_eq!(sim.stats().posts, 1, "sent once");
    tokio::task::block_in_place(|| front.stop());
}

/// The same key with another payload is 422 (problem+json naming the task); no key, two
/// different keys, and an invalid request are 400; nothing is sent for any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reused_key_is_422_and_a_missing_key_400_with_problem_details() {
    let (kafka, sim, dir) = setup(Faults::default()).await;
    let front =
        tokio::task::block_in_place(|| Front::start(dir.path(), kafka.bootstrap_servers(), &sim));
    tokio::task::block_in_place(|| {
        let first = front.post(Some("k-422"), &task(1), Some(20));
        assert_eq!(first.status, 201, "{first:?}");
        let other = front.post(Some("k-422"), &task(2), Some(20));
        assert_eq!(other.status, 422, "{other:?}");
        assert_eq!(
            other.header("content-type"),
            Some("application/problem+json")
        );
        let problem = other.json();
        assert_eq!(
            problem["type"],
            "urn:sendledger:problem:idempotency-key-reused"
        );
        assert_eq!(problem["status"], 422);
        assert_eq!(problem["task_id"], first.json()["task_id"]);
        for (key, body, kind) in [
            (None, task(3), "missing-idempotency-key"),
            (
                Some("k-a"),
                json!({ "request_key": "k-b", "tenant": "acme", "operation": "payment.create", "target": "sim", "payload": {} }),
                "idempotency-key-mismatch",
            ),
            (
                Some("k-bad"),
                json!({ "tenant": "acme", "operation": "payment.create", "target": "nowhere", "payload": {} }),
                "invalid-request",
            ),
        ] {
            let answer = front.post(key, &body, None);
            assert_eq!(answer.status, 400, "{answer:?}");
            assert_eq!(
                answer.json()["type"],
                format!("urn:sendledger:problem:{kind}")
            );
        }
    });
    assert_eq!(sim.stats().posts, 1, "only the first was sent");
    tokio::task::block_in_place(|| front.stop());
}

/// A remote answering in 1.5 s (within the target's timeout): `Prefer: wait=10` gets the
/// result (201), `wait=0` a 202 with `Location` and `Retry-After`, and the GET there the
/// result once the task ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_returns_the_result_in_time_or_202_and_the_get_later() {
    let slow = Faults {
        latency: Duration::from_millis(1500),
        ..Faults::default()
    };
    let (kafka, sim, dir) = setup(slow).await;
    let front = tokio::task::block_in_place(|| {
        Front::start_with(dir.path(), kafka.bootstrap_servers(), &sim, long_timeout)
    });
    tokio::task::block_in_place(|| {
        let waited = front.post(Some("w-1"), &task(1), Some(10));
        assert_eq!(waited.status, 201, "{waited:?}");
        assert_eq!(waited.json()["status"], "succeeded");
        let later = front.post(Some("w-2"), &task(2), Some(0));
        assert_eq!(later.status, 202, "{later:?}");
        assert_eq!(later.header("retry-after"), Some("1"));
        let location = later.header("location").unwrap().to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let done = loop {
            let got = front.get(&location);
            assert_eq!(got.status, 200, "{got:?}");
            if got.header("retry-after").is_none() {
                break got;
            }
            assert!(std::time::Instant::now() < deadline, "{got:?}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(done.json()["status"], "succeeded", "{done:?}");
        assert_eq!(done.json()["request_key"], "w-2");
    });
    assert_eq!(sim.records().len(), 2);
    tokio::task::block_in_place(|| front.stop());
}

/// A target timeout above the remote's latency in the tests that slow it down.
fn long_timeout(target: &mut Value) {
    target["request_timeout"] = "5s".into();
}

/// Polls `location` until the task ended; its result record.
fn ended(front: &Front, location: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = front.get(location);
        if got.status == 200 && got.header("retry-after").is_none() {
            return got.json();
        }
        assert!(std::time::Instant::now() < deadline, "{got:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A remote that records the payment and drops its answer: the front door's answer says the
/// outcome is unknown (202, never a failure); later the GET says succeeded, confirmed by
/// lookup; one record at the remote, one POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_is_reported_unknown_then_confirmed_by_lookup() {
    let drop = Faults {
        commit_then_drop: 1.0,
        ..Faults::default()
    };
    let (kafka, sim, dir) = setup(drop).await;
    let front = tokio::task::block_in_place(|| {
        Front::start_with(dir.path(), kafka.bootstrap_servers(), &sim, |t| {
            t["lookup"]["first_check"] = "3s".into();
        })
    });
    tokio::task::block_in_place(|| {
        let answer = front.post(Some("lost-1"), &task(9), Some(1));
        assert_eq!(answer.status, 202, "{answer:?}");
        assert_eq!(answer.json()["state"], "unknown", "{answer:?}");
        let location = answer.header("location").unwrap().to_string();
        let result = ended(&front, &location);
        assert_eq!(result["status"], "succeeded", "{result}");
        assert_eq!(result["evidence"]["kind"], "lookup", "{result}");
    });
    assert_eq!(sim.records_with_identity("lost-1").len(), 1);
    assert_eq!(sim.stats().posts, 1, "never sent again");
    tokio::task::block_in_place(|| front.stop());
}

/// The service is killed (SIGKILL) right after its 202: the request was durable, so after a
/// restart on the same ledger the task completes, once, and the GET returns its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_right_after_a_202_loses_nothing_and_sends_once() {
    let slow = Faults {
        latency: Duration::from_millis(800),
        ..Faults::default()
    };
    let (kafka, sim, dir) = setup(slow).await;
    let brokers = kafka.bootstrap_servers().to_string();
    let location = tokio::task::block_in_place(|| {
        let mut front = Front::start_with(dir.path(), &brokers, &sim, long_timeout);
        let answer = front.post(Some("kill-1"), &task(5), None);
        assert_eq!(answer.status, 202, "{answer:?}");
        front.run.kill().unwrap();
        front.run.wait().unwrap();
        answer.header("location").unwrap().to_string()
    });
    tokio::task::block_in_place(|| {
        let front = Front::start_with(dir.path(), &brokers, &sim, long_timeout);
        let result = ended(&front, &location);
        assert_eq!(result["status"], "succeeded", "{result}");
        assert_eq!(result["request_key"], "kill-1");
        front.stop();
    });
    assert_eq!(
        sim.records_with_identity("kill-1").len(),
        1,
        "completed once"
    );
}

/// With `front.max_waiting = 1` and a slow remote, a second request asking to wait while the
/// first waits is 503 and records nothing: its key stays unknown, the remote gets one record.
/// Clients that hang up while waiting leave no wait behind (`sendledger_front_waiting` back to
/// 0 on `/metrics` while their tasks cannot have ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waits_are_capped_before_anything_is_recorded_and_a_client_that_leaves_costs_nothing() {
    let slow = Faults {
        latency: Duration::from_millis(1500),
        ..Faults::default()
    };
    let (kafka, sim, dir) = setup(slow).await;
    let front = tokio::task::block_in_place(|| {
        Front::launch(dir.path(), kafka.bootstrap_servers(), &sim, &[], |c| {
            c.targets
                .insert("sim".into(), sim_target(&sim, long_timeout));
            c.front.max_waiting = 1;
            c.admin.enabled = true;
            c.admin.listen = "127.0.0.1:0".parse().unwrap();
        })
    });
    let admin = sendledger_tests::ready_field(&front.ready, "admin=");
    let waiting = |admin: &str| {
        let metrics = curl_with(&[], "GET", &format!("{admin}/metrics"), &[], None);
        sendledger_tests::metric_value(&metrics.body, "sendledger_front_waiting").unwrap_or(0.0)
    };
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let first = s.spawn(|| front.post(Some("cap-1"), &task(1), Some(20)));
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while waiting(&admin) < 1.0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the first never waited"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let second = front.post(Some("cap-2"), &task(2), Some(20));
            assert_eq!(second.status, 503, "{second:?}");
            assert_eq!(
                second.json()["type"],
                "urn:sendledger:problem:too-many-waiting"
            );
            assert!(second.header("retry-after").is_some(), "{second:?}");
            assert_eq!(first.join().unwrap().status, 201);
        });
        let unknown = front.get("/v1/tasks/acme%2Fpayment.create%2Fcap-2");
        assert_eq!(
            unknown.status, 404,
            "nothing was recorded for it: {unknown:?}"
        );

        // A remote that holds every request unanswered: no task can end for the target's
        // 5 s timeout. Three clients hang up after 300 ms of a 20 s wait.
        sim.set_faults(Faults {
            hang: 1.0,
            ..Faults::default()
        })
        .unwrap();
        for key in ["gone-1", "gone-2", "gone-3"] {
            let out = std::process::Command::new("curl")
                .args(["-s", "--max-time", "0.3", "-X", "POST"])
                .arg(format!("{}/v1/tasks", front.url))
                .args(["-H", &format!("Idempotency-Key: {key}")])
                .args([
                    "-H",
                    "Prefer: wait=20",
                    "-H",
                    "Content-Type: application/json",
                ])
                .arg("--data-binary")
                .arg(task(3).to_string())
                .output()
                .unwrap();
            assert!(!out.status.success(), "curl should have given up: {out:?}");
        }
        // Their tasks are still being sent; their waits went with their clients.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while waiting(&admin) != 0.0 {
            assert!(std::time::Instant::now() < deadline, "waits left behind");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert_eq!(sim.records_with_identity("cap-2").len(), 0);
    assert_eq!(sim.records_with_identity("cap-1").len(), 1);
    tokio::task::block_in_place(|| front.stop());
}

/// Two ways in, one identity: a request produced on the requests topic and then POSTed with
/// the same key is answered from its task (a replay, with the Kafka message as its source);
/// one POSTed first and then produced is a duplicate delivery. One record at the remote each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_comes_both_ways_is_one_task() {
    let (kafka, sim, dir) = setup(Faults::default()).await;
    let front = tokio::task::block_in_place(|| {
        Front::launch(dir.path(), kafka.bootstrap_servers(), &sim, &[], |c| {
            c.admin.enabled = true;
            c.admin.listen = "127.0.0.1:0".parse().unwrap();
        })
    });
    let producer = sendledger_kafka::RequestProducer::new(&kafka).unwrap();
    let message = |key: &str| {
        let mut request = task(7);
        request["request_key"] = key.into();
        let request: sendledger_core::TaskRequest = serde_json::from_value(request).unwrap();
        let value = serde_json::to_vec(&request).unwrap();
        [(Some(sendledger_kafka::request_key(&request)), value)]
    };
    producer.send_all(message("both-1")).await.unwrap();
    tokio::task::block_in_place(|| {
        let first = ended(&front, "/v1/tasks/acme%2Fpayment.create%2Fboth-1");
        assert_eq!(
            first["source"]["topic"],
            kafka.config().requests_topic,
            "{first}"
        );
        let again = front.post(Some("both-1"), &task(7), Some(10));
        assert_eq!(again.status, 200, "{again:?}");
        assert_eq!(again.header("idempotency-replayed"), Some("true"));
        assert_eq!(again.json(), first);

        let posted = front.post(Some("both-2"), &task(7), Some(10));
        assert_eq!(posted.status, 201, "{posted:?}");
        assert_eq!(posted.json()["source"]["topic"], "sendledger:front");
    });
    producer.send_all(message("both-2")).await.unwrap();
    // The message is recorded as a duplicate delivery of the task the POST created.
    let task_id = sendledger_tests::engine::task_id("both-2");
    let admin = sendledger_tests::ready_field(&front.ready, "admin=");
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let url = format!("{admin}/tasks/{task_id}");
            let timeline = curl_with(&[], "GET", &url, &[], None);
            if timeline.body.contains("DuplicateDelivery") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{timeline:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    assert_eq!(sim.records_with_identity("both-1").len(), 1);
    assert_eq!(sim.records_with_identity("both-2").len(), 1);
    tokio::task::block_in_place(|| front.stop());
}
