//! A task as operators read it, shared by `inspect`, `review` and the admin endpoint: task
//! references, times, and the JSON shapes of a task's timeline and of a task in review.

use std::time::{Duration, UNIX_EPOCH};

use sendledger_actors::ReviewItem;
use sendledger_core::{Event, Identity, State, TaskId};
use serde_json::{json, Value};

/// A task id (32 hex digits) or an identity's address `tenant/operation/request_key` (a `/`
/// inside a part written `%2F`, a `%` as `%25`).
pub fn parse_task(task: &str) -> anyhow::Result<TaskId> {
    if let Ok(id) = task.parse::<TaskId>() {
        return Ok(id);
    }
    let identity: Identity = task
        .parse()
        .map_err(|e| anyhow::anyhow!("{e}; nor is it a task id (32 hex digits)"))?;
    Ok(identity.task_id())
}

/// RFC 3339 with milliseconds, UTC.
pub fn time(at_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string()
}

/// A task's state and the events of its timeline to show (`inspect --json`: all of them;
/// `GET /tasks/{id}`: one page).
pub fn task_json(task: TaskId, state: &State, events: &[Event]) -> Value {
    let timeline: Vec<_> = events
        .iter()
        .map(|e| json!({ "lsn": e.lsn, "seq": e.task_seq, "at": time(e.at), "event": e.body.name(), "detail": e.body.summary(e.at) }))
        .collect();
    json!({ "task_id": task.to_string(), "state": state.phase.name(), "attempts": state.attempts, "remote_id": state.remote_id, "events": timeline })
}

/// A task in manual review with its reason and the evidence so far (`review list --json`,
/// `GET /reviews`).
pub fn review_json(item: &ReviewItem) -> Value {
    let s = &item.state;
    json!({
        "task_id": item.task_id.to_string(),
        "identity": s.request.as_ref().map(|r| &r.identity),
        "target": s.request.as_ref().map(|r| &r.target),
        "reason": s.review_reason.as_ref().map(|r| r.to_string()),
        "review_reason": s.review_reason,
        "evidence": {
            "attempts": s.attempts,
            "lookups": s.lookups,
            "last_matches": s.last_matches,
            "unknown_since": s.unknown_since.map(time),
            "idempotency_key": s.idempotency_key,
        },
        "since": time(s.last_at),
    })
}
