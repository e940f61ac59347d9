//! The processes a benchmark runs beside its own: the simulated remote (`sendledger
//! sim-remote`), so the benchmark's peak memory and CPU are not the remote's, and, for
//! `sendledger-bench kafka --service-process`, the service itself (`sendledger run`), so its peak memory
//! is measured alone, as in a deployment.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use sendledger_sim::Stats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `sendledger` executable the benchmarks start as a child: `$SENDLEDGER_BIN`, or the one
/// built beside this benchmark's executable (`cargo build --release --workspace` builds both
/// into one directory).
pub fn sendledger_exe() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("SENDLEDGER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let this = std::env::current_exe().context("finding this executable")?;
    let beside = this.with_file_name("sendledger");
    anyhow::ensure!(
        beside.is_file(),
        "no sendledger executable at {}: build it (`cargo build --release --locked -p sendledger`) or set SENDLEDGER_BIN",
        beside.display()
    );
    Ok(beside)
}

/// A `sendledger sim-remote` child, stopped when dropped.
pub struct RemoteProcess {
    child: Child,
    create_url: String,
    lookup_url: String,
    stats_url: String,
    _config: tempfile::NamedTempFile,
}

impl RemoteProcess {
    /// Starts a well-behaved remote (no faults, no latency) whose records are identified by the body field
    /// `reference`, on a free local port, and waits until it listens.
    pub fn start() -> anyhow::Result<RemoteProcess> {
        RemoteProcess::start_with(Duration::ZERO)
    }

    /// As [`RemoteProcess::start`], the remote taking `latency` to process each request.
    pub fn start_with(latency: Duration) -> anyhow::Result<RemoteProcess> {
        let config = tempfile::NamedTempFile::new()?;
        let latency = format!("{}ms", latency.as_millis());
        let text = format!("identity_field = \"reference\"\n[faults]\nlatency = \"{latency}\"\n");
        std::fs::write(config.path(), text)?;
        let mut child = Command::new(sendledger_exe()?)
            .args(["sim-remote", "--listen", "127.0.0.1:0", "--config"])
            .arg(config.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting `sendledger sim-remote`")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        // `ready create=POST URL lookup=GET URL?FIELD=VALUE stats=GET URL`
        let url_after = |label: &str| {
            line.split(label)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(|u| u.trim_end_matches("?FIELD=VALUE").to_string())
        };
        let (Some(create_url), Some(lookup_url), Some(stats_url)) = (
            url_after("create=POST "),
            url_after("lookup=GET "),
            url_after("stats=GET "),
        ) else {
            let _ = child.kill();
            anyhow::bail!("`sendledger sim-remote` did not start: it printed {line:?}");
        };
        Ok(RemoteProcess {
            child,
            create_url,
            lookup_url,
            stats_url,
            _config: config,
        })
    }

    /// A target's configuration (as JSON) that creates records here, identified by the
    /// task id in the body field `reference`, and looks them up by it.
    /// The remote's lookup URL, without a query.
    pub fn lookup_url(&self) -> &str {
        &self.lookup_url
    }

    pub fn target(&self) -> serde_json::Value {
        serde_json::json!({
            "url": self.create_url,
            "body_fields": { "reference": "{task_id}" },
            "lookup": { "url": format!("{}?reference={{task_id}}", self.lookup_url) },
        })
    }

    /// The remote's counters, from its stats endpoint.
    pub async fn stats(&self) -> anyhow::Result<Stats> {
        let rest = self
            .stats_url
            .strip_prefix("http://")
            .context("the stats URL is not http")?;
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body)
            .context("the stats endpoint answered without a body")?;
        serde_json::from_str(body).with_context(|| format!("the stats endpoint answered {text:?}"))
    }
}

impl Drop for RemoteProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `sendledger run` child on a configuration file, its output in a log file next to it;
/// killed when dropped unless stopped.
pub struct ServiceProcess {
    child: Child,
    log: PathBuf,
}

impl ServiceProcess {
    /// Starts `sendledger run --config <dir>/sendledger.toml` with `config` (TOML) as that file.
    pub fn start(dir: &Path, config: &str) -> anyhow::Result<ServiceProcess> {
        let path = dir.join("sendledger.toml");
        std::fs::write(&path, config)?;
        let log = dir.join("service.log");
        let child = Command::new(sendledger_exe()?)
            .args(["run", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting `sendledger run`")?;
        Ok(ServiceProcess { child, log })
    }

    /// Fails, with the end of its log, when the service has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!("the service exited ({status}): {}", self.log_tail()),
        }
    }

    /// The service's peak resident memory so far, in bytes, from the kernel (`VmHWM`).
    pub fn peak_rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .context("no VmHWM in the service's /proc status")
    }

    /// The CPU time (user and system, all threads) the service has used so far, in seconds,
    /// from the kernel (`/proc/PID/stat`).
    pub fn cpu_secs(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // The fields after the command's name, which is in parentheses and may hold spaces:
        // utime and stime are the 14th and 15th fields of the whole line.
        let rest = stat
            .rsplit_once(')')
            .context("no command name in /proc stat")?
            .1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| -> anyhow::Result<f64> {
            Ok(fields.get(i).context("short /proc stat")?.parse::<u64>()? as f64)
        };
        // SAFETY: sysconf with a valid name has no preconditions.
        #[allow(unsafe_code)]
        let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Ok((ticks(11)? + ticks(12)?) / per_sec)
    }

    /// Stops the service as an operator does (SIGTERM) and waits up to `grace` for it to exit.
    pub fn stop(mut self, grace: Duration) -> anyhow::Result<ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) with the pid of a child not yet waited for, so not reused.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(pid, libc::SIGTERM) } == 0;
        anyhow::ensure!(sent, "cannot signal the service");
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the service did not stop within {grace:?}: {}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of the service's log, for an error.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's resource usage so far (its own threads, not its children), from the kernel.
fn own_usage() -> Option<libc::rusage> {
    // SAFETY: rusage is plain data (integers only), valid when zeroed.
    #[allow(unsafe_code)]
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a pointer to a live local.
    #[allow(unsafe_code)]
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0;
    ok.then_some(usage)
}

/// This process's peak resident memory so far, in bytes, from the kernel.
pub fn own_peak_rss_bytes() -> u64 {
    // Linux reports ru_maxrss in KiB.
    own_usage().map_or(0, |u| u.ru_maxrss as u64 * 1024)
}

/// The CPU time (user and system, all threads) this process has used so far, in seconds.
pub fn own_cpu_secs() -> f64 {
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    own_usage().map_or(0.0, |u| secs(u.ru_utime) + secs(u.ru_stime))
}
