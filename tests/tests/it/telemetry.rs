//! Traces and CloudEvents headers, end to end: `sendledger run` (a child process) consumes
//! requests carrying `traceparent` headers from the embedded Kafka cluster, performs them at
//! simulated remotes and publishes results and events; an OTLP/HTTP receiver started by the
//! test collects the spans it exports.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use sendledger_core::TaskId;
use sendledger_kafka::rdkafka::message::{Header, OwnedHeaders};
use sendledger_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_kafka::reader::Record;
use sendledger_kafka::{Kafka, Role, TopicReader};
use sendledger_sim::{Faults, Sim, SimConfig};
use sendledger_tests::engine::{request, target};

const WAIT: Duration = Duration::from_secs(60);

/// One exported span, as the receiver decoded it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: BTreeMap<String, String>,
}

/// An OTLP/HTTP receiver: accepts `POST /v1/traces` with a protobuf body and keeps the spans.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let kept = kept.clone();
                std::thread::spawn(move || serve(conn, &kept));
            }
        });
        Receiver { url, spans }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the spans received.
    fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + WAIT;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: spans received: {spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Serves the HTTP/1.1 requests of one connection (kept alive by the exporter's client).
fn serve(conn: TcpStream, spans: &Mutex<Vec<Span>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            assert!(
                !name.eq_ignore_ascii_case("transfer-encoding"),
                "a chunked export: {line}"
            );
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        assert!(
            request_line.starts_with("POST /v1/traces "),
            "{request_line}"
        );
        let export = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        {
            let mut kept = spans.lock().unwrap();
            for resource in export.resource_spans {
                let service = resource
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| text(&kv.value))
                    .unwrap_or_default();
                for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                    kept.push(Span {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(&kv.value)))
                            .collect(),
                    });
                }
            }
        }
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if conn.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Produces `(key, value, traceparent header)` messages and waits for their acks.
async fn produce(kafka: &Kafka, messages: Vec<(String, Vec<u8>, Option<&str>)>) {
    let producer: FutureProducer = kafka.client_config(Role::Producer).create().unwrap();
    let topic = kafka.config().requests_topic.clone();
    for (key, value, trace) in &messages {
        let mut record = FutureRecord::to(&topic).key(key.as_str()).payload(value);
        if let Some(trace) = trace {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: "traceparent",
                value: Some(*trace),
            }));
        }
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("request delivered");
    }
}

/// Reads `topic` from the start until `done` holds for the records read.
async fn read_until(
    kafka: &Kafka,
    topic: &str,
    done: impl Fn(&[Record]) -> bool + Send + 'static,
) -> Vec<Record> {
    let reader = TopicReader::from_beginning(kafka, topic).unwrap();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + WAIT;
        let mut out = Vec::new();
        loop {
            if let Some(r) = reader.next(Duration::from_millis(100)) {
                out.push(r.unwrap());
                continue;
            }
            if done(&out) || Instant::now() >= deadline {
                return out;
            }
        }
    })
    .await
    .unwrap()
}

fn json(record: &Record) -> serde_json::Value {
    serde_json::from_slice(record.payload.as_deref().unwrap()).unwrap()
}

fn task(key: &str) -> String {
    TaskId::derive("acme", "payment.create", key).to_string()
}

/// The CloudEvents headers every published record carries, checked against its JSON.
fn assert_cloudevent(record: &Record, source: &str, ce_type: &str) {
    let value = json(record);
    let header = |name: &str| {
        record
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header on {value}"))
    };
    assert_eq!(header("ce_specversion"), "1.0");
    assert_eq!(header("ce_id"), value["event_id"].as_str().unwrap());
    assert_eq!(header("ce_id"), header("sendledger-event-id"));
    assert_eq!(header("ce_source"), source);
    assert_eq!(header("ce_type"), ce_type);
    assert_eq!(header("content-type"), "application/json");
    let at = humantime::parse_rfc3339(&header("ce_time")).unwrap();
    let at_ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(
        at_ms,
        value["at"].as_u64().unwrap(),
        "ce_time is the record's at"
    );
}

const TRACE_A: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const TRACE_B: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_D: &str = "00-11111111111111111111111111111111-2222222222222222-01";

/// Four requests: `a` (trace A) to a target that propagates the trace, `b` (trace B) to one
/// that does not, `c` with an invalid `traceparent` header, and `d` (trace D) to a remote that
/// drops its answers, so the outcome is found by a lookup. Every step is a span of the
/// request's trace with the task's attributes; the remote sees `traceparent` only where the
/// target allows it; every result and event record carries CloudEvents headers, and those of
/// traced tasks their `traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_s_steps_join_its_request_s_trace_and_records_are_cloudevents() {
    let kafka = tokio::task::block_in_place(|| {
        Kafka::connect(sendledger_tests::kafka::process_kafka("embedded"))
    })
    .unwrap();
    let brokers = kafka.bootstrap_servers().to_string();
    let receiver = Receiver::start();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let dropping = Sim::start(SimConfig::default()).await.unwrap();
    dropping
        .set_faults(Faults {
            commit_then_drop: 1.0,
            ..Faults::default()
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = sendledger_node::config::Config::default();
    config.storage.data = dir.path().join("ledger");
    config.engine.timer_tick = Duration::from_millis(5);
    config.kafka = sendledger_tests::kafka::process_kafka(&brokers);
    config.admin.enabled = false;
    config.telemetry.otlp_endpoint = Some(receiver.url.clone());
    let propagating = |v: &mut serde_json::Value| v["propagate_trace"] = true.into();
    config
        .targets
        .insert("sim".into(), target(&sim.base_url(), propagating));
    config
        .targets
        .insert("quiet".into(), target(&sim.base_url(), |_| {}));
    config
        .targets
        .insert("dropping".into(), target(&dropping.base_url(), propagating));
    let config_file = dir.path().join("sendledger.toml");
    std::fs::write(&config_file, toml::to_string(&config).unwrap()).unwrap();
    let (mut run, _) = tokio::task::block_in_place(|| crate::start_run(&config_file, &[]));

    let message = |key: &str, target: &str| {
        let mut r = request(key);
        r.target = target.into();
        (
            format!("acme/payment.create/{key}"),
            serde_json::to_vec(&r).unwrap(),
        )
    };
    let (a, b, c, d) = (
        message("trace-a", "sim"),
        message("trace-b", "quiet"),
        message("trace-c", "sim"),
        message("trace-d", "dropping"),
    );
    produce(
        &kafka,
        vec![
            (a.0, a.1, Some(TRACE_A)),
            (b.0, b.1, Some(TRACE_B)),
            (c.0, c.1, Some("00-not-a-trace-context")),
            (d.0, d.1, Some(TRACE_D)),
        ],
    )
    .await;

    let group = kafka.config().group_id.clone();
    let results = read_until(&kafka, &kafka.config().results_topic.clone(), |recs| {
        recs.iter()
            .filter(|r| json(r)["status"] == "succeeded")
            .count()
            >= 4
    })
    .await;
    let by_task: BTreeMap<String, &Record> = results
        .iter()
        .map(|r| (json(r)["task_id"].as_str().unwrap().to_string(), r))
        .collect();
    assert_eq!(by_task.len(), 4, "{results:?}");
    for r in &results {
        assert_cloudevent(
            r,
            &format!("sendledger/{group}/results"),
            "sendledger.result.succeeded",
        );
    }
    let trace_of = |key: &str| by_task[&task(key)].header("traceparent");
    assert_eq!(trace_of("trace-a").as_deref(), Some(TRACE_A));
    assert_eq!(trace_of("trace-b").as_deref(), Some(TRACE_B));
    assert_eq!(trace_of("trace-c"), None, "an invalid header is ignored");
    assert_eq!(trace_of("trace-d").as_deref(), Some(TRACE_D));

    let events = read_until(&kafka, &kafka.config().events_topic.clone(), |recs| {
        recs.iter()
            .filter(|r| json(r)["type"] == "Confirmed")
            .count()
            >= 4
    })
    .await;
    for r in &events {
        let value = json(r);
        let kind = value["type"].as_str().unwrap();
        assert_cloudevent(
            r,
            &format!("sendledger/{group}/events"),
            &format!("sendledger.event.{kind}"),
        );
        if value["task_id"] == task("trace-a") {
            assert_eq!(r.header("traceparent").as_deref(), Some(TRACE_A), "{value}");
        }
    }

    // The remote: `traceparent` from the propagating targets only.
    let sent = |key: &str, sim: &Sim| -> Option<String> {
        let records = sim.records_with_identity(key);
        assert_eq!(records.len(), 1, "{key}: {records:?}");
        records[0].traceparent.clone()
    };
    let at_remote_a = sent("trace-a", &sim).expect("the propagating target sends traceparent");
    assert!(
        at_remote_a.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
        "{at_remote_a}"
    );
    assert_eq!(
        sent("trace-b", &sim),
        None,
        "propagate_trace is off for `quiet`"
    );
    let at_remote_c = sent("trace-c", &sim).expect("an attempt's own span is passed on");
    assert!(!at_remote_c.contains("not-a-trace"), "{at_remote_c}");

    // SIGTERM: a clean stop exports the spans still buffered.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || run.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "run did not stop cleanly: {status}");

    let trace_id = |tp: &str| tp[3..35].to_string();
    let parent_id = |tp: &str| tp[36..52].to_string();
    let spans = tokio::task::block_in_place(|| {
        receiver.wait_for("every step of a and d", |spans| {
            let names = |tp: &str| {
                spans
                    .iter()
                    .filter(|s| s.trace_id == trace_id(tp))
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
            };
            let a = names(TRACE_A);
            let d = names(TRACE_D);
            [
                "sendledger.accept",
                "sendledger.attempt",
                "sendledger.publish",
            ]
            .iter()
            .all(|n| a.contains(n))
                && d.contains(&"sendledger.lookup")
                && d.contains(&"sendledger.publish")
        })
    });
    let one = |tp: &str, name: &str| -> Span {
        let found: Vec<&Span> = spans
            .iter()
            .filter(|s| s.trace_id == trace_id(tp) && s.name == name)
            .collect();
        assert!(!found.is_empty(), "no {name} in trace {tp}: {spans:#?}");
        found[0].clone()
    };
    for s in &spans {
        assert_eq!(s.service, "sendledger");
        // The bridge's own timings (`busy_ns`, `idle_ns`) are numbers of nanoseconds, which
        // may hold the digits 1250 by chance; every other attribute is checked.
        let checked = s
            .attributes
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "busy_ns" | "idle_ns"));
        for (key, value) in checked {
            for secret in ["amount", "1250", "EUR"] {
                assert!(!value.contains(secret), "a payload in {key} of {s:?}");
            }
        }
    }
    // Trace A: each step's parent is the request's span; the remote got the attempt's span.
    for name in [
        "sendledger.accept",
        "sendledger.attempt",
        "sendledger.publish",
    ] {
        let s = one(TRACE_A, name);
        assert_eq!(s.parent_span_id, parent_id(TRACE_A), "{s:?}");
        assert_eq!(s.attributes["task_id"], task("trace-a"), "{s:?}");
        assert_eq!(s.attributes["target"], "sim", "{s:?}");
    }
    let attempt = one(TRACE_A, "sendledger.attempt");
    assert_eq!(attempt.attributes["attempt"], "1");
    assert_eq!(attempt.attributes["outcome"], "succeeded");
    assert_eq!(
        parent_id(&at_remote_a),
        attempt.span_id,
        "the remote's parent is the attempt"
    );
    assert_eq!(
        one(TRACE_A, "sendledger.publish").attributes["outcome"],
        "acknowledged"
    );
    // Trace B: spans, though its target sends no header.
    assert_eq!(
        one(TRACE_B, "sendledger.attempt").attributes["target"],
        "quiet"
    );
    // Trace D: the attempt's outcome is unknown, a lookup finds the one record.
    let attempt = one(TRACE_D, "sendledger.attempt");
    assert_eq!(attempt.attributes["outcome"], "unknown");
    let lookup = one(TRACE_D, "sendledger.lookup");
    assert_eq!(lookup.parent_span_id, parent_id(TRACE_D));
    assert_eq!(lookup.attributes["task_id"], task("trace-d"));
    assert_eq!(lookup.attributes["target"], "dropping");
    assert_eq!(lookup.attributes["attempt"], "1");
    assert_eq!(lookup.attributes["matches"], "1");
    assert_eq!(lookup.attributes["outcome"], "one");
    // C's spans have a trace of their own, the one its remote request named.
    let c_attempt = spans
        .iter()
        .find(|s| s.name == "sendledger.attempt" && s.attributes["task_id"] == task("trace-c"))
        .expect("c's attempt span");
    assert_eq!(trace_id(&at_remote_c), c_attempt.trace_id);

    sim.shutdown().await;
    dropping.shutdown().await;
}
