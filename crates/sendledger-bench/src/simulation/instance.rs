//! One sendledger instance in the simulation. What runs is the product's code: a [`Ledger`]
//! on disk with its journal, kafka mode's [`LogReplicator`] writing through the broker model,
//! a take-over's restore ([`take_over::restore`]) reading it, and each task's decisions
//! (`decide` on the `fold` of its events from the ledger, recorded by the task actor's
//! `record`). What is modelled is the shell around them that the actors, the engine and the
//! consumer provide: one input at a time per task, the ownership epoch checked once an append
//! is acknowledged, the send lease checked at the first byte, and, around a take-over's
//! restore, the log owned, the reviews owed recorded and the unsettled tasks resumed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use sendledger_core::decide::{decide, Action, Ctx, Input, Policy};
use sendledger_core::{fold, Event, TaskId};
use sendledger_kafka::standby;
use sendledger_kafka::take_over::{self, Brokers as _};
use sendledger_kafka::{EventEncoding, LogReplicator};
use sendledger_store::{Append, Durability, Ledger, LedgerOptions, Memory};

use super::broker::{Broker, SimLog};

/// An attempt's first byte leaves within this long of its decision, or never.
pub const SEND_LEASE_MS: u64 = 5_000;
/// Events a restore step applies at most.
const RESTORE_STEP: usize = 64;

type Acked = Pin<Box<dyn Future<Output = sendledger_store::Result<Range<u64>>> + Send>>;

/// An append waiting for its acknowledgement.
struct Pending {
    partition: i32,
    epoch: u64,
    decided_at: u64,
    action: Action,
    /// The requests offset the append records (a delivery).
    offset: Option<i64>,
    /// A review owed that this append records.
    review: bool,
    acked: Acked,
    /// Whether it goes through its partition's log (it has events): only then may it wait
    /// behind a commit of the partition.
    logged: bool,
    /// The acknowledgement, once it came.
    result: Option<sendledger_store::Result<Range<u64>>>,
}

#[derive(Default)]
struct TaskSlot {
    pending: Option<Pending>,
    inputs: VecDeque<(i32, Input, bool)>,
}

/// An effect the instance owes a task of partition `partition` (decided under `epoch`).
#[derive(Debug, Clone)]
pub struct Effect {
    pub task: TaskId,
    pub partition: i32,
    pub epoch: u64,
    pub attempt: u32,
    pub key: String,
    /// Attempts: no first byte after this. Calls: when the request times out.
    pub until: u64,
}

pub struct Instance {
    pub id: usize,
    dir: PathBuf,
    ledger: Option<Ledger>,
    replicator: Arc<LogReplicator<SimLog>>,
    /// How its replicator writes event records (`kafka.events_encoding`).
    encoding: EventEncoding,
    /// Owned partitions and the ownership epoch of each.
    pub owned: BTreeMap<i32, u64>,
    epoch: u64,
    /// The next requests offset to read, by owned partition.
    pub consumed: BTreeMap<i32, i64>,
    tasks: BTreeMap<TaskId, TaskSlot>,
    pub attempts: Vec<Effect>,
    pub calls: Vec<Effect>,
    pub lookups: Vec<Effect>,
    pub timers: BTreeSet<(u64, TaskId, i32)>,
    /// Frozen (stopped) until this time: it does nothing and hears of no revocation.
    pub frozen_until: Option<u64>,
    /// Revocations it has not heard of yet (it was frozen).
    pub unheard: Vec<i32>,
    pub take_overs: u64,
    /// Take-overs that found the copy apart from the log and truncated it.
    pub truncations: u64,
}

/// What an instance's step needs from the world.
pub struct Env<'a> {
    pub now: u64,
    pub random: &'a mut dyn FnMut() -> u64,
    pub broker: &'a Arc<Broker>,
    pub policy: &'a Policy,
    pub group: u64,
    pub violations: &'a mut Vec<String>,
    pub trace: bool,
}

impl Instance {
    pub fn start(id: usize, dir: PathBuf, encoding: EventEncoding) -> anyhow::Result<Instance> {
        let mut instance = Instance {
            id,
            dir,
            ledger: None,
            replicator: Arc::new(LogReplicator::new("sim")),
            encoding,
            owned: BTreeMap::new(),
            epoch: 0,
            consumed: BTreeMap::new(),
            tasks: BTreeMap::new(),
            attempts: Vec::new(),
            calls: Vec::new(),
            lookups: Vec::new(),
            timers: BTreeSet::new(),
            frozen_until: None,
            unheard: Vec::new(),
            take_overs: 0,
            truncations: 0,
        };
        instance.open()?;
        Ok(instance)
    }

    fn open(&mut self) -> anyhow::Result<()> {
        let options = LedgerOptions {
            durability: Durability::Buffered,
            memory: Memory {
                bytes: Memory::MIN_BYTES,
            },
            replicated: true,
            archive: None,
        };
        let ledger = Ledger::open(&self.dir, options)?;
        self.replicator = Arc::new(LogReplicator::new("sim").with_events_encoding(self.encoding));
        if ledger.install_replicator(self.replicator.clone()).is_err() {
            anyhow::bail!("the ledger refused the replicator");
        }
        self.ledger = Some(ledger);
        Ok(())
    }

    pub fn up(&self) -> bool {
        self.ledger.is_some()
    }

    pub fn frozen(&self, now: u64) -> bool {
        self.frozen_until.is_some_and(|t| now < t)
    }

    /// kill -9: everything in memory is gone. Its parked commits must have been ended.
    pub fn crash(&mut self) {
        self.tasks.clear();
        self.ledger = None;
        self.owned.clear();
        self.consumed.clear();
        self.attempts.clear();
        self.calls.clear();
        self.lookups.clear();
        self.timers.clear();
        self.frozen_until = None;
        self.unheard.clear();
    }

    /// Starts again on the same disk, or on an empty one.
    pub fn restart(&mut self, wipe: bool) -> anyhow::Result<()> {
        if wipe {
            std::fs::remove_dir_all(&self.dir)?;
        }
        self.open()
    }

    /// Polls the appends under way; an acknowledgement is kept for [`Instance::next_move`].
    pub fn poll_acks(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        for slot in self.tasks.values_mut() {
            if let Some(p) = slot.pending.as_mut().filter(|p| p.result.is_none()) {
                if let Poll::Ready(result) = p.acked.as_mut().poll(&mut cx) {
                    p.result = Some(result);
                }
            }
        }
    }

    /// Whether every append under way is acknowledged or waits behind a parked commit of its
    /// partition: nothing changes until the scheduler's next move.
    pub fn quiet(&self, broker: &Broker) -> bool {
        (self.tasks.values()).all(|slot| {
            (slot.pending.as_ref()).is_none_or(|p| {
                p.result.is_some() || p.logged && broker.parked_on(self.id, p.partition)
            })
        })
    }

    /// One thing the instance does next, if it has something to do: act on the first
    /// acknowledgement, else decide the first input of a task with no append under way.
    /// One at a time, each followed by quiet, so that the journal sees a seeded order.
    pub fn next_move(&mut self, env: &mut Env<'_>) -> bool {
        let acked = (self.tasks.iter())
            .find(|(_, slot)| slot.pending.as_ref().is_some_and(|p| p.result.is_some()))
            .map(|(&task, _)| task);
        if let Some(task) = acked {
            let slot = self.tasks.get_mut(&task).expect("found");
            let mut pending = slot.pending.take().expect("found");
            let result = pending.result.take().expect("found");
            self.acknowledged(task, pending, result, env);
            return true;
        }
        let ready = (self.tasks.iter())
            .find(|(_, slot)| slot.pending.is_none() && !slot.inputs.is_empty())
            .map(|(&task, _)| task);
        match ready {
            Some(task) => {
                self.decide_next(task, env);
                true
            }
            None => {
                self.tasks
                    .retain(|_, slot| slot.pending.is_some() || !slot.inputs.is_empty());
                false
            }
        }
    }

    fn acknowledged(
        &mut self,
        task: TaskId,
        pending: Pending,
        result: sendledger_store::Result<Range<u64>>,
        env: &mut Env<'_>,
    ) {
        if env.trace {
            eprintln!(
                "  i{} ack {task} {:?}",
                self.id,
                result.as_ref().map_err(|e| e.to_string())
            );
        }
        if result.is_err() {
            // Lost or not replicated: nothing of it is recorded; the partition is taken over
            // again or belongs to another instance.
            return;
        }
        self.check_summary(task, env.violations);
        if pending.review {
            let recorded = Append {
                reviews_recorded: vec![(pending.partition, task)],
                ..Append::default()
            };
            let _ = self.ledger().append_blocking(recorded);
        }
        if let Some(offset) = pending.offset {
            self.replicator
                .done(pending.partition, offset, Some(env.group));
        }
        // The ownership epoch, checked once the append is durable: a task of a partition
        // revoked (or taken over anew) since its decision does nothing more here.
        if self.owned.get(&pending.partition) != Some(&pending.epoch) {
            return;
        }
        let key = match self.state_of(task) {
            Some(state) => match &state.request {
                Some(r) => r.identity.request_key.clone(),
                None => return,
            },
            None => return,
        };
        let effect = |attempt, until| Effect {
            task,
            partition: pending.partition,
            epoch: pending.epoch,
            attempt,
            key: key.clone(),
            until,
        };
        match pending.action {
            Action::Send { attempt, .. } => {
                let lease_end = pending.decided_at + SEND_LEASE_MS;
                self.attempts.push(effect(attempt, lease_end));
            }
            Action::WakeAt(at) => {
                self.timers.insert((at, task, pending.partition));
            }
            // Multi-step tasks, which the simulation does not run, move on at once.
            Action::Continue => {
                self.timers
                    .insert((pending.decided_at, task, pending.partition));
            }
            Action::Lookup { attempt } => self.lookups.push(effect(attempt, 0)),
            Action::None => {}
        }
    }

    /// The ledger's summary of `task` is what its events fold to: what start-up and
    /// take-overs resume tasks by.
    fn check_summary(&self, task: TaskId, violations: &mut Vec<String>) {
        let ledger = self.ledger();
        let (Ok(events), Ok(summary)) = (ledger.task_events(task), ledger.task_summary(task))
        else {
            return;
        };
        let state = fold(&events);
        let folded = (state.phase, state.next_seq);
        if let Some(summary) = summary.filter(|s| (s.phase, s.next_seq) != folded) {
            violations.push(format!(
                "instance {}: task {task}'s summary says {:?} at {} while its events fold to {:?} at {}",
                self.id, summary.phase, summary.next_seq, folded.0, folded.1
            ));
        }
    }

    fn ledger(&self) -> &Ledger {
        self.ledger.as_ref().expect("the instance is up")
    }

    fn state_of(&self, task: TaskId) -> Option<sendledger_core::State> {
        let events = self.ledger().task_events(task).ok()?;
        Some(fold(&events))
    }

    /// Gives `input` to `task` (of requests partition `partition`); it is decided once the
    /// task's last append is acknowledged.
    pub fn input(&mut self, task: TaskId, partition: i32, input: Input) {
        self.input_with(task, partition, input, false);
    }

    fn input_with(&mut self, task: TaskId, partition: i32, input: Input, review: bool) {
        let slot = self.tasks.entry(task).or_default();
        slot.inputs.push_back((partition, input, review));
    }

    /// Decides the task's next input (it has no append under way).
    fn decide_next(&mut self, task: TaskId, env: &mut Env<'_>) {
        let Some((partition, input, review)) =
            self.tasks.get_mut(&task).and_then(|s| s.inputs.pop_front())
        else {
            return;
        };
        let Some(&epoch) = self.owned.get(&partition) else {
            // Not owned here: refused, as the task actor refuses it.
            return;
        };
        let Ok(events) = self.ledger().task_events(task) else {
            return;
        };
        check_copy_not_ahead(env.broker, partition, task, &events, self.id, env);
        let state = fold(&events);
        let offset = match &input {
            Input::Deliver { source, .. } => Some(source.offset),
            _ => None,
        };
        let ctx = Ctx {
            now: env.now,
            random: (env.random)(),
            policy: env.policy,
            holds: &[],
            versions: Default::default(),
        };
        let name = format!("{input:?}").chars().take(60).collect::<String>();
        let Ok(decision) = decide(&state, input, ctx) else {
            return;
        };
        if env.trace {
            eprintln!(
                "  i{} decide {task} p{partition} e{epoch} {name} -> {:?} {:?}",
                self.id,
                decision.events.iter().map(|e| e.name()).collect::<Vec<_>>(),
                decision.action
            );
        }
        let (_, mut append) = sendledger_actors::task::record(task, &state, &decision, env.now);
        if let Some(o) = offset {
            append.offsets.push((super::REQUESTS.into(), partition, o));
        }
        if append.partition.is_none() {
            append.partition = Some(partition);
        }
        let logged = !append.events.is_empty();
        let ledger = self.ledger().clone();
        let mut acked: Acked = Box::pin(async move { ledger.append(append).await });
        // The first poll submits it to the journal.
        let mut cx = Context::from_waker(Waker::noop());
        let result = match acked.as_mut().poll(&mut cx) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => None,
        };
        if let Some(slot) = self.tasks.get_mut(&task) {
            slot.pending = Some(Pending {
                partition,
                epoch,
                decided_at: env.now,
                action: decision.action,
                offset,
                review,
                logged,
                result,
                acked,
            });
        }
    }

    /// The group assigned `partition` here: takes it over as kafka mode's partition owner
    /// does: the log opened, the product's restore ([`take_over::restore`]), then owned and its
    /// tasks resumed.
    pub fn take_over(&mut self, partition: i32, env: &mut Env<'_>) -> Result<(), String> {
        let err = |e: &dyn std::fmt::Display| e.to_string();
        let brokers = SimBrokers {
            broker: env.broker,
            instance: self.id,
        };
        let log = brokers.open(partition)?;
        let ledger = self.ledger().clone();
        let copy = take_over::LedgerCopy { ledger: &ledger };
        let restore = take_over::restore(&brokers, &copy, partition, RESTORE_STEP)?;
        if restore.truncated.is_some() {
            self.truncations += 1;
        }
        check_copy_is_log(env.broker, &ledger, partition, self.id, env.violations);
        log.park();
        self.replicator.own(log);
        self.epoch += 1;
        self.owned.insert(partition, self.epoch);
        self.consumed
            .insert(partition, env.broker.committed_offset(partition));
        self.take_overs += 1;
        // Reviews owed first, then every unsettled task resumes.
        let owed = ledger.reviews_owed(partition).map_err(|e| err(&e))?;
        for d in owed {
            let input = Input::Diverged {
                task_seq: d.task_seq,
                replaced: d.replaced,
            };
            self.input_with(d.task_id, partition, input, true);
        }
        let active = ledger
            .active_tasks_of_partition(partition)
            .map_err(|e| err(&e))?;
        for (task, summary) in active {
            if summary.phase.resumable() {
                self.input(task, partition, Input::Recover);
            }
        }
        Ok(())
    }

    /// Opens `partition`'s log and goes no further (a take-over cut short right after its
    /// fencing): its previous writer is fenced, and its open transaction ended as the brokers
    /// end it.
    pub fn open_log(&self, partition: i32, env: &mut Env<'_>) {
        let brokers = SimBrokers {
            broker: env.broker,
            instance: self.id,
        };
        let _ = brokers.open(partition);
    }

    /// Catches its copy of `partition`, not owned here, up with the log, as a standby does
    /// ([`standby::catch_up`]). The scheduler lets every settled append be written first; a
    /// parked commit of a generation given up is refused when it ends, so nothing is waited for.
    pub fn catch_up(&mut self, partition: i32, env: &mut Env<'_>) -> Result<usize, String> {
        let brokers = SimBrokers {
            broker: env.broker,
            instance: self.id,
        };
        let ledger = self.ledger().clone();
        let copy = take_over::LedgerCopy { ledger: &ledger };
        standby::catch_up(&brokers, &copy, partition, std::time::Duration::ZERO)
    }

    /// The partition was revoked (heard of now).
    pub fn release(&mut self, partition: i32) {
        self.owned.remove(&partition);
        self.consumed.remove(&partition);
        self.replicator.release(partition);
    }

    /// Partitions whose log was lost (a failed or fenced transaction), to take over again
    /// while the group still assigns them here.
    pub fn lost(&mut self) -> Vec<i32> {
        let lost: Vec<i32> = (self.replicator.take_lost().into_iter())
            .map(|(p, _)| p)
            .collect();
        for &p in &lost {
            self.owned.remove(&p);
            self.consumed.remove(&p);
        }
        lost
    }

    /// A request message was read: the consumer's bookkeeping, then the task.
    pub fn received(&mut self, partition: i32, offset: i64, group: u64) {
        self.replicator.received(partition, offset, Some(group));
        self.consumed.insert(partition, offset + 1);
    }
}

/// The brokers of the simulation as instance `instance`'s take-overs read them.
struct SimBrokers<'a> {
    broker: &'a Arc<Broker>,
    instance: usize,
}

impl take_over::Brokers for SimBrokers<'_> {
    type Log = SimLog;

    fn open(&self, partition: i32) -> Result<SimLog, String> {
        Ok(self.broker.init(self.instance, partition))
    }

    fn event_at(&self, partition: i32, offset: i64) -> Result<(i64, Option<(i64, Event)>), String> {
        let (read, _) = self.broker.read_committed(partition, offset);
        Ok((self.broker.end_offset(partition), read.into_iter().next()))
    }

    /// Each record's timestamp is its event's time (a producer's create time).
    fn read(
        &self,
        partition: i32,
        from: i64,
        each: &mut dyn FnMut(i64, i64, Event) -> Result<(), String>,
    ) -> Result<(), String> {
        let (read, _) = self.broker.read_committed(partition, from);
        for (offset, event) in read {
            let at = event.at as i64;
            each(offset, at, event)?;
        }
        Ok(())
    }
}

/// The events of `task` in `partition`'s log.
fn logged_events(broker: &Broker, partition: i32, task: TaskId) -> Vec<Event> {
    let (read, _) = broker.read_committed(partition, 0);
    (read.into_iter())
        .map(|(_, e)| e)
        .filter(|e| e.task_id == task)
        .collect()
}

fn same(a: &Event, b: &Event) -> bool {
    a.task_seq == b.task_seq && a.body == b.body && a.at == b.at
}

/// A task decides from a copy that holds nothing its log does not: every event the ledger
/// holds of it is the log's event at that sequence number.
fn check_copy_not_ahead(
    broker: &Broker,
    partition: i32,
    task: TaskId,
    events: &[Event],
    instance: usize,
    env: &mut Env<'_>,
) {
    let logged = logged_events(broker, partition, task);
    for e in events {
        // What the brokers lost after acknowledging it, the owner cannot know of before its
        // next take-over (its log was fenced with the loss).
        if !logged.iter().any(|l| same(l, e)) && !broker.lost(e) {
            env.violations.push(format!(
                "instance {instance} decided task {task} from a copy ahead of its log (event {} is not the log's)",
                e.task_seq
            ));
            return;
        }
    }
}

/// Once taken over, the copy of every task in the partition's log is the log's.
fn check_copy_is_log(
    broker: &Broker,
    ledger: &Ledger,
    partition: i32,
    instance: usize,
    violations: &mut Vec<String>,
) {
    let (read, _) = broker.read_committed(partition, 0);
    let mut by_task: BTreeMap<TaskId, Vec<Event>> = BTreeMap::new();
    for (_, e) in read {
        by_task.entry(e.task_id).or_default().push(e);
    }
    for (task, logged) in by_task {
        let held = ledger.task_events(task).unwrap_or_default();
        let equal = held.len() == logged.len() && held.iter().zip(&logged).all(|(a, b)| same(a, b));
        if !equal {
            violations.push(format!(
                "instance {instance} took partition {partition} over with task {task}'s copy ({} events) not its log's ({} events)",
                held.len(),
                logged.len()
            ));
        }
    }
}
