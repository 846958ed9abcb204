//! SASL for the log reader (`security.protocol: SASL_PLAINTEXT` or `SASL_SSL`, docs/sinks.md
//! §7.7 rule 4): the position is read back from a cluster that only talks to authenticated
//! clients, with the credentials librdkafka's producer is given.
//!
//! # Rules
//! 1. `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (any case), with
//!    `sasl.username` and `sasl.password`; or `OAUTHBEARER` with MSK's IAM tokens
//!    ([`crate::msk_iam`], `sink.msk_iam`), the only source of tokens ddbpipe has. Any other
//!    (librdkafka's default `GSSAPI`) is refused naming the property: the reader cannot speak
//!    it, and a producer whose positions could not be read back would not be exactly once.
//! 2. After ApiVersions, each connection sends SaslHandshake (v1: the exchange then rides in
//!    SaslAuthenticate requests, KIP-152) naming the mechanism, then SaslAuthenticate requests
//!    carrying the mechanism's steps until it finishes. The mechanisms are rsasl's: for SCRAM
//!    the server's final message is verified too (the broker proves it knows the password).
//!    `OAUTHBEARER` sends one message, RFC 7628's initial response with a token made for the
//!    connection (`n,,^Aauth=Bearer <token>^A^A`); the broker's answer without an error
//!    accepts it.
//! 3. A refused handshake names the mechanisms the broker offers; a refused authentication
//!    names the broker and what it said, never the password nor the exchanged bytes (they
//!    derive from it). Both are definite failures: a retry would be refused again.

use std::io::Cursor;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use rsasl::prelude::{Mechname, SASLClient, SASLConfig, State};

use super::LogError;
use super::wire::{Api, Connection};
use crate::msk_iam::MskIam;

/// SaslHandshake v1 only: v0 would send the exchange as raw frames (rule 2).
const SASL_HANDSHAKE: Api = Api {
    key: ApiKey::SaslHandshake,
    name: "SaslHandshake",
    min: 1,
    max: 1,
};

const SASL_AUTHENTICATE: Api = Api {
    key: ApiKey::SaslAuthenticate,
    name: "SaslAuthenticate",
    min: 0,
    max: 2,
};

/// Steps a mechanism may take before the reader gives up on it (SCRAM takes two).
const MAX_STEPS: usize = 8;

/// The mechanisms of rule 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    OAuthBearer,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

/// How the reader authenticates (rule 1). Its debug form names the mechanism only.
#[derive(Clone)]
pub(super) struct Sasl {
    mechanism: Mechanism,
    credentials: Credentials,
}

/// What proves who the reader is (rule 1).
#[derive(Clone)]
enum Credentials {
    /// PLAIN and SCRAM's.
    Password { username: String, password: String },
    /// `OAUTHBEARER`'s: MSK IAM tokens.
    Token(MskIam),
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sasl({})", self.mechanism.name())
    }
}

impl Sasl {
    /// The SASL settings of the client properties `get` reads, with `msk_iam`'s tokens for
    /// `OAUTHBEARER` (rule 1); `Err` names the property and what to do, never a value.
    pub(super) fn of<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
        msk_iam: Option<&MskIam>,
    ) -> Result<Sasl, String> {
        let mechanism = get("sasl.mechanism")
            .or(get("sasl.mechanisms"))
            .unwrap_or("GSSAPI");
        let mechanism = match mechanism.to_ascii_uppercase().as_str() {
            "PLAIN" => Mechanism::Plain,
            "SCRAM-SHA-256" => Mechanism::ScramSha256,
            "SCRAM-SHA-512" => Mechanism::ScramSha512,
            "OAUTHBEARER" => {
                let Some(msk_iam) = msk_iam else {
                    return Err(NO_TOKENS.to_string());
                };
                return Ok(Sasl {
                    mechanism: Mechanism::OAuthBearer,
                    credentials: Credentials::Token(msk_iam.clone()),
                });
            }
            other => {
                return Err(format!(
                    "sink.properties.sasl.mechanism: ddbpipe reads the positions back with \
                     PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or MSK IAM (sink.msk_iam), not {other} \
                     (librdkafka's default is GSSAPI): set one of those, or use delivery: \
                     at_least_once"
                ));
            }
        };
        let required = |name: &str| {
            get(name).map(str::to_string).ok_or_else(|| {
                format!(
                    "sink.properties.{name}: required with sasl.mechanism {}",
                    mechanism.name()
                )
            })
        };
        Ok(Sasl {
            mechanism,
            credentials: Credentials::Password {
                username: required("sasl.username")?,
                password: required("sasl.password")?,
            },
        })
    }

    /// Rule 2 on an open connection whose API versions are known.
    pub(super) async fn authenticate(&self, connection: &mut Connection) -> Result<(), LogError> {
        let mechanism = self.mechanism.name();
        let remedy = match &self.credentials {
            Credentials::Password { .. } => {
                "check sink.properties sasl.mechanism, sasl.username and sasl.password"
            }
            Credentials::Token(_) => {
                "check the run's AWS credentials, sink.msk_iam.region and that the role may \
                 kafka-cluster:Connect"
            }
        };
        let refused = |connection: &Connection, message: String| LogError::Authentication {
            broker: connection.broker().to_string(),
            mechanism,
            message,
            remedy,
        };
        let handshake =
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
        let answer = connection.send(SASL_HANDSHAKE, &handshake).await?;
        if let Some(error) = ResponseError::try_from_code(answer.error_code) {
            let offered: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(
                connection,
                format!(
                    "the handshake was refused ({error}); the broker offers {}",
                    if offered.is_empty() {
                        "no mechanism".to_string()
                    } else {
                        offered.join(", ")
                    }
                ),
            ));
        }
        let (username, password) = match &self.credentials {
            Credentials::Password { username, password } => (username, password),
            Credentials::Token(msk_iam) => {
                let token = (msk_iam.token().await).map_err(|e| refused(connection, e))?;
                let first = format!("n,,\x01auth=Bearer {}\x01\x01", token.value);
                let request =
                    SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(first));
                let answer = connection.send(SASL_AUTHENTICATE, &request).await?;
                return match answer.error_code {
                    0 => Ok(()),
                    _ => Err(refused(connection, refusal(&answer))),
                };
            }
        };
        let config = SASLConfig::with_credentials(None, username.clone(), password.clone())
            .map_err(|e| refused(connection, format!("the credentials cannot be used: {e}")))?;
        let name = Mechname::parse(mechanism.as_bytes())
            .map_err(|e| refused(connection, format!("no such mechanism: {e}")))?;
        let mut session = SASLClient::new(config)
            .start_suggested(&[name])
            .map_err(|e| refused(connection, format!("the mechanism cannot start: {e}")))?;
        let mut input: Option<Bytes> = None;
        for _ in 0..MAX_STEPS {
            let mut out = Cursor::new(Vec::new());
            let state = session
                .step(input.as_deref(), &mut out)
                .map_err(|e| refused(connection, format!("the exchange failed: {e}")))?;
            let sent = out.into_inner();
            if matches!(state, State::Finished(_)) && sent.is_empty() && input.is_some() {
                // The server's last message is verified: authenticated.
                return Ok(());
            }
            let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(sent));
            let answer = connection.send(SASL_AUTHENTICATE, &request).await?;
            if answer.error_code != 0 {
                return Err(refused(connection, refusal(&answer)));
            }
            if matches!(state, State::Finished(_)) {
                // A mechanism that ends with the client's message (PLAIN): accepted.
                return Ok(());
            }
            input = Some(answer.auth_bytes);
        }
        Err(refused(
            connection,
            format!("the exchange did not end within {MAX_STEPS} steps"),
        ))
    }
}

/// Rule 1's refusal of `OAUTHBEARER` without `msk_iam`.
pub const NO_TOKENS: &str = "sink.properties.sasl.mechanism: OAUTHBEARER tokens come from \
     sink.msk_iam (Amazon MSK's IAM access control), ddbpipe's only source of them: set msk_iam \
     instead of the mechanism";

/// What a refused SaslAuthenticate says (rule 3): the error and the broker's message, which
/// holds no credential.
fn refusal(answer: &SaslAuthenticateResponse) -> String {
    let said = answer
        .error_message
        .as_ref()
        .map_or_else(String::new, |m| format!(": {}", m.as_str()));
    let error = ResponseError::try_from_code(answer.error_code)
        .map_or_else(|| format!("code {}", answer.error_code), |e| e.to_string());
    format!("the broker refused the credentials ({error}{said})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&'static str, &'static str)]) -> Result<Sasl, String> {
        Sasl::of(
            |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v),
            None,
        )
    }

    #[test]
    fn the_mechanism_and_credentials_are_read_and_the_password_never_shown() {
        let sasl = of(&[
            ("sasl.mechanism", "scram-sha-512"),
            ("sasl.username", "ddbpipe"),
            ("sasl.password", "hunter22"),
        ])
        .unwrap();
        assert_eq!(sasl.mechanism, Mechanism::ScramSha512);
        assert_eq!(format!("{sasl:?}"), "Sasl(SCRAM-SHA-512)");
        let default = of(&[("sasl.username", "u"), ("sasl.password", "p")]).unwrap_err();
        assert!(default.contains("not GSSAPI"), "{default}");
        let oauth = of(&[("sasl.mechanism", "OAUTHBEARER")]).unwrap_err();
        assert_eq!(oauth, NO_TOKENS);
        let missing = of(&[("sasl.mechanism", "PLAIN"), ("sasl.username", "u")]).unwrap_err();
        assert_eq!(
            missing,
            "sink.properties.sasl.password: required with sasl.mechanism PLAIN"
        );
    }
}
