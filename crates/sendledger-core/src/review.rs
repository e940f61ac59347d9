//! An operator's resolution of a task in manual review, as a person gives it: the body of the
//! admin endpoint's `POST /reviews/{id}` (and what `sendledger review resolve` sends or, on a
//! stopped ledger, records). [`ResolveBody::resolution`] checks it and turns it into the
//! [`OperatorResolution`] that `decide` takes; whether the task is in review at all is for
//! `decide` to say.

use serde::{Deserialize, Serialize};

use crate::decide::OperatorResolution;
use crate::error::{Error, Result};

/// What an operator decides about a task in review, as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// `succeeded`, `failed` or (a multi-step task) `compensated`; absent for a resend.
    #[serde(rename = "as", default, skip_serializing_if = "Option::is_none")]
    pub resolve_as: Option<String>,
    /// `true` authorizes one new attempt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resend: bool,
    /// The remote record that is the task's (with `as: succeeded`), or the step's in review
    /// (with `as: compensated`, when the step did happen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_id: Option<String>,
    /// Records the step's lookup found besides `remote_id`, to be undone as duplicates by the
    /// step's compensating target (with `as: succeeded` or `compensated`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undo: Vec<String>,
    /// The operator. Over the admin endpoint an operator's credential names them (this may
    /// then be left out, and must agree when given).
    #[serde(default)]
    pub by: String,
    pub reason: String,
}

impl ResolveBody {
    /// The operator's decision, or what is wrong with the body (naming the field): an
    /// operator and a reason are always given, and exactly one of a final state (succeeded
    /// with the remote record, failed, or compensated) and a resend; `undo` goes with
    /// succeeded or compensated, and needs the step's own record.
    pub fn resolution(self) -> Result<OperatorResolution> {
        let bad = |problem: &str| Err(Error::BadResolution(problem.into()));
        if self.by.trim().is_empty() {
            return bad("`by` must name the operator");
        }
        if self.reason.trim().is_empty() {
            return bad("`reason` must say why");
        }
        let (by, reason, undo) = (self.by, self.reason, self.undo);
        let remote_id = self.remote_id.filter(|id| !id.is_empty());
        match (self.resolve_as.as_deref(), self.resend, remote_id) {
            (Some("succeeded"), false, Some(remote_id)) if undo.is_empty() => {
                Ok(OperatorResolution::Succeeded {
                    remote_id,
                    by,
                    reason,
                })
            }
            (Some("succeeded"), false, Some(remote_id)) => Ok(OperatorResolution::Compensate {
                record: Some(remote_id),
                duplicates: undo,
                whole_task: false,
                by,
                reason,
            }),
            (Some("succeeded"), false, None) => bad("`remote_id` is required with `as: succeeded`"),
            (Some("compensated"), false, None) if !undo.is_empty() => {
                bad("`undo` needs `remote_id`: the step's own record, which the duplicates are not")
            }
            (Some("compensated"), false, record) => Ok(OperatorResolution::Compensate {
                record,
                duplicates: undo,
                whole_task: true,
                by,
                reason,
            }),
            (_, _, _) if !undo.is_empty() => {
                bad("`undo` goes only with `as: succeeded` or `as: compensated`")
            }
            (Some("failed"), false, None) => Ok(OperatorResolution::Failed { by, reason }),
            (None, true, None) => Ok(OperatorResolution::Resend { by, reason }),
            (_, _, Some(_)) => {
                bad("`remote_id` goes only with `as: succeeded` or `as: compensated`")
            }
            (Some(other), false, _) => Err(Error::BadResolution(format!(
                "`as` must be `succeeded`, `failed` or `compensated`, not `{other}`"
            ))),
            _ => bad(
                "give exactly one of `as` (succeeded, failed or compensated) and `resend: true`",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn resolve_bodies_map_to_resolutions_or_name_the_field() {
        let body = |v: Value| serde_json::from_value::<ResolveBody>(v).map_err(|e| e.to_string());
        let ok =
            body(json!({ "as": "succeeded", "remote_id": "X", "by": "ana", "reason": "seen" }))
                .unwrap()
                .resolution()
                .unwrap();
        assert!(matches!(ok, OperatorResolution::Succeeded { remote_id, .. } if remote_id == "X"));
        let resend = body(json!({ "resend": true, "by": "ana", "reason": "none there" })).unwrap();
        assert!(matches!(
            resend.resolution(),
            Ok(OperatorResolution::Resend { .. })
        ));
        let undo = body(json!({ "as": "succeeded", "remote_id": "A", "undo": ["B"], "by": "ana", "reason": "B is a duplicate" }))
            .unwrap()
            .resolution()
            .unwrap();
        assert!(matches!(
            undo,
            OperatorResolution::Compensate { record: Some(r), duplicates, whole_task: false, .. }
                if r == "A" && duplicates == ["B"]
        ));
        let whole = body(json!({ "as": "compensated", "by": "ana", "reason": "order cancelled" }))
            .unwrap()
            .resolution()
            .unwrap();
        assert!(matches!(
            whole,
            OperatorResolution::Compensate {
                record: None,
                whole_task: true,
                ..
            }
        ));
        for (v, field) in [
            (
                json!({ "as": "compensated", "undo": ["B"], "by": "a", "reason": "x" }),
                "remote_id",
            ),
            (
                json!({ "as": "failed", "undo": ["B"], "by": "a", "reason": "x" }),
                "undo",
            ),
            (json!({ "as": "failed", "by": "ana" }), "reason"),
            (json!({ "as": "failed", "by": "", "reason": "x" }), "by"),
            (json!({ "as": "done", "by": "a", "reason": "x" }), "as"),
            (
                json!({ "as": "failed", "resend": true, "by": "a", "reason": "x" }),
                "resend",
            ),
            (
                json!({ "as": "failed", "remote_id": "X", "by": "a", "reason": "x" }),
                "remote_id",
            ),
            (
                json!({ "as": "failed", "by": "a", "reason": "x", "extra": 1 }),
                "extra",
            ),
        ] {
            let err = body(v.clone())
                .and_then(|b| b.resolution().map(|_| ()).map_err(|e| e.to_string()))
                .expect_err(&v.to_string());
            assert!(err.contains(field), "{v}: {err}");
        }
    }
}
