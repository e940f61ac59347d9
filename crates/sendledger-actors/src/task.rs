//! The task actor: the only writer of one task's events.
//!
//! Each attempt is a `sendledger.attempt` span (task id, target, attempt number, and the
//! outcome's class), parented on the task's trace context.
//!
//! Metrics: `sendledger_attempts_total{class="succeeded|rejected|not_sent|unknown"}` (attempt
//! outcomes recorded; an attempt found sending at start-up counts as unknown) and
//! `sendledger_duplicates_dropped_total{by="identity"}` (redeliveries of a known request,
//! including those past `MAX_RECORDED_DUPLICATES`, which record no event: their only trace in
//! the ledger is their processed offset).

mod ownership;
mod retention;
mod versions;

use std::sync::Arc;

use actix::prelude::*;
use sendledger_core::decide::{
    decide, Action, AttemptOutcome, Ctx, Decision, Hold, Input, Sending,
};
use sendledger_core::error::Chain;
use sendledger_core::result::Projection;
use sendledger_core::saga::Call;
use sendledger_core::{
    EventBody, Evidence, NewEvent, NotSentCause, Phase, Policy, Source, State, TaskId, WaitReason,
};
use sendledger_store::{Append, Ledger, TaskSummary, TimerKind, TRANSACTION_STALLED};
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::messages::{Idle, LookupJob, Reply, Schedule, TaskInput, TaskMsg};
use crate::ownership::Ownership;
use crate::remote::{Remote, Slot, Unavailable};

/// What every task actor shares.
pub struct Shared {
    pub ledger: Ledger,
    pub remote: Arc<dyn Remote>,
    pub timers: Recipient<Schedule>,
    pub reconciler: Recipient<LookupJob>,
    pub registry: Recipient<Idle>,
    /// Seed of the decisions' random numbers (retry jitter), so runs can be reproduced.
    pub seed: u64,
    /// Kafka mode: the partitions owned here; a task acts only for one of them.
    pub ownership: Option<Arc<Ownership>>,
    /// Kafka mode's send lease: an attempt's first byte is written within this time of the
    /// moment its intent was handed to the ledger, or never.
    pub send_lease: Option<std::time::Duration>,
    /// Who waits for a task to change: woken after each durable append.
    pub watchers: Arc<crate::watchers::Watchers>,
    /// The identities' locks (a retry takes its identity's, see [`crate::versions`]).
    pub identity_locks: Arc<crate::versions::IdentityLocks>,
    /// Versions waiting for an earlier one to settle.
    pub waiting: crate::versions::Waiting,
    /// How many versions above 0 were accepted since the engine started: what an actor read of
    /// its identity's versions holds while this has not changed.
    pub versions_accepted: std::sync::atomic::AtomicU64,
}

pub struct TaskActor {
    task_id: TaskId,
    state: State,
    shared: Arc<Shared>,
    policy: Policy,
    /// The target whose policy `policy` is: the task's current call's own target.
    policy_of: Option<String>,
    /// Whether the task's events were read when the actor started, or why not.
    loaded: Option<std::result::Result<(), Arc<sendledger_store::Error>>>,
    /// External messages fully processed, compared by the registry with those it forwarded.
    handled: u64,
    attempt_in_flight: bool,
    lookup_in_flight: bool,
    /// Room for the attempt being decided, at the target named, taken before its intent is
    /// recorded.
    slot: Option<(String, Slot)>,
    /// The targets found taking no attempt now, while the input is decided (forgotten before
    /// the next input): the decision waits instead of intending at one of them (or goes to the
    /// task's fallback).
    holds: Vec<Hold>,
    /// Inputs accepted for processing whose decision is not yet durable and acted on. The
    /// actor is idle (and may be dropped) only when there are none.
    unfinished: u32,
    /// Kafka mode: the ownership epoch when the task's state was read; a later assignment of
    /// its partition means the state must be read again.
    loaded_at: u64,
    /// What the input being decided found of the other versions of the task's request
    /// (forgotten before the next input).
    versions: Option<sendledger_core::Versions>,
    /// The identity's lock, held while a retry is decided and recorded.
    identity_guard: Option<crate::versions::IdentityGuard>,
    /// Of an actor started by a delivery of a request without a version: its identity, then
    /// (once read with the task's events) the identity's latest version above 0, as of the
    /// count of versions accepted then.
    later_version: LaterVersion,
}

/// What an actor knows of whether its request's identity has a version above 0.
enum LaterVersion {
    Unknown,
    /// To be read with the task's events.
    ToRead(sendledger_core::Identity),
    Read {
        accepted: u64,
        latest: Option<sendledger_store::Latest>,
    },
}

impl TaskActor {
    pub fn new(
        task_id: TaskId,
        shared: Arc<Shared>,
        identity: Option<sendledger_core::Identity>,
    ) -> TaskActor {
        TaskActor {
            task_id,
            state: State::default(),
            shared,
            policy: Policy::default(),
            policy_of: None,
            loaded: None,
            handled: 0,
            attempt_in_flight: false,
            lookup_in_flight: false,
            slot: None,
            holds: Vec::new(),
            unfinished: 0,
            loaded_at: 0,
            versions: None,
            identity_guard: None,
            later_version: identity.map_or(LaterVersion::Unknown, LaterVersion::ToRead),
        }
    }

    /// Loads the policy of `target` unless it is the one loaded: the task's current call's
    /// own target (a multi-step task's changes from one leg to the next).
    fn set_policy(&mut self, target: &str) {
        if self.policy_of.as_deref() == Some(target) {
            return;
        }
        self.policy = self.shared.remote.policy(target).unwrap_or_else(|| {
            tracing::warn!(task_id = %self.task_id, %target, "target no longer configured; attempts will not be sent");
            Policy::default()
        });
        self.policy_of = Some(target.to_string());
    }

    /// Loads the policy of the task's current call, once the task has a request.
    fn refresh_policy(&mut self) {
        if let Some(target) = self.state.own_target().map(str::to_string) {
            self.set_policy(&target);
        }
    }

    /// A multi-step task's steps' remote ids, for its current call's templates.
    fn step_records(&self) -> sendledger_core::saga::StepRecords {
        (self.state.saga.as_ref())
            .map(sendledger_core::saga::Saga::step_records)
            .unwrap_or_default()
    }

    fn random(&self) -> u64 {
        // SplitMix64 over (seed, task, seq): deterministic per decision, independent across tasks.
        let mut z = self.shared.seed
            ^ u64::from_be_bytes(self.task_id.0[..8].try_into().unwrap_or_default())
            ^ (u64::from(self.state.next_seq) << 32);
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Decides, appends, waits for durability, then acts. Runs while no other message of the
    /// task is handled (callers wrap it in an atomic response or `ctx.wait`).
    ///
    /// The decision is taken when the future first runs, not when it is created: actix may
    /// poll a spawned future (an attempt ending) between a handler registering its wait and
    /// that wait running, so a decision taken eagerly could start from a stale state.
    fn process(&mut self, input: TaskInput) -> ResponseActFuture<Self, Result<Reply>> {
        self.unfinished += 1;
        Box::pin(
            fut::ready(())
                .then(move |(), act: &mut Self, _| {
                    // Room and holds found for an earlier input say nothing about this one.
                    act.slot = None;
                    act.holds.clear();
                    act.versions = None;
                    act.decide_and_append(input)
                })
                .map(|res, act, _| {
                    act.unfinished -= 1;
                    act.identity_guard = None;
                    res
                }),
        )
    }

    fn decide_and_append(&mut self, input: TaskInput) -> ResponseActFuture<Self, Result<Reply>> {
        if let TaskInput::Lookup { .. } = input {
            // The lookup is over, whatever becomes of its answer (refused below when the
            // partition is no longer owned here): the next wake may look up again.
            self.lookup_in_flight = false;
        }
        if let Some(Err(e)) = &self.loaded {
            let err = Error::Load {
                task_id: self.task_id,
                source: e.clone(),
            };
            return Box::pin(fut::ready(Err(err)));
        }
        if let TaskInput::Prune { .. } | TaskInput::Forget { .. } = input {
            return self.retain(input);
        }
        if let Some(ownership) = self.shared.ownership.clone() {
            if let Some(refused_or_reload) = self.check_ownership(&ownership, input.clone()) {
                return refused_or_reload;
            }
        }
        let input = self.unsent_outcome(input);
        if let Some(found_then_decide) = self.with_versions(&input) {
            return found_then_decide;
        }
        if let (None, None, true, TaskInput::Deliver { request, .. }) = (
            &self.state.request,
            &self.slot,
            self.holds.is_empty(),
            &input,
        ) {
            // A new task's first delivery sends its first attempt (unless the core refuses
            // it, which then spends one unit of the target's rate): room at the target first,
            // then the decision, from the time the room was found. A multi-step task's first
            // attempt is its first step's.
            let steps = self.shared.remote.steps(&request.target);
            let target = first_call(request, steps.as_deref()).to_string();
            let reserve = self.reserve(&target, None, &input);
            return Box::pin(reserve.into_actor(self).then(move |room, act, _| {
                act.take_room(&target, room);
                act.decide_and_append(input)
            }));
        }
        let now = crate::now_ms();
        let mut clear = None;
        let mut source = None;
        // What to decide again once there is room at the attempt's target (or it said it
        // takes no attempt now), should this decide to send.
        let again = input.clone();
        let core_input = match input {
            TaskInput::Deliver { request, source: s } => {
                source = Some(s.clone());
                // A new task of a saga records its steps as they are configured now.
                let steps = match self.state.request {
                    None => self.shared.remote.steps(&request.target),
                    Some(_) => None,
                };
                Input::Deliver {
                    request,
                    source: s,
                    steps,
                }
            }
            TaskInput::Wake { due } => {
                clear = Some(due);
                Input::Wake
            }
            TaskInput::Continue => Input::Wake,
            TaskInput::Lookup {
                attempt,
                asked_at,
                result,
            } => {
                // The core records the failure's message as it is.
                let result = result.map_err(|e| e.to_string());
                Input::Lookup {
                    attempt,
                    asked_at,
                    result,
                }
            }
            TaskInput::Reject {
                source: s,
                reason,
                raw,
            } => {
                source = Some(s.clone());
                Input::Reject {
                    source: s,
                    reason,
                    raw,
                }
            }
            TaskInput::Recover => Input::Recover,
            TaskInput::Operator(resolution, None) => Input::Operator(resolution),
            TaskInput::Operator(resolution, Some(credential)) => Input::OperatorWith {
                resolution,
                credential,
            },
            TaskInput::RetryOnClose { reason } => Input::RetryOnClose { reason },
            TaskInput::Diverged { task_seq, replaced } => Input::Diverged { task_seq, replaced },
            TaskInput::Outcome { attempt, outcome } => Input::Outcome { attempt, outcome },
            TaskInput::Prune { .. } | TaskInput::Forget { .. } => return self.retain(input),
        };
        let delivery = matches!(core_input, Input::Deliver { .. });
        let is_new = self.state.request.is_none();
        match &core_input {
            // The first delivery decides the first attempt: it needs the policy of its target
            // (a multi-step task's first step's).
            Input::Deliver { request, steps, .. } if is_new => {
                self.set_policy(first_call(request, steps.as_deref()));
            }
            _ => self.refresh_policy(),
        }
        let decision = decide(
            &self.state,
            core_input,
            Ctx {
                now,
                random: self.random(),
                policy: &self.policy,
                holds: &self.holds,
                versions: self.versions.unwrap_or_default(),
            },
        );
        let decision = match decision {
            Ok(d) => d,
            Err(e) => {
                // Frees the room at once; the holds are forgotten with the next input.
                self.slot = None;
                return Box::pin(fut::ready(Err(e.into())));
            }
        };
        if let Action::Send { target, .. } = &decision.action {
            if self.slot.as_ref().is_none_or(|(at, _)| at != target) {
                // Room at the attempt's target first, then the intent: wait, and decide again
                // from now. Each round finds room or a hold at one more target, and the
                // decision never picks a held target, so this ends.
                self.slot = None;
                let retry_of = if self.state.target() == Some(target.as_str()) {
                    self.state.retry_of()
                } else {
                    // The first attempt at a fallback takes its target's own timeout.
                    None
                };
                let target = target.clone();
                let reserve = self.reserve(&target, retry_of, &again);
                return Box::pin(reserve.into_actor(self).then(move |room, act, _| {
                    act.take_room(&target, room);
                    act.decide_and_append(again)
                }));
            }
        }
        let (next, mut append) = record(self.task_id, &self.state, &decision, now);
        // A task that ends while watched hands its result to its watchers (the front door's
        // waits), projected from its state before these events, so that they need not read it.
        let ending = (next.phase.is_terminal() && self.shared.watchers.is_watched(self.task_id))
            .then(|| (self.state.clone(), append.events.clone()));
        if let Some(s) = source.filter(Source::is_message) {
            // A task known by what retention (or a kafka-mode snapshot) kept of it has no
            // source of its own: its deliveries' partition is its request's.
            append.partition.get_or_insert(s.partition);
            append.offsets.push((s.topic, s.partition, s.offset));
        }
        if let Some(due) = clear {
            append.clear_timers.push((due, self.task_id));
        }
        let names: Vec<&'static str> = decision.events.iter().map(EventBody::name).collect();
        let ledger = self.shared.ledger.clone();
        // The send lease runs from before the intent is recorded, so a stall anywhere in
        // recording it (the log's commit included) counts against it.
        let first_byte_by = self
            .shared
            .send_lease
            .map(|lease| std::time::Instant::now() + lease);
        let task_id = self.task_id;
        // The room at the attempt's target, held while the intent is recorded, unless that
        // takes long (see [`ROOM_HELD_THROUGH_RECORDING`]).
        let held = self.slot.take().map(|(_, slot)| slot);
        let retry_of = match &decision.action {
            Action::Send { target, .. } if self.state.target() == Some(target.as_str()) => {
                self.state.retry_of()
            }
            _ => None,
        };
        Box::pin(
            async move {
                let empty = append.events.is_empty() && append.offsets.is_empty() && append.clear_timers.is_empty() && append.set_timers.is_empty();
                if empty {
                    return (Ok(0..0), held.map(Room::Held));
                }
                let recorded = ledger.append(append);
                let Some(slot) = held else {
                    return (recorded.await, None);
                };
                tokio::pin!(recorded);
                match tokio::time::timeout(ROOM_HELD_THROUGH_RECORDING, &mut recorded).await {
                    Ok(res) => (res, Some(Room::Held(slot))),
                    Err(_) => {
                        // Gives the room back: a write that hangs (its partition's commit, in
                        // kafka mode) must not hold up other tasks' attempts at the target.
                        drop(slot);
                        (recorded.await, Some(Room::GivenBack { retry_of }))
                    }
                }
            }
            .into_actor(self)
            .map(move |(res, room), act, ctx| {
                let lsns = res.inspect_err(|e| match e {
                    // Kafka mode: the partition is taken over, here again or elsewhere, and
                    // the task resumed from what its log holds.
                    sendledger_store::Error::PartitionLost { partition, .. } => {
                        tracing::debug!(task_id = %task_id, partition, "events not recorded: the task's partition is not owned here now; it resumes where the partition is taken over");
                        // An intent refused here may still be in the log (a transaction whose
                        // outcome was unknown, or that committed after the partition was
                        // taken over anew); its attempt was not sent. Should the log show it
                        // as the task's last event when the partition is owned here again, it
                        // resumes as not sent rather than as unknown.
                        if let (Action::Send { attempt, .. }, Some(ownership)) =
                            (&decision.action, &act.shared.ownership)
                        {
                            ownership.note_unsent(task_id, *attempt);
                        }
                    }
                    e => {
                        tracing::error!(task_id = %task_id, error = %Chain(e), "ledger write failed; the task is resumed when the engine restarts");
                    }
                })?;
                count_recorded(delivery, &decision.events);
                if decision.events.iter().any(|e| matches!(e, EventBody::RequestVersion { .. })) {
                    act.shared.versions_accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let settles = next.phase.is_terminal() && !act.state.phase.is_terminal();
                act.state = next;
                if settles {
                    // The next version of the request, waiting for this one, goes on now.
                    if let Some(next_version) = act.shared.waiting.settled(task_id) {
                        act.shared.timers.do_send(Schedule { at: crate::now_ms(), task_id: next_version });
                    }
                }
                if !lsns.is_empty() {
                    let ended = act.state.phase.is_terminal();
                    let result = ending.and_then(|(before, events)| {
                        let mut projection = Projection::from_state(before);
                        (events.into_iter().zip(lsns.clone()))
                            .filter_map(|(event, lsn)| projection.apply(&event.with_lsn(lsn)))
                            .last()
                    });
                    act.shared.watchers.changed(task_id, ended, result);
                }
                act.perform(decision.action, room, first_byte_by, ctx);
                Ok(Reply { task_id, phase: act.state.phase, lsns, events: names })
            }),
        )
    }

    /// Acts on a durable decision; `room` is the target's room for an attempt to send, and
    /// `first_byte_by` the end of its send lease.
    fn perform(
        &mut self,
        action: Action,
        room: Option<Room>,
        first_byte_by: Option<std::time::Instant>,
        ctx: &mut Context<Self>,
    ) {
        let task_id = self.task_id;
        match action {
            Action::None => {}
            Action::WakeAt(at) => self.shared.timers.do_send(Schedule { at, task_id }),
            Action::Continue => {
                let next = self.process(TaskInput::Continue);
                ctx.wait(next.map(move |res, act, ctx| {
                    if let Err(e) = res {
                        // Looked at again shortly; a restart resumes the leg anyway.
                        tracing::warn!(task_id = %task_id, error = %Chain(&e), "the next leg was not decided; trying again in a second");
                        let at = crate::now_ms() + 1_000;
                        act.shared.timers.do_send(Schedule { at, task_id });
                    }
                    act.idle_check(ctx);
                }));
            }
            Action::Lookup { attempt } => {
                // At most one lookup per task: a second wake while one is out (a stored timer
                // and recovery's wake, say) waits for its result, which schedules what follows.
                if self.lookup_in_flight {
                    return;
                }
                let Some(request) = self.state.request.clone() else {
                    return;
                };
                self.lookup_in_flight = true;
                let since = self.state.first_intent_at.unwrap_or(0);
                let target = self.state.target().unwrap_or_default().to_string();
                self.shared.reconciler.do_send(LookupJob {
                    task_id,
                    target,
                    request,
                    steps: self.step_records(),
                    attempt,
                    since,
                });
            }
            Action::Send {
                attempt,
                idempotency_key,
                target,
            } => {
                let Some(request) = &self.state.request else {
                    return;
                };
                if let Some(partition) = self.partition_lost() {
                    // The intent is recorded and nothing was sent: the attempt stays sending,
                    // and whoever owns the partition now reconciles it (this instance, should
                    // it own the partition again, records it as not sent).
                    tracing::info!(task_id = %task_id, attempt, partition, "partition lost before the attempt was sent; not sent here");
                    if let Some(ownership) = &self.shared.ownership {
                        ownership.note_unsent(task_id, attempt);
                    }
                    return;
                }
                self.attempt_in_flight = true;
                let span = tracing::info_span!(
                    "sendledger.attempt",
                    task_id = %task_id,
                    target = %target,
                    attempt,
                    outcome = tracing::field::Empty,
                );
                let trace = request.traceparent();
                sendledger_telemetry::join(&span, trace);
                let passed_on = sendledger_telemetry::pass_on(&span, trace);
                span.in_scope(|| tracing::debug!(task_id = %task_id, attempt, "sending"));
                let sending = Sending {
                    trace: passed_on,
                    first_byte_by,
                };
                let remote = self.shared.remote.clone();
                let request = request.clone();
                let steps = self.step_records();
                let send = async move {
                    let slot = match room {
                        Some(Room::Held(slot)) => Some(slot),
                        // The room was given back while the intent was recorded: found
                        // again, within the send lease (the attempt checks it).
                        Some(Room::GivenBack { retry_of }) => {
                            match remote.reserve(&target, retry_of).await {
                                Ok(slot) => Some(slot),
                                Err(held) => return breaker_opened(held),
                            }
                        }
                        None => None,
                    };
                    let key = idempotency_key.as_deref();
                    let call = Call {
                        request: &request,
                        steps: &steps,
                    };
                    (remote.attempt(&target, call, attempt, key, sending, slot)).await
                }
                .instrument(span.clone());
                ctx.spawn(send.into_actor(self).map(move |outcome, act, ctx| {
                    span.record("outcome", outcome_class(&outcome));
                    drop(span);
                    act.attempt_in_flight = false;
                    tracing::debug!(task_id = %task_id, attempt, ?outcome, "attempt ended");
                    let next = act.process(TaskInput::Outcome { attempt, outcome });
                    ctx.wait(next.map(|res, act, ctx| {
                        if let Err(e) = res {
                            tracing::warn!(task_id = %act.task_id, error = %Chain(&e), "attempt outcome not recorded");
                        }
                        act.idle_check(ctx);
                    }));
                }));
            }
        }
    }

    /// Keeps what the target answered a reservation with for the decision that follows: room
    /// to send, or a hold (its breaker is open: the decision waits instead of intending).
    fn take_room(&mut self, target: &str, room: std::result::Result<Slot, Unavailable>) {
        match room {
            Ok(slot) => self.slot = Some((target.to_string(), slot)),
            Err(unavailable) => {
                let millis =
                    |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                self.holds.push(Hold {
                    until: crate::now_ms().saturating_add(millis(unavailable.wait)),
                    spread_ms: millis(unavailable.spread),
                    reason: WaitReason::BreakerOpen {
                        target: target.to_string(),
                    },
                });
            }
        }
    }

    /// Kafka mode: what the resumption of a task whose attempt was not sent here is. The task
    /// recorded the intent here, and its partition was lost before the first byte (a
    /// transaction that committed after the partition's revocation; see
    /// [`Ownership::note_unsent`]). When the partition is owned here again and its log shows
    /// that attempt still sending, nothing was sent: only the instance that records an intent
    /// sends it, and any other owner in between only reconciled. So the resumption records the
    /// attempt as not sent (it is tried again) instead of as unknown (reconciled by lookups
    /// that cannot find it, then manual review).
    fn unsent_outcome(&mut self, input: TaskInput) -> TaskInput {
        let (TaskInput::Recover, Some(ownership)) = (&input, &self.shared.ownership) else {
            return input;
        };
        let Some(attempt) = ownership.take_unsent(self.task_id) else {
            return input;
        };
        if self.state.phase != Phase::Sending || self.state.in_flight != Some(attempt) {
            // The log moved past the attempt.
            return input;
        }
        tracing::info!(task_id = %self.task_id, attempt, "an attempt not sent here when its partition was lost is resumed as not sent");
        TaskInput::Outcome {
            attempt,
            outcome: AttemptOutcome::NotSent {
                cause: NotSentCause::LocalResources(
                    "the partition was revoked between the intent and the first byte; nothing was sent"
                        .into(),
                ),
                retry_after_ms: None,
            },
        }
    }

    /// Kafka mode: the task's partition, when it is no longer owned here as it was when the
    /// task's state was read (revoked, or assigned again since).
    fn partition_lost(&self) -> Option<i32> {
        let ownership = self.shared.ownership.as_ref()?;
        let partition = self.state.source.as_ref()?.partition;
        match ownership.epoch(partition) {
            Some(epoch) if epoch <= self.loaded_at => None,
            _ => Some(partition),
        }
    }

    /// The requests partition of the task, or (a new task's first delivery) of `input`.
    fn partition_for(&self, input: &TaskInput) -> Option<i32> {
        match (&self.state.source, input) {
            (Some(source), _) | (None, TaskInput::Deliver { source, .. }) => Some(source.partition),
            (None, _) => None,
        }
    }

    /// Room at `target` for the attempt `input` may decide (see [`Remote::reserve`]). Kafka
    /// mode: not while the log of the task's partition has had a transaction under way for
    /// [`TRANSACTION_STALLED`] or longer (its commits hang): the attempt's intent could not be
    /// recorded before it ends, and the room would be kept from other partitions' tasks
    /// meanwhile. The task waits until that transaction ends (or the partition is no longer
    /// owned here: then nothing is recorded anyway), and gives back room found while one
    /// stalled.
    fn reserve(
        &self,
        target: &str,
        retry_of: Option<sendledger_core::RetryClass>,
        input: &TaskInput,
    ) -> impl std::future::Future<Output = std::result::Result<Slot, Unavailable>> {
        let (ledger, ownership) = (self.shared.ledger.clone(), self.shared.ownership.clone());
        let partition = self.partition_for(input);
        let (remote, target) = (self.shared.remote.clone(), target.to_string());
        let stalled = move || match (partition, &ownership) {
            (Some(p), Some(ownership)) if ownership.epoch(p).is_some() => {
                ledger.stats().transaction_stalled(p)
            }
            _ => false,
        };
        async move {
            loop {
                while stalled() {
                    tokio::time::sleep(TRANSACTION_STALLED / 4).await;
                }
                let room = remote.reserve(&target, retry_of).await;
                if room.is_err() || !stalled() {
                    return room;
                }
            }
        }
    }

    fn idle_check(&mut self, _ctx: &mut Context<Self>) {
        if self.unfinished == 0 && !self.attempt_in_flight && !self.lookup_in_flight {
            self.shared.registry.do_send(Idle {
                task_id: self.task_id,
                handled: self.handled,
            });
        }
    }
}

/// What the task's writer appends for a decision: its events, the task's new summary, the
/// identity on first acceptance, and the timer of a `WakeAt`. Returns the state after it.
pub fn record(task_id: TaskId, state: &State, decision: &Decision, now: u64) -> (State, Append) {
    let mut next = state.clone();
    if next.task_id.is_none() {
        next.task_id = Some(task_id);
    }
    next.apply_all(now, &decision.events);

    let mut append = Append {
        // The partition of the task's request: the unsettled index lists the task under it,
        // and in kafka mode the events go to that partition's log.
        partition: next.source.as_ref().map(|s| s.partition),
        ..Append::default()
    };
    for (i, body) in decision.events.iter().enumerate() {
        append.events.push(NewEvent {
            task_id,
            task_seq: state.next_seq + i as u32,
            at: now,
            body: body.clone(),
        });
    }
    if !decision.events.is_empty() {
        append.tasks.push((
            task_id,
            TaskSummary {
                phase: next.phase,
                next_seq: next.next_seq,
            },
        ));
        append.reindex(task_id, state, &next);
    }
    if state.request.is_none() {
        if let (Some(req), Some(hash)) = (&next.request, next.payload_hash) {
            match req.version {
                0 => append
                    .identities
                    .push((req.identity.clone(), task_id, hash)),
                version => (append.versions).push((req.identity.clone(), version, task_id, hash)),
            }
        }
    }
    if let Action::WakeAt(at) = decision.action {
        let kind = if next.phase == Phase::RetryWait {
            TimerKind::Retry
        } else {
            TimerKind::Check
        };
        append.set_timers.push((at, task_id, kind));
    }
    (next, append)
}

/// The target of a new task's first call: its saga's first step's, or its request's own.
fn first_call<'a>(
    request: &'a sendledger_core::AcceptedRequest,
    steps: Option<&'a [sendledger_core::PlannedStep]>,
) -> &'a str {
    match steps.and_then(<[_]>::first) {
        Some(step) => &step.target,
        None => &request.target,
    }
}

/// How long a task holds its room at the attempt's target while the intent is recorded. A
/// write takes milliseconds; one that takes longer (a partition's commit hangs, in kafka mode)
/// gives the room back, and the attempt finds room again once the intent is recorded, within
/// its send lease.
const ROOM_HELD_THROUGH_RECORDING: std::time::Duration = std::time::Duration::from_secs(1);

/// The attempt's room at its target, as the recording of its intent left it.
enum Room {
    Held(Slot),
    /// Given back while the intent was recorded; `retry_of` is what the attempt retries.
    GivenBack {
        retry_of: Option<sendledger_core::RetryClass>,
    },
}

/// The attempt of an intent recorded while the room at its target was given back, whose
/// target's breaker opened meanwhile: nothing was written, and the task waits for the breaker
/// as the retry's delay.
fn breaker_opened(held: Unavailable) -> AttemptOutcome {
    AttemptOutcome::NotSent {
        cause: NotSentCause::LocalResources(
            "the target's circuit breaker opened while the attempt's intent was recorded; nothing was written".into(),
        ),
        retry_after_ms: Some(u64::try_from(held.wait.as_millis()).unwrap_or(u64::MAX)),
    }
}

/// The class of an attempt's outcome, as the `sendledger.attempt` span records it.
fn outcome_class(outcome: &AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Succeeded { .. } => "succeeded",
        AttemptOutcome::Rejected { .. } => "rejected",
        AttemptOutcome::NotSent { .. } => "not_sent",
        AttemptOutcome::Unknown { .. } => "unknown",
    }
}

/// Counts what was just made durable: attempt outcomes by class, duplicate deliveries dropped.
/// A delivery that recorded no event is a duplicate past the limit, dropped all the same.
fn count_recorded(delivery: bool, events: &[EventBody]) {
    if delivery && events.is_empty() {
        metrics::counter!(sendledger_store::metric_definitions::DUPLICATES_DROPPED_TOTAL, "by" => "identity").increment(1);
    }
    for body in events {
        let class = match body {
            EventBody::Confirmed {
                evidence: Evidence::Response { .. },
                ..
            } => "succeeded",
            EventBody::Rejected { .. } => "rejected",
            EventBody::SendNotSent { .. } => "not_sent",
            EventBody::SendUnknown { .. } => "unknown",
            EventBody::DuplicateDelivery { .. } => {
                metrics::counter!(sendledger_store::metric_definitions::DUPLICATES_DROPPED_TOTAL, "by" => "identity")
                    .increment(1);
                continue;
            }
            _ => continue,
        };
        metrics::counter!(crate::metric_definitions::ATTEMPTS_TOTAL, "class" => class).increment(1);
    }
}

impl Actor for TaskActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let task_id = self.task_id;
        if let Some(ownership) = &self.shared.ownership {
            self.loaded_at = ownership.current();
        }
        let ledger = self.shared.ledger.clone();
        let identity = match std::mem::replace(&mut self.later_version, LaterVersion::Unknown) {
            LaterVersion::ToRead(identity) => Some(identity),
            _ => None,
        };
        let accepted = self
            .shared
            .versions_accepted
            .load(std::sync::atomic::Ordering::SeqCst);
        let read = move |l: &Ledger| {
            let events = l.task_history(task_id)?;
            // A new task's first delivery is refused when a later version exists: read here,
            // with the events, rather than in a read of its own for every new task.
            let later = match (&identity, events.is_empty()) {
                (Some(identity), true) => Some(l.latest_version_above_0(identity)?),
                _ => None,
            };
            Ok((events, later))
        };
        ctx.wait(async move { ledger.read(read).await }.into_actor(self).map(
            move |res, act, _| match res {
                Ok((events, later)) => {
                    act.state = sendledger_core::fold(&events);
                    act.refresh_policy();
                    act.loaded = Some(Ok(()));
                    if let Some(latest) = later {
                        act.later_version = LaterVersion::Read { accepted, latest };
                    }
                }
                Err(e) => {
                    tracing::error!(task_id = %act.task_id, error = %Chain(&e), "cannot load the task's events; it will not be processed");
                    act.loaded = Some(Err(Arc::new(e)));
                }
            },
        ));
    }
}

impl Handler<TaskMsg> for TaskActor {
    type Result = AtomicResponse<Self, Result<Reply>>;

    fn handle(&mut self, msg: TaskMsg, _ctx: &mut Context<Self>) -> Self::Result {
        let fut = self.process(msg.0).map(|res, act, ctx| {
            // Counted when done, not when received: the registry drops an actor only once every
            // message it forwarded is fully processed.
            act.handled += 1;
            act.idle_check(ctx);
            res
        });
        AtomicResponse::new(Box::pin(fut))
    }
}
