//! Decisions about the other versions of a task's request (`docs/rules.md`, Task versions): a
//! version waits for the one before it to settle before its first intent.

use super::{Action, Ctx, Decision};
use crate::event::{EventBody, PreviousVersion, WaitReason};
use crate::state::State;

/// The other versions of a task's request, as the engine found them when it decided: one
/// version runs at a time, in order (`docs/rules.md`, Task versions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Versions {
    /// The identity's latest version accepted before this task's: a new versioned task's
    /// `RequestVersion` names it.
    pub previous: Option<PreviousVersion>,
    /// An earlier version that is not settled: the task records no intent until it is, and
    /// waits (`SendDeferred`) instead.
    pub unsettled: Option<PreviousVersion>,
    /// A later version of the identity was accepted: this one is not retried.
    pub later: Option<u32>,
}

/// How long a task waiting for an earlier version goes before it looks again, should the
/// word that the earlier version settled not reach it (it is sent when that version settles).
pub const EARLIER_VERSION_RECHECK_MS: u64 = 60_000;

/// A new task's `RequestVersion`, when its request names a version above 0: recorded with its
/// acceptance, naming the identity's latest version before it.
pub(super) fn record_version(version: u32, ctx: Ctx<'_>, d: &mut Decision) {
    if version > 0 {
        d.events.push(EventBody::RequestVersion {
            version,
            previous: ctx.versions.previous,
        });
    }
}

/// Waits instead of the first intent while an earlier version of the request is not settled,
/// and says so. The wait is recorded when it begins; the task looks again when that version
/// settles, or after [`EARLIER_VERSION_RECHECK_MS`].
pub(super) fn waits_for_earlier(state: &State, ctx: Ctx<'_>, d: &mut Decision) -> bool {
    let (None, Some(earlier)) = (state.first_intent_at, ctx.versions.unsettled) else {
        return false;
    };
    let reason = WaitReason::EarlierVersion {
        version: earlier.version,
        task_id: earlier.task_id,
    };
    let until = ctx.now.saturating_add(EARLIER_VERSION_RECHECK_MS);
    if state.waiting.as_ref().map(|w| &w.reason) != Some(&reason) {
        d.events.push(EventBody::SendDeferred { until, reason });
    }
    d.action = Action::WakeAt(until);
    true
}
