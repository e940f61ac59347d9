//! The long-running commands: `run` (the service) and `sim-remote` (the simulated remote).
//! Both stop gracefully on SIGINT or SIGTERM.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sendledger_bus::Kafka;
use sendledger_sim::{Sim, SimConfig, SimTlsConfig};

use crate::config::Config;
use crate::service::Service;
use crate::wiring::HttpRemote;

#[derive(Args)]
pub struct RunArgs {
    /// Configuration file (TOML; commented example: schemas/sendledger.example.toml).
    /// `SENDLEDGER__SECTION__KEY` environment variables override it.
    #[arg(long, short)]
    config: PathBuf,
}

#[derive(Args)]
pub struct SimRemoteArgs {
    /// Configuration file (TOML; commented example: schemas/sim-remote.example.toml). Without
    /// it: a well-behaved remote with no faults.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Listen address, overriding the file (e.g. 127.0.0.1:8600).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Seed of the injected faults, overriding the file.
    #[arg(long)]
    seed: Option<u64>,
    /// Serve https with this certificate (PEM, followed by its chain), overriding the file's
    /// `[tls]`; needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA in this PEM file (mutual TLS); needs
    /// --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

/// The runtime a service runs on: `run` and `sim-remote`'s, and the demo's and `bench kafka`'s,
/// which run the service in their own process (so the benchmark's service has the same
/// threads as `run`'s).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()?)
}

/// Threads for blocking work (ledger reads, broker calls), at most. Ledger reads are short
/// and bound by the CPU: more threads than this only queue for the cores, and each keeps a
/// stack and allocator pages of its own (with tokio's default, 512, a service taking 3,000
/// requests per second ran 147 of them).
const MAX_BLOCKING_THREADS: usize = 16;

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h`; the Rust bindings have no constant
/// for it): how many milliseconds freed memory is kept before it is returned to the OS.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A long-running service returns freed memory to the OS at once instead of 10 ms later
/// (mimalloc's default), so its resident memory follows what it holds: measured with 300,000
/// tasks through Kafka at 3,000 per second, a peak RSS of 209 MiB against 250 to 296 MiB,
/// at the same throughput.
fn return_freed_memory_at_once() {
    // SAFETY: sets one of mimalloc's runtime options, which it reads atomically.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0)
    };
}

/// Writes `line` on stdout for whoever waits for it. A server must not stop because nobody
/// reads its stdout (a closed pipe is EPIPE, since Rust ignores SIGPIPE; `println!` would
/// panic), so a failed write is logged and the server goes on.
fn print_line(line: &str) {
    if let Err(e) = writeln!(std::io::stdout(), "{line}") {
        tracing::warn!(error = %e, "cannot write to stdout; going on without it");
    }
}

/// Installs the SIGINT and SIGTERM handlers, and returns what resolves on the first of them
/// with its name. The handlers are in place when this returns, before "ready" is printed: a
/// signal sent right after it is never met by the default action (the process killed
/// without a clean stop).
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// The configuration `run` would use.
pub(crate) fn config_of(args: &RunArgs) -> anyhow::Result<Config> {
    Config::load(&args.config)
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
        let kafka = tokio::task::block_in_place(|| Kafka::connect(config.kafka_config()))
            .context("kafka")?;
        let remote = Arc::new(HttpRemote::new(config.load_targets()?));
        let metrics = match config.admin.enabled {
            true => Some(crate::admin::install_recorder()?),
            false => None,
        };
        let service = Service::start(&config, &kafka, remote, metrics).await?;
        let admin = service
            .admin_addr()
            .map_or_else(|| "off".to_string(), |a| format!("http://{a}"));
        tracing::info!(
            ledger = %config.storage.data.display(),
            brokers = %kafka.bootstrap_servers(),
            embedded = kafka.embedded().is_some(),
            targets = config.targets.len(),
            %admin,
            "sendledger running"
        );
        // One line on stdout for scripts and supervisors that wait for readiness.
        print_line(&format!(
            "ready ledger={} brokers={} admin={admin}",
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

/// `sendledger sim-remote`: serves until a signal, then prints its ground-truth stats as JSON.
pub fn sim_remote(args: SimRemoteArgs) -> anyhow::Result<bool> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str::<SimConfig>(&text).with_context(|| format!("{}", path.display()))?
        }
        None => SimConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    if let (Some(cert_file), Some(key_file)) = (args.tls_cert, args.tls_key) {
        config.tls = Some(SimTlsConfig {
            cert_file,
            key_file,
            client_ca_file: args.tls_client_ca,
        });
    }
    runtime()?.block_on(async {
        let signal = tokio::spawn(shutdown_signal()?);
        let sim = Sim::start(config).await?;
        print_line(&format!(
            "ready create=POST {} lookup=GET {}?FIELD=VALUE stats=GET {}",
            sim.create_url(),
            sim.lookup_url(),
            sim.stats_url()
        ));
        signal.await?;
        let stats = sim.stats();
        print_line(&serde_json::to_string(&stats)?);
        sim.shutdown().await;
        Ok(true)
    })
}
