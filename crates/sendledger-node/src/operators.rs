//! Named operators of the admin endpoint: who may read and act, on which tenants' tasks, under
//! which credentials (`[admin.operators.NAME]`, `docs/access.md`).
//!
//! A credential is a bearer token ([`crate::credentials`]). Its id is recorded with every
//! decision made under it (`OperatorCredential`), shown by `GET /whoami`, and named in
//! `revoked` once the token is withdrawn, so `sendledger audit` can tell a decision by a
//! revoked or unknown credential.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use sendledger_core::audit::Roster;
use sendledger_core::event::POLICY_PREFIX;
use serde::{Deserialize, Serialize};

use crate::credentials::{constant_time_eq, credential_id, sha256, token_hashes};
use crate::error::ConfigError;

/// What an operator may do. Every role includes `read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Tasks, timelines with payloads, reviews, the console's data; `/metrics` for an operator
    /// of every tenant.
    Read,
    /// Resolve a review as succeeded or failed, authorize a resend, add a note.
    Resolve,
    /// Retry failed tasks whose every attempt was proven not sent, one or in bulk.
    Retry,
    /// Order records of a multi-step task undone (`as: compensated`, `undo`).
    Compensate,
    /// Everything above.
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Resolve => "resolve",
            Role::Retry => "retry",
            Role::Compensate => "compensate",
            Role::Admin => "admin",
        }
    }
}

/// Which tenants' tasks a caller may see and act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Tenants(BTreeSet<String>),
}

impl Scope {
    /// Whether a task of `tenant` is in scope; a task with no tenant (a rejected input) is
    /// only for operators of every tenant.
    pub fn allows(&self, tenant: Option<&str>) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenants(tenants) => tenant.is_some_and(|t| tenants.contains(t)),
        }
    }
}

/// A named operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub roles: BTreeSet<Role>,
    pub scope: Scope,
}

impl Operator {
    pub fn may(&self, role: Role) -> bool {
        role == Role::Read || self.roles.contains(&role) || self.roles.contains(&Role::Admin)
    }
}

/// One valid credential: the hash of its token and whose it is.
#[derive(Debug, Clone)]
struct Credential {
    hash: [u8; 32],
    id: String,
    operator: Arc<Operator>,
}

/// Every operator's credentials, and the credentials revoked.
#[derive(Debug, Clone, Default)]
pub struct Operators {
    credentials: Vec<Credential>,
    revoked: BTreeMap<String, (String, u64)>,
}

impl Operators {
    pub fn is_empty(&self) -> bool {
        self.credentials.is_empty()
    }

    /// The operator a bearer token belongs to, and the credential's id. Every credential is
    /// compared, each without stopping at the first differing byte.
    pub fn authenticate(&self, token: &str) -> Option<(Arc<Operator>, String)> {
        let hash = sha256(token.as_bytes());
        let mut found = None;
        for credential in &self.credentials {
            if constant_time_eq(&credential.hash, &hash) {
                found = Some((credential.operator.clone(), credential.id.clone()));
            }
        }
        found
    }

    /// The credentials as `sendledger audit` checks decisions against them.
    pub fn roster(&self) -> Roster {
        Roster {
            credentials: (self.credentials.iter())
                .map(|c| (c.id.clone(), c.operator.name.clone()))
                .collect(),
            revoked: self.revoked.clone(),
        }
    }
}

/// `[admin.operators.NAME]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// `read`, `resolve`, `retry`, `compensate`, `admin`.
    pub roles: Vec<Role>,
    /// The tenants whose tasks the operator sees and acts on; unset: every tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    /// Environment variables holding the operator's tokens: one, or two while a token is
    /// rotated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens_env: Vec<String>,
    /// SHA-256 digests (64 hex digits) of the operator's tokens, for a configuration that
    /// must not hold the tokens themselves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_sha256: Vec<String>,
    /// Credential ids withdrawn from the operator, each with the time it was withdrawn (RFC
    /// 3339): decisions under it after then are violations for `sendledger audit`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revoked: BTreeMap<String, String>,
}

/// Loads `[admin.operators]`, reading tokens through `env`, naming the field that is wrong.
pub fn load(
    configs: &BTreeMap<String, OperatorConfig>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Operators, ConfigError> {
    let mut operators = Operators::default();
    let mut holders: BTreeMap<String, String> = BTreeMap::new();
    for (name, config) in configs {
        let field = |rest: &str| format!("admin.operators.{name}.{rest}");
        let name_ok = !name.is_empty()
            && !name.starts_with(POLICY_PREFIX)
            && (name.chars()).all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c));
        if !name_ok {
            return Err(ConfigError::field(
                format!("admin.operators.{name}"),
                "is not an operator name: use letters, digits and . _ @ - (recorded as `by` with every decision)",
            ));
        }
        if config.roles.is_empty() {
            return Err(ConfigError::field(
                field("roles"),
                "is empty: give at least `read` (roles: read, resolve, retry, compensate, admin)",
            ));
        }
        let scope = match &config.tenants {
            None => Scope::All,
            Some(t) if t.is_empty() => {
                return Err(ConfigError::field(
                    field("tenants"),
                    "is empty: list the tenants, or leave it out for every tenant",
                ))
            }
            Some(t) => Scope::Tenants(t.iter().cloned().collect()),
        };
        let operator = Arc::new(Operator {
            name: name.clone(),
            roles: config.roles.iter().copied().collect(),
            scope,
        });
        let hashes = token_hashes(
            &format!("admin.operators.{name}"),
            &config.tokens_env,
            &config.token_sha256,
            false,
            &env,
        )?;
        for hash in hashes {
            let id = credential_id(&hash);
            if let Some(other) = holders.insert(id.clone(), name.clone()) {
                return Err(ConfigError::field(
                    field("tokens_env"),
                    format!("holds credential {id}, which {other} holds too: every operator needs tokens of their own"),
                ));
            }
            operators.credentials.push(Credential {
                hash,
                id,
                operator: operator.clone(),
            });
        }
        for (id, when) in &config.revoked {
            let at = format!("{}.{id}", field("revoked"));
            if id.len() != 16 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(ConfigError::field(
                    at,
                    "is not a credential id: 16 hex digits, as recorded with decisions and shown by GET /whoami",
                ));
            }
            if holders.contains_key(id) {
                return Err(ConfigError::field(
                    at,
                    "is revoked but still configured: remove its token from tokens_env or token_sha256",
                ));
            }
            let since = humantime::parse_rfc3339_weak(when)
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .ok_or_else(|| {
                    ConfigError::field(
                        at.clone(),
                        format!("{when:?} is not a time: use RFC 3339, e.g. 2026-12-01T00:00:00Z"),
                    )
                })?;
            operators.revoked.insert(
                id.to_ascii_lowercase(),
                (name.clone(), since.as_millis() as u64),
            );
        }
    }
    Ok(operators)
}

/// How the admin endpoint's reads are guarded: whether they need a credential, and whether the
/// configuration says so (rather than its default for the listen address).
#[derive(Debug, Clone, Copy)]
pub struct Reads {
    pub need_credential: bool,
    pub configured: bool,
}

/// Checks the admin endpoint's credentials as a whole: operators (tokens read through `env`)
/// or the shared `admin.token`, not both; and someone who may read when reads need a
/// credential.
pub fn check(
    configs: &BTreeMap<String, OperatorConfig>,
    token: Option<&str>,
    reads: Reads,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let operators = load(configs, env)?;
    let token = token.is_some_and(|t| !t.is_empty());
    if token && !operators.is_empty() {
        return Err(ConfigError::field(
            "admin.token",
            "is set beside admin.operators: the shared token acts as no one in particular; give each person an operator entry and remove the token",
        ));
    }
    if reads.need_credential && !token && operators.is_empty() {
        let why = match reads.configured {
            true => "is true",
            false => "defaults to true because admin.listen is not loopback",
        };
        return Err(ConfigError::field(
            "admin.reads_need_credential",
            format!("{why}, but no credential is configured, so no one could read tasks or reviews: add [admin.operators.NAME] entries, or set it to false only where something in front of the endpoint authenticates"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "ana-token-0123456789abcdef0123456789";

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<Operators, String> {
        let configs: BTreeMap<String, OperatorConfig> =
            toml::from_str(text).map_err(|e| e.to_string())?;
        let env: BTreeMap<String, String> = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load(&configs, |v| env.get(v).cloned()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_token_authenticates_its_operator_from_the_environment_or_its_hash() {
        let digest: String = sha256(b"bo-token-0123456789abcdef0123456789")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let text = format!(
            "[ana]\nroles = [\"resolve\"]\ntenants = [\"acme\"]\ntokens_env = [\"ANA\"]\n\
             [bo]\nroles = [\"admin\"]\ntoken_sha256 = [\"{digest}\"]\n\
             revoked = {{ \"00112233445566ff\" = \"2026-12-01T00:00:00Z\" }}"
        );
        let ops = parse(&text, &[("ANA", TOKEN)]).unwrap();
        let (ana, id) = ops.authenticate(TOKEN).unwrap();
        assert_eq!(
            (ana.name.as_str(), id.as_str()),
            ("ana", &*crate::credentials::token_credential_id(TOKEN))
        );
        assert!(ana.may(Role::Read) && ana.may(Role::Resolve) && !ana.may(Role::Retry));
        assert!(ana.scope.allows(Some("acme")) && !ana.scope.allows(Some("globex")));
        assert!(!ana.scope.allows(None));
        let (bo, _) = ops
            .authenticate("bo-token-0123456789abcdef0123456789")
            .unwrap();
        assert!(bo.may(Role::Compensate) && bo.scope == Scope::All);
        assert!(ops.authenticate("ana-token").is_none());
        let roster = ops.roster();
        assert_eq!(roster.credentials.len(), 2);
        assert_eq!(roster.revoked["00112233445566ff"].0, "bo");
    }

    #[test]
    fn a_wrong_operator_entry_names_its_field() {
        for (text, field) in [
            ("[ana]\nroles = []\ntokens_env = [\"ANA\"]", "admin.operators.ana.roles"),
            ("[ana]\nroles = [\"root\"]\ntokens_env = [\"ANA\"]", "unknown variant"),
            ("[ana]\nroles = [\"read\"]", "admin.operators.ana.tokens_env"),
            ("[ana]\nroles = [\"read\"]\ntokens_env = [\"SHORT\"]", "admin.operators.ana.tokens_env[0]"),
            ("[ana]\nroles = [\"read\"]\ntoken_sha256 = [\"abc\"]", "admin.operators.ana.token_sha256[0]"),
            ("[ana]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]\ntenants = []", "admin.operators.ana.tenants"),
            ("[\"policy:x\"]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]", "admin.operators.policy:x"),
            ("[ana]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]\n[bo]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]", "which ana holds too"),
            ("[ana]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]\nrevoked = { \"xyz\" = \"2026-12-01T00:00:00Z\" }", "admin.operators.ana.revoked.xyz"),
            ("[ana]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]\nrevoked = { \"00112233445566ff\" = \"yesterday\" }", "is not a time"),
        ] {
            let err = parse(text, &[("ANA", TOKEN), ("SHORT", "x")]).unwrap_err();
            assert!(err.contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn credentials_are_operators_or_the_shared_token_and_someone_may_read() {
        let ana: BTreeMap<String, OperatorConfig> =
            toml::from_str("[ana]\nroles = [\"read\"]\ntokens_env = [\"ANA\"]").unwrap();
        let env = |v: &str| (v == "ANA").then(|| TOKEN.to_string());
        let reads = |need_credential, configured| Reads {
            need_credential,
            configured,
        };
        let err = check(&ana, Some("shared"), reads(false, false), env).unwrap_err();
        assert!(err.to_string().starts_with("admin.token: "), "{err}");
        let none = BTreeMap::new();
        let err = check(&none, None, reads(true, false), env).unwrap_err();
        assert!(
            err.to_string()
                .contains("defaults to true because admin.listen is not loopback"),
            "{err}"
        );
        check(&none, None, reads(false, true), env).unwrap();
        check(&none, Some("shared"), reads(true, false), env).unwrap();
        check(&ana, None, reads(true, true), env).unwrap();
    }
}
