//! The reconciler: runs lookups for tasks whose outcome is unknown, at most `concurrency` at a
//! time, and hands each result (evidence, or the lookup's own failure) to the task's actor,
//! which records it. It never sends an attempt.
//!
//! Each lookup is a `sendledger.lookup` span (task id, target, attempt, match count, outcome),
//! parented on the task's trace context.
//!
//! Metric: `sendledger_lookups_total{outcome="none|one|several|error"}` (lookups ended, by how
//! many records matched, or the lookup's own failure).

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use tracing::Instrument;

use crate::messages::{LookupJob, Route, TaskInput};
use crate::remote::Remote;

pub struct Reconciler {
    remote: Arc<dyn Remote>,
    registry: Recipient<Route>,
    concurrency: usize,
    running: usize,
    queue: VecDeque<LookupJob>,
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
        }
    }

    fn pump(&mut self, ctx: &mut Context<Self>) {
        while self.running < self.concurrency {
            let Some(job) = self.queue.pop_front() else {
                return;
            };
            self.running += 1;
            let span = tracing::info_span!(
                "sendledger.lookup",
                task_id = %job.task_id,
                target = %job.request.target,
                attempt = job.attempt,
                matches = tracing::field::Empty,
                outcome = tracing::field::Empty,
            );
            let trace = job.request.traceparent();
            sendledger_telemetry::join(&span, trace);
            let passed_on = sendledger_telemetry::pass_on(&span, trace);
            let lookup = self
                .remote
                .lookup(&job.request, job.since, passed_on)
                .instrument(span.clone());
            let (task_id, attempt) = (job.task_id, job.attempt);
            let asked_at = crate::now_ms();
            ctx.spawn(lookup.into_actor(self).map(move |result, act, ctx| {
                act.running -= 1;
                let outcome = match &result {
                    Ok(matches) => {
                        tracing::debug!(task_id = %task_id, matches = matches.len(), "lookup done");
                        span.record("matches", matches.len());
                        ["none", "one"].get(matches.len()).copied().unwrap_or("several")
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
