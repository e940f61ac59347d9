//! Who is calling the admin endpoint, and what they may see and do.
//!
//! A caller is anonymous, holds the shared `admin.token` (every role, every tenant, and names
//! itself in `by`), or is a named operator ([`crate::operators`]): its roles say which calls
//! it may make, its tenants which tasks it sees (a task outside them answers as a task not in
//! the ledger), and every decision it makes is recorded under its name and credential id.
//! `GET /whoami` answers who the credential sent is.

use std::sync::Arc;

use axum::extract::State;
use http::{header, HeaderMap, StatusCode};
use serde_json::json;

use super::error::{ApiError, ApiResult};
use super::{json_response, Shared};
use crate::credentials::{bearer_token, constant_time_eq};
use crate::operators::{Operator, Operators, Role, Scope};

/// The admin endpoint's credentials and whether reads need one.
pub struct Gate {
    token: Option<String>,
    operators: Operators,
    reads_need_credential: bool,
}

/// Who sent a request.
enum Caller {
    Anonymous,
    /// The shared `admin.token`.
    Shared,
    Operator {
        operator: Arc<Operator>,
        credential: String,
    },
}

/// A caller admitted to a decision.
pub struct Actor {
    /// The operator and the credential's id; `None` for the shared token.
    named: Option<(Arc<Operator>, String)>,
}

impl Actor {
    /// The tasks the caller may act on.
    pub fn scope(&self) -> Scope {
        self.named
            .as_ref()
            .map_or(Scope::All, |(operator, _)| operator.scope.clone())
    }

    /// The credential id to record with the decision.
    pub fn credential(&self) -> Option<String> {
        self.named.as_ref().map(|(_, id)| id.clone())
    }

    /// The `by` to record: an operator's own name (a body's `by`, when given, must be it);
    /// the body's for the shared token, which names no one.
    pub fn by(&self, given: &str) -> Result<String, ApiError> {
        match &self.named {
            Some((operator, _)) if given.is_empty() || given == operator.name => {
                Ok(operator.name.clone())
            }
            Some((operator, _)) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "`by` is {given:?} but the credential is {}'s: a decision is recorded under the name of the operator who makes it (leave `by` out)",
                    operator.name
                ),
            )),
            None if given.trim().is_empty() => Err(ApiError::bad_request(
                "bad body: `by` must name the operator",
            )),
            None => Ok(given.to_string()),
        }
    }
}

impl Gate {
    pub fn new(token: Option<String>, operators: Operators, reads_need_credential: bool) -> Gate {
        Gate {
            token: token.filter(|t| !t.is_empty()),
            operators,
            reads_need_credential,
        }
    }

    /// Whether any credential is configured (otherwise changes are refused).
    pub fn has_credentials(&self) -> bool {
        self.token.is_some() || !self.operators.is_empty()
    }

    pub fn reads_need_credential(&self) -> bool {
        self.reads_need_credential
    }

    fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Ok(Caller::Anonymous);
        };
        let given = value.to_str().ok().and_then(bearer_token).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "the Authorization header is not `Bearer <token>`",
            )
        })?;
        if let Some(token) = &self.token {
            if constant_time_eq(given.as_bytes(), token.as_bytes()) {
                return Ok(Caller::Shared);
            }
        }
        match self.operators.authenticate(given) {
            Some((operator, credential)) => Ok(Caller::Operator {
                operator,
                credential,
            }),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                match self.operators.is_empty() {
                    true => "wrong admin token; send the configured `admin.token` as `Authorization: Bearer <token>`",
                    false => "unknown credential: the token is no configured operator's (revoked, or mistyped)",
                },
            )),
        }
    }

    /// Admits a read of tasks: anyone when reads need no credential (an operator who sends
    /// theirs still sees only their tenants), otherwise a valid credential.
    pub fn read(&self, headers: &HeaderMap) -> Result<Scope, ApiError> {
        match self.caller(headers)? {
            Caller::Anonymous if self.reads_need_credential => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "reading tasks needs a credential here (admin.reads_need_credential): send an operator's token as `Authorization: Bearer <token>`",
            )),
            Caller::Anonymous | Caller::Shared => Ok(Scope::All),
            Caller::Operator { operator, .. } => Ok(operator.scope.clone()),
        }
    }

    /// Admits a call that needs `role`.
    pub fn act(&self, headers: &HeaderMap, role: Role) -> Result<Actor, ApiError> {
        if !self.has_credentials() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "changes are disabled: configure operators ([admin.operators.NAME]) or `admin.token`, and send a token as `Authorization: Bearer <token>`",
            ));
        }
        match self.caller(headers)? {
            Caller::Anonymous => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer <token>` (an operator's token, or the configured `admin.token`)",
            )),
            Caller::Shared => Ok(Actor { named: None }),
            Caller::Operator { operator, .. } if !operator.may(role) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "operator {} does not have the `{}` role this call needs",
                    operator.name,
                    role.name()
                ),
            )),
            Caller::Operator {
                operator,
                credential,
            } => Ok(Actor {
                named: Some((operator, credential)),
            }),
        }
    }
}

/// The answer for a task the caller may not see: the same as for a task not in the ledger.
pub fn not_visible(task: sendledger_core::TaskId) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("task {task} is not in the ledger"),
    )
}

/// Refuses a task outside `scope` as [`not_visible`].
pub async fn check_visible(
    shared: &Shared,
    scope: &Scope,
    task: sendledger_core::TaskId,
) -> Result<(), ApiError> {
    if *scope == Scope::All {
        return Ok(());
    }
    let tenants = shared.engine.tenants(vec![task]).await?;
    match scope.allows(tenants[0].as_deref()) {
        true => Ok(()),
        false => Err(not_visible(task)),
    }
}

/// Keeps the tasks of `page` that are in `scope`: a page of other tenants' tasks comes back
/// shorter (even empty), with its `next`.
pub async fn keep_visible(
    shared: &Shared,
    scope: &Scope,
    page: &mut sendledger_store::TaskPage,
) -> Result<(), ApiError> {
    if *scope == Scope::All {
        return Ok(());
    }
    let ids = page.tasks.iter().map(|(task, _)| *task).collect();
    let tenants = shared.engine.tenants(ids).await?;
    let mut tenants = tenants.iter();
    (page.tasks).retain(|_| scope.allows(tenants.next().and_then(|t| t.as_deref())));
    Ok(())
}

/// `GET /whoami`: the operator a credential belongs to, its id, roles and tenants.
pub async fn whoami(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> ApiResult {
    let body = match shared.gate.caller(&headers)? {
        Caller::Anonymous => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "send a token as `Authorization: Bearer <token>` to learn whose it is",
            ))
        }
        Caller::Shared => json!({ "operator": null, "shared_token": true }),
        Caller::Operator {
            operator,
            credential,
        } => {
            let roles: Vec<&str> = operator.roles.iter().map(|r| r.name()).collect();
            let tenants = match &operator.scope {
                Scope::All => json!(null),
                Scope::Tenants(t) => json!(t),
            };
            json!({ "operator": operator.name, "credential": credential, "roles": roles, "tenants": tenants })
        }
    };
    Ok(json_response(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in [
            "Bearer tok en",
            "bearer tok en",
            "BEARER  tok en",
            " bEaReR tok en",
        ] {
            assert_eq!(bearer_token(value), Some("tok en"), "{value}");
        }
        for value in ["Basic tok", "Bearertok", "tok", ""] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}
