//! Rebuilding a ledger from events written elsewhere: in kafka mode a partition's events are
//! read back from the events topic and applied to the local ledger of the instance that takes
//! the partition over, before it resumes the partition's tasks.
//!
//! Applying is idempotent: an event the ledger already holds (same task, same sequence
//! number, same content) is skipped, so a restore may start from an older checkpoint than
//! needed. Two different events at a task's sequence number (the ledger's and the log's, or two
//! of the log's: two owners each wrote a history of the task) are never passed over: the
//! task's events from there on are replaced by the later ones, and the task is reported
//! ([`Diverged`], with the replaced events) so that it goes to review. What the
//! ledger derives from events comes with them, as the task's writer would have appended it:
//! the task's summary (folded from all its events), its identity on acceptance, and the
//! processed marker of every delivery's requests offset. Timers are not restored: the engine
//! re-arms each unsettled task's timer when it resumes the task.

use std::collections::{hash_map, HashMap};

use sendledger_core::{
    fold, Event, EventBody, Identity, NewEvent, PayloadHash, Retained, State, TaskId,
};

pub use crate::diverged::Diverged;
use crate::error::{Error, Result};
use crate::journal::{Append, Logged};
use crate::ledger::Ledger;
use crate::retention::{removed_digest, Prune};
use crate::summary::TaskSummary;

/// A task of a restore: the events the ledger holds, those the restore adds, and the state
/// they fold to.
struct Restoring {
    held: Vec<Event>,
    /// The sequence numbers below this one stand for a history retention (or a snapshot of
    /// the log) reduced to what it keeps: `held` then begins with that `Pruned` event.
    covered: u32,
    /// The state the ledger's events fold to, before the restore: what the task index says.
    before: State,
    /// Indexes of the task's new events in the restore's list, in sequence order.
    new: Vec<usize>,
    state: State,
}

impl Restoring {
    fn new(held: Vec<Event>) -> Restoring {
        let covered = match held.first().map(|e| &e.body) {
            Some(EventBody::Pruned { retained }) => retained.events,
            _ => 0,
        };
        let state = fold(&held);
        Restoring {
            before: state.clone(),
            state,
            held,
            covered,
            new: Vec::new(),
        }
    }

    /// The index in `held` of the event at sequence number `seq` (at or past `covered`).
    fn index(&self, seq: u32) -> usize {
        let pruned = usize::from(self.covered > 0);
        pruned + (seq - self.covered) as usize
    }

    /// The sequence number after the last held event.
    fn held_next(&self) -> u32 {
        let pruned = u32::from(self.covered > 0);
        self.covered + self.held.len() as u32 - pruned
    }
}

/// What a restore step writes, and the tasks it found diverged.
#[derive(Debug, Default)]
pub struct Restored {
    pub append: Append,
    pub diverged: Vec<Diverged>,
}

impl Restored {
    /// The append recording this restore step of requests partition `partition`'s log, with
    /// where it ends in the log (none while a truncation is under way: a copy being truncated
    /// records its checkpoint with the truncation), and the reviews its diverged tasks owe,
    /// kept until recorded.
    pub fn into_append(
        self,
        partition: i32,
        checkpoint: Option<Logged>,
    ) -> (Append, Vec<Diverged>) {
        let Restored {
            mut append,
            diverged,
        } = self;
        append.restored = true;
        append.partition = Some(partition);
        append.reviews_owed = diverged.iter().map(|d| (partition, d.clone())).collect();
        if let Some(checkpoint) = checkpoint {
            append.cursors.extend(checkpoint.cursors(partition));
        }
        (append, diverged)
    }
}

/// What appending `events` (in the order they were written) to `ledger` takes: the events the
/// ledger does not hold yet, the summaries of their tasks, identities of first acceptances
/// and processed markers. A task whose events skip a sequence number is refused (the source
/// lost an event: restoring past it would fold a wrong state). A task whose events differ
/// from what the ledger (or an earlier event of `events`) holds at the same sequence number
/// is rebuilt from the later ones and listed in `diverged` with what they replaced.
pub fn restore_append(ledger: &Ledger, events: Vec<Event>) -> Result<Restored> {
    let mut append = Append::default();
    let mut diverged = Vec::new();
    // The tasks in the order they first appear, and where each is in that list. The ledger's
    // summaries of them are read at once: a task without one has no events in the ledger
    // (most tasks of a restore on an empty disk), so its events are not read.
    let mut index: HashMap<TaskId, usize> = HashMap::new();
    let mut ids = Vec::new();
    for e in &events {
        if let hash_map::Entry::Vacant(v) = index.entry(e.task_id) {
            v.insert(ids.len());
            ids.push(e.task_id);
        }
    }
    let mut tasks = Vec::with_capacity(ids.len());
    for (id, summary) in ids.iter().zip(ledger.task_summaries_of(&ids)?) {
        let held = match summary {
            Some(_) => ledger.task_events(*id)?,
            None => Vec::new(),
        };
        tasks.push(Restoring::new(held));
    }
    // The new events; one replaced by a later event of the log becomes `None`.
    let mut new: Vec<Option<NewEvent>> = Vec::with_capacity(events.len());
    for e in events {
        let task = &mut tasks[index[&e.task_id]];
        let held_len = task.held_next();
        let next_seq = held_len + task.new.len() as u32;
        if e.task_seq < next_seq {
            // What retention kept stands for these: there is nothing to compare them with.
            if e.task_seq < task.covered {
                continue;
            }
            let (at, body) = if e.task_seq < held_len {
                let held = &task.held[task.index(e.task_seq)];
                (held.at, &held.body)
            } else {
                let index = task.new[(e.task_seq - held_len) as usize];
                let held = new[index].as_ref().expect("a task's new events are kept");
                (held.at, &held.body)
            };
            if *body == e.body && at == e.at {
                continue;
            }
            // Two histories of the task from this event on (two owners each wrote one, or the
            // ledger holds events its log lost): the later one wins, and what it replaces is
            // kept as evidence.
            tracing::error!(task_id = %e.task_id, task_seq = e.task_seq, held = body.name(), logged = e.body.name(), "two different histories of a task: the log's later events replace the others, and the task goes to review");
            let kept_new = e.task_seq.saturating_sub(held_len) as usize;
            let cut = match e.task_seq < held_len {
                true => task.index(e.task_seq),
                false => task.held.len(),
            };
            let mut replaced: Vec<Event> = task.held.iter().skip(cut).cloned().collect();
            for index in task.new.drain(kept_new..) {
                if let Some(n) = new[index].take() {
                    replaced.push(n.with_lsn(0));
                }
            }
            diverged.push(Diverged {
                task_id: e.task_id,
                task_seq: e.task_seq,
                replaced,
            });
            task.held.truncate(cut);
            task.state = fold(&task.held);
            for &index in &task.new {
                let n = new[index].as_ref().expect("a task's new events are kept");
                task.state.apply(n.task_id, n.at, &n.body);
            }
            if e.task_seq < held_len {
                append.truncate_tasks.push((e.task_id, e.task_seq));
            }
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
        task.state.apply(e.task_id, e.at, &e.body);
        match &e.body {
            // A request without a version is its identity's; a versioned one is recorded as
            // its identity's latest version by its `RequestVersion`.
            EventBody::TaskAccepted {
                request,
                payload_hash,
                ..
            } if e.task_id == request.identity.task_id() => {
                append
                    .identities
                    .push((request.identity.clone(), e.task_id, *payload_hash));
            }
            EventBody::RequestVersion { version, .. } => {
                if let (Some(request), Some(hash)) = (&task.state.request, task.state.payload_hash)
                {
                    append
                        .versions
                        .push((request.identity.clone(), *version, e.task_id, hash));
                }
            }
            _ => {}
        }
        if let Some(source) = e.body.source() {
            append
                .offsets
                .push((source.topic.clone(), source.partition, source.offset));
        }
        task.new.push(new.len());
        new.push(Some(NewEvent {
            task_id: e.task_id,
            task_seq: e.task_seq,
            at: e.at,
            body: e.body,
        }));
    }
    append.versions = latest_versions(ledger, std::mem::take(&mut append.versions))?;
    append.events = Vec::with_capacity(new.len());
    append.events.extend(new.into_iter().flatten());
    for (id, task) in ids.iter().zip(&tasks).filter(|(_, t)| !t.new.is_empty()) {
        append.tasks.push((
            *id,
            TaskSummary {
                phase: task.state.phase,
                next_seq: task.state.next_seq,
            },
        ));
        append.reindex(*id, &task.before, &task.state);
    }
    Ok(Restored { append, diverged })
}

/// What installing `kept` takes: tasks of a partition known from a snapshot of its log by what
/// retention keeps of each (a settled task's [`Retained`], standing for its history up to
/// [`Retained::events`]), recorded as a removal of that history would leave them (its summary,
/// its `retained` entry counted by the ledger's record of removals, its identity's latest
/// version), with no event. A task the ledger holds anything of is left as it is, unless
/// `replace` (a copy older than its log's start, brought up to the snapshot): then one held
/// otherwise than as this [`Retained`] alone has its events dropped from the index and is
/// recorded as the snapshot says. Of several versions of one identity only the latest above
/// the ledger's is recorded as latest. The events the log recorded after the snapshot restore
/// over them as over a task retention removed ([`restore_append`]).
pub fn install_append(
    ledger: &Ledger,
    kept: Vec<(TaskId, Retained)>,
    replace: bool,
) -> Result<Append> {
    let mut append = Append::default();
    let ids: Vec<TaskId> = kept.iter().map(|(id, _)| *id).collect();
    let held = ledger.task_summaries_of(&ids)?;
    let mut versions = Vec::new();
    for ((task, retained), held) in kept.into_iter().zip(held) {
        let mut replaces = None;
        if held.is_some() {
            if !replace {
                continue;
            }
            let stored = crate::reads::task_stored(ledger.db(), task)?;
            let events = stored.history(task, stored.kept()?.map(|(r, _)| r).as_ref())?;
            let same = matches!(events.as_slice(), [e] if matches!(&e.body, EventBody::Pruned { retained: r } if **r == retained));
            if same {
                continue;
            }
            append.truncate_tasks.push((task, 0));
            append.reindex(task, &fold(&events), &fold([&retained.event(task)]));
            replaces = stored.retained;
        }
        if retained.request_version > 0 {
            let (identity, version) = (retained.identity.clone(), retained.request_version);
            versions.push((identity, version, task, retained.payload_hash));
        }
        append.tasks.push((
            task,
            TaskSummary {
                phase: retained.phase(),
                next_seq: retained.events,
            },
        ));
        append.prune.push(Prune {
            task,
            retained,
            events: Vec::new(),
            seqs: Vec::new(),
            digest: removed_digest(None, &[]),
            replaces,
            index: None,
        });
    }
    append.versions = latest_versions(ledger, versions)?;
    Ok(append)
}

/// Of `versions` (identity, version, task, payload hash), the latest of each identity, when it
/// is later than the one the ledger holds: a snapshot lists tasks in no particular order.
fn latest_versions(
    ledger: &Ledger,
    versions: Vec<(Identity, u32, TaskId, PayloadHash)>,
) -> Result<Vec<(Identity, u32, TaskId, PayloadHash)>> {
    let mut latest: HashMap<Identity, (u32, TaskId, PayloadHash)> = HashMap::new();
    for (identity, version, task, hash) in versions {
        match latest.entry(identity) {
            hash_map::Entry::Occupied(o) if o.get().0 >= version => {}
            hash_map::Entry::Occupied(mut o) => {
                o.insert((version, task, hash));
            }
            hash_map::Entry::Vacant(v) => {
                v.insert((version, task, hash));
            }
        }
    }
    let mut out = Vec::with_capacity(latest.len());
    for (identity, (version, task, hash)) in latest {
        let held = ledger.latest_version_above_0(&identity)?;
        if held.is_none_or(|l| l.version < version) {
            out.push((identity, version, task, hash));
        }
    }
    Ok(out)
}

/// What truncating the ledger's copy of requests partition `partition` to its log of record
/// takes, once the whole log was restored over it: `logged` is how many events the log holds
/// of each of its tasks. Every task of the partition the ledger holds more events of (the log
/// lost events the ledger recorded after their commit, or never held the task at all) loses
/// the extra ones and is listed in `diverged` with them; a task none of whose events is left
/// is forgotten (its events, summary and listings). Reads every task summary of the ledger:
/// for the rare take-over that finds a copy ahead of its log, never on the common path.
pub fn truncate_append(
    ledger: &Ledger,
    partition: i32,
    logged: &HashMap<TaskId, u32>,
) -> Result<Restored> {
    let mut append = Append::default();
    let mut diverged = Vec::new();
    for item in ledger.task_summaries() {
        let (id, summary) = item?;
        let kept = logged.get(&id).copied().unwrap_or(0);
        if summary.next_seq <= kept || ledger.request_partition(id)? != Some(partition) {
            continue;
        }
        let held = ledger.task_events(id)?;
        let before = fold(&held);
        let after = fold(&held[..kept as usize]);
        tracing::error!(task_id = %id, kept, dropped = held.len() - kept as usize, "the ledger holds events of a task its log of record does not: they are dropped, and the task goes to review when they matter");
        append.truncate_tasks.push((id, kept));
        if kept == 0 {
            append.forget_tasks.push(id);
        } else {
            append.tasks.push((
                id,
                TaskSummary {
                    phase: after.phase,
                    next_seq: after.next_seq,
                },
            ));
        }
        append.reindex(id, &before, &after);
        diverged.push(Diverged {
            task_id: id,
            task_seq: kept,
            replaced: held[kept as usize..].to_vec(),
        });
    }
    Ok(Restored { append, diverged })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LedgerOptions;
    use sendledger_core::event::Evidence;
    use sendledger_core::fixtures::accepted;
    use sendledger_core::Phase;

    fn event(task: TaskId, seq: u32, at: u64, body: EventBody) -> Event {
        Event {
            lsn: 0,
            task_id: task,
            task_seq: seq,
            at,
            body,
        }
    }

    fn empty_ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        (dir, ledger)
    }

    fn intent(attempt: u32) -> EventBody {
        EventBody::SendIntended {
            attempt,
            idempotency_key: None,
        }
    }

    fn restore(ledger: &Ledger, events: &[Event]) {
        let mut append = restore_append(ledger, events.to_vec()).unwrap().append;
        append.restored = true;
        ledger.append_blocking(append).unwrap();
    }

    /// The ledger held its own copy of a task: an intent and an unknown outcome that the log
    /// of record does not hold, where the log has another instance's intent and confirmation.
    /// The log's events replace the copy from the first that differs, the index forgets the
    /// copy's longer tail, and the summary is folded from the log's history. Events the ledger
    /// holds as they are in the log are skipped.
    #[test]
    fn a_ledger_copy_that_differs_from_the_log_is_replaced_by_it() {
        let (_dir, ledger) = empty_ledger();
        let (task, body) = accepted();
        let unknown = EventBody::SendUnknown {
            attempt: 1,
            cause: sendledger_core::event::UnknownCause::Recovery,
        };
        let first = event(task, 0, 10, body);
        restore(
            &ledger,
            &[
                first.clone(),
                event(task, 1, 20, intent(1)),
                event(task, 2, 30, unknown.clone()),
                event(task, 3, 40, unknown),
            ],
        );
        assert_eq!(ledger.task_events(task).unwrap().len(), 4);

        let confirmed = EventBody::Confirmed {
            remote_id: "rec-1".into(),
            evidence: Evidence::Response { status: 201 },
        };
        let log = [
            first,
            event(task, 1, 25, intent(1)),
            event(task, 2, 35, confirmed),
        ];
        let Restored { append, diverged } = restore_append(&ledger, log.to_vec()).unwrap();
        assert_eq!(append.truncate_tasks, [(task, 1)]);
        assert_eq!(append.events.len(), 2, "the first event is held as it is");
        assert_eq!(diverged.len(), 1);
        assert_eq!((diverged[0].task_id, diverged[0].task_seq), (task, 1));
        let replaced: Vec<(u32, &str)> = diverged[0]
            .replaced
            .iter()
            .map(|e| (e.task_seq, e.body.name()))
            .collect();
        assert_eq!(
            replaced,
            [(1, "SendIntended"), (2, "SendUnknown"), (3, "SendUnknown")],
            "the copy's history from the first difference, as evidence"
        );
        restore(&ledger, &log);
        let held: Vec<(u32, u64, EventBody)> = ledger
            .task_events(task)
            .unwrap()
            .into_iter()
            .map(|e| (e.task_seq, e.at, e.body))
            .collect();
        let logged: Vec<(u32, u64, EventBody)> = log
            .iter()
            .map(|e| (e.task_seq, e.at, e.body.clone()))
            .collect();
        assert_eq!(held, logged);
        let summary = ledger.task_summary(task).unwrap().unwrap();
        assert_eq!(summary.phase, Phase::Succeeded);
        assert_eq!(summary.next_seq, 3);
        // One event read by its sequence number: the log's, and none past the log's last.
        let last = ledger.task_event(task, 2).unwrap().map(|e| (e.at, e.body));
        assert_eq!(last, Some((35, logged[2].2.clone())));
        assert_eq!(ledger.task_event(task, 3).unwrap(), None);

        // Restoring the same log again changes nothing.
        let again = restore_append(&ledger, log.to_vec()).unwrap();
        assert!(again.append.events.is_empty() && again.append.truncate_tasks.is_empty());
        assert!(again.diverged.is_empty());
    }

    /// The log holds two different events at one sequence number within one restore (a
    /// writer's transaction committed after another's): the later one and what follows it
    /// are the task's events, nothing of the earlier one is indexed, and the earlier history
    /// is reported (an intent whose outcome was unknown: a request that may have been sent,
    /// which the kept history does not account for).
    #[test]
    fn a_later_event_at_the_same_sequence_number_replaces_one_of_the_same_restore() {
        let (_dir, ledger) = empty_ledger();
        let (task, body) = accepted();
        let unknown = EventBody::SendUnknown {
            attempt: 1,
            cause: sendledger_core::event::UnknownCause::Timeout,
        };
        let confirmed = EventBody::Confirmed {
            remote_id: "rec-1".into(),
            evidence: Evidence::Response { status: 201 },
        };
        let log = [
            event(task, 0, 10, body),
            event(task, 1, 20, intent(1)),
            event(task, 2, 30, unknown.clone()),
            event(task, 3, 40, unknown),
            event(task, 1, 25, intent(1)),
            event(task, 2, 35, confirmed),
        ];
        let Restored { append, diverged } = restore_append(&ledger, log.to_vec()).unwrap();
        assert!(
            append.truncate_tasks.is_empty(),
            "the ledger held none of them"
        );
        assert_eq!(diverged.len(), 1);
        let replaced: Vec<(u64, u32, u64)> = diverged[0]
            .replaced
            .iter()
            .map(|e| (e.lsn, e.task_seq, e.at))
            .collect();
        assert_eq!(replaced, [(0, 1, 20), (0, 2, 30), (0, 3, 40)]);
        let seqs: Vec<(u32, u64)> = append.events.iter().map(|e| (e.task_seq, e.at)).collect();
        assert_eq!(seqs, [(0, 10), (1, 25), (2, 35)]);
        restore(&ledger, &log);
        let held: Vec<(u32, u64)> = ledger
            .task_events(task)
            .unwrap()
            .iter()
            .map(|e| (e.task_seq, e.at))
            .collect();
        assert_eq!(held, [(0, 10), (1, 25), (2, 35)]);
        let summary = ledger.task_summary(task).unwrap().unwrap();
        assert_eq!((summary.phase, summary.next_seq), (Phase::Succeeded, 3));
    }

    /// A settled task installed from a snapshot by what retention keeps of it: the log's
    /// events it stands for are passed over when read again, an event recorded after it is
    /// restored after it, the identity answers with the task, and a different event after it
    /// is a second history, reported.
    #[test]
    fn a_task_installed_by_what_retention_keeps_restores_only_what_follows_it() {
        let (_dir, ledger) = empty_ledger();
        let (task, body) = accepted();
        let confirmed = EventBody::Confirmed {
            remote_id: "rec-1".into(),
            evidence: Evidence::Response { status: 201 },
        };
        let log = [
            event(task, 0, 10, body.clone()),
            event(task, 1, 20, intent(1)),
            event(task, 2, 30, confirmed),
        ];
        let retained = Retained::of(&log).expect("settled with a result");
        let mut install = install_append(&ledger, vec![(task, retained.clone())], false).unwrap();
        install.restored = true;
        ledger.append_blocking(install).unwrap();
        let summary = ledger.task_summary(task).unwrap().unwrap();
        assert_eq!((summary.phase, summary.next_seq), (Phase::Succeeded, 3));
        assert_eq!(ledger.retained(task).unwrap(), Some(retained.clone()));
        let identity = retained.identity.clone();
        assert_eq!(
            ledger.latest_version(&identity).unwrap().map(|l| l.task_id),
            Some(task)
        );
        // Installing it again changes nothing.
        let again = install_append(&ledger, vec![(task, retained.clone())], false).unwrap();
        assert!(again.tasks.is_empty() && again.prune.is_empty());
        let again = install_append(&ledger, vec![(task, retained)], true).unwrap();
        assert!(
            again.tasks.is_empty(),
            "held as the snapshot says: nothing to replace"
        );

        let source = body.source().unwrap().clone();
        let duplicate = event(task, 3, 40, EventBody::DuplicateDelivery { source });
        let mut tail = log.to_vec();
        tail.push(duplicate.clone());
        let Restored { append, diverged } = restore_append(&ledger, tail.clone()).unwrap();
        assert!(diverged.is_empty());
        let new: Vec<u32> = append.events.iter().map(|e| e.task_seq).collect();
        assert_eq!(new, [3], "only what follows the kept history is new");
        restore(&ledger, &tail);
        let events = ledger.task_events(task).unwrap();
        let held: Vec<(u32, &str)> = events.iter().map(|e| (e.task_seq, e.body.name())).collect();
        assert_eq!(held, [(0, "Pruned"), (3, "DuplicateDelivery")]);
        assert_eq!(ledger.task_summary(task).unwrap().unwrap().next_seq, 4);
        assert!(restore_append(&ledger, tail)
            .unwrap()
            .append
            .events
            .is_empty());

        // Another event at sequence number 3: a second history, from there.
        let other = event(task, 3, 45, intent(2));
        let Restored { append, diverged } = restore_append(&ledger, vec![other]).unwrap();
        assert_eq!(append.truncate_tasks, [(task, 3)]);
        assert_eq!(diverged.len(), 1);
        assert_eq!(diverged[0].replaced.len(), 1);
        assert_eq!(diverged[0].replaced[0].body.name(), "DuplicateDelivery");
    }

    /// Kafka mode: a copy of a partition owned elsewhere is written by its restore while
    /// retention plans removals from it. A removal (or a forgetting) planned before the restore
    /// recorded more of the task is refused whole; planned again, it takes everything. So is
    /// a snapshot's install planned before the task's actor removed its history.
    #[test]
    fn a_removal_planned_before_a_restore_recorded_more_of_its_task_is_refused() {
        let (_dir, ledger) = empty_ledger();
        let (task, body) = accepted();
        let confirmed = EventBody::Confirmed {
            remote_id: "rec-1".into(),
            evidence: Evidence::Response { status: 201 },
        };
        let source = body.source().unwrap().clone();
        let mut log = vec![
            event(task, 0, 10, body),
            event(task, 1, 20, intent(1)),
            event(task, 2, 30, confirmed),
        ];
        restore(&ledger, &log);
        let check = sendledger_core::CheckConfig::default();
        let removal = |plan| crate::Append {
            prune: vec![plan],
            ..crate::Append::default()
        };
        let names = |ledger: &Ledger| -> Vec<(u32, &'static str)> {
            let events = ledger.task_events(task).unwrap();
            events.iter().map(|e| (e.task_seq, e.body.name())).collect()
        };

        let planned = ledger
            .prune_plan(task, 1_000, None, check)
            .unwrap()
            .unwrap();
        log.push(event(
            task,
            3,
            40,
            EventBody::DuplicateDelivery {
                source: source.clone(),
            },
        ));
        restore(&ledger, &log);
        let refused = ledger.append_blocking(removal(planned)).unwrap_err();
        assert!(
            matches!(refused, Error::RemovalOutdated { .. }),
            "{refused}"
        );
        assert_eq!(ledger.retained(task).unwrap(), None);
        assert_eq!(names(&ledger).len(), 4, "nothing of the task removed");

        let planned = ledger
            .prune_plan(task, 1_000, None, check)
            .unwrap()
            .unwrap();
        ledger.append_blocking(removal(planned)).unwrap();
        assert_eq!(names(&ledger), [(0, "Pruned")]);

        let planned = ledger.forget_plan(task, 1_000).unwrap().unwrap();
        log.push(event(task, 4, 50, EventBody::DuplicateDelivery { source }));
        restore(&ledger, &log);
        let forget = crate::Append {
            forget: vec![planned],
            ..crate::Append::default()
        };
        let refused = ledger.append_blocking(forget).unwrap_err();
        assert!(
            matches!(refused, Error::RemovalOutdated { .. }),
            "{refused}"
        );
        assert_eq!(names(&ledger), [(0, "Pruned"), (4, "DuplicateDelivery")]);

        // A snapshot's install over a task the copy holds whole, planned before its actor
        // removed the task's history: refused too, and what the actor kept stays.
        let other = TaskId([9; 16]);
        let history: Vec<Event> = (log.iter().take(3))
            .map(|e| Event {
                task_id: other,
                ..e.clone()
            })
            .collect();
        restore(&ledger, &history);
        let kept = Retained::of(&history).unwrap();
        let install = install_append(&ledger, vec![(other, kept)], true).unwrap();
        let planned = ledger
            .prune_plan(other, 1_000, None, check)
            .unwrap()
            .unwrap();
        let by_actor = planned.retained.clone();
        ledger.append_blocking(removal(planned)).unwrap();
        let refused = ledger.append_blocking(install).unwrap_err();
        assert!(
            matches!(refused, Error::RemovalOutdated { .. }),
            "{refused}"
        );
        assert_eq!(ledger.retained(other).unwrap(), Some(by_actor));
    }

    /// A copy ahead of its log: the tasks the ledger holds more of than the log lose the
    /// extra events (listed as evidence), one the log never held is forgotten, one the log
    /// holds alike is left, and so are tasks of other partitions. The evidence survives its
    /// stored form.
    #[test]
    fn a_copy_ahead_of_its_log_is_truncated_to_it() {
        let (_dir, ledger) = empty_ledger();
        let (task, body) = accepted();
        let confirmed = EventBody::Confirmed {
            remote_id: "rec-1".into(),
            evidence: Evidence::Response { status: 201 },
        };
        let other = TaskId([7; 16]);
        let gone = TaskId([8; 16]);
        let mut elsewhere = body.clone();
        if let EventBody::TaskAccepted { source, .. } = &mut elsewhere {
            source.partition += 1;
        }
        let partition = body.source().unwrap().partition;
        restore(
            &ledger,
            &[
                event(task, 0, 10, body.clone()),
                event(task, 1, 20, intent(1)),
                event(task, 2, 30, confirmed),
                event(gone, 0, 10, body.clone()),
                event(other, 0, 10, elsewhere),
                event(other, 1, 20, intent(1)),
            ],
        );
        let logged = HashMap::from([(task, 1)]);
        let Restored { append, diverged } = truncate_append(&ledger, partition, &logged).unwrap();
        let mut found: Vec<(TaskId, u32, usize)> = (diverged.iter())
            .map(|d| (d.task_id, d.task_seq, d.replaced.len()))
            .collect();
        found.sort();
        let mut wanted = vec![(task, 1, 2), (gone, 0, 1)];
        wanted.sort();
        assert_eq!(found, wanted);
        assert_eq!(append.forget_tasks, [gone]);
        for d in &diverged {
            assert_eq!(Diverged::decode(d.task_id, &d.encode()).unwrap(), *d);
        }
        let mut append = append;
        append.restored = true;
        ledger.append_blocking(append).unwrap();
        let summary = ledger.task_summary(task).unwrap().unwrap();
        assert_eq!((summary.phase, summary.next_seq), (Phase::Accepted, 1));
        assert_eq!(ledger.task_events(task).unwrap().len(), 1);
        assert_eq!(ledger.task_summary(gone).unwrap(), None);
        assert!(ledger.task_events(gone).unwrap().is_empty());
        assert_eq!(ledger.task_events(other).unwrap().len(), 2);
        let unsettled: Vec<TaskId> = (ledger.active_tasks().unwrap().into_iter())
            .map(|(id, _)| id)
            .collect();
        assert!(unsettled.contains(&task) && !unsettled.contains(&gone));
    }
}
