//! `sendledger run`: the service, until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sendledger_kafka::Kafka;
use sendledger_node::config::Config;
use sendledger_node::runtime::{return_freed_memory_at_once, runtime, shutdown_signal};
use sendledger_node::service::Service;
use sendledger_node::wiring::HttpRemote;

use super::print_line;

#[derive(Args)]
pub struct RunArgs {
    /// Configuration file (TOML; commented example: schemas/sendledger.example.toml).
    /// `SENDLEDGER__SECTION__KEY` environment variables override it.
    #[arg(long, short)]
    config: PathBuf,
}

/// The configuration `run` would use.
pub fn config_of(args: &RunArgs) -> anyhow::Result<Config> {
    Ok(Config::load(&args.config)?)
}

/// `sendledger run`: the service until a signal (exit 0 after a clean stop) or until the
/// consumer fails for good (an error).
pub fn run(args: RunArgs) -> anyhow::Result<bool> {
    return_freed_memory_at_once();
    let config = Config::load(&args.config)?;
    // Secrets show as `***` (see `Config`'s `Debug`).
    tracing::debug!(?config, "configuration");
    runtime()?.block_on(async {
        let signal = tokio::spawn(shutdown_signal()?);
        // The recorder first: what the targets and the cluster record as they are made (each
        // breaker's state, closed) is kept, not lost before there is a recorder.
        let metrics = match config.admin.enabled {
            true => Some(sendledger_node::admin::install_recorder()?),
            false => None,
        };
        let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka_config()))
            .context("kafka")?;
        let remote = Arc::new(HttpRemote::new(config.load_targets()?));
        let service = Service::start(&config, &kafka, remote, metrics).await?;
        let scheme = |tls: bool| if tls { "https" } else { "http" };
        let admin = service.admin_addr().map_or_else(
            || "off".to_string(),
            |a| format!("{}://{a}", scheme(config.admin.tls.is_some())),
        );
        let front = service.front_addr().map_or_else(
            || "off".to_string(),
            |a| format!("{}://{a}", scheme(config.front.tls.is_some())),
        );
        tracing::info!(
            ledger = %config.storage.data.display(),
            brokers = %kafka.bootstrap_servers(),
            embedded = kafka.embedded().is_some(),
            targets = config.targets.len(),
            %admin,
            %front,
            "sendledger running"
        );
        // One line on stdout for scripts and supervisors that wait for readiness.
        print_line(&format!(
            "ready ledger={} brokers={} admin={admin} front={front}",
            config.storage.data.display(),
            kafka.bootstrap_servers()
        ));
        let failure = tokio::select! {
            s = signal => {
                let s = s.context("signal handler")?;
                tracing::info!(signal = s, "stopping");
                None
            }
            () = async {
                while service.is_healthy() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            } => Some("the requests consumer or the publisher stopped after a ledger failure (see the error above); fix its cause and start again"),
        };
        service.shutdown().await?;
        match failure {
            Some(why) => anyhow::bail!(why),
            None => {
                tracing::info!("stopped cleanly");
                Ok(true)
            }
        }
    })
}
