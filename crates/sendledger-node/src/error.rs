//! The service's errors: a configuration it cannot use, and a step of starting, running or
//! stopping it that failed, each with its cause as its source. `Display` says what failed and
//! never prints the cause; print the chain (`sendledger_core::error::Chain`, or anyhow's `{:#}`)
//! to show both: `configuration sendledger.toml: engine.workers: is 0; use 1 to 256`.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Something the service could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A step of starting or stopping the service (`creating the topics`, `starting the
    /// engine on /var/lib/sendledger`, ...) failed for the reason in its source.
    #[error("{step}")]
    Step {
        step: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the admin endpoint needs the metrics recorder; install it first")]
    NoRecorder,
    #[error("binding the admin endpoint to {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("installing the metrics recorder (one per process)")]
    Recorder(#[source] metrics_exporter_prometheus::BuildError),
    /// An operating-system resource of the process: its runtime, a signal handler.
    #[error("{what}")]
    Process {
        what: &'static str,
        source: std::io::Error,
    },
    /// A task reference that is neither a task id nor an identity's address.
    #[error("{0}; nor is it a task id (32 hex digits)")]
    TaskReference(sendledger_core::Error),
}

impl Error {
    /// `step` failed because of `source`.
    pub fn step(
        step: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Step {
            step: step.into(),
            source: source.into(),
        }
    }
}

/// A configuration the service cannot use. Every message names the field (and the variable
/// that set it, for an environment override), and never quotes a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the configuration {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// What is wrong with the file at `path`.
    #[error("configuration {path}")]
    File {
        path: PathBuf,
        source: Box<ConfigError>,
    },
    /// A TOML syntax error by its position and message only: toml's own text quotes the
    /// line, which may hold a secret.
    #[error("line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// A TOML syntax error with no position.
    #[error("{message}")]
    SyntaxUnplaced { message: String },
    /// What is wrong with the environment variable `name`.
    #[error("environment {name}")]
    Environment {
        name: String,
        source: Box<ConfigError>,
    },
    /// An override that names no field (`a____b`) or a field below a value.
    #[error("{0}")]
    OverridePath(String),
    /// A field's value is wrong: `problem` says why and what to use instead.
    #[error("{field}: {problem}")]
    Field { field: String, problem: String },
    /// A field set by an environment variable is wrong.
    #[error("{field} (set by {variable}): {problem}")]
    FieldSetBy {
        field: String,
        variable: String,
        problem: String,
    },
    #[error(transparent)]
    Kafka(#[from] sendledger_kafka::Error),
    #[error(transparent)]
    Targets(#[from] sendledger_effects::Error),
}

impl ConfigError {
    pub(crate) fn field(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Field {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
