//! `GET /tasks/{id}`: a task's state and one page of its timeline.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use http::{HeaderMap, StatusCode, Uri};
use sendledger_core::{fold, TaskId};
use serde_json::{json, Value};

use super::error::{ApiError, ApiResult};
use super::{json_response, last_segment, Shared, TIMELINE_PAGE, TIMELINE_PAGE_MAX};
use crate::timeline::{parse_task, remote_ids_seen, task_json};

/// A task named in a path segment (as it came, percent-encoded): a task id, or
/// `tenant/operation/request_key` URL-encoded.
pub fn task_ref(segment: &str) -> Result<TaskId, ApiError> {
    let decoded = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("task reference is not UTF-8"))?;
    parse_task(&decoded).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The page of a timeline a query asks for: `after` (a sequence number) and `limit`.
fn timeline_page(query: Option<&str>) -> Result<(Option<u32>, usize), ApiError> {
    let (mut after, mut limit) = (None, TIMELINE_PAGE);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "after" => {
                after = Some(value.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "`after` is {value:?}; use the sequence number of an event (`next_after`)"
                    ))
                })?)
            }
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=TIMELINE_PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "`limit` is {value:?}; use 1 to {TIMELINE_PAGE_MAX}"
                        ))
                    })?
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter `{name}`; use `after` and `limit`"
                )))
            }
        }
    }
    Ok((after, limit))
}

pub async fn task(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let scope = shared.gate.read(&headers)?;
    let task_id = task_ref(last_segment(&uri))?;
    let (after, limit) = timeline_page(query.as_deref())?;
    let events = shared.engine.events(task_id).await?;
    let ownership = shared.engine.ownership();
    if events.is_empty() {
        let message = match ownership {
            None => format!("task {task_id} is not in the ledger"),
            Some(o) => format!(
                "task {task_id} is not in this instance's ledger; in kafka mode a task is known to the instance that owns its requests partition (owned here: {:?})",
                o.partitions()
            ),
        };
        return Err(ApiError::new(StatusCode::NOT_FOUND, message));
    }
    let start = after.map_or(0, |after| events.partition_point(|e| e.task_seq <= after));
    let page = &events[start..events.len().min(start + limit)];
    let more = start + page.len() < events.len();
    let state = fold(&events);
    if !scope.allows(state.request.as_ref().map(|r| r.identity.tenant.as_str())) {
        return Err(super::auth::not_visible(task_id));
    }
    let mut body = task_json(task_id, &state, page);
    if let (Some(o), Some(source)) = (ownership, &state.source) {
        // Kafka mode: a copy left from an earlier ownership may be behind its owner's.
        let owned = o.epoch(source.partition).is_some();
        body["partition"] = json!(source.partition);
        body["owned_here"] = json!(owned);
        if !owned {
            body["warning"] = json!(format!(
                "requests partition {} is owned by another instance: this copy is from when it was owned here and may be behind; ask the owner",
                source.partition
            ));
        }
    }
    body["remote_ids_seen"] = remote_ids_seen(&events);
    let steps = (state.saga.as_ref())
        .map(sendledger_core::saga::Saga::step_records)
        .unwrap_or_default();
    body["lookup_url"] = match state
        .request
        .as_ref()
        .zip(state.target())
        .and_then(|(r, target)| {
            let call = sendledger_core::saga::Call {
                request: r,
                steps: &steps,
            };
            shared.engine.lookup_url(target, call)
        }) {
        Some(Ok(url)) => json!(url),
        Some(Err(why)) => json!(format!("cannot be built: {why}")),
        None => Value::Null,
    };
    body["more"] = json!(more);
    body["next_after"] = json!(page.last().filter(|_| more).map(|e| e.task_seq));
    Ok(json_response(StatusCode::OK, &body))
}
