//! `sendledger offsets reset`: a partition's processed-offset markers on a stopped ledger.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sendledger_store::Ledger;

#[derive(Args)]
pub struct OffsetsResetArgs {
    /// Ledger directory (the service must be stopped).
    #[arg(long, default_value = "sendledger-data")]
    data: PathBuf,
    /// The requests topic.
    #[arg(long)]
    topic: String,
    /// The partition whose processed offsets are replaced.
    #[arg(long)]
    partition: i32,
    /// Count every offset up to and including this one as processed (by another ledger),
    /// instead of forgetting them all.
    #[arg(long)]
    through: Option<i64>,
}

/// Replaces a partition's processed offsets on a stopped ledger: what to do when the service
/// refuses a partition because the requests topic was deleted and recreated (forget them), or
/// because another ledger processed it (`--through`: take over from where that one stopped).
pub fn offsets_reset(args: OffsetsResetArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.partition >= 0, "--partition must be 0 or more");
    anyhow::ensure!(
        args.through.is_none_or(|t| t >= 0),
        "--through must be an offset, 0 or more"
    );
    let ledger = Ledger::open(&args.data, sendledger_store::LedgerOptions::default())
        .with_context(|| {
            format!(
                "opening the ledger at {} (stop the service first)",
                args.data.display()
            )
        })?;
    let before = ledger.processed(&args.topic, args.partition)?;
    let removed = ledger.reset_offsets(&args.topic, args.partition, args.through)?;
    if let Some(through) = args.through {
        println!(
            "{}/{}: every offset up to {through} now counts as processed by this ledger; messages above it are consumed at the next start",
            args.topic, args.partition
        );
        return Ok(());
    }
    println!(
        "{}/{}: forgot {removed} processed-offset entries (watermark was {}); its messages are consumed as new at the next start, and a redelivered known request is still a duplicate of its task",
        args.topic,
        args.partition,
        before
            .watermark
            .map_or_else(|| "none".to_string(), |w| w.to_string())
    );
    Ok(())
}
