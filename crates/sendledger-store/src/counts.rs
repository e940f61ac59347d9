//! What the ledger holds, counted: tasks by state and the open unknown outcomes. The admin
//! endpoint reports these as gauges.

use std::collections::BTreeMap;

use sendledger_core::{fold, Phase};

use crate::error::Result;
use crate::ledger::Ledger;

/// The tasks of a ledger, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Tasks by their current state; a state no task is in is absent.
    pub by_phase: BTreeMap<Phase, u64>,
    /// Tasks whose latest attempt's outcome is unknown.
    pub unknowns_open: u64,
    /// When the oldest open unknown became unknown (ms since the epoch).
    pub oldest_unknown_since: Option<u64>,
}

impl Ledger {
    /// Counts the tasks by state from their summaries, and dates the oldest open unknown by
    /// folding the events of each unknown task. Blocking: call it through [`Ledger::read`].
    pub fn task_counts(&self) -> Result<TaskCounts> {
        let mut by_phase = BTreeMap::new();
        let mut unknown = Vec::new();
        for item in self.task_summaries() {
            let (task_id, summary) = item?;
            *by_phase.entry(summary.phase).or_default() += 1;
            if summary.phase == Phase::Unknown {
                unknown.push(task_id);
            }
        }
        let mut oldest_unknown_since: Option<u64> = None;
        for task_id in &unknown {
            if let Some(since) = fold(&self.task_events(*task_id)?).unknown_since {
                oldest_unknown_since = Some(oldest_unknown_since.map_or(since, |o| o.min(since)));
            }
        }
        Ok(TaskCounts {
            by_phase,
            unknowns_open: unknown.len() as u64,
            oldest_unknown_since,
        })
    }
}

#[cfg(test)]
mod tests {
    use sendledger_core::{
        EventBody, Evidence, Limits, NewEvent, Source, TaskId, TaskRequest, UnknownCause,
    };
    use serde_json::json;

    use super::*;
    use crate::{Append, LedgerOptions, TaskSummary};

    /// Appends `bodies` as the whole history of task `key`, the first at `at`.
    fn task(ledger: &Ledger, key: &str, at: u64, bodies: Vec<EventBody>) -> TaskId {
        let request = TaskRequest {
            tenant: "acme".into(),
            operation: "op".into(),
            request_key: key.into(),
            target: "sim".into(),
            payload: json!({ "n": 1 }),
            payload_text: None,
            metadata: Default::default(),
            version: 0,
        }
        .accept(&Limits::default())
        .unwrap();
        let task_id = request.task_id();
        let mut all = vec![EventBody::TaskAccepted {
            payload_hash: request.payload_hash(),
            request,
            source: Source {
                topic: "t".into(),
                partition: 0,
                offset: 0,
            },
        }];
        all.extend(bodies);
        let events: Vec<NewEvent> = all
            .into_iter()
            .enumerate()
            .map(|(i, body)| NewEvent {
                task_id,
                task_seq: i as u32,
                at: at + i as u64,
                body,
            })
            .collect();
        let state = fold(
            &events
                .iter()
                .map(|e| e.clone().with_lsn(0))
                .collect::<Vec<_>>(),
        );
        let summary = TaskSummary {
            phase: state.phase,
            next_seq: state.next_seq,
        };
        ledger
            .append_blocking(Append {
                events,
                tasks: vec![(task_id, summary)],
                ..Append::default()
            })
            .unwrap();
        task_id
    }

    #[test]
    fn task_counts_count_every_task_and_date_the_oldest_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
        let intend = || EventBody::SendIntended {
            attempt: 1,
            idempotency_key: None,
        };
        let unknown = || EventBody::SendUnknown {
            attempt: 1,
            cause: UnknownCause::Timeout,
        };
        task(&ledger, "a", 1_000, vec![intend(), unknown()]);
        task(&ledger, "b", 5_000, vec![intend(), unknown()]);
        let ok = EventBody::Confirmed {
            remote_id: "r".into(),
            evidence: Evidence::Response { status: 201 },
        };
        task(&ledger, "c", 500, vec![intend(), ok]);
        task(&ledger, "d", 700, vec![intend()]);

        let g = ledger.task_counts().unwrap();
        assert_eq!(g.unknowns_open, 2);
        // TaskAccepted at 1000, SendIntended at 1001, SendUnknown at 1002.
        assert_eq!(g.oldest_unknown_since, Some(1_002));
        let by_phase: Vec<(Phase, u64)> = g.by_phase.into_iter().collect();
        assert_eq!(
            by_phase,
            [
                (Phase::Sending, 1),
                (Phase::Unknown, 2),
                (Phase::Succeeded, 1)
            ]
        );
    }
}
