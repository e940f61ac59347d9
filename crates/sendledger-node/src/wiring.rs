//! The adapters that plug the libraries into each other, kept where they are wired so that the
//! engine builds without Kafka or HTTP:
//!
//! - [`HttpRemote`]: the engine's [`Remote`] over HTTP, the targets configured in the effects
//!   crate.
//! - [`EngineSink`]: the engine as the Kafka consumer's [`RequestSink`], how the Kafka crate hands
//!   messages to tasks. Every call resolves once what it recorded is durable, together with the
//!   message's processed-offset marker, so the consumer may store the Kafka offset right after.
//! - [`KafkaOwner`]: kafka mode's [`PartitionOwner`]: takes a partition over (opens its log of
//!   record, restores the ledger from it, resumes its tasks) and gives it up.

use sendledger_actors::{Engine, Error, LookupError, Remote, Slot, TargetHealth, Unavailable};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sendledger_core::decide::{AttemptOutcome, Sending};
use sendledger_core::error::Chain;
use sendledger_core::event::{Millis, NotSentCause};
use sendledger_core::{
    AcceptedRequest, BoxFuture, Event, Policy, RetryClass, Source, TaskId, TaskRequest, TraceParent,
};
use sendledger_effects::{SendSlot, Targets};
use sendledger_kafka::partition_log::{
    event_at, missing_results, read_partition, record_event, LogBatch, LogRecord,
};
use sendledger_kafka::rdkafka::message::Message as _;
use sendledger_kafka::{
    Kafka, LogReplicator, PartitionLog, PartitionOwner, RequestSink, SinkError,
};
use sendledger_store::{Append, Ledger, Processed};

/// The engine's remote over HTTP.
pub struct HttpRemote {
    targets: Targets,
}

impl HttpRemote {
    pub fn new(targets: Targets) -> HttpRemote {
        HttpRemote { targets }
    }
}

impl Remote for HttpRemote {
    fn policy(&self, target: &str) -> Option<Policy> {
        self.targets.policy(target)
    }

    fn reserve(
        &self,
        target: &str,
        retry_of: Option<RetryClass>,
    ) -> BoxFuture<Result<Slot, Unavailable>> {
        match self.targets.get(target).cloned() {
            Some(target) => Box::pin(async move {
                match target.reserve(retry_of).await {
                    Ok(slot) => Ok(Box::new(slot) as Slot),
                    Err(held) => Err(Unavailable {
                        wait: held.wait,
                        spread: held.spread,
                    }),
                }
            }),
            None => Box::pin(std::future::ready(Ok(Box::new(()) as Slot))),
        }
    }

    fn attempt(
        &self,
        target: &str,
        request: &AcceptedRequest,
        attempt: u32,
        idempotency_key: Option<&str>,
        sending: Sending,
        slot: Option<Slot>,
    ) -> BoxFuture<AttemptOutcome> {
        let Some(target) = self.targets.get(target).cloned() else {
            let cause = NotSentCause::Connect(format!("target `{target}` is not configured"));
            return Box::pin(std::future::ready(AttemptOutcome::NotSent {
                cause,
                retry_after_ms: None,
            }));
        };
        let request = request.clone();
        let key = idempotency_key.map(str::to_owned);
        let slot = slot.and_then(|slot| slot.downcast::<SendSlot>().ok());
        Box::pin(async move {
            match slot {
                Some(slot) => {
                    target
                        .execute_reserved(&request, attempt, key.as_deref(), sending, *slot)
                        .await
                }
                None => {
                    target
                        .execute_with(&request, attempt, key.as_deref(), sending)
                        .await
                }
            }
        })
    }

    fn lookup_url(
        &self,
        target: &str,
        request: &AcceptedRequest,
    ) -> Option<Result<String, String>> {
        self.targets.get(target)?.lookup_url(request)
    }

    fn target_health(&self) -> Vec<TargetHealth> {
        self.targets
            .names()
            .filter_map(|name| {
                let target = self.targets.get(name)?;
                let view = target.breaker()?;
                Some(TargetHealth {
                    target: name.to_string(),
                    state: view.state.name(),
                    probing_in_ms: view.probing_in_ms,
                    opened: view.opened,
                    retry_failed_within: target.retry_failed_within(),
                })
            })
            .collect()
    }

    fn lookup(
        &self,
        target: &str,
        request: &AcceptedRequest,
        since: Millis,
        trace: Option<TraceParent>,
    ) -> BoxFuture<Result<Vec<String>, LookupError>> {
        let Some(target) = self.targets.get(target).cloned() else {
            let err = format!("target `{target}` is not configured");
            return Box::pin(std::future::ready(Err(LookupError::new(err, false))));
        };
        let request = request.clone();
        Box::pin(async move {
            target
                .lookup_traced(&request, Some(since), trace)
                .await
                .map_err(|e| {
                    LookupError::new(e.to_string(), e.is_transient())
                        .with_retry_after(e.retry_after())
                })
        })
    }
}

/// The engine as the consumer's request sink.
#[derive(Clone)]
pub struct EngineSink {
    engine: Engine,
}

impl EngineSink {
    pub fn new(engine: Engine) -> EngineSink {
        EngineSink { engine }
    }
}

/// What an engine error means for the message that caused it: the message is invalid, or it
/// was not recorded for a reason that may pass (retried), or that will not (the ingest stops).
fn classify(e: Error) -> SinkError {
    match e {
        Error::Invalid(e) => SinkError::Invalid(e.to_string()),
        e @ Error::UnknownTarget(_) => SinkError::Invalid(e.to_string()),
        // Kafka mode: the partition is not (or no longer) owned here.
        e @ (Error::NotOwned { .. }
        | Error::Ledger(sendledger_store::Error::PartitionLost { .. })) => {
            SinkError::NotOwned(Chain(&e).to_string())
        }
        e => {
            let transient = e.is_transient();
            failure(&e, transient)
        }
    }
}

/// A failure the message did not cause: retried while it may pass, else fatal.
fn failure(e: &(dyn std::error::Error + 'static), transient: bool) -> SinkError {
    let message = Chain(e).to_string();
    match transient {
        true => SinkError::Retry(message),
        false => SinkError::Fatal(message),
    }
}

impl RequestSink for EngineSink {
    fn submit(&self, request: TaskRequest, source: Source) -> BoxFuture<Result<(), SinkError>> {
        let engine = self.engine.clone();
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
        let engine = self.engine.clone();
        Box::pin(async move {
            engine
                .reject_input(source, reason, &raw)
                .await
                .map(|_| ())
                .map_err(classify)
        })
    }

    fn processed(&self, topic: String, partition: i32) -> BoxFuture<Result<Processed, SinkError>> {
        let ledger = self.engine.ledger().clone();
        Box::pin(async move {
            ledger
                .read(move |l| l.processed(&topic, partition))
                .await
                .map_err(|e| failure(&e, true))
        })
    }

    fn raise_watermarks(
        &self,
        topic: String,
        marks: Vec<(i32, i64)>,
    ) -> BoxFuture<Result<(), SinkError>> {
        let ledger = self.engine.ledger().clone();
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
                .map_err(|e| failure(&e, true))
        })
    }
}

/// How long done requests offsets wait for a transaction with events to carry them before
/// they get one of their own.
const OFFSETS_WAIT: Duration = Duration::from_secs(1);

/// Kafka mode: commits the requests offsets that no transaction with events carried (the
/// last deliveries of a partition were all dropped as processed), each partition's in a
/// transaction of its own. Without it the group's committed offset would stay behind them
/// and the next owner would read them again. Ends with the replicator or the ledger.
async fn commit_waiting_offsets(replicator: std::sync::Weak<LogReplicator>, ledger: Ledger) {
    let mut tick = tokio::time::interval(OFFSETS_WAIT);
    // Each partition's transaction runs on its own, so a hung one holds up no other; a
    // partition is not asked again while its last one lasts.
    let mut turns = tokio::task::JoinSet::new();
    let mut running = std::collections::HashSet::new();
    loop {
        tick.tick().await;
        while let Some(done) = turns.try_join_next() {
            match done {
                Ok((_, Err(sendledger_store::Error::Closed))) => return,
                // A lost partition is taken over again; its offsets wait for that.
                Ok((partition, Err(e))) => {
                    running.remove(&partition);
                    tracing::debug!(partition, error = %e, "requests offset not committed")
                }
                Ok((partition, Ok(_))) => {
                    running.remove(&partition);
                }
                Err(_) => {}
            }
        }
        let Some(waiting) = replicator
            .upgrade()
            .map(|r| r.waiting_commits(OFFSETS_WAIT))
        else {
            return;
        };
        for partition in waiting {
            if !running.insert(partition) {
                continue;
            }
            let turn = Append {
                partition: Some(partition),
                commit_offsets: true,
                ..Append::default()
            };
            let ledger = ledger.clone();
            turns.spawn(async move { (partition, ledger.append(turn).await) });
        }
    }
}

/// How long a take-over waits for the brokers (opening the log, reading it).
const TAKE_OVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Events applied per restore step: a partition's log is read and applied in steps, so a long
/// log never sits in memory whole (each step records its checkpoint).
const RESTORE_STEP: usize = 10_000;

/// The events of the last transaction a restore read (its last run of consecutive offsets),
/// and when the first was written.
#[derive(Debug, Default)]
struct LastTransaction {
    events: Vec<(TaskId, u32)>,
    /// Record timestamp of its first event, ms.
    written_at: i64,
}

/// Clock skew allowed between the last transaction's writer and the instance taking over when
/// telling whether it was recent enough to have been open at the fencing.
const LOST_RESULTS_SLACK: Duration = Duration::from_secs(30);

/// The event id a record of the log carries in its headers.
fn record_event_id(record: &LogRecord) -> Option<String> {
    (record.headers.iter())
        .find(|(k, _)| *k == sendledger_kafka::EVENT_ID_HEADER)
        .map(|(_, v)| v.clone())
}

/// Kafka mode's partition owner: the engine, its replicator and the brokers.
pub struct KafkaOwner {
    kafka: Kafka,
    engine: Engine,
    replicator: Arc<LogReplicator>,
    runtime: tokio::runtime::Handle,
    /// The task committing waiting partitions' offsets: it holds the ledger, so it ends with
    /// the owner.
    offsets: tokio::task::AbortHandle,
    /// The take-overs under way or done and not released since, by partition, each with its
    /// own number: a take-over owns its partition's log only while its claim stands.
    claims: std::sync::Mutex<Claims>,
}

#[derive(Default)]
struct Claims {
    next: u64,
    held: HashMap<i32, u64>,
}

impl Drop for KafkaOwner {
    fn drop(&mut self) {
        self.offsets.abort();
    }
}

impl KafkaOwner {
    /// Must be called within a tokio runtime (the engine's futures run on it).
    pub fn new(
        kafka: Kafka,
        engine: Engine,
        replicator: Arc<LogReplicator>,
    ) -> crate::error::Result<KafkaOwner> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            crate::error::Error::step("finding the runtime of kafka mode's partitions", e)
        })?;
        let offsets = runtime
            .spawn(commit_waiting_offsets(
                Arc::downgrade(&replicator),
                engine.ledger().clone(),
            ))
            .abort_handle();
        Ok(KafkaOwner {
            kafka,
            engine,
            replicator,
            runtime,
            offsets,
            claims: Default::default(),
        })
    }

    /// Reads the partition's log from the ledger's checkpoint and applies it, a step at a time:
    /// a thread of its own reads and decodes the next step while the last one is applied.
    /// Returns the events applied and the log's last transaction as read ([`LastTransaction`]).
    /// Tasks found with two histories owe a review, recorded with the step that found them
    /// ([`Engine::assign_partition`] sends them).
    ///
    /// The copy is checked against the log first: the log must still hold, at the offset
    /// before the checkpoint, the last event the copy recorded. A copy ahead of its log or apart
    /// from it (the brokers lost committed events, or a tail was written again since) is
    /// restored from the log's start and truncated to it ([`Engine::truncate_to_log`]).
    fn restore(&self, partition: i32) -> Result<(usize, LastTransaction), String> {
        let checkpoint = self
            .engine
            .ledger()
            .log_checkpoint(partition)
            .map_err(|e| Chain(&e).to_string())?;
        let label = partition.to_string();
        let (from, truncate) = match checkpoint {
            Some(checkpoint) if checkpoint > 0 => match self.check_copy(partition, checkpoint)? {
                None => (checkpoint, false),
                Some(why) => {
                    tracing::error!(partition, checkpoint, why = %why, "the ledger's copy of the partition is not what its log holds (the brokers lost committed events): it is restored from the log's start and truncated to it, and its tasks that lost events that matter go to review");
                    metrics::counter!(crate::metric_definitions::COPIES_TRUNCATED_TOTAL, "partition" => label.clone()).increment(1);
                    (0, true)
                }
            },
            _ => (0, false),
        };
        let restoring = metrics::gauge!(crate::metric_definitions::PARTITION_RESTORING, "partition" => label.clone());
        let restored = metrics::counter!(crate::metric_definitions::RESTORED_EVENTS_TOTAL, "partition" => label);
        restoring.set(1.0);
        let started = std::time::Instant::now();
        // Time spent applying (the rest is waiting for the reader), for the log line.
        let mut applying = Duration::ZERO;
        let kafka = &self.kafka;
        let outcome = std::thread::scope(|scope| {
            // Two steps decoded ahead at most. Each comes with the position after its last
            // event (none for an empty step): the checkpoint, whose offset before is an event.
            let (steps, decoded) = std::sync::mpsc::sync_channel::<(Vec<Event>, Option<i64>)>(2);
            let reader = scope.spawn(move || -> Result<LastTransaction, String> {
                let mut step = Vec::with_capacity(RESTORE_STEP);
                let mut last = None;
                let mut tail = LastTransaction::default();
                read_partition(kafka, partition, from, TAKE_OVER_TIMEOUT, |record| {
                    let event = record_event(record)?;
                    // A transaction's events are contiguous; its commit marker takes the
                    // offset after them.
                    if last.is_some_and(|l| l + 1 != record.offset()) {
                        tail.events.clear();
                    }
                    if tail.events.is_empty() {
                        tail.written_at = record.timestamp().to_millis().unwrap_or(0);
                    }
                    tail.events.push((event.task_id, event.task_seq));
                    step.push(event);
                    last = Some(record.offset());
                    if step.len() >= RESTORE_STEP {
                        let full = std::mem::replace(&mut step, Vec::with_capacity(RESTORE_STEP));
                        steps.send((full, last.map(|o| o + 1))).map_err(|_| {
                            sendledger_kafka::Error::Replay {
                                topic: kafka.config().events_topic.clone(),
                                detail: "the restore stopped".into(),
                            }
                        })?;
                    }
                    Ok(())
                })
                .map_err(|e| Chain(&e).to_string())?;
                let _ = steps.send((step, last.map(|o| o + 1)));
                Ok(tail)
            });
            let mut applied = 0;
            // Truncating: how many events the log holds of each task, and where it ends.
            let mut logged: HashMap<TaskId, u32> = HashMap::new();
            let mut end = None;
            let mut failed = None;
            for (events, next) in decoded.iter() {
                let at = std::time::Instant::now();
                if truncate {
                    for e in &events {
                        let n = logged.entry(e.task_id).or_default();
                        *n = (*n).max(e.task_seq + 1);
                    }
                    end = next.or(end);
                }
                // A copy being truncated records its checkpoint with the truncation: until
                // then, a take-over finds it apart from its log again.
                let checkpoint = next.filter(|_| !truncate);
                match self
                    .runtime
                    .block_on(self.engine.restore(partition, events, checkpoint))
                {
                    Ok((n, _)) => {
                        applying += at.elapsed();
                        restored.increment(n as u64);
                        applied += n;
                    }
                    Err(e) => {
                        failed = Some(Chain(&e).to_string());
                        break;
                    }
                }
            }
            // Stops the reader if applying failed.
            drop(decoded);
            let read = reader
                .join()
                .unwrap_or_else(|_| Err("the log's reader panicked".into()));
            if let Some(e) = failed {
                return Err(e);
            }
            let tail = read?;
            if truncate {
                let truncated = self
                    .runtime
                    .block_on(
                        self.engine
                            .truncate_to_log(partition, logged, end.unwrap_or(0)),
                    )
                    .map_err(|e| Chain(&e).to_string())?;
                tracing::warn!(
                    partition,
                    tasks = truncated.len(),
                    "the partition's copy is truncated to its log"
                );
            }
            Ok((applied, tail))
        });
        restoring.set(0.0);
        metrics::histogram!(crate::metric_definitions::PARTITION_RESTORE_SECONDS)
            .record(started.elapsed().as_secs_f64());
        tracing::debug!(partition, took = ?started.elapsed(), applying = ?applying, "partition log read and applied");
        outcome
    }

    /// Publishes again, in a transaction of the new log before the partition is worked, the
    /// results the log's last transaction announces that the results topic lacks. A broker
    /// that keeps its promises aborts a fenced writer's open transaction, and then there are
    /// none; one that commits it with the records that reached it (the test broker) can leave
    /// the events without their results, since the log writes a transaction's events before
    /// its results. Only a transaction recent enough to have been open at the fencing (within
    /// the transaction timeout) is looked at, and the results topic only from its time on.
    fn publish_lost_results(
        &self,
        partition: i32,
        log: &PartitionLog,
        tail: LastTransaction,
    ) -> Result<(), String> {
        let now = sendledger_actors::now_ms() as i64;
        let open_for = (TAKE_OVER_TIMEOUT + LOST_RESULTS_SLACK).as_millis() as i64;
        if tail.events.is_empty() || tail.written_at < now - open_for {
            return Ok(());
        }
        let ledger = self.engine.ledger();
        let mut events = Vec::with_capacity(tail.events.len());
        for (task, seq) in tail.events {
            if let Some(e) = ledger
                .task_event(task, seq)
                .map_err(|e| Chain(&e).to_string())?
            {
                events.push(e);
            }
        }
        let results = self
            .replicator
            .results_of(partition, &events, &|task| ledger.task_events(task))
            .map_err(|e| format!("projecting the log's last results: {e:?}"))?;
        let wanted: Vec<String> = results.iter().filter_map(record_event_id).collect();
        // Its results were produced after its events, by the same producer: from the first
        // event's timestamp on (a second earlier, for timestamps taken on another thread).
        let since = tail.written_at - 1000;
        let missing = missing_results(&self.kafka, since, &wanted, TAKE_OVER_TIMEOUT)
            .map_err(|e| Chain(&e).to_string())?;
        if missing.is_empty() {
            return Ok(());
        }
        let batch = LogBatch {
            results: (results.into_iter())
                .filter(|r| record_event_id(r).is_some_and(|id| missing.contains(&id)))
                .collect(),
            ..LogBatch::default()
        };
        tracing::error!(partition, results = batch.results.len(), "the log's last transaction holds events whose results the brokers did not keep (a fenced writer's transaction committed in part): they are published again");
        log.commit(&batch, None)
            .map_err(|e| Chain(&e).to_string())?;
        Ok(())
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why the ledger's copy of the partition, recorded up to `checkpoint`, is not what its log
    /// holds, if it is not: the log ends before the checkpoint, or its event just before the
    /// checkpoint is not the last one the copy recorded from it.
    fn check_copy(&self, partition: i32, checkpoint: i64) -> Result<Option<String>, String> {
        let last = checkpoint - 1;
        let (end, found) = event_at(&self.kafka, partition, last, TAKE_OVER_TIMEOUT)
            .map_err(|e| Chain(&e).to_string())?;
        if end < checkpoint {
            return Ok(Some(format!(
                "the log ends at offset {end}, before the copy's checkpoint {checkpoint}"
            )));
        }
        let Some((_, logged)) = found.filter(|(offset, _)| *offset == last) else {
            return Ok(Some(format!(
                "the log holds no committed event at offset {last}, the last one the copy recorded"
            )));
        };
        let held = self
            .engine
            .ledger()
            .task_event(logged.task_id, logged.task_seq)
            .map_err(|e| Chain(&e).to_string())?;
        match held {
            Some(held) if held.body == logged.body && held.at == logged.at => Ok(None),
            _ => Ok(Some(format!(
                "the log's event at offset {last} (task {} event {}) is not one the copy recorded",
                logged.task_id, logged.task_seq
            ))),
        }
    }
}

impl PartitionOwner for KafkaOwner {
    /// Claims the partition, opens its log, restores it and resumes its tasks. A release that
    /// comes meanwhile withdraws the claim: the log is not owned if it has not been yet, and
    /// given up again if it has.
    fn take_over(&self, partition: i32) -> Result<(), String> {
        let started = std::time::Instant::now();
        let claim = {
            let mut claims = self.claims();
            claims.next += 1;
            let claim = claims.next;
            claims.held.insert(partition, claim);
            claim
        };
        const RELEASED: &str = "the partition was given up during its take-over";
        // Opening the log fences the previous owner and aborts its open transaction, so what
        // is read next is all it ever committed.
        let log = PartitionLog::open(&self.kafka, partition, TAKE_OVER_TIMEOUT)
            .map_err(|e| Chain(&e).to_string())?;
        let (restored, tail) = self.restore(partition)?;
        self.publish_lost_results(partition, &log, tail)?;
        {
            let claims = self.claims();
            if claims.held.get(&partition) != Some(&claim) {
                return Err(RELEASED.into());
            }
            self.replicator.own(log);
        }
        let resumed = self
            .runtime
            .block_on(self.engine.assign_partition(partition))
            .map_err(|e| {
                self.release(partition);
                Chain(&e).to_string()
            })?;
        {
            // Released while its tasks were resumed: they may have been taken on after the
            // release, so the partition is given up again.
            let claims = self.claims();
            if claims.held.get(&partition) != Some(&claim) {
                self.engine.revoke_partition(partition);
                self.replicator.release(partition);
                return Err(RELEASED.into());
            }
        }
        tracing::info!(partition, restored, resumed, took = ?started.elapsed(), "partition restored from its log and resumed");
        Ok(())
    }

    fn release(&self, partition: i32) {
        let mut claims = self.claims();
        claims.held.remove(&partition);
        self.engine.revoke_partition(partition);
        self.replicator.release(partition);
    }

    fn received(
        &self,
        partition: i32,
        offset: i64,
        group: Option<sendledger_kafka::rdkafka::consumer::ConsumerGroupMetadata>,
    ) {
        self.replicator.received(partition, offset, group);
    }

    fn done(
        &self,
        partition: i32,
        offset: i64,
        group: Option<sendledger_kafka::rdkafka::consumer::ConsumerGroupMetadata>,
    ) {
        self.replicator.done(partition, offset, group);
    }

    fn lost(&self) -> Vec<(i32, bool)> {
        self.replicator.take_lost()
    }

    fn stalled(&self, partition: i32) -> bool {
        self.engine.ledger().stats().transaction_stalled(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closed ledger stops the ingest with its cause; a draining engine is waited for; a bad
    /// request is rejected.
    #[test]
    fn engine_errors_map_to_what_the_consumer_does() {
        let closed = classify(Error::Ledger(sendledger_store::Error::Closed));
        assert_eq!(
            closed,
            SinkError::Fatal("ledger: the journal has stopped; the ledger is closed".into())
        );
        assert!(matches!(classify(Error::ShuttingDown), SinkError::Retry(_)));
        assert!(matches!(classify(Error::Stopped), SinkError::Fatal(_)));
        let empty = sendledger_core::Error::Empty { field: "tenant" };
        assert_eq!(
            classify(Error::Invalid(empty.clone())),
            SinkError::Invalid(empty.to_string())
        );
    }
}
