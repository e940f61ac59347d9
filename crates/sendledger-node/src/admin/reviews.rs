//! `GET /reviews`: the tasks in manual review (of the caller's tenants); `POST /reviews/{id}`:
//! resolve one, with the `resolve` role (`compensate` to order records undone). A resolution goes to the task's actor through [`Engine::resolve`], like every
//! other input of the task: the admin endpoint never writes the ledger itself.
//!
//! [`Engine::resolve`]: sendledger_actors::Engine::resolve

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use bytes::Bytes;
use http::{HeaderMap, StatusCode, Uri};
use sendledger_actors::ReviewItem;
use sendledger_core::ResolveBody;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::auth::check_visible;
use super::error::{ApiError, ApiResult};
use super::tasks::task_ref;
use super::{json_bytes_response, json_response, last_segment, read_json, Shared};
use crate::operators::Role;
use crate::timeline::review_json;

pub async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> ApiResult {
    let scope = shared.gate.read(&headers)?;
    let items = shared
        .reviews
        .get(|| async {
            let items = shared.engine.reviews().await?;
            let tenant = |item: &ReviewItem| {
                let request = item.state.request.as_ref();
                request.map(|r| r.identity.tenant.clone())
            };
            let list = items.iter().map(|i| (tenant(i), review_json(i)));
            Ok(Arc::new(list.collect()))
        })
        .await?;
    let visible = (items.iter())
        .filter(|(tenant, _)| scope.allows(tenant.as_deref()))
        .map(|(_, item)| item);
    let body = Value::Array(visible.cloned().collect());
    Ok(json_bytes_response(
        StatusCode::OK,
        Bytes::from(body.to_string()),
    ))
}

pub async fn resolve(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    shared.gate.act(&headers, Role::Read)?;
    let task_id = task_ref(last_segment(&uri))?;
    let mut body: ResolveBody = read_json(&shared, body).await?;
    let undoes = body.resolve_as.as_deref() == Some("compensated") || !body.undo.is_empty();
    let role = if undoes {
        Role::Compensate
    } else {
        Role::Resolve
    };
    let actor = shared.gate.act(&headers, role)?;
    check_visible(&shared, &actor.scope(), task_id).await?;
    body.by = actor.by(&body.by)?;
    let resolution = body
        .resolution()
        .map_err(|e| ApiError::bad_request(format!("bad body: {e}")))?;
    let reply = (shared.engine)
        .resolve_under(task_id, resolution, actor.credential())
        .await?;
    shared.reviews.clear().await;
    tracing::info!(task_id = %task_id, events = ?reply.events, phase = reply.phase.name(), "review resolved");
    Ok(json_response(
        StatusCode::OK,
        &json!({ "task_id": task_id.to_string(), "state": reply.phase.name(), "recorded": reply.events }),
    ))
}

/// The tasks in review as `GET /reviews` lists them, each with its tenant.
type Reviews = Arc<Vec<(Option<String>, Value)>>;

/// The `GET /reviews` list, reused for `ttl`. The lock is async and held while the list is
/// computed, so concurrent reads wait for one computation (each would fold every task in
/// review) instead of starting their own.
pub struct ReviewsCache {
    ttl: Duration,
    body: tokio::sync::Mutex<Option<(Instant, Reviews)>>,
}

impl ReviewsCache {
    pub fn new(ttl: Duration) -> ReviewsCache {
        ReviewsCache {
            ttl,
            body: tokio::sync::Mutex::new(None),
        }
    }

    /// The cached list, or the one `compute` makes when there is none younger than the TTL.
    async fn get<F, Fut>(&self, compute: F) -> Result<Reviews, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Reviews, ApiError>>,
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
                Ok(Arc::new(vec![(None, json!(n))]))
            })
        };
        let first = |r: Result<Reviews, ApiError>| r.ok().map(|r| r[0].1.clone());
        let bodies = tokio::join!(read(), read(), read(), read());
        let bodies = [bodies.0, bodies.1, bodies.2, bodies.3];
        assert!(bodies.into_iter().all(|b| first(b) == Some(json!(0))));
        cache.clear().await;
        assert_eq!(first(read().await), Some(json!(1)));
        assert_eq!(computed.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
