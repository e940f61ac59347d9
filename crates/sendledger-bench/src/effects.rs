//! `sendledger-bench effects`: attempts per second through the effects layer against the
//! simulated remote on loopback, and the simulated remote's own capacity under a bare HTTP
//! load, so end-to-end numbers can be judged against what the remote can take. With `--tls`,
//! the same attempts also run over https (a second simulated remote with a certificate made
//! for the run), and the report compares the two.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sendledger_core::{AcceptedRequest, Limits};
use sendledger_effects::{AttemptOutcome, Target, TargetConfig};
use sendledger_sim::{Sim, SimConfig, SimTlsConfig};

#[derive(Args)]
pub struct EffectsArgs {
    /// Attempts (and bare requests) in flight at once.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Length of each measured run, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Worker threads of the simulated remote.
    #[arg(long, default_value_t = 1)]
    sim_threads: usize,
    /// Worker threads of the client (effects layer or bare load).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Open a new connection per attempt instead of reusing idle ones.
    #[arg(long)]
    fresh_connections: bool,
    /// Also run the attempts over https (TLS with a certificate made for the run, from a CA the
    /// target trusts) and report https against http.
    #[arg(long)]
    tls: bool,
    /// With `--tls`: the measured time of each scheme is cut into this many runs, alternating
    /// http and https (http first, then https twice, ...), so a change in the machine's load
    /// falls on both alike.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
}

fn bench_request(n: u64) -> anyhow::Result<AcceptedRequest> {
    crate::ledger::bench_request(n, "payments")
        .accept(&Limits::default())
        .context("bench request")
}

#[derive(Default)]
struct AttemptRun {
    attempts: u64,
    per_sec: f64,
    /// Seconds measured.
    elapsed: f64,
    latencies_us: Vec<u64>,
    outcomes: [u64; 4],
}

/// Attempts by `in_flight` workers for `seconds`; the requests are numbered from `first` up
/// (worker `w`'s `n`th is `first + (w << 32 | n)`), so runs against the same remote given
/// different `first`s never share an identity.
async fn attempts(
    target: Arc<Target>,
    in_flight: usize,
    seconds: f64,
    first: u64,
) -> anyhow::Result<AttemptRun> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers = Vec::new();
    for w in 0..in_flight as u64 {
        let target = target.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut outcomes = [0u64; 4];
            let mut n = 0u64;
            while Instant::now() < deadline {
                let request = bench_request(first + (w << 32 | n))?;
                let t = Instant::now();
                let outcome = target.execute(&request, 1, None).await;
                latencies.push(t.elapsed().as_micros() as u64);
                outcomes[match outcome {
                    AttemptOutcome::Succeeded { .. } => 0,
                    AttemptOutcome::NotSent { .. } => 1,
                    AttemptOutcome::Rejected { .. } => 2,
                    AttemptOutcome::Unknown { .. } => 3,
                }] += 1;
                n += 1;
            }
            anyhow::Ok((latencies, outcomes))
        }));
    }
    let mut run = AttemptRun::default();
    for w in workers {
        let (latencies, outcomes) = w.await??;
        run.latencies_us.extend(latencies);
        for (total, n) in run.outcomes.iter_mut().zip(outcomes) {
            *total += n;
        }
    }
    run.attempts = run.latencies_us.len() as u64;
    run.elapsed = started.elapsed().as_secs_f64();
    run.per_sec = run.attempts as f64 / run.elapsed;
    run.latencies_us.sort_unstable();
    Ok(run)
}

/// Bare HTTP/1.1 creates over `in_flight` keep-alive connections: no classification, no
/// templates, the least a client can do. Returns (requests, requests per second).
async fn bare_load(
    sim_addr: std::net::SocketAddr,
    path: String,
    in_flight: usize,
    seconds: f64,
) -> anyhow::Result<(u64, f64)> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers = Vec::new();
    for w in 0..in_flight as u64 {
        let path = path.clone();
        workers.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(sim_addr).await?;
            stream.set_nodelay(true)?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let body =
                    format!(r#"{{"amount":1250,"currency":"EUR","request_key":"raw-{w}-{n}"}}"#);
                let request = http::Request::post(path.as_str())
                    .header(http::header::HOST, "sim")
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(body)))?;
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                anyhow::ensure!(
                    response.status().is_success(),
                    "bare create answered {}",
                    response.status()
                );
                response.into_body().collect().await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for w in workers {
        total += w.await??;
    }
    Ok((total, total as f64 / started.elapsed().as_secs_f64()))
}

impl AttemptRun {
    /// Adds another run of the same scheme: its attempts, time, latencies and outcomes.
    fn merge(&mut self, other: AttemptRun) {
        self.attempts += other.attempts;
        self.elapsed += other.elapsed;
        self.per_sec = self.attempts as f64 / self.elapsed.max(f64::MIN_POSITIVE);
        self.latencies_us.extend(other.latencies_us);
        self.latencies_us.sort_unstable();
        for (total, n) in self.outcomes.iter_mut().zip(other.outcomes) {
            *total += n;
        }
    }

    /// The run's figures in the report: attempts, their rate, latency and outcomes.
    fn report(&self) -> serde_json::Value {
        let pct = |p: f64| {
            let v = &self.latencies_us;
            if v.is_empty() {
                0.0
            } else {
                round(v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0)
            }
        };
        serde_json::json!({
            "attempts": self.attempts,
            "attempts_per_sec": round(self.per_sec),
            "attempt_latency_ms": { "p50": pct(0.50), "p99": pct(0.99), "max": pct(1.0) },
            "outcomes": { "succeeded": self.outcomes[0], "not_sent": self.outcomes[1], "rejected": self.outcomes[2], "unknown": self.outcomes[3] },
        })
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A CA and a certificate it signs for `127.0.0.1` and `localhost`, written as PEM files into
/// `dir`: the https remote's certificate and key, and the CA file the target trusts.
struct RunCertificate {
    ca_file: std::path::PathBuf,
    cert_file: std::path::PathBuf,
    key_file: std::path::PathBuf,
}

fn make_certificate(dir: &std::path::Path) -> anyhow::Result<RunCertificate> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sendledger bench CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "sendledger bench remote");
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let files = RunCertificate {
        ca_file: dir.join("ca.pem"),
        cert_file: dir.join("remote.pem"),
        key_file: dir.join("remote-key.pem"),
    };
    std::fs::write(&files.ca_file, ca.pem())?;
    std::fs::write(&files.cert_file, cert.pem())?;
    std::fs::write(&files.key_file, key.serialize_pem())?;
    Ok(files)
}

pub fn run(args: EffectsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.in_flight > 0, "--in-flight must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(
        args.sim_threads > 0 && args.client_threads > 0,
        "--sim-threads and --client-threads must be at least 1"
    );
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let sim_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.sim_threads)
        .thread_name("sim")
        .enable_all()
        .build()?;
    let sim = sim_runtime
        .block_on(Sim::start(SimConfig {
            identity_field: "reference".into(),
            ..SimConfig::default()
        }))
        .context("starting the simulated remote")?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads)
        .thread_name("client")
        .enable_all()
        .build()?;
    let pool_idle = if args.fresh_connections { "0s" } else { "5s" };
    let target_config = |url: &str, tls: &str| -> anyhow::Result<TargetConfig> {
        Ok(toml::from_str(&format!(
            "url = \"{url}\"\nrequest_timeout = \"10s\"\npool_idle_timeout = \"{pool_idle}\"\nbody_fields = {{ reference = \"{{task_id}}\" }}\n{tls}",
        ))?)
    };
    let target = Arc::new(Target::from_config(
        "payments",
        &target_config(&sim.create_url(), "")?,
    )?);

    // With --tls, the same attempts over https, against a remote of their own.
    let https = if args.tls {
        let dir = tempfile::tempdir().context("a directory for the run's certificate")?;
        let files = make_certificate(dir.path()).context("making the run's certificate")?;
        let sim = sim_runtime
            .block_on(Sim::start(SimConfig {
                identity_field: "reference".into(),
                tls: Some(SimTlsConfig {
                    cert_file: files.cert_file,
                    key_file: files.key_file,
                    client_ca_file: None,
                }),
                ..SimConfig::default()
            }))
            .context("starting the simulated remote over https")?;
        let config = target_config(
            &sim.create_url(),
            &format!("tls = {{ ca_file = {:?} }}", files.ca_file),
        )?;
        let target = Arc::new(Target::from_config("payments", &config)?);
        Some((target, sim))
    } else {
        None
    };

    let before = sim.stats();
    let mut run = AttemptRun::default();
    let mut https_run = AttemptRun::default();
    match &https {
        None => run = client.block_on(attempts(target, args.in_flight, args.seconds, 0))?,
        Some((https_target, _)) => {
            let seconds = args.seconds / f64::from(args.rounds);
            for round in 0..u64::from(args.rounds) {
                // http, https; https, http; ...: the same share of early and late runs each.
                let order = if round % 2 == 0 {
                    [false, true]
                } else {
                    [true, false]
                };
                for tls in order {
                    let (into, target) = if tls {
                        (&mut https_run, https_target)
                    } else {
                        (&mut run, &target)
                    };
                    let first = round << 48;
                    into.merge(client.block_on(attempts(
                        target.clone(),
                        args.in_flight,
                        seconds,
                        first,
                    ))?);
                }
            }
        }
    }
    let sim_posts_per_sec = (sim.stats().posts - before.posts) as f64 / run.elapsed;
    let (bare, bare_per_sec) = client.block_on(bare_load(
        sim.addr(),
        sim.config().create_path.clone(),
        args.in_flight,
        args.seconds,
    ))?;
    let stats = sim.stats();

    let mut report = serde_json::json!({
        "bench": "effects",
        "in_flight": args.in_flight,
        "seconds_per_run": args.seconds,
        "sim_threads": args.sim_threads,
        "client_threads": args.client_threads,
        "connections": if args.fresh_connections { "fresh" } else { "pooled" },
    });
    let fields = report
        .as_object_mut()
        .context("the report is a JSON object")?;
    if let serde_json::Value::Object(figures) = run.report() {
        fields.extend(figures);
    }
    fields.extend([
        ("sim_posts_per_sec_during_attempts".to_string(), round(sim_posts_per_sec).into()),
        ("sim_bare_requests".to_string(), bare.into()),
        ("sim_bare_requests_per_sec".to_string(), round(bare_per_sec).into()),
        (
            "attempts_to_bare_ratio".to_string(),
            round(run.per_sec / bare_per_sec.max(1.0)).into(),
        ),
        (
            "sim".to_string(),
            serde_json::json!({ "connections": stats.connections, "records": stats.records, "duplicates": stats.duplicates }),
        ),
    ]);
    if let Some((_, https_sim)) = &https {
        let stats = https_sim.stats();
        let https = &https_run;
        let mut figures = https.report();
        figures["sim"] = serde_json::json!({ "connections": stats.connections, "records": stats.records, "duplicates": stats.duplicates, "handshakes_failed": stats.handshakes_failed });
        fields.insert("rounds".to_string(), args.rounds.into());
        fields.insert("https".to_string(), figures);
        fields.insert(
            "https_to_http_ratio".to_string(),
            round(https.per_sec / run.per_sec.max(f64::MIN_POSITIVE)).into(),
        );
    }
    println!("{report}");
    client.shutdown_timeout(Duration::from_secs(1));
    drop(sim);
    drop(https);
    sim_runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
