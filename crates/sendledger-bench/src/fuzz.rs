//! `sendledger-bench fuzz`: a generator-driven fuzzer of every input boundary, counted like a
//! benchmark. Each target starts from valid seeds, mutates them with a seeded RNG (bit flips,
//! byte inserts and deletes, splices of two seeds, boundary integers, big length prefixes,
//! long strings, deep nesting, tokens of the input's language), and feeds every input to the
//! boundary under `catch_unwind`. A boundary must answer any input with a value or an error:
//! a panic, or a value that does not survive its own round trip, is a finding.
//!
//! Not coverage-guided (the cargo-fuzz targets in `fuzz/` are, and call [`Target::exercise`]):
//! the inputs are a pure function of the seed, so a run is reproducible and runs in the tests. Inputs run on a thread with a 2 MiB stack, what the
//! service's worker threads have.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use sendledger_core::canonical::canonical_text;
use sendledger_core::{Identity, Limits, ResolveBody, TaskRequest};
use sendledger_kafka::records::{
    event_from_json, event_from_record, event_record, event_record_json, EventRecord,
};
use sendledger_store::envelope::{decode_event, encode_event, EVENT_V1};
use sha2::{Digest, Sha256};

use sendledger_node::config::Config;

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Inputs per target instead of a time budget (the same seed then gives the same run).
    #[arg(long)]
    iterations: Option<u64>,
    /// Seed of the generated inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fuzz only this target (repeatable); all by default.
    #[arg(long = "target", value_enum)]
    targets: Vec<Target>,
    /// Where an input that panicked is saved, as `<target>/<sha256 prefix>.bin`.
    #[arg(long, default_value = "tests/fixtures/fuzz")]
    crashes: PathBuf,
    /// Only write each target's seeds into `DIR/<target>/` (a starting corpus for
    /// `cargo fuzz`), and fuzz nothing.
    #[arg(long, value_name = "DIR")]
    seeds_into: Option<PathBuf>,
}

/// An input boundary of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// A requests-topic message value: `TaskRequest::from_json`, then `accept`.
    Request,
    /// A stored ledger value: `envelope::decode_event`.
    Event,
    /// An events-topic record, as `audit --from-kafka` reads it: JSON, then `event_from_record`.
    EventRecord,
    /// The configuration file: `Config::parse` (what `run --config` loads).
    Config,
    /// The body of `POST /reviews/{id}`: JSON `ResolveBody`, then `resolution()`.
    ReviewBody,
}

impl Target {
    pub const ALL: [Target; 5] = [
        Target::Request,
        Target::Event,
        Target::EventRecord,
        Target::Config,
        Target::ReviewBody,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Request => "request",
            Target::Event => "event",
            Target::EventRecord => "event-record",
            Target::Config => "config",
            Target::ReviewBody => "review-body",
        }
    }

    /// Feeds `input` to the boundary. Panics when the boundary does (a finding), or when a
    /// value it accepted does not come back from its own encoding.
    pub fn exercise(self, input: &[u8]) {
        match self {
            Target::Request => {
                let Ok(request) = TaskRequest::from_json(input) else {
                    return;
                };
                let Ok(accepted) = request.accept(&Limits::default()) else {
                    return;
                };
                let address = accepted.identity.to_string();
                let parsed: Identity = address.parse().expect("an identity address parses back");
                assert_eq!(parsed, accepted.identity, "address {address}");
                let again = canonical_text(&accepted.payload).expect("a stored payload is JSON");
                assert_eq!(again, accepted.payload, "canonical payload is stable");
                assert_eq!(
                    accepted.payload_value(),
                    request.payload,
                    "the stored payload is the request's"
                );
            }
            Target::Event => {
                // The stored LSN is the first field after the version byte; use it as the key.
                let lsn = input
                    .get(1..9)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
                if let Ok(event) = decode_event(lsn, input) {
                    let again = decode_event(lsn, &encode_event(&event));
                    assert_eq!(again.ok().as_ref(), Some(&event), "event round trip");
                }
            }
            Target::EventRecord => {
                let Ok(record) = serde_json::from_slice::<EventRecord>(input) else {
                    return;
                };
                if let Ok(event) = event_from_record(&record) {
                    let json = serde_json::to_vec(&record).expect("a record serializes");
                    let direct = event_from_json(&json);
                    assert_eq!(direct.ok().as_ref(), Some(&event), "both decoders agree");
                    let again = event_record(&event).and_then(|r| event_from_record(&r));
                    assert_eq!(again.ok().as_ref(), Some(&event), "record round trip");
                }
            }
            Target::Config => {
                let _ = Config::parse(&String::from_utf8_lossy(input), &BTreeMap::new());
            }
            Target::ReviewBody => {
                if let Ok(body) = serde_json::from_slice::<ResolveBody>(input) {
                    let _ = body.resolution();
                }
            }
        }
    }

    /// Valid inputs the mutations start from.
    pub fn seeds(self) -> Vec<Vec<u8>> {
        match self {
            Target::Request => {
                let mut seeds: Vec<Vec<u8>> = (0..4)
                    .map(|n| {
                        serde_json::to_vec(&crate::ledger::bench_request(n, "payments"))
                            .expect("a request serializes")
                    })
                    .collect();
                seeds.push(
                    br#"{"tenant":"acme","operation":"payment.create","request_key":"ord/7%2F","target":"payments","payload":{"amount":100.00,"big":1e400,"iban":12345678901234567890123,"n":[1E2,-0,{"x":null,"y":true}],"s":"\u00e9\u0000"},"metadata":{"trace":"abc"}}"#
                        .to_vec(),
                );
                seeds
            }
            Target::Event => {
                let mut seeds: Vec<Vec<u8>> =
                    sample_events().iter().map(encode_event).collect();
                // The same bytes under the first envelope version.
                seeds.push([&[EVENT_V1], &seeds[0][1..]].concat());
                seeds
            }
            Target::EventRecord => sample_events()
                .iter()
                .map(|e| event_record_json(e).expect("a record serializes"))
                .collect(),
            Target::Config => vec![
                include_bytes!("../../../schemas/sendledger.example.toml").to_vec(),
                b"[storage]\ndata = \"/tmp/l\"\ndurability = \"buffered\"\n[engine]\nworkers = 4\ntimer_tick = \"50ms\"\n[kafka]\nbrokers = \"embedded\"\n[kafka.properties]\n\"sasl.password\" = \"x\"\n[admin]\ntoken = \"t\"\n[targets.payments]\nurl = \"http://127.0.0.1:8600/records/{request_key}\"\nbody_fields = { reference = \"{task_id}\" }\n[targets.payments.lookup]\nurl = \"http://127.0.0.1:8600/records?reference={task_id}\"\n".to_vec(),
            ],
            Target::ReviewBody => [
                r#"{"as":"succeeded","remote_id":"X","by":"ana","reason":"seen at the remote"}"#,
                r#"{"as":"failed","by":"ana","reason":"refunded"}"#,
                r#"{"resend":true,"by":"ana","reason":"not there"}"#,
            ]
            .map(|s| s.as_bytes().to_vec())
            .to_vec(),
        }
    }
}

fn sample_events() -> Vec<sendledger_core::Event> {
    crate::audit::sample_events(7, 400)
}

/// How long each target runs.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    Seconds(f64),
    Iterations(u64),
}

/// An input on which a target panicked.
#[derive(Debug)]
pub struct Finding {
    pub input: Vec<u8>,
    pub message: String,
}

/// One target's run.
#[derive(Debug)]
pub struct TargetRun {
    pub target: Target,
    pub executions: u64,
    pub seconds: f64,
    pub findings: Vec<Finding>,
}

/// Fuzzes `target` for `budget` with inputs generated from `seed`.
pub fn fuzz(target: Target, budget: Budget, seed: u64) -> TargetRun {
    on_worker_stack(move || {
        // A mutated configuration may be valid with warnings: not one log line per input.
        let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
        let seeds = target.seeds();
        let mut rng = StdRng::seed_from_u64(seed ^ target as u64);
        let started = Instant::now();
        let mut run = TargetRun {
            target,
            executions: 0,
            seconds: 0.0,
            findings: Vec::new(),
        };
        loop {
            let done = match budget {
                Budget::Iterations(n) => run.executions >= n,
                // Reading the clock every input would cost more than some inputs do.
                Budget::Seconds(s) => {
                    run.executions % 64 == 0 && started.elapsed().as_secs_f64() >= s
                }
            };
            if done {
                break;
            }
            let input = mutate(&mut rng, &seeds);
            if let Err(message) = replay(target, &input) {
                run.findings.push(Finding { input, message });
            }
            run.executions += 1;
        }
        run.seconds = started.elapsed().as_secs_f64();
        run
    })
}

/// Runs one input; `Err` holds the panic message.
pub fn replay(target: Target, input: &[u8]) -> Result<(), String> {
    install_panic_capture();
    CAPTURING.set(true);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| target.exercise(input)));
    CAPTURING.set(false);
    outcome.map_err(|_| PANIC_MESSAGE.take())
}

fn on_worker_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .name("fuzz".into())
        .stack_size(2 << 20)
        .spawn(f)
        .expect("spawning the fuzz thread")
        .join()
        .unwrap_or_else(|e| panic::resume_unwind(e))
}

thread_local! {
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static PANIC_MESSAGE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Keeps the panics of fuzzed inputs off stderr (there may be thousands) and records their
/// message and location; other panics go to the previous hook.
fn install_panic_capture() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CAPTURING.get() {
                PANIC_MESSAGE.set(info.to_string());
            } else {
                previous(info);
            }
        }));
    });
}

/// Inputs grow to at most this (a long string is 70,000 bytes, over the payload limit).
const MAX_INPUT: usize = 256 * 1024;

/// Integers at the edges of their types, and lengths no input can back.
const BOUNDARY_INTS: [u64; 12] = [
    0,
    1,
    0x7f,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 60,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// Fragments of the inputs' languages (JSON, TOML) and values at their edges.
const TOKENS: &[&str] = &[
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "=",
    "\n",
    ".",
    "null",
    "true",
    "-0",
    "1e400",
    "-1e-400",
    "18446744073709551616",
    "-9223372036854775809",
    "0.000000000000000000000001",
    "NaN",
    "inf",
    "-nan",
    "\"\"\"",
    "'''",
    "[[targets.x]]",
    "[targets.x]",
    "[targets.x.lookup]",
    "1979-05-27T07:32:00Z",
    "0x7fffffff",
    "1_000",
    "\"2s\"",
    "\"0s\"",
    "\"99999999999999999999h\"",
    "{task_id}",
    "{tenant}",
    "%2F",
    "%25",
    "%",
    "/",
    "..",
    "\u{feff}",
    "é",
    "\u{10ffff}",
    "\"payload_hash\":\"zz\"",
    "\"raw\":1",
    "\"as\":\"succeeded\"",
    "\"resend\":true",
    "\"remote_id\":\"\"",
];

/// One generated input: a seed, or a splice of two, with one to eight mutations.
fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut input = seeds.choose(rng).expect("targets have seeds").clone();
    for _ in 0..rng.random_range(1..=8) {
        let at = rng.random_range(0..=input.len());
        match rng.random_range(0..11) {
            0 if !input.is_empty() => {
                let i = at.min(input.len() - 1);
                input[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !input.is_empty() => {
                let i = at.min(input.len() - 1);
                input[i] = rng.random();
            }
            2 => {
                let n = rng.random_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                input.splice(at..at, bytes);
            }
            3 => {
                let end = (at + rng.random_range(1..=32)).min(input.len());
                input.drain(at..end);
            }
            4 => {
                // Copy a stretch of the input elsewhere in it.
                let end = (at + rng.random_range(1..=64)).min(input.len());
                let stretch = input[at..end].to_vec();
                let to = rng.random_range(0..=input.len());
                input.splice(to..to, stretch);
            }
            5 => {
                // The head of this input, the tail of another seed.
                let other = seeds.choose(rng).expect("targets have seeds");
                let from = rng.random_range(0..=other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            6 | 7 => {
                // A boundary integer over 1, 2, 4 or 8 bytes, little endian: bincode's
                // integers and length prefixes.
                let value = *BOUNDARY_INTS.choose(rng).expect("not empty");
                let width = *[1, 2, 4, 8].choose(rng).expect("not empty");
                let bytes = value.to_le_bytes();
                let end = (at + width).min(input.len());
                input.splice(at..end, bytes[..width].iter().copied());
            }
            8 => {
                let token = TOKENS.choose(rng).expect("not empty");
                input.splice(at..at, token.bytes());
            }
            9 => {
                let long = match rng.random_range(0..3) {
                    0 => "a".repeat(70_000),
                    1 => "é".repeat(300),
                    _ => "x".repeat(257),
                };
                input.splice(at..at, long.bytes());
            }
            _ => {
                let depth = rng.random_range(1..=2_000);
                let (open, close) = *[("[", "]"), ("{\"a\":", "}"), ("a={", "}")]
                    .choose(rng)
                    .expect("not empty");
                let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
                input.splice(at..at, nested.bytes());
            }
        }
        input.truncate(MAX_INPUT);
    }
    input
}

/// The first 8 bytes of the input's SHA-256, in hex: a file name per distinct input.
fn short_hash(input: &[u8]) -> String {
    Sha256::digest(input)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn run(args: FuzzArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.seeds_into {
        for target in Target::ALL {
            let dir = dir.join(target.name());
            std::fs::create_dir_all(&dir)?;
            for seed in target.seeds() {
                std::fs::write(dir.join(format!("{}.bin", short_hash(&seed))), seed)?;
            }
        }
        return Ok(());
    }
    let budget = match args.iterations {
        Some(n) => Budget::Iterations(n),
        None => {
            anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
            Budget::Seconds(args.seconds)
        }
    };
    let targets = if args.targets.is_empty() {
        Target::ALL.to_vec()
    } else {
        args.targets
    };
    let mut report = serde_json::Map::new();
    let (mut executions, mut panics, mut seconds) = (0, 0, 0.0);
    for target in targets {
        eprintln!("fuzzing {}", target.name());
        let run = fuzz(target, budget, args.seed);
        let dir = args.crashes.join(target.name());
        let mut saved = Vec::new();
        for finding in &run.findings {
            let path = dir.join(format!("{}.bin", short_hash(&finding.input)));
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&path, &finding.input))
                .with_context(|| format!("saving a crashing input to {}", path.display()))?;
            eprintln!("{}: {}", path.display(), finding.message);
            saved.push(path.display().to_string());
        }
        saved.sort();
        saved.dedup();
        executions += run.executions;
        panics += run.findings.len();
        seconds += run.seconds;
        report.insert(
            target.name().into(),
            serde_json::json!({
                "executions": run.executions,
                "panics": run.findings.len(),
                "seconds": (run.seconds * 10.0).round() / 10.0,
                "executions_per_sec": (run.executions as f64 / run.seconds.max(1e-9)).round(),
                "saved": saved,
            }),
        );
    }
    let report = serde_json::json!({
        "bench": "fuzz",
        "seed": args.seed,
        "executions": executions,
        "panics": panics,
        "seconds": (seconds * 10.0).round() / 10.0,
        "targets": report,
    });
    println!("{report}");
    Ok(())
}
