//! The simulator's TLS server settings, read from PEM files when it starts.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::SimTlsConfig;
use crate::error::{Error, Result};

/// Builds the acceptor; errors name the field (`tls.cert_file`...).
pub(crate) fn acceptor(config: &SimTlsConfig) -> Result<TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config("tls", e.to_string()))?;
    let builder = match &config.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates("tls.client_ca_file", path)? {
                roots
                    .add(cert)
                    .map_err(|e| Error::config("tls.client_ca_file", e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::config("tls.client_ca_file", e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let chain = certificates("tls.cert_file", &config.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&config.key_file).map_err(|e| {
        Error::config(
            "tls.key_file",
            format!(
                "no private key read from `{}`: {e}",
                config.key_file.display()
            ),
        )
    })?;
    let mut server = builder
        .with_single_cert(chain, key)
        .map_err(|e| Error::config("tls.key_file", e.to_string()))?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(server)))
}

fn certificates(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::config(field, format!("cannot read `{}`: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::config(
            field,
            format!("`{}` holds no certificate", path.display()),
        ));
    }
    Ok(certs)
}
