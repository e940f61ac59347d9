//! The simulator's configuration: one serde struct, human durations, validated at start.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the simulated remote behaves. Every field has a default, so `SimConfig::default()` is a
/// well-behaved remote on a free loopback port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// `POST` here creates a record.
    pub create_path: String,
    /// `GET` here with `?field=value&...` lists matching records.
    pub lookup_path: String,
    /// `GET` here returns [`crate::Stats`] as JSON.
    pub stats_path: String,
    /// Dotted path of the body field that identifies a business intent (for duplicate counting).
    pub identity_field: String,
    /// When set, a repeated value of this request header returns the first record instead of
    /// creating a new one. Unset: the remote has no idempotency at all.
    pub idempotency_header: Option<String>,
    /// Records become visible to lookups this long after creation (eventual consistency).
    #[serde(with = "humantime_serde")]
    pub lookup_lag: Duration,
    /// When set, a lookup answers at most this many matches per page, in creation order, and
    /// points at the next page as `lookup_paging` says; `page` is then the query's page number,
    /// never a field condition. Unset: one JSON array with every match (and `page`, if sent,
    /// is a field condition like any other).
    pub lookup_page_size: Option<usize>,
    /// How a paged lookup's answer leads to the next page (used with `lookup_page_size`).
    pub lookup_paging: LookupPaging,
    /// When set, requests without this exact header value are answered 401 (nothing created).
    pub require_header: Option<RequiredHeader>,
    /// Largest accepted request body; larger ones are answered 413 (nothing created).
    pub max_body_bytes: usize,
    /// When set, at most this many creates are worked on at once (a small server's worker
    /// pool); the others wait their turn, and their time waiting counts against the client's
    /// timeout like any latency.
    pub capacity: Option<usize>,
    /// Seed of every random choice the simulator makes (faults, latency).
    pub seed: u64,
    pub faults: Faults,
    /// When set, the remote speaks https only (every fault works the same over TLS).
    pub tls: Option<SimTlsConfig>,
}

/// How a paged lookup leads to its next page. Every page holds at most `lookup_page_size`
/// matches in creation order; a next page's URL is absolute, keeps the query's conditions and
/// adds `page=N` (1-based; no `page` is page 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LookupPaging {
    /// The answer is `{"items": [...], "next": "<URL of the next page>"}`, with `"next": null`
    /// on the last page.
    #[default]
    Body,
    /// The answer is the page's JSON array, with an RFC 8288 `Link: <URL>; rel="next"` header
    /// when there is a next page.
    Link,
    /// The answer is the page's JSON array and nothing points further: the client asks for
    /// `page=1`, `page=2`... and stops at the first page holding fewer than
    /// `lookup_page_size` matches (an empty one included).
    Offset,
}

/// The simulated remote's TLS identity, and the CA of the client certificates it requires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimTlsConfig {
    /// PEM file of the server certificate, followed by its chain.
    pub cert_file: PathBuf,
    /// PEM file of the certificate's private key.
    pub key_file: PathBuf,
    /// When set, a client must present a certificate signed by a CA in this PEM file (mutual
    /// TLS); the handshake fails otherwise and nothing is created.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            create_path: "/records".into(),
            lookup_path: "/records".into(),
            stats_path: "/_sim/stats".into(),
            identity_field: "request_key".into(),
            idempotency_header: None,
            lookup_lag: Duration::ZERO,
            lookup_page_size: None,
            lookup_paging: LookupPaging::default(),
            require_header: None,
            max_body_bytes: 1024 * 1024,
            capacity: None,
            seed: 0,
            faults: Faults::default(),
            tls: None,
        }
    }
}

/// A header the remote requires (an API key, say). The value is never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredHeader {
    pub name: String,
    pub value: String,
}

impl fmt::Debug for RequiredHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequiredHeader")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// Injected faults. Each probability applies to one create request; at most one fault is
/// chosen per request (their sum must not exceed 1). `refuse` applies to each new connection,
/// `lookup_throttle` to each lookup request.
/// A remote that is down altogether is no fault here: [`crate::Sim::set_offline`] switches it
/// at run time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Close a new connection once the request has arrived, without reading it or answering.
    /// Nothing is created.
    pub refuse: f64,
    /// Create the record, then close the connection without answering.
    pub commit_then_drop: f64,
    /// Create the record, then never answer (the connection stays open).
    pub commit_then_hang: f64,
    /// Create the record, then answer `error_status`.
    pub commit_then_error: f64,
    /// Answer `error_status` without creating anything.
    pub error: f64,
    /// Answer `throttle_status` with `Retry-After`, without creating anything.
    pub throttle: f64,
    /// Answer `reject_status` without creating anything.
    pub reject: f64,
    /// Read the whole request, then close the connection without answering. Nothing is
    /// created: the client, which wrote its request and saw the connection close, cannot tell
    /// this from `commit_then_drop`.
    pub drop: f64,
    /// Read the whole request, then never answer (the connection stays open). Nothing is
    /// created: to the client this looks like `commit_then_hang`.
    pub hang: f64,
    /// Answer a lookup request `throttle_status` with `Retry-After` (`retry_after`), without
    /// reading any record.
    pub lookup_throttle: f64,
    /// Status of `error` and `commit_then_error` (5xx).
    pub error_status: u16,
    /// Status of `throttle` and `lookup_throttle`: 429 or 503.
    pub throttle_status: u16,
    /// Status of `reject` (4xx).
    pub reject_status: u16,
    /// `Retry-After` sent with `throttle` and `lookup_throttle`, rounded up to whole seconds.
    #[serde(with = "humantime_serde")]
    pub retry_after: Duration,
    /// Processing time of every create and lookup request.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// Extra processing time, uniform in `[0, latency_jitter]`, drawn from the seed.
    #[serde(with = "humantime_serde")]
    pub latency_jitter: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            refuse: 0.0,
            commit_then_drop: 0.0,
            commit_then_hang: 0.0,
            commit_then_error: 0.0,
            error: 0.0,
            throttle: 0.0,
            reject: 0.0,
            drop: 0.0,
            hang: 0.0,
            lookup_throttle: 0.0,
            error_status: 500,
            throttle_status: 429,
            reject_status: 422,
            retry_after: Duration::from_secs(1),
            latency: Duration::ZERO,
            latency_jitter: Duration::ZERO,
        }
    }
}

impl Faults {
    /// Checks probabilities and statuses; errors name the field.
    pub fn validate(&self) -> Result<()> {
        // Per connection and per lookup: apart from the per-create faults, which follow.
        let apart = 2;
        let probabilities = [
            ("faults.refuse", self.refuse),
            ("faults.lookup_throttle", self.lookup_throttle),
            ("faults.commit_then_drop", self.commit_then_drop),
            ("faults.commit_then_hang", self.commit_then_hang),
            ("faults.commit_then_error", self.commit_then_error),
            ("faults.error", self.error),
            ("faults.throttle", self.throttle),
            ("faults.reject", self.reject),
            ("faults.drop", self.drop),
            ("faults.hang", self.hang),
        ];
        for (field, p) in probabilities {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::config(
                    field,
                    format!("{p} is not a probability in [0, 1]"),
                ));
            }
        }
        let per_request: f64 = probabilities[apart..].iter().map(|(_, p)| p).sum();
        if per_request > 1.0 + 1e-9 {
            return Err(Error::config(
                "faults",
                format!("the per-request fault probabilities add up to {per_request}, more than 1"),
            ));
        }
        if !(500..=599).contains(&self.error_status) {
            return Err(Error::config("faults.error_status", "must be a 5xx status"));
        }
        if !matches!(self.throttle_status, 429 | 503) {
            return Err(Error::config(
                "faults.throttle_status",
                "must be 429 or 503",
            ));
        }
        if !(400..=499).contains(&self.reject_status) {
            return Err(Error::config(
                "faults.reject_status",
                "must be a 4xx status",
            ));
        }
        Ok(())
    }
}

impl SimConfig {
    /// Checks the whole configuration; errors name the field.
    pub fn validate(&self) -> Result<()> {
        for (field, path) in [
            ("create_path", &self.create_path),
            ("lookup_path", &self.lookup_path),
            ("stats_path", &self.stats_path),
        ] {
            if !path.starts_with('/') || path.contains('?') {
                return Err(Error::config(
                    field,
                    "must start with `/` and have no query",
                ));
            }
        }
        if self.stats_path == self.create_path || self.stats_path == self.lookup_path {
            return Err(Error::config(
                "stats_path",
                "must differ from the create and lookup paths",
            ));
        }
        if self.identity_field.is_empty() {
            return Err(Error::config("identity_field", "must not be empty"));
        }
        if let Some(name) = &self.idempotency_header {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(Error::config(
                    "idempotency_header",
                    "is not a valid header name",
                ));
            }
        }
        if let Some(h) = &self.require_header {
            if http::HeaderName::from_bytes(h.name.as_bytes()).is_err() {
                return Err(Error::config(
                    "require_header.name",
                    "is not a valid header name",
                ));
            }
        }
        if self.max_body_bytes == 0 {
            return Err(Error::config("max_body_bytes", "must be at least 1"));
        }
        validate_page_size(self.lookup_page_size)?;
        self.faults.validate()
    }
}

/// Checks a lookup page size (at start and when changed at run time); errors name the field.
pub(crate) fn validate_page_size(size: Option<usize>) -> Result<()> {
    if size == Some(0) {
        return Err(Error::config("lookup_page_size", "must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outage_faults_and_paging_are_read_by_their_names() {
        let config: SimConfig = toml::from_str(
            r#"
            lookup_page_size = 50
            lookup_paging = "link"
            [faults]
            drop = 0.1
            hang = 0.05
            "#,
        )
        .unwrap();
        assert_eq!(config.lookup_page_size, Some(50));
        assert_eq!(config.lookup_paging, LookupPaging::Link);
        assert_eq!((config.faults.drop, config.faults.hang), (0.1, 0.05));
        config.validate().unwrap();
        for (text, style) in [
            ("body", LookupPaging::Body),
            ("link", LookupPaging::Link),
            ("offset", LookupPaging::Offset),
        ] {
            let config: SimConfig = toml::from_str(&format!("lookup_paging = \"{text}\"")).unwrap();
            assert_eq!(config.lookup_paging, style);
        }
        assert!(toml::from_str::<SimConfig>("lookup_paging = \"cursor\"").is_err());
        let defaults: SimConfig = toml::from_str("").unwrap();
        assert_eq!(
            (defaults.lookup_page_size, defaults.lookup_paging),
            (None, LookupPaging::Body)
        );
        let written = toml::to_string(&config).unwrap();
        assert_eq!(toml::from_str::<SimConfig>(&written).unwrap(), config);
    }

    /// The example file is valid, and so are the settings it shows commented out.
    #[test]
    fn the_example_file_reads_with_its_commented_paging_too() {
        let text = include_str!("../../../schemas/sim-remote.example.toml");
        let example: SimConfig = toml::from_str(text).unwrap();
        example.validate().unwrap();
        assert_eq!(example.lookup_page_size, None);
        let paged = text
            .replace("# lookup_page_size =", "lookup_page_size =")
            .replace("# lookup_paging =", "lookup_paging =");
        let paged: SimConfig = toml::from_str(&paged).unwrap();
        paged.validate().unwrap();
        assert_eq!(
            (paged.lookup_page_size, paged.lookup_paging),
            (Some(50), LookupPaging::Body)
        );
    }

    #[test]
    fn errors_name_the_new_fields() {
        let error = |config: SimConfig| config.validate().unwrap_err().to_string();
        let faults = |faults: Faults| SimConfig {
            faults,
            ..SimConfig::default()
        };
        assert_eq!(
            error(faults(Faults {
                drop: 1.5,
                ..Faults::default()
            })),
            "faults.drop: 1.5 is not a probability in [0, 1]"
        );
        assert_eq!(
            error(faults(Faults {
                hang: -0.1,
                ..Faults::default()
            })),
            "faults.hang: -0.1 is not a probability in [0, 1]"
        );
        // Summed with the other per-request faults; `refuse` (per connection) and
        // `lookup_throttle` (per lookup) are apart.
        let too_many = error(faults(Faults {
            error: 0.4,
            drop: 0.4,
            hang: 0.4,
            ..Faults::default()
        }));
        assert!(
            too_many.starts_with("faults: the per-request fault probabilities add up to 1.2"),
            "{too_many}"
        );
        assert_eq!(
            error(faults(Faults {
                lookup_throttle: 2.0,
                ..Faults::default()
            })),
            "faults.lookup_throttle: 2 is not a probability in [0, 1]"
        );
        faults(Faults {
            refuse: 1.0,
            lookup_throttle: 1.0,
            error: 0.2,
            drop: 0.4,
            hang: 0.4,
            ..Faults::default()
        })
        .validate()
        .unwrap();
        assert_eq!(
            error(SimConfig {
                lookup_page_size: Some(0),
                ..SimConfig::default()
            }),
            "lookup_page_size: must be at least 1"
        );
    }
}
