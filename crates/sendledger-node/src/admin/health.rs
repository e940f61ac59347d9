//! `GET /healthz`: whether the service works, and what an operator must act on when it does not.

use std::sync::Arc;

use axum::extract::State;
use http::StatusCode;
use sendledger_kafka::IngestStats;
use serde_json::json;

use super::error::ApiResult;
use super::{json_response, Shared};

pub async fn healthz(State(shared): State<Arc<Shared>>) -> ApiResult {
    let (live_tasks, waiting) = shared.engine.load().await?;
    let mut body = json!({ "ok": true, "last_lsn": shared.engine.ledger().last_lsn(), "live_tasks": live_tasks, "waiting": waiting, "durability": "sync", "token_configured": shared.gate.has_credentials(), "reads_need_credential": shared.gate.reads_need_credential() });
    let mut status = StatusCode::OK;
    if shared.engine.durability() == sendledger_store::Durability::Buffered {
        body["durability"] = json!("buffered");
        body["warning"] = json!("storage.durability is `buffered`: acknowledged events are not fsynced and can be lost on power loss or an OS crash; use `sync` in production");
    }
    if let Some(why) = shared.engine.ledger().stats().failing() {
        // Nothing is recorded, so nothing is accepted or sent: an operator must act.
        status = StatusCode::SERVICE_UNAVAILABLE;
        body["ok"] = json!(false);
        body["ledger_error"] = json!(format!("the ledger cannot write: {why}"));
    }
    // A remote that is down is not this service failing: its tasks wait (see each state).
    let targets: serde_json::Map<String, serde_json::Value> = shared
        .engine
        .target_health()
        .into_iter()
        .map(|t| {
            let detail =
                json!({ "breaker": t.state, "probing_in_ms": t.probing_in_ms, "opened": t.opened });
            (t.target, detail)
        })
        .collect();
    body["targets"] = serde_json::Value::Object(targets);
    let ingests = shared
        .ingest
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(ownership) = shared.engine.ownership() {
        body["mode"] = json!("kafka");
        body["owned_partitions"] = json!(ownership.partitions());
    }
    let mut lost = 0;
    for (i, (topic, stats)) in ingests.iter().enumerate() {
        lost += IngestStats::get(&stats.lost);
        // The requests topic's problems at the top, as always; a tenant's topic's under its name.
        let mut problems = serde_json::Map::new();
        let blocked = stats.blocked();
        if !blocked.is_empty() {
            // A partition nobody consumes: an operator must act (see each reason).
            problems.insert("blocked_partitions".into(), json!(blocked));
        }
        if let Some(why) = stats.unconsumed() {
            // Requests wait that no member consumes: the group did not form.
            problems.insert("unconsumed_partitions".into(), json!(why));
        }
        if let Some(why) = stats.shared_group() {
            // Nothing is consumed while another instance is in the group.
            problems.insert("shared_group".into(), json!(why));
        }
        if problems.is_empty() {
            continue;
        }
        status = StatusCode::SERVICE_UNAVAILABLE;
        body["ok"] = json!(false);
        match (i, body.as_object_mut()) {
            (0, Some(top)) => top.extend(problems),
            _ => body["tenant_topics"][topic] = serde_json::Value::Object(problems),
        }
    }
    if !ingests.is_empty() {
        body["requests_lost"] = json!(lost);
    }
    Ok(json_response(status, &body))
}
