//! TLS client settings of a target, built once when the target is loaded: trusted roots, the
//! optional client certificate, and the server name of each https endpoint.
//!
//! Every problem with the files is found here, at load, and named by its field
//! (`targets.<name>.tls.ca_file`...), so an attempt never fails because of local TLS settings.
//! Certificate verification cannot be turned off.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::config::TlsConfig;
use crate::error::{Error, Result};

/// What an https endpoint needs to open a connection: the client settings and the name its
/// certificate must be valid for.
#[derive(Clone)]
pub(crate) struct Tls {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The server name verified for `host` as written in a URL: an IP address (IPv6 without its
/// brackets) or a DNS name.
pub(crate) fn server_name(field: &str, host: &str) -> Result<ServerName<'static>> {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_string()).map_err(|_| {
        Error::config(
            field,
            format!("`{host}` is neither a DNS name nor an IP address a certificate can name"),
        )
    })
}

/// Builds the client settings of a target (`prefix` is `targets.<name>.tls`): the CA file's
/// certificates as the only roots when set, the webpki roots otherwise; the client certificate
/// and key when both are set (they must match). Only HTTP/1.1 is offered (ALPN).
pub(crate) fn connector(prefix: &str, config: Option<&TlsConfig>) -> Result<TlsConnector> {
    let field = |name: &str| format!("{prefix}.{name}");
    let empty = TlsConfig {
        ca_file: None,
        client_cert: None,
        client_key: None,
    };
    let config = config.unwrap_or(&empty);
    let roots = match &config.ca_file {
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
        Some(path) => {
            let field = field("ca_file");
            let mut roots = RootCertStore::empty();
            for (i, cert) in certificates(&field, path)?.into_iter().enumerate() {
                roots.add(cert).map_err(|e| {
                    Error::config(
                        &field,
                        format!(
                            "certificate {} in `{}` is not a usable CA certificate: {e}",
                            i + 1,
                            path.display()
                        ),
                    )
                })?;
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(prefix, format!("no usable TLS protocol version: {e}")))?
        .with_root_certificates(roots);
    let mut client = match (&config.client_cert, &config.client_key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => {
            return Err(Error::config(
                field("client_key"),
                "is missing: client_cert needs the file of its private key",
            ))
        }
        (None, Some(_)) => {
            return Err(Error::config(
                field("client_cert"),
                "is missing: client_key needs the file of its certificate",
            ))
        }
        (Some(cert_path), Some(key_path)) => {
            let chain = certificates(&field("client_cert"), cert_path)?;
            let key = private_key(&field("client_key"), key_path)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                Error::config(
                    field("client_key"),
                    format!(
                        "`{}` is not the private key of the certificate in `{}`: {e}",
                        key_path.display(),
                        cert_path.display()
                    ),
                )
            })?
        }
    };
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(client)))
}

/// Every certificate in a PEM file; at least one.
fn certificates(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let unreadable = |e: &dyn std::fmt::Display| {
        Error::config(field, format!("cannot read `{}`: {e}", path.display()))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(&pem_error(e)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unreadable(&pem_error(e)))?;
    if certs.is_empty() {
        return Err(Error::config(
            field,
            format!(
                "`{}` holds no certificate (expected PEM `-----BEGIN CERTIFICATE-----` blocks)",
                path.display()
            ),
        ));
    }
    Ok(certs)
}

/// The first private key in a PEM file. The key's bytes never appear in an error.
fn private_key(field: &str, path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        let reason = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "holds no private key (expected a PEM `PRIVATE KEY` block)".to_string()
            }
            other => format!("cannot be read: {}", pem_error(other)),
        };
        Error::config(field, format!("`{}` {reason}", path.display()))
    })
}

/// A PEM error in words, without quoting the file's contents (a malformed line of a key file
/// could be part of the key).
fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as Pem;
    match e {
        Pem::Io(e) => e.to_string(),
        Pem::MissingSectionEnd { .. } => "a PEM section has no END line".into(),
        Pem::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".into(),
        Pem::Base64Decode(_) => "a PEM section is not valid base64".into(),
        Pem::NoItemsFound => "no PEM section found".into(),
        _ => "malformed PEM".into(),
    }
}
