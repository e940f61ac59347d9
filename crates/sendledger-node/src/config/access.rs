//! `[access]`: which tenants requests may be for, the targets and operations each may use, and
//! the keys each signs its requests with (`docs/access.md`). Off when no tenant is listed: every
//! valid request is then acted on, whoever produced it, which is unsafe when several tenants
//! share the requests topic.

use std::collections::BTreeMap;

use sendledger_core::access::{Access, SigningKey, TenantRules};
use sendledger_effects::{SagaConfig, TargetConfig};
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Shortest signing key accepted, in bytes: a short key can be guessed from signed messages.
pub const MIN_KEY_BYTES: usize = 32;

/// `[access]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// `[access.tenants.NAME]`: the tenants requests may be for. A request for a tenant not
    /// listed is rejected.
    pub tenants: BTreeMap<String, TenantAccessConfig>,
}

/// `[access.tenants.NAME]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantAccessConfig {
    /// The requests topic of the tenant's own (its producers alone may write it, by Kafka's
    /// ACLs): the service reads it besides `kafka.requests_topic`, and acts on the tenant's
    /// requests from there only. Unset: they come on `kafka.requests_topic`, beside other
    /// tenants'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The targets and sagas the tenant's requests may name.
    pub targets: Vec<String>,
    /// The operations the tenant's requests may name; unset: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<Vec<String>>,
    /// Environment variables holding the keys the tenant signs its requests with: one, or two
    /// while a key is rotated. Unset: its requests need no signature.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signing_keys_env: Vec<String>,
}

impl AccessConfig {
    /// The requests topics of tenants of their own, besides `main` (the requests topic).
    pub fn own_topics(&self, main: &str) -> std::collections::BTreeSet<String> {
        (self.tenants.values())
            .filter_map(|t| t.topic.clone())
            .filter(|t| t != main)
            .collect()
    }

    /// The access rules, checked against the targets and sagas and with the keys read through
    /// `env`; `None` when no tenant is listed. A tenant without a topic of its own sends on
    /// `requests_topic`.
    pub fn load(
        &self,
        targets: &BTreeMap<String, TargetConfig>,
        sagas: &BTreeMap<String, SagaConfig>,
        requests_topic: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Access>, ConfigError> {
        if self.tenants.is_empty() {
            return Ok(None);
        }
        let mut access = Access::default();
        for (tenant, config) in &self.tenants {
            let field = |rest: &str| format!("access.tenants.{tenant}.{rest}");
            if config.targets.is_empty() {
                return Err(ConfigError::field(
                    field("targets"),
                    "is empty: list the targets or sagas the tenant may use",
                ));
            }
            for (i, target) in config.targets.iter().enumerate() {
                if !targets.contains_key(target) && !sagas.contains_key(target) {
                    return Err(ConfigError::field(
                        format!("{}[{i}]", field("targets")),
                        format!("`{target}` is neither a configured target nor a saga"),
                    ));
                }
            }
            if let Some(topic) = &config.topic {
                sendledger_kafka::config::check_topic(topic)
                    .map_err(|problem| ConfigError::field(field("topic"), problem))?;
            }
            if config.signing_keys_env.len() > 2 {
                return Err(ConfigError::field(
                    field("signing_keys_env"),
                    "names more than two keys; two are valid at once while a key is rotated",
                ));
            }
            let mut keys = Vec::new();
            for (i, name) in config.signing_keys_env.iter().enumerate() {
                let at = format!("{}[{i}]", field("signing_keys_env"));
                let secret = env(name).unwrap_or_default();
                if secret.len() < MIN_KEY_BYTES {
                    return Err(ConfigError::field(
                        at,
                        format!(
                            "environment variable {name} is unset or shorter than {MIN_KEY_BYTES} bytes; set it to the tenant's signing key (e.g. 32 random bytes, hex-encoded)"
                        ),
                    ));
                }
                keys.push(SigningKey {
                    id: name.clone(),
                    secret: secret.into_bytes(),
                });
            }
            let topic = config
                .topic
                .clone()
                .unwrap_or_else(|| requests_topic.to_string());
            let rules = TenantRules {
                topic: Some(topic),
                targets: config.targets.iter().cloned().collect(),
                operations: (config.operations.as_ref()).map(|o| o.iter().cloned().collect()),
                keys,
            };
            access.tenants.insert(tenant.clone(), rules);
        }
        Ok(Some(access))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml_text: &str, env: &[(&str, &str)]) -> Result<Option<Access>, String> {
        let config: AccessConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        let target: TargetConfig =
            serde_json::from_value(serde_json::json!({ "url": "http://remote.example/x" }))
                .unwrap();
        let targets = BTreeMap::from([("payments".to_string(), target)]);
        let env: BTreeMap<String, String> = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (config.load(&targets, &BTreeMap::new(), "requests", |name| {
            env.get(name).cloned()
        }))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn access_rules_load_with_their_keys_or_name_the_field_that_is_wrong() {
        let key = "k".repeat(MIN_KEY_BYTES);
        let ok = load(
            "[tenants.acme]\ntargets = [\"payments\"]\nsigning_keys_env = [\"ACME_KEY\"]",
            &[("ACME_KEY", &key)],
        )
        .unwrap()
        .unwrap();
        assert_eq!(ok.tenants["acme"].keys[0].secret, key.as_bytes());
        assert_eq!(ok.tenants["acme"].topic.as_deref(), Some("requests"));
        assert!(
            load("", &[]).unwrap().is_none(),
            "off when no tenant is listed"
        );
        for (text, field) in [
            ("[tenants.acme]\ntargets = []", "access.tenants.acme.targets"),
            ("[tenants.acme]\ntargets = [\"refunds\"]", "access.tenants.acme.targets[0]"),
            (
                "[tenants.acme]\ntargets = [\"payments\"]\nsigning_keys_env = [\"UNSET\"]",
                "access.tenants.acme.signing_keys_env[0]",
            ),
            (
                "[tenants.acme]\ntargets = [\"payments\"]\nsigning_keys_env = [\"A\", \"B\", \"C\"]",
                "access.tenants.acme.signing_keys_env",
            ),
            ("[tenants.acme]\ntargets = [\"payments\"]\ncolour = 1", "colour"),
            (
                "[tenants.acme]\ntargets = [\"payments\"]\ntopic = \"acme requests\"",
                "access.tenants.acme.topic",
            ),
        ] {
            let err = load(text, &[("SHORT", "x")]).unwrap_err();
            assert!(err.contains(field), "{text}: {err}");
        }
    }
}
