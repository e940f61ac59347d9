//! The end of a run: every fault healed, the group rebalanced, the work drained.

use super::broker::Ending;
use super::{World, DRAIN_STEPS, SESSION_MS};

impl World {
    /// Heals every fault and runs until nothing is left to do.
    pub(super) fn drain(&mut self) -> anyhow::Result<()> {
        for i in 0..self.instances.len() {
            if !self.instances[i].up() {
                self.instances[i].restart(false)?;
            }
        }
        let thaw = self.now + SESSION_MS * 3;
        self.advance(thaw);
        self.rebalance();
        self.run_until_idle()?;
        // The whole group rebalances once more: every partition is given up and taken over
        // again, so every copy is checked against its log after the faults (an owner whose log
        // lost commits while it had nothing to write hears of it only at a take-over).
        for inst in self.instances.iter_mut() {
            for p in inst.owned.keys().copied().collect::<Vec<_>>() {
                inst.release(p);
            }
        }
        self.assignment.clear();
        self.rebalance();
        self.run_until_idle()
    }

    /// Runs moves without faults (every parked commit committed first) until nothing is left
    /// to do.
    fn run_until_idle(&mut self) -> anyhow::Result<()> {
        for _ in 0..DRAIN_STEPS {
            if self.idle() {
                return Ok(());
            }
            let parked = self.broker.parked();
            if let Some(&id) = parked.first() {
                self.broker.end(id, Ending::Commit);
                self.settle()?;
                self.housekeeping()?;
                continue;
            }
            self.step(false)?;
        }
        self.report.violations.push(format!(
            "the run did not settle within {DRAIN_STEPS} steps of draining"
        ));
        Ok(())
    }

    /// Nothing left to do: every request read, nothing parked or in flight, no timer.
    fn idle(&self) -> bool {
        let unread = (self.instances.iter()).any(|inst| {
            (inst.consumed.iter())
                .any(|(p, &next)| (next as usize) < self.requests.get(p).map_or(0, Vec::len))
        });
        let owned: usize = self.instances.iter().map(|i| i.owned.len()).sum();
        let busy = (self.instances.iter()).any(|i| {
            !i.attempts.is_empty()
                || !i.calls.is_empty()
                || !i.lookups.is_empty()
                || !i.timers.is_empty()
        });
        let deaf = self.instances.iter().any(|i| !i.unheard.is_empty());
        owned == self.partitions as usize
            && !deaf
            && !unread
            && !busy
            && self.broker.parked().is_empty()
    }
}
