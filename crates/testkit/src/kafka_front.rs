//! A Kafka broker behind a listener of the test's own, for what the tests' broker (tansu in
//! memory) does not serve itself: SASL. The listener authenticates each connection with SCRAM
//! (rsasl's server) or OAUTHBEARER (an MSK IAM token, kept for the test to judge by botocore),
//! then passes its bytes on. Used by `crates/kafka/tests/tls.rs` and the CLI's Kafka tests.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// The broker, stopped when dropped.
pub struct Broker(Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A broker of the test's own (the binary `scripts/kafka.sh` exports as
/// `DDBPIPE_TEST_KAFKA_BIN`) listening on `port` that advertises `advertised`: a listener of the
/// test's in front of it on `advertised` is the only way clients reach it.
pub fn broker(port: u16, advertised: u16) -> Broker {
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

/// The SCRAM-SHA-512 secrets of the proxy's one user, as a broker keeps them.
pub struct Secrets {
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl Secrets {
    /// The secrets of `password`.
    pub fn of(password: &str) -> Secrets {
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
pub async fn read_frame(stream: &mut TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let size = stream.read_i32().await.ok()?;
    let mut frame = vec![0; usize::try_from(size).ok()?];
    stream.read_exact(&mut frame).await.ok()?;
    Some(frame)
}

pub async fn write_frame(stream: &mut TcpStream, frame: &[u8]) -> Option<()> {
    use tokio::io::AsyncWriteExt;
    let size = i32::try_from(frame.len()).ok()?;
    stream.write_all(&size.to_be_bytes()).await.ok()?;
    stream.write_all(frame).await.ok()
}

/// An answer to a request of `version` with `correlation`: header and body.
pub fn answer<R: kafka_protocol::protocol::Encodable + kafka_protocol::protocol::HeaderVersion>(
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

/// What a SASL listener takes.
#[derive(Clone)]
pub enum Accepts {
    /// SCRAM-SHA-512 as the user `ddbpipe` with the password of these secrets.
    Scram(Arc<Secrets>),
    /// OAUTHBEARER with a token that is an MSK IAM token of `region` (a presigned
    /// `kafka-cluster:Connect` request to its endpoint, base64url): every token it is given is
    /// kept for the test to verify its signature.
    Bearer {
        region: &'static str,
        tokens: Arc<std::sync::Mutex<Vec<String>>>,
    },
}

impl Accepts {
    fn mechanism(&self) -> &'static str {
        match self {
            Accepts::Scram(_) => "SCRAM-SHA-512",
            Accepts::Bearer { .. } => "OAUTHBEARER",
        }
    }

    /// OAUTHBEARER: whether RFC 7628's initial response `sent` carries a token of the region
    /// (kept).
    fn bearer(&self, sent: &[u8]) -> bool {
        use base64::Engine as _;
        let Accepts::Bearer { region, tokens } = self else {
            return false;
        };
        let sent = String::from_utf8_lossy(sent);
        let Some(token) = (sent.strip_prefix("n,,\x01auth=Bearer "))
            .and_then(|rest| rest.strip_suffix("\x01\x01"))
        else {
            return false;
        };
        tokens.lock().unwrap().push(token.to_string());
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token);
        url.is_ok_and(|url| {
            String::from_utf8_lossy(&url).starts_with(&format!(
                "https://kafka.{region}.amazonaws.com/?Action=kafka-cluster%3AConnect&"
            ))
        })
    }
}

/// A listener on `port` in front of the broker on `to` that requires SASL as `accepts` says,
/// as a broker with authentication does: ApiVersions is passed on, SaslHandshake and
/// SaslAuthenticate are answered here (SCRAM by rsasl's SCRAM server), anything else before
/// the client is authenticated closes the connection, and once it is the bytes pass on both
/// ways.
pub async fn sasl_listener(port: u16, to: u16, accepts: Accepts) {
    use kafka_protocol::messages::{
        RequestHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse,
    };
    use kafka_protocol::protocol::{Decodable, HeaderVersion, StrBytes};
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let accepts = accepts.clone();
            tokio::spawn(async move {
                let Ok(mut broker) = TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                // SCRAM's server configuration; OAUTHBEARER's tokens are judged by `bearer`.
                let config = match &accepts {
                    Accepts::Scram(secrets) => Some(
                        rsasl::prelude::SASLConfig::builder()
                            .with_defaults()
                            .with_callback(Secrets {
                                salt: secrets.salt.clone(),
                                stored_key: secrets.stored_key.clone(),
                                server_key: secrets.server_key.clone(),
                            })
                            .unwrap(),
                    ),
                    Accepts::Bearer { .. } => None,
                };
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
                            let offered = accepts.mechanism();
                            let known = asked.mechanism.as_str() == offered;
                            let said = SaslHandshakeResponse::default()
                                .with_error_code(if known { 0 } else { 33 })
                                .with_mechanisms(vec![StrBytes::from_static_str(offered)]);
                            if known && let Some(config) = &config {
                                let server = rsasl::prelude::SASLServer::<
                                    rsasl::validate::NoValidation,
                                >::new(Arc::clone(
                                    config,
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
                            if let Accepts::Bearer { .. } = &accepts {
                                let said = match accepts.bearer(&asked.auth_bytes) {
                                    true => SaslAuthenticateResponse::default(),
                                    false => SaslAuthenticateResponse::default()
                                        .with_error_code(58)
                                        .with_error_message(Some(StrBytes::from_static_str(
                                            "not an MSK IAM token",
                                        ))),
                                };
                                let accepted = said.error_code == 0;
                                let out = answer(header.correlation_id, version, &said);
                                if write_frame(&mut client, &out).await.is_none() || !accepted {
                                    return;
                                }
                                let _ =
                                    tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                                return;
                            }
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

/// MSK IAM's signature, judged by botocore (the library AWS's own Python signer signs with):
/// the token's request, signed again by botocore at the token's `X-Amz-Date` with the same
/// credentials for the region of its credential scope, has the token's signature.
const VERIFY_MSK_TOKEN: &str = r#"
import base64, datetime, sys
from urllib.parse import urlparse, parse_qsl
import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
token, key, secret = sys.argv[1:4]
url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
query = dict(parse_qsl(urlparse(url).query))
region = query["X-Amz-Credential"].split("/")[2]
signed_at = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
botocore.auth.get_current_datetime = lambda *args, **kwargs: signed_at
request = AWSRequest(
    method="GET",
    url=f"https://kafka.{region}.amazonaws.com/?Action=kafka-cluster%3AConnect",
)
botocore.auth.SigV4QueryAuth(Credentials(key, secret), "kafka-cluster", region, expires=900).add_auth(request)
expected = dict(parse_qsl(urlparse(request.url).query))["X-Amz-Signature"]
print("same" if expected == query["X-Amz-Signature"] else "different")
"#;

/// Whether MSK IAM `token` is signed with the secret key `secret` of `key`, as botocore
/// judges it ([`VERIFY_MSK_TOKEN`]).
///
/// # Panics
/// When Python with botocore (moto's) cannot run it.
pub fn msk_token_signed_by(token: &str, key: &str, secret: &str) -> bool {
    let judged = Command::new("python3")
        .args(["-c", VERIFY_MSK_TOKEN, token, key, secret])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&judged.stdout);
    assert!(
        judged.status.success(),
        "botocore could not judge the token: {}",
        String::from_utf8_lossy(&judged.stderr)
    );
    said.trim() == "same"
}
