//! Who waits for a task to change: a caller that wants to know when a task has moved on (the
//! front door waiting for a result) watches it, and the task's actor wakes every watcher of
//! the task each time its events are durable; in kafka mode, so does a restore that applies
//! events of the task its partition's owner committed (a take-over's, or a standby copy's).
//! Nothing is kept for tasks no one watches; a watch ends when it is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sendledger_core::result::TaskResult;
use sendledger_core::TaskId;
use tokio::sync::Notify;

/// The watched tasks, each with how many watch it.
#[derive(Debug, Default)]
pub struct Watchers {
    tasks: Mutex<HashMap<TaskId, (Arc<Watched>, usize)>>,
    /// How many tasks are watched, read without the lock by [`Watchers::changed`].
    watched: AtomicUsize,
}

/// What the watchers of one task share.
#[derive(Debug, Default)]
struct Watched {
    notify: Notify,
    /// Set once a terminal state of the task is recorded.
    ended: AtomicBool,
    /// The result announced with it, when its writer gave it.
    result: Mutex<Option<Arc<TaskResult>>>,
}

/// A watch of one task; wakes on [`TaskWatch::changed`] after the task's next durable change.
pub struct TaskWatch {
    watchers: Arc<Watchers>,
    task: TaskId,
    watched: Arc<Watched>,
}

impl Watchers {
    /// Starts watching `task`. Changes are seen from now on: check the task's state after this
    /// call, then wait with [`TaskWatch::changed`].
    pub fn watch(self: &Arc<Self>, task: TaskId) -> TaskWatch {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let entry = tasks.entry(task).or_insert_with(|| {
            self.watched.fetch_add(1, Ordering::SeqCst);
            (Arc::new(Watched::default()), 0)
        });
        entry.1 += 1;
        TaskWatch {
            watchers: self.clone(),
            task,
            watched: entry.0.clone(),
        }
    }

    /// Whether anyone watches `task`. A lock only while some task is watched.
    pub fn is_watched(&self, task: TaskId) -> bool {
        if self.watched.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.contains_key(&task)
    }

    /// Wakes the watchers of `task`: its events are durable, and its state is now terminal
    /// when `ended`, with `result` the result announced with it when the writer gives it (the
    /// watchers then need not read it back). A lock only while some task is watched.
    pub fn changed(&self, task: TaskId, ended: bool, result: Option<TaskResult>) {
        if self.watched.load(Ordering::SeqCst) == 0 {
            return;
        }
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((watched, _)) = tasks.get(&task) {
            if ended {
                if let Some(result) = result {
                    *watched.result.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Arc::new(result));
                }
                watched.ended.store(true, Ordering::SeqCst);
            }
            watched.notify.notify_waiters();
        }
    }
}

impl TaskWatch {
    /// A future that completes at the task's next durable change after this call (not after
    /// its first poll): call it, then read the task's state, then await it, and no change in
    /// between is missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.watched.notify.notified()
    }

    /// Whether a terminal state of the task was recorded since the watch began.
    pub fn ended(&self) -> bool {
        self.watched.ended.load(Ordering::SeqCst)
    }

    /// The result announced with the task's terminal state, when it ended since the watch
    /// began and its writer gave it.
    pub fn result(&self) -> Option<Arc<TaskResult>> {
        (self
            .watched
            .result
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
        .clone()
    }
}

impl Drop for TaskWatch {
    fn drop(&mut self) {
        let mut tasks = (self.watchers.tasks.lock()).unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = tasks.get_mut(&self.task) {
            entry.1 -= 1;
            if entry.1 == 0 {
                tasks.remove(&self.task);
                self.watchers.watched.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_wakes_on_its_tasks_change_and_is_forgotten_when_dropped() {
        let watchers = Arc::new(Watchers::default());
        let (a, b) = (TaskId([1; 16]), TaskId([2; 16]));
        let watch = watchers.watch(a);
        let second = watchers.watch(a);
        {
            // Made before the change, polled only after it: still woken.
            let waiting = watch.changed();
            tokio::pin!(waiting);
            watchers.changed(b, true, None);
            let other = tokio::time::timeout(std::time::Duration::from_millis(20), &mut waiting);
            assert!(other.await.is_err(), "another task's change wakes no one");
            watchers.changed(a, false, None);
            waiting.await;
            assert!(!watch.ended());
            // A change before the future was made is not seen by it.
            let late = watch.changed();
            let missed = tokio::time::timeout(std::time::Duration::from_millis(20), late);
            assert!(missed.await.is_err());
            watchers.changed(a, true, None);
            assert!(watch.ended() && second.ended());
            assert!(watch.result().is_none(), "no result was given");
        }
        assert!(watchers.is_watched(a) && !watchers.is_watched(b));
        drop(watch);
        assert_eq!(watchers.watched.load(Ordering::SeqCst), 1);
        drop(second);
        assert!(!watchers.is_watched(a));
        assert!(watchers.tasks.lock().unwrap().is_empty());
        assert_eq!(watchers.watched.load(Ordering::SeqCst), 0);
    }
}
