//! TLS of the service's own listeners (the admin endpoint, the front door): the server
//! certificate and key, and optionally the CA that clients' certificates must be signed by
//! (mutual TLS). Read when the configuration is checked, so a missing or wrong file fails at
//! load, naming its field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use tokio_rustls::TlsAcceptor;

use crate::error::ConfigError;

/// `[admin.tls]`, `[front.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// PEM file of the server certificate, followed by its chain.
    pub cert_file: PathBuf,
    /// PEM file of the certificate's private key.
    pub key_file: PathBuf,
    /// When set, every client must present a certificate signed by a CA in this PEM file: the
    /// handshake fails otherwise, before any request is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

/// The SHA-256 of the certificate a client presented in the TLS handshake (its leaf, DER): a
/// request's extension on a listener with `client_ca_file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCertificate(pub [u8; 32]);

impl ListenerTlsConfig {
    /// The acceptor; `field` is the section's path (`front.tls`) for errors.
    pub fn acceptor(&self, field: &str) -> Result<TlsAcceptor, ConfigError> {
        let at = |name: &str| format!("{field}.{name}");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError::field(field, e.to_string()))?;
        let builder = match &self.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(&at("client_ca_file"), path)? {
                    roots
                        .add(cert)
                        .map_err(|e| ConfigError::field(at("client_ca_file"), e.to_string()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| ConfigError::field(at("client_ca_file"), e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let chain = certificates(&at("cert_file"), &self.cert_file)?;
        let key = PrivateKeyDer::from_pem_file(&self.key_file).map_err(|e| {
            ConfigError::field(
                at("key_file"),
                format!(
                    "no private key read from `{}`: {e}",
                    self.key_file.display()
                ),
            )
        })?;
        let mut server = builder
            .with_single_cert(chain, key)
            .map_err(|e| ConfigError::field(at("key_file"), e.to_string()))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(server)))
    }
}

fn certificates(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ConfigError::field(field, format!("cannot read `{}`: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ConfigError::field(
            field,
            format!("`{}` holds no certificate", path.display()),
        ));
    }
    Ok(certs)
}
