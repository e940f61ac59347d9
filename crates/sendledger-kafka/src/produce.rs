//! Producing request messages: what `sendledger produce` and the demo use to feed the requests
//! topic, the way a client application would; and, used by the publisher too, the one way
//! records are handed to a producer (waiting while its queue is full) and the start-up help
//! that lets a new producer send at once (`ensure_producer_id`).

use std::future::Future;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::DeliveryFuture;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, ProducerContext};
use sendledger_core::access::{sign, SIGNATURE_HEADER};
use sendledger_core::TaskRequest;
use tokio::sync::OnceCell;

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};

/// The Kafka key of a request: its identity address, `tenant/operation/request_key` (a `/` or
/// `%` inside a part percent-encoded, so no two identities share a key), so that every
/// delivery of one task lands in one partition, in order.
pub fn request_key(request: &TaskRequest) -> String {
    request.identity().to_string()
}

/// An idempotent producer on the requests topic.
pub struct RequestProducer {
    producer: FutureProducer,
    topic: String,
    /// Set once the producer was helped to its producer id (see [`ensure_producer_id`]).
    ready: OnceCell<()>,
    /// The key messages are signed with (`sendledger_core::access`), when they are.
    signing_key: Option<Vec<u8>>,
}

impl RequestProducer {
    pub fn new(kafka: &Kafka) -> Result<RequestProducer> {
        Ok(RequestProducer {
            producer: kafka.client_config(Role::Producer).create()?,
            topic: kafka.config().requests_topic.clone(),
            ready: OnceCell::new(),
            signing_key: None,
        })
    }

    /// This producer, signing every message with `secret` (the `sendledger-signature` header
    /// of `sendledger_core::access`), as a tenant with signing keys must.
    pub fn signing_with(mut self, secret: Vec<u8>) -> RequestProducer {
        self.signing_key = Some(secret);
        self
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Sends every `(key, value)` message in order and waits until each is acknowledged;
    /// returns their `(partition, offset)`. Must be called within a tokio runtime.
    pub async fn send_all(
        &self,
        messages: impl IntoIterator<Item = (Option<String>, Vec<u8>)>,
    ) -> Result<Vec<(i32, i64)>> {
        let mut pending = Vec::new();
        for (key, value) in messages {
            pending.push(self.send(key.as_deref(), &value).await?);
        }
        let mut acked = Vec::with_capacity(pending.len());
        for delivery in pending {
            acked.push(delivery.await?);
        }
        Ok(acked)
    }

    /// Waits, the first time, until the producer has its producer id and sends at once (for
    /// at most 2 s; see `ensure_producer_id`). [`RequestProducer::send`] waits for it too;
    /// calling this first keeps the wait out of whatever is timed.
    pub async fn ready(&self) {
        self.ready
            .get_or_init(|| ensure_producer_id(&self.producer, &self.topic))
            .await;
    }

    /// Hands one message to the producer, waiting while its queue is full; the returned future
    /// resolves to the message's `(partition, offset)` once it is acknowledged. Signed when the
    /// producer signs. Must be called within a tokio runtime.
    // rdkafka's send returns the record with its error, large, so it can be sent again.
    #[allow(clippy::result_large_err)]
    pub async fn send(
        &self,
        key: Option<&str>,
        value: &[u8],
    ) -> Result<impl Future<Output = Result<(i32, i64)>>> {
        let signature = (self.signing_key.as_ref()).map(|s| sign(s, &self.topic, value));
        let headers: Vec<_> = signature
            .iter()
            .map(|s| (SIGNATURE_HEADER, s.as_str()))
            .collect();
        self.send_with(key, value, &headers).await
    }

    /// As [`RequestProducer::send`], the message carrying `headers` (and no signature of this
    /// producer's own).
    #[allow(clippy::result_large_err)]
    pub async fn send_with(
        &self,
        key: Option<&str>,
        value: &[u8],
        headers: &[(&str, &str)],
    ) -> Result<impl Future<Output = Result<(i32, i64)>>> {
        self.ready().await;
        let mut record = FutureRecord::to(&self.topic).payload(value);
        if let Some(k) = key {
            record = record.key(k);
        }
        if !headers.is_empty() {
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (key, value) in headers {
                owned = owned.insert(Header {
                    key,
                    value: Some(*value),
                });
            }
            record = record.headers(owned);
        }
        Ok(ack(enqueue(record, |r| self.producer.send_result(r)).await?))
    }
}

/// How long [`ensure_producer_id`] helps a new producer to its producer id before giving up
/// (its messages then wait inside librdkafka until it has one).
const READY_WITHIN: Duration = Duration::from_secs(2);
/// How long one metadata request of [`ensure_producer_id`] may take.
const READY_STEP: Duration = Duration::from_millis(500);

/// Helps the new idempotent `producer` to its producer id, without which it sends nothing.
/// librdkafka asks for the id on a 500 ms timer, and at once when a metadata response arrives
/// while a broker it learned from the cluster's metadata is up. A new client's first metadata
/// comes from its bootstrap connection, before that broker is connected, so the id came with
/// the timer: a new producer's first records waited half a second (the first result of a
/// service, on every start). A metadata request answered by a learned broker (not the
/// bootstrap connection, whose id is -1) has the id asked for at once. Gives up after
/// [`READY_WITHIN`] (brokers that do not answer): the timer still gets the id.
pub(crate) async fn ensure_producer_id<C, P>(producer: &P, topic: &str)
where
    C: ProducerContext + 'static,
    P: Producer<C> + Clone + Send + 'static,
{
    let (producer, topic) = (producer.clone(), topic.to_string());
    let answered = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            match producer.client().fetch_metadata(Some(&topic), READY_STEP) {
                Ok(m) if m.orig_broker_id() >= 0 => return true,
                Ok(_) => {}
                // Brokers not reachable yet: asking again at once would spin.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        false
    })
    .await;
    if !matches!(answered, Ok(true)) {
        tracing::debug!(
            within = ?READY_WITHIN,
            "no metadata from a broker yet; the producer id comes with librdkafka's timer"
        );
    }
}

/// Hands `record` to a producer with `send`, waiting while the producer's queue is full.
pub(crate) async fn enqueue<R, T>(
    mut record: R,
    mut send: impl FnMut(R) -> std::result::Result<T, (KafkaError, R)>,
) -> std::result::Result<T, KafkaError> {
    loop {
        match send(record) {
            Ok(sent) => return Ok(sent),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

async fn ack(delivery: DeliveryFuture) -> Result<(i32, i64)> {
    match delivery.await {
        Ok(Ok(d)) => Ok((d.partition, d.offset)),
        Ok(Err((e, _))) => Err(e.into()),
        Err(_) => Err(Error::Thread {
            what: "kafka producer",
        }),
    }
}
