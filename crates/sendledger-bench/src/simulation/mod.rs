//! Kafka mode under deterministic simulation: instances running the product's ledger,
//! journal, replicator, restore and decisions (see [`instance`]) against a model of the
//! brokers ([`broker`]) and of the remote ([`remote`]), under one seeded scheduler that picks
//! every step: which request is read, which commit ends and how, which attempt writes its
//! first byte, which response is lost, when time passes, which instance is killed, frozen
//! past its session, restarted on its disk or on an empty one, and when the group
//! rebalances. Time is the scheduler's. A run ends with every fault healed and the work
//! drained, then checks what a user would: no side effect twice, no task with two different
//! terminal results, every request at a terminal result or in review, results that agree
//! with the remote, the rules of every task's log, and, all along, that no instance decides
//! from a copy ahead of its log. A failing seed replays exactly.
//!
//! How to run it: `sendledger-bench simulate --seeds A..B`; what it covers and what it
//! does not: `docs/testing.md`.

mod broker;
mod checks;
pub mod command;
mod drain;
mod instance;
mod remote;
mod report;

pub use command::SimulateArgs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sendledger_core::decide::{AttemptOutcome, Input, Policy, ReconcilePolicy};
use sendledger_core::event::{NotSentCause, UnknownCause};
use sendledger_core::retry::RetryPolicy;
use sendledger_core::{Limits, Source, TaskRequest};
use sendledger_kafka::EventEncoding;

use broker::{Broker, Ending};
use instance::{Effect, Env, Instance};
use remote::Remote;
pub use report::{Report, Swarm};

/// The requests topic's name in the simulation.
pub const REQUESTS: &str = "requests";
/// The target every task goes to.
const TARGET: &str = "api";
/// A request unanswered this long after its first byte times out.
const REQUEST_TIMEOUT_MS: u64 = 3_000;
/// A member stopped this long leaves the group.
const SESSION_MS: u64 = 6_000;
/// At most this long between a record's creation and a lookup seeing it.
const LOOKUP_LAG_MS: u64 = 2_000;
/// Steps of the drain (no faults) at most before a run is said not to settle.
const DRAIN_STEPS: usize = 20_000;

/// The size of one run.
#[derive(Debug, Clone)]
pub struct Options {
    pub instances: usize,
    pub partitions: i32,
    pub tasks: usize,
    /// Steps with faults, before the drain.
    pub steps: usize,
    /// Print every move and every decision on stderr (to follow a failing seed).
    pub trace: bool,
    /// Whether an attempt's first byte is refused past its send lease. Off only to show that
    /// the checks see what the lease prevents (a deposed owner's late send).
    pub send_lease: bool,
    /// Whether seeds draw the moves added after the fixed seeds of the tests were found
    /// (standby copies caught up, a take-over cut short by a kill, instances writing binary
    /// event records), from a generator of their own. Off, every seed runs the schedule it
    /// ran before them.
    pub newer_moves: bool,
    /// Whether the brokers break Kafka's promise to abort a fenced writer's open transaction
    /// (in half the seeds, drawn), committing it with the records that reached them instead,
    /// as a broker that breaks its promises does. Off, the brokers are Kafka's: kafka mode
    /// stands on that promise, and `check-broker` says when a broker breaks it.
    pub commits_fenced: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            instances: 3,
            partitions: 3,
            tasks: 24,
            steps: 600,
            trace: false,
            send_lease: true,
            newer_moves: true,
            commits_fenced: false,
        }
    }
}

/// Runs seed `seed` in directory `dir` (its ledgers go there).
pub fn run(seed: u64, dir: &Path, options: &Options) -> anyhow::Result<Report> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Drawn whether or not the brokers may break the promise: every seed runs the schedule
    // it ran before the promise was kept by default.
    let commits_fenced = rng.random_bool(0.5) && options.commits_fenced;
    let mut swarm = Swarm::draw(&mut rng);
    // From a generator of its own: a seed without them runs as it did before them.
    let mut newer = StdRng::seed_from_u64(seed ^ 0x5354_414e_4442_5953);
    if options.newer_moves {
        swarm.standby = [0, 8][newer.random_range(0..2)];
        swarm.cut_take_over = [0, 1, 2][newer.random_range(0..3)];
    }
    // Each instance writes the events topic's records in an encoding of its own (both kinds
    // of record in one log, as while a running topic is switched): every reader reads both.
    let encodings: Vec<EventEncoding> = (0..options.instances)
        .map(|_| match options.newer_moves && newer.random_bool(0.5) {
            true => EventEncoding::Binary,
            false => EventEncoding::Json,
        })
        .collect();
    let mut world = World {
        trace: options.trace,
        send_lease: options.send_lease,
        swarm,
        now: 1_800_000_000_000,
        broker: Broker::new(commits_fenced),
        remote: Remote::default(),
        instances: Vec::new(),
        requests: BTreeMap::new(),
        assignment: BTreeMap::new(),
        expel_at: BTreeMap::new(),
        expelled: BTreeSet::new(),
        group: 0,
        policy: policy(),
        report: Report {
            seed,
            commits_fenced,
            swarm,
            binary_instances: encodings
                .iter()
                .filter(|e| **e == EventEncoding::Binary)
                .count(),
            ..Report::default()
        },
        partitions: options.partitions,
        rng,
    };
    for (i, encoding) in encodings.into_iter().enumerate() {
        let dir = dir.join(format!("instance-{i}"));
        world.instances.push(Instance::start(i, dir, encoding)?);
    }
    world.requests = requests(&mut world.rng, options);
    world.rebalance();
    for _ in 0..options.steps {
        world.step(true)?;
        world.report.steps += 1;
    }
    world.drain()?;
    world.check();
    Ok(world.report)
}

/// The target's policy: retries, lookups with a deadline past the send lease and the
/// request timeout, and a resend authorized once when the deadline passes with no record.
fn policy() -> Policy {
    Policy {
        retry: RetryPolicy {
            max_attempts: 4,
            initial_backoff_ms: 500,
            max_backoff_ms: 4_000,
            ..RetryPolicy::default()
        },
        reconcile: Some(ReconcilePolicy {
            first_check_ms: 1_000,
            check_interval_ms: 2_000,
            deadline_ms: instance::SEND_LEASE_MS + REQUEST_TIMEOUT_MS + LOOKUP_LAG_MS + 1_000,
            resend_when_absent: true,
            max_policy_resends: 1,
            complete_after_ms: None,
        }),
        ..Policy::default()
    }
}

/// The requests topic: each task's request in its partition, some delivered twice, one
/// conflicting with another's identity.
fn requests(rng: &mut StdRng, options: &Options) -> BTreeMap<i32, Vec<TaskRequest>> {
    let request = |i: usize, n: usize| TaskRequest {
        tenant: "t".into(),
        operation: "create".into(),
        request_key: format!("k{i}"),
        target: TARGET.into(),
        payload: serde_json::json!({ "n": n }),
        payload_text: None,
        metadata: Default::default(),
        version: 0,
    };
    let mut topic: BTreeMap<i32, Vec<TaskRequest>> = BTreeMap::new();
    for i in 0..options.tasks {
        let p = (i as i32) % options.partitions;
        topic.entry(p).or_default().push(request(i, i));
    }
    for i in 0..options.tasks {
        let p = (i as i32) % options.partitions;
        if rng.random_bool(0.25) {
            let at = rng.random_range(0..=topic[&p].len());
            topic.get_mut(&p).expect("filled").insert(at, request(i, i));
        }
    }
    if options.tasks > 0 {
        // Same identity as task 0, another payload: a conflict, never executed.
        topic.entry(0).or_default().push(request(0, 1_000_000));
    }
    topic
}

struct World {
    trace: bool,
    send_lease: bool,
    swarm: Swarm,
    now: u64,
    rng: StdRng,
    broker: Arc<Broker>,
    remote: Remote,
    instances: Vec<Instance>,
    requests: BTreeMap<i32, Vec<TaskRequest>>,
    /// The group's assignment: partition → member.
    assignment: BTreeMap<i32, usize>,
    /// Frozen members the group expels at a time (their session expires).
    expel_at: BTreeMap<usize, u64>,
    /// Frozen members expelled, until they thaw.
    expelled: BTreeSet<usize>,
    group: u64,
    policy: Policy,
    report: Report,
    partitions: i32,
}

/// One thing the scheduler may do.
#[derive(Debug, Clone, Copy)]
enum Move {
    Deliver,
    EndCommit,
    FirstByte,
    Answer,
    Lookup,
    Timer,
    Wait,
    Crash,
    Restart,
    Freeze,
    /// An instance with an attempt whose first byte is not written yet stops (a pause between
    /// the intent and the send).
    FreezeSender,
    Rebalance,
    /// An instance takes over a partition the group assigned it (or one whose log it lost).
    TakeOver,
    /// An instance hears of the revocations it missed while frozen.
    Hear,
    /// A partition loses its last committed transaction (an unclean leader election).
    LoseTail,
    /// An instance catches its standby copy of a partition it does not own up with the log.
    Standby,
    /// An instance opens the log of a partition it does not own (fencing its writer) and is
    /// killed before it restores anything: a take-over cut short.
    CutTakeOver,
}

impl World {
    /// Runs `f` on instance `i` with the world's environment, then lets every instance settle.
    fn with<T>(&mut self, i: usize, f: impl FnOnce(&mut Instance, &mut Env<'_>) -> T) -> T {
        let rng = &mut self.rng;
        let mut random = || rng.random::<u64>();
        let mut env = Env {
            now: self.now,
            random: &mut random,
            broker: &self.broker,
            policy: &self.policy,
            group: self.group,
            violations: &mut self.report.violations,
            trace: self.trace,
        };
        f(&mut self.instances[i], &mut env)
    }

    /// Lets the instances do what they have to, one move at a time (see
    /// [`Instance::next_move`]), each once every append under way is acknowledged or waits
    /// behind a parked commit.
    fn settle(&mut self) -> anyhow::Result<()> {
        loop {
            self.quiet()?;
            let mut moved = false;
            for i in 0..self.instances.len() {
                if self.active(i) && self.with(i, |inst, env| inst.next_move(env)) {
                    moved = true;
                    break;
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// Waits until every append under way is acknowledged or waits behind a parked commit.
    fn quiet(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let mut quiet = true;
            for inst in self.instances.iter_mut().filter(|i| i.up()) {
                inst.poll_acks();
                quiet &= inst.quiet(&self.broker);
            }
            if quiet {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                anyhow::bail!(
                    "seed {}: appends neither acknowledged nor waiting for a commit after 30 s",
                    self.report.seed
                );
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Whether instance `i` acts now (up and not frozen).
    fn active(&self, i: usize) -> bool {
        self.instances[i].up() && !self.instances[i].frozen(self.now)
    }

    fn step(&mut self, faults: bool) -> anyhow::Result<()> {
        let on = |w: u32| if faults { w } else { 0 };
        let moves: &[(Move, u32)] = &[
            (Move::Deliver, 24),
            (Move::EndCommit, 30),
            (Move::FirstByte, 14),
            (Move::Answer, 14),
            (Move::Lookup, 10),
            (Move::Timer, 8),
            (Move::Wait, 8),
            (Move::Crash, on(self.swarm.crash)),
            (Move::Restart, 3),
            (Move::Freeze, on(self.swarm.freeze)),
            (Move::FreezeSender, on(self.swarm.freeze_sender)),
            (Move::Rebalance, on(self.swarm.rebalance)),
            (Move::LoseTail, on(self.swarm.lose_tail)),
            (Move::TakeOver, 10),
            (Move::Hear, 6),
            (Move::Standby, self.swarm.standby),
            (Move::CutTakeOver, on(self.swarm.cut_take_over)),
        ];
        let total: u32 = moves.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.random_range(0..total);
        let mut chosen = Move::Wait;
        for &(m, w) in moves {
            if pick < w {
                chosen = m;
                break;
            }
            pick -= w;
        }
        if self.trace {
            let parked = self.broker.parked();
            let owned: Vec<_> = self
                .instances
                .iter()
                .map(|i| {
                    (
                        i.up(),
                        i.owned.clone(),
                        i.attempts.len(),
                        i.calls.len(),
                        i.lookups.len(),
                        i.timers.len(),
                    )
                })
                .collect();
            eprintln!("{} {chosen:?} parked={parked:?} {owned:?}", self.now);
        }
        self.make(chosen, faults)?;
        self.settle()?;
        self.housekeeping()?;
        self.settle()
    }

    fn make(&mut self, chosen: Move, faults: bool) -> anyhow::Result<()> {
        match chosen {
            Move::Deliver => self.deliver(),
            Move::EndCommit => {
                let parked = self.broker.parked();
                if !parked.is_empty() {
                    let id = parked[self.rng.random_range(0..parked.len())];
                    let failing = if faults {
                        self.swarm.commit_failures_pct
                    } else {
                        0
                    };
                    let ending = match self.rng.random_range(0..100) {
                        r if r >= failing => Ending::Commit,
                        r if r < failing / 3 => Ending::Abort,
                        _ => Ending::TimedOut {
                            committed: self.rng.random_bool(0.5),
                        },
                    };
                    self.report.commits += 1;
                    if ending != Ending::Commit {
                        self.report.commits_failed += 1;
                    }
                    self.broker.end(id, ending);
                }
            }
            Move::FirstByte => self.first_byte(),
            Move::Answer => self.answer(faults),
            Move::Lookup => self.lookup(),
            Move::Timer => self.timer(),
            Move::Wait => {
                let by = self.rng.random_range(10..3_000);
                self.advance(self.now + by);
            }
            Move::Crash => {
                if let Some(i) = self.victim() {
                    self.crash(i);
                }
            }
            Move::Restart => {
                let down: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| !self.instances[i].up())
                    .collect();
                if !down.is_empty() {
                    let i = down[self.rng.random_range(0..down.len())];
                    let wipe = self.rng.random_bool(0.25);
                    self.report.wipes += wipe as u64;
                    self.instances[i].restart(wipe)?;
                    self.rebalance();
                }
            }
            Move::Freeze => {
                let active: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.active(i))
                    .collect();
                self.freeze_one(active);
            }
            Move::FreezeSender => {
                let sending: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.active(i) && !self.instances[i].attempts.is_empty())
                    .collect();
                self.freeze_one(sending);
            }
            Move::Rebalance => self.rebalance(),
            Move::TakeOver => self.take_over()?,
            Move::LoseTail => {
                let p = self.rng.random_range(0..self.partitions);
                if self.broker.lose_tail(p) {
                    self.report.lost_tails += 1;
                }
            }
            Move::Standby => self.standby(),
            Move::CutTakeOver => {
                if let Some(i) = self.victim() {
                    let p = self.rng.random_range(0..self.partitions);
                    if !self.instances[i].owned.contains_key(&p) {
                        self.with(i, |inst, env| inst.open_log(p, env));
                        self.report.take_overs_cut += 1;
                    }
                    self.crash(i);
                }
            }
            Move::Hear => {
                let deaf: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.active(i) && !self.instances[i].unheard.is_empty())
                    .collect();
                if !deaf.is_empty() {
                    let i = deaf[self.rng.random_range(0..deaf.len())];
                    for p in std::mem::take(&mut self.instances[i].unheard) {
                        self.instances[i].release(p);
                    }
                }
            }
        }
        Ok(())
    }

    /// An instance to kill, picked among those up while another one stays up.
    fn victim(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.instances[i].up())
            .collect();
        (up.len() > 1).then(|| up[self.rng.random_range(0..up.len())])
    }

    /// Stops one of `candidates` for up to 40 s, while another instance stays active; past
    /// its session the group expels it.
    fn freeze_one(&mut self, candidates: Vec<usize>) {
        let active = (0..self.instances.len())
            .filter(|&i| self.active(i))
            .count();
        if candidates.is_empty() || active < 2 {
            return;
        }
        let i = candidates[self.rng.random_range(0..candidates.len())];
        let for_ms = self.rng.random_range(1_000..45_000);
        self.instances[i].frozen_until = Some(self.now + for_ms);
        if for_ms > SESSION_MS {
            self.expel_at.insert(i, self.now + SESSION_MS);
        }
        self.report.freezes += 1;
    }

    /// Reads the next request of a partition an active instance owns.
    fn deliver(&mut self) {
        let mut ready = Vec::new();
        for (i, inst) in self.instances.iter().enumerate() {
            if !self.active(i) {
                continue;
            }
            for (&p, &next) in &inst.consumed {
                if (next as usize) < self.requests.get(&p).map_or(0, Vec::len) {
                    ready.push((i, p, next));
                }
            }
        }
        if ready.is_empty() {
            return;
        }
        let (i, p, offset) = ready[self.rng.random_range(0..ready.len())];
        let request = self.requests[&p][offset as usize].clone();
        let group = self.group;
        let accepted = request
            .accept(&Limits::default())
            .expect("the simulation's requests are valid");
        let task = accepted.task_id();
        let source = Source {
            topic: REQUESTS.into(),
            partition: p,
            offset,
        };
        let inst = &mut self.instances[i];
        inst.received(p, offset, group);
        let input = Input::Deliver {
            request: accepted,
            source,
            steps: None,
        };
        inst.input(task, p, input);
    }

    /// Picks one effect of the active instances' `which` list, removed.
    fn take_effect(
        &mut self,
        which: fn(&mut Instance) -> &mut Vec<Effect>,
    ) -> Option<(usize, Effect)> {
        let mut all = Vec::new();
        for i in 0..self.instances.len() {
            if self.active(i) {
                for n in 0..which(&mut self.instances[i]).len() {
                    all.push((i, n));
                }
            }
        }
        if all.is_empty() {
            return None;
        }
        let (i, n) = all[self.rng.random_range(0..all.len())];
        Some((i, which(&mut self.instances[i]).remove(n)))
    }

    /// An attempt's first byte: refused past its send lease, dropped when its partition was
    /// revoked since its decision; otherwise the request reaches the remote.
    fn first_byte(&mut self) {
        let Some((i, mut effect)) = self.take_effect(|i| &mut i.attempts) else {
            return;
        };
        if self.instances[i].owned.get(&effect.partition) != Some(&effect.epoch) {
            self.report.revoked_before_sending += 1;
            return;
        }
        if self.send_lease && self.now > effect.until {
            self.report.leases_expired += 1;
            let outcome = AttemptOutcome::NotSent {
                cause: NotSentCause::LocalResources(
                    "send lease expired before the first request byte; nothing was written".into(),
                ),
                retry_after_ms: None,
            };
            self.outcome(i, &effect, outcome);
            return;
        }
        self.report.sends += 1;
        effect.until = self.now + REQUEST_TIMEOUT_MS;
        self.instances[i].calls.push(effect);
    }

    /// The remote answers one request (or its answer is lost).
    fn answer(&mut self, faults: bool) {
        let Some((i, effect)) = self.take_effect(|i| &mut i.calls) else {
            return;
        };
        let roll = if faults {
            self.rng.random_range(0..100)
        } else {
            0
        };
        let lag = self.rng.random_range(0..LOOKUP_LAG_MS);
        let outcome = match roll {
            0..60 => {
                let id = self.remote.create(&effect.key, self.now, lag);
                AttemptOutcome::Succeeded {
                    remote_id: id,
                    status: 201,
                    answer: Default::default(),
                }
            }
            60..75 => {
                self.remote.create(&effect.key, self.now, lag);
                self.report.lost_responses += 1;
                AttemptOutcome::Unknown {
                    cause: UnknownCause::Timeout,
                }
            }
            75..82 => {
                self.remote.create(&effect.key, self.now, lag);
                AttemptOutcome::Unknown {
                    cause: UnknownCause::Status(500),
                }
            }
            82..92 => AttemptOutcome::NotSent {
                cause: NotSentCause::Throttled { status: 429 },
                retry_after_ms: Some(1_000),
            },
            92..96 => AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            },
            _ => AttemptOutcome::Rejected {
                status: 422,
                detail: "refused".into(),
            },
        };
        self.outcome(i, &effect, outcome);
    }

    fn outcome(&mut self, i: usize, effect: &Effect, outcome: AttemptOutcome) {
        let input = Input::Outcome {
            attempt: effect.attempt,
            outcome,
        };
        let (task, p) = (effect.task, effect.partition);
        self.instances[i].input(task, p, input);
    }

    fn lookup(&mut self) {
        let Some((i, effect)) = self.take_effect(|i| &mut i.lookups) else {
            return;
        };
        let found = self.remote.lookup(&effect.key, self.now);
        let input = Input::Lookup {
            attempt: effect.attempt,
            asked_at: self.now,
            result: Ok(found.into()),
        };
        self.instances[i].input(effect.task, effect.partition, input);
    }

    /// The earliest timer of an active instance: fired when due, else time moves to it.
    fn timer(&mut self) {
        let next = (0..self.instances.len())
            .filter(|&i| self.active(i))
            .filter_map(|i| self.instances[i].timers.first().map(|t| (t.0, i)))
            .min();
        let Some((at, i)) = next else {
            return;
        };
        if at > self.now {
            self.advance(at);
            return;
        }
        let (_, task, p) = self.instances[i].timers.pop_first().expect("a timer");
        self.instances[i].input(task, p, Input::Wake);
    }

    /// Time passes: requests whose answer does not come in time time out first (their record
    /// made or not), then frozen members past their session leave the group and thawed ones
    /// hear what they missed.
    fn advance(&mut self, to: u64) {
        loop {
            let late = (0..self.instances.len())
                .filter(|&i| self.instances[i].up())
                .flat_map(|i| {
                    (self.instances[i].calls.iter().enumerate()).map(move |(n, c)| (c.until, i, n))
                })
                .filter(|(until, ..)| *until < to)
                .min();
            let Some((until, i, n)) = late else {
                break;
            };
            self.now = self.now.max(until);
            let effect = self.instances[i].calls.remove(n);
            if self.rng.random_bool(0.5) {
                let lag = self.rng.random_range(0..LOOKUP_LAG_MS);
                self.remote.create(&effect.key, self.now, lag);
            }
            // A frozen instance hears it when it thaws; it decides now all the same.
            let outcome = AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            };
            self.outcome(i, &effect, outcome);
        }
        self.now = self.now.max(to);
        let expelled: Vec<usize> = (self.expel_at.iter())
            .filter(|(_, &at)| at <= self.now)
            .map(|(&i, _)| i)
            .collect();
        for &i in &expelled {
            self.expel_at.remove(&i);
            self.expelled.insert(i);
        }
        let thawed: Vec<usize> = (0..self.instances.len())
            .filter(|&i| {
                self.instances[i]
                    .frozen_until
                    .is_some_and(|t| t <= self.now)
            })
            .collect();
        for &i in &thawed {
            self.expel_at.remove(&i);
            self.expelled.remove(&i);
            self.instances[i].frozen_until = None;
        }
        if !expelled.is_empty() || !thawed.is_empty() {
            self.rebalance();
        }
    }

    /// kill -9 of instance `i`: its transactions stay open at the brokers, its requests at
    /// the remote end unheard.
    fn crash(&mut self, i: usize) {
        self.report.crashes += 1;
        for p in self.instances[i].owned.keys().copied().collect::<Vec<_>>() {
            self.instances[i].release(p);
        }
        for id in self.broker.parked_of(i) {
            self.broker.end(id, Ending::TimedOut { committed: false });
        }
        for effect in std::mem::take(&mut self.instances[i].calls) {
            if self.rng.random_bool(0.5) {
                let lag = self.rng.random_range(0..LOOKUP_LAG_MS);
                self.remote.create(&effect.key, self.now, lag);
            }
        }
        self.instances[i].crash();
        self.expel_at.remove(&i);
        self.expelled.remove(&i);
        self.rebalance();
    }

    /// A new group generation: partitions spread over the members that can join (up, not
    /// frozen); a frozen member whose session has not expired keeps what it has.
    fn rebalance(&mut self) {
        self.report.rebalances += 1;
        self.group = self.broker.rebalance();
        let joining: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.active(i))
            .collect();
        let keeps = |i: usize, w: &World| {
            w.instances[i].up() && w.instances[i].frozen(w.now) && !w.expelled.contains(&i)
        };
        for p in 0..self.partitions {
            let old = self.assignment.get(&p).copied();
            let new = match old {
                Some(o) if keeps(o, self) => Some(o),
                _ if joining.is_empty() => None,
                _ => Some(joining[self.rng.random_range(0..joining.len())]),
            };
            if let Some(o) = old.filter(|&o| Some(o) != new && self.instances[o].up()) {
                if self.instances[o].frozen(self.now) {
                    self.instances[o].unheard.push(p);
                } else {
                    self.instances[o].release(p);
                }
            }
            match new {
                Some(n) => self.assignment.insert(p, n),
                None => self.assignment.remove(&p),
            };
        }
    }

    /// The partitions whose log an instance lost are given up (the replicator says so).
    fn housekeeping(&mut self) -> anyhow::Result<()> {
        for inst in self.instances.iter_mut().filter(|i| i.up()) {
            inst.lost();
        }
        Ok(())
    }

    /// An active instance takes over one partition assigned to it that it does not own (and
    /// has heard of every revocation: a consumer hears them before new assignments).
    fn take_over(&mut self) -> anyhow::Result<()> {
        let todo: Vec<(usize, i32)> = (self.assignment.iter())
            .filter(|(p, &i)| {
                self.active(i)
                    && self.instances[i].unheard.is_empty()
                    && !self.instances[i].owned.contains_key(p)
            })
            .map(|(&p, &i)| (i, p))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let (i, p) = todo[self.rng.random_range(0..todo.len())];
        if self.with(i, |inst, env| inst.take_over(p, env)).is_ok() {
            self.report.take_overs += 1;
        }
        Ok(())
    }

    /// An active instance catches its standby copy of a partition it does not own up with the
    /// log.
    fn standby(&mut self) {
        let active: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.active(i))
            .collect();
        if active.is_empty() {
            return;
        }
        let i = active[self.rng.random_range(0..active.len())];
        let others: Vec<i32> = (0..self.partitions)
            .filter(|p| !self.instances[i].owned.contains_key(p))
            .collect();
        if others.is_empty() {
            return;
        }
        let p = others[self.rng.random_range(0..others.len())];
        if let Ok(n) = self.with(i, |inst, env| inst.catch_up(p, env)) {
            self.report.standby_steps += 1;
            self.report.standby_events += n as u64;
        }
    }
}
