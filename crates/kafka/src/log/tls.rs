//! How the log reader reaches a broker's listener (docs/sinks.md §7.7 rule 4): PLAINTEXT, or
//! TLS (`security.protocol: SSL`) configured from the same `sink.properties` librdkafka reads,
//! so the producer and the reader of the positions meet the cluster alike.
//!
//! # Rules
//! 1. `security.protocol` (any case; default `PLAINTEXT`): `PLAINTEXT`, `SSL`,
//!    `SASL_PLAINTEXT` or `SASL_SSL`; the SASL ones authenticate each connection as `sasl`
//!    says (PLAIN or SCRAM, the credentials of `sasl.username`/`sasl.password`; OAUTHBEARER,
//!    MSK IAM's tokens).
//! 2. TLS verifies the broker, as librdkafka does by default: its certificate chains to
//!    `ssl.ca.location` (a PEM file of one or more certificates) or, without it, to the
//!    Mozilla roots (webpki-roots), and names the host of the address connected to (a DNS
//!    name or an IP address). The properties that turn any of that off
//!    (`enable.ssl.certificate.verification: false`, `ssl.endpoint.identification.algorithm:
//!    none`) are refused: a position read from an unverified broker could be anyone's.
//! 3. A client certificate (`ssl.certificate.location` and `ssl.key.location`, PEM; both or
//!    neither) is presented when given. An encrypted key (`ssl.key.password`) is refused.
//! 4. Messages name the property and the file's trouble, never a property's value (rule 3 of
//!    `client`).

use std::io::BufReader;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::sasl::Sasl;
use crate::msk_iam::MskIam;

/// How the reader's connections are made (rule 1): plain TCP or TLS, with or without SASL.
#[derive(Clone, Default)]
pub struct Security {
    /// TLS with this client configuration (rules 2 and 3); `None`: plain TCP.
    tls: Option<Arc<ClientConfig>>,
    /// SASL after the connection opened (`sasl`).
    sasl: Option<Arc<Sasl>>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.tls.is_some() {
            "Tls"
        } else {
            "Plaintext"
        })?;
        if let Some(sasl) = &self.sasl {
            write!(f, "+{sasl:?}")?;
        }
        Ok(())
    }
}

impl Security {
    /// The security the client `properties` ask for (rules 1–3); `Err` names the property and
    /// what to do.
    pub fn of(
        properties: &[(String, String)],
        msk_iam: Option<&MskIam>,
    ) -> Result<Security, String> {
        let get = |name: &str| {
            properties
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        let protocol = get("security.protocol").unwrap_or("plaintext");
        let (tls, sasl) = match protocol.to_ascii_lowercase().as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            _ => {
                return Err("sink.properties.security.protocol must be PLAINTEXT, SSL, \
                     SASL_PLAINTEXT or SASL_SSL"
                    .to_string());
            }
        };
        let sasl = if sasl {
            Some(Arc::new(Sasl::of(get, msk_iam)?))
        } else {
            None
        };
        if !tls {
            return Ok(Security { tls: None, sasl });
        }
        if get("enable.ssl.certificate.verification")
            .is_some_and(|value| value.eq_ignore_ascii_case("false"))
            || get("ssl.endpoint.identification.algorithm")
                .is_some_and(|value| value.eq_ignore_ascii_case("none"))
        {
            return Err(
                "sink.properties: ddbpipe reads its positions only from a broker whose \
                 certificate and name it verified; give the broker's CA in ssl.ca.location \
                 instead of turning verification off"
                    .to_string(),
            );
        }
        if get("ssl.key.password").is_some() {
            return Err(
                "sink.properties.ssl.key.password: an encrypted client key is not read \
                 by ddbpipe's position reader; give an unencrypted PEM key in ssl.key.location \
                 (readable by ddbpipe only)"
                    .to_string(),
            );
        }
        let mut roots = RootCertStore::empty();
        match get("ssl.ca.location") {
            Some(path) => {
                for certificate in certificates(path, "ssl.ca.location")? {
                    roots.add(certificate).map_err(|e| {
                        format!("sink.properties.ssl.ca.location: a certificate is not usable: {e}")
                    })?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match (get("ssl.certificate.location"), get("ssl.key.location")) {
            (None, None) => builder.with_no_client_auth(),
            (Some(certificate), Some(key)) => {
                let chain = certificates(certificate, "ssl.certificate.location")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!(
                        "sink.properties.ssl.key.location: no PEM private key could be read: {e}"
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("sink.properties.ssl.key.location: {e}"))?
            }
            _ => {
                return Err("sink.properties: a client certificate needs both \
                     ssl.certificate.location and ssl.key.location"
                    .to_string());
            }
        };
        Ok(Security {
            tls: Some(Arc::new(config)),
            sasl,
        })
    }

    /// The TLS configuration, when the connections are TLS.
    pub(super) fn tls(&self) -> Option<&Arc<ClientConfig>> {
        self.tls.as_ref()
    }

    /// The SASL settings, when the connections authenticate.
    pub(super) fn sasl(&self) -> Option<&Sasl> {
        self.sasl.as_deref()
    }
}

/// The certificates of the PEM file at `path` (`property` names it in messages): at least one.
fn certificates(path: &str, property: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = std::fs::File::open(path)
        .map_err(|e| format!("sink.properties.{property}: the file cannot be read: {e}"))?;
    let read: Result<Vec<_>, _> =
        CertificateDer::pem_reader_iter(&mut BufReader::new(file)).collect();
    let read =
        read.map_err(|e| format!("sink.properties.{property}: not PEM certificates: {e}"))?;
    if read.is_empty() {
        return Err(format!(
            "sink.properties.{property}: the file holds no PEM certificate"
        ));
    }
    Ok(read)
}

/// Opens TLS over `tcp` to the broker at `host` (its address's host part: the name the
/// certificate must hold, rule 2).
pub(super) async fn connect(
    config: &Arc<ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("'{host}' is not a host name TLS can verify: {e}"),
        )
    })?;
    TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
}
