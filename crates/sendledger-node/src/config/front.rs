//! `[front]`: the HTTP front door, where callers submit tasks with an `Idempotency-Key` and
//! wait for their results (`docs/front-door.md`). Off by default.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

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
        }
    }
}

impl FrontConfig {
    /// Ranges; `kafka_mode` and `access` (whether `[access]` lists tenants) say what the
    /// front door cannot do yet.
    pub fn validate(&self, kafka_mode: bool, access: bool) -> Result<(), ConfigError> {
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
        if kafka_mode {
            return Err(ConfigError::field(
                "front.enabled",
                "the front door answers from this instance's ledger, and in kafka mode a task's ledger is its partition owner's: it runs in local mode only for now",
            ));
        }
        if access {
            return Err(ConfigError::field(
                "front.enabled",
                "the front door does not authenticate its callers yet, so it would let anyone act for the tenants [access] binds: leave it off where [access] lists tenants",
            ));
        }
        Ok(())
    }
}
