//! Retention's loop (`storage.retention`): every so often, the histories of tasks settled
//! longer ago than the retention are removed, each through its task's actor, once the outbox
//! has published every event of it; with `storage.identity_retention`, what was kept of those
//! settled longer ago than that is forgotten too (`docs/operating/retention.md`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sendledger_actors::Engine;
use sendledger_kafka::publisher::PUBLISHER_CURSOR;

/// How often retention looks for tasks to remove: a tenth of the retention, between 1 s and
/// 1 min (a task outlives its retention by at most this).
pub fn pass_interval(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// The running loop, stopped when dropped (a removal under way completes: each is one write).
pub struct Retention {
    task: tokio::task::JoinHandle<()>,
}

impl Retention {
    /// Starts the loop on `engine`'s ledger. In local mode (`outbox`), nothing is removed
    /// before the publisher's durable cursor is past every event of a task; in kafka mode a
    /// result is written in the transaction that records its event, before the ledger holds it.
    pub fn start(
        engine: Engine,
        retention: Duration,
        identities: Option<Duration>,
        outbox: bool,
    ) -> Retention {
        let interval = pass_interval(retention);
        tracing::info!(
            retention = %humantime::format_duration(retention),
            every = %humantime::format_duration(interval),
            "settled tasks' histories are removed once older than the retention"
        );
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis() as u64;
                let before = |kept: Duration| now.saturating_sub(kept.as_millis() as u64);
                let cutoff = before(retention);
                // Local mode: the publisher's durable cursor, and when the first event past it
                // was recorded: a task settled after that is not all published, so the pass
                // does not even look at it (while the brokers are away, say). Kafka mode has
                // no outbox: a result is committed with its event.
                let (published, cutoff) = if outbox {
                    let read = (engine.ledger()).read(|l| {
                        let cursor = l.cursor(PUBLISHER_CURSOR)?.unwrap_or(0);
                        let next = l.read_log(cursor + 1, 1)?.first().map(|e| e.at);
                        Ok((cursor, next))
                    });
                    match read.await {
                        Ok((cursor, next)) => {
                            (Some(cursor), next.map_or(cutoff, |at| cutoff.min(at)))
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "retention skipped a pass: the publisher's cursor is unreadable");
                            continue;
                        }
                    }
                } else {
                    (None, cutoff)
                };
                let pass = async {
                    let pruned = engine.prune_settled(cutoff, published).await?;
                    let forgotten = match identities {
                        Some(kept) => engine.forget_expired(before(kept)).await?,
                        None => 0,
                    };
                    Ok::<_, sendledger_actors::Error>((pruned, forgotten))
                };
                match pass.await {
                    Ok((0, 0)) => {}
                    Ok((pruned, forgotten)) => tracing::info!(
                        pruned,
                        forgotten,
                        "settled tasks' histories removed, identities forgotten"
                    ),
                    Err(e) if e.is_transient() => {
                        tracing::warn!(error = %e, "retention's pass stopped; it tries again")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "retention stopped");
                        return;
                    }
                }
            }
        });
        Retention { task }
    }
}

impl Drop for Retention {
    fn drop(&mut self) {
        self.task.abort();
    }
}
