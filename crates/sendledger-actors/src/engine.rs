//! The engine handle: start it on a ledger directory with a [`Remote`], submit requests,
//! resolve reviews, shut it down.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use sendledger_core::decide::{decide, Ctx, Input, OperatorResolution, REJECTED_RAW_KEEP};
use sendledger_core::error::Chain;
use sendledger_core::{
    AcceptedRequest, Event, EventBody, Identity, Limits, Phase, Source, State, TaskId, TaskRequest,
};
use sendledger_store::{
    Append, Diverged, Durability, Ledger, LedgerOptions, Logged, Memory, Replicator, Restored,
    TaskPage, TaskQuery,
};
use tokio::sync::oneshot;

use crate::closed_breakers::ClosedBreakers;
use crate::error::{Error, Result};
use crate::messages::{Drain, Load, Reply, Route, Schedule, TaskInput};
use crate::ownership::Ownership;
use crate::reconciler::Reconciler;
use crate::registry::Registry;
use crate::remote::Remote;
use crate::task::{record, Shared};
use crate::timers::Timers;
use crate::versions::IdentityLocks;
use crate::watchers::{TaskWatch, Watchers};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub ledger_dir: PathBuf,
    pub durability: Durability,
    /// RocksDB's memory budget for the ledger.
    pub memory: Memory,
    /// Threads that run task actors (and their HTTP attempts); `default_workers()` unless
    /// configured.
    pub workers: usize,
    /// Most task actors alive at once; further messages wait in the registry.
    pub max_live_tasks: usize,
    /// Most lookups in flight at once.
    pub lookup_concurrency: usize,
    /// How often due timers are checked.
    pub timer_tick: Duration,
    /// Seed of retry jitter, for reproducible runs.
    pub seed: u64,
    pub limits: Limits,
    /// Kafka mode: events are recorded only once the log of record took them
    /// ([`Engine::install_replicator`]), and tasks act only for the partitions assigned with
    /// [`Engine::assign_partition`]; nothing is resumed at start.
    pub replicated: bool,
    /// Kafka mode's send lease: an attempt's first byte is written within this time of its
    /// intent being handed to the ledger, or never (the attempt ends not sent). It bounds how
    /// late an instance that stalled after recording an intent, and lost its partition
    /// meanwhile, can still send. `None`: no bound (local mode, one writer).
    pub send_lease: Option<Duration>,
    /// Where retention archives what it removes ([`sendledger_store::archive`]).
    pub archive: Option<PathBuf>,
}

/// Actor threads when none are configured: half the cores, at least one. The task actors take
/// about a third of the service's CPU, and every message between an actor thread and the
/// others' (the journal's, the ingest's, the registry's) may wake one: on two cores one actor
/// thread did more than two (`sendledger-bench kafka`, 100,000 tasks: 7% more tasks a second at 10% less
/// CPU a task).
fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}

impl EngineConfig {
    pub fn new(ledger_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            ledger_dir: ledger_dir.into(),
            durability: Durability::Sync,
            memory: Memory::default(),
            workers: default_workers(),
            max_live_tasks: 10_000,
            lookup_concurrency: 32,
            timer_tick: Duration::from_millis(10),
            seed: 0x5e4d_1ed9,
            limits: Limits::default(),
            replicated: false,
            send_lease: None,
            archive: None,
        }
    }
}

/// Threads for blocking work (the task actors' ledger reads) per actor thread's runtime: the
/// system's and each worker's. Tokio's default is 512 a runtime: a service taking 3,000
/// requests per second had grown to 148 Tokio threads (its own runtime allows 18), each with a
/// stack and allocator pages of its own. The reads are short and bound by the CPU. Name
/// lookups of new HTTP connections, which can hang as long as the resolver waits, run on
/// threads of their own (the effects crate's resolver), never in this pool.
const BLOCKING_THREADS_PER_RUNTIME: usize = 8;

/// The Tokio runtime of an actor thread: actix's (one thread, timers and I/O), with at most
/// [`BLOCKING_THREADS_PER_RUNTIME`] threads for blocking work.
fn actor_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS_PER_RUNTIME)
        .build()
        .expect("an actor thread's runtime could not be created")
}

/// A task waiting for a person, with the evidence gathered so far.
#[derive(Debug, Clone)]
pub struct ReviewItem {
    pub task_id: TaskId,
    pub state: State,
}

impl ReviewItem {
    /// The tasks of a ledger in manual review. Blocking: scans the task summaries and folds
    /// the events of each task in review.
    pub fn list(ledger: &Ledger) -> sendledger_store::Result<Vec<ReviewItem>> {
        let mut out = Vec::new();
        for (task_id, summary) in ledger.active_tasks()? {
            if summary.phase == Phase::ManualReview {
                out.push(ReviewItem {
                    task_id,
                    state: sendledger_core::fold(&ledger.task_events(task_id)?),
                });
            }
        }
        Ok(out)
    }
}

/// How many tasks a pass of retention removes at once (each through its actor): enough that
/// their appends share fsyncs.
pub const PRUNE_AT_ONCE: usize = 1024;

/// A running engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Addr<Registry>,
    ledger: Ledger,
    remote: Arc<dyn Remote>,
    limits: Limits,
    durability: Durability,
    ownership: Option<Arc<Ownership>>,
    watchers: Arc<Watchers>,
    /// A delivery of an identity is recorded under its lock (one version at a time).
    identity_locks: Arc<IdentityLocks>,
    system: System,
    stopped: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Engine {
    /// Opens the ledger, starts the actors, and resumes every task that is not terminal: a task
    /// found sending (intent recorded, no outcome) is reconciled, never resent.
    ///
    /// Blocking (it reads the ledger); call it outside async code or in `spawn_blocking`.
    pub fn start(config: EngineConfig, remote: Arc<dyn Remote>) -> Result<Engine> {
        let ledger = Ledger::open(
            &config.ledger_dir,
            LedgerOptions {
                durability: config.durability,
                memory: config.memory,
                replicated: config.replicated,
                archive: config.archive.clone(),
            },
        )?;
        if config.durability == Durability::Buffered {
            tracing::warn!(
                ledger = %config.ledger_dir.display(),
                "durability is `buffered`: acknowledged events are not fsynced and can be lost on \
                 power loss or an OS crash, and with them the proof that a request was sent; \
                 use `storage.durability = \"sync\"` in production"
            );
        }
        let mode = match config.durability {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
        };
        metrics::gauge!(crate::metric_definitions::LEDGER_DURABILITY, "mode" => mode).set(1.0);
        // Kafka mode: nothing is owned yet; each partition's tasks resume when it is assigned.
        let ownership = config.replicated.then(|| Arc::new(Ownership::default()));
        let (active, timers) = match ownership {
            Some(_) => (Vec::new(), Vec::new()),
            None => (
                ledger.active_tasks()?,
                ledger.due_timers(u64::MAX, usize::MAX)?,
            ),
        };

        let (tx, rx) = std::sync::mpsc::channel();
        let (stopped_tx, stopped_rx) = oneshot::channel();
        let (ledger2, remote2, cfg) = (ledger.clone(), remote.clone(), config.clone());
        let ownership2 = ownership.clone();
        let watchers = Arc::new(Watchers::default());
        let watchers2 = watchers.clone();
        let identity_locks = Arc::new(IdentityLocks::default());
        let identity_locks2 = identity_locks.clone();
        std::thread::Builder::new()
            .name("sendledger-engine".into())
            .spawn(move || {
                let system = System::with_tokio_rt(actor_runtime);
                system.block_on(async move {
                    let arbiters: Vec<Arbiter> = (0..cfg.workers.max(1))
                        .map(|_| Arbiter::with_tokio_rt(actor_runtime))
                        .collect();
                    let (watched_remote, watched_ledger) = (remote2.clone(), ledger2.clone());
                    let registry = Registry::create(move |ctx| {
                        let registry = ctx.address();
                        let shared = Arc::new(Shared {
                            ledger: ledger2,
                            remote: remote2.clone(),
                            timers: Timers::new(registry.clone().recipient(), cfg.timer_tick)
                                .start()
                                .recipient(),
                            reconciler: Reconciler::new(
                                remote2,
                                registry.clone().recipient(),
                                cfg.lookup_concurrency,
                            )
                            .start()
                            .recipient(),
                            registry: registry.recipient(),
                            seed: cfg.seed,
                            ownership: ownership2,
                            send_lease: cfg.send_lease,
                            watchers: watchers2,
                            identity_locks: identity_locks2,
                            waiting: Default::default(),
                            versions_accepted: Default::default(),
                        });
                        let _ = tx.send((ctx.address(), shared.timers.clone(), System::current()));
                        Registry::new(shared, arbiters, cfg.max_live_tasks)
                    });
                    ClosedBreakers::new(watched_remote, watched_ledger, registry).start();
                });
                let _ = system.run();
                let _ = stopped_tx.send(());
            })
            .map_err(|_| Error::Stopped)?;
        let (registry, timer_addr, system) = rx.recv().map_err(|_| Error::Stopped)?;

        for (at, task_id, _) in timers {
            timer_addr.do_send(Schedule { at, task_id });
        }
        let resumed = active.iter().filter(|(_, s)| s.phase.resumable()).count();
        for (task_id, summary) in active {
            if summary.phase.resumable() {
                registry.do_send(Route {
                    task_id,
                    input: TaskInput::Recover,
                });
            }
        }
        tracing::info!(resumed, last_lsn = ledger.last_lsn(), "engine started");
        Ok(Engine {
            inner: Arc::new(Inner {
                registry,
                ledger,
                remote,
                limits: config.limits,
                durability: config.durability,
                ownership,
                watchers,
                identity_locks,
                system,
                stopped: std::sync::Mutex::new(Some(stopped_rx)),
            }),
        })
    }

    pub fn ledger(&self) -> &Ledger {
        &self.inner.ledger
    }

    /// Watches `task`: the watch wakes each time the task's actor has made events of it
    /// durable (read the task's state after taking the watch, then wait for a change).
    pub fn watch(&self, task: TaskId) -> TaskWatch {
        self.inner.watchers.watch(task)
    }

    /// Kafka mode: the partitions owned here (`None` in local mode).
    pub fn ownership(&self) -> Option<&Arc<Ownership>> {
        self.inner.ownership.as_ref()
    }

    /// The owned partitions, or why `what` does not apply (local mode).
    fn ownership_for(&self, what: &'static str) -> Result<&Arc<Ownership>> {
        self.inner.ownership.as_ref().ok_or(Error::LocalMode(what))
    }

    /// Kafka mode: installs the log of record (see [`Ledger::install_replicator`]).
    pub fn install_replicator(&self, replicator: Arc<dyn Replicator>) -> Result<()> {
        self.ownership_for("a log of record")?;
        self.inner
            .ledger
            .install_replicator(replicator)
            .map_err(|_| Error::ReplicatorInstalled)
    }

    /// Kafka mode: applies events of requests partition `partition` read from its log of
    /// record (from the ledger's checkpoint on), and records `checkpoint`, where they end in
    /// the log. Only while the partition is not owned here (its tasks do not act). Returns
    /// the number of events the ledger did not hold yet, and the tasks found with two
    /// histories: each owes a review, recorded with the restore (the replaced events may
    /// exist nowhere else) and sent when the partition is assigned.
    pub async fn restore(
        &self,
        partition: i32,
        events: Vec<Event>,
        checkpoint: Option<Logged>,
    ) -> Result<(usize, Vec<Diverged>)> {
        self.not_owned(partition, "restoring a partition")?;
        let ledger = self.inner.ledger.clone();
        let restored = ledger
            .read(move |l| sendledger_store::restore_append(l, events))
            .await?;
        let count = restored.append.events.len();
        let diverged = self.record_restore(partition, restored, checkpoint).await?;
        Ok((count, diverged))
    }

    /// Kafka mode: truncates the ledger's copy of requests partition `partition` to its log of
    /// record, once the whole log was restored over it (a copy found ahead of its log, or
    /// apart from it): `logged` is how many events the log holds of each task, `checkpoint`
    /// where the log ends. Each task that loses events owes a review,
    /// recorded with the truncation, unless what it lost is harmless (see
    /// [`Input::Diverged`]); a task its log never held is recorded again from its first event.
    ///
    /// [`Input::Diverged`]: sendledger_core::decide::Input::Diverged
    pub async fn truncate_to_log(
        &self,
        partition: i32,
        logged: HashMap<TaskId, u32>,
        checkpoint: Logged,
    ) -> Result<Vec<Diverged>> {
        self.not_owned(partition, "truncating a partition's copy")?;
        let ledger = self.inner.ledger.clone();
        let restored = ledger
            .read(move |l| sendledger_store::truncate_append(l, partition, &logged))
            .await?;
        self.record_restore(partition, restored, Some(checkpoint))
            .await
    }

    fn not_owned(&self, partition: i32, what: &'static str) -> Result<()> {
        if self.ownership_for(what)?.epoch(partition).is_some() {
            return Err(Error::RestoreWhileOwned(partition));
        }
        Ok(())
    }

    async fn record_restore(
        &self,
        partition: i32,
        restored: Restored,
        checkpoint: Option<Logged>,
    ) -> Result<Vec<Diverged>> {
        let (append, diverged) = restored.into_append(partition, checkpoint);
        let changed: Vec<(TaskId, bool)> = (append.tasks.iter())
            .map(|(task, summary)| (*task, summary.phase.is_terminal()))
            .collect();
        self.inner.ledger.append(append).await?;
        // A standby's copy (or a take-over's) is what the front door of a non-owner answers from.
        for (task, ended) in changed {
            self.inner.watchers.changed(task, ended, None);
        }
        if !diverged.is_empty() {
            metrics::counter!(crate::metric_definitions::DIVERGENT_HISTORIES_TOTAL)
                .increment(diverged.len() as u64);
        }
        Ok(diverged)
    }

    /// Kafka mode: takes requests partition `partition` on (call it once its log is open and
    /// restored) and resumes its unsettled tasks as start-up does in local mode: a task found
    /// sending is reconciled, timers are armed again. Returns the number of tasks resumed.
    ///
    /// The reviews its restores left owed (tasks whose history here the log's replaced) are
    /// recorded first, through the log (see [`Input::Diverged`]), and forgotten once
    /// recorded; only then are the tasks resumed. Should recording one fail, the partition is
    /// revoked again and the error returned: the next take-over sends them again.
    ///
    /// [`Input::Diverged`]: sendledger_core::decide::Input::Diverged
    pub async fn assign_partition(&self, partition: i32) -> Result<usize> {
        let ownership = self.ownership_for("assigning a partition")?.clone();
        ownership.assign(partition);
        let ledger = self.inner.ledger.clone();
        let owed = match ledger.read(move |l| l.reviews_owed(partition)).await {
            Ok(owed) => owed,
            Err(e) => {
                ownership.revoke(partition);
                return Err(e.into());
            }
        };
        let mut recorded = Append::default();
        for d in owed {
            let input = TaskInput::Diverged {
                task_seq: d.task_seq,
                replaced: d.replaced,
            };
            if let Err(e) = self.route(d.task_id, input).await {
                ownership.revoke(partition);
                return Err(e);
            }
            recorded.reviews_recorded.push((partition, d.task_id));
        }
        if !recorded.reviews_recorded.is_empty() {
            if let Err(e) = ledger.append(recorded).await {
                ownership.revoke(partition);
                return Err(e.into());
            }
        }
        let ledger = self.inner.ledger.clone();
        let tasks = ledger
            .read(move |l| {
                let active = l.active_tasks_of_partition(partition)?;
                Ok((active.into_iter())
                    .filter(|(_, summary)| summary.phase.resumable())
                    .map(|(task_id, _)| task_id)
                    .collect::<Vec<_>>())
            })
            .await?;
        for &task_id in &tasks {
            // Each resumes on its own; one that is refused says why (it waits for the next
            // take-over of its partition, or the next start).
            let resumed = self.inner.registry.send(Route {
                task_id,
                input: TaskInput::Recover,
            });
            tokio::spawn(async move {
                match resumed.await {
                    Ok(Ok(_)) | Err(_) => {}
                    Ok(Err(e @ (Error::NotOwned { .. } | Error::ShuttingDown))) => {
                        tracing::debug!(task_id = %task_id, partition, error = %Chain(&e), "a task of the partition was not resumed")
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(task_id = %task_id, partition, error = %Chain(&e), "a task of the partition was not resumed; it is resumed at the partition's next take-over or the next start")
                    }
                }
            });
        }
        tracing::info!(partition, resumed = tasks.len(), "partition assigned");
        Ok(tasks.len())
    }

    /// Kafka mode: gives requests partition `partition` up. Its tasks stop acting here: what
    /// they would record next is refused, and an attempt already sent is reconciled by the
    /// next owner.
    pub fn revoke_partition(&self, partition: i32) {
        if let Some(o) = &self.inner.ownership {
            o.revoke(partition);
            tracing::info!(partition, "partition revoked");
        }
    }

    /// Whether appends are fsynced before they are acknowledged.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// Validates a request and hands it to its task. Returns once what it caused is durable:
    /// the acceptance (and first intent), a duplicate delivery, or a conflict.
    ///
    /// A request whose identity the ledger already knows goes to its task even when it no
    /// longer passes today's checks (a limit tightened, its target removed since): it is a
    /// redelivery or a conflict, never a new rejected task.
    pub async fn submit(&self, request: TaskRequest, source: Source) -> Result<Reply> {
        let accepted = match self.check(&request) {
            Ok(accepted) => accepted,
            Err(invalid) => match self.known(&request).await? {
                Some(accepted) => accepted,
                None => return Err(invalid),
            },
        };
        self.deliver(accepted, source).await
    }

    /// Hands a request that passed [`Engine::check`] to its task, as [`Engine::submit`] does
    /// after its checks.
    ///
    /// Deliveries of one identity are recorded one at a time, whatever their versions: a new
    /// version then names the latest one before it, and a version below the latest that was
    /// never accepted is refused (`sendledger_core::Error::StaleVersion`).
    pub async fn deliver(&self, request: AcceptedRequest, source: Source) -> Result<Reply> {
        let _identity = self
            .inner
            .identity_locks
            .lock(request.identity.task_id())
            .await;
        self.route(request.task_id(), TaskInput::Deliver { request, source })
            .await
    }

    /// The request as accepted, when it passes the checks a new task's request must: the
    /// limits, and a target (or saga) the engine knows.
    pub fn check(&self, request: &TaskRequest) -> Result<AcceptedRequest> {
        let accepted = request.accept(&self.inner.limits)?;
        let remote = &self.inner.remote;
        if remote.policy(&accepted.target).is_none() && remote.steps(&accepted.target).is_none() {
            return Err(Error::UnknownTarget(accepted.target));
        }
        Ok(accepted)
    }

    /// The request as its task compares it, when the ledger knows its identity.
    async fn known(&self, request: &TaskRequest) -> Result<Option<AcceptedRequest>> {
        let identity = Identity {
            tenant: request.tenant.clone(),
            operation: request.operation.clone(),
            request_key: request.request_key.clone(),
        };
        let known = self
            .inner
            .ledger
            .read(move |l| l.latest_version(&identity))
            .await?;
        if known.is_none() {
            return Ok(None);
        }
        // Only the size limits are lifted: the message itself was bounded by the consumer.
        let unbounded = Limits {
            max_identity_len: usize::MAX,
            max_target_len: usize::MAX,
            max_payload_bytes: usize::MAX,
            max_metadata_bytes: usize::MAX,
        };
        Ok(request.accept(&unbounded).ok())
    }

    /// Records a message of the requests topic that is not a valid request, so that its
    /// rejected result is published like any other and its offset counts as processed.
    /// The ledger keeps at most 4 KiB of `raw`. It goes through the task actor of the message's
    /// own task id, so concurrent calls for one message record it once.
    pub async fn reject_input(&self, source: Source, reason: String, raw: &[u8]) -> Result<Reply> {
        let task_id = TaskId::for_rejected_input(&source.topic, source.partition, source.offset);
        tracing::warn!(source = %source, %reason, "invalid request rejected");
        let raw = raw[..raw.len().min(REJECTED_RAW_KEEP)].to_vec();
        self.route(
            task_id,
            TaskInput::Reject {
                source,
                reason,
                raw,
            },
        )
        .await
    }

    /// An operator's decision on a task in manual review (or a note on any task), handled by
    /// the task's actor. A resend is recorded as `ResendAuthorized`; the one new attempt
    /// follows at the task's next wake (at once). A task not in review is refused with
    /// `sendledger_core::Error::NotInReview`.
    pub async fn resolve(&self, task_id: TaskId, resolution: OperatorResolution) -> Result<Reply> {
        self.resolve_under(task_id, resolution, None).await
    }

    /// [`Engine::resolve`] under a named credential: its id is recorded with the decision
    /// (`OperatorCredential`, naming the resolution's `by`).
    pub async fn resolve_under(
        &self,
        task_id: TaskId,
        resolution: OperatorResolution,
        credential: Option<String>,
    ) -> Result<Reply> {
        let known = self
            .inner
            .ledger
            .read(move |l| l.task_summary(task_id))
            .await?;
        if known.is_none() {
            return Err(Error::NoSuchTask(task_id));
        }
        self.route(task_id, TaskInput::Operator(resolution, credential))
            .await
    }

    /// Retention's pass over the ledger: removes the history of every task settled before
    /// `cutoff` (ms since the epoch) whose events are all at or below `published` (the
    /// publisher's cursor; `None` when nothing publishes), through each task's actor, up to
    /// [`PRUNE_AT_ONCE`] at a time. Returns how many it removed. Tasks it may not remove yet
    /// (unpublished, or kept because their history breaks a rule) are looked at again by the
    /// next pass.
    pub async fn prune_settled(&self, cutoff: u64, published: Option<u64>) -> Result<u64> {
        let list = move |l: &Ledger, after: Option<&[u8]>| l.prunable(cutoff, after, PRUNE_AT_ONCE);
        let input = move || TaskInput::Prune { cutoff, published };
        self.each_candidate(list, input, "Pruned").await
    }

    /// Identity retention's pass: forgets every task whose history retention removed and that
    /// settled before `cutoff`, through each task's actor, as [`Engine::prune_settled`]
    /// removes them. A later delivery of a forgotten task's request is a new task. Returns how
    /// many it forgot.
    pub async fn forget_expired(&self, cutoff: u64) -> Result<u64> {
        let list =
            move |l: &Ledger, after: Option<&[u8]>| l.forgettable(cutoff, after, PRUNE_AT_ONCE);
        self.each_candidate(list, move || TaskInput::Forget { cutoff }, "Forgotten")
            .await
    }

    /// Sends `input` to every task `list` names (page by page, from a cursor), up to
    /// [`PRUNE_AT_ONCE`] at a time; counts the replies naming `done`.
    async fn each_candidate(
        &self,
        list: impl Fn(&Ledger, Option<&[u8]>) -> sendledger_store::Result<(Vec<TaskId>, Option<Vec<u8>>)>
            + Clone
            + Send
            + 'static,
        input: impl Fn() -> TaskInput,
        done: &'static str,
    ) -> Result<u64> {
        let mut count = 0;
        // Tasks left as they were, and the first one's reason: logged once at the end.
        let mut left = (0u64, None::<Error>);
        let mut waiting = std::collections::VecDeque::new();
        // The index position after the candidates listed so far; `None` once all were.
        let mut listed: Option<Option<Vec<u8>>> = Some(None);
        let mut running = tokio::task::JoinSet::new();
        loop {
            while running.len() < PRUNE_AT_ONCE {
                if let Some(task) = waiting.pop_front() {
                    let (engine, input) = (self.clone(), input());
                    running.spawn(async move { engine.route(task, input).await });
                    continue;
                }
                let Some(after) = listed.take() else { break };
                let list = list.clone();
                let (tasks, next) = self
                    .inner
                    .ledger
                    .read(move |l| list(l, after.as_deref()))
                    .await?;
                waiting.extend(tasks);
                listed = next.map(Some);
            }
            match running.join_next().await {
                None => break,
                Some(Ok(Ok(reply))) => count += u64::from(reply.events == [done]),
                Some(Ok(Err(e @ (Error::Stopped | Error::ShuttingDown)))) => return Err(e),
                // One task's trouble (its events unreadable, say) is its own: the audit
                // names it, and the others go on.
                Some(Ok(Err(e))) => {
                    left.0 += 1;
                    left.1.get_or_insert(e);
                }
                Some(Err(_)) => return Err(Error::Stopped),
            }
        }
        if let (n, Some(e)) = left {
            tracing::warn!(error = %Chain(&e), tasks = n, "tasks left as they are by retention this pass (the first one's reason)");
        }
        Ok(count)
    }

    async fn route(&self, task_id: TaskId, input: TaskInput) -> Result<Reply> {
        self.inner
            .registry
            .send(Route { task_id, input })
            .await
            .map_err(|_| Error::Stopped)?
    }

    /// A task's events in order.
    pub async fn events(&self, task_id: TaskId) -> Result<Vec<Event>> {
        Ok(self
            .inner
            .ledger
            .read(move |l| l.task_events(task_id))
            .await?)
    }

    /// The lookup URL of a task's call at `target` (where its attempts went), as its
    /// reconciliation asks it (see [`Remote::lookup_url`]).
    pub fn lookup_url(
        &self,
        target: &str,
        call: sendledger_core::saga::Call<'_>,
    ) -> Option<std::result::Result<String, String>> {
        self.inner.remote.lookup_url(target, call)
    }

    /// The circuit breaker of each target (see [`Remote::target_health`]).
    pub fn target_health(&self) -> Vec<crate::remote::TargetHealth> {
        self.inner.remote.target_health()
    }

    /// A task's current state (the fold of its events).
    pub async fn state(&self, task_id: TaskId) -> Result<State> {
        Ok(sendledger_core::fold(&self.events(task_id).await?))
    }

    /// The tenant of each task, from its acceptance (`None`: a rejected input, or a task not
    /// in the ledger).
    pub async fn tenants(&self, tasks: Vec<TaskId>) -> Result<Vec<Option<String>>> {
        let read = move |l: &Ledger| {
            (tasks.iter())
                .map(|task| {
                    Ok(match l.task_event(*task, 0)? {
                        Some(sendledger_core::Event {
                            body: EventBody::TaskAccepted { request, .. },
                            ..
                        }) => Some(request.identity.tenant),
                        _ => None,
                    })
                })
                .collect()
        };
        Ok(self.inner.ledger.read(read).await?)
    }

    /// One page of the tasks a query selects, from the ledger's task index (see
    /// [`Ledger::list_tasks`]). In kafka mode the ledger holds the partitions owned here, and
    /// may still hold copies of tasks whose partition moved.
    pub async fn list_tasks(&self, query: TaskQuery) -> Result<TaskPage> {
        Ok(self
            .inner
            .ledger
            .read(move |l| l.list_tasks(&query))
            .await?)
    }

    /// Tasks waiting for a person. In kafka mode, those of the partitions owned here: the
    /// ledger may still hold copies of tasks whose partition moved, which their owner resolves.
    pub async fn reviews(&self) -> Result<Vec<ReviewItem>> {
        let mut items = self.inner.ledger.read(ReviewItem::list).await?;
        if let Some(ownership) = &self.inner.ownership {
            items.retain(|item| {
                item.state
                    .source
                    .as_ref()
                    .is_some_and(|s| ownership.epoch(s.partition).is_some())
            });
        }
        Ok(items)
    }

    /// Records an operator's resolution on a ledger that no engine has open (the service is
    /// stopped), through the same `decide` the task's actor uses and the ledger's journal.
    /// The process holding the ledger open is its only writer (RocksDB's lock makes that
    /// exclusive with a running service), so this call is the task's single writer while it
    /// runs.
    ///
    /// A resend is only authorized here, never sent (no remote is at hand): the task becomes
    /// unknown again with a due timer, and the next [`Engine::start`] resumes it and sends the
    /// attempt. Blocking.
    pub fn resolve_stopped(
        ledger: &Ledger,
        task_id: TaskId,
        resolution: OperatorResolution,
    ) -> Result<Reply> {
        let events = ledger.task_events(task_id)?;
        if events.is_empty() {
            return Err(Error::NoSuchTask(task_id));
        }
        let state = sendledger_core::fold(&events);
        let now = crate::now_ms();
        // Operator decisions use neither the target's policy nor randomness.
        let policy = sendledger_core::Policy::default();
        let ctx = Ctx {
            now,
            random: 0,
            policy: &policy,
            holds: &[],
            versions: Default::default(),
        };
        let decision = decide(&state, Input::Operator(resolution), ctx)?;
        let (next, append) = record(task_id, &state, &decision, now);
        let lsns = ledger.append_blocking(append)?;
        Ok(Reply {
            task_id,
            phase: next.phase,
            lsns,
            events: decision.events.iter().map(EventBody::name).collect(),
        })
    }

    /// Live task actors and messages waiting for room.
    pub async fn load(&self) -> Result<(usize, usize)> {
        self.inner
            .registry
            .send(Load)
            .await
            .map_err(|_| Error::Stopped)
    }

    /// Stops taking new work, lets live tasks finish their current step for up to `grace`,
    /// then stops. Whatever is interrupted is safe: an attempt without a recorded outcome is
    /// reconciled at the next start.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.inner.registry.send(Drain).await;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match self.inner.registry.send(Load).await {
                Ok((0, _)) | Err(_) => break,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        self.inner.system.stop();
        let stopped = self.inner.stopped.lock().ok().and_then(|mut s| s.take());
        if let Some(rx) = stopped {
            let _ = rx.await;
        }
    }
}
