//! `GET /reviews`: the tasks in manual review; `POST /reviews/{id}`: resolve one, with the
//! admin token. A resolution goes to the task's actor through [`Engine::resolve`], like every
//! other input of the task: the admin endpoint never writes the ledger itself.
//!
//! [`Engine::resolve`]: sendledger_actors::Engine::resolve

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use bytes::Bytes;
use http::{header, HeaderMap, StatusCode, Uri};
use sendledger_core::ResolveBody;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::error::{ApiError, ApiResult};
use super::tasks::task_ref;
use super::{json_bytes_response, json_response, last_segment, read_json, Shared};
use crate::timeline::review_json;

pub async fn list(State(shared): State<Arc<Shared>>) -> ApiResult {
    let body = shared
        .reviews
        .get(|| async {
            let items = shared.engine.reviews().await?;
            let list: Vec<Value> = items.iter().map(review_json).collect();
            Ok(Bytes::from(Value::Array(list).to_string()))
        })
        .await?;
    Ok(json_bytes_response(StatusCode::OK, body))
}

pub async fn resolve(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    authorize(shared.token.as_deref(), &headers)?;
    let task_id = task_ref(last_segment(&uri))?;
    let body: ResolveBody = read_json(&shared, body).await?;
    let resolution = body
        .resolution()
        .map_err(|e| ApiError::bad_request(format!("bad body: {e}")))?;
    let reply = shared.engine.resolve(task_id, resolution).await?;
    shared.reviews.clear().await;
    tracing::info!(task_id = %task_id, events = ?reply.events, phase = reply.phase.name(), "review resolved");
    Ok(json_response(
        StatusCode::OK,
        &json!({ "task_id": task_id.to_string(), "state": reply.phase.name(), "recorded": reply.events }),
    ))
}

/// The `GET /reviews` body, reused for `ttl`. The lock is async and held while the list is
/// computed, so concurrent reads wait for one computation (each would fold every task in
/// review) instead of starting their own.
pub struct ReviewsCache {
    ttl: Duration,
    body: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
}

impl ReviewsCache {
    pub fn new(ttl: Duration) -> ReviewsCache {
        ReviewsCache {
            ttl,
            body: tokio::sync::Mutex::new(None),
        }
    }

    /// The cached body, or the one `compute` makes when there is none younger than the TTL.
    async fn get<F, Fut>(&self, compute: F) -> Result<Bytes, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Bytes, ApiError>>,
    {
        let mut body = self.body.lock().await;
        if let Some((at, bytes)) = &*body {
            if at.elapsed() < self.ttl {
                return Ok(bytes.clone());
            }
        }
        let bytes = compute().await?;
        *body = Some((Instant::now(), bytes.clone()));
        Ok(bytes)
    }

    /// Drops the cached body: the next read computes the list again.
    async fn clear(&self) {
        *self.body.lock().await = None;
    }
}

/// Admits a mutating call that carries the configured token; refuses every one when none is
/// configured.
pub(super) fn authorize(token: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "mutating calls are disabled: set `admin.token` in the configuration and send it as `Authorization: Bearer <token>`",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "wrong admin token; send the configured `admin.token` as `Authorization: Bearer <token>`",
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <token>` (the configured `admin.token`)",
        )),
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 7235).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Concurrent reads of the review list compute it once; a resolution's `clear` makes the
    /// next read compute it again.
    #[tokio::test]
    async fn the_review_list_is_computed_once_for_concurrent_reads() {
        let cache = ReviewsCache::new(Duration::from_secs(3600));
        let computed = std::sync::atomic::AtomicU32::new(0);
        let read = || {
            cache.get(|| async {
                let n = computed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
                Ok(Bytes::from(n.to_string()))
            })
        };
        let bodies = tokio::join!(read(), read(), read(), read());
        let bodies = [bodies.0, bodies.1, bodies.2, bodies.3];
        assert!(bodies
            .iter()
            .all(|b| b.as_ref().ok() == Some(&Bytes::from("0"))));
        cache.clear().await;
        assert_eq!(read().await.ok(), Some(Bytes::from("1")));
        assert_eq!(computed.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in [
            "Bearer tok en",
            "bearer tok en",
            "BEARER  tok en",
            " bEaReR tok en",
        ] {
            assert_eq!(bearer_token(value), Some("tok en"), "{value}");
        }
        for value in ["Basic tok", "Bearertok", "tok", ""] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}
