//! `sendledger review`: list and resolve tasks in manual review, on a running service (through
//! its admin endpoint) or on a stopped ledger.
//!
//! On a stopped ledger a resolution is decided by the same core `decide` the task's actor
//! uses and appended through the ledger's journal ([`Engine::resolve_stopped`]); RocksDB's
//! lock makes that exclusive with a running service. A resend is only authorized there: the
//! next service start performs the one new attempt.

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use http::Method;
use sendledger_actors::{Engine, ReviewItem};
use sendledger_core::{Identity, ResolveBody};
use serde_json::Value;

use super::{call, open, At};

use sendledger_node::timeline::{parse_task, review_json};

#[derive(Args)]
pub struct ReviewArgs {
    #[command(subcommand)]
    command: ReviewCommand,
}

#[derive(Subcommand)]
enum ReviewCommand {
    /// The tasks in manual review, with reason and evidence.
    List {
        #[command(flatten)]
        at: At,
        /// Print JSON (the same as the admin endpoint's `GET /reviews`).
        #[arg(long)]
        json: bool,
        /// The token sent with --admin: an operator's (`[admin.operators]`), or the service's
        /// `admin.token`.
        #[arg(long, env = "SENDLEDGER_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Resolve a task in review: as succeeded (with the remote record that is the task's), as
    /// failed, as compensated (a multi-step task: every step that succeeded is undone), or by
    /// authorizing one resend. The operator's name and reason are recorded.
    ///
    /// With --data (a stopped ledger), --resend records only the authorization; the attempt is
    /// sent by the service when it next starts. A second resolution of the same review is
    /// refused.
    Resolve {
        /// Task id (32 hex digits), or `tenant/operation/request_key` (a `/` inside a part
        /// written `%2F`, a `%` as `%25`).
        task: String,
        #[command(flatten)]
        at: At,
        /// What the task is now: `succeeded` (needs --remote-id), `failed`, or `compensated`
        /// (with --remote-id when the step in review did happen, so it is undone too).
        #[arg(
            long = "as",
            value_enum,
            conflicts_with = "resend",
            required_unless_present = "resend"
        )]
        resolve_as: Option<Outcome>,
        /// Authorize one new attempt instead (after checking the remote has no record).
        #[arg(long)]
        resend: bool,
        /// The id of the remote record that is the task's (with `--as succeeded`), or the
        /// step's in review (with `--as compensated`).
        #[arg(long, required_if_eq("resolve_as", "succeeded"))]
        remote_id: Option<String>,
        /// A record the step's lookup found besides --remote-id, to undo as a duplicate with
        /// the step's compensating target (repeat for several; with --as succeeded or
        /// compensated).
        #[arg(long = "undo", value_name = "REMOTE_ID")]
        undo: Vec<String>,
        /// Who decides (recorded). Needed with --data; with --admin an operator's token names
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

#[derive(Clone, Copy, ValueEnum)]
enum Outcome {
    Succeeded,
    Failed,
    Compensated,
}

pub fn run(args: ReviewArgs) -> anyhow::Result<()> {
    match args.command {
        ReviewCommand::List { at, json, token } => {
            let list = match (&at.admin, &at.data) {
                (Some(url), _) => call(url, Method::GET, "/reviews", None, token.as_deref())?,
                (None, Some(dir)) => {
                    let items = ReviewItem::list(&open(dir)?)?;
                    Value::Array(items.iter().map(review_json).collect())
                }
                (None, None) => unreachable!("clap requires --admin or --data"),
            };
            print_list(&list, json)
        }
        ReviewCommand::Resolve {
            task,
            at,
            resolve_as,
            resend,
            remote_id,
            undo,
            by,
            reason,
            token,
        } => {
            let body = ResolveBody {
                resolve_as: resolve_as.map(|o| match o {
                    Outcome::Succeeded => "succeeded".into(),
                    Outcome::Failed => "failed".into(),
                    Outcome::Compensated => "compensated".into(),
                }),
                resend,
                remote_id,
                undo,
                by: by.clone().unwrap_or_default(),
                reason,
            };
            match (&at.admin, &at.data) {
                (Some(url), _) => {
                    let path = format!(
                        "/reviews/{}",
                        percent_encoding::utf8_percent_encode(
                            &task,
                            percent_encoding::NON_ALPHANUMERIC
                        )
                    );
                    let body = serde_json::to_vec(&body)?;
                    let out = call(url, Method::POST, &path, Some(body), token.as_deref())?;
                    println!("{}", serde_json::to_string_pretty(&out)?);
                }
                (None, Some(dir)) => {
                    anyhow::ensure!(by.is_some(), "--by is needed with --data: name who decides");
                    let task_id = parse_task(&task)?;
                    let resolution = body.resolution()?;
                    let ledger = open(dir)?;
                    let reply = Engine::resolve_stopped(&ledger, task_id, resolution)
                        .with_context(|| format!("resolving task {task_id}"))?;
                    let out = serde_json::json!({ "task_id": task_id.to_string(), "state": reply.phase.name(), "recorded": reply.events });
                    println!("{}", serde_json::to_string_pretty(&out)?);
                    if resend {
                        eprintln!(
                            "resend authorized: the service sends the attempt when it next starts"
                        );
                    }
                }
                (None, None) => unreachable!("clap requires --admin or --data"),
            }
            Ok(())
        }
    }
}

fn print_list(list: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(list)?);
        return Ok(());
    }
    let items = list.as_array().map(Vec::as_slice).unwrap_or_default();
    println!("{} task(s) in manual review", items.len());
    for item in items {
        let field = |k: &str| item[k].as_str().unwrap_or("-").to_owned();
        let identity = serde_json::from_value::<Identity>(item["identity"].clone())
            .map_or_else(|_| "-".to_string(), |i| i.to_string());
        println!(
            "{}  {identity}  since {}: {}",
            field("task_id"),
            field("since"),
            field("reason"),
        );
    }
    Ok(())
}
