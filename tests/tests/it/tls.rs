//! https targets against the simulated remote speaking TLS, with certificates made at test
//! time: one test per classification row, each counting the records at the remote. A failed
//! handshake is not sent (no record can exist); once request bytes were handed to TLS, a broken
//! or silent connection is unknown. Plus mutual TLS, pooling, lookups and load errors.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sendledger_core::{NotSentCause, UnknownCause};
use sendledger_effects::{AttemptOutcome, Sending, Target, TargetConfig};
use sendledger_sim::{Faults, Sim, SimConfig, SimTlsConfig};
use sendledger_tests::pki::{Ca, Issued};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

use sendledger_tests::effects::{config, faults, request};

/// A simulated remote on https with a certificate for `localhost` and `127.0.0.1` signed by
/// its own CA, and the directory holding the files.
struct Remote {
    sim: Sim,
    ca: Ca,
    dir: tempfile::TempDir,
}

impl Remote {
    async fn start(faults: Faults) -> Remote {
        Remote::start_with(faults, |_, _| {}).await
    }

    /// As [`Remote::start`], with the certificate issued by `issue` instead (the CA and
    /// directory are given) and the simulator's configuration adjusted.
    async fn start_with(faults: Faults, adjust: impl FnOnce(&Path, &mut SimConfig)) -> Remote {
        Remote::start_issued(
            faults,
            |ca| ca.issue("server", &["localhost", "127.0.0.1"]),
            adjust,
        )
        .await
    }

    async fn start_issued(
        faults: Faults,
        issue: impl FnOnce(&Ca) -> Issued,
        adjust: impl FnOnce(&Path, &mut SimConfig),
    ) -> Remote {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new(dir.path(), "remote");
        let server = issue(&ca);
        let mut config = SimConfig {
            faults,
            tls: Some(SimTlsConfig {
                cert_file: server.cert,
                key_file: server.key,
                client_ca_file: None,
            }),
            ..SimConfig::default()
        };
        adjust(dir.path(), &mut config);
        let sim = Sim::start(config).await.expect("sim starts with tls");
        assert!(sim.create_url().starts_with("https://127.0.0.1:"));
        Remote { sim, ca, dir }
    }

    /// One attempt of the task `ord-1` by a target that trusts the remote's CA.
    async fn attempt(&self) -> AttemptOutcome {
        self.target("")
            .execute(&request("ord-1", json!({})), 1, None)
            .await
    }

    /// A target against the remote that trusts its CA; `extra` as in `effects::config`.
    fn target(&self, extra: &str) -> Target {
        self.target_with_tls(&trust(&self.ca), extra)
    }

    /// A target against the remote with this `tls` inline table's contents.
    fn target_with_tls(&self, tls: &str, extra: &str) -> Target {
        Target::from_config("payments", &self.config(tls, extra)).expect("valid test target")
    }

    fn config(&self, tls: &str, extra: &str) -> TargetConfig {
        config(&self.sim, &format!("tls = {{ {tls} }}\n{extra}"))
    }
}

/// The `tls` table's keys that trust `ca`.
fn trust(ca: &Ca) -> String {
    format!("ca_file = {:?}", ca.ca_file())
}

/// Asserts a `NotSent{Connect}` whose reason contains every one of `words`.
fn assert_not_sent(outcome: &AttemptOutcome, words: &[&str]) {
    match outcome {
        AttemptOutcome::NotSent {
            cause: NotSentCause::Connect(reason),
            retry_after_ms: None,
        } => {
            for word in words {
                assert!(reason.contains(word), "`{word}` not in: {reason}");
            }
        }
        other => panic!("expected NotSent{{Connect}}, got {other:?}"),
    }
}

/// Asserts an unknown outcome: the connection broke after request bytes were handed to TLS.
fn assert_reset_after_write(outcome: &AttemptOutcome) {
    assert!(
        matches!(
            outcome,
            AttemptOutcome::Unknown {
                cause: UnknownCause::ResetAfterWrite(_)
            }
        ),
        "{outcome:?}"
    );
}

/// Waits until the remote has seen `n` failed handshakes (it learns of a refusal a moment
/// after the client gave up).
async fn await_failed_handshakes(sim: &Sim, n: u64) {
    for _ in 0..500 {
        if sim.stats().handshakes_failed == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "expected {n} failed handshakes, the remote saw {}",
        sim.stats().handshakes_failed
    );
}

// ---- Not sent: the handshake never completed, no request byte was written ----

#[tokio::test]
async fn https_connection_refused_is_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "remote");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"https://{addr}/records\"\nconnect_timeout = \"1s\"\ntls = {{ {} }}",
        trust(&ca)
    ))
    .unwrap();
    let target = Target::from_config("payments", &cfg).unwrap();
    let outcome = target.execute(&request("k1", json!({})), 1, None).await;
    assert_not_sent(&outcome, &["connect to"]);
}

#[tokio::test]
async fn https_unknown_ca_is_not_sent_and_nothing_reaches_the_remote() {
    let remote = Remote::start(Faults::default()).await;
    let other = Ca::new(remote.dir.path(), "other");
    // Trusting another private CA, and trusting the public roots (no tls section).
    let trusting_other = remote.target_with_tls(&trust(&other), "");
    let outcome = trusting_other
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_not_sent(&outcome, &["tls handshake with", "UnknownIssuer"]);
    let public_roots = Target::from_config("payments", &config(&remote.sim, "")).unwrap();
    let outcome = public_roots
        .execute(&request("ord-1", json!({})), 2, None)
        .await;
    assert_not_sent(&outcome, &["tls handshake with", "UnknownIssuer"]);
    await_failed_handshakes(&remote.sim, 2).await;
    let stats = remote.sim.stats();
    assert_eq!((stats.records, stats.requests), (0, 0), "{stats:?}");
}

#[tokio::test]
async fn https_wrong_host_name_is_not_sent() {
    let remote = Remote::start_issued(
        Faults::default(),
        |ca| ca.issue("elsewhere", &["elsewhere.test"]),
        |_, _| {},
    )
    .await;
    let outcome = remote.attempt().await;
    assert_not_sent(&outcome, &["tls handshake with", "not valid for name"]);
    await_failed_handshakes(&remote.sim, 1).await;
    assert_eq!(remote.sim.stats().records, 0);
    assert_eq!(remote.sim.stats().requests, 0);
}

#[tokio::test]
async fn https_expired_certificate_is_not_sent() {
    let remote = Remote::start_issued(
        Faults::default(),
        |ca| {
            ca.issue_with("expired", &["127.0.0.1"], |params| {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            })
        },
        |_, _| {},
    )
    .await;
    let outcome = remote.attempt().await;
    assert_not_sent(&outcome, &["tls handshake with", "expired"]);
    assert_eq!(remote.sim.stats().records, 0);
}

/// An https target pointed at a remote that speaks plain HTTP: the handshake fails on the
/// remote's first answer; the remote never sees a request.
#[tokio::test]
async fn https_to_a_remote_without_tls_is_not_sent() {
    let plain = Sim::start(SimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "remote");
    let url = plain.create_url().replace("http://", "https://");
    let target = Target::from_config(
        "payments",
        &config(
            &plain,
            &format!("url = \"{url}\"\ntls = {{ {} }}", trust(&ca)),
        ),
    )
    .unwrap();
    let outcome = target.execute(&request("ord-1", json!({})), 1, None).await;
    assert_not_sent(&outcome, &["tls handshake with"]);
    assert_eq!(plain.stats().records, 0);
    assert_eq!(plain.stats().posts, 0);
}

/// A remote that accepts the connection and never answers the ClientHello: the handshake does
/// not complete within `connect_timeout`, and only handshake bytes were written.
#[tokio::test]
async fn https_handshake_timeout_is_not_sent() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "remote");
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"https://{addr}/records\"\nconnect_timeout = \"300ms\"\ntls = {{ {} }}",
        trust(&ca)
    ))
    .unwrap();
    let target = Target::from_config("payments", &cfg).unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        target.execute(&request("ord-1", json!({})), 1, None),
    )
    .await
    .expect("the connect timeout ends the handshake");
    assert_not_sent(
        &outcome,
        &["tls handshake with", "not complete within 300ms"],
    );
    silent.abort();
}

#[tokio::test]
async fn https_throttled_429_with_retry_after_is_not_sent() {
    let remote = Remote::start(faults(|f| {
        f.throttle = 1.0;
        f.retry_after = Duration::from_secs(2);
    }))
    .await;
    let outcome = remote.attempt().await;
    assert_eq!(
        outcome,
        AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: 429 },
            retry_after_ms: Some(2_000)
        }
    );
    assert_eq!(remote.sim.stats().records, 0);
    assert_eq!(remote.sim.stats().throttled, 1);
}

// ---- Succeeded and rejected: an answer ----

#[tokio::test]
async fn https_created_2xx_is_succeeded_with_the_remote_id() {
    let remote = Remote::start(Faults::default()).await;
    let outcome = remote
        .target("")
        .execute(&request("ord-1", json!({"amount": 5})), 1, None)
        .await;
    let records = remote.sim.records_with_identity("ord-1");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body["amount"], json!(5));
    assert_eq!(
        outcome,
        AttemptOutcome::Succeeded {
            remote_id: records[0].id.clone(),
            status: 201,
            answer: Default::default(),
        }
    );
}

#[tokio::test]
async fn https_4xx_is_rejected() {
    let remote = Remote::start(faults(|f| {
        f.reject = 1.0;
        f.reject_status = 422;
    }))
    .await;
    match remote.attempt().await {
        AttemptOutcome::Rejected { status, detail } => {
            assert_eq!(status, 422);
            assert!(detail.contains("rejected by the remote"), "{detail}");
        }
        other => panic!("expected rejected, got {other:?}"),
    }
    assert_eq!(remote.sim.stats().records, 0);
    assert_eq!(remote.sim.stats().rejected, 1);
}

// ---- Unknown: request bytes handed to TLS, no complete answer ----

#[tokio::test]
async fn https_5xx_is_unknown_by_default() {
    let remote = Remote::start(faults(|f| f.commit_then_error = 1.0)).await;
    let outcome = remote.attempt().await;
    assert_eq!(
        outcome,
        AttemptOutcome::Unknown {
            cause: UnknownCause::Status(500)
        }
    );
    assert_eq!(remote.sim.records_with_identity("ord-1").len(), 1);
}

#[tokio::test]
async fn https_commit_then_drop_is_unknown_and_the_remote_holds_exactly_one_record() {
    let remote = Remote::start(faults(|f| f.commit_then_drop = 1.0)).await;
    let target = remote.target("");
    let req = request("ord-1", json!({}));
    let outcome = target.execute(&req, 1, None).await;
    assert_reset_after_write(&outcome);
    assert_eq!(remote.sim.records_with_identity("ord-1").len(), 1);
    assert_eq!(remote.sim.stats().dropped, 1);
    // The lookup, over https too, finds that record and reconciles the attempt.
    let found = target.lookup(&req, None).await.unwrap();
    assert_eq!(
        found,
        [remote.sim.records_with_identity("ord-1")[0].id.clone()]
    );
}

#[tokio::test]
async fn https_commit_then_hang_is_unknown_after_the_request_timeout() {
    let remote = Remote::start(faults(|f| f.commit_then_hang = 1.0)).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        remote
            .target("request_timeout = \"300ms\"")
            .execute(&request("ord-1", json!({})), 1, None),
    )
    .await
    .expect("the request timeout ends the attempt");
    assert_eq!(
        outcome,
        AttemptOutcome::Unknown {
            cause: UnknownCause::Timeout
        }
    );
    assert_eq!(remote.sim.records_with_identity("ord-1").len(), 1);
    assert_eq!(remote.sim.stats().hung, 1);
}

/// The remote completes the handshake, waits for the request and closes unanswered: the
/// request was written, so the outcome is unknown although nothing was created.
#[tokio::test]
async fn https_refused_after_the_handshake_is_unknown_and_nothing_was_created() {
    let remote = Remote::start(faults(|f| f.refuse = 1.0)).await;
    let outcome = remote.attempt().await;
    assert_reset_after_write(&outcome);
    assert_eq!(remote.sim.stats().records, 0);
    assert_eq!(remote.sim.stats().refused, 1);
}

// ---- Connections and mutual TLS ----

/// On a runtime with several threads, so a connection's task may not have been polled again
/// yet when its answer has been read and it goes back to the pool: it is kept all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_idle_connections_are_reused_only_when_pooling_is_on() {
    let remote = Remote::start(Faults::default()).await;
    let pooled = remote.target("");
    for i in 0..50 {
        let outcome = pooled
            .execute(&request(&format!("p-{i}"), json!({})), 1, None)
            .await;
        assert!(
            matches!(outcome, AttemptOutcome::Succeeded { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(remote.sim.stats().connections, 1);
    let fresh = remote.target("pool_idle_timeout = \"0s\"");
    for i in 0..10 {
        let outcome = fresh
            .execute(&request(&format!("f-{i}"), json!({})), 1, None)
            .await;
        assert!(
            matches!(outcome, AttemptOutcome::Succeeded { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(remote.sim.stats().connections, 11);
    assert_eq!(remote.sim.stats().records, 60);
}

/// The remote requires a client certificate from its clients' CA. A target presenting one
/// creates its record (reaching the remote by DNS name, `localhost`); a target without one
/// creates nothing.
#[tokio::test]
async fn mutual_tls_a_required_client_certificate_is_presented() {
    let mut client = None;
    let remote = Remote::start_with(Faults::default(), |dir, config| {
        let clients = Ca::new(dir, "clients");
        client = Some(clients.issue("sendledger", &["sendledger.test"]));
        if let Some(tls) = &mut config.tls {
            tls.client_ca_file = Some(clients.ca_file());
        }
    })
    .await;
    let client = client.unwrap();
    let url = remote.sim.create_url().replace("127.0.0.1", "localhost");
    let with_cert = remote.target_with_tls(
        &format!(
            "{}, client_cert = {:?}, client_key = {:?}",
            trust(&remote.ca),
            client.cert,
            client.key
        ),
        &format!("url = \"{url}\""),
    );
    let outcome = with_cert
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    let records = remote.sim.records_with_identity("ord-1");
    assert_eq!(records.len(), 1);
    assert_eq!(
        outcome,
        AttemptOutcome::Succeeded {
            remote_id: records[0].id.clone(),
            status: 201,
            answer: Default::default(),
        }
    );

    // Without a certificate: refused in the handshake. Under TLS 1.3 the client's handshake
    // is complete before the remote checks its certificate, so the request may have been
    // handed to TLS already: not sent or unknown, never succeeded, and nothing created.
    let without = remote.target("");
    let outcome = without.execute(&request("ord-2", json!({})), 1, None).await;
    assert!(
        matches!(
            outcome,
            AttemptOutcome::NotSent {
                cause: NotSentCause::Connect(_),
                ..
            } | AttemptOutcome::Unknown {
                cause: UnknownCause::ResetAfterWrite(_)
            }
        ),
        "{outcome:?}"
    );
    await_failed_handshakes(&remote.sim, 1).await;
    assert_eq!(remote.sim.stats().records, 1);
    assert!(remote.sim.records_with_identity("ord-2").is_empty());
}

// ---- Configuration ----

#[test]
fn tls_config_errors_name_the_field_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "remote");
    let one = ca.issue("one", &["one.test"]);
    let two = ca.issue("two", &["two.test"]);
    let not_pem = dir.path().join("not-pem.txt");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let cases: Vec<(String, &str)> = vec![
        (
            format!("ca_file = {missing:?}"),
            "targets.t.tls.ca_file: cannot read",
        ),
        (format!("ca_file = {not_pem:?}"), "targets.t.tls.ca_file: `"),
        (
            format!("client_cert = {:?}", one.cert),
            "targets.t.tls.client_key: is missing",
        ),
        (
            format!("client_key = {:?}", one.key),
            "targets.t.tls.client_cert: is missing",
        ),
        (
            format!("client_cert = {:?}, client_key = {:?}", one.cert, two.key),
            "targets.t.tls.client_key: `",
        ),
        (
            format!("client_cert = {:?}, client_key = {missing:?}", one.cert),
            "targets.t.tls.client_key: `",
        ),
        (
            format!("client_cert = {:?}, client_key = {:?}", one.cert, one.cert),
            "targets.t.tls.client_key: `",
        ),
    ];
    let reasons = [
        "no such file",
        "holds no certificate",
        "client_cert needs",
        "client_key needs",
        "is not the private key of the certificate",
        "cannot be read",
        "holds no private key",
    ];
    for ((tls, expected), reason) in cases.iter().zip(reasons) {
        let cfg: TargetConfig = toml::from_str(&format!(
            "url = \"https://127.0.0.1:9/records\"\ntls = {{ {tls} }}"
        ))
        .unwrap();
        let err = Target::from_config("t", &cfg).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{tls}: {err}");
        assert!(err.to_lowercase().contains(reason), "{tls}: {err}");
    }
    // A tls section on a target without any https URL is a mistake, not a silent no-op.
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"http://127.0.0.1:9/records\"\ntls = {{ {} }}",
        trust(&ca)
    ))
    .unwrap();
    let err = Target::from_config("t", &cfg).unwrap_err().to_string();
    assert!(
        err.starts_with("targets.t.tls: applies to https:// URLs only"),
        "{err}"
    );
    // A valid private CA with mutual TLS loads, for the attempt and the lookup URL alike.
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"https://[::1]:8443/records\"\nbody_fields = {{ reference = \"{{task_id}}\" }}\n\
         lookup = {{ url = \"https://remote.test/records?reference={{task_id}}\" }}\n\
         tls = {{ {}, client_cert = {:?}, client_key = {:?} }}",
        trust(&ca),
        one.cert,
        one.key
    ))
    .unwrap();
    Target::from_config("t", &cfg).unwrap();
}

// ---- Kafka mode's send lease ----

/// Forwards connections on a loopback port to `upstream`, each only after `delay`: a remote
/// slow to complete the TLS handshake.
async fn slow_relay(upstream: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    addr
}

/// The send lease ends while the TLS handshake is still under way (the remote completes it
/// only after 600ms): the handshake completes, and the request's first write is refused at the
/// connection. Not sent, the lease named, and no request reaches the remote. The same target
/// through the same slow remote without a lease succeeds, so the relay passes requests.
#[tokio::test]
async fn a_send_lease_that_ends_during_the_handshake_sends_nothing() {
    let remote = Remote::start(Faults::default()).await;
    let relay = slow_relay(remote.sim.addr(), Duration::from_millis(600)).await;
    let mut cfg = remote.config(&trust(&remote.ca), "connect_timeout = \"5s\"");
    cfg.url = format!("https://{relay}/records");
    let target = Target::from_config("payments", &cfg).unwrap();

    let lease = Sending {
        first_byte_by: Some(std::time::Instant::now() + Duration::from_millis(200)),
        ..Sending::default()
    };
    let outcome = target
        .execute_with(&request("late-1", json!({})), 1, None, lease)
        .await;
    match &outcome {
        AttemptOutcome::NotSent {
            cause: NotSentCause::LocalResources(reason),
            retry_after_ms: None,
        } => assert!(reason.starts_with("send lease expired"), "{reason}"),
        other => panic!("expected NotSent{{LocalResources}}, got {other:?}"),
    }
    assert_eq!(remote.sim.stats().connections, 1, "the handshake completed");
    assert_eq!(remote.sim.stats().posts, 0);

    let outcome = target.execute(&request("late-2", json!({})), 1, None).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(remote.sim.stats().posts, 1);
    assert!(remote.sim.records_with_identity("late-1").is_empty());
}

/// A pooled connection is not used once the lease is over: nothing is written, and the
/// connection stays usable for the next attempt.
#[tokio::test]
async fn a_lapsed_send_lease_writes_nothing_on_a_pooled_connection() {
    let remote = Remote::start(Faults::default()).await;
    let target = remote.target("");
    let outcome = target.execute(&request("p-1", json!({})), 1, None).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    let lapsed = Sending {
        first_byte_by: Some(std::time::Instant::now()),
        ..Sending::default()
    };
    let outcome = target
        .execute_with(&request("p-2", json!({})), 1, None, lapsed)
        .await;
    assert!(
        matches!(&outcome, AttemptOutcome::NotSent { cause: NotSentCause::LocalResources(r), .. } if r.starts_with("send lease expired")),
        "{outcome:?}"
    );
    let outcome = target.execute(&request("p-3", json!({})), 1, None).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(remote.sim.stats().posts, 2);
    assert_eq!(remote.sim.stats().connections, 1);
    assert!(remote.sim.records_with_identity("p-2").is_empty());
}

// ---- A pooled connection ended by the remote as a request is written on it ----

/// How the relay ends a connection.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `close_notify` and FIN; it goes on reading, so request bytes that still arrive are seen.
    CloseNotify,
    /// FIN without `close_notify` (a remote that just closes its socket); it goes on reading.
    Fin,
    /// A reset: what arrives afterwards cannot be seen.
    Reset,
}

/// When the relay ends the connection that answered a first request.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// This long after it relayed the first answer, whatever the client is doing then.
    Idle(Duration),
    /// As soon as the first bytes of a second request arrive; that request is not forwarded.
    FirstBytes,
    /// Once a second request arrived whole and the remote answered it (its record exists); the
    /// answer is not relayed.
    Answered,
}

/// What the relay saw of the second request on a connection it ended: plaintext bytes, and
/// whether it saw everything the client wrote (not after a reset).
#[derive(Debug, Clone, Copy)]
struct Seen {
    bytes: usize,
    complete: bool,
}

/// A TLS-terminating relay in front of the plain-http simulated remote. Each new connection
/// takes the next plan, if there is one: it relays one exchange, ends the connection as planned
/// and reports what it saw of a second request. Connections without a plan relay everything.
struct Relay {
    addr: std::net::SocketAddr,
    /// Connections accepted so far.
    connections: Arc<std::sync::atomic::AtomicUsize>,
    plans: Arc<Mutex<VecDeque<(Moment, Ending)>>>,
    seen: tokio::sync::mpsc::UnboundedReceiver<Seen>,
}

impl Relay {
    async fn start(upstream: std::net::SocketAddr, acceptor: TlsAcceptor) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let plans: Arc<Mutex<VecDeque<(Moment, Ending)>>> = Arc::default();
        let (report, seen) = tokio::sync::mpsc::unbounded_channel();
        let next = plans.clone();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let plan = next.lock().unwrap().pop_front();
                let (acceptor, report) = (acceptor.clone(), report.clone());
                tokio::spawn(async move {
                    let seen = relay_connection(tcp, acceptor, upstream, plan).await;
                    if let Some(seen) = seen {
                        let _ = report.send(seen);
                    }
                });
            }
        });
        Relay {
            addr,
            connections,
            plans,
            seen,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The plan of the next connection opened to the relay.
    fn plan(&self, moment: Moment, ending: Ending) {
        self.plans.lock().unwrap().push_back((moment, ending));
    }

    /// What the planned connection saw of its second request, once it ended.
    async fn seen(&mut self) -> Seen {
        tokio::time::timeout(Duration::from_secs(20), self.seen.recv())
            .await
            .expect("the relay reports what it saw")
            .unwrap()
    }
}

/// Relays one connection (see [`Relay`]); with a plan, returns what it saw of the second
/// request.
async fn relay_connection(
    tcp: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    upstream: std::net::SocketAddr,
    plan: Option<(Moment, Ending)>,
) -> Option<Seen> {
    let _ = tcp.set_nodelay(true);
    let mut tls = acceptor
        .accept(tcp)
        .await
        .expect("the client completes the handshake");
    let mut remote = tokio::net::TcpStream::connect(upstream).await.unwrap();
    let (mut from_client, mut from_remote) = (Vec::new(), Vec::new());
    let Some((moment, ending)) = plan else {
        // Until either side ends the connection.
        while let Some(request) = read_message(&mut tls, &mut from_client).await {
            remote.write_all(&request).await.unwrap();
            let answer = read_message(&mut remote, &mut from_remote).await.unwrap();
            if tls.write_all(&answer).await.is_err() {
                break;
            }
        }
        return None;
    };
    let request = read_message(&mut tls, &mut from_client).await.unwrap();
    remote.write_all(&request).await.unwrap();
    let answer = read_message(&mut remote, &mut from_remote).await.unwrap();
    tls.write_all(&answer).await.unwrap();
    tls.flush().await.unwrap();
    let before_end = match moment {
        Moment::Idle(after) => {
            spin(after).await;
            0
        }
        Moment::FirstBytes => {
            let mut chunk = [0u8; 1];
            tls.read(&mut chunk).await.unwrap_or(0)
        }
        Moment::Answered => {
            let Some(request) = read_message(&mut tls, &mut from_client).await else {
                // The client ended the connection without a whole second request.
                return Some(Seen {
                    bytes: from_client.len(),
                    complete: true,
                });
            };
            remote.write_all(&request).await.unwrap();
            read_message(&mut remote, &mut from_remote).await.unwrap();
            request.len()
        }
    };
    match ending {
        Ending::Reset => {
            tls.get_ref().0.set_zero_linger().unwrap();
            return Some(Seen {
                bytes: before_end,
                complete: false,
            });
        }
        Ending::CloseNotify => {
            let _ = tls.shutdown().await;
        }
        Ending::Fin => {
            let _ = tls.get_mut().0.shutdown().await;
        }
    }
    // Whatever the client still writes arrives before its own end of the connection.
    let mut bytes = before_end;
    let mut chunk = [0u8; 16384];
    while let Ok(Ok(n @ 1..)) =
        tokio::time::timeout(Duration::from_secs(10), tls.read(&mut chunk)).await
    {
        bytes += n;
    }
    Some(Seen {
        bytes,
        complete: true,
    })
}

/// Reads one HTTP/1.1 message (its body by `content-length`) from `io`, after what `buf`
/// holds already; leaves what follows it in `buf`. `None` when the stream ends first.
async fn read_message<S: AsyncRead + Unpin>(io: &mut S, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).unwrap();
            let body = head
                .lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
                .map_or(0, |(_, value)| value.trim().parse::<usize>().unwrap());
            let total = end + 4 + body;
            if buf.len() >= total {
                let rest = buf.split_off(total);
                return Some(std::mem::replace(buf, rest));
            }
        }
        let mut chunk = [0u8; 16384];
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Waits `d` without sleeping (timers are too coarse for the race's microseconds).
async fn spin(d: Duration) {
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        tokio::task::yield_now().await;
    }
}

/// A relay in front of a plain-http simulated remote, with a certificate from `ca`, and a
/// target configuration against it (pooled connections) that trusts `ca`.
async fn relayed_remote(ca: &Ca) -> (Sim, Relay, TargetConfig) {
    let sim = sendledger_tests::effects::start_sim(Faults::default()).await;
    let issued = ca.issue("relay", &["127.0.0.1"]);
    let relay = Relay::start(sim.addr(), acceptor(&issued)).await;
    let mut cfg = config(&sim, &format!("tls = {{ {} }}", trust(ca)));
    cfg.url = format!("https://{}/records", relay.addr);
    (sim, relay, cfg)
}

fn acceptor(issued: &Issued) -> TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(&issued.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&issued.key).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    TlsAcceptor::from(Arc::new(server))
}

/// Checks one race: the first request `warm` went through the relay on a connection that the
/// relay then ended at `moment`, and `outcome` is the attempt of `key` that followed on the
/// pooled connection. Returns the outcome's class.
fn check_race(
    sim: &Sim,
    moment: Moment,
    ending: Ending,
    key: &str,
    outcome: &AttemptOutcome,
    seen: Seen,
    posts: u64,
) -> &'static str {
    let records = sim.records_with_identity(key).len();
    let context =
        format!("{moment:?}, {ending:?}: {outcome:?}, relay saw {seen:?}, {records} records");
    let class = match outcome {
        AttemptOutcome::NotSent {
            cause: NotSentCause::Connect(_),
            ..
        } => {
            // Nothing of the request left: the relay saw none of it, nothing was created.
            assert_eq!(
                seen.bytes, 0,
                "not sent, yet request bytes arrived: {context}"
            );
            assert_eq!(records, 0, "{context}");
            "not sent"
        }
        AttemptOutcome::Unknown { .. } => {
            // Written on the ended connection: the relay forwarded it only when planned to.
            if seen.complete {
                assert!(
                    seen.bytes > 0,
                    "unknown, yet no request byte arrived: {context}"
                );
            }
            let forwarded = usize::from(matches!(moment, Moment::Answered));
            assert_eq!(records, forwarded, "{context}");
            "unknown"
        }
        AttemptOutcome::Succeeded { .. } => {
            // The client saw the connection end and opened another: nothing on the old one.
            assert_eq!(seen.bytes, 0, "{context}");
            assert_eq!(records, 1, "{context}");
            "succeeded on a new connection"
        }
        other => panic!("unexpected outcome {other:?} ({context})"),
    };
    // Never sent twice: one POST at most reached the remote, none when nothing was created.
    assert_eq!(posts, records as u64, "posts at the remote: {context}");
    class
}

/// The remote ends an idle pooled connection (`close_notify`, a bare FIN or a reset) at a
/// seeded moment around the instant the next request is written on it. Whichever comes first,
/// an attempt is "not sent" only when no byte of its request arrived and nothing was created,
/// and "unknown" only when request bytes arrived (as far as the relay can see); a client that
/// noticed the end in time succeeds on a new connection. No request is ever sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_ended_as_a_request_is_written_is_never_not_sent_once_bytes_left() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "relay");
    let (sim, mut relay, cfg) = relayed_remote(&ca).await;
    let mut rng = StdRng::seed_from_u64(20_260_512);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..240 {
        let ending = [Ending::CloseNotify, Ending::Fin, Ending::Reset][i % 3];
        let relay_after = Duration::from_micros(rng.random_range(0..=1_500));
        let client_after = Duration::from_micros(rng.random_range(0..=1_500));
        relay.plan(Moment::Idle(relay_after), ending);
        let target = Target::from_config("payments", &cfg).unwrap();
        let warm = target
            .execute(&request(&format!("warm-{i}"), json!({})), 1, None)
            .await;
        assert!(matches!(warm, AttemptOutcome::Succeeded { .. }), "{warm:?}");
        let posts = sim.stats().posts;
        spin(client_after).await;
        let key = format!("race-{i}");
        let outcome = target.execute(&request(&key, json!({})), 1, None).await;
        let seen = relay.seen().await;
        let posts = sim.stats().posts - posts;
        let class = check_race(
            &sim,
            Moment::Idle(relay_after),
            ending,
            &key,
            &outcome,
            seen,
            posts,
        );
        *tally.entry(format!("{ending:?}: {class}")).or_default() += 1;
    }
    eprintln!("outcomes over the seeded schedule: {tally:?}");
}

/// The remote ends the pooled connection on the first bytes of the next request (not
/// forwarded: nothing created), or after that request was answered by the remote (its record
/// exists) without relaying the answer. Either way bytes were written: unknown, with the
/// remote's records counted (none, or exactly one). Small requests and requests of several TLS
/// records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_ended_after_request_bytes_arrived_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "relay");
    let (sim, mut relay, cfg) = relayed_remote(&ca).await;
    let large = "x".repeat(60_000);
    let mut i = 0;
    for moment in [Moment::FirstBytes, Moment::Answered] {
        for ending in [Ending::CloseNotify, Ending::Fin, Ending::Reset] {
            for payload in [json!({}), json!({ "memo": large })] {
                i += 1;
                relay.plan(moment, ending);
                let target = Target::from_config("payments", &cfg).unwrap();
                let warm = target
                    .execute(&request(&format!("warm-{i}"), json!({})), 1, None)
                    .await;
                assert!(matches!(warm, AttemptOutcome::Succeeded { .. }), "{warm:?}");
                let posts = sim.stats().posts;
                let connections = relay.connections();
                let key = format!("race-{i}");
                let outcome = target.execute(&request(&key, payload), 1, None).await;
                let seen = relay.seen().await;
                assert_eq!(
                    relay.connections(),
                    connections,
                    "the pooled connection was not reused: {moment:?}, {ending:?}, {outcome:?}"
                );
                let posts = sim.stats().posts - posts;
                let class = check_race(&sim, moment, ending, &key, &outcome, seen, posts);
                assert_eq!(class, "unknown", "{moment:?}, {ending:?}: {outcome:?}");
                assert!(seen.bytes > 0);
            }
        }
    }
}
