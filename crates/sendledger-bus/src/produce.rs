//! Producing request messages: what `sendledger produce` and the demo use to feed the requests
//! topic, the way a client application would; and the one way records are handed to a
//! producer (waiting while its queue is full), used by the publisher too.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::producer::future_producer::DeliveryFuture;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_core::TaskRequest;

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
}

impl RequestProducer {
    pub fn new(kafka: &Kafka) -> Result<RequestProducer> {
        Ok(RequestProducer {
            producer: kafka.client_config(Role::Producer).create()?,
            topic: kafka.config().requests_topic.clone(),
        })
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
            let mut record = FutureRecord::to(&self.topic).payload(&value);
            if let Some(k) = &key {
                record = record.key(k.as_str());
            }
            pending.push(enqueue(&self.producer, record).await?);
        }
        let mut acked = Vec::with_capacity(pending.len());
        for delivery in pending {
            acked.push(ack(delivery).await?);
        }
        Ok(acked)
    }
}

/// Hands `record` to the producer, waiting while its queue is full.
pub(crate) async fn enqueue<K, P>(
    producer: &FutureProducer,
    mut record: FutureRecord<'_, K, P>,
) -> std::result::Result<DeliveryFuture, KafkaError>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    loop {
        match producer.send_result(record) {
            Ok(delivery) => return Ok(delivery),
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
