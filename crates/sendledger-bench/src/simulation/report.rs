//! What a simulated run draws of its faults ([`Swarm`]) and what it reports ([`Report`]).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;

/// Which faults a run injects, and how often (weights of the scheduler's moves, a share of
/// commits): drawn per seed, so that runs differ in kind and not only in order, and faults
/// that mask each other (a crash ends a pause) are also seen apart.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Swarm {
    pub crash: u32,
    pub freeze: u32,
    pub freeze_sender: u32,
    pub rebalance: u32,
    pub commit_failures_pct: u32,
    /// Unclean leader elections (a lost acknowledged commit).
    pub lose_tail: u32,
    /// Standby copies' catching up (drawn apart from the rest, see [`super::Options::newer_moves`]).
    pub standby: u32,
    /// Take-overs cut short by a kill right after they fenced the previous writer (drawn
    /// apart, as `standby`).
    pub cut_take_over: u32,
}

impl Swarm {
    pub(super) fn draw(rng: &mut StdRng) -> Swarm {
        let mut weight = || [0, 1, 3][rng.random_range(0..3)];
        Swarm {
            crash: weight(),
            freeze: weight(),
            freeze_sender: weight(),
            rebalance: weight(),
            commit_failures_pct: [0, 5, 20][rng.random_range(0..3)],
            lose_tail: [0, 0, 1][rng.random_range(0..3)],
            standby: 0,
            cut_take_over: 0,
        }
    }
}

/// What one run did and found.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub seed: u64,
    /// The brokers committed fenced writers' open transactions (as the test broker does).
    pub commits_fenced: bool,
    pub swarm: Swarm,
    /// Instances writing binary event records (the others write JSON ones).
    pub binary_instances: usize,
    pub steps: usize,
    pub commits: u64,
    pub commits_failed: u64,
    pub take_overs: u64,
    pub crashes: u64,
    pub wipes: u64,
    pub freezes: u64,
    pub rebalances: u64,
    pub sends: u64,
    /// First bytes refused: the send lease ended (the instance was stopped meanwhile).
    pub leases_expired: u64,
    /// First bytes not written: the partition was revoked since the intent.
    pub revoked_before_sending: u64,
    pub lost_responses: u64,
    /// Committed transactions the brokers lost (unclean leader elections).
    pub lost_tails: u64,
    /// Tasks with events the brokers lost: exempt from the checks at the remote (nothing
    /// can tell their sends apart), not from settling.
    pub tasks_with_lost_events: usize,
    /// Take-overs that found a copy longer than, or apart from, the log and truncated it.
    pub copies_truncated: u64,
    /// Take-overs cut short by a kill once they had fenced the previous writer.
    pub take_overs_cut: u64,
    /// Standby copies caught up with the log, and the events they applied.
    pub standby_steps: u64,
    pub standby_events: u64,
    pub records: usize,
    pub succeeded: usize,
    pub reviews: usize,
    /// Why the tasks in review are there.
    pub reviews_why: BTreeMap<String, usize>,
    pub failed: usize,
    pub rejected: usize,
    pub violations: Vec<String>,
}
