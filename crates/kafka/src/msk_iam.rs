//! Amazon MSK's IAM access control (`sink.msk_iam`, docs/sinks.md §7.7 rule 4): the producer,
//! the admin client and the positions reader authenticate with SASL `OAUTHBEARER`, their token
//! a SigV4-presigned `kafka-cluster:Connect` request signed with the run's AWS credentials, as
//! MSK (provisioned with IAM, and MSK Serverless, which takes nothing else) expects.
//!
//! # Rules
//! 1. The token is made by `aws-msk-iam-sasl-signer` (the signer MSK's Rust clients use, on
//!    `aws-sigv4`) from the credentials of the run's AWS configuration (`aws-config`'s chain,
//!    the source's) in the cluster's region. It lasts 15 minutes; librdkafka asks for a new
//!    one before it expires, and the positions reader makes one per connection.
//! 2. Making a token is asynchronous (credentials may be refreshed: SSO, a role, IMDS) and
//!    librdkafka asks from its own threads: the token is made on a thread of its own, on the
//!    run's Tokio runtime, so that no thread of that runtime is ever blocked on it.
//! 3. A token is a credential: it is never logged, printed or kept; a failure to make one
//!    names the region and what the credentials chain said.

use std::time::Duration;

use aws_config::Region;
use aws_credential_types::provider::SharedCredentialsProvider;

/// A token is made within this time, or the attempt fails (rule 2).
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The principal librdkafka names a token's holder by; MSK takes the identity from the
/// signature, not from it.
const PRINCIPAL: &str = "ddbpipe";

/// What makes MSK IAM tokens: the cluster's region and the run's credentials (rule 1).
#[derive(Clone)]
pub struct MskIam {
    region: String,
    credentials: SharedCredentialsProvider,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for MskIam {
    // Rule 3: the region only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MskIam({})", self.region)
    }
}

/// A token and when it expires (milliseconds since the Unix epoch).
pub struct Token {
    /// The token (a credential: rule 3).
    pub value: String,
    /// Its expiry.
    pub expires_at_ms: i64,
}

impl MskIam {
    /// Tokens for a cluster in `region`, signed with `credentials`, made on the runtime the
    /// caller runs in (rule 2).
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn new(region: impl Into<String>, credentials: SharedCredentialsProvider) -> MskIam {
        MskIam {
            region: region.into(),
            credentials,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The cluster's region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// A new token (rule 1).
    pub async fn token(&self) -> Result<Token, String> {
        let made = aws_msk_iam_sasl_signer::generate_auth_token_from_credentials_provider(
            Region::new(self.region.clone()),
            self.credentials.clone(),
        );
        match tokio::time::timeout(TOKEN_TIMEOUT, made).await {
            Ok(Ok((value, expires_at_ms))) => Ok(Token {
                value,
                expires_at_ms,
            }),
            Ok(Err(error)) => Err(format!(
                "cannot make an MSK IAM token for region {}: {}",
                self.region,
                ddbpipe_source::aws::causes(&error)
            )),
            Err(_) => Err(format!(
                "cannot make an MSK IAM token for region {}: no credentials within {}s",
                self.region,
                TOKEN_TIMEOUT.as_secs()
            )),
        }
    }

    /// [`MskIam::token`] from a thread that is not the runtime's (librdkafka's), made on a
    /// thread of its own (rule 2).
    pub fn token_blocking(&self) -> Result<Token, String> {
        let this = self.clone();
        std::thread::scope(|scope| {
            scope
                .spawn(move || this.runtime.block_on(this.token()))
                .join()
                .unwrap_or_else(|_| Err("the MSK IAM token's thread panicked".to_string()))
        })
    }

    /// librdkafka's answer to its token refresh (rules 1–3).
    pub(crate) fn oauth_token(&self) -> Result<rdkafka::client::OAuthToken, String> {
        let token = self.token_blocking()?;
        Ok(rdkafka::client::OAuthToken {
            token: token.value,
            principal_name: PRINCIPAL.to_string(),
            lifetime_ms: token.expires_at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::Credentials;

    fn static_credentials() -> SharedCredentialsProvider {
        SharedCredentialsProvider::new(Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        ))
    }

    /// The token is the base64url of a presigned `kafka-cluster:Connect` request to the
    /// region's MSK endpoint, signed for `kafka-cluster` in that region, lasting 15 minutes;
    /// the secret key is in none of it, nor in its debug form.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_token_is_a_presigned_connect_request_of_the_region() {
        use base64::Engine as _;
        let tokens = MskIam::new("eu-west-1", static_credentials());
        let token = tokens.token_blocking().unwrap();
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token.value)
            .unwrap();
        let url = String::from_utf8(url).unwrap();
        assert!(
            url.starts_with(
                "https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&"
            ),
            "{url}"
        );
        for part in [
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "X-Amz-Credential=AKIDEXAMPLE%2F",
            "%2Feu-west-1%2Fkafka-cluster%2Faws4_request",
            "X-Amz-Expires=900",
            "X-Amz-Signature=",
        ] {
            assert!(url.contains(part), "{part} in {url}");
        }
        assert!(!url.contains("wJalrXUtnFEMI"), "{url}");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!((token.expires_at_ms - now_ms - 900_000).abs() < 5_000);
        assert_eq!(format!("{tokens:?}"), "MskIam(eu-west-1)");
    }
}
