//! [`Rule::VersionsInOrder`] across tasks: a version of a request records its first intent
//! only once the version before it settled, and that one records no intent after it.
//! (Within one task, the rule is checked by [`sendledger_core::rules`].)

use sendledger_core::audit::{AuditReport, Finding};
use sendledger_core::{EventBody, PreviousVersion, Rule, State, TaskId};

use super::Check;
use crate::error::Result;

impl Check<'_> {
    /// Checks each task that follows an earlier version (`followers`: the task and the version
    /// its `RequestVersion` names) against that version's events. A task whose history was
    /// removed, or whose earlier version was forgotten, is not checked (what was removed was
    /// checked before it went).
    pub(super) fn versions(
        &self,
        mut followers: Vec<(TaskId, PreviousVersion)>,
        report: &mut AuditReport,
    ) -> Result<()> {
        // A task closed twice (its events were read again) is checked once.
        followers.sort_unstable_by_key(|(task, _)| *task);
        followers.dedup_by_key(|(task, _)| *task);
        for (task, previous) in followers {
            let own = self.events_before(task, u64::MAX)?;
            let Some(first) = own.iter().find(|e| e.body.intent().is_some()) else {
                continue;
            };
            let earlier = self.events_before(previous.task_id, u64::MAX)?;
            if first.lsn == 0 || earlier.is_empty() {
                continue;
            }
            let mut flag = |lsns: Vec<u64>, detail: String| {
                report.violations.push(Finding {
                    task_id: Some(task.to_string()),
                    rule: Rule::VersionsInOrder.name(),
                    lsns,
                    detail,
                });
            };
            let mut state = State::default();
            let mut checked = false;
            for e in &earlier {
                // What retention kept of a task stands at its result's position.
                let at = match &e.body {
                    EventBody::Pruned { retained } => retained.result_lsn,
                    _ => e.lsn,
                };
                if at > first.lsn && !checked {
                    checked = true;
                    if !state.phase.is_terminal() {
                        flag(
                            vec![first.lsn],
                            format!(
                                "its first intent was recorded while version {} (task {}) was {}",
                                previous.version,
                                previous.task_id,
                                state.phase.name()
                            ),
                        );
                    }
                }
                if at > first.lsn && e.body.intent().is_some() {
                    flag(
                        vec![first.lsn, e.lsn],
                        format!(
                            "version {} (task {}) recorded an intent after this version's first",
                            previous.version, previous.task_id
                        ),
                    );
                }
                state.apply(e.task_id, e.at, &e.body);
            }
            if !checked && !state.phase.is_terminal() {
                flag(
                    vec![first.lsn],
                    format!(
                        "its first intent was recorded while version {} (task {}) is {}",
                        previous.version,
                        previous.task_id,
                        state.phase.name()
                    ),
                );
            }
        }
        Ok(())
    }
}
