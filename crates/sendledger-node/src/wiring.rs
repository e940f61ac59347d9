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
use std::sync::{Arc, Weak};
use std::time::Duration;

use sendledger_core::decide::{AttemptOutcome, Sending};
use sendledger_core::error::Chain;
use sendledger_core::event::{Millis, NotSentCause};
use sendledger_core::saga::Call;
use sendledger_core::{
    BoxFuture, Event, PlannedStep, Policy, RetryClass, Source, TaskId, TaskRequest, TraceParent,
};
use sendledger_effects::{SendSlot, Targets};
use sendledger_kafka::snapshot;
use sendledger_kafka::take_over::{self, Brokers as _};
use sendledger_kafka::{Kafka, LogReplicator, PartitionOwner, RequestSink, SinkError, Standby};
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

    fn steps(&self, name: &str) -> Option<Vec<PlannedStep>> {
        self.targets.steps(name).map(<[PlannedStep]>::to_vec)
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
        call: Call<'_>,
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
        let (request, steps) = (call.request.clone(), call.steps.clone());
        let key = idempotency_key.map(str::to_owned);
        let slot = slot.and_then(|slot| slot.downcast::<SendSlot>().ok());
        Box::pin(async move {
            let request = Call {
                request: &request,
                steps: &steps,
            };
            match slot {
                Some(slot) => {
                    target
                        .execute_reserved(request, attempt, key.as_deref(), sending, *slot)
                        .await
                }
                None => {
                    target
                        .execute_with(request, attempt, key.as_deref(), sending)
                        .await
                }
            }
        })
    }

    fn lookup_url(&self, target: &str, call: Call<'_>) -> Option<Result<String, String>> {
        self.targets.get(target)?.lookup_url(call)
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
        call: Call<'_>,
        since: Millis,
        trace: Option<TraceParent>,
    ) -> BoxFuture<Result<sendledger_core::saga::Found, LookupError>> {
        let Some(target) = self.targets.get(target).cloned() else {
            let err = format!("target `{target}` is not configured");
            return Box::pin(std::future::ready(Err(LookupError::new(err, false))));
        };
        let (request, steps) = (call.request.clone(), call.steps.clone());
        Box::pin(async move {
            let call = Call {
                request: &request,
                steps: &steps,
            };
            target
                .lookup_found(call, Some(since), trace)
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

/// The engine as the writer of a partition's copy during its take-over, or as a standby's.
struct EngineCopy {
    engine: Engine,
    runtime: tokio::runtime::Handle,
    /// Counts the events applied.
    restored: Option<metrics::Counter>,
}

impl take_over::Copy for EngineCopy {
    fn ledger(&self) -> &Ledger {
        self.engine.ledger()
    }

    fn restore(
        &self,
        partition: i32,
        events: Vec<Event>,
        checkpoint: Option<sendledger_store::Logged>,
    ) -> Result<usize, String> {
        let (n, _) = (self.runtime)
            .block_on(self.engine.restore(partition, events, checkpoint))
            .map_err(|e| Chain(&e).to_string())?;
        if let Some(restored) = &self.restored {
            restored.increment(n as u64);
        }
        Ok(n)
    }

    fn truncate(
        &self,
        partition: i32,
        logged: HashMap<TaskId, u32>,
        checkpoint: sendledger_store::Logged,
    ) -> Result<(), String> {
        let truncated = (self.runtime)
            .block_on(self.engine.truncate_to_log(partition, logged, checkpoint))
            .map_err(|e| Chain(&e).to_string())?;
        tracing::warn!(
            partition,
            tasks = truncated.len(),
            "the partition's copy is truncated to its log"
        );
        Ok(())
    }
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
    /// With `kafka.snapshot_interval`: the task writing the owned partitions' snapshots.
    snapshots: Option<tokio::task::AbortHandle>,
    /// The take-overs under way or done and not released since, by partition, each with its
    /// own number: a take-over owns its partition's log only while its claim stands.
    claims: std::sync::Mutex<Claims>,
    /// With `kafka.standby`: the copies of the partitions not owned here, kept current.
    standby: Option<Standby>,
    /// The partition count of the log of record (and of the requests topic, checked at start).
    partitions: i32,
}

#[derive(Default)]
struct Claims {
    next: u64,
    held: HashMap<i32, u64>,
    /// The partitions whose take-over is under way (claim withdrawn or not): the standby
    /// follows one given up meanwhile only once its take-over has stopped writing its copy.
    running: std::collections::HashSet<i32>,
}

impl Drop for KafkaOwner {
    fn drop(&mut self) {
        self.offsets.abort();
        if let Some(snapshots) = &self.snapshots {
            snapshots.abort();
        }
    }
}

/// Writes a snapshot of each partition owned here every `interval` (when its log moved on
/// since the last one), one partition at a time, on the blocking pool; ends with the
/// replicator.
async fn write_snapshots(
    kafka: Kafka,
    replicator: Weak<LogReplicator>,
    interval: Duration,
    identity_retention: Option<Duration>,
) {
    let partitions = kafka.config().partitions;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(owned) = replicator
            .upgrade()
            .map(|r| (0..partitions).filter(|p| r.owns(*p)).collect::<Vec<i32>>())
        else {
            return;
        };
        for partition in owned {
            let label = partition.to_string();
            let kafka = kafka.clone();
            let started = std::time::Instant::now();
            let written = tokio::task::spawn_blocking(move || {
                let now = sendledger_actors::now_ms();
                let idle = take_over::TAKE_OVER_TIMEOUT;
                snapshot::write(&kafka, partition, now, identity_retention, idle)
            })
            .await;
            match written {
                Ok(Ok(Some(w))) => {
                    let m = &w.manifest;
                    tracing::info!(partition, next = m.next, tasks = m.tasks, kept = m.kept, forgotten = m.forgotten, chunks = m.chunks.len(), events_read = w.events_read, took = ?started.elapsed(), "partition snapshot written");
                    metrics::counter!(crate::metric_definitions::SNAPSHOTS_WRITTEN_TOTAL, "partition" => label.clone()).increment(1);
                    let gauge = |kind: &'static str, n: u64| {
                        metrics::gauge!(crate::metric_definitions::SNAPSHOT_TASKS, "partition" => label.clone(), "kind" => kind).set(n as f64);
                    };
                    gauge("kept", m.kept);
                    gauge("events", m.tasks - m.kept);
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(partition, error = %Chain(&e), "the partition's snapshot could not be written; the next interval tries again");
                    metrics::counter!(crate::metric_definitions::SNAPSHOTS_FAILED_TOTAL, "partition" => label).increment(1);
                }
                Err(_) => return,
            }
        }
    }
}

impl KafkaOwner {
    /// Must be called within a tokio runtime (the engine's futures run on it). With
    /// `kafka.snapshot_interval`, its snapshots leave out the identities settled longer ago
    /// than `identity_retention`. `partitions` is the events topic's partition count (see
    /// `Kafka::check_log_of_record`).
    pub fn new(
        kafka: Kafka,
        engine: Engine,
        replicator: Arc<LogReplicator>,
        partitions: i32,
        identity_retention: Option<Duration>,
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
        let snapshots = kafka.config().snapshot_interval.map(|interval| {
            let replicator = Arc::downgrade(&replicator);
            let writer = write_snapshots(kafka.clone(), replicator, interval, identity_retention);
            runtime.spawn(writer).abort_handle()
        });
        let standby = match kafka.config().standby {
            true => {
                let copy = EngineCopy {
                    engine: engine.clone(),
                    runtime: runtime.clone(),
                    restored: None,
                };
                let standby = Standby::start(&kafka, copy, partitions).map_err(|e| {
                    crate::error::Error::step("starting kafka mode's standby copies", e)
                })?;
                Some(standby)
            }
            false => None,
        };
        Ok(KafkaOwner {
            kafka,
            engine,
            replicator,
            runtime,
            offsets,
            snapshots,
            claims: Default::default(),
            standby,
            partitions,
        })
    }

    /// Restores the partition from its log, just opened (see [`take_over::restore`]), with its
    /// metrics and logs.
    fn restore(&self, partition: i32) -> Result<usize, String> {
        let label = partition.to_string();
        let restoring = metrics::gauge!(crate::metric_definitions::PARTITION_RESTORING, "partition" => label.clone());
        let copy = EngineCopy {
            engine: self.engine.clone(),
            runtime: self.runtime.clone(),
            restored: Some(
                metrics::counter!(crate::metric_definitions::RESTORED_EVENTS_TOTAL, "partition" => label.clone()),
            ),
        };
        restoring.set(1.0);
        let started = std::time::Instant::now();
        let outcome = take_over::restore(&self.kafka, &copy, partition, take_over::RESTORE_STEP);
        restoring.set(0.0);
        metrics::histogram!(crate::metric_definitions::PARTITION_RESTORE_SECONDS)
            .record(started.elapsed().as_secs_f64());
        let restore = outcome?;
        if let Some(why) = &restore.truncated {
            tracing::error!(partition, why = %why, "the ledger's copy of the partition was not what its log holds (the brokers lost committed events): it was restored from the log's start and truncated to it, and its tasks that lost events that matter go to review");
            metrics::counter!(crate::metric_definitions::COPIES_TRUNCATED_TOTAL, "partition" => label)
                .increment(1);
        }
        if let Some(m) = &restore.snapshot {
            tracing::info!(partition, snapshot = %format!("{:x}", m.id), next = m.next, tasks = m.tasks, kept = m.kept, "the partition was restored from its latest snapshot and the log after it");
        }
        tracing::debug!(partition, took = ?started.elapsed(), applying = ?restore.applying, "partition log read and applied");
        Ok(restore.events)
    }

    /// [`PartitionOwner::take_over`] once the partition is claimed (`claim`).
    fn take_over_claimed(&self, partition: i32, claim: u64) -> Result<(), String> {
        let started = std::time::Instant::now();
        const RELEASED: &str = "the partition was given up during its take-over";
        // The standby stops applying the partition's events (the restore does from here), and
        // what this instance's last generation of it committed is written before the restore
        // reads the copy.
        if let Some(standby) = &self.standby {
            standby.unfollow(partition);
        }
        (self.engine.ledger())
            .quiesce_blocking(partition, take_over::QUIESCE)
            .map_err(|e| Chain(&e).to_string())?;
        // Opening the log fences the previous owner and aborts its open transaction, so what
        // is read next is all it ever committed.
        let log = self.kafka.open(partition)?;
        let restored = self.restore(partition)?;
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

    fn claims(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PartitionOwner for KafkaOwner {
    /// Claims the partition, opens its log, restores it and resumes its tasks. A release that
    /// comes meanwhile withdraws the claim: the log is not owned if it has not been yet, and
    /// given up again if it has; the standby follows the partition once the take-over ends
    /// (never while it may still write the partition's copy).
    fn take_over(&self, partition: i32) -> Result<(), String> {
        if partition >= self.partitions {
            return Err(format!(
                "the events topic has no partition {partition} (it has {}): partitions were added to the requests topic, and its requests cannot be placed in a log; they wait, unconsumed (see docs/kafka-mode.md, \"Partitions are fixed\")",
                self.partitions
            ));
        }
        let claim = {
            let mut claims = self.claims();
            claims.next += 1;
            let claim = claims.next;
            claims.held.insert(partition, claim);
            claims.running.insert(partition);
            claim
        };
        let outcome = self.take_over_claimed(partition, claim);
        let mut claims = self.claims();
        claims.running.remove(&partition);
        // Given up during its take-over: the copy is the standby's again, now that the
        // take-over no longer writes it.
        if let Some(standby) =
            (self.standby.as_ref()).filter(|_| claims.held.get(&partition) != Some(&claim))
        {
            standby.follow(partition);
        }
        outcome
    }

    fn log_partitions(&self) -> i32 {
        self.partitions
    }

    fn release(&self, partition: i32) {
        let mut claims = self.claims();
        claims.held.remove(&partition);
        self.engine.revoke_partition(partition);
        self.replicator.release(partition);
        if let Some(standby) =
            (self.standby.as_ref()).filter(|_| !claims.running.contains(&partition))
        {
            standby.follow(partition);
        }
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
