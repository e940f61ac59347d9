//! `POST /tasks/{id}/retry` and `POST /tasks/retry`: retry failed tasks whose every attempt
//! was proven not sent, one or in bulk (selected as `GET /tasks` selects them, within the
//! caller's tenants), with the `retry` role. Each retry goes to the task's actor through [`Engine::resolve`], which records
//! `TaskRetried` (who, why) and sends the new version's first attempt; a task that cannot be
//! retried (not failed, or an attempt of it may have reached the remote) is refused with why.
//!
//! [`Engine::resolve`]: sendledger_actors::Engine::resolve

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use http::{HeaderMap, StatusCode, Uri};
use sendledger_core::{OperatorResolution, Phase, TaskId};
use sendledger_store::TaskQuery;
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinSet;

use super::auth::{check_visible, keep_visible};
use super::error::{ApiError, ApiResult};
use super::task_list::select;
use super::tasks::task_ref;
use super::{json_response, read_json, Shared};
use crate::operators::Role;

/// Tasks one bulk call retries unless `limit` says otherwise, and the most it may say.
pub const BULK_DEFAULT: usize = 1000;
pub const BULK_MAX: usize = 10_000;

/// Retries of one bulk call in flight at once (each is one durable append).
const CONCURRENT: usize = 32;

/// Refusals a bulk answer lists one by one (all are counted).
const REFUSALS_LISTED: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    #[serde(default)]
    by: String,
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    #[serde(default)]
    by: String,
    reason: String,
    target: Option<String>,
    failure: Option<String>,
    from: Option<String>,
    to: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

fn resolution(by: String, reason: String) -> Result<OperatorResolution, ApiError> {
    if reason.trim().is_empty() {
        return Err(ApiError::bad_request("bad body: `reason` must say why"));
    }
    Ok(OperatorResolution::Retry { by, reason })
}

pub async fn retry_one(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let actor = shared.gate.act(&headers, Role::Retry)?;
    let segment = uri
        .path()
        .strip_suffix("/retry")
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or_default();
    let task_id = task_ref(segment)?;
    let body: RetryBody = read_json(&shared, body).await?;
    check_visible(&shared, &actor.scope(), task_id).await?;
    let retry = resolution(actor.by(&body.by)?, body.reason)?;
    let reply = (shared.engine)
        .resolve_under(task_id, retry, actor.credential())
        .await?;
    tracing::info!(task_id = %task_id, phase = reply.phase.name(), "task retried");
    Ok(json_response(
        StatusCode::OK,
        &json!({ "task_id": task_id.to_string(), "state": reply.phase.name(), "recorded": reply.events }),
    ))
}

pub async fn retry_bulk(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let actor = shared.gate.act(&headers, Role::Retry)?;
    let body: BulkBody = read_json(&shared, body).await?;
    let limit = body.limit.unwrap_or(BULK_DEFAULT);
    if !(1..=BULK_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "bad body: `limit` is {limit}; use 1 to {BULK_MAX}"
        )));
    }
    let retry = resolution(actor.by(&body.by)?, body.reason)?;
    let mut query = TaskQuery {
        phases: vec![Phase::Failed],
        limit,
        ..TaskQuery::default()
    };
    for (name, value) in [
        ("target", body.target),
        ("failure", body.failure),
        ("from", body.from),
        ("to", body.to),
        ("after", body.after),
    ] {
        if let Some(value) = value {
            select(&mut query, name, &value)
                .map_err(|e| ApiError::bad_request(format!("bad body: {}", e.message)))?;
        }
    }
    let mut page = shared.engine.list_tasks(query).await?;
    keep_visible(&shared, &actor.scope(), &mut page).await?;
    let (mut retried, mut refused, mut listed) = (0u64, 0u64, Vec::new());
    let mut running = JoinSet::new();
    let mut tasks = page.tasks.iter().map(|(task, _)| *task);
    loop {
        while running.len() < CONCURRENT {
            let Some(task) = tasks.next() else { break };
            let (engine, retry) = (shared.engine.clone(), retry.clone());
            let credential = actor.credential();
            running.spawn(async move {
                let reply = engine.resolve_under(task, retry, credential).await;
                (task, reply)
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (task, outcome): (TaskId, _) =
            done.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        match outcome {
            Ok(_) => retried += 1,
            Err(e) => {
                refused += 1;
                if listed.len() < REFUSALS_LISTED {
                    let e = ApiError::from(e);
                    listed.push(json!({ "task_id": task.to_string(), "error": e.message }));
                }
            }
        }
    }
    tracing::info!(retried, refused, "failed tasks retried in bulk");
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "selected": page.tasks.len(),
            "retried": retried,
            "refused": refused,
            "refusals": listed,
            "next": page.next.as_ref().map(sendledger_store::Cursor::to_hex),
        }),
    ))
}
