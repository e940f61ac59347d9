//! The reconciler: runs lookups for tasks whose outcome is unknown, at most `concurrency` at a
//! time, and hands each result (evidence, or the lookup's own failure) to the task's actor,
//! which records it. It never sends an attempt.
//!
//! Each lookup is a `sendledger.lookup` span (task id, target, attempt, match count, outcome),
//! parented on the task's trace context.
//!
//! A lookup that fails with a transient error (no answer, a 5xx, throttled, no room at the
//! target) backs its target off: that
//! target's next lookups wait, 1 s after the first failure, then one lookup probes, and each
//! failed probe doubles the wait up to 30 s, until one answers. A remote that is down is not asked once per unknown task
//! per check interval; each task's observation window runs on meanwhile (a failed lookup is no
//! evidence either way), and the other targets' lookups are not held up. A lookup the remote
//! throttled (429, or 503 with `Retry-After`) backs its target off for at least that delay. The
//! target's limits, and the same `Retry-After`, are also kept where lookups are sent (the
//! `Remote`; over HTTP, `sendledger-effects`' `Target::lookup`): no lookup reaches a target
//! before the delay its latest throttled lookup was given.
//!
//! Metric: `sendledger_lookups_total{outcome="none|one|several|error"}` (lookups ended, by how
//! many records matched, or the lookup's own failure).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::Instrument;

use crate::messages::{LookupJob, Route, TaskInput};
use crate::remote::Remote;
use sendledger_core::saga::Call;

/// The first backoff of a target whose lookup failed, and the longest.
const LOOKUP_BACKOFF_FIRST: Duration = Duration::from_secs(1);
const LOOKUP_BACKOFF_MAX: Duration = Duration::from_secs(30);

pub struct Reconciler {
    remote: Arc<dyn Remote>,
    registry: Recipient<Route>,
    concurrency: usize,
    running: usize,
    queue: VecDeque<LookupJob>,
    /// Targets whose lookups failed: until when their lookups wait, and the backoff that got
    /// them there.
    backoff: BTreeMap<String, (Instant, Duration)>,
    /// Backed-off targets whose backoff ended and whose one probing lookup runs: their other
    /// lookups wait for its answer.
    probing: BTreeSet<String>,
    /// Whether a pump is scheduled for when the earliest backoff ends.
    wake_scheduled: bool,
}

impl Reconciler {
    pub fn new(
        remote: Arc<dyn Remote>,
        registry: Recipient<Route>,
        concurrency: usize,
    ) -> Reconciler {
        Reconciler {
            remote,
            registry,
            concurrency: concurrency.max(1),
            running: 0,
            queue: VecDeque::new(),
            backoff: BTreeMap::new(),
            probing: BTreeSet::new(),
            wake_scheduled: false,
        }
    }

    /// Whether `target`'s lookups wait now.
    fn backed_off(&self, target: &str, now: Instant) -> bool {
        self.backoff
            .get(target)
            .is_some_and(|(until, _)| *until > now)
    }

    /// The next job whose target is neither backed off nor probing, in order. The first job
    /// of a target whose backoff ended probes it alone.
    fn next_job(&mut self) -> Option<LookupJob> {
        let now = Instant::now();
        let ready = self.queue.iter().position(|job| {
            let target = &job.target;
            !self.backed_off(target, now) && !self.probing.contains(target)
        })?;
        let job = self.queue.remove(ready)?;
        if self.backoff.contains_key(&job.target) {
            self.probing.insert(job.target.clone());
        }
        Some(job)
    }

    /// Jobs wait for a backed-off target: pump again when the earliest backoff ends.
    fn wake_after_backoff(&mut self, ctx: &mut Context<Self>) {
        if self.wake_scheduled || self.queue.is_empty() {
            return;
        }
        let now = Instant::now();
        let Some(until) = self
            .backoff
            .values()
            .map(|(until, _)| *until)
            .filter(|until| *until > now)
            .min()
        else {
            return;
        };
        self.wake_scheduled = true;
        ctx.run_later(
            until.saturating_duration_since(Instant::now()),
            |act, ctx| {
                act.wake_scheduled = false;
                act.pump(ctx);
            },
        );
    }

    /// A lookup of `target` answered (it may still have found nothing), or failed. Failures of
    /// lookups that were already running when the target backed off do not back it off
    /// further: only the lookup that probes after a backoff doubles it.
    /// A remote's `Retry-After` is a floor on the wait, whichever lookup brought it.
    fn lookup_ended(
        &mut self,
        target: &str,
        transient_failure: bool,
        retry_after: Option<Duration>,
    ) {
        let probed = self.probing.remove(target);
        if !transient_failure {
            self.backoff.remove(target);
            return;
        }
        let now = Instant::now();
        let floor = retry_after.map(|d| now + d);
        if self.backed_off(target, now) || (!probed && self.backoff.contains_key(target)) {
            if let (Some(floor), Some((until, _))) = (floor, self.backoff.get_mut(target)) {
                *until = (*until).max(floor);
            }
            return;
        }
        let previous = self.backoff.get(target).map(|(_, backoff)| *backoff);
        let backoff = previous.map_or(LOOKUP_BACKOFF_FIRST, |b| (b * 2).min(LOOKUP_BACKOFF_MAX));
        let until = floor.map_or(now + backoff, |floor| floor.max(now + backoff));
        self.backoff.insert(target.to_string(), (until, backoff));
    }

    fn pump(&mut self, ctx: &mut Context<Self>) {
        while self.running < self.concurrency {
            let Some(job) = self.next_job() else {
                self.wake_after_backoff(ctx);
                return;
            };
            self.running += 1;
            let span = tracing::info_span!(
                "sendledger.lookup",
                task_id = %job.task_id,
                target = %job.target,
                attempt = job.attempt,
                matches = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            let trace = job.request.traceparent();
            sendledger_telemetry::join(&span, trace);
            let passed_on = sendledger_telemetry::pass_on(&span, trace);
            let lookup = self
                .remote
                .lookup(
                    &job.target,
                    Call {
                        request: &job.request,
                        steps: &job.steps,
                    },
                    job.since,
                    passed_on,
                )
                .instrument(span.clone());
            let (task_id, attempt) = (job.task_id, job.attempt);
            let target = job.target;
            let asked_at = crate::now_ms();
            ctx.spawn(lookup.into_actor(self).map(move |result, act, ctx| {
                act.running -= 1;
                let outcome = match &result {
                    Ok(matches) => {
                        tracing::debug!(task_id = %task_id, matches = matches.ids.len(), "lookup done");
                        span.record("matches", matches.ids.len());
                        ["none", "one"].get(matches.ids.len()).copied().unwrap_or("several")
                    }
                    Err(e) if e.is_transient() => {
                        tracing::warn!(task_id = %task_id, error = %e, "lookup failed; will check again");
                        "error"
                    }
                    Err(e) => {
                        tracing::error!(task_id = %task_id, error = %e, "lookup cannot succeed until its cause is fixed; checked again until the task's deadline, then the task goes to manual review");
                        "error"
                    }
                };
                span.record("outcome", outcome);
                drop(span);
                let (transient, retry_after) = match &result {
                    Err(e) => (e.is_transient(), e.retry_after()),
                    Ok(_) => (false, None),
                };
                act.lookup_ended(&target, transient, retry_after);
                metrics::counter!(crate::metric_definitions::LOOKUPS_TOTAL, "outcome" => outcome).increment(1);
                act.registry.do_send(Route { task_id, input: TaskInput::Lookup { attempt, asked_at, result } });
                act.pump(ctx);
            }));
        }
    }
}

impl Actor for Reconciler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(usize::MAX);
    }
}

impl Handler<LookupJob> for Reconciler {
    type Result = ();

    fn handle(&mut self, job: LookupJob, ctx: &mut Context<Self>) {
        self.queue.push_back(job);
        self.pump(ctx);
    }
}
