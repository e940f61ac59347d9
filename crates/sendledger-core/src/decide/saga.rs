//! The decisions of multi-step tasks: moving on to the next leg, starting the next
//! compensation (`docs/sagas.md`).

use super::{Action, Ctx, Decision};
use crate::event::{EventBody, NotSentCause, ReviewReason, POLICY_SAGA_BY};
use crate::saga::{Leg, StepOutcome};
use crate::state::{Phase, State};

/// A multi-step task whose decision ended a leg (a step confirmed, the next one to begin; a
/// failure to compensate, or a compensation done and another owed) goes on at once
/// ([`Action::Continue`]), decided with the next leg's own target and policy.
pub(super) fn move_on(state: &State, ctx: Ctx<'_>, d: &mut Decision) {
    if state.saga.is_none() || d.events.is_empty() || d.action != Action::None {
        return;
    }
    let mut after = state.clone();
    after.apply_all(ctx.now, &d.events);
    if matches!(after.phase, Phase::Accepted | Phase::Compensating) {
        d.action = Action::Continue;
    }
}

/// Starts the next compensation a multi-step task owes (a duplicate record an operator ordered
/// undone first, then the steps' own, last first); the decision that follows at once sends it.
pub(super) fn compensate_next(state: &State, d: &mut Decision) {
    let Some(saga) = &state.saga else {
        return;
    };
    if let Some((n, duplicate)) = saga.next_duplicate() {
        let name = &saga.steps[n as usize].name;
        d.events.push(EventBody::CompensationStarted {
            step: n,
            remote_id: duplicate.undoes.clone(),
            by: duplicate.by.clone(),
            reason: format!("a duplicate of step {name}'s record, ordered undone"),
        });
        d.action = Action::Continue;
        return;
    }
    let Some(n) = saga.next_compensation() else {
        return;
    };
    let step = &saga.steps[n as usize];
    let StepOutcome::Succeeded { remote_id } = &step.outcome else {
        return;
    };
    let (by, reason) = match &saga.ordered_by {
        Some((by, reason)) => (
            by.clone(),
            format!("the whole task ordered undone: {reason}"),
        ),
        None => {
            let failed = (saga.steps.iter())
                .find(|s| {
                    matches!(
                        s.outcome,
                        StepOutcome::Rejected { .. } | StepOutcome::Failed { .. }
                    )
                })
                .map_or("a later step", |s| s.name.as_str());
            (
                POLICY_SAGA_BY.to_string(),
                format!(
                    "step {failed} did not succeed: the steps before it are undone in reverse order"
                ),
            )
        }
    };
    d.events.push(EventBody::CompensationStarted {
        step: n,
        remote_id: remote_id.clone(),
        by,
        reason,
    });
    d.action = Action::Continue;
}

/// The step (number and name) whose compensation the task's attempts are, when they are one.
pub(super) fn compensation_of(state: &State) -> Option<(u32, String)> {
    let saga = state.saga.as_ref()?;
    match saga.leg {
        Leg::Compensation(n) => Some((n, saga.step()?.name.clone())),
        Leg::Step(_) => None,
    }
}

/// Whether the task is a multi-step one at a step after the first: a call of it that cannot be
/// built ([`not_built`]) is a person's to look at, not a refusal that undoes the steps before.
pub(super) fn not_built_after_steps(state: &State) -> bool {
    matches!(state.leg(), Some(Leg::Step(n)) if n > 0)
}

/// A step's call could not be built (a template reads what the task does not have: a field of
/// an earlier step's answer that was not kept, a step its plan lacks). Nothing was sent; the
/// steps before it succeeded, and undoing them over a configuration mistake would be worse
/// than waiting: the task goes to review, where a person fixes the configuration and
/// authorizes a resend, or undoes the task.
pub(super) fn not_built(
    state: &State,
    attempt: u32,
    reason: String,
    ctx: Ctx<'_>,
    d: &mut Decision,
) {
    let (Some(Leg::Step(step)), Some(saga)) = (state.leg(), &state.saga) else {
        return;
    };
    let name = saga.step().map_or_else(String::new, |s| s.name.clone());
    d.events.push(EventBody::SendNotSent {
        attempt,
        cause: NotSentCause::NotBuilt(reason.clone()),
        retry_at: ctx.now,
    });
    d.events.push(EventBody::ManualReviewRequired {
        reason: ReviewReason::StepNotBuilt { step, name, reason },
    });
}
