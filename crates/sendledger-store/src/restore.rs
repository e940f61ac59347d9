//! Rebuilding a ledger from events written elsewhere: in kafka mode a partition's events are
//! read back from the events topic and applied to the local ledger of the instance that takes
//! the partition over, before it resumes the partition's tasks.
//!
//! Applying is idempotent: an event the ledger already holds (same task, same sequence
//! number) is skipped, so a restore may start from an older checkpoint than needed. What the
//! ledger derives from events comes with them, as the task's writer would have appended it:
//! the task's summary (folded from all its events), its identity on acceptance, and the
//! processed marker of every delivery's requests offset. Timers are not restored: the engine
//! re-arms each unsettled task's timer when it resumes the task.

use std::collections::BTreeMap;

use sendledger_core::{fold, Event, EventBody, NewEvent, TaskId};

use crate::error::{Error, Result};
use crate::journal::Append;
use crate::ledger::{Ledger, TaskSummary};

/// What appending `events` (in the order they were written) to `ledger` takes: the events the
/// ledger does not hold yet, the summaries of their tasks, identities of first acceptances
/// and processed markers. A task whose events skip a sequence number is refused (the source
/// lost an event: restoring past it would fold a wrong state).
pub fn restore_append(ledger: &Ledger, events: &[Event]) -> Result<Append> {
    let mut append = Append::default();
    let mut tasks: BTreeMap<TaskId, Vec<Event>> = BTreeMap::new();
    for e in events {
        let history = match tasks.entry(e.task_id) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            // A task without a summary has no events in the ledger: one point read instead
            // of a scan of its events (most tasks of a restore on an empty disk).
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(match ledger.task_summary(e.task_id)? {
                    Some(_) => ledger.task_events(e.task_id)?,
                    None => Vec::new(),
                })
            }
        };
        let next_seq = history.len() as u32;
        if e.task_seq < next_seq {
            continue;
        }
        if e.task_seq > next_seq {
            return Err(Error::Corrupt {
                lsn: e.lsn,
                detail: format!(
                    "task {} continues at event {} but the ledger holds {next_seq} of its events: an event is missing from the source",
                    e.task_id, e.task_seq
                ),
            });
        }
        history.push(e.clone());
        append.events.push(NewEvent {
            task_id: e.task_id,
            task_seq: e.task_seq,
            at: e.at,
            body: e.body.clone(),
        });
        match &e.body {
            EventBody::TaskAccepted {
                request,
                payload_hash,
                source,
            } => {
                append
                    .identities
                    .push((request.identity.clone(), e.task_id, *payload_hash));
                append
                    .offsets
                    .push((source.topic.clone(), source.partition, source.offset));
            }
            EventBody::DuplicateDelivery { source, .. }
            | EventBody::RequestConflict { source, .. }
            | EventBody::InputRejected { source, .. } => {
                append
                    .offsets
                    .push((source.topic.clone(), source.partition, source.offset));
            }
            _ => {}
        }
    }
    let restored: std::collections::BTreeSet<TaskId> =
        append.events.iter().map(|e| e.task_id).collect();
    for (task, history) in tasks.iter().filter(|(t, _)| restored.contains(t)) {
        let state = fold(history);
        append.tasks.push((
            *task,
            TaskSummary {
                phase: state.phase,
                next_seq: state.next_seq,
            },
        ));
    }
    Ok(append)
}
