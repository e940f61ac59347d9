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
    /// `succeeded` or `failed`; absent for a resend.
    #[serde(rename = "as", default, skip_serializing_if = "Option::is_none")]
    pub resolve_as: Option<String>,
    /// `true` authorizes one new attempt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resend: bool,
    /// The remote record that is the task's (with `as: succeeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_id: Option<String>,
    pub by: String,
    pub reason: String,
}

impl ResolveBody {
    /// The operator's decision, or what is wrong with the body (naming the field): an
    /// operator and a reason are always given, and exactly one of a final state (succeeded
    /// with the remote record, or failed) and a resend.
    pub fn resolution(self) -> Result<OperatorResolution> {
        let bad = |problem: &str| Err(Error::BadResolution(problem.into()));
        if self.by.trim().is_empty() {
            return bad("`by` must name the operator");
        }
        if self.reason.trim().is_empty() {
            return bad("`reason` must say why");
        }
        let (by, reason) = (self.by, self.reason);
        match (self.resolve_as.as_deref(), self.resend, self.remote_id) {
            (Some("succeeded"), false, Some(remote_id)) if !remote_id.is_empty() => {
                Ok(OperatorResolution::Succeeded {
                    remote_id,
                    by,
                    reason,
                })
            }
            (Some("succeeded"), false, _) => bad("`remote_id` is required with `as: succeeded`"),
            (Some("failed"), false, None) => Ok(OperatorResolution::Failed { by, reason }),
            (None, true, None) => Ok(OperatorResolution::Resend { by, reason }),
            (_, _, Some(_)) => bad("`remote_id` goes only with `as: succeeded`"),
            (Some(other), false, _) => Err(Error::BadResolution(format!(
                "`as` must be `succeeded` or `failed`, not `{other}`"
            ))),
            _ => bad("give exactly one of `as` (succeeded or failed) and `resend: true`"),
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
        for (v, field) in [
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
