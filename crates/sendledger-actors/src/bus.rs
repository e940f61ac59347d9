//! The engine as the Kafka consumer's [`RequestSink`]: how the bus hands messages to tasks.
//!
//! Every call resolves once what it recorded is durable, together with the message's
//! processed-offset marker, so the consumer may store the Kafka offset right after.

use sendledger_bus::{RequestSink, SinkError};
use sendledger_core::{BoxFuture, Source, TaskRequest};
use sendledger_store::{Append, Processed};

use crate::engine::Engine;
use crate::error::Error;

/// What an engine error means for the message that caused it.
fn classify(e: Error) -> SinkError {
    match e {
        Error::Invalid(e) => SinkError::Invalid(e.to_string()),
        e @ Error::UnknownTarget(_) => SinkError::Invalid(e.to_string()),
        e @ (Error::Ledger(_) | Error::ShuttingDown | Error::NoSuchTask(_)) => {
            SinkError::Retry(e.to_string())
        }
        e @ Error::Stopped => SinkError::Fatal(e.to_string()),
    }
}

impl RequestSink for Engine {
    fn submit(&self, request: TaskRequest, source: Source) -> BoxFuture<Result<(), SinkError>> {
        let engine = self.clone();
        Box::pin(async move {
            engine
                .submit(request, source)
                .await
                .map(|_| ())
                .map_err(classify)
        })
    }

    fn reject(
        &self,
        source: Source,
        reason: String,
        raw: Vec<u8>,
    ) -> BoxFuture<Result<(), SinkError>> {
        let engine = self.clone();
        Box::pin(async move {
            engine
                .reject_input(source, reason, &raw)
                .await
                .map(|_| ())
                .map_err(classify)
        })
    }

    fn processed(&self, topic: String, partition: i32) -> BoxFuture<Result<Processed, SinkError>> {
        let ledger = self.ledger().clone();
        Box::pin(async move {
            ledger
                .read(move |l| l.processed(&topic, partition))
                .await
                .map_err(|e| SinkError::Retry(e.to_string()))
        })
    }

    fn raise_watermarks(
        &self,
        topic: String,
        marks: Vec<(i32, i64)>,
    ) -> BoxFuture<Result<(), SinkError>> {
        let ledger = self.ledger().clone();
        Box::pin(async move {
            let append = Append {
                offset_watermarks: marks
                    .into_iter()
                    .map(|(p, o)| (topic.clone(), p, o))
                    .collect(),
                ..Append::default()
            };
            ledger
                .append(append)
                .await
                .map(|_| ())
                .map_err(|e| SinkError::Retry(e.to_string()))
        })
    }
}
