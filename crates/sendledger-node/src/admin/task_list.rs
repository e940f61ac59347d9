//! `GET /tasks`: tasks by phase, target, failure kind and the time they entered their phase,
//! one page at a time, from the ledger's task index (never a scan of every task). An operator
//! of some tenants gets the page's tasks of theirs only.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use http::{HeaderMap, StatusCode};
use sendledger_core::{FailureKind, Phase};
use sendledger_store::{Cursor, TaskQuery};

use super::error::{ApiError, ApiResult};
use super::{json_response, Shared};
use crate::timeline::{parse_time, task_page_json};

/// Tasks per page unless `limit` says otherwise, and the most it may say.
pub const LIST_PAGE: usize = 100;
pub const LIST_PAGE_MAX: usize = 1000;

pub async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let scope = shared.gate.read(&headers)?;
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
    let mut page = shared.engine.list_tasks(q).await?;
    super::auth::keep_visible(&shared, &scope, &mut page).await?;
    Ok(json_response(StatusCode::OK, &task_page_json(&page)))
}

/// Applies one selector of a task query (`phase`, `target`, `failure`, `from`, `to`,
/// `after`), from a query string or a JSON body: an unknown name or a bad value is an error
/// that names it.
pub fn select(q: &mut TaskQuery, name: &str, value: &str) -> Result<(), ApiError> {
    match name {
        "phase" => {
            for phase in value.split(',') {
                q.phases.push(Phase::parse(phase).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`phase` {phase:?} is not a phase; use {}",
                        names(Phase::ALL.iter().map(|p| p.name()))
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

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// A time as milliseconds since the Unix epoch, or RFC 3339 (`2026-12-05T10:00:00Z`).
fn instant(name: &str, value: &str) -> Result<u64, ApiError> {
    parse_time(value).ok_or_else(|| {
        ApiError::bad_request(format!(
            "`{name}` is {value:?}; give RFC 3339 (2026-12-05T10:00:00Z) or milliseconds since the Unix epoch"
        ))
    })
}
