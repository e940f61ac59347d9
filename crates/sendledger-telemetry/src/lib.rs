//! sendledger's traces: each step of a task (accept, attempt, lookup, publish) is a `tracing`
//! span, parented on the task's W3C trace context ([`TraceParent`], stored with the accepted
//! request, see `sendledger_core::trace`).
//!
//! Spans are plain `tracing` spans: without an exporter they cost what any span costs and
//! [`join`] does nothing, so the libraries make them unconditionally. The exporter (OTLP over
//! HTTP) lives in `sendledger-node`, whose service alone installs it: this crate names no HTTP
//! client, so the engine and the Kafka crate build without one.
//!
//! What a span carries: the task id, the target, the attempt number, outcomes and counts.
//! Never a payload, a header value or a remote's answer.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use sendledger_core::TraceParent;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of the task's trace context, if the task has one. Does nothing when no
/// exporter is installed.
pub fn join(span: &tracing::Span, trace: Option<TraceParent>) {
    let Some(trace) = trace else {
        return;
    };
    let parent = Context::new().with_remote_span_context(span_context(&trace));
    // Fails only when the span was already started, which callers never do.
    if let Err(e) = span.set_parent(parent) {
        tracing::debug!(error = %e, "a span could not join its task's trace");
    }
}

/// The trace context to pass on from within `span` (to a remote, say): the span itself when
/// spans are exported, else the task's own context, so that a downstream service still joins
/// the request's trace when this process exports nothing.
pub fn pass_on(span: &tracing::Span, trace: Option<TraceParent>) -> Option<TraceParent> {
    let cx = span.context();
    let own = cx.span().span_context().clone();
    if !own.is_valid() {
        return trace;
    }
    Some(TraceParent {
        trace_id: own.trace_id().to_bytes(),
        parent_id: own.span_id().to_bytes(),
        flags: own.trace_flags().to_u8(),
    })
}

fn span_context(trace: &TraceParent) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(trace.trace_id),
        SpanId::from_bytes(trace.parent_id),
        TraceFlags::new(trace.flags),
        true,
        TraceState::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_the_task_context_is_passed_on_as_it_is() {
        let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let span = tracing::info_span!("sendledger.test");
        join(&span, tp);
        assert_eq!(pass_on(&span, tp), tp);
        assert_eq!(pass_on(&span, None), None);
    }
}
