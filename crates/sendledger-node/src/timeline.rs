//! A task as operators read it, shared by `inspect`, `review` and the admin endpoint: task
//! references, times, and the JSON shapes of a task's timeline and of a task in review.

use std::time::{Duration, UNIX_EPOCH};

use sendledger_actors::ReviewItem;
use sendledger_core::{Event, EventBody, Identity, State, TaskId};
use serde_json::{json, Value};

/// A task id (32 hex digits) or an identity's address `tenant/operation/request_key` (a `/`
/// inside a part written `%2F`, a `%` as `%25`).
pub fn parse_task(task: &str) -> crate::error::Result<TaskId> {
    if let Ok(id) = task.parse::<TaskId>() {
        return Ok(id);
    }
    let identity: Identity = task.parse().map_err(crate::error::Error::TaskReference)?;
    Ok(identity.task_id())
}

/// A time as people give it: milliseconds since the Unix epoch, or RFC 3339
/// (`2026-12-05T10:00:00Z`).
pub fn parse_time(value: &str) -> Option<u64> {
    if let Ok(ms) = value.parse::<u64>() {
        return Some(ms);
    }
    let t = humantime::parse_rfc3339_weak(value).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// A page of the task index as JSON (`GET /tasks`, `tasks list --json`): each task with its
/// phase, target, since and failure kind; `next` to read on (null on the last page).
pub fn task_page_json(page: &sendledger_store::TaskPage) -> Value {
    let tasks: Vec<Value> = page
        .tasks
        .iter()
        .map(|(task, e)| {
            json!({
                "task_id": task.to_string(),
                "state": e.phase.name(),
                "target": e.target,
                "since": time(e.since),
                "failure": e.failure.map(sendledger_core::FailureKind::name),
            })
        })
        .collect();
    json!({ "tasks": tasks, "next": page.next.as_ref().map(sendledger_store::Cursor::to_hex) })
}

/// RFC 3339 with milliseconds, UTC.
pub fn time(at_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string()
}

/// A task's state, its request (identity, target, payload, metadata: what was accepted; the
/// target's headers and secrets live in the configuration and are not part of it), and the
/// events of its timeline to show (`inspect --json`: all of them; `GET /tasks/{id}`: one
/// page). Each event has its one-line `detail`, the `attempt` it is about (send events), and
/// `data`: its recorded fields (the evidence of a confirmation, a lookup's matches, ...).
pub fn task_json(task: TaskId, state: &State, events: &[Event]) -> Value {
    let timeline: Vec<_> = events
        .iter()
        .map(|e| json!({ "lsn": e.lsn, "seq": e.task_seq, "at": time(e.at), "event": e.body.name(), "detail": e.body.summary(e.at), "attempt": attempt_of(&e.body), "data": fields_of(&e.body) }))
        .collect();
    // Why the task waits before its next intent, as its `SendDeferred` recorded it.
    let waiting = state.waiting.as_ref().map(|w| json!({ "since": time(w.since), "until": time(w.until), "reason": w.reason.to_string() }));
    // A multi-step task's steps (null for a one-step task) and the call its attempts go to.
    let steps = state
        .saga
        .as_ref()
        .map(|s| json!({ "leg": s.leg, "steps": s.steps }));
    json!({ "task_id": task.to_string(), "state": state.phase.name(), "version": state.version, "attempts": state.attempts, "target": state.target(), "remote_id": state.remote_id, "failure": state.failure_kind.map(sendledger_core::FailureKind::name), "waiting": waiting, "request": state.request, "saga": steps, "events": timeline })
}

/// The attempt a send event is about; none for other events.
fn attempt_of(body: &EventBody) -> Option<u32> {
    match body {
        EventBody::SendIntended { attempt, .. }
        | EventBody::SendIntendedAt { attempt, .. }
        | EventBody::SendNotSent { attempt, .. }
        | EventBody::SendUnknown { attempt, .. } => Some(*attempt),
        _ => None,
    }
}

/// An event's fields as JSON, without the variant's name (that is `event`).
fn fields_of(body: &EventBody) -> Value {
    match serde_json::to_value(body) {
        Ok(Value::Object(variant)) => variant.into_iter().next().map_or(Value::Null, |(_, v)| v),
        _ => Value::Null,
    }
}

/// Every remote id a task's events name (a confirmation, a lookup's matches), each once in
/// order of first sight, with where it was seen: `[{"remote_id", "seen": ["Confirmed #3 at
/// ...", "LookupPerformed #5 at ..."]}]`. An operator resolving a review picks among these.
pub fn remote_ids_seen(events: &[Event]) -> Value {
    let mut seen: Vec<(String, Vec<String>)> = Vec::new();
    for e in events {
        let ids: &[String] = match &e.body {
            EventBody::Confirmed { remote_id, .. } => std::slice::from_ref(remote_id),
            EventBody::LookupPerformed { matches, .. } => matches,
            _ => &[],
        };
        for id in ids {
            let place = format!("{} #{} at {}", e.body.name(), e.task_seq, time(e.at));
            match seen.iter_mut().find(|(known, _)| known == id) {
                Some((_, places)) => places.push(place),
                None => seen.push((id.clone(), vec![place])),
            }
        }
    }
    Value::Array(
        seen.into_iter()
            .map(|(id, places)| json!({ "remote_id": id, "seen": places }))
            .collect(),
    )
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
