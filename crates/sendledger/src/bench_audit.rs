//! `sendledger bench audit`: generates a realistic ledger of N events, then audits it in a
//! child process (`sendledger audit --json`) and reports the audit's events per second and the
//! child's peak resident memory, read from the kernel (`wait4` rusage) rather than estimated.
//!
//! The log is written through the ledger's journal in large batches without fsync
//! (`buffered`): the generated log is test data, and its write speed is not what is measured.
//! Tasks interleave as in a running service (`--in-flight` tasks progress together), and follow
//! the paths a real ledger holds: mostly accepted → intended → succeeded; throttled and retried;
//! unknown and confirmed by lookup; unknown and resent with the same idempotency key; rejected;
//! failed after attempts that never left; manual reviews resolved by an operator or an
//! authorized resend; some still unknown at the end; duplicate deliveries (also after the
//! result), conflicting payloads and invalid input messages.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sendledger_core::{
    EventBody, Evidence, Limits, NewEvent, NotSentCause, PayloadHash, ReviewReason, Source, State,
    TaskId, UnknownCause,
};
use sendledger_store::{Append, Durability, Ledger, LedgerOptions, TaskSummary};

use crate::bench::bench_request;

#[derive(Args)]
pub struct AuditArgs {
    /// Events in the generated log.
    #[arg(long, default_value_t = 5_000_000)]
    events: u64,
    /// Tasks progressing together while the log is generated: how far apart one task's events
    /// are in the log.
    #[arg(long, default_value_t = 1_000)]
    in_flight: usize,
    /// Seed of the generated log.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the generated ledger (a temporary directory by default); it takes about
    /// 100 bytes per event.
    #[arg(long)]
    dir: Option<PathBuf>,
}

const EVENTS_PER_APPEND: usize = 20_000;
const START_MS: u64 = 1_750_000_000_000;

/// A task being generated: its remaining events, and its fold so far for its summary.
struct Live {
    id: TaskId,
    script: VecDeque<EventBody>,
    state: State,
}

struct Generator {
    rng: StdRng,
    tasks: u64,
    at: u64,
}

impl Generator {
    fn source(&mut self, n: u64) -> Source {
        Source {
            topic: "sendledger.requests".into(),
            partition: (n % 8) as i32,
            offset: (n / 8) as i64,
        }
    }

    /// A new task's first event and the rest of its script.
    fn task(&mut self) -> (NewEvent, VecDeque<EventBody>, Option<(TaskId, PayloadHash)>) {
        let n = self.tasks;
        self.tasks += 1;
        let at = self.at;
        let source = self.source(n);
        if self.rng.random_ratio(1, 200) {
            let id = TaskId::for_rejected_input(&source.topic, source.partition, source.offset);
            let body = EventBody::InputRejected {
                source,
                reason: "invalid request JSON: missing field `target`".into(),
                raw: format!(r#"{{"tenant":"bench","request_key":"ord-{n}"}}"#).into_bytes(),
            };
            let first = NewEvent {
                task_id: id,
                task_seq: 0,
                at,
                body,
            };
            return (first, VecDeque::new(), None);
        }
        let request = bench_request(n, "payments")
            .accept(&Limits::default())
            .expect("valid bench request");
        let (id, hash) = (request.task_id(), request.payload_hash());
        let first = NewEvent {
            task_id: id,
            task_seq: 0,
            at,
            body: EventBody::TaskAccepted {
                request,
                payload_hash: hash,
                source,
            },
        };
        let mut script = self.script(n, at);
        if self.rng.random_ratio(15, 100) {
            let at_step = self.rng.random_range(0..=script.len());
            let dup = EventBody::DuplicateDelivery {
                source: self.source(n + 1_000_003),
            };
            script.insert(at_step, dup);
        }
        if self.rng.random_ratio(1, 100) {
            script.push_back(EventBody::RequestConflict {
                source: self.source(n + 2_000_003),
                payload_hash: PayloadHash([7; 32]),
            });
        }
        (first, script, Some((id, hash)))
    }

    fn script(&mut self, n: u64, at: u64) -> VecDeque<EventBody> {
        use EventBody::*;
        let intend = |attempt, key: Option<&String>| SendIntended {
            attempt,
            idempotency_key: key.cloned(),
        };
        let remote_id = format!("r-{n}");
        let ok = |status| Confirmed {
            remote_id: remote_id.clone(),
            evidence: Evidence::Response { status },
        };
        let lookup = |matches: Vec<String>, next: Option<u64>| LookupPerformed {
            matches,
            next_check_at: next,
        };
        let unknown = |attempt, cause| SendUnknown { attempt, cause };
        let key = format!("idem-{n}");
        let roll = self.rng.random_range(0..1000);
        let script = match roll {
            0..620 => vec![intend(1, None), ok(201)],
            620..720 => vec![
                intend(1, None),
                SendNotSent {
                    attempt: 1,
                    cause: NotSentCause::Throttled { status: 429 },
                    retry_at: at + 1_000,
                },
                intend(2, None),
                ok(201),
            ],
            720..820 => vec![
                intend(1, None),
                unknown(1, UnknownCause::Timeout),
                lookup(vec![], Some(at + 5_000)),
                lookup(vec![remote_id.clone()], None),
                Confirmed {
                    remote_id: remote_id.clone(),
                    evidence: Evidence::Lookup,
                },
            ],
            820..860 => vec![
                intend(1, Some(&key)),
                unknown(1, UnknownCause::ResetAfterWrite("connection reset".into())),
                intend(2, Some(&key)),
                ok(200),
            ],
            860..900 => vec![
                intend(1, None),
                Rejected {
                    status: 422,
                    detail: r#"{"error":"currency not supported"}"#.into(),
                },
            ],
            900..920 => vec![
                intend(1, None),
                unknown(1, UnknownCause::Status(503)),
                lookup(vec![], Some(at + 5_000)),
                lookup(vec![], Some(at + 10_000)),
                ManualReviewRequired {
                    reason: ReviewReason::DeadlinePassed { lookups: 2 },
                },
                ResendAuthorized {
                    by: "oncall".into(),
                    reason: "not at the remote after the deadline".into(),
                },
                intend(2, None),
                ok(201),
            ],
            920..930 => {
                let ids = vec![remote_id.clone(), format!("r-{n}-dup")];
                vec![
                    intend(1, None),
                    unknown(1, UnknownCause::Timeout),
                    lookup(ids.clone(), None),
                    ManualReviewRequired {
                        reason: ReviewReason::MultipleMatches { remote_ids: ids },
                    },
                    Confirmed {
                        remote_id: remote_id.clone(),
                        evidence: Evidence::Operator {
                            by: "oncall".into(),
                            reason: "kept the first record, refunded the second".into(),
                        },
                    },
                ]
            }
            930..950 => {
                let mut s = Vec::new();
                for attempt in 1..=3 {
                    s.push(intend(attempt, None));
                    s.push(SendNotSent {
                        attempt,
                        cause: NotSentCause::Connect("connection refused".into()),
                        retry_at: at + 1_000 * u64::from(attempt),
                    });
                }
                s.push(Failed {
                    reason: "3 attempts, none reached the remote".into(),
                });
                s
            }
            950..960 => vec![
                intend(1, None),
                unknown(1, UnknownCause::Recovery),
                lookup(vec![remote_id.clone()], None),
                Confirmed {
                    remote_id: remote_id.clone(),
                    evidence: Evidence::Lookup,
                },
            ],
            960..975 => vec![
                intend(1, None),
                unknown(1, UnknownCause::Timeout),
                lookup(vec![], Some(at + 5_000)),
            ],
            _ => vec![
                intend(1, None),
                OperatorNote {
                    who: "oncall".into(),
                    text: "slow remote today".into(),
                },
                ok(201),
            ],
        };
        script.into()
    }
}

struct Generated {
    events: u64,
    tasks: u64,
}

fn generate(ledger: &Ledger, args: &AuditArgs) -> anyhow::Result<Generated> {
    let mut gen = Generator {
        rng: StdRng::seed_from_u64(args.seed),
        tasks: 0,
        at: START_MS,
    };
    let mut live: Vec<Live> = Vec::with_capacity(args.in_flight);
    let mut append = Append::default();
    let mut written = 0u64;
    // Events scripted for the live tasks and not yet written.
    let mut remaining = 0usize;
    while written < args.events {
        let budget = (args.events - written) as usize;
        while append.events.len() < EVENTS_PER_APPEND.min(budget) {
            gen.at += 1;
            // Keep `in_flight` tasks going while there are events left to write for them.
            if live.len() < args.in_flight && append.events.len() + remaining < budget {
                let (first, script, identity) = gen.task();
                remaining += script.len();
                let mut state = State::default();
                state.apply(first.task_id, first.at, &first.body);
                if let (Some((id, hash)), EventBody::TaskAccepted { request, .. }) =
                    (identity, &first.body)
                {
                    append.identities.push((request.identity.clone(), id, hash));
                }
                live.push(Live {
                    id: first.task_id,
                    script,
                    state,
                });
                append.events.push(first);
                continue;
            }
            let i = gen.rng.random_range(0..live.len());
            let task = &mut live[i];
            let Some(body) = task.script.pop_front() else {
                let done = live.swap_remove(i);
                append.tasks.push((done.id, summary(&done.state)));
                continue;
            };
            remaining -= 1;
            let event = NewEvent {
                task_id: task.id,
                task_seq: task.state.next_seq,
                at: gen.at,
                body,
            };
            task.state.apply(event.task_id, event.at, &event.body);
            append.events.push(event);
        }
        live.retain(|l| {
            append.tasks.push((l.id, summary(&l.state)));
            !l.script.is_empty()
        });
        written += append.events.len() as u64;
        ledger
            .append_blocking(std::mem::take(&mut append))
            .context("writing the generated log")?;
    }
    Ok(Generated {
        events: written,
        tasks: gen.tasks,
    })
}

fn summary(state: &State) -> TaskSummary {
    TaskSummary {
        phase: state.phase,
        next_seq: state.next_seq,
    }
}

/// The audit's JSON report, exit status and peak RSS, from a child `sendledger audit`.
struct ChildAudit {
    report: serde_json::Value,
    seconds: f64,
    peak_rss_bytes: u64,
}

fn audit_in_child(dir: &std::path::Path) -> anyhow::Result<ChildAudit> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let started = Instant::now();
    let mut child = Command::new(exe)
        .arg("audit")
        .arg("--data")
        .arg(dir)
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the audit")?;
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut out)
        .context("reading the audit's report")?;
    let mut status = 0;
    // SAFETY: rusage is plain data the kernel fills in; the pid is our own unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    anyhow::ensure!(
        pid > 0,
        "waiting for the audit: {}",
        std::io::Error::last_os_error()
    );
    let seconds = started.elapsed().as_secs_f64();
    let status = std::process::ExitStatus::from_raw(status);
    let report: serde_json::Value = serde_json::from_slice(&out)
        .with_context(|| format!("the audit ({status}) printed no JSON report"))?;
    Ok(ChildAudit {
        report,
        seconds,
        // Linux reports ru_maxrss in KiB.
        peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
    })
}

pub fn run(args: AuditArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.events > 0, "--events must be at least 1");
    anyhow::ensure!(args.in_flight > 0, "--in-flight must be at least 1");
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let dir = base.path().join("ledger");
    let started = Instant::now();
    let generated = {
        let ledger = Ledger::open(
            &dir,
            LedgerOptions {
                durability: Durability::Buffered,
            },
        )
        .context("opening the bench ledger")?;
        let generated = generate(&ledger, &args)?;
        ledger.flush().context("flushing the bench ledger")?;
        generated
    };
    let generate_seconds = started.elapsed().as_secs_f64();
    let audit = audit_in_child(&dir)?;
    let violations = audit.report["violations"].as_array().map_or(0, Vec::len);
    anyhow::ensure!(
        violations == 0,
        "the audit found {violations} violations in the generated log (a bug in the generator or the audit): {}",
        audit.report["violations"]
    );
    let events = audit.report["events"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        events == generated.events,
        "the audit read {events} events of the {} generated",
        generated.events
    );
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let report = serde_json::json!({
        "bench": "audit",
        "events": generated.events,
        "tasks": generated.tasks,
        "in_flight": args.in_flight,
        "generate_seconds": round(generate_seconds),
        "generate_events_per_sec": round(generated.events as f64 / generate_seconds),
        "audit_seconds": round(audit.seconds),
        "audit_events_per_sec": round(generated.events as f64 / audit.seconds),
        "audit_peak_rss_mib": round(audit.peak_rss_bytes as f64 / (1024.0 * 1024.0)),
        "tasks_by_state": audit.report["tasks_by_state"],
        "unknown_outcomes": audit.report["unknown_outcomes"],
        "duplicates_dropped": audit.report["duplicates_dropped"],
        "violations": violations,
    });
    println!("{report}");
    Ok(())
}
