//! The test harness of sendledger's workspace tests: shared by the integration tests
//! (`tests/it/`), the chaos soaks (`tests/soak/`) and the child processes they start
//! (`src/bin/`).
//!
//! - the crate root: the events of the crash tests' writers ([`crash_event`]), the seed of a
//!   randomized test ([`seed`]) and the fields of a server's `ready` line ([`ready_field`]);
//! - [`engine`]: targets pointing at a simulated remote, engines on a temporary directory,
//!   requests, waiting for a task;
//! - [`effects`]: one target against the simulated remote, for the attempt and lookup tests;
//! - [`pki`]: a CA and the certificates it signs, made at test time;
//! - [`broker`]: Apache Kafka, one node or a cluster of three, started from the jars
//!   `scripts/prereqs` fetched, killed, frozen and restarted by the tests;
//! - [`kafka`]: the embedded cluster, relays in front of Apache Kafka (one that cuts
//!   connections, one that terminates TLS), the engine with its
//!   ingest and publisher, producing requests, reading results and events back, and the
//!   assertions the Kafka tests share;
//! - [`cluster`]: kafka mode as deployed: `sendledger run` processes in one consumer group,
//!   the timeline of who owned which partition when (read from their logs), a steady stream of
//!   requests, a follower of the results topic, and the check that every task settled once;
//! - [`outage`]: a remote that goes down in the middle of a stream of tasks, and what the
//!   tasks end as, against the simulated remote or json-server, a real HTTP server;
//! - [`fault_proxy`]: a proxy in front of a real HTTP server, switched at run time between
//!   passing and refusing connections, dropping, 503-ing or hanging each POST;
//! - [`http`]: one HTTP request to the admin endpoint or the simulated remote;
//! - [`process`]: a command that must succeed, `sendledger run` up to its `ready` line;
//! - [`kill`]: an engine child process SIGKILLed while its requests are in flight and started
//!   again, until a last run settles every task;
//! - [`browser`]: a headless Chromium driven through the DevTools protocol.
//!
//! Nothing here knows where the test binaries are (`CARGO_BIN_EXE_*` is set only when
//! integration tests are compiled): what starts `sendledger` is given its path.

use sendledger_core::{EventBody, NewEvent, TaskId};

pub mod broker;
pub mod browser;
pub mod cluster;
pub mod effects;
pub mod fault_proxy;
pub mod http;
pub mod kafka;
pub mod kafka_relay;
pub mod kill;
pub mod outage;
pub mod process;

/// The seed of a randomized test: `SENDLEDGER_TEST_SEED` when set, else the given default.
/// Printed, so that a failure can be reproduced.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("SENDLEDGER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("seed = {seed} (set SENDLEDGER_TEST_SEED to reproduce)");
    seed
}

/// The value after `prefix` in a `ready` line (`brokers=`, `admin=http://`, ...).
pub fn ready_field(line: &str, prefix: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {line:?}"))
        .to_string()
}

/// The body of the `seq`-th event of writer task `task` in the crash tests. Deterministic, so
/// the verifier knows exactly what every stored event must contain; sizes vary from a few
/// bytes to a few kilobytes so that torn writes would show.
pub fn crash_body(task: u32, seq: u32) -> EventBody {
    let len = ((task as usize * 7919 + seq as usize * 104_729) % 4096) + 1;
    let fill = char::from(b'a' + ((task + seq) % 26) as u8);
    EventBody::OperatorNote {
        who: format!("writer-{task}"),
        text: format!("{seq}:{}", fill.to_string().repeat(len)),
    }
}

/// The task id of writer task `task` in the crash tests.
pub fn crash_task(task: u32) -> TaskId {
    TaskId::derive("crash", "append", &task.to_string())
}

pub fn crash_event(task: u32, seq: u32, at: u64) -> NewEvent {
    NewEvent {
        task_id: crash_task(task),
        task_seq: seq,
        at,
        body: crash_body(task, seq),
    }
}

pub mod engine {
    //! Helpers of the engine tests: targets pointing at a simulated remote, waiting for tasks.

    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use sendledger_actors::{Engine, EngineConfig};
    use sendledger_core::{Phase, Source, State, TaskId, TaskRequest};
    use sendledger_effects::{TargetConfig, Targets};
    use sendledger_node::wiring::HttpRemote;

    /// A target creating records at `base` (a simulated remote), with fast timeouts and a
    /// lookup by `reference`, the task id. The body also carries the `request_key`, the
    /// simulated remote's default identity field. Adjust the JSON with `tweak` before it is
    /// parsed.
    pub fn target(base: &str, tweak: impl FnOnce(&mut serde_json::Value)) -> TargetConfig {
        let mut value = serde_json::json!({
            "url": format!("{base}/records"),
            "connect_timeout": "500ms",
            "request_timeout": "400ms",
            "body_fields": { "request_key": "{request_key}", "reference": "{task_id}" },
            "retry": { "max_attempts": 5, "initial_backoff": "20ms", "max_backoff": "200ms", "multiplier": 2.0 },
            "lookup": {
                "url": format!("{base}/records?reference={{task_id}}"),
                "first_check": "50ms",
                "check_interval": "100ms",
                "deadline": "3s"
            }
        });
        tweak(&mut value);
        serde_json::from_value(value).expect("valid target config")
    }

    pub fn targets(target: TargetConfig) -> Targets {
        Targets::from_config(&BTreeMap::from([("sim".to_string(), target)])).expect("valid targets")
    }

    /// The targets a child process is given as JSON, and the target or saga its tasks name:
    /// the one target `sim`, or `{"targets": {...}, "sagas": {...}, "target": NAME}`.
    pub fn child_targets(json: &str) -> (Targets, String) {
        let setup: serde_json::Value = serde_json::from_str(json).expect("TARGET_JSON");
        let Some(all) = setup.get("targets") else {
            let one = serde_json::from_value(setup).expect("a target");
            return (targets(one), "sim".to_string());
        };
        let all = serde_json::from_value(all.clone()).expect("targets");
        let sagas = serde_json::from_value(setup["sagas"].clone()).expect("sagas");
        let targets = Targets::from_config(&all).expect("valid targets");
        let name = setup["target"].as_str().expect("target").to_string();
        (targets.with_sagas(&sagas).expect("valid sagas"), name)
    }

    /// Starts an engine on `dir` with the one target `sim` (blocking; call outside async code
    /// or within `block_in_place`).
    pub fn start(dir: &std::path::Path, target: TargetConfig) -> Engine {
        start_with(dir, targets(target))
    }

    /// Starts an engine on `dir` with these targets (blocking, as [`start`]).
    pub fn start_with(dir: &std::path::Path, targets: Targets) -> Engine {
        let mut config = EngineConfig::new(dir);
        config.timer_tick = Duration::from_millis(5);
        Engine::start(config, Arc::new(HttpRemote::new(targets))).expect("engine starts")
    }

    pub fn request(key: &str) -> TaskRequest {
        TaskRequest {
            tenant: "acme".into(),
            operation: "payment.create".into(),
            request_key: key.into(),
            target: "sim".into(),
            payload: serde_json::json!({ "amount": 1250, "currency": "EUR" }),
            payload_text: None,
            metadata: Default::default(),
            version: 0,
        }
    }

    pub fn source(offset: i64) -> Source {
        Source {
            topic: "test".into(),
            partition: 0,
            offset,
        }
    }

    pub fn task_id(key: &str) -> TaskId {
        TaskId::derive("acme", "payment.create", key)
    }

    /// The task reference of a request key, as `tenant/operation/request_key` URL-encoded.
    pub fn task_ref(key: &str) -> String {
        format!("acme%2Fpayment.create%2F{key}")
    }

    /// Polls a task until `done` holds, or panics with its timeline after `timeout`.
    pub async fn wait_for(
        engine: &Engine,
        task: TaskId,
        timeout: Duration,
        done: impl Fn(&State) -> bool,
    ) -> State {
        let deadline = Instant::now() + timeout;
        loop {
            let state = engine.state(task).await.expect("read task");
            if done(&state) {
                return state;
            }
            if Instant::now() > deadline {
                let events = engine.events(task).await.unwrap_or_default();
                let timeline: Vec<String> = events
                    .iter()
                    .map(|e| format!("{} {:?}", e.at, e.body))
                    .collect();
                panic!(
                    "task {task} still {:?} after {timeout:?}:\n{}",
                    state.phase,
                    timeline.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes `history` as task `key`'s events to the ledger at `dir`, each recorded as its task
    /// actor records a decision (summary, indexes); returns the task's state after it.
    pub async fn write_history(
        dir: &std::path::Path,
        key: &str,
        history: Vec<sendledger_core::EventBody>,
    ) -> sendledger_core::State {
        let ledger = sendledger_store::Ledger::open(dir, Default::default()).unwrap();
        let mut state = sendledger_core::State::default();
        for body in history {
            let decision = sendledger_core::Decision {
                events: vec![body],
                action: sendledger_core::Action::None,
            };
            let (next, append) =
                sendledger_actors::task::record(task_id(key), &state, &decision, 1);
            ledger.append(append).await.unwrap();
            state = next;
        }
        state
    }

    pub fn settled(state: &State) -> bool {
        state.phase.is_terminal() || state.phase == Phase::ManualReview
    }
}

pub mod pki {
    //! Certificates made at test time: a CA, and server or client certificates it signs,
    //! written as PEM files into a directory of the test's choosing.

    use std::path::{Path, PathBuf};

    use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair};

    /// A certificate authority whose files live in `dir`.
    pub struct Ca {
        dir: PathBuf,
        name: String,
        cert: Certificate,
        key: KeyPair,
    }

    /// A certificate and its private key, as PEM files.
    pub struct Issued {
        pub cert: PathBuf,
        pub key: PathBuf,
    }

    impl Ca {
        /// A new CA named `name`; its certificate is written to `<dir>/<name>-ca.pem`.
        pub fn new(dir: &Path, name: &str) -> Ca {
            let key = KeyPair::generate().expect("ca key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
            params.distinguished_name.push(
                rcgen::DnType::CommonName,
                format!("sendledger test CA {name}"),
            );
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let cert = params.self_signed(&key).expect("ca certificate");
            let ca = Ca {
                dir: dir.to_path_buf(),
                name: name.to_string(),
                cert,
                key,
            };
            std::fs::write(ca.ca_file(), ca.cert.pem()).expect("write ca certificate");
            ca
        }

        /// The PEM file of the CA's certificate.
        pub fn ca_file(&self) -> PathBuf {
            self.dir.join(format!("{}-ca.pem", self.name))
        }

        /// A certificate for `names` (DNS names or IP addresses), valid from now on, written
        /// to `<dir>/<CA name>-<file>.pem` and `<dir>/<CA name>-<file>-key.pem`.
        pub fn issue(&self, file: &str, names: &[&str]) -> Issued {
            self.issue_with(file, names, |_| {})
        }

        /// As [`Ca::issue`], with the parameters adjusted first (validity, say).
        pub fn issue_with(
            &self,
            file: &str,
            names: &[&str],
            adjust: impl FnOnce(&mut CertificateParams),
        ) -> Issued {
            let key = KeyPair::generate().expect("key");
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let mut params = CertificateParams::new(names).expect("certificate params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, file);
            adjust(&mut params);
            let cert = params
                .signed_by(&key, &self.cert, &self.key)
                .expect("certificate");
            let issued = Issued {
                cert: self.dir.join(format!("{}-{file}.pem", self.name)),
                key: self.dir.join(format!("{}-{file}-key.pem", self.name)),
            };
            std::fs::write(&issued.cert, cert.pem()).expect("write certificate");
            std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
            issued
        }
    }
}

/// A counter or gauge's value in Prometheus text (its unlabelled sample).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
