//! Producing request messages: what `sendledger produce` and the demo use to feed the requests
//! topic, the way a client application would.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::future_producer::DeliveryFuture;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sendledger_core::TaskRequest;

use crate::cluster::Kafka;
use crate::config::Role;
use crate::error::{Error, Result};

/// The Kafka key of a request: its identity, `tenant/operation/request_key`, so that every
/// delivery of one task lands in one partition, in order.
pub fn request_key(request: &TaskRequest) -> String {
    format!(
        "{}/{}/{}",
        request.tenant, request.operation, request.request_key
    )
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
    /// returns their `(partition, offset)`. `after_ack` is called with the number acknowledged
    /// so far. Must be called within a tokio runtime.
    pub async fn send_all(
        &self,
        messages: impl IntoIterator<Item = (Option<String>, Vec<u8>)>,
        mut after_ack: impl FnMut(usize),
    ) -> Result<Vec<(i32, i64)>> {
        let mut pending: std::collections::VecDeque<DeliveryFuture> = Default::default();
        let mut acked = Vec::new();
        for (key, value) in messages {
            let mut record = FutureRecord::to(&self.topic).payload(&value);
            if let Some(k) = &key {
                record = record.key(k.as_str());
            }
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push_back(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        let Some(oldest) = pending.pop_front() else {
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                            continue;
                        };
                        acked.push(ack(oldest).await?);
                        after_ack(acked.len());
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
        }
        while let Some(delivery) = pending.pop_front() {
            acked.push(ack(delivery).await?);
            after_ack(acked.len());
        }
        Ok(acked)
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
