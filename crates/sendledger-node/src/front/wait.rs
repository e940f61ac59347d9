//! Waiting for a task: a request's wait is a future woken by the task's watch (the engine
//! wakes it each time it records events of the task, as the task's actor or, in kafka mode, as
//! a partition's standby copy or restore), never a thread.

use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use sendledger_actors::watchers::TaskWatch;
use sendledger_core::result::{Projection, TaskResult};
use sendledger_core::TaskId;
use serde_json::json;

use super::problem::Problem;
use super::{unavailable, Shared, RETRY_AFTER};
use crate::metric_definitions::{FRONT_WAITING, FRONT_WAITS_TOTAL};

/// How often a waiting request reads its task's summary when nothing woke it: a safety net
/// (the engine wakes it after every change it records).
const RECHECK: Duration = Duration::from_millis(500);

/// Where a task stands: its state, its latest result and its tenant.
pub(super) struct Progress {
    pub state: &'static str,
    pub terminal: bool,
    pub result: Option<Arc<TaskResult>>,
    /// The task's tenant; `None` for rejected input, which names no trusted tenant.
    pub tenant: Option<String>,
}

impl Progress {
    /// A task that ended with `result`.
    fn ended(shared: &Shared, mut result: Arc<TaskResult>) -> Progress {
        if shared.kafka.is_some() {
            // As published (see [`progress`]).
            Arc::make_mut(&mut result).lsn = 0;
        }
        Progress {
            state: result.status.name(),
            terminal: true,
            tenant: result.tenant.clone(),
            result: Some(result),
        }
    }

    /// The result record with `done` when the task is terminal; otherwise `pending` with
    /// where to ask and when.
    pub fn answer(self, task_id: TaskId, done: StatusCode, pending: StatusCode) -> Response {
        if self.terminal {
            // The record as the results topic carries it, fields in the same order.
            let body = serde_json::to_string(&self.result.as_deref()).unwrap_or_default();
            return (done, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        }
        let body = json!({ "task_id": task_id.to_string(), "state": self.state, "result": self.result.as_deref() });
        let location = format!("/v1/tasks/{task_id}");
        (
            pending,
            [
                (header::CONTENT_TYPE, "application/json".to_string()),
                (header::LOCATION, location),
                (header::RETRY_AFTER, RETRY_AFTER.to_string()),
            ],
            body.to_string(),
        )
            .into_response()
    }
}

/// A request waiting for its task: a permit of `front.max_waiting`, the task's watch, and its
/// count in [`FRONT_WAITING`] while it lives (a client that goes away drops its wait, and this
/// with it).
pub(super) struct Waiting<'a> {
    /// When the wait for the task's result ends (at once without `Prefer: wait`).
    deadline: tokio::time::Instant,
    /// Whether the caller asked to wait (how its wait ended is counted).
    asked: bool,
    watch: Option<(TaskWatch, tokio::sync::SemaphorePermit<'a>)>,
}

impl<'a> Waiting<'a> {
    /// A wait of `wait` for `task_id`, or 503 when `front.max_waiting` requests wait already.
    /// The task is watched when `wait` is not zero, or when `watch` says the request waits in
    /// any case (kafka mode: for its partition's owner to record it).
    pub fn begin(
        shared: &'a Shared,
        task_id: TaskId,
        wait: Duration,
        watch: bool,
    ) -> std::result::Result<Waiting<'a>, Problem> {
        let deadline = tokio::time::Instant::now() + wait;
        let asked = !wait.is_zero();
        if !asked && !watch {
            return Ok(Waiting {
                deadline,
                asked,
                watch: None,
            });
        }
        let permit = shared.waiting.try_acquire().map_err(|_| {
            metrics::counter!(FRONT_WAITS_TOTAL, "ended" => "refused").increment(1);
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too-many-waiting",
                "Too many requests are waiting",
            )
            .detail("front.max_waiting requests wait already; nothing was executed: ask again without waiting, or later")
            .retry_after()
        })?;
        metrics::gauge!(FRONT_WAITING).increment(1.0);
        Ok(Waiting {
            deadline,
            asked,
            watch: Some((shared.engine.watch(task_id), permit)),
        })
    }

    /// The task's watch, when it is watched.
    pub fn watch(&self) -> Option<&TaskWatch> {
        self.watch.as_ref().map(|(watch, _)| watch)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.watch.is_some() {
            metrics::gauge!(FRONT_WAITING).decrement(1.0);
        }
    }
}

/// The task's progress once it is terminal (at once when it `ended` already), or when the wait
/// has passed (at once with no wait). Woken by the task's actor each time it records events of
/// the task (which says when the task has ended); the task's summary is read only after
/// [`RECHECK`] without a wake.
pub(super) async fn wait_for(
    shared: &Shared,
    task_id: TaskId,
    waiting: Waiting<'_>,
    ended: bool,
) -> std::result::Result<Progress, Problem> {
    let watch = waiting.watch();
    let mut read_ledger = false;
    loop {
        // Taken before the summary is read, so a change in between still wakes it.
        let changed = watch.map(|w| w.changed());
        let mut terminal = ended || watch.is_some_and(|w| w.ended());
        if read_ledger && !terminal {
            let summary = (shared.engine.ledger())
                .read(move |l| l.task_summary(task_id))
                .await
                .map_err(unavailable)?;
            terminal = summary.as_ref().is_some_and(|s| s.phase.is_terminal());
        }
        let now = tokio::time::Instant::now();
        if terminal || now >= waiting.deadline {
            if waiting.asked {
                let ended = if terminal { "ended" } else { "timeout" };
                metrics::counter!(FRONT_WAITS_TOTAL, "ended" => ended).increment(1);
            }
            // Ended while watched: its writer gave the result.
            if let Some(result) = watch.filter(|_| terminal).and_then(TaskWatch::result) {
                return Ok(Progress::ended(shared, result));
            }
            // Submitted, or known, before the wait: the ledger holds the task.
            return progress(shared, task_id)
                .await?
                .ok_or_else(|| unavailable(format!("task {task_id} is not in the ledger")));
        }
        read_ledger = !next_change(changed, waiting.deadline).await;
    }
}

/// Waits for the change `changed` announces (the watch's next), for at most [`RECHECK`] and
/// not past `until`; returns whether it came (never without a watch: then it only sleeps).
pub(super) async fn next_change(
    changed: Option<tokio::sync::futures::Notified<'_>>,
    until: tokio::time::Instant,
) -> bool {
    let pause = RECHECK.min(until.saturating_duration_since(tokio::time::Instant::now()));
    match changed {
        Some(changed) => tokio::time::timeout(pause, changed).await.is_ok(),
        None => {
            tokio::time::sleep(pause).await;
            false
        }
    }
}

/// What the ledger holds of the task; `None` when it holds nothing yet.
pub(super) async fn progress(
    shared: &Shared,
    task_id: TaskId,
) -> std::result::Result<Option<Progress>, Problem> {
    let events = shared.engine.events(task_id).await.map_err(unavailable)?;
    if events.is_empty() {
        return Ok(None);
    }
    let mut projection = Projection::default();
    let mut result = None;
    // Kafka mode's records carry no ledger's position (each instance's copy has its own):
    // the result is the one its owner published, whichever instance answers.
    let kafka_mode = shared.kafka.is_some();
    for mut event in events {
        if kafka_mode {
            event.lsn = 0;
        }
        if let Some(r) = projection.apply(&event) {
            result = Some(r);
        }
    }
    // A task whose history retention removed has the result it ended with.
    let result = result.or_else(|| projection.announced().cloned());
    let state = projection.state();
    Ok(Some(Progress {
        state: state.phase.name(),
        terminal: state.phase.is_terminal(),
        result: result.map(Arc::new),
        tenant: (state.request.as_ref()).map(|r| r.identity.tenant.clone()),
    }))
}
