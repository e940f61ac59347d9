//! Kafka mode: which requests partitions this instance owns. A task acts only while the
//! partition of its request is owned here; between two assignments of a partition another
//! instance may have advanced its tasks, so a task actor that loaded its state before the
//! partition's latest assignment loads it again before it decides anything.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use sendledger_core::TaskId;

/// Most attempts [`Ownership::note_unsent`] keeps; beyond, one is not noted (the partition's
/// next owner reconciles it as an unknown outcome, as it would one of another instance).
const UNSENT_KEPT: usize = 10_000;

/// The owned partitions, each with the epoch of its latest assignment. Epochs come from one
/// counter, so an actor compares the epoch it loaded at with its partition's.
#[derive(Debug, Default)]
pub struct Ownership {
    inner: Mutex<Epochs>,
}

#[derive(Debug, Default)]
struct Epochs {
    /// The counter: the epoch of the latest assignment of any partition.
    current: u64,
    owned: BTreeMap<i32, u64>,
    /// Attempts whose intent a task recorded here and that were not sent, the partition lost
    /// in between: task → attempt.
    unsent: HashMap<TaskId, u32>,
}

impl Ownership {
    fn lock(&self) -> MutexGuard<'_, Epochs> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `partition` on; returns its new epoch.
    pub fn assign(&self, partition: i32) -> u64 {
        let mut e = self.lock();
        e.current += 1;
        let epoch = e.current;
        e.owned.insert(partition, epoch);
        epoch
    }

    /// Gives `partition` up: its tasks stop acting here.
    pub fn revoke(&self, partition: i32) {
        self.lock().owned.remove(&partition);
    }

    /// The epoch of `partition`'s latest assignment, while it is owned.
    pub fn epoch(&self, partition: i32) -> Option<u64> {
        self.lock().owned.get(&partition).copied()
    }

    /// The latest epoch of any partition: an actor that loads its state now has seen every
    /// assignment up to it.
    pub fn current(&self) -> u64 {
        self.lock().current
    }

    /// The partitions owned now.
    pub fn partitions(&self) -> Vec<i32> {
        self.lock().owned.keys().copied().collect()
    }

    /// Notes that `task` recorded the intent of `attempt` here and did not send it (its
    /// partition was lost before the first byte), for when the partition is owned here again.
    /// The task's actor may be gone by then.
    pub fn note_unsent(&self, task: TaskId, attempt: u32) {
        let mut e = self.lock();
        if e.unsent.len() < UNSENT_KEPT || e.unsent.contains_key(&task) {
            e.unsent.insert(task, attempt);
        }
    }

    /// The attempt of `task` noted by [`Ownership::note_unsent`], forgotten once taken.
    pub fn take_unsent(&self, task: TaskId) -> Option<u32> {
        self.lock().unsent.remove(&task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reassigned_partition_has_a_later_epoch() {
        let o = Ownership::default();
        let first = o.assign(3);
        let seen = o.current();
        o.revoke(3);
        assert_eq!(o.epoch(3), None);
        let second = o.assign(3);
        assert!(second > first && second > seen);
        assert_eq!(o.epoch(3), Some(second));
        assert_eq!(o.partitions(), vec![3]);
    }

    #[test]
    fn an_unsent_attempt_is_taken_once() {
        let o = Ownership::default();
        let task = TaskId([1; 16]);
        o.note_unsent(task, 2);
        assert_eq!(o.take_unsent(task), Some(2));
        assert_eq!(o.take_unsent(task), None);
    }
}
