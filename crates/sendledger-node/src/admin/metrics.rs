//! `GET /metrics`: Prometheus text of every `sendledger_*` metric of the process, plus gauges
//! computed from the ledger at scrape time; and the process's recorder that renders them.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use http::header;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sendledger_core::Phase;
use sendledger_store::{Ledger, TaskCounts};
use tokio::time::Instant;

use super::error::ApiResult;
use super::{Shared, LEDGER_GAUGES_TTL};
use crate::error::{Error, Result};

/// Installs the process-wide recorder of the `metrics` facade, exporting Prometheus text, and
/// returns the handle [`super::Admin::start`] renders. Call it once per process, before the
/// engine starts (metrics recorded earlier are lost). Histograms get explicit buckets so they
/// render as Prometheus histograms.
pub fn install_recorder() -> Result<PrometheusHandle> {
    // From an fsync (sub-millisecond) to a partition's take-over (seconds to a minute).
    const SECONDS: [f64; 16] = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5,
        10.0, 30.0, 60.0,
    ];
    const COUNTS: [f64; 12] = [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_appends".into()), &COUNTS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_events".into()), &COUNTS))
        .and_then(|b| b.install_recorder())
        .map_err(Error::Recorder)?;
    crate::metric_definitions::describe();
    Ok(handle)
}

pub async fn scrape(State(shared): State<Arc<Shared>>, headers: http::HeaderMap) -> ApiResult {
    if shared.gate.read(&headers)? != crate::operators::Scope::All {
        return Err(super::ApiError::new(
            http::StatusCode::FORBIDDEN,
            "the metrics cover every tenant: they need an operator of every tenant",
        ));
    }
    if let Some(usage) = shared.engine.ledger().memory_usage() {
        for (kind, bytes) in [
            ("budget", usage.budget),
            ("cached", usage.cached),
            ("write_buffers", usage.write_buffers),
        ] {
            metrics::gauge!(crate::metric_definitions::LEDGER_MEMORY_BYTES, "kind" => kind)
                .set(bytes as f64);
        }
    }
    if let Some(ownership) = shared.engine.ownership() {
        metrics::gauge!(crate::metric_definitions::PARTITIONS_OWNED)
            .set(ownership.partitions().len() as f64);
    }
    let stale = shared
        .gauges_at
        .lock()
        .map(|at| at.is_none_or(|at| at.elapsed() >= LEDGER_GAUGES_TTL))
        .unwrap_or(true);
    if stale {
        let counts = shared.engine.ledger().read(Ledger::task_counts).await?;
        publish_counts(&counts);
        if let Ok(mut at) = shared.gauges_at.lock() {
            *at = Some(Instant::now());
        }
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(),
    )
        .into_response())
}

/// Sets the gauges `GET /metrics` reports from the ledger itself.
fn publish_counts(counts: &TaskCounts) {
    use crate::metric_definitions::{TASKS, UNKNOWNS_OPEN, UNKNOWN_OLDEST_AGE_SECONDS};
    // Every phase, zeros included.
    for phase in Phase::ALL {
        let n = counts.by_phase.get(&phase).copied().unwrap_or(0);
        metrics::gauge!(TASKS, "state" => phase.name()).set(n as f64);
    }
    metrics::gauge!(UNKNOWNS_OPEN).set(counts.unknowns_open as f64);
    let age_ms = counts
        .oldest_unknown_since
        .map_or(0, |since| sendledger_actors::now_ms().saturating_sub(since));
    metrics::gauge!(UNKNOWN_OLDEST_AGE_SECONDS).set(age_ms as f64 / 1000.0);
}
