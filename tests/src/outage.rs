//! A remote that goes down in the middle of a steady stream of tasks, and what the tasks end
//! as: the engine (real RocksDB) against a remote over real sockets, the outage switched on and
//! off at run time. The remote is either the simulated remote, whose faults are switched, or
//! json-server, a real REST server run as a separate process behind a [`FaultProxy`]
//! ([`Remote`]). The integration tests run it short and assert; the outage soak
//! (`tests/soak/outage.rs`) runs it for minutes, with and without the breaker, and reports the
//! numbers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sendledger_core::{EventBody, Phase};
use sendledger_sim::{Faults, Sim, SimConfig};
use serde::Serialize;

use crate::engine::{request, settled, source, start, target, task_id};
use crate::fault_proxy::{FaultProxy, Mode};

/// The remote a run sends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Remote {
    /// The simulated remote (`sendledger-sim`), in this process; the outage is its faults.
    Sim,
    /// json-server (`scripts/prereqs` installs it), a separate process, behind a
    /// [`FaultProxy`] that makes the outage; records are `POST /orders`, lookups
    /// `GET /orders?reference=...`.
    JsonServer,
}

/// What the remote does during the outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outage {
    /// Connections are refused: nothing listens.
    Refused,
    /// Each POST is read and its connection closed, unanswered (nothing created).
    Dropped,
    /// Each POST is answered 503 without `Retry-After` (nothing created).
    Unavailable,
    /// Each POST is read and never answered, until the client's request timeout (nothing
    /// created).
    Hung,
}

impl Outage {
    pub const ALL: [Outage; 4] = [
        Outage::Refused,
        Outage::Dropped,
        Outage::Unavailable,
        Outage::Hung,
    ];
}

/// One run: `tasks` submitted evenly over `submit_for`; the outage starts `outage_at` after
/// the first and lasts `outage_for`.
#[derive(Debug, Clone, Serialize)]
pub struct OutageRun {
    pub remote: Remote,
    pub kind: Outage,
    pub tasks: usize,
    pub submit_for: Duration,
    pub outage_at: Duration,
    pub outage_for: Duration,
    /// The target's breaker and `lookup.complete_after` (off: what the service did before
    /// either existed).
    pub breaker: bool,
    /// How long after the remote is back every task must have settled.
    pub settle_within: Duration,
}

/// What the tasks ended as.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OutageReport {
    pub remote: Option<Remote>,
    pub tasks: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub manual_review: usize,
    /// Neither settled nor terminal when the run gave up waiting.
    pub unsettled: usize,
    /// Identities with more than one record at the remote.
    pub duplicates: usize,
    /// Records at the remote.
    pub records: usize,
    /// Succeeded tasks without a record at the remote, or naming another one.
    pub wrong_remote_id: usize,
    /// POSTs the remote (for json-server: its proxy) received while it was down.
    pub posts_during_outage: u64,
    /// From the remote's return until every task settled (or the run gave up); tasks submitted
    /// after the return included.
    pub drain_ms: u64,
    /// From the remote's return until every task submitted before it settled (or the run gave
    /// up): what the outage cost once the remote was back.
    pub settled_after_return_ms: u64,
    /// Tasks submitted before the remote's return.
    pub tasks_before_return: usize,
    /// Waits recorded before an intent (`SendDeferred`), and tasks with at least one.
    pub waits: usize,
    pub tasks_that_waited: usize,
    /// Times the target's breaker opened.
    pub breaker_opened: u64,
    pub attempts: u64,
}

/// The target of a run: the test target with the default retry policy (8 attempts from
/// 100 ms), a 1 s request timeout, a 20 s observation window, and, with `breaker`, a breaker
/// that opens after 5 calls, probes every second, and takes an attempt running for 500 ms as
/// failing, and lookups declared complete after 2 s (at most 3 resends on that proof).
fn outage_target(remote: Remote, base: &str, breaker: bool) -> sendledger_effects::TargetConfig {
    target(base, |t| {
        if remote == Remote::JsonServer {
            t["url"] = format!("{base}/orders").into();
            t["lookup"]["url"] = format!("{base}/orders?reference={{task_id}}").into();
        }
        t["request_timeout"] = "1s".into();
        t["retry"] = serde_json::json!({});
        t["lookup"]["deadline"] = "20s".into();
        t["lookup"]["check_interval"] = "500ms".into();
        if breaker {
            t["breaker"] = serde_json::json!({
                "window_calls": 10,
                "minimum_calls": 5,
                "open_for": "1s",
                "slow_after": "500ms",
            });
            t["lookup"]["complete_after"] = "2s".into();
            // A task can be the half-open probe of an outage more than once.
            t["lookup"]["max_policy_resends"] = 3.into();
        } else {
            t["breaker"] = serde_json::json!({ "enabled": false });
        }
    })
}

pub async fn run(run: &OutageRun) -> OutageReport {
    let remote = Backend::start(run.remote).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = outage_target(run.remote, &remote.base_url(), run.breaker);
    let engine = tokio::task::block_in_place(|| start(dir.path(), config));
    let keys: Vec<String> = (0..run.tasks).map(|i| format!("o-{i}")).collect();
    let gap = run.submit_for / run.tasks.max(1) as u32;
    let started = Instant::now();
    let (mut down, mut back) = (false, None);
    let mut posts_before = 0;
    let mut posts_during_outage = 0;
    let mut settling = None;
    for (i, key) in keys.iter().enumerate() {
        let elapsed = started.elapsed();
        if !down && elapsed >= run.outage_at {
            posts_before = remote.posts();
            remote.begin(run.kind).await;
            down = true;
        }
        if down && back.is_none() && elapsed >= run.outage_at + run.outage_for {
            posts_during_outage = remote.posts() - posts_before;
            remote.end(run.kind).await;
            let at = Instant::now();
            back = Some(at);
            settling = Some(watch_settle(&engine, &keys[..i], at, run.settle_within));
        }
        engine
            .submit(request(key), source(i as i64))
            .await
            .expect("request recorded");
        let next = started + gap * (i as u32 + 1);
        tokio::time::sleep_until(next.into()).await;
    }
    if back.is_none() {
        tokio::time::sleep_until((started + run.outage_at + run.outage_for).into()).await;
        if !down {
            posts_before = remote.posts();
        }
        posts_during_outage = remote.posts() - posts_before;
        remote.end(run.kind).await;
        let at = Instant::now();
        back = Some(at);
        settling = Some(watch_settle(&engine, &keys, at, run.settle_within));
    }
    let back = back.expect("the remote came back");
    let settling = settling.expect("watched since the return");
    let give_up = back + run.settle_within;
    let mut report = OutageReport {
        remote: Some(run.remote),
        tasks: run.tasks,
        posts_during_outage,
        ..OutageReport::default()
    };
    let mut states = BTreeMap::new();
    for key in &keys {
        loop {
            let state = engine.state(task_id(key)).await.expect("read task");
            if settled(&state) || Instant::now() > give_up {
                states.insert(key.clone(), state);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    report.drain_ms = back.elapsed().as_millis() as u64;
    (report.tasks_before_return, report.settled_after_return_ms) =
        settling.await.expect("the watch ends");
    let records = remote.records().await;
    report.records = records.values().map(Vec::len).sum();
    for (key, state) in &states {
        match state.phase {
            Phase::Succeeded => report.succeeded += 1,
            Phase::Failed => report.failed += 1,
            Phase::ManualReview => report.manual_review += 1,
            _ => report.unsettled += 1,
        }
        report.attempts += u64::from(state.attempts);
        let ids = records.get(key).map(Vec::as_slice).unwrap_or_default();
        if ids.len() > 1 {
            report.duplicates += 1;
        }
        if state.phase == Phase::Succeeded
            && (ids.len() != 1 || state.remote_id.as_deref() != Some(ids[0].as_str()))
        {
            report.wrong_remote_id += 1;
        }
        let events = engine.events(task_id(key)).await.expect("read events");
        let waits = events
            .iter()
            .filter(|e| matches!(e.body, EventBody::SendDeferred { .. }))
            .count();
        report.waits += waits;
        report.tasks_that_waited += usize::from(waits > 0);
    }
    // Records of no task of the run would be duplicates of nothing: none may exist.
    let strays = records.keys().filter(|k| !states.contains_key(*k)).count();
    assert_eq!(
        strays, 0,
        "records at the remote of identities never submitted"
    );
    report.breaker_opened = engine.target_health().iter().map(|t| t.opened).sum::<u64>();
    engine.shutdown(Duration::from_secs(5)).await;
    remote.shutdown().await;
    report
}

/// Watches, from the remote's return at `back`, the tasks of `keys` (those submitted before
/// it) until each settled or `within` passed: their number, and the milliseconds from `back`
/// until the last of them settled.
fn watch_settle(
    engine: &sendledger_actors::Engine,
    keys: &[String],
    back: Instant,
    within: Duration,
) -> tokio::task::JoinHandle<(usize, u64)> {
    let engine = engine.clone();
    let keys = keys.to_vec();
    tokio::spawn(async move {
        let give_up = back + within;
        for key in &keys {
            while !settled(&engine.state(task_id(key)).await.expect("read task"))
                && Instant::now() <= give_up
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        (keys.len(), back.elapsed().as_millis() as u64)
    })
}

/// The remote of a run, and how its outage is made.
enum Backend {
    Sim(Sim),
    JsonServer {
        server: JsonServer,
        proxy: FaultProxy,
    },
}

impl Backend {
    async fn start(remote: Remote) -> Backend {
        match remote {
            Remote::Sim => Backend::Sim(
                Sim::start(SimConfig::default())
                    .await
                    .expect("simulated remote"),
            ),
            Remote::JsonServer => {
                let server = tokio::task::block_in_place(JsonServer::start);
                let proxy = FaultProxy::start(server.addr()).await.expect("fault proxy");
                Backend::JsonServer { server, proxy }
            }
        }
    }

    /// The base URL the target sends to.
    fn base_url(&self) -> String {
        match self {
            Backend::Sim(sim) => sim.base_url(),
            Backend::JsonServer { proxy, .. } => proxy.base_url(),
        }
    }

    /// POSTs received so far (by the proxy, for json-server: refused connections bring none).
    fn posts(&self) -> u64 {
        match self {
            Backend::Sim(sim) => sim.stats().posts,
            Backend::JsonServer { proxy, .. } => proxy.counts().posts,
        }
    }

    async fn begin(&self, kind: Outage) {
        let proxy = match self {
            Backend::Sim(sim) => return begin(sim, kind).await,
            Backend::JsonServer { proxy, .. } => proxy,
        };
        let mode = match kind {
            Outage::Refused => Mode::Refused,
            Outage::Dropped => Mode::DropPosts,
            Outage::Unavailable => Mode::Answer503,
            Outage::Hung => Mode::HangPosts,
        };
        proxy.set_mode(mode).await.expect("proxy mode");
    }

    async fn end(&self, kind: Outage) {
        match self {
            Backend::Sim(sim) => end(sim, kind).await,
            Backend::JsonServer { proxy, .. } => proxy
                .set_mode(Mode::Pass)
                .await
                .expect("proxy passes again"),
        }
    }

    /// The ids of the records at the remote, by identity (the request key).
    async fn records(&self) -> BTreeMap<String, Vec<String>> {
        match self {
            Backend::Sim(sim) => {
                sim.records()
                    .into_iter()
                    .fold(BTreeMap::new(), |mut by_key, record| {
                        let key = record.body["request_key"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        by_key.entry(key).or_insert_with(Vec::new).push(record.id);
                        by_key
                    })
            }
            Backend::JsonServer { server, .. } => server.records().await,
        }
    }

    async fn shutdown(self) {
        match self {
            Backend::Sim(sim) => sim.shutdown().await,
            Backend::JsonServer { server, proxy } => {
                drop(proxy);
                drop(server);
            }
        }
    }
}

/// json-server as a separate process on a free port of 127.0.0.1, its store (`db.json`, one
/// empty collection `orders`) in a temporary directory; killed when dropped.
pub struct JsonServer {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

/// Where json-server is: `SENDLEDGER_JSON_SERVER`, else `node_modules/.bin/json-server` under
/// `SENDLEDGER_NPM_PREFIX`, else under `~/.cache/sendledger-npm` (where `scripts/prereqs`
/// installs it).
pub fn json_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SENDLEDGER_JSON_SERVER") {
        return PathBuf::from(path);
    }
    let prefix = std::env::var_os("SENDLEDGER_NPM_PREFIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/sendledger-npm")
        });
    prefix.join("node_modules/.bin/json-server")
}

impl JsonServer {
    /// Starts it and waits (up to 30 s) until it answers `GET /orders`. Panics, saying to run
    /// `scripts/prereqs`, when json-server is not installed.
    pub fn start() -> JsonServer {
        let binary = json_server_binary();
        assert!(
            binary.exists(),
            "json-server is not installed at {}: run scripts/prereqs (it installs json-server with npm), \
             or set SENDLEDGER_JSON_SERVER to its path",
            binary.display()
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let db = dir.path().join("db.json");
        std::fs::write(&db, r#"{"orders": []}"#).expect("write db.json");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = std::fs::File::create(dir.path().join("json-server.log")).expect("log file");
        let child = Command::new(&binary)
            .args(["--quiet", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg(&db)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "json-server at {} does not start ({e}): run scripts/prereqs (it installs Node.js and json-server)",
                    binary.display()
                )
            });
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut server = JsonServer { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if crate::http::get(&addr.to_string(), "/orders", Duration::from_secs(1)).is_some() {
                return server;
            }
            let log = std::fs::read_to_string(server.dir.path().join("json-server.log"))
                .unwrap_or_default();
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("json-server exited ({status}) before answering:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "json-server did not answer GET /orders within 30 s:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its own address, not the proxy's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every record of `orders`, read with `GET /orders` straight from the server: their ids
    /// (numbers, as text) by `request_key`.
    pub async fn records(&self) -> BTreeMap<String, Vec<String>> {
        let all = crate::http::get_json(&self.addr.to_string(), "/orders").await;
        let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for record in all.as_array().expect("GET /orders answers an array") {
            let key = record["request_key"]
                .as_str()
                .unwrap_or_else(|| panic!("a record without a request_key: {record}"));
            let id = match &record["id"] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            by_key.entry(key.to_string()).or_default().push(id);
        }
        by_key
    }
}

impl Drop for JsonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn begin(sim: &Sim, kind: Outage) {
    let faults = match kind {
        Outage::Refused => {
            sim.set_offline(true).await.expect("remote offline");
            return;
        }
        Outage::Dropped => Faults {
            drop: 1.0,
            ..Faults::default()
        },
        Outage::Unavailable => Faults {
            error: 1.0,
            error_status: 503,
            ..Faults::default()
        },
        Outage::Hung => Faults {
            hang: 1.0,
            ..Faults::default()
        },
    };
    sim.set_faults(faults).expect("valid faults");
}

async fn end(sim: &Sim, kind: Outage) {
    match kind {
        Outage::Refused => sim.set_offline(false).await.expect("remote back online"),
        _ => sim.set_faults(Faults::default()).expect("valid faults"),
    }
}
