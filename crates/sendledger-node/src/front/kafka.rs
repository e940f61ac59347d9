//! Kafka mode's submissions. A request is produced to the requests topic, keyed by its
//! identity as every producer's must be, and the brokers' acknowledgement makes it durable:
//! the partition's owner executes it, whichever instance that is. It is answered once this
//! instance's copy of the partition shows what the owner recorded for that very message
//! (`TaskAccepted`, `DuplicateDelivery` or `RequestConflict` with the message as its source):
//! the copy of a partition owned here is its ledger, of one owned elsewhere its standby copy
//! (the front door needs `kafka.standby`), which holds what the owner committed only.

use std::time::Duration;

use http::StatusCode;
use sendledger_core::{EventBody, Source, TaskId};
use sendledger_kafka::{Kafka, RequestProducer};

use super::problem::Problem;
use super::wait::{next_change, Waiting};
use super::{unavailable, Shared, Verdict};
use crate::error::{Error, Result};

/// How long a request waits for its partition's owner to record it when it did not ask to
/// wait longer (at most `front.max_wait`): past it, the answer is 202 `submitted`.
pub(super) const VERDICT_WITHIN: Duration = Duration::from_secs(5);

/// How long a request waits for the brokers to acknowledge its message: past it, 503 (the
/// producer keeps the message and delivers it once it can, so the answer says it may be on
/// the topic).
const ACKNOWLEDGED_WITHIN: Duration = Duration::from_secs(10);

/// The producer of a kafka-mode front door.
pub(super) struct KafkaDoor {
    producer: RequestProducer,
    max_message_bytes: usize,
}

impl KafkaDoor {
    pub fn new(kafka: &Kafka) -> Result<KafkaDoor> {
        let producer = RequestProducer::new(kafka)
            .map_err(|e| Error::step("starting the front door's producer", e))?;
        Ok(KafkaDoor {
            producer,
            max_message_bytes: kafka.config().max_message_bytes,
        })
    }

    /// The requests topic.
    pub fn topic(&self) -> &str {
        self.producer.topic()
    }

    /// Produces the request message `value` under `key` with `headers`, and returns its
    /// source once the brokers have acknowledged it; 413 for a message larger than the
    /// requests topic takes, 503 when it was not acknowledged within [`ACKNOWLEDGED_WITHIN`].
    pub async fn produce(
        &self,
        key: &str,
        value: &[u8],
        headers: &[(&str, &str)],
    ) -> std::result::Result<Source, Problem> {
        if value.len() > self.max_message_bytes {
            return Err(Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "The request is too large",
            )
            .detail(format!(
                "its message would be {} bytes; kafka.max_message_bytes is {}",
                value.len(),
                self.max_message_bytes
            )));
        }
        let not_acknowledged = |why: String| {
            tracing::warn!(error = %why, "front door: a request was not acknowledged by the brokers");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "The request cannot be taken now",
            )
            .detail(format!("the brokers did not acknowledge it ({why}); it may or may not be on the requests topic: send it again with the same key, which is executed once either way"))
            .retry_after()
        };
        let acked = async {
            let delivery = self.producer.send_with(Some(key), value, headers).await?;
            delivery.await
        };
        let (partition, offset) = match tokio::time::timeout(ACKNOWLEDGED_WITHIN, acked).await {
            Ok(Ok(acked)) => acked,
            Ok(Err(e)) => {
                return Err(not_acknowledged(
                    sendledger_core::error::Chain(&e).to_string(),
                ))
            }
            Err(_) => {
                return Err(not_acknowledged(format!(
                    "no acknowledgement within {ACKNOWLEDGED_WITHIN:?}"
                )))
            }
        };
        Ok(Source {
            topic: self.topic().to_string(),
            partition,
            offset,
        })
    }
}

/// What the partition's owner recorded for the message at `source`, and whether the task has
/// ended, once this instance's copy of the partition shows it; `None` when it does not by
/// `until`. A message the owner rejected (its configuration refuses what this instance's
/// accepted) is answered 400 with the owner's reason.
pub(super) async fn verdict(
    shared: &Shared,
    task_id: TaskId,
    source: &Source,
    waiting: &Waiting<'_>,
    until: tokio::time::Instant,
) -> std::result::Result<Option<(Verdict, bool)>, Problem> {
    let rejected_id = TaskId::for_rejected_input(&source.topic, source.partition, source.offset);
    loop {
        // Taken before the task is read, so a change in between still wakes it.
        let changed = waiting.watch().map(|w| w.changed());
        let events = shared.engine.events(task_id).await.map_err(unavailable)?;
        let found = events.iter().find_map(|e| match &e.body {
            EventBody::TaskAccepted { source: s, .. } if s == source => Some(Verdict::New),
            EventBody::DuplicateDelivery { source: s } if s == source => Some(Verdict::Replay),
            EventBody::RequestConflict { source: s, .. } if s == source => Some(Verdict::Conflict),
            _ => None,
        });
        if let Some(verdict) = found {
            let ended = sendledger_core::fold(&events).phase.is_terminal();
            return Ok(Some((verdict, ended)));
        }
        let rejected = shared
            .engine
            .events(rejected_id)
            .await
            .map_err(unavailable)?;
        if let Some(reason) = rejected.iter().find_map(|e| match &e.body {
            EventBody::InputRejected { reason, .. } => Some(reason),
            _ => None,
        }) {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "rejected",
                "The partition's owner rejected the request",
            )
            .detail(format!("{reason} (decided by the instance that owns partition {} of {}; should this be a check this instance passed, their configurations differ)", source.partition, source.topic)));
        }
        if tokio::time::Instant::now() >= until {
            return Ok(None);
        }
        next_change(changed, until).await;
    }
}
