//! The log reader over TLS (`security.protocol: SSL`, docs/sinks.md §7.7 rule 4): a broker of
//! the test's own (the binary `scripts/kafka.sh` exports as `DDBPIPE_TEST_KAFKA_BIN`) behind a
//! TLS listener with a self-signed certificate, which it advertises, so librdkafka's producer
//! and ddbpipe's reader both reach it only through TLS. The broker of the tests serves no TLS
//! itself; the listener here terminates it and passes the bytes on. And over SASL
//! (`SASL_PLAINTEXT` with SCRAM-SHA-512, or OAUTHBEARER with MSK IAM's tokens): a listener in
//! front of the broker that authenticates every connection before passing its bytes on
//! (`ddbpipe_testkit::kafka_front`; the tests' broker keeps no SASL users in its in-memory
//! storage).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ddbpipe_kafka::log::{LogReader, Security};
use ddbpipe_testkit::free_port;
use ddbpipe_testkit::kafka_front::{Accepts, Secrets, broker, msk_token_signed_by, sasl_listener};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// The MSK IAM test's AWS credentials (no AWS is reached: the listener takes the tokens).
const KEY: &str = "AKIDMSKIAMTEST";
const SECRET: &str = "msk-iam-test-secret-kept-out-of-every-message";

/// A credentials chain that finds none.
#[derive(Debug)]
struct NoCredentials;

impl aws_credential_types::provider::ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded("no profile here"),
        ))
    }
}

const TIMEOUT: Duration = Duration::from_secs(30);

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

    let security = Security::of(&tls_properties(ca), None).unwrap();
    let reader = LogReader::new(&address, TIMEOUT).with_security(security);
    let last = reader.last_committed("positions", 0, b"p").await.unwrap();
    let value = last.and_then(|record| record.value).unwrap();
    assert_eq!(&value[..], b"committed");

    // A broker whose certificate does not chain to the trusted roots is refused: the Mozilla
    // roots do not hold the test's self-signed certificate.
    let unverified = Security::of(&[("security.protocol".into(), "SSL".into())], None).unwrap();
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
    sasl_listener(
        sasl,
        plain,
        Accepts::Scram(Arc::new(Secrets::of("s3cret-pass"))),
    )
    .await;
    let address = format!("127.0.0.1:{sasl}");
    let good = sasl_properties("SCRAM-SHA-512", "ddbpipe", "s3cret-pass");
    committed_and_aborted(&address, "positions", &good).await;

    let reader =
        LogReader::new(&address, TIMEOUT).with_security(Security::of(&good, None).unwrap());
    let last = reader.last_committed("positions", 0, b"p").await.unwrap();
    let value = last.and_then(|record| record.value).unwrap();
    assert_eq!(&value[..], b"committed");

    let wrong = sasl_properties("SCRAM-SHA-512", "ddbpipe", "wrong-password-42");
    let refused = LogReader::new(&address, Duration::from_secs(5))
        .with_security(Security::of(&wrong, None).unwrap())
        .last_committed("positions", 0, b"p")
        .await
        .unwrap_err();
    let said = refused.to_string();
    assert!(said.contains("SASL SCRAM-SHA-512"), "{said}");
    assert!(said.contains("refused the credentials"), "{said}");
    assert!(!said.contains("wrong-password-42"), "{said}");

    let other = sasl_properties("SCRAM-SHA-256", "ddbpipe", "s3cret-pass");
    let unoffered = LogReader::new(&address, Duration::from_secs(5))
        .with_security(Security::of(&other, None).unwrap())
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

/// `msk_iam.rs` and `log/sasl.rs` (docs/sinks.md §7.7 rule 4): behind a listener that takes
/// only OAUTHBEARER with an MSK IAM token of its region (`sasl_listener`, which it
/// advertises), the admin client makes the positions topic, librdkafka's transactional
/// producer writes a committed position and an aborted one, and the reader reads back the
/// committed one, each with tokens ddbpipe made from the run's credentials (librdkafka's token
/// refresh answered by the clients' context). Every token the listener was given is signed as
/// botocore signs (its signature made again by botocore at the token's time is the same), and
/// none holds the secret key. A token of another region is refused, naming the mechanism and
/// never the secret; OAUTHBEARER without `msk_iam` is refused before anything connects.
#[tokio::test(flavor = "multi_thread")]
async fn msk_iam_tokens_authenticate_the_admin_client_the_producer_and_the_reader() {
    use aws_credential_types::Credentials;
    use aws_credential_types::provider::SharedCredentialsProvider;
    use ddbpipe_kafka::client::{Connection, TopicShape};
    use ddbpipe_kafka::msk_iam::MskIam;
    use rdkafka::producer::BaseRecord;

    let (plain, sasl) = (free_port(), free_port());
    let _broker = broker(plain, sasl);
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let accepts = Accepts::Bearer {
        region: "eu-west-1",
        tokens: Arc::clone(&tokens),
    };
    sasl_listener(sasl, plain, accepts).await;
    let address = format!("127.0.0.1:{sasl}");
    let credentials =
        || SharedCredentialsProvider::new(Credentials::new(KEY, SECRET, None, None, "test"));
    let msk_iam = MskIam::new("eu-west-1", credentials());
    let properties: Vec<(String, String)> = vec![
        ("security.protocol".into(), "SASL_PLAINTEXT".into()),
        ("sasl.mechanism".into(), "OAUTHBEARER".into()),
    ];
    let connection = Connection {
        brokers: address.clone(),
        properties: properties.clone(),
        timeout: TIMEOUT,
        msk_iam: Some(msk_iam.clone()),
    };
    connection
        .ensure_topic("positions", TopicShape::default(), true)
        .await
        .unwrap();
    let producer = connection.producer(Some("msk-iam-test")).unwrap();
    producer.init_transactions(TIMEOUT).unwrap();
    for (value, commit) in [("committed", true), ("aborted", false)] {
        producer.begin_transaction().unwrap();
        let record = BaseRecord::to("positions")
            .partition(0)
            .key("p")
            .payload(value);
        producer.send(record).map_err(|(error, _)| error).unwrap();
        producer.flush(TIMEOUT).unwrap();
        if commit {
            producer.commit_transaction(TIMEOUT).unwrap();
        } else {
            producer.abort_transaction(TIMEOUT).unwrap();
        }
    }

    let security = Security::of(&properties, Some(&msk_iam)).unwrap();
    let reader = LogReader::new(&address, TIMEOUT).with_security(security);
    let last = reader.last_committed("positions", 0, b"p").await.unwrap();
    let value = last.and_then(|record| record.value).unwrap();
    assert_eq!(&value[..], b"committed");

    // What a reader with `tokens` is told.
    let refusal = |tokens: MskIam| {
        let security = Security::of(&properties, Some(&tokens)).unwrap();
        let reader = LogReader::new(&address, Duration::from_secs(5)).with_security(security);
        async move {
            let read = reader.last_committed("positions", 0, b"p").await;
            read.unwrap_err().to_string()
        }
    };
    let refused = refusal(MskIam::new("us-east-1", credentials())).await;
    assert!(
        refused.contains("OAUTHBEARER")
            && refused.contains("not an MSK IAM token")
            && refused.contains("sink.msk_iam.region"),
        "{refused}"
    );
    assert!(!refused.contains(SECRET), "{refused}");
    // Credentials that cannot be had: the token is not made, and the error says why.
    let nowhere = MskIam::new("eu-west-1", SharedCredentialsProvider::new(NoCredentials));
    let failed = refusal(nowhere).await;
    assert!(
        failed.contains("cannot make an MSK IAM token for region eu-west-1")
            && failed.contains("no profile here"),
        "{failed}"
    );
    assert_eq!(
        Security::of(&properties, None).unwrap_err(),
        ddbpipe_kafka::log::NO_TOKENS
    );

    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.len() >= 4,
        "the admin client, the producer and the reader each authenticated: {} tokens",
        tokens.len()
    );
    for token in &tokens {
        assert!(!token.contains(SECRET));
        assert!(
            msk_token_signed_by(token, KEY, SECRET),
            "botocore signs the token's request otherwise: {token}"
        );
        assert!(!msk_token_signed_by(token, KEY, "another-secret"));
    }
}
