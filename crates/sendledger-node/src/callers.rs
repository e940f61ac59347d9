//! The front door's callers (`[front.callers.NAME]`, `docs/front-door.md`): who may submit
//! tasks and read them, for which tenants, under which credentials. A caller proves itself
//! with a bearer token ([`crate::credentials`]) or, on a listener with mutual TLS, with its
//! client certificate, named by the SHA-256 of the certificate.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::credentials::{constant_time_eq, parse_sha256, sha256, token_hashes};
use crate::error::ConfigError;
use crate::operators::Scope;

/// `[front.callers.NAME]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    /// The tenants the caller may submit and read tasks for; unset: every tenant (every tenant
    /// `[access]` lists, when it lists any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    /// Environment variables holding the caller's bearer tokens: one, or two while rotating.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens_env: Vec<String>,
    /// SHA-256 digests (64 hex digits) of the caller's tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_sha256: Vec<String>,
    /// SHA-256 fingerprints of the client certificates the caller presents (64 hex digits,
    /// colons allowed: `openssl x509 -noout -fingerprint -sha256`); needs
    /// `front.tls.client_ca_file`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_sha256: Vec<String>,
}

/// A caller of the front door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub scope: Scope,
}

/// Every caller's credentials. Empty: the front door takes requests from anyone.
#[derive(Debug, Clone, Default)]
pub struct Callers {
    tokens: Vec<([u8; 32], Arc<Caller>)>,
    certificates: Vec<([u8; 32], Arc<Caller>)>,
}

impl Callers {
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.certificates.is_empty()
    }

    /// Whose bearer token `token` is; every credential is compared, each in constant time.
    pub fn by_token(&self, token: &str) -> Option<Arc<Caller>> {
        find(&self.tokens, &sha256(token.as_bytes()))
    }

    /// Whose client certificate hashes to `fingerprint`.
    pub fn by_certificate(&self, fingerprint: &[u8; 32]) -> Option<Arc<Caller>> {
        find(&self.certificates, fingerprint)
    }
}

fn find(credentials: &[([u8; 32], Arc<Caller>)], hash: &[u8; 32]) -> Option<Arc<Caller>> {
    let mut found = None;
    for (known, caller) in credentials {
        if constant_time_eq(known, hash) {
            found = Some(caller.clone());
        }
    }
    found
}

/// Loads `[front.callers]`, reading tokens through `env`. `tenants` are the tenants `[access]`
/// lists (`None` when it lists none): a caller may be scoped to those only. `mutual_tls`:
/// whether the listener asks for client certificates.
pub fn load(
    configs: &BTreeMap<String, CallerConfig>,
    tenants: Option<&BTreeSet<String>>,
    mutual_tls: bool,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Callers, ConfigError> {
    let mut callers = Callers::default();
    let mut holders: BTreeMap<[u8; 32], String> = BTreeMap::new();
    for (name, config) in configs {
        let path = format!("front.callers.{name}");
        let field = |rest: &str| format!("{path}.{rest}");
        let scope = match &config.tenants {
            None => Scope::All,
            Some(t) if t.is_empty() => {
                return Err(ConfigError::field(
                    field("tenants"),
                    "is empty: list the tenants, or leave it out for every tenant",
                ))
            }
            Some(t) => {
                if let Some(unknown) = (t.iter()).find(|t| tenants.is_some_and(|k| !k.contains(*t)))
                {
                    return Err(ConfigError::field(
                        field("tenants"),
                        format!("names {unknown:?}, which [access] does not list: add it there, or remove it here"),
                    ));
                }
                Scope::Tenants(t.iter().cloned().collect())
            }
        };
        let caller = Arc::new(Caller {
            name: name.clone(),
            scope,
        });
        let certificates = !config.certificate_sha256.is_empty();
        let tokens = token_hashes(
            &path,
            &config.tokens_env,
            &config.token_sha256,
            certificates,
            &env,
        )?;
        if certificates && !mutual_tls {
            return Err(ConfigError::field(
                field("certificate_sha256"),
                "names client certificates, but the front door does not ask for them: set front.tls.client_ca_file",
            ));
        }
        let mut fingerprints = Vec::new();
        for (i, hex) in config.certificate_sha256.iter().enumerate() {
            fingerprints.push(parse_sha256(hex).ok_or_else(|| {
                ConfigError::field(
                    format!("{}[{i}]", field("certificate_sha256")),
                    "is not a SHA-256 fingerprint: 64 hex digits, colons allowed",
                )
            })?);
        }
        for (hash, is_token) in
            (tokens.iter().map(|h| (*h, true))).chain(fingerprints.iter().map(|h| (*h, false)))
        {
            if let Some(other) = holders.insert(hash, name.clone()) {
                return Err(ConfigError::field(
                    path.clone(),
                    format!("holds a credential that {other} holds too: every caller needs credentials of its own"),
                ));
            }
            let list = match is_token {
                true => &mut callers.tokens,
                false => &mut callers.certificates,
            };
            list.push((hash, caller.clone()));
        }
    }
    Ok(callers)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "shop-token-0123456789abcdef0123456789";

    fn parse(text: &str, access: Option<&[&str]>, mtls: bool) -> Result<Callers, String> {
        let configs: BTreeMap<String, CallerConfig> =
            toml::from_str(text).map_err(|e| e.to_string())?;
        let tenants: Option<BTreeSet<String>> =
            access.map(|t| t.iter().map(|s| s.to_string()).collect());
        let env = |v: &str| (v == "SHOP").then(|| TOKEN.to_string());
        load(&configs, tenants.as_ref(), mtls, env).map_err(|e| e.to_string())
    }

    #[test]
    fn a_caller_is_found_by_its_token_or_its_certificate() {
        let cert = sha256(b"a certificate");
        let colons: Vec<String> = cert.iter().map(|b| format!("{b:02X}")).collect();
        let text = format!(
            "[shop]\ntenants = [\"acme\"]\ntokens_env = [\"SHOP\"]\n\
             [batch]\ncertificate_sha256 = [\"{}\"]",
            colons.join(":")
        );
        let callers = parse(&text, Some(&["acme", "globex"]), true).unwrap();
        let shop = callers.by_token(TOKEN).unwrap();
        assert_eq!(shop.name, "shop");
        assert!(shop.scope.allows(Some("acme")) && !shop.scope.allows(Some("globex")));
        assert_eq!(callers.by_certificate(&cert).unwrap().name, "batch");
        assert!(callers.by_token("shop-token").is_none());
        assert!(callers.by_certificate(&sha256(b"another")).is_none());
    }

    #[test]
    fn a_wrong_caller_entry_names_its_field() {
        let cert = "ab".repeat(32);
        for (text, access, mtls, wanted) in [
            (
                "[shop]\ntenants = []\ntokens_env = [\"SHOP\"]",
                None,
                false,
                "front.callers.shop.tenants: is empty",
            ),
            (
                "[shop]\ntenants = [\"initech\"]\ntokens_env = [\"SHOP\"]",
                Some(&["acme"][..]),
                false,
                "which [access] does not list",
            ),
            (
                "[shop]\ntenants = [\"acme\"]",
                None,
                false,
                "front.callers.shop.tokens_env",
            ),
            (
                "[shop]\ntokens_env = [\"UNSET\"]",
                None,
                false,
                "front.callers.shop.tokens_env[0]",
            ),
            (
                &*format!("[shop]\ncertificate_sha256 = [\"{cert}\"]"),
                None,
                false,
                "set front.tls.client_ca_file",
            ),
            (
                "[shop]\ncertificate_sha256 = [\"xyz\"]",
                None,
                true,
                "front.callers.shop.certificate_sha256[0]",
            ),
            (
                "[a]\ntokens_env = [\"SHOP\"]\n[b]\ntokens_env = [\"SHOP\"]",
                None,
                false,
                "that a holds too",
            ),
        ] {
            let err = parse(text, access, mtls).unwrap_err();
            assert!(err.contains(wanted), "{text}: {err}");
        }
    }
}
