//! Kafka mode as it is deployed: several `sendledger run` processes ([`Instance`]s of a
//! [`Group`]) in one consumer group on Apache Kafka (a cluster of three brokers, started by
//! [`start_broker`]), each with its own configuration file and data directory, started, killed,
//! frozen and restarted by the tests; a steady [`Stream`] of requests; a `read_committed`
//! follower of the results topic ([`ResultsFollower`]); the events topic read back and audited
//! ([`read_and_audit_log`]); and the check that every task settled once
//! ([`assert_settled_once`]).
//!
//! Who owns which partition, and when, is read from each process's own log (JSON lines on its
//! stderr: `partition taken over`, `partitions revoked`, and what a partition lost without
//! being revoked logs) into a [`Timeline`], which times every change of hands, including those
//! of a process killed since.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sendledger_core::result::{announcements, TaskResult};
use sendledger_core::{Event, ResultStatus};
use sendledger_kafka::{Kafka, KafkaConfig, Record, TopicReader};
use sendledger_node::config::{Config, StorageMode};
use sendledger_sim::Sim;

use crate::kafka::{
    config_for_process, dedupe, produce_with, request_messages_to, requests_producer, task_ids,
    terminal_by_task, validate_all, Broker, Rec,
};

/// Partitions of every topic: enough for three or four instances to own some each.
pub const PARTITIONS: i32 = 6;
/// How long reading a topic back or creating the topics may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The group's Kafka configuration against `broker`: topics replicated to every node (three),
/// a 6 s session, so that a killed member's partitions move on quickly, and dynamic group
/// membership (`instance_id = ""`): a test that kills an instance and starts another in its
/// place measures the failover, not a static member's return.
pub fn cluster_kafka(broker: &Broker) -> KafkaConfig {
    KafkaConfig {
        partitions: PARTITIONS,
        instance_id: Some(String::new()),
        ..config_for_process(broker)
    }
}

/// Apache Kafka (three brokers), the group's configuration against it, and a client of it
/// with the topics created.
pub async fn start_broker() -> (Broker, KafkaConfig, Kafka) {
    let broker = tokio::task::block_in_place(Broker::cluster);
    let kafka_config = cluster_kafka(&broker);
    let kafka = Kafka::connect(kafka_config.clone()).unwrap();
    kafka
        .ensure_topics(kafka_config.replication_factor, TIMEOUT, true)
        .await
        .expect("topics created");
    (broker, kafka_config, kafka)
}

/// The configuration file of one `sendledger run` in kafka mode on `dir`, with the admin
/// endpoint on a free loopback port.
fn instance_config(dir: &Path, kafka: &KafkaConfig, tweak: impl FnOnce(&mut Config)) -> String {
    let mut config = Config::default();
    config.storage.data = dir.join("ledger");
    config.storage.mode = StorageMode::Kafka;
    config.engine.timer_tick = Duration::from_millis(5);
    config.kafka = kafka.clone();
    config.admin.enabled = true;
    config.admin.listen = "127.0.0.1:0".parse().unwrap();
    tweak(&mut config);
    toml::to_string(&config).expect("a config serializes to TOML")
}

/// What an instance's log says about its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// `partition taken over`: the log opened (the previous writer fenced), restored, resumed.
    TakenOver(i32),
    /// `partitions revoked` by a rebalance.
    Revoked(Vec<i32>),
    /// The partition is lost here: its log's transaction was refused (another instance took
    /// the partition over) or its commit's outcome is unknown, or the group took it away when
    /// this instance's session expired.
    Lost(i32),
}

#[derive(Debug, Clone)]
pub struct Note {
    pub at: Instant,
    pub instance: usize,
    /// Which start of the instance said it (0 for the first).
    pub run: usize,
    pub said: Said,
}

/// Everything every instance said about its partitions, in the order it was read.
#[derive(Clone, Default)]
pub struct Timeline(Arc<Mutex<Vec<Note>>>);

impl Timeline {
    fn push(&self, note: Note) {
        self.0.lock().unwrap().push(note);
    }

    pub fn notes(&self) -> Vec<Note> {
        self.0.lock().unwrap().clone()
    }

    /// The partitions run `run` of instance `instance` owns by what it said so far.
    pub fn owned(&self, instance: usize, run: usize) -> BTreeSet<i32> {
        let mut owned = BTreeSet::new();
        for n in self.notes() {
            if (n.instance, n.run) != (instance, run) {
                continue;
            }
            match n.said {
                Said::TakenOver(p) => {
                    owned.insert(p);
                }
                Said::Revoked(ps) => ps.iter().for_each(|p| {
                    owned.remove(p);
                }),
                Said::Lost(p) => {
                    owned.remove(&p);
                }
            }
        }
        owned
    }

    /// When every one of `partitions` was taken over after `since` by a process other than run
    /// `run` of instance `instance` (each partition's first take-over counts), if they all
    /// were; and whether the instance's own restart took any of them.
    pub fn taken_over(
        &self,
        instance: usize,
        run: usize,
        partitions: &BTreeSet<i32>,
        since: Instant,
    ) -> Option<(Instant, bool)> {
        let notes = self.notes();
        let mut last = since;
        let mut by_restart = false;
        for p in partitions {
            let first = notes.iter().find(|n| {
                n.at > since
                    && (n.instance, n.run) != (instance, run)
                    && n.said == Said::TakenOver(*p)
            })?;
            last = last.max(first.at);
            by_restart |= first.instance == instance;
        }
        Some((last, by_restart))
    }

    pub fn lost(&self, instance: usize) -> usize {
        self.notes()
            .iter()
            .filter(|n| n.instance == instance && matches!(n.said, Said::Lost(_)))
            .count()
    }
}

/// The numbers in a `Debug`-printed list such as `[0, 3]`.
fn numbers(text: &str) -> Vec<i32> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// What a JSON log line says about partitions, if anything.
fn parse_log_line(line: &str) -> Option<Said> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = &value["fields"];
    let partition = || fields["partition"].as_i64().map(|p| p as i32);
    match fields["message"].as_str()? {
        "partition taken over" => partition().map(Said::TakenOver),
        "partitions revoked" => Some(Said::Revoked(numbers(fields["partitions"].as_str()?))),
        m if m.starts_with("the partition's log of record is lost")
            || m.starts_with("partition lost to the group") =>
        {
            partition().map(Said::Lost)
        }
        _ => None,
    }
}

/// One `sendledger run` process of the group: its directory (configuration file, ledger, log)
/// outlives the process, which is started again on it.
pub struct Instance {
    pub id: usize,
    pub dir: PathBuf,
    config: PathBuf,
    /// The `sendledger` executable.
    cli: PathBuf,
    /// How many times it was started.
    runs: usize,
    /// Environment variables its processes get, besides the test's.
    env: Vec<(String, String)>,
    running: Option<Running>,
}

struct Running {
    child: Child,
    admin: String,
    /// The front door's `http://` address, or `off`.
    front: String,
    run: usize,
}

/// A test that fails leaves no process behind: a running instance is killed (thawed first,
/// should it be frozen).
impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut running) = self.running.take() {
            // SAFETY: kill(2) on our own child's pid, which has not been waited for yet.
            unsafe { libc::kill(running.child.id() as i32, libc::SIGCONT) };
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

impl Instance {
    /// Instance `id` of the group: its directory `<root>/instance-<id>` and its configuration
    /// file there, with the one target `sim`, run by the `sendledger` executable at `cli`.
    pub fn new(
        cli: impl AsRef<Path>,
        root: &Path,
        id: usize,
        kafka: &KafkaConfig,
        target: sendledger_effects::TargetConfig,
    ) -> Instance {
        Instance::configured(cli, root, id, kafka, |config| {
            config.targets.insert("sim".into(), target);
        })
    }

    /// As [`Instance::new`], its configuration (targets, sagas, ...) set by `tweak`.
    pub fn configured(
        cli: impl AsRef<Path>,
        root: &Path,
        id: usize,
        kafka: &KafkaConfig,
        tweak: impl FnOnce(&mut Config),
    ) -> Instance {
        let dir = root.join(format!("instance-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("sendledger.toml");
        std::fs::write(&config, instance_config(&dir, kafka, tweak)).unwrap();
        Instance {
            id,
            dir,
            config,
            cli: cli.as_ref().to_path_buf(),
            runs: 0,
            env: Vec::new(),
            running: None,
        }
    }

    /// This instance, its processes given `env` (secrets its configuration names).
    pub fn with_env(mut self, env: &[(&str, &str)]) -> Instance {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self
    }

    pub fn log_file(&self) -> PathBuf {
        self.dir.join("stderr.jsonl")
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    pub fn run(&self) -> usize {
        self.running.as_ref().expect("running").run
    }

    pub fn admin(&self) -> &str {
        &self.running.as_ref().expect("running").admin
    }

    /// The front door's URL (`http://host:port`), when it is enabled.
    pub fn front(&self) -> &str {
        &self.running.as_ref().expect("running").front
    }

    fn pid(&self) -> i32 {
        self.running.as_ref().expect("running").child.id() as i32
    }

    /// Starts `sendledger run` and waits for its `ready` line. Its stderr (JSON log lines) is
    /// appended to [`Instance::log_file`], and what it says about partitions to `timeline`.
    pub fn start(&mut self, timeline: &Timeline) {
        assert!(self.running.is_none(), "instance {} runs already", self.id);
        let run = self.runs;
        self.runs += 1;
        let mut child = Command::new(&self.cli)
            .args(["--log-format", "json", "run", "--config"])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .unwrap();
        writeln!(
            log,
            "{{\"test\":\"instance {} run {run} starts\"}}",
            self.id
        )
        .unwrap();
        let (timeline, instance) = (timeline.clone(), self.id);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(log, "{line}");
                if let Some(said) = parse_log_line(&line) {
                    timeline.push(Note {
                        at: Instant::now(),
                        instance,
                        run,
                        said,
                    });
                }
            }
        });
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("ready "),
            "instance {} did not start: {line:?} (its log: {})",
            self.id,
            self.log_file().display()
        );
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let admin = crate::ready_field(&line, "admin=http://");
        let front = crate::ready_field(&line, "front=");
        self.running = Some(Running {
            child,
            admin,
            front,
            run,
        });
    }

    /// `kill -9`, and waits for the process to end.
    pub fn kill(&mut self) {
        let mut running = self.running.take().expect("running");
        running.child.kill().unwrap();
        running.child.wait().unwrap();
    }

    /// SIGTERM, and the exit status once it stopped.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// Waits for the process to end (after a signal), at most a minute.
    pub fn wait(&mut self) -> ExitStatus {
        let mut running = self.running.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = running.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "instance {} did not stop within a minute",
                self.id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Fails if the process ended by itself.
    pub fn assert_alive(&mut self) {
        let log = self.log_file();
        if let Some(running) = &mut self.running {
            if let Some(status) = running.child.try_wait().unwrap() {
                panic!(
                    "instance {} (run {}) ended by itself: {status}; its log: {}",
                    self.id,
                    running.run,
                    log.display()
                );
            }
        }
    }

    /// The instance's `/metrics`, if it answers within a second.
    pub fn metrics(&self) -> Option<String> {
        crate::http::get(self.admin(), "/metrics", Duration::from_secs(1))
    }

    /// The instance's `/healthz`, if it answers 200 within a second.
    pub fn health(&self) -> Option<serde_json::Value> {
        crate::http::get(self.admin(), "/healthz", Duration::from_secs(1))
            .and_then(|body| serde_json::from_str(&body).ok())
    }
}

/// Follows the results topic from its beginning as a `read_committed` consumer, on a thread
/// of its own, keeping every record.
pub struct ResultsFollower {
    /// The cluster it reads, where a task without a result has its history looked up.
    kafka: Kafka,
    records: Arc<Mutex<Vec<Rec>>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl ResultsFollower {
    pub fn start(kafka: &Kafka) -> ResultsFollower {
        let reader = TopicReader::from_beginning(kafka, &kafka.config().results_topic)
            .expect("a reader of the results topic");
        let records = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, stopped) = (records.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                // Errors (a broker connection lost) are the client's to retry.
                let Some(Ok(r)) = reader.next(Duration::from_millis(100)) else {
                    continue;
                };
                out.lock().unwrap().push(Rec {
                    key: r.key_text(),
                    event_id: r
                        .event_id()
                        .expect("every record carries an event id header"),
                    value: serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                        .expect("JSON record"),
                });
            }
        });
        ResultsFollower {
            kafka: kafka.clone(),
            records,
            stop,
            thread,
        }
    }

    /// Tasks with a terminal or a manual-review result so far.
    pub fn answered(&self) -> BTreeSet<String> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .filter(|r| {
                r.value["status"].as_str().is_some_and(|s| {
                    [
                        "succeeded",
                        "rejected",
                        "failed",
                        "manual_review",
                        "compensated",
                    ]
                    .contains(&s)
                })
            })
            .filter_map(|r| r.value["task_id"].as_str().map(str::to_string))
            .collect()
    }

    pub fn stop(self) -> Vec<Rec> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the results reader ends");
        Arc::try_unwrap(self.records)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|m| m.lock().unwrap().clone())
    }
}

/// The events topic read back ([`logged_events`]) and its audit as a `read_committed` reader.
pub fn read_and_audit_log(
    kafka: &Kafka,
) -> (
    (Vec<sendledger_core::Event>, Vec<Rec>),
    sendledger_store::AuditReport,
) {
    let logged = logged_events(kafka);
    let report = sendledger_kafka::audit_topic(
        kafka,
        &kafka.config().events_topic,
        Default::default(),
        |_, _| {},
    )
    .expect("the events topic is audited");
    (logged, report)
}

/// Every event of the events topic (the log of record), as a `read_committed` consumer reads
/// it, partition by partition.
pub fn read_log(kafka: &Kafka) -> Vec<sendledger_core::Event> {
    logged_events(kafka).0
}

/// Every event of the events topic, as a `read_committed` consumer reads it, and its records.
fn logged_events(kafka: &Kafka) -> (Vec<sendledger_core::Event>, Vec<Rec>) {
    let (mut events, mut records) = (Vec::new(), Vec::new());
    for partition in 0..kafka.config().partitions {
        sendledger_kafka::partition_log::read_partition(kafka, partition, 0, TIMEOUT, |m| {
            events.push(sendledger_kafka::partition_log::record_event(m)?);
            let r = Record::from_message(m);
            records.push(Rec {
                key: r.key_text(),
                event_id: r.event_id().unwrap_or_default(),
                value: serde_json::from_slice(r.payload.as_deref().unwrap_or_default())
                    .expect("JSON record"),
            });
            Ok(())
        })
        .expect("the events topic reads back");
    }
    (events, records)
}

/// A temporary directory kept (and named) when the test fails, or always with
/// `SENDLEDGER_KEEP_LOGS=1`, for the instances' logs.
pub struct KeptOnFailure(Option<tempfile::TempDir>);

impl KeptOnFailure {
    pub fn new() -> KeptOnFailure {
        KeptOnFailure(Some(
            tempfile::Builder::new()
                .prefix("sendledger-cluster-")
                .tempdir()
                .unwrap(),
        ))
    }

    pub fn path(&self) -> &Path {
        self.0.as_ref().unwrap().path()
    }
}

impl Default for KeptOnFailure {
    fn default() -> KeptOnFailure {
        KeptOnFailure::new()
    }
}

impl Drop for KeptOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("SENDLEDGER_KEEP_LOGS").is_some() {
            let kept = self.0.take().unwrap().keep();
            eprintln!(
                "the instances' directories and logs are kept in {}",
                kept.display()
            );
        }
    }
}

/// The remote holds at most one record per identity, and each task has exactly one terminal
/// result, which the log of record announces (its event id names an event of the log), matching
/// the remote, or is in review with no record. Each result is on the results topic at most as
/// many times as the log announces it, counted as records: a result the log announces once is
/// published once, whatever took the partition over in between. Returns the tasks in review.
pub fn assert_settled_once(
    sim: &Sim,
    keys: &[String],
    raw: &[Rec],
    events: &[Event],
) -> Vec<String> {
    let stats = sim.stats();
    assert_eq!(
        stats.duplicates, 0,
        "identities with two records: {stats:?}"
    );
    validate_all(raw, "task-result.schema.json");
    let results = dedupe(raw);
    let announced = announcements(events);
    let unbacked: Vec<&TaskResult> = (results.iter())
        .filter(|r| r.status.is_terminal() && !announced.contains_key(&r.event_id))
        .collect();
    assert!(
        unbacked.is_empty(),
        "results the log of record does not announce: {unbacked:?}"
    );
    let mut published: HashMap<&str, usize> = HashMap::new();
    for r in raw {
        *published.entry(r.event_id.as_str()).or_insert(0) += 1;
    }
    let overpublished: Vec<(&str, usize, usize)> = (published.iter())
        .map(|(id, n)| (*id, *n, announced.get(*id).copied().unwrap_or(0)))
        .filter(|(_, n, a)| n > a)
        .collect();
    assert!(
        overpublished.is_empty(),
        "results published more often than the log announces them (event id, records, \
         announcements): {overpublished:?}"
    );
    let terminal = terminal_by_task(&results);
    let mut reviews = Vec::new();
    for key in keys {
        let task = crate::engine::task_id(key).to_string();
        let records = sim.records_with_identity(key);
        assert!(records.len() <= 1, "{key}: {} records", records.len());
        match terminal.get(&task).map(Vec::as_slice) {
            Some([one]) => {
                assert_eq!(one.status, ResultStatus::Succeeded, "{key}: {one:?}");
                assert_eq!(
                    records.len(),
                    1,
                    "{key}: succeeded, {} records",
                    records.len()
                );
                assert_eq!(
                    one.remote_id.as_deref(),
                    Some(records[0].id.as_str()),
                    "{key}"
                );
            }
            Some(many) => panic!("{key}: {} terminal results: {many:?}", many.len()),
            None => {
                assert!(
                    results
                        .iter()
                        .any(|r| r.task_id == task && r.status == ResultStatus::ManualReview),
                    "{key}: neither a terminal nor a review result"
                );
                assert!(
                    records.is_empty(),
                    "{key}: in review but the remote holds its record {records:?}"
                );
                reviews.push(key.clone());
            }
        }
    }
    eprintln!(
        "{} results read ({} distinct): {} tasks succeeded, {} in manual review {reviews:?}",
        raw.len(),
        results.len(),
        keys.len() - reviews.len(),
        reviews.len(),
    );
    reviews
}

/// Whether each partition of `partitions` answered a request of `produced` from index `from`
/// on, by the results seen so far.
pub fn each_answered(
    results: &ResultsFollower,
    produced: &[(String, i32)],
    from: usize,
    partitions: &BTreeSet<i32>,
) -> bool {
    let answered = results.answered();
    (partitions.iter()).all(|p| answered_on(&answered, produced, from, *p))
}

/// Whether a request of `produced` from index `from` on, on `partition`, is in `answered`.
fn answered_on(
    answered: &BTreeSet<String>,
    produced: &[(String, i32)],
    from: usize,
    partition: i32,
) -> bool {
    (produced.iter().skip(from))
        .any(|(k, q)| *q == partition && answered.contains(&crate::engine::task_id(k).to_string()))
}

/// Why partitions of `partitions` did not answer a request of `produced` from index `from` on:
/// per such partition, its first request since then, whether the log of record holds its task
/// and in which phase, and the results topic's partitions whose last stable offset (where a
/// `read_committed` reader stops) is behind their end (a transaction left open).
pub fn why_unanswered(
    results: &ResultsFollower,
    produced: &[(String, i32)],
    from: usize,
    partitions: &BTreeSet<i32>,
) -> String {
    let answered = results.answered();
    // The log may not read back (a broker down): say so rather than fail here.
    let log = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_log(&results.kafka)));
    let mut why = Vec::new();
    if log.is_err() {
        why.push("the log of record did not read back".to_string());
    }
    let log = log.unwrap_or_default();
    for p in (partitions.iter()).filter(|p| !answered_on(&answered, produced, from, **p)) {
        let waiting = (produced.iter().skip(from)).find(|(_, q)| q == p);
        let Some((key, _)) = waiting else {
            why.push(format!("partition {p}: nothing produced"));
            continue;
        };
        let task = crate::engine::task_id(key).to_string();
        let events: Vec<&str> = (log.iter())
            .filter(|e| e.task_id.to_string() == task)
            .map(|e| e.body.name())
            .collect();
        why.push(format!(
            "partition {p}: {key} ({task}) logged as {events:?}"
        ));
    }
    let topic = &results.kafka.config().results_topic;
    let end = |isolation: &str, partition: i32| {
        let mut config = results.kafka.client_config(sendledger_kafka::Role::Replay);
        config.set("isolation.level", isolation);
        let consumer: sendledger_kafka::rdkafka::consumer::BaseConsumer = config.create().ok()?;
        use sendledger_kafka::rdkafka::consumer::Consumer;
        consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(5))
            .ok()
            .map(|w| w.1)
    };
    for p in 0..results.kafka.config().partitions {
        let (stable, high) = (end("read_committed", p), end("read_uncommitted", p));
        if stable != high {
            why.push(format!(
                "{topic} partition {p}: last stable offset {stable:?}, end {high:?}"
            ));
        }
    }
    why.join("; ")
}

/// The chaos run: instances, the timeline of their partitions, and the waiting in between.
pub struct Group {
    pub instances: Vec<Instance>,
    pub timeline: Timeline,
}

impl Group {
    /// `n` instances of `sendledger run` (the executable `cli`) with the one target `sim`
    /// (`target`), each started, and waited for (a minute at most) until they own every
    /// partition between them.
    pub async fn start(
        cli: &str,
        root: &Path,
        n: usize,
        kafka: &KafkaConfig,
        target: sendledger_effects::TargetConfig,
    ) -> Group {
        let timeline = Timeline::default();
        let mut group = Group {
            instances: (0..n)
                .map(|i| Instance::new(cli, root, i, kafka, target.clone()))
                .collect(),
            timeline: timeline.clone(),
        };
        tokio::task::block_in_place(|| {
            for i in &mut group.instances {
                i.start(&timeline);
            }
        });
        let took = group.wait_settled(Duration::from_secs(60)).await;
        assert!(
            took.is_some(),
            "not every partition owned: {}",
            group.owners()
        );
        group
    }

    pub fn running(&self) -> Vec<usize> {
        self.instances
            .iter()
            .filter(|i| i.is_running())
            .map(|i| i.id)
            .collect()
    }

    pub fn assert_alive(&mut self) {
        for i in &mut self.instances {
            i.assert_alive();
        }
    }

    /// Whether the running instances own every partition between them, each some, none twice.
    pub fn settled(&self) -> bool {
        let mut all = BTreeSet::new();
        let mut count = 0;
        for i in self.instances.iter().filter(|i| i.is_running()) {
            let owned = self.timeline.owned(i.id, i.run());
            if owned.is_empty() {
                return false;
            }
            count += owned.len();
            all.extend(owned);
        }
        count == PARTITIONS as usize && all.len() == PARTITIONS as usize
    }

    /// Waits (at most `limit`) until the group settled; returns how long that took, or `None`.
    pub async fn wait_settled(&mut self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            self.assert_alive();
            if self.settled() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Waits (at most `limit`) until every one of `tasks` has a result.
    pub async fn wait_answered(
        &mut self,
        results: &ResultsFollower,
        tasks: &BTreeSet<String>,
        limit: Duration,
    ) {
        let deadline = Instant::now() + limit;
        while !tasks.is_subset(&results.answered()) {
            self.assert_alive();
            if Instant::now() > deadline {
                let answered = results.answered();
                let missing: Vec<&String> = tasks.difference(&answered).collect();
                // What the log of record holds of each, to tell a stuck task from a lost result.
                let log = tokio::task::block_in_place(|| read_log(&results.kafka));
                for task in &missing {
                    let history: Vec<String> = (log.iter())
                        .filter(|e| e.task_id.to_string() == **task)
                        .map(|e| format!("{} {}: {}", e.at, e.body.name(), e.body.summary(e.at)))
                        .collect();
                    eprintln!(
                        "{task} has no result; its events:\n  {}",
                        history.join("\n  ")
                    );
                }
                panic!("{} tasks without a result", missing.len());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The end of a run: waits (90 s at most) until every task of `keys` has a result, stops
    /// every instance (each must exit 0) and the follower, and checks what the user would:
    /// each task settled once and none in review ([`assert_settled_once`]), and the events
    /// topic audits clean. Returns the audit's report.
    pub async fn finish(
        &mut self,
        results: ResultsFollower,
        sim: &Sim,
        keys: &[String],
    ) -> sendledger_store::AuditReport {
        self.wait_answered(&results, &task_ids(keys), Duration::from_secs(90))
            .await;
        self.stop_all();
        let kafka = results.kafka.clone();
        let raw = results.stop();
        let ((events, _), report) = tokio::task::block_in_place(|| read_and_audit_log(&kafka));
        let reviews = assert_settled_once(sim, keys, &raw, &events);
        assert!(reviews.is_empty(), "tasks in review: {reviews:?}");
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        report
    }

    /// SIGTERM to every running instance; each must stop cleanly (exit 0).
    pub fn stop_all(&mut self) {
        tokio::task::block_in_place(|| {
            for i in self.instances.iter_mut().filter(|i| i.is_running()) {
                let status = i.terminate();
                assert!(
                    status.success(),
                    "instance {} did not stop cleanly: {status}",
                    i.id
                );
            }
        });
    }

    pub fn owners(&self) -> String {
        self.instances
            .iter()
            .filter(|i| i.is_running())
            .map(|i| format!("{}:{:?}", i.id, self.timeline.owned(i.id, i.run())))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Keys produced by a [`Stream`], with the partition each went to.
pub type Produced = Arc<Mutex<Vec<(String, i32)>>>;

/// A steady stream of new requests (`batch` every `every`) until stopped.
pub struct Stream {
    produced: Produced,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    pub fn start(kafka: &Kafka, prefix: &'static str, batch: usize, every: Duration) -> Stream {
        Stream::start_to(kafka, "sim", prefix, batch, every)
    }

    /// As [`Stream::start`], the requests naming `target` (a target or a saga).
    pub fn start_to(
        kafka: &Kafka,
        target: &'static str,
        prefix: &'static str,
        batch: usize,
        every: Duration,
    ) -> Stream {
        let produced: Produced = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (kafka, out, stopped) = (kafka.clone(), produced.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let producer = requests_producer(&kafka);
            let mut n = 0;
            while !stopped.load(Ordering::Relaxed) {
                let keys: Vec<String> = (n..n + batch).map(|i| format!("{prefix}-{i}")).collect();
                n += batch;
                let messages = request_messages_to(keys.iter(), target);
                let acks = produce_with(&producer, &kafka, messages).await;
                out.lock()
                    .unwrap()
                    .extend(keys.into_iter().zip(acks.into_iter().map(|(p, _)| p)));
                tokio::time::sleep(every).await;
            }
        });
        Stream {
            produced,
            stop,
            task,
        }
    }

    pub fn produced(&self) -> Vec<(String, i32)> {
        self.produced.lock().unwrap().clone()
    }

    pub async fn stop(self) -> Vec<(String, i32)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        Arc::try_unwrap(self.produced)
            .unwrap()
            .into_inner()
            .unwrap()
    }
}
