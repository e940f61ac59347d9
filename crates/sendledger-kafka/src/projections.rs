//! The task projections a writer of records keeps between its batches (the outbox publisher,
//! and in kafka mode each partition's log writer): a task's next event is projected from
//! where its last one left it, instead of folding its history read back from the ledger.
//!
//! Bounded: a settled task's projection is forgotten at the end of the first batch without
//! events of its task (later events are rare, a duplicate delivery or an operator's note, and
//! then its history is folded once; a run of them in consecutive batches goes on from the kept
//! projection), and beyond [`KEPT`] tasks the least recently used are forgotten. An unsettled
//! task's state is held by its live task actor too.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use sendledger_core::result::Projection;
use sendledger_core::{Event, TaskId};

/// Most projections kept between batches: as many as a service has live tasks by default
/// (`engine.max_live_tasks`).
pub const KEPT: usize = 10_000;

struct Kept {
    projection: Projection,
    /// The batch that last used it.
    used: u64,
}

/// Projections of the tasks seen in recent batches, each after the last event applied to it.
#[derive(Default)]
pub struct Projections {
    tasks: HashMap<TaskId, Kept>,
    /// The current batch's number.
    batch: u64,
}

impl Projections {
    /// Starts a batch.
    pub fn start_batch(&mut self) {
        self.batch += 1;
    }

    /// The projection of `event`'s task right before it: the kept one when it stands right
    /// before the event, else folded from `history` (the task's events before `event`, in
    /// order; not read for a task's first event). Returns it with the number of events folded.
    pub fn before<E>(
        &mut self,
        event: &Event,
        history: impl FnOnce() -> Result<Vec<Event>, E>,
    ) -> Result<(&mut Projection, u64), E> {
        let batch = self.batch;
        let fold = |history: Vec<Event>| {
            Projection::of(history.iter().take_while(|h| h.task_seq < event.task_seq))
        };
        // A task's first event has nothing before it to read.
        let history = || match event.task_seq {
            0 => Ok(Vec::new()),
            _ => history(),
        };
        let (kept, refolded) = match self.tasks.entry(event.task_id) {
            Entry::Occupied(slot) => {
                let kept = slot.into_mut();
                if kept.projection.next_seq() == event.task_seq {
                    (kept, 0)
                } else {
                    // Past the event (a batch built again) or behind it (a batch the kept
                    // projection never saw).
                    kept.projection = fold(history()?);
                    (kept, u64::from(event.task_seq))
                }
            }
            Entry::Vacant(slot) => {
                let projection = fold(history()?);
                (
                    slot.insert(Kept {
                        projection,
                        used: 0,
                    }),
                    u64::from(event.task_seq),
                )
            }
        };
        kept.used = batch;
        Ok((&mut kept.projection, refolded))
    }

    /// Ends a batch: forgets the projections of settled tasks this batch did not use, and the
    /// least recently used beyond [`KEPT`].
    pub fn end_batch(&mut self) {
        let batch = self.batch;
        self.tasks
            .retain(|_, kept| kept.used == batch || !kept.projection.settled());
        let excess = self.tasks.len().saturating_sub(KEPT);
        if excess > 0 {
            let mut ages: Vec<(u64, TaskId)> =
                self.tasks.iter().map(|(id, k)| (k.used, *id)).collect();
            ages.select_nth_unstable(excess - 1);
            for (_, id) in &ages[..excess] {
                self.tasks.remove(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendledger_core::fixtures::{accepted, history};
    use sendledger_core::{EventBody, Evidence};

    fn no_history() -> Result<Vec<Event>, ()> {
        panic!("the history should not have been read")
    }

    /// A task's events over several batches are projected from the kept projection; one that
    /// is not where the event needs it is folded from the history; a settled task is
    /// forgotten at the end of a batch without its events.
    #[test]
    fn a_kept_projection_is_used_until_its_task_settles() {
        let (task, body) = accepted();
        let events = history(
            task,
            vec![
                body,
                EventBody::SendIntended {
                    attempt: 1,
                    idempotency_key: None,
                },
                EventBody::Confirmed {
                    remote_id: "r-1".into(),
                    evidence: Evidence::Response { status: 201 },
                },
            ],
        );
        let mut kept = Projections::default();
        let all = || Ok::<_, ()>(events.clone());
        kept.start_batch();
        let (p, refolded) = kept.before(&events[0], no_history).unwrap();
        assert_eq!(refolded, 0);
        assert!(p.apply(&events[0]).is_none());
        kept.end_batch();
        kept.start_batch();
        let (p, refolded) = kept.before(&events[1], no_history).unwrap();
        assert_eq!(refolded, 0);
        p.apply(&events[1]);
        kept.end_batch();
        assert_eq!(kept.tasks.len(), 1);
        // The same batch built again: the kept projection is past it, so it is folded.
        kept.start_batch();
        let (p, refolded) = kept.before(&events[1], all).unwrap();
        assert_eq!(refolded, 1);
        p.apply(&events[1]);
        let (p, _) = kept.before(&events[2], no_history).unwrap();
        assert!(
            p.apply(&events[2]).is_some(),
            "the confirmation is a result"
        );
        kept.end_batch();
        assert_eq!(
            kept.tasks.len(),
            1,
            "kept for a duplicate in the next batch"
        );
        kept.start_batch();
        kept.end_batch();
        assert!(kept.tasks.is_empty(), "a settled task is forgotten");
    }

    /// Beyond the bound, the tasks used longest ago are forgotten.
    #[test]
    fn the_least_recently_used_are_forgotten_beyond_the_bound() {
        let mut kept = Projections::default();
        let first: Vec<Event> = (0..KEPT + 10)
            .map(|i| Event {
                task_id: TaskId::for_rejected_input("t", 0, i as i64),
                ..history(accepted().0, vec![accepted().1]).remove(0)
            })
            .collect();
        // The first ten each in a batch of its own, so they are the ten used longest ago.
        let (alone, rest) = first.split_at(10);
        for chunk in alone.chunks(1).chain(rest.chunks(1000)) {
            kept.start_batch();
            for e in chunk {
                let (p, _) = kept.before(e, no_history).unwrap();
                p.apply(e);
            }
            kept.end_batch();
        }
        assert_eq!(kept.tasks.len(), KEPT);
        for (i, e) in first.iter().enumerate() {
            assert_eq!(kept.tasks.contains_key(&e.task_id), i >= 10, "task {i}");
        }
    }
}
