//! What retention keeps of a settled task once its history is removed: a [`Retained`], about a
//! hundred bytes, enough to answer a redelivery or a resubmission of the request with the
//! task's result and never execute it again (`docs/operating/retention.md`).
//!
//! A ledger holding one reads it back as one [`EventBody::Pruned`] event at `task_seq` 0 in
//! place of the removed events, so every fold (a task's actor, the publisher's projection,
//! `inspect`, `audit`) goes on from where the history ended: the same phase, payload hash and
//! sequence number, and the same result re-announced by a later duplicate delivery.

use crate::event::{Ended, Event, EventBody, Retained};
use crate::ids::TaskId;
use crate::result::{event_id, Projection, ResultStatus, TaskResult};
use crate::state::Phase;

impl Retained {
    /// What retention keeps of the task whose whole history is `history`; `None` unless the task
    /// is settled (succeeded, rejected, failed or compensated) with a result announced: a task
    /// in progress, in review or never accepted is never removed.
    pub fn of(history: &[Event]) -> Option<Retained> {
        let projection = Projection::of(history);
        let state = projection.state();
        let announced = projection.announced()?;
        if !state.phase.is_terminal() {
            return None;
        }
        let request = state.request.as_ref()?;
        let status = match announced.status {
            ResultStatus::Succeeded => Ended::Succeeded,
            ResultStatus::Rejected => Ended::Rejected,
            ResultStatus::Failed => Ended::Failed,
            ResultStatus::Compensated => Ended::Compensated,
            ResultStatus::ManualReview | ResultStatus::Conflict => return None,
        };
        Some(Retained {
            identity: request.identity.clone(),
            target: request.target.clone(),
            payload_hash: state.payload_hash?,
            status,
            remote_id: announced.remote_id.clone(),
            remote_target: announced
                .remote_target
                .clone()
                .filter(|t| *t != request.target),
            reason: announced.reason.clone(),
            http_status: announced.http_status,
            attempts: announced.attempts,
            version: announced.version,
            result_seq: announced
                .event_id
                .rsplit(':')
                .next()
                .and_then(|s| s.parse().ok())?,
            result_lsn: announced.lsn,
            result_at: announced.at,
            events: state.next_seq,
            settled_at: state.phase_since,
            request_version: request.version,
        })
    }

    /// The phase the task ended in.
    pub fn phase(&self) -> Phase {
        match self.status {
            Ended::Succeeded => Phase::Succeeded,
            Ended::Rejected => Phase::Rejected,
            Ended::Failed => Phase::Failed,
            Ended::Compensated => Phase::Compensated,
        }
    }

    /// The status of its result.
    pub fn result_status(&self) -> ResultStatus {
        match self.status {
            Ended::Succeeded => ResultStatus::Succeeded,
            Ended::Rejected => ResultStatus::Rejected,
            Ended::Failed => ResultStatus::Failed,
            Ended::Compensated => ResultStatus::Compensated,
        }
    }

    /// The event that stands for the removed history when the task's events are read: at
    /// `task_seq` 0 and LSN 0 (it is in no log), at the time the task settled.
    pub fn event(&self, task_id: TaskId) -> Event {
        Event {
            lsn: 0,
            task_id,
            task_seq: 0,
            at: self.settled_at,
            body: EventBody::Pruned {
                retained: Box::new(self.clone()),
            },
        }
    }

    /// The task's result as the removed history announced it, re-announced to a duplicate: the
    /// same event id, status, remote id, attempts and version; what retention does not keep
    /// (the remote's answer, the evidence, the source, the steps) is absent.
    pub fn result(&self, task_id: TaskId) -> TaskResult {
        TaskResult {
            event_id: event_id(task_id, self.result_seq),
            task_id: task_id.to_string(),
            status: self.result_status(),
            tenant: Some(self.identity.tenant.clone()),
            operation: Some(self.identity.operation.clone()),
            request_key: Some(self.identity.request_key.clone()),
            target: Some(self.target.clone()),
            remote_id: self.remote_id.clone(),
            remote_target: self
                .remote_id
                .as_ref()
                .map(|_| self.remote_target.clone().unwrap_or(self.target.clone())),
            evidence: None,
            reason: self.reason.clone(),
            review: None,
            detail: None,
            http_status: self.http_status,
            remote_ids: Vec::new(),
            attempts: self.attempts,
            version: self.version,
            request_version: self.request_version,
            source: None,
            steps: Vec::new(),
            lsn: self.result_lsn,
            at: self.result_at,
        }
    }
}
