//! The log reader over TLS (`security.protocol: SSL`, docs/sinks.md §7.7 rule 4): a broker of
//! the test's own (the binary `scripts/kafka.sh` exports as `DDBPIPE_TEST_KAFKA_BIN`) behind a
//! TLS listener with a self-signed certificate, which it advertises, so librdkafka's producer
//! and ddbpipe's reader both reach it only through TLS. The broker of the tests serves no TLS
//! itself; the listener here terminates it and passes the bytes on.

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
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &address)
        .set("message.timeout.ms", "30000")
        .set("transactional.id", "tls-test");
    for (name, value) in tls_properties(ca) {
        config.set(name, value);
    }
    let producer: FutureProducer = config.create().unwrap();
    producer.init_transactions(TIMEOUT).unwrap();
    for (value, commit) in [("committed", true), ("aborted", false)] {
        producer.begin_transaction().unwrap();
        let record = FutureRecord::to("positions")
            .partition(0)
            .key("p")
            .payload(value);
        producer.send(record, Duration::ZERO).await.unwrap();
        if commit {
            producer.commit_transaction(TIMEOUT).unwrap();
        } else {
            producer.abort_transaction(TIMEOUT).unwrap();
        }
    }

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
