//! One module per command of the `sendledger` binary: each parses its arguments with clap and
//! calls the libraries (the service itself is `sendledger_node`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sendledger_store::{Error as StoreError, Ledger, LedgerOptions};
use serde_json::Value;

pub mod audit;
pub mod check_broker;
pub mod demo;
pub mod inspect;
pub mod offsets;
pub mod produce;
pub mod review;
pub mod run;
pub mod sim_remote;
pub mod tasks;

/// A `--kafka-property KEY=VALUE` argument.
pub fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// Opens the ledger read-only: these commands create and change nothing where they point.
pub fn open_read_only(data: &Path) -> anyhow::Result<Ledger> {
    Ledger::open_read_only(data).map_err(|e| match e {
        StoreError::NoLedger { .. } => anyhow::anyhow!("{e}; pass --data DIR"),
        e => anyhow::Error::new(e).context(format!("opening the ledger at {}", data.display())),
    })
}

/// Writes `line` on stdout for whoever waits for it. A server must not stop because nobody
/// reads its stdout (a closed pipe is EPIPE, since Rust ignores SIGPIPE; `println!` would
/// panic), so a failed write is logged and the server goes on.
pub fn print_line(line: &str) {
    if let Err(e) = writeln!(std::io::stdout(), "{line}") {
        tracing::warn!(error = %e, "cannot write to stdout; going on without it");
    }
}

/// Where the ledger is: exactly one of a running service or a stopped ledger directory.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct At {
    /// A running service's admin endpoint, e.g. `http://127.0.0.1:9464`.
    #[arg(long, value_name = "URL")]
    pub admin: Option<Uri>,
    /// A stopped service's ledger directory.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
}

/// Opens a stopped service's ledger for writing (an operator's decision), refusing one a
/// service holds or a kafka-mode copy.
pub fn open(dir: &PathBuf) -> anyhow::Result<Ledger> {
    anyhow::ensure!(
        dir.exists(),
        "no ledger at {}; pass --data DIR",
        dir.display()
    );
    match Ledger::open(dir, LedgerOptions::default()) {
        Ok(ledger) => Ok(ledger),
        Err(sendledger_store::Error::InUse { .. }) => anyhow::bail!(
            "the ledger at {} is in use by a running service; use --admin URL",
            dir.display()
        ),
        // Its record is the events topic: a resolution written only here would be lost.
        Err(sendledger_store::Error::OtherMode { .. }) => anyhow::bail!(
            "the ledger at {} is a kafka-mode copy; resolve through the admin endpoint of the instance that owns the task's partition (--admin URL)",
            dir.display()
        ),
        Err(e) => Err(e).with_context(|| format!("opening the ledger at {}", dir.display())),
    }
}

/// One request to the admin endpoint; its JSON answer, or its error message.
pub fn call(
    base: &Uri,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    token: Option<&str>,
) -> anyhow::Result<Value> {
    anyhow::ensure!(
        base.scheme_str() == Some("http"),
        "--admin must be an http:// URL, e.g. http://127.0.0.1:9464"
    );
    let authority = base
        .authority()
        .context("--admin needs a host and port, e.g. http://127.0.0.1:9464")?
        .clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, bytes) = runtime.block_on(async {
        let addr = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        let stream = tokio::net::TcpStream::connect(&addr)
            .await
            .with_context(|| {
                format!("connecting to the admin endpoint at {addr}; is the service running?")
            })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, authority.as_str())
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, bytes))
    })?;
    let value: Value = serde_json::from_slice(&bytes).with_context(|| {
        format!("the admin endpoint answered {status} with a body that is not JSON")
    })?;
    if status == StatusCode::OK {
        return Ok(value);
    }
    let message = value["error"].as_str().unwrap_or("no message");
    anyhow::bail!("the admin endpoint answered {status}: {message}")
}
