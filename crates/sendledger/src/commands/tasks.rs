//! `sendledger tasks`: list tasks by phase, target, failure kind and time (from the ledger's
//! task index), and retry failed tasks whose every attempt was proven not sent, one or in
//! bulk, on a running service (through its admin endpoint) or on a stopped ledger.
//!
//! On a stopped ledger a retry is decided by the same core `decide` the task's actor uses and
//! appended through the ledger's journal ([`Engine::resolve_stopped`]): only `TaskRetried` is
//! recorded there, and the service sends the new version's attempt when it next starts.

use anyhow::Context;
use clap::{Args, Subcommand};
use http::Method;
use sendledger_actors::Engine;
use sendledger_core::{FailureKind, OperatorResolution, Phase};
use sendledger_store::TaskQuery;
use serde_json::{json, Value};

use super::{call, open, At};
use sendledger_node::timeline::{parse_task, parse_time, task_page_json};

#[derive(Args)]
pub struct TasksArgs {
    #[command(subcommand)]
    command: TasksCommand,
}

/// Which tasks: the selectors of `GET /tasks`.
#[derive(Args, Default)]
struct Select {
    /// Only tasks in this phase (repeat for several): accepted, sending, retry_wait, unknown,
    /// manual_review, succeeded, rejected, failed, compensating, compensated.
    #[arg(long = "phase")]
    phases: Vec<String>,
    /// Only tasks of this target.
    #[arg(long)]
    target: Option<String>,
    /// Only tasks that failed for this reason: connect, throttled, server_error,
    /// local_resources, operator.
    #[arg(long)]
    failure: Option<String>,
    /// Only tasks that entered their phase at or after this time (RFC 3339, e.g.
    /// 2026-12-05T10:00:00Z, or ms since the Unix epoch).
    #[arg(long)]
    from: Option<String>,
    /// Only tasks that entered their phase before this time.
    #[arg(long)]
    to: Option<String>,
}

impl Select {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs: Vec<(&'static str, String)> = Vec::new();
        if !self.phases.is_empty() {
            pairs.push(("phase", self.phases.join(",")));
        }
        for (name, value) in [
            ("target", &self.target),
            ("failure", &self.failure),
            ("from", &self.from),
            ("to", &self.to),
        ] {
            if let Some(value) = value {
                pairs.push((name, value.clone()));
            }
        }
        pairs
    }

    /// The query a stopped ledger answers, checked as the admin endpoint checks it.
    fn query(&self, limit: usize) -> anyhow::Result<TaskQuery> {
        let mut q = TaskQuery {
            limit,
            ..TaskQuery::default()
        };
        for phase in &self.phases {
            q.phases.push(
                Phase::parse(phase).with_context(|| format!("--phase {phase} is not a phase"))?,
            );
        }
        q.target.clone_from(&self.target);
        if let Some(f) = &self.failure {
            q.failure = Some(
                FailureKind::parse(f)
                    .with_context(|| format!("--failure {f} is not a failure kind"))?,
            );
        }
        q.from = self
            .from
            .as_deref()
            .map(|t| instant("--from", t))
            .transpose()?;
        q.to = self.to.as_deref().map(|t| instant("--to", t)).transpose()?;
        Ok(q)
    }
}

fn instant(flag: &str, value: &str) -> anyhow::Result<u64> {
    parse_time(value)
        .with_context(|| format!("{flag} {value}: give RFC 3339 or ms since the Unix epoch"))
}

#[derive(Subcommand)]
enum TasksCommand {
    /// Tasks by phase, target, failure kind and the time they entered their phase, ordered by
    /// phase, target, then time.
    List {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        select: Select,
        /// At most this many tasks.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON (`{"tasks": [...], "next"}`, as the admin endpoint's `GET /tasks`).
        #[arg(long)]
        json: bool,
        /// The token sent with --admin: an operator's (`[admin.operators]`), or the service's
        /// `admin.token`.
        #[arg(long, env = "SENDLEDGER_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Retry failed tasks whose every attempt was proven not sent: one TASK, or every failed
    /// task the selectors choose (all of them when none is given), page by page. Each retry
    /// records who and why, and the task's next result supersedes its failed one. A task an
    /// attempt of which may have reached the remote is refused (it needs reconciliation or
    /// review).
    Retry {
        /// Task id (32 hex digits), or `tenant/operation/request_key`. Without it, every
        /// selected failed task.
        task: Option<String>,
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        select: Select,
        /// Who retries (recorded). Needed with --data; with --admin an operator's token names
        /// them (given, it must be their name).
        #[arg(long)]
        by: Option<String>,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// The token sent with --admin: an operator's (`[admin.operators]`), or the service's
        /// `admin.token`.
        #[arg(long, env = "SENDLEDGER_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

pub fn run(args: TasksArgs) -> anyhow::Result<()> {
    match args.command {
        TasksCommand::List {
            at,
            select,
            limit,
            json,
            token,
        } => {
            let page = match (&at.admin, &at.data) {
                (Some(url), _) => {
                    let mut pairs = select.pairs();
                    pairs.push(("limit", limit.to_string()));
                    call(
                        url,
                        Method::GET,
                        &format!("/tasks?{}", query_string(&pairs)),
                        None,
                        token.as_deref(),
                    )?
                }
                (None, Some(dir)) => {
                    let ledger = open(dir)?;
                    task_page_json(&ledger.list_tasks(&select.query(limit)?)?)
                }
                (None, None) => unreachable!("clap requires --admin or --data"),
            };
            print_page(&page, json)
        }
        TasksCommand::Retry {
            task,
            at,
            select,
            by,
            reason,
            token,
        } => {
            let on_ledger = || {
                by.clone()
                    .context("--by is needed with --data: name who retries")
            };
            let by = by.as_deref().unwrap_or_default();
            let out = match (task, &at.admin, &at.data) {
                (Some(task), Some(url), _) => {
                    let path = format!(
                        "/tasks/{}/retry",
                        percent_encoding::utf8_percent_encode(
                            &task,
                            percent_encoding::NON_ALPHANUMERIC
                        )
                    );
                    let body = serde_json::to_vec(&json!({ "by": by, "reason": reason }))?;
                    call(url, Method::POST, &path, Some(body), token.as_deref())?
                }
                (Some(task), None, Some(dir)) => {
                    let task_id = parse_task(&task)?;
                    let ledger = open(dir)?;
                    let reply = Engine::resolve_stopped(
                        &ledger,
                        task_id,
                        OperatorResolution::Retry {
                            by: on_ledger()?,
                            reason,
                        },
                    )
                    .with_context(|| format!("retrying task {task_id}"))?;
                    eprintln!("retry recorded: the service sends the attempt when it next starts");
                    json!({ "task_id": task_id.to_string(), "state": reply.phase.name(), "recorded": reply.events })
                }
                (None, Some(url), _) => {
                    bulk_at_service(url, &select, by, &reason, token.as_deref())?
                }
                (None, None, Some(dir)) => bulk_on_ledger(dir, &select, &on_ledger()?, &reason)?,
                (_, None, None) => unreachable!("clap requires --admin or --data"),
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
    }
}

/// Every selected failed task, one page (one call) at a time until the last.
fn bulk_at_service(
    url: &http::Uri,
    select: &Select,
    by: &str,
    reason: &str,
    token: Option<&str>,
) -> anyhow::Result<Value> {
    let mut body = json!({ "by": by, "reason": reason });
    for (name, value) in select.pairs() {
        anyhow::ensure!(
            name != "phase",
            "retry takes failed tasks only; drop --phase"
        );
        body[name] = json!(value);
    }
    let (mut totals, mut refusals) = ([0u64; 3], Vec::new());
    loop {
        let out = call(
            url,
            Method::POST,
            "/tasks/retry",
            Some(serde_json::to_vec(&body)?),
            token,
        )?;
        for (i, field) in ["selected", "retried", "refused"].iter().enumerate() {
            totals[i] += out[field].as_u64().unwrap_or(0);
        }
        refusals.extend(out["refusals"].as_array().cloned().unwrap_or_default());
        match out["next"].as_str() {
            Some(next) => body["after"] = json!(next),
            None => break,
        }
    }
    Ok(
        json!({ "selected": totals[0], "retried": totals[1], "refused": totals[2], "refusals": refusals }),
    )
}

fn bulk_on_ledger(
    dir: &std::path::PathBuf,
    select: &Select,
    by: &str,
    reason: &str,
) -> anyhow::Result<Value> {
    anyhow::ensure!(
        select.phases.is_empty(),
        "retry takes failed tasks only; drop --phase"
    );
    let ledger = open(dir)?;
    let mut query = select.query(1000)?;
    query.phases = vec![Phase::Failed];
    let (mut selected, mut retried, mut refusals) = (0u64, 0u64, Vec::new());
    loop {
        let page = ledger.list_tasks(&query)?;
        for (task, _) in &page.tasks {
            selected += 1;
            let retry = OperatorResolution::Retry {
                by: by.into(),
                reason: reason.into(),
            };
            match Engine::resolve_stopped(&ledger, *task, retry) {
                Ok(_) => retried += 1,
                Err(e) => {
                    refusals.push(json!({ "task_id": task.to_string(), "error": e.to_string() }))
                }
            }
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    if retried > 0 {
        eprintln!("retries recorded: the service sends the attempts when it next starts");
    }
    Ok(
        json!({ "selected": selected, "retried": retried, "refused": refusals.len(), "refusals": refusals }),
    )
}

fn query_string(pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}={}",
                percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn print_page(page: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(page)?);
        return Ok(());
    }
    let tasks = page["tasks"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for t in tasks {
        let field = |k: &str| t[k].as_str().unwrap_or("-").to_owned();
        println!(
            "{}  {:<13} {:<16} since {}  {}",
            field("task_id"),
            field("state"),
            field("target"),
            field("since"),
            field("failure"),
        );
    }
    if page["next"].is_string() {
        println!("(more: raise --limit, or use --json and the admin endpoint's `next`)");
    }
    Ok(())
}
