//! An operator's resolutions of a task in review, and retries of failed tasks.

use super::{Action, Ctx, Decision, OperatorResolution};
use crate::error::{Error, Result};
use crate::event::{EventBody, Evidence, ReviewReason, POLICY_PREFIX};
use crate::saga::Leg;
use crate::state::{Phase, State};

pub(super) fn operator(
    state: &State,
    resolution: OperatorResolution,
    credential: Option<String>,
    ctx: Ctx<'_>,
    d: &mut Decision,
) -> Result<()> {
    let in_review = || match state.phase {
        Phase::ManualReview => Ok(()),
        phase => Err(Error::NotInReview {
            phase: phase.name(),
        }),
    };
    let by = match &resolution {
        OperatorResolution::Succeeded { by, .. }
        | OperatorResolution::Failed { by, .. }
        | OperatorResolution::Resend { by, .. }
        | OperatorResolution::Note { by, .. }
        | OperatorResolution::Retry { by, .. }
        | OperatorResolution::Compensate { by, .. } => by,
    };
    if by.starts_with(POLICY_PREFIX) {
        return Err(Error::ReservedOperator { by: by.clone() });
    }
    if let Some(credential) = credential {
        d.events.push(EventBody::OperatorCredential {
            operator: by.clone(),
            credential,
        });
    }
    match resolution {
        OperatorResolution::Note { by, text } => {
            d.events.push(EventBody::OperatorNote { who: by, text })
        }
        OperatorResolution::Succeeded {
            remote_id,
            by,
            reason,
        } => {
            in_review()?;
            d.events.push(EventBody::Confirmed {
                remote_id,
                evidence: Evidence::Operator { by, reason },
            })
        }
        OperatorResolution::Failed { by, reason } => {
            in_review()?;
            failed(by, reason, d);
        }
        OperatorResolution::Compensate {
            record,
            duplicates,
            whole_task,
            by,
            reason,
        } => {
            in_review()?;
            compensate(state, record, duplicates, whole_task, by, reason, d)?;
        }
        // Only the authorization: the attempt follows at the next wake, so the same decision can
        // be recorded on a stopped ledger (no remote at hand) and the service sends on its start.
        OperatorResolution::Resend { by, reason } => {
            in_review()?;
            d.events.push(EventBody::ResendAuthorized { by, reason });
            d.action = Action::WakeAt(ctx.now);
        }
        OperatorResolution::Retry { by, reason } => retry(state, by, reason, ctx, d)?,
    }
    Ok(())
}

fn failed(by: String, reason: String, d: &mut Decision) {
    d.events.push(EventBody::OperatorNote {
        who: by.clone(),
        text: reason.clone(),
    });
    d.events.push(EventBody::Failed {
        reason: format!("resolved as failed by {by}: {reason}"),
    });
}

/// An operator's order to undo records of a multi-step task in review at a step (see
/// [`OperatorResolution::Compensate`]). Refused, saying why, when it cannot be carried out as
/// given: the task has no steps, its review is of a compensation, a duplicate is not a record
/// the step's lookup found, or nothing would be undone.
fn compensate(
    state: &State,
    record: Option<String>,
    duplicates: Vec<String>,
    whole_task: bool,
    by: String,
    reason: String,
    d: &mut Decision,
) -> Result<()> {
    let refuse = |why: String| Err(Error::BadResolution(why));
    let Some(saga) = &state.saga else {
        return refuse("the task is a one-step task: nothing can undo its record (a saga's step can name a `compensate` target)".into());
    };
    let Leg::Step(n) = saga.leg else {
        return refuse(format!(
            "the task is in review about a compensation (of step {}): resolve that as succeeded with its record, or as failed, or authorize a resend",
            saga.step().map_or("?", |s| s.name.as_str())
        ));
    };
    let step = &saga.steps[n as usize];
    if !duplicates.is_empty() {
        let Some(record) = &record else {
            return refuse("undoing duplicates needs the step's own record (`remote_id`)".into());
        };
        if step.compensate.is_none() {
            return refuse(format!(
                "step {} names no `compensate` target: its duplicates cannot be undone",
                step.name
            ));
        }
        let found = match &state.review_reason {
            Some(ReviewReason::MultipleMatches { remote_ids }) => remote_ids.as_slice(),
            _ => &[],
        };
        for (i, id) in duplicates.iter().enumerate() {
            if id == record || duplicates[..i].contains(id) {
                return refuse(format!("record {id} is named twice"));
            }
            if !found.contains(id) {
                return refuse(format!(
                    "{id} is not a record the lookup of step {} found ({}): only those can be undone as duplicates",
                    step.name,
                    found.join(", ")
                ));
            }
        }
    }
    let Some(record) = record else {
        // The step in review did not happen: as failed, which undoes the steps before it.
        if !whole_task || !saga.owes_compensation() {
            return refuse(format!(
                "no step before {} succeeded with a `compensate` target: nothing to undo (resolve as failed)",
                step.name
            ));
        }
        failed(by, reason, d);
        return Ok(());
    };
    let undoes_something =
        !duplicates.is_empty() || saga.owes_compensation() || step.compensate.is_some();
    if !undoes_something || (!whole_task && duplicates.is_empty()) {
        return refuse(format!(
            "nothing to undo: step {} and the steps before it name no `compensate` target (resolve as succeeded or failed)",
            step.name
        ));
    }
    d.events.push(EventBody::CompensationOrdered {
        step: n,
        record,
        duplicates,
        whole_task,
        by,
        reason,
    });
    Ok(())
}

/// Starts a new version of a failed task whose every attempt was proven not sent. Like an
/// authorized resend, only the decision is recorded; the attempt follows at the next wake.
/// Used for an operator's retry and, with a `policy:` name, for the target's own.
pub(super) fn retry(
    state: &State,
    by: String,
    reason: String,
    ctx: Ctx<'_>,
    d: &mut Decision,
) -> Result<()> {
    state.retryable().map_err(|why| Error::NotRetryable {
        phase: state.phase.name(),
        why,
    })?;
    if ctx.versions.later.is_some() {
        return Err(Error::NotRetryable {
            phase: state.phase.name(),
            why: "a later version of its request was accepted since, and versions run one at a time in order; submit a new version to run it again",
        });
    }
    d.events.push(EventBody::TaskRetried { by, reason });
    d.action = Action::WakeAt(ctx.now);
    Ok(())
}
