//! The checks of a finished run: what a user would verify at the remote, on the results
//! topic and in the log.

use std::collections::{BTreeMap, BTreeSet};

use sendledger_core::event::ReviewReason;
use sendledger_core::result::{announcements, ResultStatus, TaskResult};
use sendledger_core::rules::{check_task, CheckConfig};
use sendledger_core::{Event, Phase, TaskId, TaskRequest};

use sendledger_kafka::LogRecord;

use super::{World, TARGET};

impl World {
    /// The checks of a finished run.
    pub(super) fn check(&mut self) {
        let violations = &mut self.report.violations;
        let lost = self.broker.lost_tasks();
        self.report.tasks_with_lost_events = lost.len();
        let key_of = |key: &str| {
            TaskRequest {
                tenant: "t".into(),
                operation: "create".into(),
                request_key: key.into(),
                target: TARGET.into(),
                payload: serde_json::json!({}),
                payload_text: None,
                metadata: Default::default(),
                version: 0,
            }
            .identity()
            .task_id()
        };
        // No side effect twice.
        for (key, records) in self.remote.records() {
            if records.len() > 1 && !lost.contains(&key_of(key)) {
                violations.push(format!("{} records at the remote for {key}", records.len()));
            }
        }
        self.report.records = self.remote.records().values().map(Vec::len).sum();
        // The log: every task's rules, and its final state.
        let log = self.broker.log();
        let mut tasks: BTreeMap<TaskId, Vec<Event>> = BTreeMap::new();
        for events in log.values() {
            for e in events {
                tasks.entry(e.task_id).or_default().push(e.clone());
            }
        }
        let config = CheckConfig {
            key_ttl_ms: None,
            max_policy_resends: 1,
        };
        let mut finals: BTreeMap<TaskId, sendledger_core::State> = BTreeMap::new();
        for (task, events) in &tasks {
            let seqs: Vec<u32> = events.iter().map(|e| e.task_seq).collect();
            if seqs.iter().enumerate().any(|(n, &s)| s != n as u32) {
                violations.push(format!("task {task}'s log is not one chain: {seqs:?}"));
            }
            let (state, broken) = check_task(events, config);
            for v in broken {
                violations.push(format!("task {task}: {} ({})", v.rule.name(), v.detail));
            }
            finals.insert(*task, state);
        }
        // Results: no two different terminal results of a task.
        let mut results: BTreeMap<String, Vec<TaskResult>> = BTreeMap::new();
        for record in self.broker.results() {
            match serde_json::from_slice::<TaskResult>(&record.payload) {
                Ok(r) => results.entry(r.task_id.clone()).or_default().push(r),
                Err(e) => violations.push(format!("an unreadable result: {e}")),
            }
        }
        for (task, rs) in &results {
            if lost.iter().any(|t| t.to_string() == *task) {
                continue;
            }
            let terminal: BTreeSet<(String, Option<String>)> = (rs.iter())
                .filter(|r| {
                    matches!(
                        r.status,
                        ResultStatus::Succeeded | ResultStatus::Rejected | ResultStatus::Failed
                    )
                })
                .map(|r| (format!("{:?}", r.status), r.remote_id.clone()))
                .collect();
            if terminal.len() > 1 {
                violations.push(format!(
                    "task {task} has two terminal results: {terminal:?}"
                ));
            }
        }
        results_as_records(&self.broker.results(), &tasks, &lost, violations);
        // Every request at a terminal result or in review, and what it says agrees with the
        // remote.
        let mut keys = BTreeSet::new();
        for reqs in self.requests.values() {
            for r in reqs {
                keys.insert(r.request_key.clone());
            }
        }
        for key in keys {
            let task = key_of(&key);
            let exempt = lost.contains(&task);
            let Some(state) = finals.get(&task) else {
                // The brokers lost every event of it after its request's offset was
                // committed: an instance that held a copy records it again when it takes the
                // partition over; one with no copy cannot know of it.
                if !exempt {
                    violations.push(format!("request {key} has no task in the log"));
                }
                continue;
            };
            let records = self.remote.records().get(&key).map_or(0, Vec::len);
            match state.phase {
                Phase::Succeeded => {
                    self.report.succeeded += 1;
                    if records == 0 {
                        violations
                            .push(format!("task {key} succeeded with no record at the remote"));
                    }
                }
                Phase::ManualReview => {
                    self.report.reviews += 1;
                    let why = match &state.review_reason {
                        Some(ReviewReason::MultipleMatches { .. }) => "multiple_matches",
                        Some(ReviewReason::DeadlinePassed { .. }) => "deadline_passed",
                        Some(ReviewReason::DivergentHistory { .. }) => "divergent_history",
                        Some(_) => "other",
                        None => "unknown",
                    };
                    *self.report.reviews_why.entry(why.into()).or_default() += 1;
                }
                Phase::Failed | Phase::Rejected => {
                    if state.phase == Phase::Failed {
                        self.report.failed += 1;
                    } else {
                        self.report.rejected += 1;
                    }
                    if records > 0 && !exempt {
                        violations.push(format!(
                            "task {key} ended {:?} with {records} record(s) at the remote",
                            state.phase
                        ));
                    }
                }
                other => {
                    violations.push(format!("task {key} ({task}) ended {other:?}, not settled"))
                }
            }
            let announced = (results.get(&task.to_string()).into_iter().flatten())
                .any(|r| r.status != ResultStatus::Conflict);
            if !announced {
                violations.push(format!("task {key} settled with no result published"));
            }
        }
        self.report.copies_truncated = self.instances.iter().map(|i| i.truncations).sum();
        let take_overs: u64 = self.instances.iter().map(|i| i.take_overs).sum();
        self.report.take_overs = self.report.take_overs.max(take_overs);
    }
}

/// Results counted as records: each result record names an event the log announces it by,
/// and none is on the results topic more often than the log announces it (once by the
/// event that makes it, once more by each later delivery of its request). Two records of
/// one result are two, whatever they say.
fn results_as_records(
    results: &[LogRecord],
    tasks: &BTreeMap<TaskId, Vec<Event>>,
    lost: &BTreeSet<TaskId>,
    violations: &mut Vec<String>,
) {
    let announced = announcements(tasks.values().flatten());
    let mut published: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for record in results {
        if let Ok(r) = serde_json::from_slice::<TaskResult>(&record.payload) {
            published.entry(r.event_id).or_insert((r.task_id, 0)).1 += 1;
        }
    }
    for (id, (task, records)) in published {
        if lost.iter().any(|t| t.to_string() == task) {
            continue;
        }
        let times = announced.get(&id).copied().unwrap_or(0);
        if records > times {
            violations.push(format!(
                "result {id} of task {task} is {records} records on the results topic; the log announces it {times} time(s)"
            ));
        }
    }
}
