//! Apache Kafka for the tests: brokers in KRaft mode, each a JVM started from the jars that
//! `scripts/prereqs` fetched with Maven (`SENDLEDGER_KAFKA_LIBS`), on loopback ports of their
//! own, with their data in a temporary directory.
//!
//! [`Broker::single`] is one combined broker and controller (replication factor 1), for the
//! ordinary suite; [`Broker::cluster`] is three, each broker and controller (three voters,
//! replication factor 3, `min.insync.replicas=2`, unclean leader election off), for kafka mode.
//! A node can be killed (`SIGKILL`), frozen (`SIGSTOP`) and started again on its data.
//!
//! Each node has three listeners: `CLIENT` for the clients (advertised at another port when a
//! relay stands in front of it, so every client connection goes through the relay), `INTERNAL`
//! between brokers (never through a relay: a broker writing transaction markers to itself or
//! replicating is not a client), and `CONTROLLER` for the quorum.
//!
//! No broker outlives its test: dropping a [`Broker`] kills its nodes, and a watchdog beside
//! each node kills it when the test process is gone (a test binary killed by its runner never
//! runs its destructors).

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sendledger_kafka::rdkafka::config::ClientConfig;
use sendledger_kafka::rdkafka::consumer::{BaseConsumer, Consumer};

/// The heap of each broker's JVM (`-Xms` and `-Xmx`).
pub const HEAP: &str = "512m";
/// How long a broker (or a cluster) may take to answer with every node registered.
const START: Duration = Duration::from_secs(60);
/// One three-node cluster at a time in a test process: three JVMs and the instances of a
/// kafka-mode test fill both cores of the machines the suite runs on, and two such tests side
/// by side starved their remotes' lookups past their deadlines. A test with a cluster waits
/// for the one before it; the other test threads go on.
struct Turn;

static CLUSTER_RUNNING: Mutex<bool> = Mutex::new(false);
static CLUSTER_ENDED: Condvar = Condvar::new();

impl Turn {
    fn take() -> Turn {
        let mut running = CLUSTER_RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *running {
            running = CLUSTER_ENDED
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
        *running = true;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *CLUSTER_RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = false;
        CLUSTER_ENDED.notify_one();
    }
}

/// The id of every test cluster: each is formatted from one template of its size.
const CLUSTER_ID: &str = "c2VuZGxlZGdlci10ZXN0cw";

/// One node: a combined broker and controller.
struct Node {
    id: u32,
    client: u16,
    internal: u16,
    controller: u16,
    /// The port the node advertises to clients (a relay's, or its own `client`).
    advertised: u16,
    dir: PathBuf,
    child: Option<Child>,
    watchdog: Option<Child>,
}

/// Apache Kafka: one node or three, started and waited for.
pub struct Broker {
    nodes: Vec<Node>,
    /// A cluster holds the turn of [`Turn::take`] while it runs.
    _turn: Option<Turn>,
    /// The client port of the first node (the one a relay stands in front of).
    pub port: u16,
    /// The nodes' directories: removed with the broker, kept when its test fails.
    dir: Option<tempfile::TempDir>,
}

impl Broker {
    /// One combined broker and controller.
    pub fn single() -> Broker {
        Broker::start(1, None)
    }

    /// One combined broker and controller that tells clients to connect to `advertised` (a
    /// relay's port) instead of its own.
    pub fn single_advertising(advertised: u16) -> Broker {
        Broker::start(1, Some(advertised))
    }

    /// Three brokers, each also a controller: replication factor 3, `min.insync.replicas=2`.
    pub fn cluster() -> Broker {
        Broker::start(3, None)
    }

    fn start(n: u32, advertised: Option<u16>) -> Broker {
        let turn = (n > 1).then(Turn::take);
        let dir = tempfile::tempdir().expect("a directory for the brokers");
        let mut nodes: Vec<Node> = (1..=n)
            .map(|id| {
                let client = free_port();
                Node {
                    id,
                    client,
                    internal: free_port(),
                    controller: free_port(),
                    advertised: advertised.filter(|_| id == 1).unwrap_or(client),
                    dir: dir.path().join(format!("node-{id}")),
                    child: None,
                    watchdog: None,
                }
            })
            .collect();
        let voters = nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller))
            .collect::<Vec<_>>()
            .join(",");
        for node in &nodes {
            copy_dir(
                &template(n).join(format!("node-{}/data", node.id)),
                &node.dir.join("data"),
            );
            write_properties(node, n, &voters);
        }
        for node in &mut nodes {
            node.spawn();
        }
        let broker = Broker {
            port: nodes[0].client,
            nodes,
            _turn: turn,
            dir: Some(dir),
        };
        broker.wait_ready();
        broker
    }

    /// The bootstrap servers of the clients: every node's client port.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.advertised))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until the metadata names every node as a broker (the controllers have a leader
    /// and every broker registered with it).
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + START;
        let direct = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client))
            .collect::<Vec<_>>()
            .join(",");
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &direct)
            .set("log_level", "0")
            .create()
            .expect("a metadata probe");
        loop {
            let alive = self.nodes.iter().filter(|n| n.child.is_some()).count();
            if let Ok(md) = probe.fetch_metadata(None, Duration::from_secs(2)) {
                if md.brokers().len() >= alive {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "Apache Kafka did not come up within {START:?}; its logs: {}",
                self.nodes[0].dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index (0-based, as [`Broker::kill`] takes it) of the node leading `partition` of
    /// `topic`, as the metadata says.
    pub fn leader_of(&self, topic: &str, partition: i32) -> usize {
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("log_level", "0")
            .create()
            .expect("a metadata probe");
        let md = probe
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("the topic's metadata");
        let leader = (md.topics().iter())
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .unwrap_or_else(|| panic!("{topic} has no partition {partition}"))
            .leader();
        (self.nodes.iter())
            .position(|n| n.id as i32 == leader)
            .unwrap_or_else(|| {
                panic!("{topic}/{partition} has no leader among the nodes ({leader})")
            })
    }

    /// The index of the node coordinating consumer group `group`: the leader of its partition
    /// of `__consumer_offsets` (the Java hash of the group's name, its absolute value, modulo
    /// the six partitions the nodes give that topic).
    pub fn coordinator_of(&self, group: &str) -> usize {
        let hash = group
            .encode_utf16()
            .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
        let partition = if hash == i32::MIN { 0 } else { hash.abs() } % 6;
        self.leader_of("__consumer_offsets", partition)
    }

    /// How many nodes this broker has.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Kills node `index` (0-based) with `SIGKILL`: its data stays.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Starts node `index` again on its data.
    pub fn restart(&mut self, index: usize) {
        self.nodes[index].spawn();
    }

    /// Freezes node `index` (`SIGSTOP`) or thaws it (`SIGCONT`).
    pub fn freeze(&self, index: usize, frozen: bool) {
        let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        if let Some(child) = &self.nodes[index].child {
            // SAFETY: kill(2) with the pid of a child this harness started and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!(
                    "the brokers' logs and data are kept in {}",
                    dir.keep().display()
                );
            }
        }
    }
}

impl Node {
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "node {} is running", self.id);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .expect("the broker's output file");
        let child = Command::new(java())
            .args(jvm_options())
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                self.dir.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(classpath())
            .arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the output file"))
            .stderr(out)
            .spawn()
            .expect("start Apache Kafka with java");
        // Kills the JVM when this process is gone, and ends when the JVM does.
        let watchdog = Command::new("sh")
            .args([
                "-c",
                r#"while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done; kill -9 "$2" 2>/dev/null"#,
                "watchdog",
            ])
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the broker's watchdog");
        self.child = Some(child);
        self.watchdog = Some(watchdog);
    }

    fn kill(&mut self) {
        for mut child in [self.child.take(), self.watchdog.take()]
            .into_iter()
            .flatten()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The JVM's options: a fixed heap, the serial collector (one GC thread: the machines have two
/// cores to share with the service and the remote), and the JIT's first tier only (a broker
/// answers sooner after its start and spends less CPU compiling; a test's load never needs
/// the second tier's code).
fn jvm_options() -> Vec<String> {
    vec![
        format!("-Xms{HEAP}"),
        format!("-Xmx{HEAP}"),
        "-XX:+UseSerialGC".into(),
        "-XX:TieredStopAtLevel=1".into(),
        "-Djava.awt.headless=true".into(),
    ]
}

/// `SENDLEDGER_KAFKA_LIBS`: the directory of Apache Kafka's jars.
fn libs() -> PathBuf {
    let Some(dir) = std::env::var_os("SENDLEDGER_KAFKA_LIBS") else {
        panic!(
            "Apache Kafka, the broker of this test, is not installed: run the tests with \
             scripts/test (scripts/prereqs fetches it with Maven and sets SENDLEDGER_KAFKA_LIBS)"
        );
    };
    let dir = PathBuf::from(dir);
    assert!(
        has_kafka_jar(&dir),
        "SENDLEDGER_KAFKA_LIBS ({}) holds no Apache Kafka jar: run scripts/prereqs again",
        dir.display()
    );
    dir
}

fn has_kafka_jar(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("kafka_2.13-") && name.ends_with(".jar")
            })
        })
        .unwrap_or(false)
}

fn classpath() -> String {
    format!("{}/*", libs().display())
}

fn java() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) => PathBuf::from(home).join("bin/java"),
        None => PathBuf::from("java"),
    }
}

/// A free loopback port (free when asked; the broker binds it soon after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node's `server.properties` and `log4j2.properties`: warnings to `broker.log`, or what
/// `SENDLEDGER_BROKER_LOG` names (a log4j level, or `LEVEL,logger=LEVEL,...` to set loggers
/// apart, e.g. `WARN,kafka.coordinator.transaction=DEBUG`) when investigating a failure.
fn write_properties(node: &Node, nodes: u32, voters: &str) {
    let replicas = nodes.min(3);
    let min_isr = replicas.min(2);
    let properties = format!(
        "process.roles=broker,controller
node.id={id}
controller.quorum.voters={voters}
listeners=CLIENT://127.0.0.1:{client},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=CLIENT://127.0.0.1:{advertised},INTERNAL://127.0.0.1:{internal}
listener.security.protocol.map=CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={min_isr}
unclean.leader.election.enable=false
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=6
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=6
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
",
        id = node.id,
        client = node.client,
        internal = node.internal,
        controller = node.controller,
        advertised = node.advertised,
        data = node.dir.join("data").display(),
    );
    let levels = std::env::var("SENDLEDGER_BROKER_LOG").unwrap_or_else(|_| "WARN".into());
    let mut levels = levels.split(',');
    let root = levels.next().unwrap_or("WARN");
    let loggers: String = levels
        .filter_map(|l| l.split_once('='))
        .enumerate()
        .map(|(i, (name, level))| format!("logger.l{i}.name={name}\nlogger.l{i}.level={level}\n"))
        .collect();
    let log4j = format!(
        "rootLogger.level={root}
{loggers}rootLogger.appenderRef.file.ref=file
appender.file.type=File
appender.file.name=file
appender.file.fileName={}
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
",
        node.dir.join("broker.log").display()
    );
    std::fs::create_dir_all(&node.dir).unwrap();
    for (name, text) in [
        ("server.properties", properties),
        ("log4j2.properties", log4j),
    ] {
        let mut file = std::fs::File::create(node.dir.join(name)).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }
}

/// The formatted storage of a cluster of `nodes` (`node-1/`, ...), made once per test process
/// with Kafka's storage tool: a node's data is a copy of its template, so no test waits for a
/// JVM to format it. The storage names the cluster and the node, not the ports, which come
/// from each node's properties (`controller.quorum.voters`, a static quorum).
fn template(nodes: u32) -> PathBuf {
    static SINGLE: OnceLock<tempfile::TempDir> = OnceLock::new();
    static CLUSTER: OnceLock<tempfile::TempDir> = OnceLock::new();
    let cell = match nodes {
        1 => &SINGLE,
        3 => &CLUSTER,
        _ => panic!("a test cluster has one node or three, not {nodes}"),
    };
    cell.get_or_init(|| format_template(nodes))
        .path()
        .to_path_buf()
}

fn format_template(nodes: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory for the brokers' template");
    let template: Vec<Node> = (1..=nodes)
        .map(|id| Node {
            id,
            client: 9092,
            internal: 9094,
            controller: 9093,
            advertised: 9092,
            dir: dir.path().join(format!("node-{id}")),
            child: None,
            watchdog: None,
        })
        .collect();
    let voters = (1..=nodes)
        .map(|id| format!("{id}@127.0.0.1:9093"))
        .collect::<Vec<_>>()
        .join(",");
    let formats: Vec<(u32, Child)> = template
        .iter()
        .map(|node| {
            write_properties(node, nodes, &voters);
            let child = Command::new(java())
                .args(["-Xmx256m", "-cp", &classpath(), "kafka.tools.StorageTool"])
                .args(["format", "--ignore-formatted", "-t", CLUSTER_ID, "-c"])
                .arg(node.dir.join("server.properties"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run Kafka's storage tool with java");
            (node.id, child)
        })
        .collect();
    for (id, child) in formats {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "formatting node {id}'s storage failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// Copies the files of `from` (one level: a formatted log directory) into `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        assert!(
            entry.file_type().unwrap().is_file(),
            "{} is not a file",
            entry.path().display()
        );
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
