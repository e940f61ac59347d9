//! `sendledger-bench simulate`: a range of seeds, one run each, one JSON summary.

use std::time::Instant;

use super::Options;

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Seeds to run, `A..B` (B excluded).
    #[arg(long, default_value = "1..101")]
    seeds: String,
    /// Steps with faults per run, before the drain.
    #[arg(long, default_value_t = Options::default().steps)]
    steps: usize,
    /// Tasks per run.
    #[arg(long, default_value_t = Options::default().tasks)]
    tasks: usize,
    /// Instances per run.
    #[arg(long, default_value_t = Options::default().instances)]
    instances: usize,
    /// Partitions of the requests and events topics.
    #[arg(long, default_value_t = Options::default().partitions)]
    partitions: i32,
    /// Print each run's report (a JSON object per line) before the summary.
    #[arg(long)]
    each: bool,
    /// Print every move of the scheduler and every decision on stderr (to follow one seed).
    #[arg(long)]
    trace: bool,
    /// The brokers commit a fenced writer's open transaction instead of aborting it (in half
    /// the seeds), as a broker that breaks Kafka's promise does: kafka mode stands on that
    /// promise, so such runs are expected to break rules.
    #[arg(long)]
    commits_fenced: bool,
    /// Runs without the send lease (an attempt's first byte is written however late): to
    /// measure how many seeds the checks need to see what the lease prevents.
    #[arg(long)]
    without_send_lease: bool,
}

/// Parses `A..B`.
pub fn seed_range(text: &str) -> anyhow::Result<std::ops::Range<u64>> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| anyhow::anyhow!("--seeds takes A..B, not {text:?}"))?;
    let (a, b): (u64, u64) = (a.trim().parse()?, b.trim().parse()?);
    anyhow::ensure!(a < b, "--seeds {text}: the range is empty");
    Ok(a..b)
}

pub fn run_args(args: SimulateArgs) -> anyhow::Result<bool> {
    let seeds = seed_range(&args.seeds)?;
    let options = Options {
        instances: args.instances.max(1),
        partitions: args.partitions.max(1),
        tasks: args.tasks,
        steps: args.steps,
        trace: args.trace,
        commits_fenced: args.commits_fenced,
        send_lease: !args.without_send_lease,
        ..Options::default()
    };
    let started = Instant::now();
    let (mut runs, mut steps, mut take_overs, mut crashes, mut freezes) = (0u64, 0, 0, 0, 0);
    let mut binary_instances = 0;
    let mut failed = Vec::new();
    for seed in seeds.clone() {
        let dir = tempfile::tempdir()?;
        let report = super::run(seed, dir.path(), &options)?;
        runs += 1;
        steps += report.steps as u64;
        take_overs += report.take_overs;
        crashes += report.crashes;
        freezes += report.freezes;
        binary_instances += report.binary_instances;
        if args.each {
            println!("{}", serde_json::to_string(&report)?);
        }
        if !report.violations.is_empty() {
            eprintln!("seed {seed}: {:#?}", report.violations);
            failed.push(seed);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let summary = serde_json::json!({
        "benchmark": "simulate",
        "seeds": args.seeds,
        "runs": runs,
        "steps": steps,
        "take_overs": take_overs,
        "crashes": crashes,
        "freezes": freezes,
        "instances_writing_binary_records": binary_instances,
        "seconds": secs,
        "runs_per_minute": runs as f64 * 60.0 / secs,
        "failed_seeds": failed,
    });
    println!("{summary}");
    Ok(failed.is_empty())
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    match run_args(args)? {
        true => Ok(()),
        false => anyhow::bail!("some seeds broke a rule (listed above)"),
    }
}
