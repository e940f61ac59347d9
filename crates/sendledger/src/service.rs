//! The service: engine, Kafka ingest and outbox publisher on one ledger, started and stopped
//! in the order that keeps every guarantee.
//!
//! Start: the engine first (it resumes unfinished tasks and reconciles interrupted attempts),
//! then the publisher, then the ingest. Stop: the ingest first (no new work; offsets of
//! finished messages committed), then the engine (live tasks finish their current step), then
//! the publisher once it has published everything the ledger holds, or the grace has passed;
//! the admin endpoint last, so the drain can be watched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use sendledger_actors::{Engine, Remote};
use sendledger_bus::{Ingest, Kafka, Publisher};

use crate::admin::Admin;
use crate::config::Config;
use crate::wiring::EngineSink;

/// How long topic creation on external brokers may take.
const TOPIC_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Service {
    engine: Engine,
    ingest: Ingest,
    publisher: Publisher,
    admin: Option<Admin>,
    grace: Duration,
}

impl Service {
    /// Starts everything on `kafka` (which outlives the service: the demo restarts the service
    /// on the same embedded cluster). Missing topics are created on external brokers. Must be
    /// called within a multi-threaded tokio runtime. With `admin.enabled`, the admin endpoint
    /// serves `metrics` (the handle of [`crate::admin::install_recorder`]).
    pub async fn start(
        config: &Config,
        kafka: &Kafka,
        remote: Arc<dyn Remote>,
        metrics: Option<PrometheusHandle>,
    ) -> anyhow::Result<Service> {
        let metrics = match (config.admin.enabled, metrics) {
            (true, Some(m)) => Some(m),
            (true, None) => {
                anyhow::bail!("the admin endpoint needs the metrics recorder; install it first")
            }
            (false, _) => None,
        };
        kafka
            .ensure_topics(config.kafka.replication_factor, TOPIC_TIMEOUT, false)
            .await
            .context("creating the topics")?;
        let engine_config = config.engine_config();
        let engine = tokio::task::block_in_place(|| Engine::start(engine_config, remote))
            .with_context(|| format!("starting the engine on {}", config.storage.data.display()))?;
        let publisher =
            Publisher::start(kafka, engine.ledger().clone()).context("starting the publisher")?;
        let admin = match metrics {
            Some(metrics) => Some(Admin::start(&config.admin, engine.clone(), metrics).await?),
            None => None,
        };
        let ingest = Ingest::start(kafka, Arc::new(EngineSink::new(engine.clone())))
            .context("starting the ingest")?;
        if let Some(admin) = &admin {
            admin.watch_ingest(ingest.stats().clone());
        }
        Ok(Service {
            engine,
            ingest,
            publisher,
            admin,
            grace: config.engine.shutdown_grace,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Where the admin endpoint listens, when it is enabled.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(Admin::local_addr)
    }

    /// False once the consumer or the publisher stopped by itself (the ledger failed for
    /// good).
    pub fn is_healthy(&self) -> bool {
        self.ingest.is_running() && self.publisher.is_running()
    }

    /// Stops in order within the configured grace. Whatever is cut off is safe: unfinished
    /// messages are delivered again, interrupted attempts are reconciled at the next start,
    /// unpublished events are published then.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.grace;
        let left = || deadline.saturating_duration_since(Instant::now());
        let ingest = self.ingest.shutdown(left()).await;
        let ledger = self.engine.ledger().clone();
        self.engine.shutdown(left()).await;
        if !self.publisher.wait_for(ledger.last_lsn(), left()).await {
            tracing::warn!(
                cursor = self.publisher.cursor(),
                last_lsn = ledger.last_lsn(),
                "not every event was published before the grace ran out; the rest is published at the next start"
            );
        }
        let publisher = self
            .publisher
            .shutdown(left().max(Duration::from_secs(1)))
            .await;
        if let Some(admin) = self.admin {
            admin.shutdown().await;
        }
        ingest.context("stopping the ingest")?;
        publisher.context("stopping the publisher")?;
        Ok(())
    }
}
