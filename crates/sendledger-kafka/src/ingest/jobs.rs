//! Jobs and dead letters: what a message asks for (a request to submit, or a rejection), the
//! job that hands it to the [`RequestSink`] on the runtime after the previous job of its
//! chain (retrying while the sink's failure may pass), and the copy of rejected input to the
//! dead-letter topic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{BorrowedHeaders, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use sendledger_core::access::SIGNATURE_HEADER;
use sendledger_core::trace::TRACEPARENT;
use sendledger_core::{Source, TaskRequest, TraceParent};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::tracker::{lock, Done, Outcome};
use super::{IngestStats, Worker, RETRY_INITIAL, RETRY_MAX};
use crate::error::Result;
use crate::metric_definitions::{REQUESTS_MISPLACED_TOTAL, REQUESTS_REFUSED_TOTAL};
use crate::sink::{RequestSink, SinkError};

/// Header of a dead letter: why the message was rejected.
pub const REASON_HEADER: &str = "sendledger-reason";
/// Header of a dead letter: where it came from, `topic/partition@offset`.
pub const SOURCE_HEADER: &str = "sendledger-source";

pub(super) struct DeadLetters {
    pub(super) producer: FutureProducer,
    pub(super) topic: String,
}

/// What to do with one message.
enum Work {
    Submit(Box<TaskRequest>),
    Reject(String),
}

impl<S: RequestSink> Worker<S> {
    /// One message from the consumer: its partition's processed offsets are loaded, the message
    /// is admitted (or dropped as a duplicate, or not ours), its work is decided from its value,
    /// and its job is dispatched after the previous job of its chain.
    pub(super) fn handle(&self, msg: &rdkafka::message::BorrowedMessage<'_>) -> Result<()> {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let (partition, offset) = (msg.partition(), msg.offset());
        let bytes = msg.payload_len() + msg.key().map_or(0, <[u8]>::len);
        if msg.topic() != self.topic || !self.ensure_loaded(partition, offset)? {
            return Ok(());
        }
        let Some(generation) = self.admit(partition, offset, bytes) else {
            return Ok(());
        };
        let raw = msg.payload().map(<[u8]>::to_vec);
        let mut work = self.work_of(raw.as_deref());
        if let Work::Submit(request) = &mut work {
            keep_trace_context(request, msg.headers(), partition, offset);
        }
        work = self.allowed(work, msg.headers(), raw.as_deref().unwrap_or_default());
        if self.owner.is_some() {
            work = keyed_by_identity(work, msg.key());
            work = self.placed(work, msg.key(), partition);
        }
        let job = Job {
            sink: self.sink.clone(),
            stop: self.stop.clone(),
            stats: self.stats.clone(),
            dead_letters: self.dead_letters.clone(),
            source: Source {
                topic: self.topic.clone(),
                partition,
                offset,
            },
            raw: raw.unwrap_or_default(),
            key: msg.key().map(<[u8]>::to_vec),
        };
        self.dispatch(job, work, generation, bytes);
        Ok(())
    }

    /// What a message's value asks for: a request to submit, or a rejection with its reason.
    fn work_of(&self, raw: Option<&[u8]>) -> Work {
        match raw {
            None => Work::Reject("the message has no value (a tombstone or an empty record); a request is a JSON object".into()),
            Some(bytes) if bytes.len() > self.max_message_bytes => Work::Reject(format!(
                "the message is {} bytes, more than the limit of {} (max_message_bytes)",
                bytes.len(),
                self.max_message_bytes
            )),
            Some(bytes) => match TaskRequest::from_json(bytes) {
                Ok(request) => Work::Submit(Box::new(request)),
                Err(e) => Work::Reject(e.to_string()),
            },
        }
    }

    /// The work of a request its tenant may not ask for (see `sendledger_core::access`): a
    /// rejection naming the rule, counted per tenant and rule. Anything else as it is.
    fn allowed(&self, work: Work, headers: Option<&BorrowedHeaders>, value: &[u8]) -> Work {
        let Work::Submit(request) = &work else {
            return work;
        };
        let Some(access) = &self.access else {
            self.note_tenant(&request.tenant);
            return work;
        };
        let signature = last_header(headers, SIGNATURE_HEADER);
        let Err(refusal) = access.check(request, &self.topic, value, signature) else {
            return work;
        };
        let tenant = refusal.tenant.clone().unwrap_or_else(|| "unknown".into());
        metrics::counter!(REQUESTS_REFUSED_TOTAL, "tenant" => tenant.clone(), "rule" => refusal.rule.name())
            .increment(1);
        tracing::warn!(%tenant, rule = refusal.rule.name(), reason = %refusal.detail, "request refused by the access rules; rejected, nothing sent");
        Work::Reject(refusal.to_string())
    }

    /// Kafka mode: the work of a request whose key belongs to another partition than the one
    /// it arrived on (by `kafka.partitioner`, over the log of record's partitions): a rejection
    /// naming both, counted in `sendledger_requests_misplaced_total`. Acted on here, its task
    /// would have a second owner (the key's partition's), which does not know it and would run
    /// a redelivery of it again. Anything else as it is.
    fn placed(&self, work: Work, key: Option<&[u8]>, partition: i32) -> Work {
        let (Work::Submit(_), Some((partitioner, partitions)), Some(key)) =
            (&work, self.placement, key)
        else {
            return work;
        };
        let belongs = partitioner.partition(key, partitions);
        if belongs == partition {
            return work;
        }
        metrics::counter!(REQUESTS_MISPLACED_TOTAL, "partition" => partition.to_string())
            .increment(1);
        let name = partitioner.name();
        tracing::warn!(
            partition,
            belongs,
            partitioner = name,
            "a request arrived on another partition than its key's; rejected, nothing sent"
        );
        Work::Reject(format!(
            "misplaced: the key {:?} belongs to partition {belongs} of {partitions} under the {name} partitioner (kafka.partitioner), and the request arrived on partition {partition}; in kafka mode a request runs only on its key's partition (one owner per task). Produce it again keyed the same, with the {name} partitioner (librdkafka: partitioner={}) and no explicit partition; partitions are never added to a requests topic in use (docs/kafka-mode.md)",
            String::from_utf8_lossy(key),
            partitioner.librdkafka_name()
        ))
    }

    /// Without access rules: warns once when requests for a second tenant arrive, since then
    /// any producer of the topic can act for any of them.
    fn note_tenant(&self, tenant: &str) {
        if self.several_tenants.load(Ordering::Relaxed) {
            return;
        }
        let mut first = self.first_tenant.lock().unwrap_or_else(|e| e.into_inner());
        match first.as_deref() {
            None => *first = Some(tenant.to_string()),
            Some(seen) if seen != tenant => {
                self.several_tenants.store(true, Ordering::Relaxed);
                tracing::warn!(topic = %self.topic, first = %seen, second = %tenant, "requests for several tenants arrive on this topic and no [access] rules are configured: any producer of the topic can act for any tenant; configure [access.tenants] (docs/access.md)");
            }
            Some(_) => {}
        }
    }

    /// Runs the job on the runtime after the previous job of its chain: messages of one identity
    /// reach the sink in partition order, and two jobs for one message (redelivered across a
    /// rebalance while the first is still at work) one after the other.
    fn dispatch(&self, job: Job<S>, work: Work, generation: u64, bytes: usize) {
        let (partition, offset) = (job.source.partition, job.source.offset);
        let id = match &work {
            Work::Submit(r) => format!("{}\u{0}{}\u{0}{}", r.tenant, r.operation, r.request_key),
            Work::Reject(_) => format!("\u{1}{partition}\u{0}{offset}"),
        };
        let (signal, rx) = oneshot::channel();
        let (seq, prev) = {
            let mut t = lock(&self.tracker);
            let seq = t.next_chain;
            t.next_chain += 1;
            let prev = t
                .chains
                .insert(id.clone(), (seq, Some(rx)))
                .and_then(|(_, rx)| rx);
            (seq, prev)
        };
        let done_tx = self.done_tx.clone();
        self.runtime.spawn(async move {
            if let Some(prev) = prev {
                let _ = prev.await;
            }
            let outcome = job.run(work).await;
            drop(signal);
            let _ = done_tx.send(Done {
                partition,
                generation,
                offset,
                bytes,
                outcome,
                chain: (id, seq),
            });
        });
    }
}

/// Kafka mode: a request must be keyed by its identity (`tenant/operation/request_key`, as
/// `sendledger produce` keys it). Its partition decides which instance owns its task, so a
/// delivery under another key may land on a partition another instance owns, which has never
/// heard of the task and would send it again: such a message is rejected unprocessed.
fn keyed_by_identity(work: Work, key: Option<&[u8]>) -> Work {
    let Work::Submit(request) = &work else {
        return work;
    };
    let identity = crate::produce::request_key(request);
    if key == Some(identity.as_bytes()) {
        return work;
    }
    let key = key.map_or("none".to_string(), |k| {
        format!("{:?}", String::from_utf8_lossy(k))
    });
    Work::Reject(format!(
        "in kafka mode a request must be keyed by its identity {identity:?} (the key is {key}): under another key its deliveries may reach an instance that does not know the task; produce it again with that key"
    ))
}

/// Keeps a message's `traceparent` header (the last one, if repeated) with its request. An
/// invalid one is ignored: the request is processed as if it had none.
fn keep_trace_context(
    request: &mut TaskRequest,
    headers: Option<&BorrowedHeaders>,
    partition: i32,
    offset: i64,
) {
    let Some(value) = last_header(headers, TRACEPARENT) else {
        return;
    };
    match std::str::from_utf8(value).ok().and_then(TraceParent::parse) {
        Some(trace) => request.set_traceparent(trace),
        None => tracing::debug!(
            partition,
            offset,
            "the message's traceparent header is not a valid W3C trace context; ignored"
        ),
    }
}

/// The value of a message's header `name` (the last one, if repeated; names compared without
/// case).
fn last_header<'a>(headers: Option<&'a BorrowedHeaders>, name: &str) -> Option<&'a [u8]> {
    headers?
        .iter()
        .filter(|h| h.key.eq_ignore_ascii_case(name))
        .last()?
        .value
}

/// One message on its way into the sink.
struct Job<S: RequestSink> {
    sink: Arc<S>,
    stop: Arc<AtomicBool>,
    stats: Arc<IngestStats>,
    dead_letters: Option<Arc<DeadLetters>>,
    source: Source,
    raw: Vec<u8>,
    key: Option<Vec<u8>>,
}

impl<S: RequestSink> Job<S> {
    async fn run(self, work: Work) -> Outcome {
        match work {
            Work::Reject(reason) => self.reject(reason).await,
            Work::Submit(request) => {
                let span = tracing::info_span!(
                    "sendledger.accept",
                    task_id = %request.identity().task_id(),
                    target = %request.target,
                    source = %self.source,
                );
                sendledger_telemetry::join(&span, request.traceparent());
                self.submit(*request).instrument(span).await
            }
        }
    }

    /// Hands a request to the sink until it is recorded (or refused, or the ingest stops).
    async fn submit(&self, request: TaskRequest) -> Outcome {
        let mut delay = RETRY_INITIAL;
        loop {
            match self.sink.submit(request.clone(), self.source.clone()).await {
                Ok(()) => {
                    self.stats.submitted.fetch_add(1, Ordering::Relaxed);
                    return Outcome::Recorded;
                }
                Err(SinkError::Invalid(reason)) => return self.reject(reason).await,
                Err(SinkError::Fatal(e)) => return Outcome::Fatal(e),
                Err(SinkError::NotOwned(_)) => return Outcome::Abandoned,
                Err(SinkError::Retry(e)) => {
                    if !self.wait_retry(&mut delay, &e).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }

    /// Sleeps before a retry; false when the ingest is stopping instead.
    async fn wait_retry(&self, delay: &mut Duration, error: &str) -> bool {
        if self.stop.load(Ordering::SeqCst) {
            return false;
        }
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(source = %self.source, error, retry_in = ?*delay, "message not recorded; retrying");
        tokio::time::sleep(*delay).await;
        *delay = (*delay * 2).min(RETRY_MAX);
        !self.stop.load(Ordering::SeqCst)
    }

    async fn reject(&self, reason: String) -> Outcome {
        let mut delay = RETRY_INITIAL;
        // Recorded already by an earlier job for the same message: no second dead letter.
        let recorded = self
            .sink
            .processed(self.source.topic.clone(), self.source.partition)
            .await
            .is_ok_and(|p| p.contains(self.source.offset));
        if recorded {
            return Outcome::Recorded;
        }
        if let Some(dl) = &self.dead_letters {
            let source = self.source.to_string();
            loop {
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: REASON_HEADER,
                        value: Some(reason.as_str()),
                    })
                    .insert(Header {
                        key: SOURCE_HEADER,
                        value: Some(source.as_str()),
                    });
                let mut record = FutureRecord::to(&dl.topic)
                    .payload(&self.raw)
                    .headers(headers);
                if let Some(k) = &self.key {
                    record = record.key(k);
                }
                match dl.producer.send(record, Timeout::Never).await {
                    Ok(_) => {
                        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err((e, _)) => {
                        if !self
                            .wait_retry(&mut delay, &format!("dead letter: {e}"))
                            .await
                        {
                            return Outcome::Abandoned;
                        }
                    }
                }
            }
        }
        let mut delay = RETRY_INITIAL;
        loop {
            match self
                .sink
                .reject(self.source.clone(), reason.clone(), self.raw.clone())
                .await
            {
                Ok(()) => {
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    return Outcome::Recorded;
                }
                Err(SinkError::Fatal(e)) => return Outcome::Fatal(e),
                Err(SinkError::NotOwned(_)) => return Outcome::Abandoned,
                Err(e) => {
                    if !self.wait_retry(&mut delay, &e.to_string()).await {
                        return Outcome::Abandoned;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka mode takes a request only under its identity's key: another key, or none, is a
    /// rejection that names the key to use; an invalid message stays rejected for its reason.
    #[test]
    fn kafka_mode_takes_a_request_only_under_its_identity_key() {
        let json = br#"{"tenant":"acme","operation":"pay","request_key":"k/1","target":"sim","payload":{}}"#;
        let submit = || Work::Submit(Box::new(TaskRequest::from_json(json).unwrap()));
        assert!(matches!(
            keyed_by_identity(submit(), Some(b"acme/pay/k%2F1")),
            Work::Submit(_)
        ));
        for key in [Some(&b"acme/pay/k/1"[..]), Some(b"k1"), None] {
            let Work::Reject(reason) = keyed_by_identity(submit(), key) else {
                panic!("{key:?} was taken");
            };
            assert!(
                reason.starts_with(
                    "in kafka mode a request must be keyed by its identity \"acme/pay/k%2F1\""
                ),
                "{reason}"
            );
        }
        let Work::Reject(reason) = keyed_by_identity(Work::Reject("bad json".into()), None) else {
            panic!()
        };
        assert_eq!(reason, "bad json");
    }
}
