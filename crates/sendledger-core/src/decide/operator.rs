//! An operator's resolutions of a task in review, and retries of failed tasks.

use super::{Action, Ctx, Decision, OperatorResolution};
use crate::error::{Error, Result};
use crate::event::{EventBody, Evidence, POLICY_PREFIX};
use crate::state::{Phase, State};

pub(super) fn operator(
    state: &State,
    resolution: OperatorResolution,
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
        | OperatorResolution::Retry { by, .. } => by,
    };
    if by.starts_with(POLICY_PREFIX) {
        return Err(Error::ReservedOperator { by: by.clone() });
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
            d.events.push(EventBody::OperatorNote {
                who: by.clone(),
                text: reason.clone(),
            });
            d.events.push(EventBody::Failed {
                reason: format!("resolved as failed by {by}: {reason}"),
            });
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
    d.events.push(EventBody::TaskRetried { by, reason });
    d.action = Action::WakeAt(ctx.now);
    Ok(())
}
