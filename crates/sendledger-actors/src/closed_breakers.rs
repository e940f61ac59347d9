//! Retries failed tasks when their target's circuit breaker closes again, for the targets that
//! ask for it ([`TargetHealth::retry_failed_within`]): after an outage that outlasted the retry
//! policy, the breaker's closing gets the tasks the outage failed done, with no operator.
//!
//! Every second it reads the breakers ([`Remote::target_health`]): one that opened since the
//! last look and is closed now has closed. The target's tasks that failed within the setting
//! before then, found in the task index, each failed for a reason of the remote's (connect,
//! throttled, server_error), are sent `RetryOnClose`: the task's actor records `TaskRetried` by
//! `policy:breaker_closed` when the task may be retried (every attempt proven not sent) and
//! refuses otherwise. In kafka mode each instance has its own breakers and retries the tasks of
//! the partitions it owns (the others' actors refuse).
//!
//! [`TargetHealth::retry_failed_within`]: crate::remote::TargetHealth::retry_failed_within

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use sendledger_core::error::Chain;
use sendledger_core::{FailureKind, Phase, TaskId};
use sendledger_store::{Ledger, TaskQuery};
use tokio::task::JoinSet;

use crate::messages::{Route, TaskInput};
use crate::registry::Registry;
use crate::remote::Remote;

/// How often the breakers are read.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Failed tasks read from the index at a time.
const PAGE: usize = 1000;
/// Retries in flight at once (each is one durable append, then the task's first attempt).
const CONCURRENT: usize = 32;

pub struct ClosedBreakers {
    remote: Arc<dyn Remote>,
    ledger: Ledger,
    registry: Addr<Registry>,
    /// Per target, how many times its breaker had opened when its last closing was handled.
    handled: BTreeMap<String, u64>,
}

impl ClosedBreakers {
    pub fn new(remote: Arc<dyn Remote>, ledger: Ledger, registry: Addr<Registry>) -> Self {
        ClosedBreakers {
            remote,
            ledger,
            registry,
            handled: BTreeMap::new(),
        }
    }

    fn look(&mut self, ctx: &mut Context<Self>) {
        for health in self.remote.target_health() {
            let Some(within) = health.retry_failed_within else {
                continue;
            };
            let handled = self.handled.entry(health.target.clone()).or_insert(0);
            if health.state != "closed" || health.opened <= *handled {
                continue;
            }
            *handled = health.opened;
            let since = crate::now_ms().saturating_sub(millis(within));
            let job = retry_failed(
                self.ledger.clone(),
                self.registry.clone(),
                health.target,
                since,
            );
            ctx.spawn(fut::wrap_future(job));
        }
    }
}

impl Actor for ClosedBreakers {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(LOOK_EVERY, |act, ctx| act.look(ctx));
    }
}

/// Retries `target`'s tasks that failed since `since` for a reason of the remote's.
async fn retry_failed(ledger: Ledger, registry: Addr<Registry>, target: String, since: u64) {
    let reason = format!("the circuit breaker of target {target} closed: the remote is back");
    let (mut retried, mut refused) = (0u64, 0u64);
    let mut after = None;
    loop {
        let query = TaskQuery {
            phases: vec![Phase::Failed],
            target: Some(target.clone()),
            from: Some(since),
            after,
            limit: PAGE,
            ..TaskQuery::default()
        };
        let page = match ledger.read(move |l| l.list_tasks(&query)).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(%target, error = %Chain(&e), "failed tasks not retried on the breaker's closing: the task index could not be read");
                return;
            }
        };
        let tasks = page.tasks.iter().filter_map(|(task, entry)| {
            matches!(
                entry.failure,
                Some(FailureKind::Connect | FailureKind::Throttled | FailureKind::ServerError)
            )
            .then_some(*task)
        });
        let mut running = JoinSet::new();
        for task_id in tasks {
            if running.len() >= CONCURRENT {
                count(running.join_next().await, &mut retried, &mut refused);
            }
            let input = TaskInput::RetryOnClose {
                reason: reason.clone(),
            };
            let send = registry.send(Route { task_id, input });
            running.spawn(async move { (task_id, send.await) });
        }
        while let Some(done) = running.join_next().await {
            count(Some(done), &mut retried, &mut refused);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    tracing::info!(%target, retried, refused, "breaker closed: failed tasks retried");
}

type Sent = (TaskId, Result<crate::Result<crate::Reply>, MailboxError>);

fn count(done: Option<Result<Sent, tokio::task::JoinError>>, retried: &mut u64, refused: &mut u64) {
    match done {
        Some(Ok((_, Ok(Ok(_))))) => *retried += 1,
        Some(Ok((task_id, Ok(Err(e))))) => {
            *refused += 1;
            tracing::debug!(task_id = %task_id, error = %Chain(&e), "not retried on the breaker's closing");
        }
        _ => *refused += 1,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
