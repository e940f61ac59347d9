//! Errors of the core crate: all of them are about bad input. [`Chain`] prints any error with
//! its causes.

/// A request or value that sendledger refuses, with the field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("field `{field}` must not be empty")]
    Empty { field: &'static str },
    #[error("field `{field}` is {len} bytes, more than the limit of {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("field `{field}` contains {ch:?} at byte {at}; allowed are ASCII letters, digits and `-_.:@/+=#`")]
    BadChar {
        field: &'static str,
        ch: char,
        at: usize,
    },
    #[error("payload is {len} bytes as canonical JSON, more than the limit of {max}")]
    PayloadTooLarge { len: usize, max: usize },
    #[error("payload must be a JSON object, found {found}")]
    PayloadNotObject { found: &'static str },
    #[error("the task is {phase}, not in manual review; only notes can be added")]
    NotInReview { phase: &'static str },
    #[error("the task is {phase} and cannot be retried: {why}")]
    NotRetryable {
        phase: &'static str,
        why: &'static str,
    },
    #[error("operator name `{by}` is reserved: names starting with `policy:` mark what a target's policy recorded; give a person's name")]
    ReservedOperator { by: String },
    /// The text quotes the input only through [`crate::sanitize_reason`].
    #[error("invalid request JSON: {0}")]
    Json(String),
    /// An operator's resolution that cannot be recorded as written (see
    /// [`crate::ResolveBody::resolution`]).
    #[error("{0}")]
    BadResolution(String),
    #[error("version {version} of this request was never accepted, and version {latest} of it was: a version below the latest one is only a redelivery of a version already accepted; send version {next} to run the request again")]
    StaleVersion {
        version: u32,
        latest: u32,
        next: u32,
    },
    #[error("`{address}` is not an identity address (tenant/operation/request_key): {problem}")]
    BadAddress { address: String, problem: String },
}

impl Error {
    /// The refusal of `version` of a request whose identity's latest accepted version is
    /// `latest` (not below it), naming the version to send instead.
    pub fn stale_version(version: u32, latest: u32) -> Error {
        Error::StaleVersion {
            version,
            latest,
            next: latest.saturating_add(1),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes on one line, `error: cause: cause`, the way the binary prints
/// errors. The `Display` of every sendledger error type shows its own level only (its cause is
/// its `source`), so a log field or a message built from an error goes through this.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("ledger")]
    struct Ledger(#[source] std::io::Error);

    #[test]
    fn a_chain_shows_each_level_once() {
        let e = Ledger(std::io::Error::other("no space left on device"));
        assert_eq!(e.to_string(), "ledger");
        assert_eq!(Chain(&e).to_string(), "ledger: no space left on device");
        let plain = Error::Json("expected value".into());
        assert_eq!(Chain(&plain).to_string(), plain.to_string());
    }
}
