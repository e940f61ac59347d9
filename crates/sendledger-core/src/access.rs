//! Who may ask for what: a request is acted on only when its tenant is allowed for where it
//! came from (`docs/access.md`). Deduplication is not authorization: the request key and
//! payload hash say whether a request was seen, not whether its producer may act for its
//! tenant.
//!
//! A tenant's rules: the targets (or sagas) and operations it may use, and the keys its
//! requests are signed with. A signed request carries [`SIGNATURE_HEADER`]: `v1=` and the
//! lowercase hex HMAC-SHA256, under one of the tenant's keys, of the bytes
//! `sendledger-request-v1\n`, the requests topic's name, `\n`, and the message's value as it
//! is. Binding the topic keeps a signed request from being replayed onto another service's
//! topic; the value holds the identity and the payload.
//! Two keys valid at once allow rotation: sign with the new one once every instance has it,
//! then drop the old.
//!
//! Pure: the keys are given (the node reads them from the environment), nothing is read here.

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::request::TaskRequest;

/// The header of a signed request message.
pub const SIGNATURE_HEADER: &str = "sendledger-signature";

/// What a signature covers before the topic and the value.
const CONTEXT: &[u8] = b"sendledger-request-v1\n";

/// Every tenant that may send requests, and what each may ask for. A tenant not listed may
/// ask for nothing.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub tenants: BTreeMap<String, TenantRules>,
}

/// What one tenant may ask for.
#[derive(Debug, Clone, Default)]
pub struct TenantRules {
    /// The requests topic the tenant's requests come from; `None`: any topic the service
    /// reads (the producers' access to each topic is then no part of the check).
    pub topic: Option<String>,
    /// The targets and sagas its requests may name.
    pub targets: BTreeSet<String>,
    /// The operations its requests may name; `None`: any.
    pub operations: Option<BTreeSet<String>>,
    /// The keys its requests are signed with; none: its requests need no signature (the
    /// topic's ACLs are the only check of who produced them).
    pub keys: Vec<SigningKey>,
}

/// A key a tenant signs with, and a name for it that logs and errors may show.
#[derive(Clone)]
pub struct SigningKey {
    pub id: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Which rule refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AccessRule {
    UnknownTenant,
    TopicNotAllowed,
    Unsigned,
    BadSignature,
    TargetNotAllowed,
    OperationNotAllowed,
}

impl AccessRule {
    /// The rule's name, in reasons and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            AccessRule::UnknownTenant => "unknown_tenant",
            AccessRule::TopicNotAllowed => "topic_not_allowed",
            AccessRule::Unsigned => "unsigned",
            AccessRule::BadSignature => "bad_signature",
            AccessRule::TargetNotAllowed => "target_not_allowed",
            AccessRule::OperationNotAllowed => "operation_not_allowed",
        }
    }
}

/// Why a request is not acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refused by access rule {}: {detail}", rule.name())]
pub struct Refusal {
    pub rule: AccessRule,
    /// The request's tenant when it is a configured one, else `None` (a metric label must not
    /// take any value a producer writes).
    pub tenant: Option<String>,
    pub detail: String,
}

impl Refusal {
    fn of(request: &TaskRequest, rule: AccessRule, detail: String) -> Refusal {
        Refusal {
            rule,
            tenant: Some(request.tenant.clone()),
            detail,
        }
    }
}

impl Access {
    /// The rules of `request`'s tenant; refused when it is not listed.
    fn rules_of(&self, request: &TaskRequest) -> Result<&TenantRules, Refusal> {
        self.tenants.get(&request.tenant).ok_or_else(|| Refusal {
            rule: AccessRule::UnknownTenant,
            tenant: None,
            detail: format!(
                "tenant {:?} is not one this service acts for",
                request.tenant
            ),
        })
    }

    /// Whether `request`, the value `value` of a message on `topic` with the signature header
    /// `signature` (when it has one), may be acted on.
    pub fn check(
        &self,
        request: &TaskRequest,
        topic: &str,
        value: &[u8],
        signature: Option<&[u8]>,
    ) -> Result<(), Refusal> {
        let rules = self.rules_of(request)?;
        let refuse = |rule, detail| Err(Refusal::of(request, rule, detail));
        if let Some(own) = rules.topic.as_deref().filter(|own| *own != topic) {
            return refuse(
                AccessRule::TopicNotAllowed,
                format!(
                    "tenant {:?} sends its requests on topic {own:?}, and this one came on {topic:?}",
                    request.tenant
                ),
            );
        }
        if !rules.keys.is_empty() {
            let Some(signature) = signature else {
                return refuse(
                    AccessRule::Unsigned,
                    format!(
                        "tenant {:?} signs its requests, and this one has no {SIGNATURE_HEADER} header",
                        request.tenant
                    ),
                );
            };
            if !rules
                .keys
                .iter()
                .any(|k| verify(k, topic, value, signature))
            {
                return refuse(
                    AccessRule::BadSignature,
                    format!(
                        "the {SIGNATURE_HEADER} header is not a signature of this message on topic {topic:?} by a key of tenant {:?}",
                        request.tenant
                    ),
                );
            }
        }
        self.check_request(request)
    }

    /// Whether `request`'s tenant is listed and may ask for its target and operation: the
    /// rules of [`Access::check`] that do not depend on the message it came in.
    pub fn check_request(&self, request: &TaskRequest) -> Result<(), Refusal> {
        let rules = self.rules_of(request)?;
        let refuse = |rule, detail| Err(Refusal::of(request, rule, detail));
        if !rules.targets.contains(&request.target) {
            return refuse(
                AccessRule::TargetNotAllowed,
                format!(
                    "tenant {:?} may not use target {:?}",
                    request.tenant, request.target
                ),
            );
        }
        if let Some(operations) = &rules.operations {
            if !operations.contains(&request.operation) {
                return refuse(
                    AccessRule::OperationNotAllowed,
                    format!(
                        "tenant {:?} may not ask for operation {:?}",
                        request.tenant, request.operation
                    ),
                );
            }
        }
        Ok(())
    }
}

fn mac(secret: &[u8], topic: &str, value: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(CONTEXT);
    mac.update(topic.as_bytes());
    mac.update(b"\n");
    mac.update(value);
    mac
}

/// The [`SIGNATURE_HEADER`] value of a message with value `value` on `topic`, signed with
/// `secret`.
pub fn sign(secret: &[u8], topic: &str, value: &[u8]) -> String {
    let digest = mac(secret, topic, value).finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("v1={hex}")
}

/// Whether `signature` is [`sign`]'s for this message under `key` (compared in constant time).
fn verify(key: &SigningKey, topic: &str, value: &[u8], signature: &[u8]) -> bool {
    let Some(hex) = signature.strip_prefix(b"v1=") else {
        return false;
    };
    if hex.len() != 64 {
        return false;
    }
    let mut bytes = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let Some(b) = std::str::from_utf8(pair)
            .ok()
            .and_then(|p| u8::from_str_radix(p, 16).ok())
        else {
            return false;
        };
        bytes[i] = b;
    }
    mac(&key.secret, topic, value).verify_slice(&bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tenant: &str, target: &str) -> TaskRequest {
        TaskRequest::from_json(
            format!(r#"{{"tenant":"{tenant}","operation":"payment.create","request_key":"k-1","target":"{target}","payload":{{"amount":1}}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    fn access() -> Access {
        let key = |id: &str, secret: &str| SigningKey {
            id: id.into(),
            secret: secret.as_bytes().to_vec(),
        };
        let acme = TenantRules {
            topic: None,
            targets: ["payments".to_string()].into(),
            operations: Some(["payment.create".to_string()].into()),
            keys: vec![key("old", "s3cret-old"), key("new", "s3cret-new")],
        };
        let open = TenantRules {
            targets: ["payments".to_string()].into(),
            ..TenantRules::default()
        };
        let own_topic = TenantRules {
            topic: Some("globex.requests".into()),
            targets: ["payments".to_string()].into(),
            ..TenantRules::default()
        };
        Access {
            tenants: [
                ("acme".to_string(), acme),
                ("open".to_string(), open),
                ("globex".to_string(), own_topic),
            ]
            .into(),
        }
    }

    #[test]
    fn a_request_passes_only_signed_by_its_tenant_for_its_targets_and_operations() {
        let a = access();
        let ok = request("acme", "payments");
        let value = b"the message value";
        for secret in ["s3cret-old", "s3cret-new"] {
            let sig = sign(secret.as_bytes(), "requests", value);
            assert_eq!(
                a.check(&ok, "requests", value, Some(sig.as_bytes())),
                Ok(())
            );
        }
        let sig = sign(b"s3cret-new", "requests", value);
        let rule = |r: &TaskRequest, topic: &str, v: &[u8], s: Option<&[u8]>| {
            a.check(r, topic, v, s).unwrap_err().rule
        };
        assert_eq!(rule(&ok, "requests", value, None), AccessRule::Unsigned);
        let forged = sign(b"guess", "requests", value);
        assert_eq!(
            rule(&ok, "requests", value, Some(forged.as_bytes())),
            AccessRule::BadSignature
        );
        assert_eq!(
            rule(&ok, "other-topic", value, Some(sig.as_bytes())),
            AccessRule::BadSignature
        );
        assert_eq!(
            rule(&ok, "requests", b"another value", Some(sig.as_bytes())),
            AccessRule::BadSignature
        );
        assert_eq!(
            rule(&ok, "requests", value, Some(b"v1=zz")),
            AccessRule::BadSignature
        );
        let elsewhere = request("acme", "shipments");
        let sig_for = |v: &[u8]| sign(b"s3cret-old", "requests", v);
        assert_eq!(
            rule(
                &elsewhere,
                "requests",
                value,
                Some(sig_for(value).as_bytes())
            ),
            AccessRule::TargetNotAllowed
        );
        let stranger = request("mallory", "payments");
        let refusal = a.check(&stranger, "requests", value, None).unwrap_err();
        assert_eq!(
            (refusal.rule, refusal.tenant),
            (AccessRule::UnknownTenant, None)
        );
        // A tenant without keys needs no signature.
        assert_eq!(
            a.check(&request("open", "payments"), "requests", value, None),
            Ok(())
        );
        // A tenant bound to its topic: its requests from there only.
        let globex = request("globex", "payments");
        assert_eq!(a.check(&globex, "globex.requests", value, None), Ok(()));
        let refusal = a.check(&globex, "requests", value, None).unwrap_err();
        assert_eq!(
            (refusal.rule, refusal.tenant.as_deref()),
            (AccessRule::TopicNotAllowed, Some("globex"))
        );
    }
}
