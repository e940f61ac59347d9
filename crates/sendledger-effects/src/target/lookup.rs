//! Lookups and evidence matching: [`Target::lookup`] asks the remote which records it holds
//! for a task (following the pages of its answer as `paging.rs` says), and `select` keeps
//! those that match the task (the filters, with numbers compared by exact value, and
//! `created_after_intent`). An error is no evidence either way.
//!
//! A lookup takes its room as an attempt does, from the target's limiter or from its own
//! (`lookup.limits`): a slot of `max_in_flight` held for all its pages, and a turn of
//! `rate_limit` for each page. A page answered 429, or 503 with `Retry-After`, holds the
//! target's next lookups until the delay has passed (waited for before the slot is taken). A
//! lookup waits for all of that (without holding a thread) at most the target's
//! `request_timeout` in all, then fails unsent: [`Error::LookupNotSent`], no evidence.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use sendledger_core::saga::{Answer, Call, Found};
use sendledger_core::TraceParent;
use serde_json::Value;
use tokio::time::Instant;
use tracing::{debug, info};

use super::paging::Page;
use super::{millis, Lookup, Target};
use crate::classify::{self, id_text};
use crate::config::TimeFormat;
use crate::conn::Failure;
use crate::error::{whole_millis, Error, Result};

impl Target {
    /// The URL a lookup of this task asks (the target's lookup template rendered for it), or
    /// why it cannot be built; `None` without a lookup. Nothing is sent.
    pub fn lookup_url<'a>(
        &self,
        call: impl Into<Call<'a>>,
    ) -> Option<std::result::Result<String, String>> {
        let lookup = self.lookup.as_ref()?;
        let call = call.into();
        let url = lookup
            .url
            .render_url(call, &call.request.payload_value())
            .map(|url| self.scrub(url.to_string()))
            .map_err(|reason| self.scrub(reason));
        Some(url)
    }

    /// Asks the remote which records match the task: the configured query (every page of its
    /// answer with `lookup.paging`), then the filters. `intent_at_ms` (milliseconds since the
    /// Unix epoch) is the time of the task's first intent, for the `created_after_intent`
    /// filter. Returns the matching remote ids, each once, in the remote's order. An error is
    /// no evidence either way; with paging, so is a page that cannot be read or an answer
    /// that goes on past `max_pages`, however many matches the pages before held.
    pub async fn lookup<'a>(
        &self,
        request: impl Into<Call<'a>>,
        intent_at_ms: Option<u64>,
    ) -> Result<Vec<String>> {
        self.lookup_traced(request, intent_at_ms, None).await
    }

    /// [`Target::lookup`], sending `trace` as the `traceparent` header when the target has
    /// `propagate_trace` set (never otherwise), as attempts do.
    ///
    /// The lookup first takes its room (see the module's documentation); when there is none
    /// within `request_timeout` it fails with [`Error::LookupNotSent`], nothing sent.
    pub async fn lookup_traced<'a>(
        &self,
        call: impl Into<Call<'a>>,
        intent_at_ms: Option<u64>,
        trace: Option<TraceParent>,
    ) -> Result<Vec<String>> {
        Ok(self.lookup_found(call, intent_at_ms, trace).await?.ids)
    }

    /// [`Target::lookup_traced`], with the fields later steps of a multi-step task read of the
    /// record found when exactly one matched ([`Found`]).
    pub async fn lookup_found<'a>(
        &self,
        call: impl Into<Call<'a>>,
        intent_at_ms: Option<u64>,
        trace: Option<TraceParent>,
    ) -> Result<Found> {
        let Some(lookup) = &self.lookup else {
            return Err(Error::config(
                format!("targets.{}.lookup", self.name),
                "is not configured; add a lookup to reconcile unknown outcomes",
            ));
        };
        let call = call.into();
        let payload = call.request.payload_value();
        let render_err = |reason: String| Error::Render {
            target: self.name.clone(),
            reason,
        };
        let url = lookup.url.render_url(call, &payload).map_err(render_err)?;
        let answer_err = |reason: String| self.unusable(reason);
        let by = Instant::now() + lookup.endpoint.request_timeout;
        // A throttled remote is waited for before the slot is taken: the wait holds no room
        // an attempt could use.
        self.retry_after_passed(lookup, by).await?;
        let _slot = tokio::time::timeout_at(by, lookup.limiter.slot())
            .await
            .map_err(|_| self.not_sent(lookup, "every slot of max_in_flight stayed taken"))?;
        let mut ids: Vec<String> = Vec::new();
        let mut first_answer = Answer::new();
        let mut next = Some(
            lookup
                .paging
                .as_ref()
                .map_or(url.clone(), |p| p.first(&url)),
        );
        let mut number = 0;
        // Every page is read, or the lookup fails: a record on a page not read could be the
        // task's own or its duplicate.
        while let Some(at) = next.take() {
            number += 1;
            let at_page = |error: Error| match lookup.paging {
                Some(_) => Error::LookupPage {
                    page: number,
                    error: Box::new(error),
                },
                None => error,
            };
            self.page_turn(lookup, by).await.map_err(at_page)?;
            let (doc, headers) = self
                .lookup_page(lookup, &at, trace)
                .await
                .map_err(at_page)?;
            let records = records(lookup, &doc).map_err(answer_err).map_err(at_page)?;
            let found = select(lookup, records, &payload, intent_at_ms)
                .map_err(answer_err)
                .map_err(at_page)?;
            for (id, record) in found {
                if !ids.contains(&id) {
                    if ids.is_empty() {
                        first_answer = classify::answer(record, &self.rules.answer_fields);
                    }
                    ids.push(id);
                }
            }
            if let Some(paging) = &lookup.paging {
                let page = Page {
                    number,
                    url: &at,
                    doc: &doc,
                    headers: &headers,
                    records: records.len(),
                };
                next = paging
                    .next(&url, &page)
                    .map_err(|reason| Error::LookupPaging {
                        target: self.name.clone(),
                        page: number,
                        reason: self.scrub(reason),
                    })?;
            }
        }
        debug!(target_name = %self.name, task_id = %call.request.task_id(), matches = ids.len(), pages = number, "lookup performed");
        if ids.len() != 1 {
            first_answer.clear();
        }
        Ok(Found {
            ids,
            answer: first_answer,
        })
    }

    /// Waits until a page may be asked: past the remote's `Retry-After` and at the rate's turn,
    /// by `by` at the latest; otherwise the lookup is not sent.
    async fn page_turn(&self, lookup: &Lookup, by: Instant) -> Result<()> {
        self.retry_after_passed(lookup, by).await?;
        if !lookup.limiter.turn(Some(by)).await {
            return Err(self.not_sent(lookup, "the next turn of rate_limit comes later"));
        }
        Ok(())
    }

    /// Waits until the `Retry-After` of the target's latest throttled lookup has passed, if it
    /// does by `by`; otherwise the lookup is not sent.
    async fn retry_after_passed(&self, lookup: &Lookup, by: Instant) -> Result<()> {
        let until = *lookup
            .throttled_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(until) = until.filter(|until| *until > Instant::now()) else {
            return Ok(());
        };
        if until > by {
            let left = until.saturating_duration_since(Instant::now());
            return Err(self.not_sent(
                lookup,
                &format!(
                    "the remote's Retry-After ends in {}",
                    humantime::format_duration(whole_millis(left))
                ),
            ));
        }
        tokio::time::sleep_until(until).await;
        Ok(())
    }

    /// A lookup not sent for want of room within its `request_timeout`, and why.
    fn not_sent(&self, lookup: &Lookup, why: &str) -> Error {
        Error::LookupNotSent {
            target: self.name.clone(),
            reason: format!(
                "no room for it within request_timeout ({}): {why}",
                humantime::format_duration(lookup.endpoint.request_timeout)
            ),
        }
    }

    /// One `GET` of a lookup: the answer's JSON and headers, or why there is none.
    async fn lookup_page(
        &self,
        lookup: &Lookup,
        url: &str,
        trace: Option<TraceParent>,
    ) -> Result<(Value, HeaderMap)> {
        let mut req = self.request(Method::GET, url, &lookup.endpoint, Bytes::new())?;
        req.headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        self.propagate(&mut req, trace);
        let answer = self
            .pool
            .exchange(&lookup.endpoint, req, None)
            .await
            .map_err(|failure| Error::LookupTransport {
                target: self.name.clone(),
                reason: self.scrub(match failure {
                    Failure::NotWritten(r) | Failure::Local(r) | Failure::Broken(r) => r,
                    Failure::TimedOut => "no answer within the request timeout".into(),
                    // Lookups are sent without a first-byte deadline.
                    Failure::Late { .. } => "not sent within its deadline".into(),
                }),
            })?;
        let answer_err = |reason: String| self.unusable(reason);
        let body = answer.body.map_err(answer_err)?;
        if !answer.status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let detail: String = text.trim().chars().take(512).collect();
            let detail = self.scrub(detail);
            let target = self.name.clone();
            let status = answer.status.as_u16();
            let retry_after = classify::retry_after(&answer.headers, SystemTime::now())
                .map(|d| d.min(self.rules.max_retry_after));
            if answer.status != StatusCode::TOO_MANY_REQUESTS
                && !(answer.status == StatusCode::SERVICE_UNAVAILABLE && retry_after.is_some())
            {
                return Err(Error::LookupStatus {
                    target,
                    status,
                    detail,
                });
            }
            if let Some(delay) = retry_after {
                let until = Instant::now() + delay;
                let mut held = lookup
                    .throttled_until
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                *held = Some(held.map_or(until, |held| held.max(until)));
                info!(target_name = %self.name, status, retry_after_ms = millis(delay), "lookup throttled: the target's next lookups wait");
            }
            return Err(Error::LookupThrottled {
                target,
                status,
                retry_after,
                detail,
            });
        }
        let doc: Value =
            serde_json::from_slice(&body).map_err(|e| answer_err(format!("not JSON: {e}")))?;
        Ok((doc, answer.headers))
    }

    /// A lookup answer (or page) that does not have the configured shape, and why, with the
    /// target's secrets removed from the remote's text.
    fn unusable(&self, reason: String) -> Error {
        Error::LookupAnswer {
            target: self.name.clone(),
            reason: self.scrub(reason),
        }
    }
}

/// JSON equality with numbers compared by exact value: number tokens are kept as written, so
/// a remote that stores `100.00` and answers `100.0` still matches (and no two different
/// numbers ever do, however long).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (exact_decimal(&x.to_string()), exact_decimal(&y.to_string())) {
                (Some(x), Some(y)) => x == y,
                _ => x == y,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// A JSON number as (negative, significant digits without leading or trailing zeros,
/// exponent): equal for equal values. Zero is `(false, "", 0)`.
fn exact_decimal(token: &str) -> Option<(bool, String, i64)> {
    let (mantissa, exponent) = match token.find(['e', 'E']) {
        Some(i) => (&token[..i], token[i + 1..].parse::<i64>().ok()?),
        None => (token, 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit())) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mut exponent = exponent.checked_sub(frac.len() as i64)?;
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    exponent = exponent.checked_add((digits.len() - trimmed.len()) as i64)?;
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, trimmed.to_string(), exponent))
}

/// The records of a lookup answer (or page), matching or not.
fn records<'a>(lookup: &Lookup, doc: &'a Value) -> std::result::Result<&'a [Value], String> {
    doc.pointer(&lookup.results_pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| format!("no array at `{}`", lookup.results_pointer))
}

/// The ids of the `records` that pass the filters, each once, with the first record of each.
fn select<'a>(
    lookup: &Lookup,
    records: &'a [Value],
    payload: &Value,
    intent_at_ms: Option<u64>,
) -> std::result::Result<Vec<(String, &'a Value)>, String> {
    let mut wanted = Vec::with_capacity(lookup.filters.len());
    for (record_pointer, payload_pointer) in &lookup.filters {
        let value = payload.pointer(payload_pointer).ok_or_else(|| {
            format!("the payload has no value at `{payload_pointer}` for a filter")
        })?;
        wanted.push((record_pointer.as_str(), value));
    }
    let mut ids: Vec<(String, &Value)> = Vec::new();
    for (i, record) in records.iter().enumerate() {
        if !wanted
            .iter()
            .all(|(p, v)| record.pointer(p).is_some_and(|r| same_value(r, v)))
        {
            continue;
        }
        if let (Some(c), Some(intent)) = (&lookup.created_after, intent_at_ms) {
            let at = record
                .pointer(&c.pointer)
                .and_then(|v| timestamp_ms(v, c.format))
                .ok_or_else(|| {
                    format!(
                        "record {i} has no readable creation time at `{}`",
                        c.pointer
                    )
                })?;
            if at.saturating_add(millis(c.skew)) < intent {
                continue;
            }
        }
        let id = record
            .pointer(&lookup.id_pointer)
            .and_then(id_text)
            .ok_or_else(|| format!("record {i} has no id at `{}`", lookup.id_pointer))?;
        if !ids.iter().any(|(seen, _)| *seen == id) {
            ids.push((id, record));
        }
    }
    Ok(ids)
}

fn timestamp_ms(v: &Value, format: TimeFormat) -> Option<u64> {
    match format {
        TimeFormat::UnixMillis => v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64)),
        TimeFormat::UnixSeconds => v.as_f64().map(|s| (s.max(0.0) * 1000.0) as u64),
        TimeFormat::Rfc3339 => humantime::parse_rfc3339_weak(v.as_str()?)
            .ok()?
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(millis),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn filters_compare_numbers_by_exact_value() {
        use super::same_value;
        let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert!(same_value(&v("100.00"), &v("100.0")));
        assert!(same_value(&v("1e2"), &v("100")));
        assert!(same_value(&v("-0"), &v("0.0")));
        assert!(same_value(&v("{\"a\": [1.50]}"), &v("{\"a\": [1.5]}")));
        assert!(!same_value(
            &v("12345678901234567890123"),
            &v("12345678901234567890124")
        ));
        assert!(!same_value(&v("100"), &v("\"100\"")));
        assert!(!same_value(&v("-1"), &v("1")));
    }
}
