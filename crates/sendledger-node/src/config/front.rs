//! `[front]`: the HTTP front door, where callers submit tasks with an `Idempotency-Key` and
//! wait for their results (`docs/front-door.md`). Off by default.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::callers::{CallerConfig, Callers};
use crate::error::ConfigError;
use crate::tls::ListenerTlsConfig;

/// `[front]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FrontConfig {
    pub enabled: bool,
    /// Listen address; loopback by default.
    pub listen: SocketAddr,
    /// The longest `Prefer: wait=N` honoured; a longer one waits this long.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Requests waiting for their task's result at once; more are answered 503 at once.
    pub max_waiting: usize,
    /// Connections open at once; further ones are closed as soon as they are accepted.
    pub max_connections: usize,
    /// How long a connection may wait before sending a request.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How long a request's head and body may take once its first byte arrived.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// TLS on the listener (and mutual TLS with `client_ca_file`); unset: plain HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTlsConfig>,
    /// `[front.callers.NAME]`: who may submit and read tasks. None: anyone who reaches the
    /// listener (refused where `[access]` lists tenants, or `listen` is not loopback).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub callers: BTreeMap<String, CallerConfig>,
}

impl Default for FrontConfig {
    fn default() -> Self {
        FrontConfig {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 9480)),
            max_wait: Duration::from_secs(30),
            max_waiting: 10_000,
            max_connections: 1024,
            idle_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(5),
            max_body_bytes: 1024 * 1024,
            tls: None,
            callers: BTreeMap::new(),
        }
    }
}

impl FrontConfig {
    /// The callers, tokens read through `env`; `tenants` are the tenants `[access]` lists.
    pub fn load_callers(
        &self,
        tenants: Option<&BTreeSet<String>>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Callers, ConfigError> {
        let mutual_tls = (self.tls.as_ref()).is_some_and(|t| t.client_ca_file.is_some());
        crate::callers::load(&self.callers, tenants, mutual_tls, env)
    }

    /// Ranges, TLS files and callers (tokens read through `env`); `kafka_mode`, `standby`
    /// (`kafka.standby`) and `tenants` (what `[access]` lists, `None` when nothing) say what
    /// the front door must refuse.
    pub fn validate(
        &self,
        kafka_mode: bool,
        standby: bool,
        tenants: Option<&BTreeSet<String>>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        for (field, value) in [
            ("front.max_waiting", self.max_waiting),
            ("front.max_connections", self.max_connections),
            ("front.max_body_bytes", self.max_body_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::field(field, "must be at least 1"));
            }
        }
        for (field, value) in [
            ("front.idle_timeout", self.idle_timeout),
            ("front.header_read_timeout", self.header_read_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::field(field, "must be longer than 0s"));
            }
        }
        if kafka_mode && !standby {
            return Err(ConfigError::field(
                "front.enabled",
                "in kafka mode the front door answers for tasks of every partition from this instance's copies of them: set kafka.standby = true, so that it keeps a copy of each partition it does not own",
            ));
        }
        if let Some(tls) = &self.tls {
            tls.acceptor("front.tls")?;
        }
        let callers = self.load_callers(tenants, env)?;
        if callers.is_empty() && tenants.is_some() {
            return Err(ConfigError::field(
                "front.callers",
                "is empty while [access] lists tenants: anyone who reaches the front door could act for them; add [front.callers.NAME] entries with their tenants",
            ));
        }
        if callers.is_empty() && !self.listen.ip().to_canonical().is_loopback() {
            return Err(ConfigError::field(
                "front.callers",
                format!("is empty while front.listen ({}) is not loopback: anyone who reaches it could submit tasks; add [front.callers.NAME] entries, or listen on loopback behind something that authenticates", self.listen),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "caller-token-0123456789abcdef0123456789";

    /// `kafka_mode`: kafka mode without standby copies.
    fn check(text: &str, kafka_mode: bool, access: Option<&[&str]>) -> Result<(), String> {
        let front: FrontConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let tenants: Option<BTreeSet<String>> =
            access.map(|t| t.iter().map(|s| s.to_string()).collect());
        let env = |v: &str| (v == "TOKEN").then(|| TOKEN.to_string());
        (front.validate(kafka_mode, false, tenants.as_ref(), env)).map_err(|e| e.to_string())
    }

    #[test]
    fn the_front_door_is_refused_where_anyone_could_act_for_a_tenant() {
        let on = "enabled = true\n";
        let caller = "[callers.shop]\ntokens_env = [\"TOKEN\"]\n";
        check(on, false, None).unwrap();
        check(&format!("{on}{caller}"), false, Some(&["acme"])).unwrap();
        for (text, kafka_mode, access, wanted) in [
            (on.to_string(), false, Some(&["acme"][..]), "front.callers: is empty while [access] lists tenants"),
            (format!("{on}listen = \"0.0.0.0:9480\"\n"), false, None, "is not loopback"),
            (format!("{on}{caller}"), true, None, "set kafka.standby = true"),
            (format!("{on}max_waiting = 0\n"), false, None, "front.max_waiting"),
            (format!("{on}[tls]\ncert_file = \"/nonexistent.pem\"\nkey_file = \"/nonexistent-key.pem\"\n"), false, None, "front.tls.cert_file: cannot read"),
        ] {
            let err = check(&text, kafka_mode, access).unwrap_err();
            assert!(err.contains(wanted), "{text}: {err}");
        }
        check(
            &format!("{on}listen = \"0.0.0.0:9480\"\n{caller}"),
            false,
            None,
        )
        .unwrap();
    }
}
