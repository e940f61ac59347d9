//! What an answer proves (`docs/classification.md`), as one pure function.

use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, StatusCode};
use sendledger_core::decide::AttemptOutcome;
use sendledger_core::saga::Answer;
use sendledger_core::{NotSentCause, UnknownCause};
use serde_json::Value;

use crate::config::{ConflictPolicy, ServerErrorPolicy};

/// Longest `detail` kept from a rejecting answer.
const MAX_DETAIL_CHARS: usize = 512;

/// Longest `Retry-After` honoured unless the target's `retry.max_backoff` is longer: a remote
/// cannot park a task for longer than this per attempt.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The per-target rules that classification needs.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub id_pointer: String,
    /// The fields of a 2xx answer that later steps of a multi-step task read (JSON pointers;
    /// set by [`crate::Targets::with_sagas`]).
    pub answer_fields: Vec<String>,
    pub on_5xx: ServerErrorPolicy,
    pub on_409: ConflictPolicy,
    /// Longest `Retry-After` honoured; longer ones are cut to it.
    pub max_retry_after: Duration,
}

/// Classifies an answer. `body` is the response body or why it could not be read; `now` is
/// used for a `Retry-After` given as a date. `Retry-After` is cut to `rules.max_retry_after`.
///
/// - 2xx: `Succeeded`, the id read at the id pointer (a string, or a number printed). A 2xx is
///   proof that the remote acted even when the id is missing or the body unreadable; then the
///   id is empty (the caller logs it) rather than turning a proven success into an unknown
///   outcome that could be resent.
/// - 429, and 503 with a usable `Retry-After`: `NotSent{Throttled}`.
/// - 408: `Unknown{Status}`; 409: `Rejected`, or `Unknown{Status}` when set to reconcile, or
///   `Succeeded` (the id from the answer when it has one) when set to succeeded; other
///   4xx: `Rejected` with the body (truncated) as detail.
/// - other 5xx: `Unknown{Status}`, or `NotSent{ServerError}` when the target says a 5xx
///   performs nothing (with `Retry-After` when given).
/// - 1xx and 3xx (redirects are not followed): `Unknown{Status}`.
pub(crate) fn classify(
    rules: &Rules,
    status: StatusCode,
    headers: &HeaderMap,
    body: &Result<bytes::Bytes, String>,
    now: SystemTime,
) -> AttemptOutcome {
    let code = status.as_u16();
    let already_done = code == 409 && rules.on_409 == ConflictPolicy::Succeeded;
    if status.is_success() || already_done {
        let doc = (body.as_ref().ok()).and_then(|b| serde_json::from_slice::<Value>(b).ok());
        let remote_id = (doc.as_ref())
            .and_then(|v| v.pointer(&rules.id_pointer).and_then(id_text))
            .unwrap_or_default();
        let answer = doc.map_or_else(Answer::new, |doc| answer(&doc, &rules.answer_fields));
        return AttemptOutcome::Succeeded {
            remote_id,
            status: code,
            answer,
        };
    }
    let retry_after_ms = retry_after(headers, now).map(|d| {
        let capped = d.min(rules.max_retry_after);
        u64::try_from(capped.as_millis()).unwrap_or(u64::MAX)
    });
    match code {
        429 => AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: code },
            retry_after_ms,
        },
        503 if retry_after_ms.is_some() => AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: code },
            retry_after_ms,
        },
        408 => AttemptOutcome::Unknown {
            cause: UnknownCause::Status(code),
        },
        409 if rules.on_409 == ConflictPolicy::Reconcile => AttemptOutcome::Unknown {
            cause: UnknownCause::Status(code),
        },
        400..=499 => AttemptOutcome::Rejected {
            status: code,
            detail: detail(status, body),
        },
        500..=599 => match rules.on_5xx {
            ServerErrorPolicy::Unknown => AttemptOutcome::Unknown {
                cause: UnknownCause::Status(code),
            },
            ServerErrorPolicy::NotSent => AttemptOutcome::NotSent {
                cause: NotSentCause::ServerError { status: code },
                retry_after_ms,
            },
        },
        _ => AttemptOutcome::Unknown {
            cause: UnknownCause::Status(code),
        },
    }
}

/// The values at `fields` (JSON pointers) of a record: strings as they are, numbers and
/// booleans as their JSON text. A field that is absent, null, an object or an array is left
/// out; a template that reads it fails with a message naming it.
pub(crate) fn answer(record: &Value, fields: &[String]) -> Answer {
    let mut answer = Answer::new();
    for pointer in fields {
        let value = match record.pointer(pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            _ => continue,
        };
        answer.insert(pointer.clone(), value);
    }
    answer
}

/// An id as text: strings as they are, numbers printed.
pub(crate) fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `Retry-After` as delay-seconds (saturating: more digits than fit are the longest delay) or
/// an HTTP date (a past date is no delay).
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The body of a rejecting answer, shortened, or the status's reason.
fn detail(status: StatusCode, body: &Result<bytes::Bytes, String>) -> String {
    let text = match body {
        Ok(b) => String::from_utf8_lossy(b).trim().to_string(),
        Err(_) => String::new(),
    };
    if text.is_empty() {
        return status
            .canonical_reason()
            .unwrap_or("no detail given")
            .to_string();
    }
    match text.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rules() -> Rules {
        Rules {
            id_pointer: "/data/id".into(),
            answer_fields: Vec::new(),
            on_5xx: ServerErrorPolicy::Unknown,
            on_409: ConflictPolicy::Reject,
            max_retry_after: MAX_RETRY_AFTER,
        }
    }

    /// The fields later steps read are kept from a 2xx answer: scalars as text, anything
    /// else left out.
    #[test]
    fn success_keeps_the_answer_fields_later_steps_read() {
        let mut r = rules();
        r.answer_fields = ["/data/id", "/data/n", "/data/ok", "/data/obj", "/missing"]
            .map(String::from)
            .to_vec();
        let AttemptOutcome::Succeeded { answer, .. } = run(
            &r,
            201,
            None,
            r#"{"data":{"id":"p-1","n":7,"ok":true,"obj":{"a":1}}}"#,
        ) else {
            panic!("a success")
        };
        let kept: Vec<(&str, &str)> = answer
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            kept,
            [("/data/id", "p-1"), ("/data/n", "7"), ("/data/ok", "true")]
        );
    }

    fn headers(retry_after: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = retry_after {
            h.insert(header::RETRY_AFTER, v.parse().unwrap());
        }
        h
    }

    fn run(rules: &Rules, code: u16, ra: Option<&str>, body: &str) -> AttemptOutcome {
        classify(
            rules,
            StatusCode::from_u16(code).unwrap(),
            &headers(ra),
            &Ok(Bytes::from(body.to_string())),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        )
    }

    #[test]
    fn success_reads_the_id_and_survives_a_missing_one() {
        let r = rules();
        assert_eq!(
            run(&r, 201, None, r#"{"data":{"id":"p-1"}}"#),
            AttemptOutcome::Succeeded {
                remote_id: "p-1".into(),
                status: 201,
                answer: Answer::new()
            }
        );
        assert_eq!(
            run(&r, 200, None, r#"{"data":{"id":42}}"#),
            AttemptOutcome::Succeeded {
                remote_id: "42".into(),
                status: 200,
                answer: Answer::new()
            }
        );
        assert_eq!(
            run(&r, 204, None, ""),
            AttemptOutcome::Succeeded {
                remote_id: String::new(),
                status: 204,
                answer: Answer::new()
            }
        );
    }

    #[test]
    fn status_table() {
        let r = rules();
        let unknown = |s| AttemptOutcome::Unknown {
            cause: UnknownCause::Status(s),
        };
        assert_eq!(run(&r, 408, None, ""), unknown(408));
        assert_eq!(run(&r, 500, None, ""), unknown(500));
        assert_eq!(run(&r, 503, None, ""), unknown(503));
        assert_eq!(run(&r, 503, Some("soon"), ""), unknown(503));
        assert_eq!(run(&r, 302, None, ""), unknown(302));
        assert_eq!(
            run(&r, 503, Some("3"), ""),
            AttemptOutcome::NotSent {
                cause: NotSentCause::Throttled { status: 503 },
                retry_after_ms: Some(3000)
            }
        );
        assert_eq!(
            run(&r, 429, None, ""),
            AttemptOutcome::NotSent {
                cause: NotSentCause::Throttled { status: 429 },
                retry_after_ms: None
            }
        );
        assert_eq!(
            run(&r, 409, None, "exists"),
            AttemptOutcome::Rejected {
                status: 409,
                detail: "exists".into()
            }
        );
        assert_eq!(
            run(&r, 404, None, ""),
            AttemptOutcome::Rejected {
                status: 404,
                detail: "Not Found".into()
            }
        );
        let r2 = Rules {
            on_5xx: ServerErrorPolicy::NotSent,
            on_409: ConflictPolicy::Reconcile,
            ..rules()
        };
        assert_eq!(run(&r2, 409, None, ""), unknown(409));
        let r3 = Rules {
            on_409: ConflictPolicy::Succeeded,
            ..rules()
        };
        assert_eq!(
            run(&r3, 409, None, r#"{"data":{"id":"ex-1"}}"#),
            AttemptOutcome::Succeeded {
                remote_id: "ex-1".into(),
                status: 409,
                answer: Answer::new()
            }
        );
        assert_eq!(
            run(&r2, 502, Some("1"), ""),
            AttemptOutcome::NotSent {
                cause: NotSentCause::ServerError { status: 502 },
                retry_after_ms: Some(1000)
            }
        );
    }

    #[test]
    fn retry_after_dates_and_long_details() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            retry_after(&headers(Some(&later)), now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(
            retry_after(&headers(Some(&earlier)), now),
            Some(Duration::ZERO)
        );
        let long = "é".repeat(2_000);
        match run(&rules(), 422, None, &long) {
            AttemptOutcome::Rejected { detail, .. } => {
                assert_eq!(detail.chars().count(), MAX_DETAIL_CHARS + 1)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retry_after_is_capped_without_overflow() {
        let capped = AttemptOutcome::NotSent {
            cause: NotSentCause::Throttled { status: 429 },
            retry_after_ms: Some(3_600_000),
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let far_future = httpdate::fmt_http_date(now + Duration::from_secs(50 * 365 * 86_400));
        for ra in [
            "18446744073709551615",
            "99999999999999999999999",
            far_future.as_str(),
        ] {
            assert_eq!(run(&rules(), 429, Some(ra), ""), capped, "{ra}");
        }
        let longer = Rules {
            max_retry_after: Duration::from_secs(7_200),
            ..rules()
        };
        assert_eq!(
            run(&longer, 503, Some("18446744073709551615"), ""),
            AttemptOutcome::NotSent {
                cause: NotSentCause::Throttled { status: 503 },
                retry_after_ms: Some(7_200_000)
            }
        );
        // Under the cap: honoured as given.
        assert_eq!(
            run(&rules(), 429, Some("90"), ""),
            AttemptOutcome::NotSent {
                cause: NotSentCause::Throttled { status: 429 },
                retry_after_ms: Some(90_000)
            }
        );
    }
}
