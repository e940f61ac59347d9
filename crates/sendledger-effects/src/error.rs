use std::time::Duration;

/// What can go wrong loading a target or performing a lookup. Attempts never fail with an
/// error: every attempt ends in exactly one [`sendledger_core::decide::AttemptOutcome`].
///
/// No variant ever contains a configured header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A configuration field is invalid. `field` is the full path, e.g.
    /// `targets.payments.lookup.url`.
    #[error("{field}: {reason}")]
    Config { field: String, reason: String },
    /// The request lacks a value that a URL template or a filter needs.
    #[error("cannot build the request for target {target}: {reason}")]
    Render { target: String, reason: String },
    /// The lookup request got no answer (connect failure, timeout, broken connection).
    #[error("lookup on target {target} failed: {reason}; the remote will be asked again")]
    LookupTransport { target: String, reason: String },
    /// The lookup was answered with a non-2xx status.
    #[error("lookup on target {target} answered {status}: {detail}")]
    LookupStatus {
        target: String,
        status: u16,
        detail: String,
    },
    /// The lookup was answered 429, or 503 with `Retry-After`: the remote asks to be left
    /// alone for `retry_after` (none given: as long as the caller's backoff says). The
    /// target's next lookups are not sent before it has passed.
    #[error(
        "lookup on target {target} answered {status}: throttled, {}: {detail}",
        after(retry_after)
    )]
    LookupThrottled {
        target: String,
        status: u16,
        retry_after: Option<Duration>,
        detail: String,
    },
    /// The lookup was not sent: it found no room within the target's `request_timeout` (no
    /// free slot of `max_in_flight`, no turn of `rate_limit`, or the remote's `Retry-After`
    /// ends later).
    #[error("lookup on target {target} not sent: {reason}; the remote will be asked again")]
    LookupNotSent { target: String, reason: String },
    /// The lookup answer does not have the configured shape.
    #[error("lookup answer of target {target} is unusable: {reason}; check `lookup.results_pointer`, `lookup.id_pointer` and the filters")]
    LookupAnswer { target: String, reason: String },
    /// A page of a paged lookup failed as `error` says; `page` counts the pages in the order
    /// they were read, from 1. The pages read before it are no evidence either: a record on
    /// this one could be the task's own or its duplicate.
    #[error("{error} (at page {page})")]
    LookupPage { page: u32, error: Box<Error> },
    /// A paged lookup cannot go past page `page`: the answer goes on past
    /// `lookup.paging.max_pages`, or its next page's URL cannot be used (not a URL, or on
    /// another scheme, host or port, where the target's headers must not go).
    #[error("lookup on target {target} cannot read past page {page}: {reason}; the pages read are no evidence either way")]
    LookupPaging {
        target: String,
        page: u32,
        reason: String,
    },
}

impl Error {
    /// Whether the same call may succeed later with nothing changed: a lookup (or a page of
    /// it) that got no answer, was answered 408, 429 or 5xx, or was not sent for want of
    /// room at the target. A configuration or request
    /// that cannot be built, any other refusal, an answer of the wrong shape and pages that
    /// cannot be followed fail the same way again.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::LookupTransport { .. }
            | Error::LookupThrottled { .. }
            | Error::LookupNotSent { .. } => true,
            Error::LookupStatus { status, .. } => matches!(status, 408 | 429 | 500..=599),
            Error::LookupPage { error, .. } => error.is_transient(),
            Error::Config { .. }
            | Error::Render { .. }
            | Error::LookupAnswer { .. }
            | Error::LookupPaging { .. } => false,
        }
    }

    /// How long the remote asked to be left alone (`Retry-After` of a throttled lookup, or of
    /// the page of it that was throttled).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::LookupThrottled { retry_after, .. } => *retry_after,
            Error::LookupPage { error, .. } => error.retry_after(),
            _ => None,
        }
    }

    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `d` without its part below a millisecond, for messages.
pub(crate) fn whole_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a throttled lookup's delay reads in its message.
fn after(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(
            "retry after {}",
            humantime::format_duration(whole_millis(*d))
        ),
        None => "no retry-after given".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_without_an_answer_or_answered_5xx_may_pass() {
        let status = |status| Error::LookupStatus {
            target: "t".into(),
            status,
            detail: String::new(),
        };
        assert!(status(503).is_transient());
        assert!(status(429).is_transient());
        assert!(!status(404).is_transient());
        assert!(!status(401).is_transient());
        let transport = Error::LookupTransport {
            target: "t".into(),
            reason: "connection refused".into(),
        };
        assert!(transport.is_transient());
        let shape = Error::LookupAnswer {
            target: "t".into(),
            reason: "no array at /data".into(),
        };
        assert!(!shape.is_transient());
        assert!(!Error::config("targets.t.lookup", "is not configured").is_transient());
        // A page of a paged lookup fails as its error says; pages that cannot be followed
        // fail the same way again.
        let page = |error| Error::LookupPage {
            page: 2,
            error: Box::new(error),
        };
        assert!(page(status(503)).is_transient());
        assert!(!page(status(404)).is_transient());
        // Throttled, or not sent for want of room: asking later may answer.
        let throttled = Error::LookupThrottled {
            target: "t".into(),
            status: 429,
            retry_after: Some(Duration::from_secs(2)),
            detail: String::new(),
        };
        assert!(throttled.is_transient());
        assert_eq!(
            page(throttled.clone()).retry_after(),
            Some(Duration::from_secs(2))
        );
        assert!(
            throttled.to_string().contains("retry after 2s"),
            "{throttled}"
        );
        let not_sent = Error::LookupNotSent {
            target: "t".into(),
            reason: "no free slot".into(),
        };
        assert!(not_sent.is_transient());
        assert_eq!(not_sent.retry_after(), None);
        let cap = Error::LookupPaging {
            target: "t".into(),
            page: 10,
            reason: "the answer has more pages".into(),
        };
        assert!(!cap.is_transient());
    }
}
