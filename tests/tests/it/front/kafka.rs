//! The front door in kafka mode: two `sendledger run` processes in one group on the separate
//! broker process, each with its front door and standby copies. A POST to either instance is
//! executed by its partition's owner, whichever that is, and answered by the instance it was
//! sent to; retries to the other instance are replays of the same result, a reused key is 422,
//! and concurrent POSTs of one key to both are one task. The tenant signs its requests and the
//! front door has callers: each message is signed as its owner requires. A request whose owner is frozen is
//! answered 202 `submitted` once it is on the requests topic, and executed once by the next
//! owner after the frozen one is killed. Checked at the remote (one record per key), in the
//! answers, on the results topic, and in the audit of the events topic.

use std::collections::BTreeSet;
use std::time::Duration;

use sendledger_kafka::Kafka;
use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::cluster::{
    read_and_audit_log, start_broker, Group, Instance, KeptOnFailure, ResultsFollower, Timeline,
};
use sendledger_tests::kafka::Broker;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{curl_with, openapi, task, Answer};
use crate::SENDLEDGER;

/// A request to `instance`'s front door with curl, its answer checked against the OpenAPI
/// document.
/// The caller's token (`[front.callers.shop]`, its SHA-256 in the configuration).
const TOKEN: &str = "shop-caller-token-0123456789abcdef0123";

/// The key tenant `acme` signs its requests with: the owner refuses an unsigned one.
const ACME_KEY: &str = "acme-signing-key-0123456789abcdef";

/// A request to `instance`'s front door with curl as caller `shop`, its answer checked
/// against the OpenAPI document.
fn request(
    instance: &Instance,
    method: &str,
    path: &str,
    headers: &[&str],
    body: Option<&Value>,
) -> Answer {
    let url = format!("{}{path}", instance.front());
    let auth = format!("Authorization: Bearer {TOKEN}");
    let headers: Vec<&str> = std::iter::once(auth.as_str())
        .chain(headers.iter().copied())
        .collect();
    let answer = curl_with(&[], method, &url, &headers, body);
    openapi::check(method, path, body, &answer);
    answer
}

fn post(instance: &Instance, key: &str, body: &Value, wait: Option<u64>) -> Answer {
    let key = format!("Idempotency-Key: \"{key}\"");
    let wait = wait.map(|w| format!("Prefer: wait={w}"));
    let headers: Vec<&str> = std::iter::once(&key)
        .chain(wait.iter())
        .map(String::as_str)
        .collect();
    request(instance, "POST", "/v1/tasks", &headers, Some(body))
}

/// Two instances with front doors and standby copies on Apache Kafka, started, the
/// partitions split between them.
struct Setup {
    broker: Broker,
    kafka: Kafka,
    requests_topic: String,
    timeline: Timeline,
    group: Group,
    /// The partitions each instance owns.
    owned: Vec<BTreeSet<i32>>,
}

impl Setup {
    async fn start(root: &KeptOnFailure, sim: &Sim) -> Setup {
        let (broker, kafka_config, kafka) = start_broker().await;
        let kafka_config = sendledger_kafka::KafkaConfig {
            standby: true,
            ..kafka_config
        };
        let target = sendledger_tests::engine::target(&sim.base_url(), |_| {});
        let timeline = Timeline::default();
        let mut group = Group {
            instances: (0..2)
                .map(|id| {
                    Instance::configured(SENDLEDGER, root.path(), id, &kafka_config, |config| {
                        config.targets.insert("sim".into(), target.clone());
                        config.front.enabled = true;
                        config.front.listen = "127.0.0.1:0".parse().unwrap();
                        config.access = toml::from_str(
                            "[tenants.acme]\ntargets = [\"sim\"]\nsigning_keys_env = [\"ACME_KEY\"]",
                        )
                        .unwrap();
                        let hash = Sha256::digest(TOKEN);
                        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
                        config.front.callers = toml::from_str(&format!(
                            "[shop]\ntenants = [\"acme\"]\ntoken_sha256 = [\"{hex}\"]"
                        ))
                        .unwrap();
                    })
                    .with_env(&[("ACME_KEY", ACME_KEY)])
                })
                .collect(),
            timeline: timeline.clone(),
        };
        for instance in &mut group.instances {
            tokio::task::block_in_place(|| instance.start(&timeline));
        }
        let took = group.wait_settled(Duration::from_secs(60)).await;
        assert!(
            took.is_some(),
            "the partitions were not split: {}",
            group.owners()
        );
        let owned = (group.instances.iter())
            .map(|i| timeline.owned(i.id, i.run()))
            .collect();
        Setup {
            broker,
            kafka,
            requests_topic: kafka_config.requests_topic,
            timeline,
            group,
            owned,
        }
    }

    /// Stops every instance, then audits the events topic: no rule broken.
    fn stop_and_audit(&mut self) {
        self.group.stop_all();
        let (_, report) = tokio::task::block_in_place(|| read_and_audit_log(&self.kafka));
        assert!(report.violations.is_empty(), "{:?}", report.violations);
    }

    /// The instance that owns `partition`.
    fn owner_of(&self, partition: i32) -> usize {
        (0..2)
            .find(|&i| self.owned[i].contains(&partition))
            .unwrap_or_else(|| {
                panic!(
                    "partition {partition} is not owned: {}",
                    self.group.owners()
                )
            })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_to_any_instance_is_executed_by_its_partitions_owner() {
    let root = KeptOnFailure::new();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let mut setup = Setup::start(&root, &sim).await;
    let results = ResultsFollower::start(&setup.kafka);
    let answered = tokio::task::block_in_place(|| {
        let (a, b) = (&setup.group.instances[0], &setup.group.instances[1]);
        // Every request to A, waited for: answered by A, executed by the owner of the
        // partition its message landed in.
        let keys: Vec<String> = (0..24).map(|i| format!("kf-{i}")).collect();
        let mut firsts = Vec::new();
        let mut executed_by = [0, 0];
        for (i, key) in keys.iter().enumerate() {
            let answer = post(a, key, &task(i as u64), Some(20));
            assert_eq!(answer.status, 201, "{key}: {answer:?}");
            let result = answer.json();
            assert_eq!(result["status"], "succeeded", "{result}");
            assert_eq!(result["source"]["topic"], setup.requests_topic);
            let partition = result["source"]["partition"].as_i64().unwrap() as i32;
            executed_by[setup.owner_of(partition)] += 1;
            firsts.push(result);
        }
        assert!(
            executed_by[1] > 0,
            "no request sent to A landed in a partition of B's: {executed_by:?} ({})",
            setup.group.owners()
        );

        // B answers every retry from its copies: the same result, a replay; a GET too.
        for (i, (key, first)) in keys.iter().zip(&firsts).enumerate() {
            let again = post(b, key, &task(i as u64), None);
            assert_eq!(again.status, 200, "{key}: {again:?}");
            assert_eq!(again.header("idempotency-replayed"), Some("true"));
            assert_eq!(&again.json(), first, "{key}: the stored result");
            let location = format!("/v1/tasks/{}", first["task_id"].as_str().unwrap());
            for instance in [a, b] {
                let got = request(instance, "GET", &location, &[], None);
                assert_eq!(got.status, 200, "{got:?}");
                assert_eq!(&got.json(), first);
            }
        }

        // The same key with another payload: 422 from either instance.
        for instance in [a, b] {
            let other = post(instance, &keys[0], &task(999), Some(5));
            assert_eq!(other.status, 422, "{other:?}");
            assert_eq!(other.json()["task_id"], firsts[0]["task_id"]);
        }

        // One key posted to both instances at once: one task, one 201, one result.
        let answers: Vec<Answer> = std::thread::scope(|s| {
            let posts: Vec<_> = (0..10)
                .map(|i| {
                    let instance = &setup.group.instances[i % 2];
                    s.spawn(move || post(instance, "kf-both", &task(77), Some(20)))
                })
                .collect();
            posts.into_iter().map(|p| p.join().unwrap()).collect()
        });
        let created = answers.iter().filter(|a| a.status == 201).count();
        assert_eq!(created, 1, "one request created the task: {answers:?}");
        let result = answers[0].json();
        assert_eq!(result["status"], "succeeded", "{result}");
        for answer in &answers {
            assert!([200, 201].contains(&answer.status), "{answer:?}");
            assert_eq!(answer.json(), result, "every answer is the same result");
        }

        for key in keys.iter().map(String::as_str).chain(["kf-both"]) {
            assert_eq!(sim.records_with_identity(key).len(), 1, "{key}: one record");
        }
        assert_eq!(sim.stats().posts, keys.len() as u64 + 1, "each sent once");
        firsts.push(result);
        firsts
    });
    setup.stop_and_audit();
    // Each answer is the result record its owner published.
    let published = results.stop();
    for answer in &answered {
        let record = (published.iter())
            .find(|r| r.event_id == answer["event_id"].as_str().unwrap())
            .unwrap_or_else(|| panic!("no result {} published", answer["event_id"]));
        assert_eq!(&record.value, answer);
    }
}

/// B frozen: requests to A for B's partitions are answered 202 `submitted` once on the requests
/// topic (A's own are executed). B killed: A takes its partitions over and executes
/// each submitted request once; a GET then answers its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_whose_owner_is_frozen_is_submitted_and_executed_once_by_the_next() {
    let root = KeptOnFailure::new();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let mut setup = Setup::start(&root, &sim).await;
    let (a, b) = (0, 1);
    setup.group.instances[b].signal(libc::SIGSTOP);
    let keys: Vec<String> = (0..16).map(|i| format!("frozen-{i}")).collect();
    let answers: Vec<Answer> = tokio::task::block_in_place(|| {
        let front = &setup.group.instances[a];
        std::thread::scope(|s| {
            let posts: Vec<_> = (keys.iter().enumerate())
                .map(|(i, key)| s.spawn(move || post(front, key, &task(i as u64), Some(1))))
                .collect();
            posts.into_iter().map(|p| p.join().unwrap()).collect()
        })
    });
    let (mut submitted, mut pending) = (0, Vec::new());
    for (key, answer) in keys.iter().zip(&answers) {
        let body = answer.json();
        match answer.status {
            // A partition of A's: executed, or under way.
            201 => assert_eq!(body["status"], "succeeded", "{key}: {body}"),
            202 => {
                let location = answer.header("location").expect("a Location");
                pending.push((key.clone(), location.to_string()));
                submitted += usize::from(body["state"] == "submitted");
            }
            _ => panic!("{key}: {answer:?}"),
        }
    }
    assert!(
        submitted > 0,
        "no request landed in a partition of the frozen instance's ({})",
        setup.group.owners()
    );
    assert!(
        sim.stats().posts <= (keys.len() - submitted) as u64,
        "nothing of the frozen owner's partitions is sent"
    );

    // kill -9 of the frozen owner: A takes its partitions over and executes what waits there.
    tokio::task::block_in_place(|| setup.group.instances[b].kill());
    let front = &setup.group.instances[a];
    let limit = std::time::Instant::now() + Duration::from_secs(90);
    for (key, location) in &pending {
        loop {
            let got = tokio::task::block_in_place(|| request(front, "GET", location, &[], None));
            if got.status == 200 && got.json()["status"] == "succeeded" {
                assert_eq!(got.json()["request_key"], key.as_str());
                break;
            }
            assert!(
                std::time::Instant::now() < limit,
                "{key} was not executed after its owner's kill: {got:?} ({})",
                setup.group.owners()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(
        setup.timeline.owned(a, 0).len() == sendledger_tests::cluster::PARTITIONS as usize,
        "A owns every partition"
    );
    for key in &keys {
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}: one record");
    }
    assert_eq!(sim.stats().posts, keys.len() as u64, "each sent once");
    setup.stop_and_audit();
}

/// The brokers gone: a request is answered 503 with `Retry-After` once its message has gone
/// unacknowledged for a while, not held until the brokers return.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_the_brokers_do_not_acknowledge_is_503() {
    let root = KeptOnFailure::new();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let setup = Setup::start(&root, &sim).await;
    let front = &setup.group.instances[0];
    let first = tokio::task::block_in_place(|| post(front, "gone-0", &task(0), Some(20)));
    assert_eq!(first.status, 201, "{first:?}");
    drop(setup.broker);
    let refused = tokio::task::block_in_place(|| post(front, "gone-1", &task(1), Some(20)));
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    let problem = refused.json();
    assert_eq!(problem["type"], "urn:sendledger:problem:unavailable");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("may or may not be on the requests topic"),
        "{problem}"
    );
    assert_eq!(sim.stats().posts, 1, "nothing else was sent");
}
