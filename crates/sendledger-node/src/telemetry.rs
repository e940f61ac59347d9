//! The OTLP trace exporter `run` installs: sendledger's spans (see `sendledger_telemetry`)
//! sent over OTLP/HTTP (protobuf) to a collector, when an endpoint is configured.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The `service.name` of the exported spans.
pub const SERVICE_NAME: &str = "sendledger";
/// The standard variable naming the collector's base URL (`/v1/traces` is appended).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The standard variable naming the traces URL itself (used as it is).
pub const OTLP_TRACES_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const TRACES_PATH: &str = "/v1/traces";

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("the OTLP trace exporter for {endpoint}: {reason}")]
pub struct Error {
    endpoint: String,
    reason: String,
}

/// The traces URL to export to: `configured` (the `[telemetry] otlp_endpoint` setting, a
/// base URL like the standard variable's), else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT`; `None` (no export) when none is set. `env` reads a variable.
pub fn traces_url(
    configured: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let set = |v: &String| !v.trim().is_empty();
    if let Some(base) = configured.map(str::to_owned).filter(set) {
        return Some(with_traces_path(&base));
    }
    if let Some(url) = env(OTLP_TRACES_ENDPOINT_ENV).filter(set) {
        return Some(url);
    }
    env(OTLP_ENDPOINT_ENV)
        .filter(set)
        .map(|b| with_traces_path(&b))
}

fn with_traces_path(base: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_string()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// The running exporter. Dropping it (or [`Exporter::shutdown`]) exports the spans still
/// buffered; call it outside an async runtime, as the process ends.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Exports what is buffered and stops.
    pub fn shutdown(self) {}
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "not every span could be exported at shutdown");
        }
    }
}

/// A layer exporting sendledger's spans (those of its own crates, with the log events inside
/// them) to `url` over OTLP/HTTP protobuf, in batches from a thread of its own. Must be built
/// outside an async runtime (its HTTP client is a blocking one).
pub fn otlp_layer<S>(url: &str) -> Result<(impl Layer<S> + Send + Sync, Exporter), Error>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .build()
        .map_err(|e| Error {
            endpoint: url.to_string(),
            reason: e.to_string(),
        })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder_empty()
                .with_service_name(SERVICE_NAME)
                .build(),
        )
        .build();
    let tracer = provider.tracer(SERVICE_NAME);
    // Only sendledger's own spans: not those of its libraries, nor (through them) of the
    // exporter's own HTTP client.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.target().starts_with("sendledger")
        }));
    Ok((layer, Exporter { provider }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_endpoint_wins_then_the_standard_variables() {
        let none = |_: &str| None;
        assert_eq!(traces_url(None, none), None);
        assert_eq!(traces_url(Some(" "), none), None);
        assert_eq!(
            traces_url(Some("http://c:4318/"), none).as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(
            traces_url(Some("http://c:4318/v1/traces"), none).as_deref(),
            Some("http://c:4318/v1/traces")
        );
        let base = |k: &str| (k == OTLP_ENDPOINT_ENV).then(|| "http://env:4318".to_string());
        assert_eq!(
            traces_url(None, base).as_deref(),
            Some("http://env:4318/v1/traces")
        );
        assert_eq!(
            traces_url(Some("http://c:1"), base).as_deref(),
            Some("http://c:1/v1/traces")
        );
        let both = |k: &str| match k {
            OTLP_TRACES_ENDPOINT_ENV => Some("http://t:1/custom".to_string()),
            _ => Some("http://env:4318".to_string()),
        };
        assert_eq!(traces_url(None, both).as_deref(), Some("http://t:1/custom"));
    }
}
