//! `sendledger sim-remote`: the simulated third-party remote, until SIGINT or SIGTERM.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sendledger_node::runtime::{runtime, shutdown_signal};
use sendledger_sim::{Sim, SimConfig, SimTlsConfig};

use super::print_line;

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
