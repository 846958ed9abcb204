//! The log reader over TLS (`security.protocol: SSL`, docs/sinks.md §7.7 rule 4): a broker of
//! the test's own (the binary `scripts/kafka.sh` exports as `DDBPIPE_TEST_KAFKA_BIN`) behind a
//! TLS listener with a self-signed certificate, which it advertises, so librdkafka's producer
//! and ddbpipe's reader both reach it only through TLS. The broker of the tests serves no TLS
//! itself; the listener here terminates it and passes the bytes on. And over SASL
//! (`SASL_PLAINTEXT` with SCRAM-SHA-512): a listener in front of the broker that authenticates
//! every connection with rsasl's SCRAM server before passing its bytes on (the tests' broker
//! keeps no SASL users in its in-memory storage).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_kafka::log::{LogReader, Security};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A free loopback port.
fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The broker, stopped when dropped.
struct Broker(Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A broker listening on `port` that advertises `advertised`.
fn broker(port: u16, advertised: u16) -> Broker {
    let bin = std::env::var("DDBPIPE_TEST_KAFKA_BIN").unwrap_or_else(|_| {
        panic!("DDBPIPE_TEST_KAFKA_BIN is not set: run the tests through scripts/test.sh (scripts/kafka.sh exports it)")
    });
    let broker = Broker(
        Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{port}"),
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{advertised}"),
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return broker;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the test's broker did not listen on {port}");
}

/// Terminates TLS on `port` with `certificate` and `key`, passing each connection's bytes to
/// the broker on `to`.
async fn tls_listener(port: u16, to: u16, certificate: &str, key: &str) {
    let chain = vec![CertificateDer::from_pem_slice(certificate.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                let Ok(mut broker) = TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
            });
        }
    });
}

/// The client properties of TLS to the test's listener, trusting `ca`.
fn tls_properties(ca: &str) -> Vec<(String, String)> {
    vec![
        ("security.protocol".into(), "SSL".into()),
        ("ssl.ca.location".into(), ca.into()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn positions_are_read_back_over_tls_from_a_verified_broker_only() {
    let dir = tempfile::tempdir().unwrap();
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let certificate = certified.cert.pem();
    let key = certified.key_pair.serialize_pem();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &certificate).unwrap();
    let ca = ca.to_str().unwrap();
    let (plain, tls) = (free_port(), free_port());
    let _broker = broker(plain, tls);
    tls_listener(tls, plain, &certificate, &key).await;
    let address = format!("127.0.0.1:{tls}");

    // librdkafka writes a committed position and an aborted one, over TLS.
    committed_and_aborted(&address, "positions", &tls_properties(ca)).await;

    let security = Security::of(&tls_properties(ca)).unwrap();
    let reader = LogReader::new(&address, TIMEOUT).with_security(security);
    let last = reader.last_committed("positions", 0, b"p").await.unwrap();
    let value = last.and_then(|record| record.value).unwrap();
    assert_eq!(&value[..], b"committed");

    // A broker whose certificate does not chain to the trusted roots is refused: the Mozilla
    // roots do not hold the test's self-signed certificate.
    let unverified = Security::of(&[("security.protocol".into(), "SSL".into())]).unwrap();
    let refused = LogReader::new(&address, Duration::from_secs(5))
        .with_security(unverified)
        .last_committed("positions", 0, b"p")
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("certificate"), "{refused}");
    // PLAINTEXT to a TLS listener does not read anything either.
    let plaintext = LogReader::new(&address, Duration::from_secs(5))
        .last_committed("positions", 0, b"p")
        .await;
    assert!(plaintext.is_err(), "{plaintext:?}");
}

/// Writes a committed position and an aborted one into partition 0 of `topic` through a
/// transactional librdkafka producer with `properties`.
async fn committed_and_aborted(address: &str, topic: &str, properties: &[(String, String)]) {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", address)
        .set("message.timeout.ms", "30000")
        .set("transactional.id", format!("{topic}-{address}"));
    for (name, value) in properties {
        config.set(name, value);
    }
    let producer: FutureProducer = config.create().unwrap();
    producer.init_transactions(TIMEOUT).unwrap();
    for (value, commit) in [("committed", true), ("aborted", false)] {
        producer.begin_transaction().unwrap();
        let record = FutureRecord::to(topic).partition(0).key("p").payload(value);
        producer.send(record, Duration::ZERO).await.unwrap();
        if commit {
            producer.commit_transaction(TIMEOUT).unwrap();
        } else {
            producer.abort_transaction(TIMEOUT).unwrap();
        }
    }
}

/// The SCRAM-SHA-512 secrets of the proxy's one user, as a broker keeps them.
struct Secrets {
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl Secrets {
    fn of(password: &str) -> Secrets {
        use rsasl::mechanisms::scram::tools;
        use sha2::{Digest, Sha512};
        let salt = b"ddbpipe-test-salt".to_vec();
        let mut salted = Default::default();
        tools::hash_password::<Sha512>(password.as_bytes(), 4096, &salt, &mut salted);
        let (client_key, server_key) = tools::derive_keys::<Sha512>(salted.as_slice());
        Secrets {
            salt,
            stored_key: Sha512::digest(client_key).to_vec(),
            server_key: server_key.to_vec(),
        }
    }
}

impl rsasl::callback::SessionCallback for Secrets {
    fn callback(
        &self,
        _: &rsasl::callback::SessionData,
        context: &rsasl::callback::Context,
        request: &mut rsasl::callback::Request,
    ) -> Result<(), rsasl::prelude::SessionError> {
        use rsasl::mechanisms::scram::properties::ScramStoredPassword;
        if context.get_ref::<rsasl::property::AuthId>() == Some("ddbpipe") {
            request.satisfy::<ScramStoredPassword>(&ScramStoredPassword::new(
                4096,
                &self.salt,
                &self.stored_key,
                &self.server_key,
            ))?;
        }
        Ok(())
    }
}

/// One frame of the Kafka protocol: its size, then its bytes.
async fn read_frame(stream: &mut TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let size = stream.read_i32().await.ok()?;
    let mut frame = vec![0; usize::try_from(size).ok()?];
    stream.read_exact(&mut frame).await.ok()?;
    Some(frame)
}

async fn write_frame(stream: &mut TcpStream, frame: &[u8]) -> Option<()> {
    use tokio::io::AsyncWriteExt;
    let size = i32::try_from(frame.len()).ok()?;
    stream.write_all(&size.to_be_bytes()).await.ok()?;
    stream.write_all(frame).await.ok()
}

/// An answer to a request of `version` with `correlation`: header and body.
fn answer<R: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion>(
    correlation: i32,
    version: i16,
    body: &R,
) -> Vec<u8> {
    use kafka_protocol::protocol::Encodable as _;
    let mut out = bytes::BytesMut::new();
    kafka_protocol::messages::ResponseHeader::default()
        .with_correlation_id(correlation)
        .encode(&mut out, R::header_version(version))
        .unwrap();
    body.encode(&mut out, version).unwrap();
    out.to_vec()
}

/// A listener on `port` in front of the broker on `to` that requires SASL SCRAM-SHA-512 as
/// the user `ddbpipe` with `password`, as a broker with authentication does: ApiVersions is
/// passed on, SaslHandshake and SaslAuthenticate are answered here by rsasl's SCRAM server,
/// anything else before the user is authenticated closes the connection, and once it is the
/// bytes pass on both ways.
async fn sasl_listener(port: u16, to: u16, password: &str) {
    use kafka_protocol::messages::{
        RequestHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse,
    };
    use kafka_protocol::protocol::{Decodable, HeaderVersion, StrBytes};
    let secrets = Arc::new(Secrets::of(password));
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let secrets = Arc::clone(&secrets);
            tokio::spawn(async move {
                let Ok(mut broker) = TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                let config = rsasl::prelude::SASLConfig::builder()
                    .with_defaults()
                    .with_callback(Secrets {
                        salt: secrets.salt.clone(),
                        stored_key: secrets.stored_key.clone(),
                        server_key: secrets.server_key.clone(),
                    })
                    .unwrap();
                let mechanism = rsasl::prelude::Mechname::parse(b"SCRAM-SHA-512").unwrap();
                let mut session = None;
                loop {
                    let Some(frame) = read_frame(&mut client).await else {
                        return;
                    };
                    let key = i16::from_be_bytes([frame[0], frame[1]]);
                    let version = i16::from_be_bytes([frame[2], frame[3]]);
                    let mut body = bytes::Bytes::from(frame.clone());
                    match key {
                        17 => {
                            let header = RequestHeader::decode(
                                &mut body,
                                SaslHandshakeRequest::header_version(version),
                            )
                            .unwrap();
                            let asked = SaslHandshakeRequest::decode(&mut body, version).unwrap();
                            let known = asked.mechanism.as_str() == "SCRAM-SHA-512";
                            let said = SaslHandshakeResponse::default()
                                .with_error_code(if known { 0 } else { 33 })
                                .with_mechanisms(vec![StrBytes::from_static_str("SCRAM-SHA-512")]);
                            if known {
                                let server = rsasl::prelude::SASLServer::<
                                    rsasl::validate::NoValidation,
                                >::new(Arc::clone(
                                    &config,
                                ));
                                session = Some(server.start_suggested(mechanism).unwrap());
                            }
                            let out = answer(header.correlation_id, version, &said);
                            if write_frame(&mut client, &out).await.is_none() {
                                return;
                            }
                        }
                        36 => {
                            let header = RequestHeader::decode(
                                &mut body,
                                SaslAuthenticateRequest::header_version(version),
                            )
                            .unwrap();
                            let asked =
                                SaslAuthenticateRequest::decode(&mut body, version).unwrap();
                            let Some(running) = session.as_mut() else {
                                return;
                            };
                            let mut sent = std::io::Cursor::new(Vec::new());
                            let stepped = running.step(Some(&asked.auth_bytes), &mut sent);
                            let sent = sent.into_inner();
                            // As a Kafka broker does, a failed exchange (SCRAM's `e=` final
                            // message) is answered SASL_AUTHENTICATION_FAILED.
                            let failed = match &stepped {
                                Ok(_) if sent.starts_with(b"e=") => {
                                    Some(String::from_utf8_lossy(&sent).into_owned())
                                }
                                Ok(_) => None,
                                Err(error) => Some(error.to_string()),
                            };
                            let said = match &failed {
                                None => SaslAuthenticateResponse::default()
                                    .with_auth_bytes(bytes::Bytes::from(sent)),
                                Some(why) => SaslAuthenticateResponse::default()
                                    .with_error_code(58)
                                    .with_error_message(Some(StrBytes::from_string(format!(
                                        "authentication failed: {why}"
                                    )))),
                            };
                            let out = answer(header.correlation_id, version, &said);
                            if write_frame(&mut client, &out).await.is_none() {
                                return;
                            }
                            if failed.is_some() {
                                return;
                            }
                            match stepped {
                                Ok(state) if !state.is_running() => {
                                    // Authenticated: the rest passes on.
                                    let _ = tokio::io::copy_bidirectional(&mut client, &mut broker)
                                        .await;
                                    return;
                                }
                                Ok(_) => {}
                                Err(_) => return,
                            }
                        }
                        18 => {
                            if write_frame(&mut broker, &frame).await.is_none() {
                                return;
                            }
                            let Some(answered) = read_frame(&mut broker).await else {
                                return;
                            };
                            if write_frame(&mut client, &answered).await.is_none() {
                                return;
                            }
                        }
                        // Not authenticated: nothing else is served.
                        _ => return,
                    }
                }
            });
        }
    });
}

/// SASL client properties: `mechanism` as `user` with `password`.
fn sasl_properties(mechanism: &str, user: &str, password: &str) -> Vec<(String, String)> {
    vec![
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanism".into(), mechanism.into()),
        ("sasl.username".into(), user.into()),
        ("sasl.password".into(), password.into()),
    ]
}

/// `log/sasl.rs`: behind a listener that requires SASL SCRAM-SHA-512 (`sasl_listener`, which
/// it advertises), librdkafka's producer writes a committed position and an aborted one and
/// the reader, with the producer's credentials, reads back the committed one. A wrong password
/// is refused naming the broker and the mechanism, never the password; a mechanism the broker
/// does not offer is refused naming the ones it does; a reader without SASL reads nothing.
#[tokio::test(flavor = "multi_thread")]
async fn positions_are_read_back_over_sasl_with_the_producers_credentials() {
    let (plain, sasl) = (free_port(), free_port());
    let _broker = broker(plain, sasl);
    sasl_listener(sasl, plain, "s3cret-pass").await;
    let address = format!("127.0.0.1:{sasl}");
    let good = sasl_properties("SCRAM-SHA-512", "ddbpipe", "s3cret-pass");
    committed_and_aborted(&address, "positions", &good).await;

    let reader = LogReader::new(&address, TIMEOUT).with_security(Security::of(&good).unwrap());
    let last = reader.last_committed("positions", 0, b"p").await.unwrap();
    let value = last.and_then(|record| record.value).unwrap();
    assert_eq!(&value[..], b"committed");

    let wrong = sasl_properties("SCRAM-SHA-512", "ddbpipe", "wrong-password-42");
    let refused = LogReader::new(&address, Duration::from_secs(5))
        .with_security(Security::of(&wrong).unwrap())
        .last_committed("positions", 0, b"p")
        .await
        .unwrap_err();
    let said = refused.to_string();
    assert!(said.contains("SASL SCRAM-SHA-512"), "{said}");
    assert!(said.contains("refused the credentials"), "{said}");
    assert!(!said.contains("wrong-password-42"), "{said}");

    let other = sasl_properties("SCRAM-SHA-256", "ddbpipe", "s3cret-pass");
    let unoffered = LogReader::new(&address, Duration::from_secs(5))
        .with_security(Security::of(&other).unwrap())
        .last_committed("positions", 0, b"p")
        .await
        .unwrap_err()
        .to_string();
    assert!(unoffered.contains("offers SCRAM-SHA-512"), "{unoffered}");

    let plaintext = LogReader::new(&address, Duration::from_secs(5))
        .last_committed("positions", 0, b"p")
        .await;
    assert!(plaintext.is_err(), "{plaintext:?}");
}
