//! The audit's report and the accounting every replay shares.
//!
//! A replay (of the local ledger in the store crate, of the events topic in the Kafka crate) feeds
//! each task's events in task order to a [`TaskAudit`], which checks them against the rules of
//! `docs/rules.md` ([`crate::rules`]) and counts what they add to the [`AuditReport`]; it feeds
//! every LSN in order to an [`LsnSequence`]. What it finds about the log itself is an
//! [`Integrity`] finding. So both replays report the same rules with the same names.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::event::{Event, EventBody, Evidence, UnknownCause};
use crate::ids::TaskId;
use crate::rules::{CheckConfig, TaskCheck, Violation};
use crate::state::{Phase, State};

/// Damage to the log itself (as opposed to a [`crate::rules::Rule`] broken by a task's events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// LSNs run 1, 2, 3... with no gap and no position holding two different events.
    LsnContiguous,
    /// Every stored event decodes (known envelope version, valid bincode, stored under its own
    /// LSN; on the events topic: a valid JSON event record).
    EventDecodable,
    /// The local ledger's indexes agree with the log: every event is indexed under its task
    /// and sequence number, every index entry points to that event, and each task's stored
    /// summary (phase, number of events) equals the fold of its events.
    IndexConsistent,
    /// What retention kept of the tasks it removed is what it wrote: the ledger's entries add
    /// up to its record of them, and each matches the archive's copy when there is one.
    RetainedIntact,
    /// The archive of removed histories is as written: every frame decodes, every checkpoint
    /// matches what it covers and follows the one before, each history matches the digest kept
    /// with it, and the chain ends where the ledger's record of its removals does.
    ArchiveIntact,
}

impl Integrity {
    pub fn name(self) -> &'static str {
        match self {
            Integrity::LsnContiguous => "lsn-contiguous",
            Integrity::EventDecodable => "event-decodable",
            Integrity::IndexConsistent => "index-consistent",
            Integrity::RetainedIntact => "retained-intact",
            Integrity::ArchiveIntact => "archive-intact",
        }
    }
}

/// A broken rule or a damaged log, naming the task (when it is known) and the LSNs involved.
///
/// `rule` is a [`crate::rules::Rule`] name (`intent-before-attempt`, `no-blind-resend`, `unknown-not-failed`,
/// `terminal-is-final`, `sequence`, `policy-resend-limit`, `retry-only-not-sent`,
/// `fallback-only-on-proof`) or an [`Integrity`] name (`lsn-contiguous`,
/// `event-decodable`, `index-consistent`, `retained-intact`, `archive-intact`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub task_id: Option<String>,
    pub rule: &'static str,
    pub lsns: Vec<u64>,
    pub detail: String,
}

impl Finding {
    pub fn integrity(
        kind: Integrity,
        task: Option<TaskId>,
        lsns: Vec<u64>,
        detail: impl Into<String>,
    ) -> Finding {
        Finding {
            task_id: task.map(|t| t.to_string()),
            rule: kind.name(),
            lsns,
            detail: detail.into(),
        }
    }
}

/// What an audit found. Violations are listed in the order they were found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    /// What was replayed: `ledger <dir>` or `kafka topic <name>`.
    pub source: String,
    pub events: u64,
    pub last_lsn: u64,
    pub tasks: u64,
    pub tasks_by_state: BTreeMap<&'static str, u64>,
    pub attempts: u64,
    pub unknown_outcomes: u64,
    pub unknowns_resolved_by_lookup: u64,
    pub unknowns_resolved_by_same_key_resend: u64,
    pub unknowns_resolved_by_authorized_resend: u64,
    pub unknowns_resolved_by_operator: u64,
    pub unknowns_open: u64,
    pub recovered_after_crash: u64,
    /// Waits recorded before an intent (`SendDeferred`: the target's breaker was open).
    pub waits_before_intent: u64,
    /// Failed tasks retried (`TaskRetried`: a new version of the task).
    pub retries: u64,
    /// Compensations of multi-step tasks' steps started (`CompensationStarted`).
    pub compensations: u64,
    pub manual_reviews_open: u64,
    pub duplicates_dropped: u64,
    pub conflicts: u64,
    pub rejected_inputs: u64,
    /// Operators' decisions recorded (a resolution, a note, a retry, an order to undo).
    pub operator_decisions: u64,
    /// Of those, decisions recorded with no named credential (on a stopped ledger's files,
    /// under the shared `admin.token`, or before operators had credentials).
    pub decisions_without_credential: u64,
    /// Events and tasks retention removed from the ledger (what it kept of each task is
    /// checked with the events recorded after it; the removed events were checked before they
    /// went). Every LSN missing from the log must be one of `pruned_events`.
    pub pruned_events: u64,
    pub pruned_tasks: u64,
    /// Checks this replay could not make, and why (e.g. index checks on a topic replay).
    pub skipped_checks: Vec<String>,
    pub violations: Vec<Finding>,
    /// Every decision made under a named credential, for [`AuditReport::check_operators`].
    #[serde(skip)]
    pub credentialed: Vec<CredentialedDecision>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Checks every decision made under a named credential against the operators configured
    /// now: a credential no operator holds or held (`operator-unknown`), one used after it
    /// was revoked (`operator-revoked`), or one recorded for another operator than its
    /// holder (`operator-mismatch`) is a violation.
    pub fn check_operators(&mut self, roster: &Roster) {
        for d in std::mem::take(&mut self.credentialed) {
            let what = format!(
                "{} by {} under credential {}",
                d.decision, d.by, d.credential
            );
            let (holder, revoked) = match (
                roster.credentials.get(&d.credential),
                roster.revoked.get(&d.credential),
            ) {
                (Some(holder), _) => (holder, None),
                (None, Some((holder, since))) => (holder, Some(*since)),
                (None, None) => {
                    self.operator_finding(
                        &d,
                        "operator-unknown",
                        format!("{what}, which no configured operator holds or held"),
                    );
                    continue;
                }
            };
            if *holder != d.by || d.named != d.by {
                let detail = format!(
                    "{what}: the credential belongs to {holder} and its event names {}",
                    d.named
                );
                self.operator_finding(&d, "operator-mismatch", detail);
            } else if let Some(since) = revoked.filter(|since| d.at >= *since) {
                let detail = format!(
                    "{what}, revoked at {since} (ms since the epoch), before this decision at {}",
                    d.at
                );
                self.operator_finding(&d, "operator-revoked", detail);
            }
        }
    }

    fn operator_finding(&mut self, d: &CredentialedDecision, rule: &'static str, detail: String) {
        self.violations.push(Finding {
            task_id: Some(d.task_id.to_string()),
            rule,
            lsns: vec![d.lsn],
            detail,
        });
    }
}

/// An operator's decision recorded under a named credential (`OperatorCredential`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialedDecision {
    pub task_id: TaskId,
    /// The `OperatorCredential` event's.
    pub lsn: u64,
    pub at: crate::event::Millis,
    /// The operator the `OperatorCredential` names.
    pub named: String,
    /// The operator the decision names (`by`).
    pub by: String,
    pub credential: String,
    /// The kind of the decision's first event.
    pub decision: &'static str,
}

/// The operators' credentials a configuration knows: held now (credential id → operator),
/// and revoked (credential id → operator and when it was revoked, ms since the epoch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roster {
    pub credentials: BTreeMap<String, String>,
    pub revoked: BTreeMap<String, (String, crate::event::Millis)>,
}

/// One task under audit: its events are pushed in task order, then it is finished once.
#[derive(Debug, Clone)]
pub struct TaskAudit {
    task: TaskId,
    check: TaskCheck,
    unknown: bool,
    authorized: bool,
    /// The `OperatorCredential` just pushed, until the decision it introduces.
    credential: Option<Event>,
    scratch: Vec<Violation>,
}

impl TaskAudit {
    pub fn new(task: TaskId, config: CheckConfig) -> TaskAudit {
        TaskAudit {
            task,
            check: TaskCheck::new(config),
            unknown: false,
            authorized: false,
            credential: None,
            scratch: Vec::new(),
        }
    }

    /// The task's state after the events pushed so far.
    pub fn state(&self) -> &State {
        self.check.state()
    }

    /// Checks the task's next event, reports what it breaks and counts what it adds.
    pub fn push(&mut self, event: &Event, report: &mut AuditReport) {
        self.check.push(event, &mut self.scratch);
        for v in self.scratch.drain(..) {
            report.violations.push(Finding {
                task_id: Some(self.task.to_string()),
                rule: v.rule.name(),
                lsns: v.lsns,
                detail: v.detail,
            });
        }
        self.count_decision(event, report);
        match &event.body {
            EventBody::SendUnknown { cause, .. } => {
                report.unknown_outcomes += 1;
                if *cause == UnknownCause::Recovery {
                    report.recovered_after_crash += 1;
                }
                self.unknown = true;
            }
            EventBody::ResendAuthorized { .. } => self.authorized = true,
            EventBody::Confirmed { evidence, .. } if self.unknown => match evidence {
                Evidence::Lookup => report.unknowns_resolved_by_lookup += 1,
                Evidence::Response { .. } if self.authorized => {
                    report.unknowns_resolved_by_authorized_resend += 1
                }
                Evidence::Response { .. } => report.unknowns_resolved_by_same_key_resend += 1,
                Evidence::Operator { .. } => report.unknowns_resolved_by_operator += 1,
            },
            EventBody::InputRejected { .. } => report.rejected_inputs += 1,
            EventBody::SendDeferred { .. } => report.waits_before_intent += 1,
            EventBody::TaskRetried { .. } => report.retries += 1,
            EventBody::CompensationStarted { .. } => report.compensations += 1,
            _ => {}
        }
    }

    /// Counts an operator's decision, and notes under which credential it was made.
    fn count_decision(&mut self, event: &Event, report: &mut AuditReport) {
        if let EventBody::OperatorCredential { .. } = event.body {
            self.credential = Some(event.clone());
            return;
        }
        let credential = self.credential.take();
        let Some(by) = decider(&event.body) else {
            return;
        };
        report.operator_decisions += 1;
        match credential {
            Some(Event {
                lsn,
                at,
                body:
                    EventBody::OperatorCredential {
                        operator,
                        credential,
                    },
                ..
            }) => {
                let decision = event.body.name();
                report.credentialed.push(CredentialedDecision {
                    task_id: self.task,
                    lsn,
                    at,
                    named: operator,
                    by: by.to_owned(),
                    credential,
                    decision,
                });
            }
            _ => report.decisions_without_credential += 1,
        }
    }

    /// Counts the task's final state into the report and returns it.
    pub fn finish(self, report: &mut AuditReport) -> State {
        let state = self.check.into_state();
        report.tasks += 1;
        *report.tasks_by_state.entry(state.phase.name()).or_default() += 1;
        report.attempts += u64::from(state.attempts);
        report.duplicates_dropped += u64::from(state.duplicates);
        report.conflicts += u64::from(state.conflicts);
        if state.phase == Phase::ManualReview {
            report.manual_reviews_open += 1;
        }
        if state.unresolved_unknown {
            report.unknowns_open += 1;
        }
        state
    }
}

/// Who made the decision `body` records, when it is an operator's: the first event of an
/// operator's resolution, note, retry or order to undo (not a policy's).
fn decider(body: &EventBody) -> Option<&str> {
    let by = match body {
        EventBody::Confirmed {
            evidence: Evidence::Operator { by, .. },
            ..
        }
        | EventBody::ResendAuthorized { by, .. }
        | EventBody::TaskRetried { by, .. }
        | EventBody::CompensationOrdered { by, .. }
        | EventBody::OperatorNote { who: by, .. } => by,
        _ => return None,
    };
    (!by.starts_with(crate::event::POLICY_PREFIX)).then_some(by.as_str())
}

/// Checks that LSNs fed in ascending order run 1, 2, 3... without a gap.
#[derive(Debug, Clone)]
pub struct LsnSequence {
    expected: u64,
}

impl Default for LsnSequence {
    fn default() -> Self {
        LsnSequence { expected: 1 }
    }
}

impl LsnSequence {
    /// The next LSN present; a gap before it is reported.
    pub fn push(&mut self, lsn: u64, report: &mut AuditReport) {
        if lsn > self.expected {
            let missing = if lsn == self.expected + 1 {
                self.expected.to_string()
            } else {
                format!("{}..{}", self.expected, lsn - 1)
            };
            report.violations.push(Finding::integrity(
                Integrity::LsnContiguous,
                None,
                vec![self.expected - 1, lsn],
                format!("LSN gap: {missing} missing"),
            ));
        }
        self.expected = self.expected.max(lsn + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_name_the_positions_around_them() {
        let mut report = AuditReport::default();
        let mut seq = LsnSequence::default();
        for lsn in [1, 2, 4, 7, 8] {
            seq.push(lsn, &mut report);
        }
        let found: Vec<_> = report
            .violations
            .iter()
            .map(|f| (f.rule, f.lsns.clone(), f.detail.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("lsn-contiguous", vec![2, 4], "LSN gap: 3 missing"),
                ("lsn-contiguous", vec![4, 7], "LSN gap: 5..6 missing"),
            ]
        );
    }

    /// Decisions are counted, with or without a named credential; against a roster, a
    /// credential recorded for another operator, one unknown and one used after its
    /// revocation are each a violation.
    #[test]
    fn decisions_are_checked_against_the_operators_configured() {
        use crate::fixtures::{accepted, history};
        let (task, body) = accepted();
        let credential = |operator: &str, id: &str| EventBody::OperatorCredential {
            operator: operator.into(),
            credential: id.into(),
        };
        let note = |who: &str| EventBody::OperatorNote {
            who: who.into(),
            text: "looked".into(),
        };
        let events = history(
            task,
            vec![
                body,
                note("ana"),
                credential("ana", "aaaa"),
                note("ana"),
                credential("ana", "aaaa"),
                note("eve"),
                credential("bo", "bbbb"),
                note("bo"),
                credential("cy", "cccc"),
                note("cy"),
            ],
        );
        let mut report = AuditReport::default();
        let mut audit = TaskAudit::new(task, CheckConfig::default());
        for event in &events {
            audit.push(event, &mut report);
        }
        audit.finish(&mut report);
        assert_eq!(
            (
                report.operator_decisions,
                report.decisions_without_credential
            ),
            (5, 1)
        );
        let at = events[3].at;
        let roster = Roster {
            credentials: [("aaaa".to_string(), "ana".to_string())].into(),
            revoked: [("cccc".to_string(), ("cy".to_string(), at))].into(),
        };
        report.check_operators(&roster);
        let found: Vec<(&str, Vec<u64>)> = (report.violations.iter())
            .map(|v| (v.rule, v.lsns.clone()))
            .collect();
        let lsn = |i: usize| events[i].lsn;
        assert_eq!(
            found,
            [
                ("operator-mismatch", vec![lsn(4)]),
                ("operator-unknown", vec![lsn(6)]),
                ("operator-revoked", vec![lsn(8)]),
            ]
        );
    }
}
