//! Who may use the front door: callers with bearer tokens or client certificates, each for its
//! tenants, and `[access]`'s rules applied before anything is produced; TLS on the front door
//! and the admin endpoint.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use sendledger_node::config::Config;
use sendledger_sim::Faults;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{curl_with, setup, Answer, Front};

const SHOP: &str = "shop-token-6f1d0c3e9a7b4d2f8e5a1c0b9d8e7f6a";
const BATCH: &str = "batch-token-2b7c9e1f4a6d8c0e3f5b7a9d1c3e5f70";
const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const GLOBEX_TOPIC: &str = "sendledger.requests.globex";
const ACME_KEY: &str = "acme-signing-key-0123456789abcdef0123456789";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn request(tenant: &str, operation: &str, amount: u64) -> Value {
    json!({ "tenant": tenant, "operation": operation, "target": "sim", "payload": { "amount": amount } })
}

impl Front {
    /// A POST with `token` as a bearer token (none: no Authorization header), waiting 20 s.
    fn post_as(&self, token: Option<&str>, key: &str, body: &Value) -> Answer {
        let auth = token.map(|t| format!("Authorization: Bearer {t}"));
        let key = format!("Idempotency-Key: \"{key}\"");
        let mut headers = vec![key.as_str(), "Prefer: wait=20"];
        headers.extend(auth.as_deref());
        self.request("POST", "/v1/tasks", &headers, Some(body))
    }

    fn get_as(&self, token: &str, location: &str) -> Answer {
        let auth = format!("Authorization: Bearer {token}");
        self.request("GET", location, &[&auth], None)
    }
}

/// Two tenants under `[access]`: acme signs its requests and may ask for `payment.create`
/// only; globex has a requests topic of its own. Caller `shop` acts for acme (token from the
/// environment), `batch` for globex (configured by the token's hash). Each submits and reads
/// its tenant's tasks only; a request the rules refuse is 403 and records nothing; the
/// requests that pass reach the remote once each, though neither came on its tenant's topic
/// nor signed: the caller's credential stands for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_act_for_their_tenants_only_and_under_the_access_rules() {
    let (kafka, sim, dir) = setup(Faults::default()).await;
    // The service reaches the embedded cluster as external brokers: globex's topic exists
    // beforehand, as an administrator would create it with its ACLs.
    kafka.for_requests_topic(GLOBEX_TOPIC, "setup").unwrap();
    let env = [
        ("FRONT_SHOP_TOKEN", SHOP.to_string()),
        ("ACME_SIGNING_KEY", ACME_KEY.to_string()),
    ];
    let front = tokio::task::block_in_place(|| {
        Front::launch(
            dir.path(),
            kafka.bootstrap_servers(),
            &sim,
            &env,
            |c: &mut Config| {
                c.access = toml::from_str(&format!(
                    "[tenants.acme]\ntargets = [\"sim\"]\noperations = [\"payment.create\"]\n\
                     signing_keys_env = [\"ACME_SIGNING_KEY\"]\n\
                     [tenants.globex]\ntargets = [\"sim\"]\ntopic = \"{GLOBEX_TOPIC}\""
                ))
                .unwrap();
                c.front.callers = toml::from_str(&format!(
                    "[shop]\ntenants = [\"acme\"]\ntokens_env = [\"FRONT_SHOP_TOKEN\"]\n\
                 [batch]\ntenants = [\"globex\"]\ntoken_sha256 = [\"{}\"]",
                    hex(&Sha256::digest(BATCH))
                ))
                .unwrap();
            },
        )
    });
    tokio::task::block_in_place(|| {
        let payment = request("acme", "payment.create", 1);
        let anonymous = front.post_as(None, "c-1", &payment);
        assert_eq!(anonymous.status, 401, "{anonymous:?}");
        assert!(
            (anonymous.header("www-authenticate")).is_some_and(|v| v.starts_with("Bearer")),
            "{anonymous:?}"
        );
        let wrong = front.post_as(
            Some("not-a-token-of-anyone-0123456789abcd"),
            "c-1",
            &payment,
        );
        assert_eq!(wrong.status, 401, "{wrong:?}");

        let acme = front.post_as(Some(SHOP), "c-1", &payment);
        assert_eq!(acme.status, 201, "{acme:?}");
        assert_eq!(acme.json()["status"], "succeeded", "{acme:?}");
        let globex = front.post_as(Some(BATCH), "c-2", &request("globex", "payment.create", 2));
        assert_eq!(globex.status, 201, "{globex:?}");
        assert_eq!(globex.json()["status"], "succeeded", "{globex:?}");

        let other_tenant =
            front.post_as(Some(SHOP), "c-3", &request("globex", "payment.create", 3));
        assert_eq!(other_tenant.status, 403, "{other_tenant:?}");
        assert_eq!(
            other_tenant.json()["type"],
            "urn:sendledger:problem:tenant-not-allowed"
        );
        let refused = front.post_as(Some(SHOP), "c-4", &request("acme", "refund.create", 4));
        assert_eq!(refused.status, 403, "{refused:?}");
        assert_eq!(
            refused.json()["type"],
            "urn:sendledger:problem:access-refused"
        );
        assert!(
            (refused.json()["detail"].as_str())
                .is_some_and(|d| d.contains("operation_not_allowed")),
            "{refused:?}"
        );

        let location = |a: &Answer| format!("/v1/tasks/{}", a.json()["task_id"].as_str().unwrap());
        assert_eq!(front.get_as(BATCH, &location(&globex)).status, 200);
        assert_eq!(
            front.get_as(SHOP, &location(&globex)).status,
            404,
            "not shop's tenant"
        );
        assert_eq!(
            front.get(&location(&acme)).status,
            401,
            "reads need a caller too"
        );
    });
    assert_eq!(
        sim.records().len(),
        2,
        "the two allowed requests, once each"
    );
    assert_eq!(sim.stats().posts, 2);
    tokio::task::block_in_place(|| front.stop());
}

/// The front door over mutual TLS, with a caller known by its client certificate's
/// fingerprint, and the admin endpoint over TLS: a client whose certificate no caller holds is
/// 401, one without a certificate, or with one of another CA, never completes a request; a
/// plain-HTTP client of the admin endpoint gets no answer. The POST's `traceparent` is the
/// task's trace context.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_mutual_tls_a_caller_is_known_by_its_certificate() {
    let (kafka, sim, dir) = setup(Faults::default()).await;
    let ca = sendledger_tests::pki::Ca::new(dir.path(), "front");
    let server = ca.issue("server", &["127.0.0.1"]);
    let batch = ca.issue("batch", &["batch.test"]);
    let stranger = ca.issue("stranger", &["stranger.test"]);
    let other_ca = sendledger_tests::pki::Ca::new(dir.path(), "other");
    let forged = other_ca.issue("batch", &["batch.test"]);
    let der = CertificateDer::from_pem_file(&batch.cert).unwrap();
    let fingerprint = hex(&Sha256::digest(der.as_ref()));
    let tls: sendledger_node::tls::ListenerTlsConfig = toml::from_str(&format!(
        "cert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}",
        server.cert,
        server.key,
        ca.ca_file()
    ))
    .unwrap();
    let mut front = tokio::task::block_in_place(|| {
        Front::launch(
            dir.path(),
            kafka.bootstrap_servers(),
            &sim,
            &[],
            |c: &mut Config| {
                c.front.tls = Some(tls.clone());
                c.front.callers = toml::from_str(&format!(
                    "[batch]\ncertificate_sha256 = [\"{fingerprint}\"]"
                ))
                .unwrap();
                c.admin.enabled = true;
                c.admin.listen = "127.0.0.1:0".parse().unwrap();
                c.admin.tls = Some(sendledger_node::tls::ListenerTlsConfig {
                    client_ca_file: None,
                    ..tls.clone()
                });
            },
        )
    });
    assert!(front.url.starts_with("https://127.0.0.1:"), "{}", front.url);
    let ca_file = ca.ca_file().display().to_string();
    let with_cert = |issued: &sendledger_tests::pki::Issued| {
        vec![
            "--cacert".to_string(),
            ca_file.clone(),
            "--cert".into(),
            issued.cert.display().to_string(),
            "--key".into(),
            issued.key.display().to_string(),
        ]
    };
    let mut task_id = String::new();
    tokio::task::block_in_place(|| {
        front.options = with_cert(&batch);
        let headers = [
            "Idempotency-Key: m-1",
            "Prefer: wait=20",
            &*format!("traceparent: {TRACE}"),
        ];
        let body = request("acme", "payment.create", 1);
        let answer = front.request("POST", "/v1/tasks", &headers, Some(&body));
        assert_eq!(answer.status, 201, "{answer:?}");
        assert_eq!(answer.json()["status"], "succeeded");
        task_id = answer.json()["task_id"].as_str().unwrap().to_string();
        front.options = with_cert(&stranger);
        let unknown = front.post(Some("m-2"), &request("acme", "payment.create", 2), Some(20));
        assert_eq!(unknown.status, 401, "{unknown:?}");
        for options in [
            vec!["--cacert".to_string(), ca_file.clone()],
            with_cert(&forged),
        ] {
            let mut cmd = std::process::Command::new("curl");
            cmd.args(&options)
                .args(["-s", "--max-time", "20", "-X", "POST"])
                .arg(format!("{}/v1/tasks", front.url))
                .args(["-H", "Idempotency-Key: m-3", "--data-binary"])
                .arg(request("acme", "payment.create", 3).to_string());
            let out = cmd.output().unwrap();
            assert!(!out.status.success(), "{options:?} got an answer: {out:?}");
        }
    });
    let admin = sendledger_tests::ready_field(&front.ready, "admin=");
    assert!(admin.starts_with("https://"), "{admin}");
    tokio::task::block_in_place(|| {
        let options = ["--cacert".to_string(), ca_file.clone()];
        let health = curl_with(&options, "GET", &format!("{admin}/healthz"), &[], None);
        assert_eq!(health.status, 200, "{health:?}");
        // The caller's trace context reached the task, as a producer's does on Kafka.
        let task = curl_with(
            &options,
            "GET",
            &format!("{admin}/tasks/{task_id}"),
            &[],
            None,
        );
        assert_eq!(
            task.json()["request"]["metadata"]["traceparent"],
            TRACE,
            "{task:?}"
        );
        let plain = admin.replacen("https://", "http://", 1);
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "10",
            ])
            .arg(format!("{plain}/healthz"))
            .output()
            .unwrap();
        let code = String::from_utf8_lossy(&out.stdout);
        assert!(
            code != "200",
            "plain HTTP answered by a TLS listener: {out:?}"
        );
    });
    assert_eq!(sim.records().len(), 1, "only the known caller's request");
    tokio::task::block_in_place(|| front.stop());
}
