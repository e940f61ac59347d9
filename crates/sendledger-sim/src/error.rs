use std::net::SocketAddr;

/// What can go wrong starting the simulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration field is invalid.
    #[error("{field}: {reason}")]
    Config { field: String, reason: String },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} (is the port in use? pick another `listen` address)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn config(field: &str, reason: impl Into<String>) -> Error {
        Error::Config {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
