//! Requests bound to their tenant (`[access]`), through the real pipeline on the embedded
//! cluster: a request signed with its tenant's key (either of two during a rotation) for a
//! target the tenant may use is performed; an unsigned one, one signed with another key, one
//! for a target the tenant may not use, and one for a tenant the service does not act for are
//! each rejected with the rule that refused it, nothing sent, one result each.

use std::sync::Arc;
use std::time::Duration;

use sendledger_core::access::{sign, Access, SigningKey, TenantRules, SIGNATURE_HEADER};
use sendledger_kafka::rdkafka::message::{Header, OwnedHeaders};
use sendledger_kafka::rdkafka::producer::FutureRecord;
use sendledger_kafka::{Ingest, Kafka, Publisher};
use sendledger_node::wiring::EngineSink;
use sendledger_sim::{Sim, SimConfig};
use sendledger_tests::engine::{request, target};
use sendledger_tests::kafka::{config, dedupe, read_until, requests_producer, validate_all};

const OLD_KEY: &str = "acme-signing-key-2026-11-0123456789abcdef";
const NEW_KEY: &str = "acme-signing-key-2026-12-0123456789abcdef";

fn access() -> Access {
    let key = |id: &str, secret: &str| SigningKey {
        id: id.into(),
        secret: secret.as_bytes().to_vec(),
    };
    let acme = TenantRules {
        topic: None,
        targets: ["sim".to_string()].into(),
        operations: Some(["payment.create".to_string()].into()),
        keys: vec![key("ACME_OLD", OLD_KEY), key("ACME_NEW", NEW_KEY)],
    };
    Access {
        tenants: [("acme".to_string(), acme)].into(),
    }
}

/// A request key, its tenant and target, the key it is signed with, and the rule expected to
/// refuse it (`None`: performed).
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_are_acted_on_only_when_their_tenant_may_ask_for_them() {
    let mut cfg = config("embedded");
    cfg.dead_letter_topic = Some("sendledger.dead".into());
    let kafka = tokio::task::block_in_place(|| Kafka::connect(cfg)).unwrap();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = tokio::task::block_in_place(|| {
        sendledger_tests::engine::start(dir.path(), target(&sim.base_url(), |_| {}))
    });
    let sink = Arc::new(EngineSink::new(engine.clone()));
    let ingest = Ingest::start_checked(&kafka, sink, None, Some(Arc::new(access()))).unwrap();
    let publisher = Publisher::start(&kafka, engine.ledger().clone()).unwrap();

    let topic = kafka.config().requests_topic.clone();
    let value_of = |key: &str, tenant: &str, target: &str| {
        let mut r = request(key);
        r.tenant = tenant.into();
        r.target = target.into();
        serde_json::to_vec(&r).unwrap()
    };
    let cases: [Case; 6] = [
        ("signed-old", "acme", "sim", Some(OLD_KEY), None),
        ("signed-new", "acme", "sim", Some(NEW_KEY), None),
        ("unsigned", "acme", "sim", None, Some("unsigned")),
        (
            "forged",
            "acme",
            "sim",
            Some("a-key-of-someone-else-0123456789ab"),
            Some("bad_signature"),
        ),
        (
            "elsewhere",
            "acme",
            "ledger-admin",
            Some(NEW_KEY),
            Some("target_not_allowed"),
        ),
        ("stranger", "globex", "sim", None, Some("unknown_tenant")),
    ];
    let producer = requests_producer(&kafka);
    for (key, tenant, target, signing, _) in cases {
        let value = value_of(key, tenant, target);
        let mut headers = OwnedHeaders::new();
        let signature = signing.map(|s| sign(s.as_bytes(), &topic, &value));
        if let Some(signature) = &signature {
            headers = headers.insert(Header {
                key: SIGNATURE_HEADER,
                value: Some(signature.as_str()),
            });
        }
        let identity = format!("{tenant}/payment.create/{key}");
        let record = FutureRecord::to(&topic)
            .key(&identity)
            .payload(&value)
            .headers(headers);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    let raw = read_until(&kafka, &kafka.config().results_topic.clone(), |r| {
        r.len() >= 6
    })
    .await;
    validate_all(&raw, "task-result.schema.json");
    let results = dedupe(&raw);
    assert_eq!(results.len(), 6, "one result each: {results:#?}");
    for (key, _, _, _, refused_by) in cases {
        check_outcome(&results, &sim, key, refused_by);
    }
    ingest.shutdown(Duration::from_secs(10)).await.unwrap();
    publisher.shutdown(Duration::from_secs(10)).await.unwrap();
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The same through the commands a user runs: `sendledger run` with `[access]` rules and its
/// key in the environment, `sendledger produce --sign-key-env` for the signed requests, plain
/// `produce` for the unsigned ones. The signed are performed; the unsigned rejected, nothing
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_acts_on_requests_produce_signed_and_rejects_the_unsigned() {
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config("embedded"))).unwrap();
    let brokers = kafka.bootstrap_servers().to_string();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("sendledger.toml");
    let config = sendledger_tests::kafka::service_config(dir.path(), &brokers, &sim)
        + "\n[access.tenants.acme]\ntargets = [\"sim\"]\nsigning_keys_env = [\"ACME_SIGNING_KEY\"]\n";
    std::fs::write(&config_file, config).unwrap();
    let env = [("ACME_SIGNING_KEY", NEW_KEY.to_string())];
    let (mut run, _) = tokio::task::block_in_place(|| crate::start_run(&config_file, &env));

    let write = |name: &str, keys: &[&str]| {
        let lines: Vec<String> = (keys.iter())
            .map(|k| String::from_utf8(sendledger_tests::kafka::request_json(k)).unwrap())
            .collect();
        let file = dir.path().join(name);
        std::fs::write(&file, lines.join("\n")).unwrap();
        file
    };
    let signed = write("signed.jsonl", &["cli-signed-1", "cli-signed-2"]);
    let unsigned = write("unsigned.jsonl", &["cli-unsigned"]);
    for (file, sign) in [(&signed, true), (&unsigned, false)] {
        let mut produce = crate::sendledger();
        produce.args(["produce", "--brokers", &brokers]).arg(file);
        if sign {
            produce
                .args(["--sign-key-env", "ACME_SIGNING_KEY"])
                .env("ACME_SIGNING_KEY", NEW_KEY);
        }
        let out = produce.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let raw = read_until(&kafka, &kafka.config().results_topic.clone(), |r| {
        r.len() >= 3
    })
    .await;
    let results = dedupe(&raw);
    let status_of = |key: &str| {
        (results.iter())
            .find(|r| r.request_key.as_deref() == Some(key))
            .map(|r| (r.status, r.reason.clone().unwrap_or_default()))
            .unwrap_or_else(|| panic!("{key}: no result in {results:#?}"))
    };
    for key in ["cli-signed-1", "cli-signed-2"] {
        assert_eq!(
            status_of(key).0,
            sendledger_core::ResultStatus::Succeeded,
            "{key}"
        );
        assert_eq!(sim.records_with_identity(key).len(), 1, "{key}");
    }
    let (status, reason) = status_of("cli-unsigned");
    assert_eq!(status, sendledger_core::ResultStatus::Rejected);
    assert!(reason.contains("unsigned"), "{reason}");
    assert!(sim.records_with_identity("cli-unsigned").is_empty());
    tokio::task::block_in_place(|| sendledger_tests::process::stop_run(&mut run));
}

/// Tenants with requests topics of their own (`access.tenants.NAME.topic`): `sendledger run`
/// reads each besides the requests topic, and acts on a tenant's requests from its own topic
/// only. A producer of acme's topic asking for globex, and acme's request on the shared
/// requests topic, are rejected (`topic_not_allowed`), nothing sent; each tenant's request on
/// its own topic is performed. One result each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_reads_tenants_own_topics_and_acts_on_their_requests_from_there_only() {
    let kafka = tokio::task::block_in_place(|| Kafka::connect(config("embedded"))).unwrap();
    let brokers = kafka.bootstrap_servers().to_string();
    // The service reaches the cluster as external brokers: the topics exist beforehand, as
    // an administrator would create them with their ACLs.
    for topic in ["acme.requests", "globex.requests"] {
        kafka.for_requests_topic(topic, "setup").unwrap();
    }
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("sendledger.toml");
    let config = sendledger_tests::kafka::service_config(dir.path(), &brokers, &sim)
        + "\n[access.tenants.acme]\ntargets = [\"sim\"]\ntopic = \"acme.requests\"\n"
        + "\n[access.tenants.globex]\ntargets = [\"sim\"]\ntopic = \"globex.requests\"\n";
    std::fs::write(&config_file, config).unwrap();
    let (mut run, _) = tokio::task::block_in_place(|| crate::start_run(&config_file, &[]));

    let produce = |topic: &str, tenant: &str, key: &str| {
        let mut r = request(key);
        r.tenant = tenant.into();
        let file = dir.path().join(format!("{key}.jsonl"));
        std::fs::write(&file, serde_json::to_vec(&r).unwrap()).unwrap();
        let out = (crate::sendledger())
            .args(["produce", "--brokers", &brokers, "--topic", topic])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let requests_topic = kafka.config().requests_topic.clone();
    let cases = [
        ("acme.requests", "acme", "own-acme", None),
        ("globex.requests", "globex", "own-globex", None),
        (
            "acme.requests",
            "globex",
            "globex-on-acme",
            Some("topic_not_allowed"),
        ),
        (
            requests_topic.as_str(),
            "acme",
            "acme-on-shared",
            Some("topic_not_allowed"),
        ),
    ];
    for (topic, tenant, key, _) in &cases {
        produce(topic, tenant, key);
    }
    let raw = read_until(&kafka, &kafka.config().results_topic.clone(), |r| {
        r.len() >= 4
    })
    .await;
    let results = dedupe(&raw);
    assert_eq!(results.len(), 4, "one result each: {results:#?}");
    for (_, _, key, refused_by) in cases {
        check_outcome(&results, &sim, key, refused_by);
    }
    tokio::task::block_in_place(|| sendledger_tests::process::stop_run(&mut run));
}

/// The request `key` (or, refused, a rejected input naming it) has one result: succeeded with
/// one record at the remote, or rejected by `refused_by` with nothing sent.
fn check_outcome(
    results: &[sendledger_core::TaskResult],
    sim: &Sim,
    key: &str,
    refused_by: Option<&str>,
) {
    let result = (results.iter())
        .find(|r| {
            r.request_key.as_deref() == Some(key)
                || r.reason.as_deref().is_some_and(|x| x.contains(key))
        })
        .unwrap_or_else(|| panic!("{key}: no result in {results:#?}"));
    let records = sim.records_with_identity(key).len();
    match refused_by {
        None => {
            assert_eq!(
                result.status,
                sendledger_core::ResultStatus::Succeeded,
                "{key}"
            );
            assert_eq!(records, 1, "{key}");
        }
        Some(rule) => {
            assert_eq!(
                result.status,
                sendledger_core::ResultStatus::Rejected,
                "{key}"
            );
            let reason = result.reason.as_deref().unwrap_or_default();
            assert!(reason.contains(rule), "{key}: {reason}");
            assert_eq!(records, 0, "{key}: nothing sent");
        }
    }
}
