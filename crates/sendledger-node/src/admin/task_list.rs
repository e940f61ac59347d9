//! `GET /tasks`: tasks by phase, target, failure kind and the time they entered their phase,
//! one page at a time, from the ledger's task index (never a scan of every task).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use http::StatusCode;
use sendledger_core::{FailureKind, Phase};
use sendledger_store::{Cursor, TaskPage, TaskQuery};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::{json_response, Shared};
use crate::timeline::time;

/// Tasks per page unless `limit` says otherwise, and the most it may say.
pub const LIST_PAGE: usize = 100;
pub const LIST_PAGE_MAX: usize = 1000;

pub async fn list(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> ApiResult {
    let mut q = TaskQuery {
        limit: LIST_PAGE,
        ..TaskQuery::default()
    };
    for pair in query.as_deref().unwrap_or_default().split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| ApiError::bad_request(format!("`{name}` is not UTF-8")))?;
        match name {
            "limit" => {
                q.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=LIST_PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "`limit` is {value:?}; use 1 to {LIST_PAGE_MAX}"
                        ))
                    })?
            }
            _ => select(&mut q, name, &value)?,
        }
    }
    let page = shared.engine.list_tasks(q).await?;
    Ok(json_response(StatusCode::OK, &page_json(&page)))
}

/// Applies one selector of a task query (`phase`, `target`, `failure`, `from`, `to`,
/// `after`), from a query string or a JSON body: an unknown name or a bad value is an error
/// that names it.
pub fn select(q: &mut TaskQuery, name: &str, value: &str) -> Result<(), ApiError> {
    match name {
        "phase" => {
            for phase in value.split(',') {
                q.phases.push(phase_named(phase).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`phase` {phase:?} is not a phase; use {}",
                        names(ALL_PHASES.iter().map(|p| p.name()))
                    ))
                })?);
            }
        }
        "target" => q.target = Some(value.to_string()),
        "failure" => {
            q.failure = Some(FailureKind::parse(value).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "`failure` {value:?} is not a failure kind; use {}",
                    names(FailureKind::ALL.iter().map(|k| k.name()))
                ))
            })?)
        }
        "from" => q.from = Some(instant(name, value)?),
        "to" => q.to = Some(instant(name, value)?),
        "after" => {
            q.after = Some(Cursor::from_hex(value).ok_or_else(|| {
                ApiError::bad_request("`after` is not a cursor; pass a page's `next` as it came")
            })?)
        }
        _ => {
            return Err(ApiError::bad_request(format!(
                "unknown selector `{name}`; use phase, target, failure, from, to, after and limit"
            )))
        }
    }
    Ok(())
}

const ALL_PHASES: [Phase; 8] = [
    Phase::Accepted,
    Phase::Sending,
    Phase::RetryWait,
    Phase::Unknown,
    Phase::ManualReview,
    Phase::Succeeded,
    Phase::Rejected,
    Phase::Failed,
];

fn phase_named(name: &str) -> Option<Phase> {
    ALL_PHASES.into_iter().find(|p| p.name() == name)
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// A time as milliseconds since the Unix epoch, or RFC 3339 (`2026-12-05T10:00:00Z`).
fn instant(name: &str, value: &str) -> Result<u64, ApiError> {
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(value)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "`{name}` is {value:?}; give RFC 3339 (2026-12-05T10:00:00Z) or milliseconds since the Unix epoch"
            ))
        })
}

/// A page as JSON: each task with its phase, target, since and failure kind; `next` to read on
/// (null on the last page).
pub fn page_json(page: &TaskPage) -> Value {
    let tasks: Vec<Value> = page
        .tasks
        .iter()
        .map(|(task, e)| {
            json!({
                "task_id": task.to_string(),
                "state": e.phase.name(),
                "target": e.target,
                "since": time(e.since),
                "failure": e.failure.map(FailureKind::name),
            })
        })
        .collect();
    json!({ "tasks": tasks, "next": page.next.as_ref().map(Cursor::to_hex) })
}
