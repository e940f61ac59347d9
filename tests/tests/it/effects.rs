//! Attempt classification and lookups over real sockets, against the simulated remote: one
//! test per row of `docs/classification.md` and per injected fault. Every test checks the
//! remote's ground truth (its records) as well as the outcome.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sendledger_core::{Limits, NotSentCause, TaskRequest, UnknownCause};
use sendledger_effects::{AttemptOutcome, Target, TargetConfig, Targets};
use sendledger_sim::{Faults, RequiredHeader, Sim, SimConfig};
use sendledger_tests::effects::{config, faults, request, start_sim, target};
use serde_json::json;

/// Polls until the sim holds `n` records with this identity (work that finishes after the
/// client gave up), or panics after a generous bound.
async fn await_records(sim: &Sim, key: &str, n: usize) {
    for _ in 0..500 {
        if sim.records_with_identity(key).len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "expected {n} records for {key}, have {}",
        sim.records_with_identity(key).len()
    );
}

fn unknown(cause: UnknownCause) -> AttemptOutcome {
    AttemptOutcome::Unknown { cause }
}

// ---- NotSent: nothing written ----

#[tokio::test]
async fn connection_refused_port_closed_is_not_sent() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"http://{addr}/records\"\nconnect_timeout = \"1s\""
    ))
    .unwrap();
    let target = Target::from_config("payments", &cfg).unwrap();
    match target
        .execute(&request("k1", json!({"amount": 1})), 1, None)
        .await
    {
        AttemptOutcome::NotSent {
            cause: NotSentCause::Connect(reason),
            retry_after_ms: None,
        } => assert!(reason.contains("connect to"), "{reason}"),
        other => panic!("expected NotSent, got {other:?}"),
    }
}

/// A name that cannot resolve (`.invalid` is reserved): nothing can have been written.
#[tokio::test]
async fn dns_failure_is_not_sent() {
    let cfg: TargetConfig = toml::from_str(
        "url = \"http://sendledger-remote.invalid/records\"\nconnect_timeout = \"1s\"",
    )
    .unwrap();
    let target = Target::from_config("payments", &cfg).unwrap();
    let outcome = target.execute(&request("k1", json!({})), 1, None).await;
    assert!(
        matches!(
            outcome,
            AttemptOutcome::NotSent {
                cause: NotSentCause::Connect(_),
                retry_after_ms: None
            }
        ),
        "{outcome:?}"
    );
}

/// A listener whose accept queue is full drops new SYNs: the connect times out, nothing is
/// written.
#[tokio::test]
async fn connect_timeout_is_not_sent() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(stream)) => held.push(stream),
            _ => break,
        }
    }
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"http://{addr}/records\"\nconnect_timeout = \"300ms\"\nrequest_timeout = \"300ms\""
    ))
    .unwrap();
    let target = Target::from_config("payments", &cfg).unwrap();
    match target.execute(&request("k1", json!({})), 1, None).await {
        AttemptOutcome::NotSent {
            cause: NotSentCause::Connect(reason),
            ..
        } => assert!(reason.contains("no connection within"), "{reason}"),
        other => panic!("expected NotSent, got {other:?}"),
    }
    drop(listener);
}

// ---- Succeeded ----

#[tokio::test]
async fn created_2xx_is_succeeded_with_the_remote_id() {
    let sim = start_sim(Faults::default()).await;
    let target = target(&sim, "");
    let outcome = target
        .execute(
            &request("ord-1", json!({"amount": 1250, "currency": "EUR"})),
            1,
            None,
        )
        .await;
    let records = sim.records();
    assert_eq!(records.len(), 1);
    assert_eq!(
        outcome,
        AttemptOutcome::Succeeded {
            remote_id: records[0].id.clone(),
            status: 201,
            answer: Default::default(),
        }
    );
    let task_id = sendledger_core::TaskId::derive("acme", "payment.create", "ord-1");
    assert_eq!(
        records[0].body,
        json!({"amount": 1250, "currency": "EUR", "request_key": "ord-1", "reference": task_id.to_string()})
    );
}

/// Accepts one HTTP request on a plain TCP listener, answers 201 with an id, and returns the
/// request's body exactly as it arrived on the socket.
fn capture_one_body() -> (String, std::thread::JoinHandle<Vec<u8>>) {
    use std::io::{BufRead, BufReader, Read};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let answer = r#"{"id":"r-1"}"#;
        write!(
            reader.get_mut(),
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
            answer.len()
        )
        .unwrap();
        body
    });
    (addr, handle)
}

/// The numbers a producer wrote reach the remote as the same tokens, whether the body is the
/// payload itself or the payload with `body_fields` added: no rounding to an f64
/// (`12345678901234567890123`), no reformatting (`100.00`, `-0`, `1E2`), no overflow (`1e400`).
#[tokio::test]
async fn payload_numbers_reach_the_remote_as_written() {
    let produced = br#"{"tenant":"acme","operation":"payment.create","request_key":"ord-7","target":"payments",
        "payload":{"iban": 12345678901234567890123, "amount": 100.00, "zero": -0, "huge": 1e400, "e": [1E2, 2e-1]}}"#;
    let request = TaskRequest::from_json(produced)
        .unwrap()
        .accept(&Limits::default())
        .unwrap();
    for (extra, expected) in [
        (
            "",
            r#"{"amount":100.00,"e":[1E2,2e-1],"huge":1e400,"iban":12345678901234567890123,"zero":-0}"#,
        ),
        (
            r#"body_fields = { request_key = "{request_key}" }"#,
            r#"{"amount":100.00,"e":[1E2,2e-1],"huge":1e400,"iban":12345678901234567890123,"request_key":"ord-7","zero":-0}"#,
        ),
    ] {
        let (addr, server) = capture_one_body();
        let config: TargetConfig = toml::from_str(&format!(
            "url = \"http://{addr}/records\"\nrequest_timeout = \"5s\"\n{extra}"
        ))
        .unwrap();
        let target = Target::from_config("payments", &config).unwrap();
        let outcome = target.execute(&request, 1, None).await;
        assert_eq!(
            outcome,
            AttemptOutcome::Succeeded {
                remote_id: "r-1".into(),
                status: 201,
                answer: Default::default(),
            }
        );
        let body = tokio::task::spawn_blocking(move || server.join().unwrap())
            .await
            .unwrap();
        assert_eq!(String::from_utf8(body).unwrap(), expected);
    }
}

#[tokio::test]
async fn success_without_an_id_is_still_succeeded() {
    let sim = start_sim(Faults::default()).await;
    let target = target(&sim, "response_id_pointer = \"/data/id\"");
    let outcome = target.execute(&request("ord-1", json!({})), 1, None).await;
    assert_eq!(
        outcome,
        AttemptOutcome::Succeeded {
            remote_id: String::new(),
            status: 201,
            answer: Default::default(),
        }
    );
    assert_eq!(sim.stats().records, 1);
}

// ---- Unknown: written, no reliable answer ----

#[tokio::test]
async fn commit_then_drop_is_unknown_and_the_remote_holds_exactly_one_record() {
    let sim = start_sim(faults(|f| f.commit_then_drop = 1.0)).await;
    let target = target(&sim, "");
    let outcome = target.execute(&request("ord-1", json!({})), 1, None).await;
    assert!(
        matches!(
            outcome,
            AttemptOutcome::Unknown {
                cause: UnknownCause::ResetAfterWrite(_)
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(sim.records_with_identity("ord-1").len(), 1);
    assert_eq!(sim.stats().dropped, 1);
}

#[tokio::test]
async fn commit_then_hang_is_unknown_after_the_request_timeout() {
    let sim = start_sim(faults(|f| f.commit_then_hang = 1.0)).await;
    let target = target(&sim, "request_timeout = \"300ms\"");
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        target.execute(&request("ord-1", json!({})), 1, None),
    )
    .await
    .expect("the request timeout ends the attempt");
    assert_eq!(outcome, unknown(UnknownCause::Timeout));
    assert_eq!(sim.records_with_identity("ord-1").len(), 1);
    assert_eq!(sim.stats().hung, 1);
}

#[tokio::test]
async fn refused_before_reading_is_unknown_and_nothing_was_created() {
    let sim = start_sim(faults(|f| f.refuse = 1.0)).await;
    let target = target(&sim, "");
    let outcome = target.execute(&request("ord-1", json!({})), 1, None).await;
    // The request was written: the client cannot know the remote did not read it.
    assert!(
        matches!(
            outcome,
            AttemptOutcome::Unknown {
                cause: UnknownCause::ResetAfterWrite(_)
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(sim.stats().records, 0);
    assert_eq!(sim.stats().refused, 1);
}

#[tokio::test]
async fn slow_remote_past_the_timeout_is_unknown_and_the_record_still_appears() {
    let sim = start_sim(faults(|f| f.latency = Duration::from_millis(700))).await;
    let target = target(&sim, "request_timeout = \"200ms\"");
    let outcome = target.execute(&request("ord-1", json!({})), 1, None).await;
    assert_eq!(outcome, unknown(UnknownCause::Timeout));
    // A timeout is not a failure: the remote performed the effect after the client gave up.
    await_records(&sim, "ord-1", 1).await;
}

#[tokio::test]
async fn server_error_500_before_commit_is_unknown() {
    let sim = start_sim(faults(|f| f.error = 1.0)).await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(outcome, unknown(UnknownCause::Status(500)));
    assert_eq!(sim.stats().records, 0);
}

#[tokio::test]
async fn server_error_500_after_commit_is_unknown() {
    let sim = start_sim(faults(|f| f.commit_then_error = 1.0)).await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(outcome, unknown(UnknownCause::Status(500)));
    assert_eq!(sim.records_with_identity("ord-1").len(), 1);
}

#[tokio::test]
async fn server_error_is_not_sent_when_the_target_says_so() {
    let sim = start_sim(faults(|f| {
        f.error = 1.0;
        f.error_status = 502;
    }))
    .await;
    let outcome = target(&sim, "on_5xx = \"not_sent\"")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(
        outcome,
        AttemptOutcome::NotSent {
            cause: NotSentCause::ServerError { status: 502 },
            retry_after_ms: None
        }
    );
    assert_eq!(sim.stats().records, 0);
}

#[tokio::test]
async fn unavailable_503_without_retry_after_is_unknown() {
    let sim = start_sim(faults(|f| {
        f.error = 1.0;
        f.error_status = 503;
    }))
    .await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(outcome, unknown(UnknownCause::Status(503)));
}

#[tokio::test]
async fn request_timeout_408_is_unknown() {
    let sim = start_sim(faults(|f| {
        f.reject = 1.0;
        f.reject_status = 408;
    }))
    .await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(outcome, unknown(UnknownCause::Status(408)));
}

// ---- NotSent: throttled ----

#[tokio::test]
async fn throttled_429_with_retry_after_2_is_not_sent_for_at_least_2s() {
    let sim = start_sim(faults(|f| {
        f.throttle = 1.0;
        f.retry_after = Duration::from_secs(2);
    }))
    .await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    match outcome {
        AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: 429 },
            retry_after_ms: Some(ms),
        } => assert!(ms >= 2_000, "{ms}"),
        other => panic!("expected throttled, got {other:?}"),
    }
    assert_eq!(sim.stats().records, 0);
}

#[tokio::test]
async fn unavailable_503_with_retry_after_is_not_sent() {
    let sim = start_sim(faults(|f| {
        f.throttle = 1.0;
        f.throttle_status = 503;
        f.retry_after = Duration::from_secs(3);
    }))
    .await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(
        outcome,
        AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: 503 },
            retry_after_ms: Some(3_000)
        }
    );
    assert_eq!(sim.stats().records, 0);
}

// ---- Rejected ----

async fn rejected_with(status: u16) {
    let sim = start_sim(faults(|f| {
        f.reject = 1.0;
        f.reject_status = status;
    }))
    .await;
    let outcome = target(&sim, "")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    match outcome {
        AttemptOutcome::Rejected { status: s, detail } => {
            assert_eq!(s, status);
            assert!(detail.contains("rejected by the remote"), "{detail}");
        }
        other => panic!("expected rejected, got {other:?}"),
    }
    assert_eq!(sim.stats().records, 0);
}

#[tokio::test]
async fn bad_request_400_is_rejected() {
    rejected_with(400).await;
}

#[tokio::test]
async fn unprocessable_422_is_rejected() {
    rejected_with(422).await;
}

#[tokio::test]
async fn conflict_409_is_rejected_by_default_and_unknown_when_set_to_reconcile() {
    rejected_with(409).await;
    let sim = start_sim(faults(|f| {
        f.reject = 1.0;
        f.reject_status = 409;
    }))
    .await;
    let outcome = target(&sim, "on_409 = \"reconcile\"")
        .execute(&request("ord-1", json!({})), 1, None)
        .await;
    assert_eq!(outcome, unknown(UnknownCause::Status(409)));
}

#[tokio::test]
async fn a_request_that_cannot_be_built_is_rejected_without_sending() {
    let sim = start_sim(Faults::default()).await;
    let target = target(
        &sim,
        "body_fields = { customer = \"{payload.customer.id}\" }",
    );
    match target.execute(&request("ord-1", json!({})), 1, None).await {
        AttemptOutcome::Rejected { status: 0, detail } => {
            assert!(detail.contains("no field `customer.id`"), "{detail}")
        }
        other => panic!("expected rejected, got {other:?}"),
    }
    assert_eq!(sim.stats().posts, 0);
}

// ---- Idempotency keys and connections ----

#[tokio::test]
async fn a_reused_idempotency_key_returns_the_first_record() {
    let sim = Sim::start(SimConfig {
        idempotency_header: Some("Idempotency-Key".into()),
        faults: faults(|f| f.commit_then_drop = 1.0),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let target = target(
        &sim,
        "idempotency = { header = \"Idempotency-Key\", ttl = \"1h\" }",
    );
    assert_eq!(target.policy().idempotency_ttl_ms, Some(3_600_000));
    let req = request("ord-1", json!({}));
    let first = target.execute(&req, 1, Some("key-1")).await;
    assert!(matches!(first, AttemptOutcome::Unknown { .. }), "{first:?}");
    sim.set_faults(Faults::default()).unwrap();
    let second = target.execute(&req, 2, Some("key-1")).await;
    let records = sim.records_with_identity("ord-1");
    assert_eq!(
        records.len(),
        1,
        "the same key must not create a second record"
    );
    assert_eq!(
        second,
        AttemptOutcome::Succeeded {
            remote_id: records[0].id.clone(),
            status: 201,
            answer: Default::default(),
        }
    );
    assert_eq!(sim.stats().replays, 1);
}

/// On a runtime with several threads, so a connection's task may not have been polled again
/// yet when its answer has been read and it goes back to the pool: it is kept all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_reused_only_when_pooling_is_on() {
    let sim = start_sim(Faults::default()).await;
    let pooled = target(&sim, "");
    for i in 0..50 {
        let outcome = pooled
            .execute(&request(&format!("p-{i}"), json!({})), 1, None)
            .await;
        assert!(
            matches!(outcome, AttemptOutcome::Succeeded { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(sim.stats().connections, 1);
    let fresh = target(&sim, "pool_idle_timeout = \"0s\"");
    for i in 0..10 {
        let outcome = fresh
            .execute(&request(&format!("f-{i}"), json!({})), 1, None)
            .await;
        assert!(
            matches!(outcome, AttemptOutcome::Succeeded { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(sim.stats().connections, 11);
    assert_eq!(sim.stats().records, 60);
}

#[tokio::test]
async fn a_sim_shutdown_ends_a_hanging_attempt_as_unknown() {
    let sim = start_sim(faults(|f| f.commit_then_hang = 1.0)).await;
    let target = Arc::new(target(&sim, "request_timeout = \"30s\""));
    let attempt = {
        let target = target.clone();
        tokio::spawn(async move { target.execute(&request("ord-1", json!({})), 1, None).await })
    };
    while sim.stats().hung == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sim.shutdown().await;
    let outcome = tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .expect("shutdown closes hanging connections")
        .unwrap();
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

// ---- Lookups ----

/// A lookup carries the trace context as `traceparent` when its target propagates trace
/// contexts (`propagate_trace = true`), as attempts do, and never otherwise.
#[tokio::test]
async fn lookups_send_traceparent_only_when_the_target_propagates() {
    let sim = start_sim(Faults::default()).await;
    let trace = sendledger_core::TraceParent::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    .unwrap();
    let req = request("ord-t", json!({}));
    target(&sim, "")
        .lookup_traced(&req, None, Some(trace))
        .await
        .unwrap();
    assert!(sim.lookup_traceparents().is_empty());
    target(&sim, "propagate_trace = true")
        .lookup_traced(&req, None, Some(trace))
        .await
        .unwrap();
    assert_eq!(sim.lookup_traceparents(), [trace.to_string()]);
    assert_eq!(sim.stats().lookups, 2);
}

#[tokio::test]
async fn lookup_finds_zero_one_and_several_matches() {
    let sim = start_sim(Faults::default()).await;
    let target = target(&sim, "");
    let req = request("ord-1", json!({"amount": 5}));
    assert_eq!(
        target.lookup(&req, None).await.unwrap(),
        Vec::<String>::new()
    );
    target.execute(&req, 1, None).await;
    let one = target.lookup(&req, None).await.unwrap();
    assert_eq!(one, vec![sim.records()[0].id.clone()]);
    // An unrelated task's record is not a match.
    target.execute(&request("ord-2", json!({})), 1, None).await;
    assert_eq!(target.lookup(&req, None).await.unwrap(), one);
    // A duplicate at the remote: both records are reported.
    target.execute(&req, 2, None).await;
    let several = target.lookup(&req, None).await.unwrap();
    let expected: Vec<String> = sim
        .records_with_identity("ord-1")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(several.len(), 2);
    assert_eq!(several, expected);
}

#[tokio::test]
async fn lookup_lag_hides_fresh_records_until_they_are_visible() {
    let sim = Sim::start(SimConfig {
        lookup_lag: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let target = target(&sim, "");
    let req = request("ord-1", json!({}));
    assert!(matches!(
        target.execute(&req, 1, None).await,
        AttemptOutcome::Succeeded { .. }
    ));
    assert!(target.lookup(&req, None).await.unwrap().is_empty());
    sim.set_lookup_lag(Duration::ZERO);
    assert_eq!(target.lookup(&req, None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn lookup_filters_exclude_records_whose_fields_differ() {
    let sim = start_sim(Faults::default()).await;
    let text = format!(
        r#"
url = "{create}"
body_fields = {{ request_key = "{{request_key}}", reference = "{{task_id}}" }}
[lookup]
url = "{lookup}?reference={{task_id}}"
filters = {{ "/body/amount" = "/amount", "/body/currency" = "/currency" }}
"#,
        create = sim.create_url(),
        lookup = sim.lookup_url()
    );
    let filtered = Target::from_config("payments", &toml::from_str(&text).unwrap()).unwrap();
    let unfiltered = target(&sim, "");
    let ours = request("ord-1", json!({"amount": 100, "currency": "EUR"}));
    let other_amount = request("ord-1", json!({"amount": 200, "currency": "EUR"}));
    let other_currency = request("ord-1", json!({"amount": 100, "currency": "USD"}));
    let AttemptOutcome::Succeeded { remote_id, .. } = filtered.execute(&ours, 1, None).await else {
        panic!("create failed")
    };
    filtered.execute(&other_amount, 1, None).await;
    filtered.execute(&other_currency, 1, None).await;
    assert_eq!(unfiltered.lookup(&ours, None).await.unwrap().len(), 3);
    assert_eq!(filtered.lookup(&ours, None).await.unwrap(), vec![remote_id]);
    // A payload without a filtered field cannot be judged: an error, not zero matches.
    let err = filtered
        .lookup(&request("ord-1", json!({"amount": 100})), None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`/currency`"), "{err}");
}

#[tokio::test]
async fn lookup_created_after_intent_excludes_older_records() {
    let sim = start_sim(Faults::default()).await;
    let text = format!(
        r#"
url = "{create}"
body_fields = {{ request_key = "{{request_key}}", reference = "{{task_id}}" }}
[lookup]
url = "{lookup}?reference={{task_id}}"
created_after_intent = {{ pointer = "/created_at", format = "unix_millis", skew = "0s" }}
"#,
        create = sim.create_url(),
        lookup = sim.lookup_url()
    );
    let target = Target::from_config("payments", &toml::from_str(&text).unwrap()).unwrap();
    let req = request("ord-1", json!({}));
    target.execute(&req, 1, None).await;
    let created_at = sim.records()[0].created_at;
    assert_eq!(
        target
            .lookup(&req, Some(created_at - 1_000))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        target.lookup(&req, Some(created_at)).await.unwrap().len(),
        1
    );
    assert!(target
        .lookup(&req, Some(created_at + 60_000))
        .await
        .unwrap()
        .is_empty());
    // Without an intent time the filter does not apply.
    assert_eq!(target.lookup(&req, None).await.unwrap().len(), 1);
}

/// The identity fields each as a whole query value: encoded, so `/`, `#`, `=`, `:` and `+`
/// in a value reach the remote as that value.
#[tokio::test]
async fn lookup_url_encodes_request_fields() {
    let sim = start_sim(Faults::default()).await;
    let target = target(
        &sim,
        &format!(
            r#"
body_fields = {{ tenant = "{{tenant}}", operation = "{{operation}}", request_key = "{{request_key}}" }}
lookup = {{ url = "{}?tenant={{tenant}}&operation={{operation}}&request_key={{request_key}}" }}"#,
            sim.lookup_url()
        ),
    );
    let req = request("ord/1+2#x=y:z", json!({}));
    target.execute(&req, 1, None).await;
    target.execute(&request("ord/1", json!({})), 1, None).await;
    assert_eq!(target.lookup(&req, None).await.unwrap().len(), 1);
    assert_eq!(sim.records_with_identity("ord/1+2#x=y:z").len(), 1);
}

#[tokio::test]
async fn failed_lookups_are_errors_not_evidence() {
    let sim = start_sim(Faults::default()).await;
    let req = request("ord-1", json!({}));
    // Wrong shape: the answer is an array, not an object with `/data`.
    let shaped = target(&sim, "");
    let mut cfg = config(&sim, "");
    if let Some(l) = cfg.lookup.as_mut() {
        l.results_pointer = "/data".into();
    }
    let wrong_shape = Target::from_config("payments", &cfg).unwrap();
    let err = wrong_shape.lookup(&req, None).await.unwrap_err();
    assert!(
        matches!(err, sendledger_effects::Error::LookupAnswer { .. }),
        "{err}"
    );
    // Wrong path: 404.
    let mut cfg = config(&sim, "");
    if let Some(l) = cfg.lookup.as_mut() {
        l.url = format!("{}/nope?reference={{task_id}}", sim.base_url());
    }
    let err = Target::from_config("payments", &cfg)
        .unwrap()
        .lookup(&req, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            sendledger_effects::Error::LookupStatus { status: 404, .. }
        ),
        "{err}"
    );
    // Remote gone.
    let _ = shaped.lookup(&req, None).await.unwrap();
    sim.shutdown().await;
    let err = shaped.lookup(&req, None).await.unwrap_err();
    assert!(
        matches!(err, sendledger_effects::Error::LookupTransport { .. }),
        "{err}"
    );
}

/// Tenant `t:1` with key `k` and tenant `t` with key `1:k` are two tasks. Joined as
/// `{tenant}:{request_key}` they read alike, and task B's lookup would find task A's record:
/// such a target is refused. With `{task_id}`, B's lookup does not find A's record.
#[tokio::test]
async fn a_lookup_finds_only_its_own_tasks_records() {
    let sim = Sim::start(SimConfig {
        identity_field: "reference".into(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let with = |reference: &str| -> TargetConfig {
        toml::from_str(&format!(
            r#"
url = "{}"
body_fields = {{ reference = "{reference}" }}
lookup = {{ url = "{}?reference={reference}" }}"#,
            sim.create_url(),
            sim.lookup_url()
        ))
        .unwrap()
    };
    let task = |tenant: &str, key: &str| {
        TaskRequest {
            tenant: tenant.into(),
            operation: "payment.create".into(),
            request_key: key.into(),
            target: "payments".into(),
            payload: json!({}),
            payload_text: None,
            metadata: Default::default(),
            version: 0,
        }
        .accept(&Limits::default())
        .unwrap()
    };
    let (a, b) = (task("t:1", "k"), task("t", "1:k"));

    let err = Target::from_config("payments", &with("{tenant}:{request_key}")).unwrap_err();
    let err = err.to_string();
    assert!(
        err.starts_with("targets.payments.lookup.url: does not tell tasks apart"),
        "{err}"
    );
    assert!(err.contains("{task_id}"), "{err}");

    let target = Target::from_config("payments", &with("{task_id}")).unwrap();
    let AttemptOutcome::Succeeded { remote_id, .. } = target.execute(&a, 1, None).await else {
        panic!("A's record was not created")
    };
    assert_eq!(target.lookup(&b, None).await.unwrap(), Vec::<String>::new());
    assert_eq!(target.lookup(&a, None).await.unwrap(), vec![remote_id]);
}

/// Other ways a lookup could fail to tell tasks apart, refused with the field named; a URL that
/// matches on payload values only is accepted (the operator may know them to be unique).
#[test]
fn ambiguous_lookups_are_refused() {
    let load = |extra: &str| {
        let cfg: TargetConfig =
            toml::from_str(&format!("url = \"http://127.0.0.1:9/r\"\n{extra}")).unwrap();
        Target::from_config("t", &cfg)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    for (extra, expected) in [
        (
            "lookup = { url = \"http://127.0.0.1:9/r?k={request_key}\" }",
            "targets.t.lookup.url: does not tell tasks apart",
        ),
        (
            "lookup = { url = \"http://127.0.0.1:9/r/{tenant}/{operation}-{request_key}\" }",
            "targets.t.lookup.url: does not tell tasks apart",
        ),
        (
            "body_fields = { reference = \"{tenant}:{request_key}\" }\nlookup = { url = \"http://127.0.0.1:9/r?reference={task_id}\" }",
            "targets.t.body_fields.reference: is `{tenant}:{request_key}` but lookup.url queries `reference` with `{task_id}`",
        ),
        (
            "lookup = { url = \"http://127.0.0.1:9/a/../r?reference={task_id}\" }",
            "targets.t.lookup.url: has the path segment `..`",
        ),
    ] {
        let err = load(extra).unwrap_err();
        assert!(err.starts_with(expected), "{extra}: {err}");
    }
    for extra in [
        "body_fields = { reference = \"ref-{task_id}\" }\nlookup = { url = \"http://127.0.0.1:9/r?reference=ref-{task_id}\" }",
        "lookup = { url = \"http://127.0.0.1:9/r/{tenant}/{operation}/{request_key}\" }",
        "lookup = { url = \"http://127.0.0.1:9/r?order={payload.order}\" }",
    ] {
        assert_eq!(load(extra), Ok(()), "{extra}");
    }
}

/// A request key `..` in a path segment would make the attempt reach another resource at a
/// remote that normalizes paths: rejected without sending anything.
#[tokio::test]
async fn a_dot_segment_from_a_request_field_is_not_sent() {
    let sim = start_sim(Faults::default()).await;
    let target = target(
        &sim,
        &format!("url = \"{}/{{request_key}}/x\"", sim.create_url()),
    );
    let outcome = target.execute(&request("..", json!({})), 1, None).await;
    let AttemptOutcome::Rejected { status: 0, detail } = outcome else {
        panic!("expected a rejection without sending, got {outcome:?}")
    };
    assert!(detail.contains("addresses another resource"), "{detail}");
    assert_eq!(sim.stats().posts, 0);
}

// ---- Configuration ----

#[test]
fn config_errors_name_the_field() {
    let base = "url = \"http://127.0.0.1:9/records\"\n";
    let cases: &[(&str, &str)] = &[
        ("method = \"BREW\"", "targets.t.method: `BREW` is not supported"),
        ("request_timeout = \"0s\"", "targets.t.request_timeout: must be longer than 0s"),
        ("response_id_pointer = \"id\"", "targets.t.response_id_pointer: `id` is not a JSON pointer"),
        ("headers = { \"Bad Name\" = \"x\" }", "targets.t.headers.Bad Name: is not a valid header name"),
        ("headers = { Host = \"x\" }", "targets.t.headers.Host: is set by the client"),
        ("headers = { Authorization = { env = \"SENDLEDGER_TEST_UNSET_VAR\" } }",
         "targets.t.headers.Authorization: environment variable `SENDLEDGER_TEST_UNSET_VAR` is not set"),
        ("body_fields = { ref = \"{nope}\" }", "targets.t.body_fields.ref: unknown placeholder `{nope}`"),
        ("retry = { max_attempts = 0 }", "targets.t.retry.max_attempts: must be at least 1"),
        ("retry = { multiplier = 0.5 }", "targets.t.retry.multiplier"),
        ("idempotency = { header = \"Idempotency-Key\", ttl = \"0s\" }", "targets.t.idempotency.ttl"),
        ("lookup = { url = \"http://127.0.0.1:9/r?k={bogus}\" }", "targets.t.lookup.url: unknown placeholder `{bogus}`"),
        ("lookup = { url = \"http://127.0.0.1:9/r\", id_pointer = \"x\" }", "targets.t.lookup.id_pointer"),
        ("lookup = { url = \"http://127.0.0.1:9/r\", first_check = \"10s\", deadline = \"1s\" }", "targets.t.lookup.deadline"),
        ("lookup = { url = \"http://127.0.0.1:9/r\", deadline = \"1m\", complete_after = \"2m\" }", "targets.t.lookup.complete_after: must be shorter than lookup.deadline"),
        ("retry = { connect = { max_attempts = 9 } }", "targets.t.retry.connect.max_attempts: must not exceed retry.max_attempts"),
        ("retry = { throttled = { multiplier = 0.5 } }", "targets.t.retry.throttled.multiplier: must be a number of at least 1.0"),
        ("retry = { connect = { initial_backoff = \"1m\" } }", "targets.t.retry.connect.initial_backoff: must not exceed retry.connect.max_backoff"),
        ("retry = { server_error = { max_attempts = 2 } }", "targets.t.retry.server_error: applies to 5xx answers declared not performed"),
        ("retry = { connect = { timeout = \"0s\" } }", "targets.t.retry.connect.timeout: must be longer than 0s"),
        ("breaker = { minimum_calls = 60 }", "targets.t.breaker.window_calls: must be at least breaker.minimum_calls"),
        ("breaker = { failure_rate = 1.5 }", "targets.t.breaker.failure_rate: must be a share in (0, 1]"),
        ("breaker = { open_for = \"0s\" }", "targets.t.breaker.open_for: must be longer than 0s"),
        ("breaker = { half_open_probes = 0 }", "targets.t.breaker.half_open_probes: must be at least 1"),
        ("request_timeout = \"5s\"\nbreaker = { slow_after = \"6s\" }", "targets.t.breaker.slow_after: must not exceed request_timeout"),
        ("breaker = { count_not_sent = false, count_unknown = false }", "targets.t.breaker: counts no failure"),
        ("breaker = { health_url = \"http://127.0.0.1:9/h/{task_id}\" }", "targets.t.breaker.health_url: must not have placeholders"),
        ("breaker = { enabled = false, retry_failed_within = \"1h\" }", "targets.t.breaker.retry_failed_within: retries failed tasks when the breaker closes, and the breaker is off"),
        ("breaker = { retry_failed_within = \"0s\" }", "targets.t.breaker.retry_failed_within: must be longer than 0s"),
    ];
    for (extra, expected) in cases {
        let cfg: TargetConfig = toml::from_str(&format!("{base}{extra}")).unwrap();
        let err = Target::from_config_with_env("t", &cfg, |_| None).unwrap_err();
        assert!(err.to_string().starts_with(expected), "{extra}: {err}");
    }
    for (url, expected) in [
        ("ftp://x/y", "absolute http:// URL"),
        ("http://{tenant}.example/y", "written literally"),
        ("/relative", "absolute http:// URL"),
    ] {
        let cfg: TargetConfig = toml::from_str(&format!("url = \"{url}\"")).unwrap();
        let err = Target::from_config("t", &cfg).unwrap_err();
        assert!(
            err.to_string().starts_with("targets.t.url: "),
            "{url}: {err}"
        );
        assert!(err.to_string().contains(expected), "{url}: {err}");
    }
    let err = toml::from_str::<TargetConfig>(&format!("{base}colour = \"red\"")).unwrap_err();
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
    let err =
        toml::from_str::<TargetConfig>(&format!("{base}connect_timeout = \"soon\"")).unwrap_err();
    assert!(err.to_string().contains("connect_timeout"), "{err}");
    let err = toml::from_str::<TargetConfig>(&format!("{base}on_5xx = \"retry\"")).unwrap_err();
    assert!(err.to_string().contains("unknown variant `retry`"), "{err}");
}

/// Retries layered by class of "not sent", as a team writes them: connection failures 3
/// attempts growing 1 s → 4 s → 16 s; 5xx proven not performed 2 attempts at a fixed 2 s; a
/// 409 is this task's record already (success, no retry); 429s keep the default.
#[test]
fn retries_by_class_are_expressible() {
    let cfg: TargetConfig = toml::from_str(
        r#"
url = "http://127.0.0.1:9/records"
on_5xx = "not_sent"
on_409 = "succeeded"
[retry]
max_attempts = 6
[retry.connect]
max_attempts = 3
initial_backoff = "1s"
max_backoff = "16s"
multiplier = 4.0
jitter = false
[retry.server_error]
max_attempts = 2
initial_backoff = "2s"
max_backoff = "2s"
multiplier = 1.0
jitter = false
"#,
    )
    .unwrap();
    let retry = Target::from_config("t", &cfg).unwrap().policy().retry;
    let connect = retry.for_class(Some(sendledger_core::RetryClass::Connect));
    assert_eq!(connect.max_attempts, 3);
    let delays: Vec<u64> = (1..=3)
        .map(|n| connect.backoff_ms(n, None, 12_345))
        .collect();
    assert_eq!(delays, [1_000, 4_000, 16_000]);
    let server = retry.for_class(Some(sendledger_core::RetryClass::ServerError));
    assert_eq!(server.max_attempts, 2);
    assert_eq!(server.backoff_ms(1, None, 7), 2_000);
    assert_eq!(server.backoff_ms(2, None, 7), 2_000);
    let throttled = retry.for_class(Some(sendledger_core::RetryClass::Throttled));
    assert_eq!(throttled.max_attempts, 6);
    assert!(throttled.jitter, "the default policy");
}

#[test]
fn a_target_maps_to_the_core_policy() {
    let cfg: TargetConfig = toml::from_str(
        r#"
url = "http://127.0.0.1:9/records"
idempotency = { header = "Idempotency-Key", ttl = "24h" }
retry = { max_attempts = 5, initial_backoff = "200ms", max_backoff = "1m", multiplier = 3.0 }
lookup = { url = "http://127.0.0.1:9/records?k={task_id}", first_check = "2s", check_interval = "15s", deadline = "10m", resend_when_absent = true }
"#,
    )
    .unwrap();
    let policy = Target::from_config("t", &cfg).unwrap().policy();
    assert_eq!(
        policy,
        sendledger_core::Policy {
            retry: sendledger_core::RetryPolicy {
                max_attempts: 5,
                initial_backoff_ms: 200,
                max_backoff_ms: 60_000,
                multiplier: 3.0,
                ..Default::default()
            },
            reconcile: Some(sendledger_core::ReconcilePolicy {
                first_check_ms: 2_000,
                check_interval_ms: 15_000,
                deadline_ms: 600_000,
                resend_when_absent: true,
                max_policy_resends: 1,
                complete_after_ms: None,
            }),
            idempotency_ttl_ms: Some(86_400_000),
            // A tenth of the TTL, at most a minute.
            idempotency_ttl_margin_ms: 60_000,
            fallback: None,
        }
    );
    let plain: TargetConfig = toml::from_str("url = \"http://127.0.0.1:9/r\"").unwrap();
    let policy = Target::from_config("t", &plain).unwrap().policy();
    assert_eq!(policy.reconcile, None);
    assert_eq!(policy.idempotency_ttl_ms, None);
    assert_eq!(policy.retry, sendledger_core::RetryPolicy::default());
    // Resending when absent is off unless asked for.
    let with_lookup: TargetConfig = toml::from_str(
        "url = \"http://127.0.0.1:9/r\"\nlookup = { url = \"http://127.0.0.1:9/r\" }",
    )
    .unwrap();
    let reconcile = Target::from_config("t", &with_lookup)
        .unwrap()
        .policy()
        .reconcile
        .unwrap();
    assert!(!reconcile.resend_when_absent);
    let targets = Targets::from_config(&[("payments".to_string(), plain)].into()).unwrap();
    assert_eq!(targets.names().collect::<Vec<_>>(), ["payments"]);
}

// ---- Secrets ----

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every outcome, error, `Debug` and log line produced while a target with secret headers
/// works through every kind of ending is free of the secret values.
#[test]
fn secret_header_values_never_appear_in_debug_logs_or_errors() {
    const TOKEN: &str = "tok-5e3c7f1d9a";
    const API_KEY: &str = "key-81b2aa0c44";
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let capture = capture.clone();
            move || capture.clone()
        })
        .finish();
    let mut seen: Vec<String> = Vec::new();
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let sim = Sim::start(SimConfig {
                require_header: Some(RequiredHeader {
                    name: "Authorization".into(),
                    value: format!("Bearer {TOKEN}"),
                }),
                ..SimConfig::default()
            })
            .await
            .unwrap();
            seen.push(format!("{:?}", sim.config()));
            let secret_headers = format!(
                "request_timeout = \"1s\"\nheaders = {{ Authorization = {{ env = \"PAYMENTS_TOKEN\", prefix = \"Bearer \" }}, X-Api-Key = \"{API_KEY}\" }}"
            );
            let cfg = config(&sim, &secret_headers);
            seen.push(format!("{cfg:?}"));
            let env = |name: &str| (name == "PAYMENTS_TOKEN").then(|| TOKEN.to_string());
            let target = Target::from_config_with_env("payments", &cfg, env).unwrap();
            seen.push(format!("{target:?}"));
            let req = request("ord-1", json!({"amount": 1}));
            let mut outcomes = Vec::new();
            // Accepted only with the right header: proves the secret was sent.
            outcomes.push(target.execute(&req, 1, None).await);
            assert!(matches!(outcomes[0], AttemptOutcome::Succeeded { .. }), "{:?}", outcomes[0]);
            for f in [
                faults(|f| f.commit_then_drop = 1.0),
                faults(|f| f.commit_then_hang = 1.0),
                faults(|f| f.error = 1.0),
                faults(|f| f.reject = 1.0),
                faults(|f| f.throttle = 1.0),
                faults(|f| f.refuse = 1.0),
            ] {
                sim.set_faults(f).unwrap();
                outcomes.push(target.execute(&req, 2, None).await);
            }
            sim.set_faults(Faults::default()).unwrap();
            seen.push(format!("{:?}", target.lookup(&req, None).await));
            // The remote without the header: 401, rejected.
            let no_auth = Target::from_config("payments", &config(&sim, "")).unwrap();
            outcomes.push(no_auth.execute(&req, 1, None).await);
            assert!(matches!(outcomes.last(), Some(AttemptOutcome::Rejected { status: 401, .. })));
            let bad = config(&sim, &format!("headers = {{ X-Api-Key = \"{API_KEY}\\n\" }}"));
            sim.shutdown().await;
            outcomes.push(target.execute(&req, 3, None).await);
            let err = target.lookup(&req, None).await.unwrap_err();
            seen.push(format!("{err} {err:?}"));
            seen.push(format!("{outcomes:?}"));
            // An invalid header value is reported without echoing it.
            let err = Target::from_config("payments", &bad).unwrap_err();
            seen.push(format!("{err} {err:?}"));
        });
    });
    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("attempt outcome unknown"),
        "logging was not captured:\n{logs}"
    );
    seen.push(logs);
    for text in &seen {
        for secret in [TOKEN, API_KEY] {
            assert!(!text.contains(secret), "secret leaked into:\n{text}");
        }
    }
}

/// A remote that answers every request 401, quoting the bare credentials of the
/// `Authorization` header it got (and the whole header, its scheme included).
async fn remote_quoting_the_token() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let auth = head
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                    .map_or("", |l| l["authorization:".len()..].trim());
                let bare = auth.split_once(' ').map_or(auth, |(_, t)| t);
                let body =
                    format!("{{\"error\":\"token {bare} is not allowed\",\"got\":\"{auth}\"}}");
                let resp = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

/// A remote that quotes the bare token in its 401: the rejection detail and the lookup error
/// keep the remote's words but not the token (nor the whole header value).
#[tokio::test]
async fn a_token_quoted_by_the_remote_is_redacted() {
    const TOKEN: &str = "s3cr3t-7f1d9a0c";
    let addr = remote_quoting_the_token().await;
    let cfg: TargetConfig = toml::from_str(&format!(
        r#"
url = "http://{addr}/records"
request_timeout = "2s"
body_fields = {{ reference = "{{task_id}}" }}
headers = {{ Authorization = {{ env = "PAYMENTS_TOKEN", prefix = "Bearer " }} }}
lookup = {{ url = "http://{addr}/records?reference={{task_id}}" }}
"#
    ))
    .unwrap();
    let env = |name: &str| (name == "PAYMENTS_TOKEN").then(|| TOKEN.to_string());
    let target = Target::from_config_with_env("payments", &cfg, env).unwrap();
    let req = request("ord-1", json!({"amount": 1}));
    let AttemptOutcome::Rejected { status, detail } = target.execute(&req, 1, None).await else {
        panic!("a 401 is a rejection")
    };
    assert_eq!(status, 401);
    assert!(detail.contains("is not allowed"), "{detail}");
    assert!(!detail.contains(TOKEN), "token leaked: {detail}");
    assert!(
        detail.contains("token <redacted> is not allowed"),
        "{detail}"
    );
    let err = target.lookup(&req, None).await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        matches!(
            err,
            sendledger_effects::Error::LookupStatus { status: 401, .. }
        ),
        "{text}"
    );
    assert!(text.contains("is not allowed"), "{text}");
    assert!(!text.contains(TOKEN), "token leaked: {text}");
}

#[test]
fn the_example_configs_parse_and_validate() {
    let text = include_str!("../../../schemas/sendledger.example.toml");
    let mut doc: toml::Table = toml::from_str(text).unwrap();
    let targets: std::collections::BTreeMap<String, TargetConfig> =
        doc.remove("targets").unwrap().try_into().unwrap();
    let env = |name: &str| (name == "PAYMENTS_TOKEN").then(|| "t".to_string());
    let loaded = Targets::from_config_with_env(&targets, env).unwrap();
    let payments = loaded.get("payments").unwrap();
    assert!(payments.has_lookup());
    assert_eq!(payments.policy().retry.max_attempts, 8);
    let sim: SimConfig =
        toml::from_str(include_str!("../../../schemas/sim-remote.example.toml")).unwrap();
    sim.validate().unwrap();
    assert_eq!(sim.identity_field, "reference");
}

// ---- The room reserved before an intent ----

/// Waits until the simulated remote has accepted `n` connections.
async fn await_connections(sim: &Sim, n: u64) {
    for _ in 0..200 {
        if sim.stats().connections >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} connections, {n} expected", sim.stats().connections);
}

/// `reserve`, which a task calls before it records an attempt's intent, opens the attempt's
/// connection; the attempt then only writes on it. A crash between the durable intent and the
/// first byte has less to interrupt, and no connect failure comes after the intent.
#[tokio::test]
async fn the_connection_is_opened_before_the_intent_and_used_by_the_attempt() {
    let sim = start_sim(Faults::default()).await;
    let target = target(&sim, "pool_idle_timeout = \"0s\"");
    let slot = target.reserve(None).await.expect("the breaker is closed");
    await_connections(&sim, 1).await;
    assert_eq!(sim.stats().posts, 0, "nothing sent by reserving");
    let outcome = target
        .execute_reserved(
            &request("pre-1", json!({})),
            1,
            None,
            Default::default(),
            slot,
        )
        .await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded { .. }),
        "{outcome:?}"
    );
    assert_eq!(sim.records_with_identity("pre-1").len(), 1);
    assert_eq!(
        sim.stats().connections,
        1,
        "the attempt went out on the connection opened by reserve"
    );
}

/// A connection that cannot be opened while reserving fails the attempt as not sent with its
/// cause, without connecting again after the intent.
#[tokio::test]
async fn a_connection_that_cannot_be_opened_before_the_intent_is_not_sent() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg: TargetConfig = toml::from_str(&format!(
        "url = \"http://127.0.0.1:{port}/records\"\nconnect_timeout = \"1s\""
    ))
    .unwrap();
    let target = Target::from_config("t", &cfg).unwrap();
    let slot = target.reserve(None).await.expect("the breaker is closed");
    // The remote comes up after the reservation: the attempt does not try again.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let outcome = target
        .execute_reserved(
            &request("pre-2", json!({})),
            1,
            None,
            Default::default(),
            slot,
        )
        .await;
    match outcome {
        AttemptOutcome::NotSent {
            cause: NotSentCause::Connect(reason),
            ..
        } => assert!(reason.contains("refused"), "{reason}"),
        other => panic!("expected not sent, got {other:?}"),
    }
    let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(accepted.is_err(), "no connection after the intent");
}
