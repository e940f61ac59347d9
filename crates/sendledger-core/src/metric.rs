//! What a metric is, as the crates that record one define it: its name, kind, unit and help
//! text. Each crate lists the metrics it records in its own `metric_definitions` module (names
//! as constants, recorded through those constants only); the service describes them all to
//! its recorder, and the tests check that the operating guide lists every one. Plain data:
//! this crate records nothing.

/// What kind of value a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// The unit a metric's values are in, when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricUnit {
    Seconds,
    Bytes,
    Count,
}

/// One metric: its name (`sendledger_<thing>_<unit>`, `_total` for counters), kind, unit and
/// the `# HELP` text a scrape shows.
#[derive(Debug, Clone, Copy)]
pub struct MetricDefinition {
    pub name: &'static str,
    pub kind: MetricKind,
    pub unit: Option<MetricUnit>,
    pub help: &'static str,
}

impl MetricDefinition {
    pub const fn counter(name: &'static str, help: &'static str) -> MetricDefinition {
        MetricDefinition {
            name,
            kind: MetricKind::Counter,
            unit: None,
            help,
        }
    }

    pub const fn gauge(name: &'static str, help: &'static str) -> MetricDefinition {
        MetricDefinition {
            name,
            kind: MetricKind::Gauge,
            unit: None,
            help,
        }
    }

    pub const fn histogram(name: &'static str, help: &'static str) -> MetricDefinition {
        MetricDefinition {
            name,
            kind: MetricKind::Histogram,
            unit: None,
            help,
        }
    }

    /// The same metric, in `unit`.
    pub const fn in_unit(self, unit: MetricUnit) -> MetricDefinition {
        MetricDefinition {
            unit: Some(unit),
            ..self
        }
    }
}
