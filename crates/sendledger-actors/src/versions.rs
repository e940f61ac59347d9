//! One version of a request at a time (`docs/rules.md`, Task versions).
//!
//! Each version of a request is a task of its own. What keeps them in order:
//! - [`IdentityLocks`]: the engine records a delivery of an identity (any version) under the
//!   identity's lock, so two versions are never accepted at once, each new one names the latest
//!   before it, and a version below the latest is refused unless it is a redelivery. A task's
//!   actor takes the same lock, without waiting, to retry a failed version, so a retry and the
//!   acceptance of a later version never cross.
//! - [`Waiting`]: a version waiting for the one before it to settle, woken when it does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sendledger_core::TaskId;
use tokio::sync::OwnedMutexGuard;

/// A lock per identity, held while one of its deliveries (or a retry) is decided and recorded.
/// Keyed by the identity's task id of version 0; an entry lives while someone holds or waits
/// for it.
#[derive(Default)]
pub struct IdentityLocks {
    locks: Mutex<HashMap<TaskId, Arc<tokio::sync::Mutex<()>>>>,
}

/// An identity's lock, held until dropped.
pub struct IdentityGuard {
    locks: Arc<IdentityLocks>,
    key: TaskId,
    guard: Option<OwnedMutexGuard<()>>,
}

impl IdentityLocks {
    fn entry(&self, key: TaskId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(key).or_default().clone()
    }

    /// Waits for the identity's lock.
    pub async fn lock(self: &Arc<Self>, key: TaskId) -> IdentityGuard {
        let guard = self.entry(key).lock_owned().await;
        IdentityGuard {
            locks: self.clone(),
            key,
            guard: Some(guard),
        }
    }

    /// The identity's lock, if no one holds it.
    pub fn try_lock(self: &Arc<Self>, key: TaskId) -> Option<IdentityGuard> {
        let guard = self.entry(key).try_lock_owned();
        let guard = match guard {
            Ok(guard) => guard,
            Err(_) => {
                self.forget_unused(key);
                return None;
            }
        };
        Some(IdentityGuard {
            locks: self.clone(),
            key,
            guard: Some(guard),
        })
    }

    /// Drops the identity's entry when no one holds or waits for its lock.
    fn forget_unused(&self, key: TaskId) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if locks.get(&key).is_some_and(|m| Arc::strong_count(m) == 1) {
            locks.remove(&key);
        }
    }

    /// How many identities have an entry (held or waited for).
    pub fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for IdentityGuard {
    fn drop(&mut self) {
        self.guard.take();
        self.locks.forget_unused(self.key);
    }
}

/// Versions waiting for an earlier one to settle: earlier version's task → the waiting task.
#[derive(Default)]
pub struct Waiting {
    by_earlier: Mutex<HashMap<TaskId, TaskId>>,
}

impl Waiting {
    /// `task` waits for `earlier` to settle. Registered before `earlier` is read, so that
    /// either the read finds it settled or its settling finds this.
    pub fn register(&self, earlier: TaskId, task: TaskId) {
        let mut map = self.by_earlier.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(earlier, task);
    }

    /// Undoes [`Waiting::register`]: `earlier` was found settled.
    pub fn unregister(&self, earlier: TaskId, task: TaskId) {
        let mut map = self.by_earlier.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&earlier) == Some(&task) {
            map.remove(&earlier);
        }
    }

    /// The task waiting for `earlier`, which has just settled.
    pub fn settled(&self, earlier: TaskId) -> Option<TaskId> {
        let mut map = self.by_earlier.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held lock makes others wait (or `try_lock` fail) until it is dropped, and an
    /// identity's entry goes once no one holds or waits for it.
    #[tokio::test]
    async fn a_lock_is_held_until_dropped_and_its_entry_then_goes() {
        let locks = Arc::new(IdentityLocks::default());
        let (a, b) = (TaskId([1; 16]), TaskId([2; 16]));
        let held = locks.lock(a).await;
        assert!(locks.try_lock(a).is_none());
        let other = locks.try_lock(b).expect("another identity is free");
        assert_eq!(locks.len(), 2);
        drop(other);
        assert_eq!(locks.len(), 1);
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _guard = locks.lock(a).await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        waiter.await.unwrap();
        assert!(locks.is_empty());
        assert!(locks.try_lock(a).is_some());
        assert!(locks.is_empty());
    }
}
