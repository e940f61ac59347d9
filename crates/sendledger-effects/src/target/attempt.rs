//! One attempt and its classification: the request built from the task, sent once, and what
//! its ending proves (`docs/classification.md`). Whether any request byte was written is
//! observed by `conn.rs`; what an answer proves is `classify.rs`'s pure function.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::HeaderValue;
use http::Request;
use http_body_util::Full;
use sendledger_core::decide::{AttemptOutcome, Sending};
use sendledger_core::saga::Call;
use sendledger_core::{NotSentCause, TraceParent, UnknownCause};
use tracing::{debug, info, warn};

use super::Target;
use crate::classify;
use crate::conn::{Answer, Endpoint, Failure, Opened};
use crate::limit::SendSlot;
use crate::template;

impl Target {
    /// Performs one attempt and classifies it by what it proves (`docs/classification.md`). Never fails:
    /// every ending is one [`AttemptOutcome`].
    ///
    /// - Nothing written to the socket (DNS, connect refused or timed out, a connection that
    ///   failed before the first byte): `NotSent{Connect}`.
    /// - Written, then no answer within `request_timeout`: `Unknown{Timeout}`; written, then the
    ///   connection failed: `Unknown{ResetAfterWrite}`.
    /// - An answer: by status (see the crate documentation).
    /// - The request cannot be built from this task (a template field missing from the
    ///   payload): `Rejected{status: 0}`: nothing was sent and resending cannot help.
    ///
    /// `idempotency_key` is sent in the configured header when the target has one. The caller
    /// must have made the attempt's intent durable before calling. Dropping the future may
    /// leave the request written or not: treat that as unknown.
    pub async fn execute<'a>(
        &self,
        request: impl Into<Call<'a>>,
        attempt: u32,
        idempotency_key: Option<&str>,
    ) -> AttemptOutcome {
        self.execute_with(request, attempt, idempotency_key, Sending::default())
            .await
    }

    /// [`Target::execute`], sent as `sending` says: with a trace context, or within a
    /// first-byte deadline. A deadline that passes before the request's first byte was written
    /// ends the attempt `NotSent{LocalResources}`: nothing was sent, and it was this process's
    /// delay, not the remote's doing.
    pub async fn execute_with<'a>(
        &self,
        request: impl Into<Call<'a>>,
        attempt: u32,
        idempotency_key: Option<&str>,
        sending: Sending,
    ) -> AttemptOutcome {
        self.send(
            request.into(),
            attempt,
            idempotency_key,
            sending,
            None,
            None,
        )
        .await
    }

    /// [`Target::execute_with`] in the room `slot` reserved for it ([`Target::reserve`]): on
    /// the connection opened before the intent, its outcome reported to the target's breaker.
    pub async fn execute_reserved<'a>(
        &self,
        request: impl Into<Call<'a>>,
        attempt: u32,
        idempotency_key: Option<&str>,
        sending: Sending,
        mut slot: SendSlot,
    ) -> AttemptOutcome {
        let conn = slot.conn.take();
        let endpoint = slot.endpoint.take();
        if let Some(ticket) = &slot.ticket {
            ticket.start();
        }
        let outcome = self
            .send(
                request.into(),
                attempt,
                idempotency_key,
                sending,
                conn,
                endpoint.as_ref(),
            )
            .await;
        slot.finish(&outcome);
        outcome
    }

    async fn send(
        &self,
        call: Call<'_>,
        attempt: u32,
        idempotency_key: Option<&str>,
        sending: Sending,
        conn: Option<Opened>,
        endpoint: Option<&Endpoint>,
    ) -> AttemptOutcome {
        let task_id = call.request.task_id();
        let built = match self.build_attempt(call, idempotency_key, sending.trace) {
            Ok(built) => built,
            Err(reason) => {
                warn!(target_name = %self.name, %task_id, attempt, %reason, "attempt cannot be built; rejected without sending");
                return AttemptOutcome::Rejected {
                    status: 0,
                    detail: self.scrub(format!(
                        "request cannot be built for target {}: {reason}",
                        self.name
                    )),
                };
            }
        };
        let exchange = self.pool.exchange_on(
            endpoint.unwrap_or(&self.endpoint),
            conn,
            built,
            sending.first_byte_by,
        );
        let outcome = match exchange.await {
            Ok(answer) => self.classify(answer),
            Err(Failure::NotWritten(reason)) => AttemptOutcome::NotSent {
                cause: NotSentCause::Connect(self.scrub(reason)),
                retry_after_ms: None,
            },
            Err(Failure::Local(reason)) => AttemptOutcome::NotSent {
                cause: NotSentCause::LocalResources(self.scrub(reason)),
                retry_after_ms: None,
            },
            Err(Failure::Late { by }) => {
                warn!(target_name = %self.name, %task_id, attempt, late_ms = by.as_millis() as u64, "send deadline passed before the request could be written; not sent");
                AttemptOutcome::NotSent {
                    cause: NotSentCause::LocalResources(format!(
                        "send lease expired {} before the first request byte; nothing was written",
                        humantime::format_duration(Duration::from_millis(by.as_millis() as u64))
                    )),
                    retry_after_ms: None,
                }
            }
            Err(Failure::TimedOut) => AttemptOutcome::Unknown {
                cause: UnknownCause::Timeout,
            },
            Err(Failure::Broken(reason)) => AttemptOutcome::Unknown {
                cause: UnknownCause::ResetAfterWrite(self.scrub(reason)),
            },
        };
        match &outcome {
            AttemptOutcome::Unknown { cause } => {
                info!(target_name = %self.name, %task_id, attempt, ?cause, "attempt outcome unknown; to be reconciled")
            }
            AttemptOutcome::Succeeded {
                remote_id, status, ..
            } if remote_id.is_empty() => {
                warn!(target_name = %self.name, %task_id, attempt, status, pointer = %self.rules.id_pointer, "attempt succeeded but the answer has no remote id")
            }
            other => {
                debug!(target_name = %self.name, %task_id, attempt, outcome = ?other, "attempt classified")
            }
        }
        outcome
    }

    fn classify(&self, answer: Answer) -> AttemptOutcome {
        let outcome = classify::classify(
            &self.rules,
            answer.status,
            &answer.headers,
            &answer.body,
            SystemTime::now(),
        );
        match outcome {
            AttemptOutcome::Rejected { status, detail } => AttemptOutcome::Rejected {
                status,
                detail: self.scrub(detail),
            },
            other => other,
        }
    }

    fn build_attempt(
        &self,
        call: Call<'_>,
        idempotency_key: Option<&str>,
        trace: Option<TraceParent>,
    ) -> std::result::Result<Request<Full<Bytes>>, String> {
        let templates = self.body_fields.iter().map(|(_, template)| template);
        let request = call.request;
        let payload = template::payload_for(request, std::iter::once(&self.url).chain(templates));
        let url = self.url.render_url(call, &payload)?;
        let body = if self.body_fields.is_empty() {
            Bytes::from(request.payload.clone())
        } else {
            let fields = self
                .body_fields
                .iter()
                .map(|(key, template)| Ok((key.as_str(), template.render_text(call, &payload)?)))
                .collect::<std::result::Result<Vec<_>, String>>()?;
            let body = request
                .payload_with_fields(fields)
                .ok_or("the payload is not a JSON object")?;
            Bytes::from(body)
        };
        let mut req = self
            .request(self.method.clone(), &url, &self.endpoint, body)
            .map_err(|e| e.to_string())?;
        if let (Some((header_name, _, _)), Some(key)) = (&self.idempotency, idempotency_key) {
            let value = HeaderValue::from_str(key)
                .map_err(|_| "the idempotency key is not a valid header value".to_string())?;
            req.headers_mut().insert(header_name.clone(), value);
        }
        self.propagate(&mut req, trace);
        Ok(req)
    }
}
