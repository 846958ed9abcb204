//! Endpoint URLs, and the one rule by which ddbpipe shows any URL it prints, logs or stores
//! (docs/config.md §1.4).
//!
//! An endpoint URL may carry secrets: a user-info (`http://user:password@host`) or a
//! presigned-style query (`?X-Amz-Signature=…`). Every output shows it masked: log lines,
//! error messages and hints, `--json` answers, the state identity (state files, keyed state
//! tables, the leader row of a shared run). Only the code that builds an AWS client reads the
//! URL as given ([`EndpointUrl::expose`]).
//!
//! # Masking
//! 1. Everything after `://` up to its **last** `@` is the user-info, shown as `***` (an
//!    unencoded `/`, `?`, `#` or `@` in a password stays hidden; when a query value holds an
//!    `@`, the text before it is hidden too: more is hidden, never less).
//! 2. Each query parameter keeps its name and shows `***` for its value
//!    (`?X-Amz-Signature=***`); a parameter without `=` is `***`. A fragment is `#***`.
//! 3. Scheme, host, port and path are kept, so a URL without user-info, query or fragment
//!    shows as it is: the state fingerprint of such an endpoint is the one it always had.
//! 4. Masking a masked URL changes nothing. Identities stored before masking are masked when
//!    read, so they compare equal to the ones a run makes now, and the next write stores them
//!    masked.
//! 5. Text without `://` is masked as if it followed one.
//!
//! [`mask_urls_in`] applies the rules to every `scheme://…` in a message: the AWS SDK's
//! errors may quote an endpoint (`Custom endpoint `…` was not a valid URI`).
//!
//! PostgreSQL connection strings are not masked here: `ddbpipe_keyed`'s `conninfo` hides
//! exactly what its own parse (the one that connects, with libpq's rules and its key=value
//! form) reads as a password, and keeps the other parameters (`sslmode`, `options`) visible.
//!
//! # Validation
//! An endpoint URL is `http://` or `https://` (any case), names a host after its user-info,
//! and has no query or fragment: the SDK ignores a query of a DynamoDB endpoint (logging it)
//! and S3's endpoint rules refuse one, so a URL with one is refused when the config is read,
//! by `check` as by `run`.

use std::fmt;
use std::str::FromStr;

/// What masked text shows in place of a secret.
const HIDDEN: &str = "***";

/// `url` with its user-info and every query value and fragment hidden (rules 1–5).
pub fn mask_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    let rest = match rest.rfind('@') {
        Some(at) => {
            out.push_str(HIDDEN);
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, _)) => (rest, true),
        None => (rest, false),
    };
    let (base, query) = match rest.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (rest, None),
    };
    out.push_str(base);
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}={HIDDEN}"),
                None if pair.is_empty() => String::new(),
                None => HIDDEN.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    if fragment {
        out.push('#');
        out.push_str(HIDDEN);
    }
    out
}

/// `text` with every URL in it (a `scheme://` and what follows, up to white space, a quote
/// or a backtick) masked by [`mask_url`].
pub fn mask_urls_in(text: &str) -> String {
    let ends_url = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>');
    let is_scheme = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let separator = from + found;
        let start = text[copied..separator]
            .rfind(|c: char| !is_scheme(c))
            .map_or(copied, |i| {
                let c = text[copied + i..].chars().next().map_or(1, char::len_utf8);
                copied + i + c
            });
        let end = text[separator..]
            .find(ends_url)
            .map_or(text.len(), |i| separator + i);
        out.push_str(&text[copied..start]);
        out.push_str(&mask_url(&text[start..end]));
        copied = end;
        from = end.max(separator + 3);
    }
    out.push_str(&text[copied..]);
    out
}

/// An endpoint URL of the AWS clients (`source.endpoint_url`, `snapshot.s3_endpoint_url`,
/// `--endpoint-url`), valid by the rules of the module docs. It prints masked in logs,
/// errors and `Debug` output; only the code that builds a client calls
/// [`EndpointUrl::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointUrl(String);

/// Why a text is not an endpoint URL. The message never quotes the text (it may hold a
/// password or a signature).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadEndpoint(String);

impl EndpointUrl {
    /// Checks `text` against the rules of the module docs.
    pub fn new(text: impl Into<String>) -> Result<Self, BadEndpoint> {
        let text = text.into();
        let scheme_end = text.find("://");
        let scheme = scheme_end.map(|end| text[..end].to_ascii_lowercase());
        let (Some(end), Some("http" | "https")) = (scheme_end, scheme.as_deref()) else {
            return Err(BadEndpoint(
                "an endpoint URL begins with http:// or https://, e.g. http://localhost:8000"
                    .into(),
            ));
        };
        let rest = &text[end + 3..];
        if rest.contains('?') || rest.contains('#') {
            return Err(BadEndpoint(
                "an endpoint URL takes no query or fragment (the AWS SDK ignores a \
                 DynamoDB endpoint's query and S3 refuses one): remove the part from '?' or '#' \
                 (percent-encode one in a password: %3F, %23)"
                    .into(),
            ));
        }
        let host = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
        if host.is_empty() || host.starts_with(['/', ':']) {
            return Err(BadEndpoint(
                "an endpoint URL names a host, e.g. http://localhost:8000".into(),
            ));
        }
        Ok(EndpointUrl(text))
    }

    /// The URL as given, for the SDK. Never log or format the result: show
    /// [`EndpointUrl::masked`] (or the URL's `Display`) instead.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its user-info hidden ([`mask_url`]).
    pub fn masked(&self) -> String {
        mask_url(&self.0)
    }
}

impl FromStr for EndpointUrl {
    type Err = BadEndpoint;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        EndpointUrl::new(text)
    }
}

impl fmt::Display for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl fmt::Debug for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointUrl({})", self.masked())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_query_values_and_fragments_are_hidden() {
        for (url, masked) in [
            (
                "http://user:s3cr3t@127.0.0.1:8000",
                "http://***@127.0.0.1:8000",
            ),
            ("https://token@host/path", "https://***@host/path"),
            ("http://u:p@ss/w?rd#x@host:1/p", "http://***@host:1/p"),
            (
                "https://s3.local/?X-Amz-Signature=abc&X-Amz-Credential=k&flag",
                "https://s3.local/?X-Amz-Signature=***&X-Amz-Credential=***&***",
            ),
            ("http://h/p#frag", "http://h/p#***"),
            ("user:pw@host:8000", "***@host:8000"),
        ] {
            assert_eq!(mask_url(url), masked, "{url}");
        }
    }

    #[test]
    fn a_url_without_secrets_shows_as_it_is_and_masking_twice_changes_nothing() {
        for url in [
            "http://127.0.0.1:8000",
            "https://dynamodb.eu-west-1.amazonaws.com/",
            "http://[::1]:8000/base",
        ] {
            assert_eq!(mask_url(url), url);
        }
        for url in ["http://u:p@h?a=1&b#c", "http://@h?", "x://a@b@c"] {
            let once = mask_url(url);
            assert_eq!(mask_url(&once), once, "{url}");
        }
    }

    #[test]
    fn every_url_in_a_message_is_masked() {
        let text = "Custom endpoint `http://u:s3cr3t@h:99999/?sig=abc` was not a valid URI; \
                    also 'https://k@s3.local' and x+y://a:b@c, done";
        assert_eq!(
            mask_urls_in(text),
            "Custom endpoint `http://***@h:99999/?sig=***` was not a valid URI; \
             also 'https://***@s3.local' and x+y://***@c, done"
        );
        assert_eq!(mask_urls_in("no url here"), "no url here");
        assert_eq!(mask_urls_in("ends with ://"), "ends with ://");
        assert_eq!(mask_urls_in("é://a@b"), "é://***@b");
    }

    #[test]
    fn endpoint_urls_are_http_with_a_host_and_no_query() {
        assert!(EndpointUrl::new("http://localhost:8000").is_ok());
        assert!(EndpointUrl::new("HTTPS://u:p@h").is_ok());
        for bad in [
            "localhost:8000",
            "ftp://h",
            "http://",
            "http://u:s3cr3t@",
            "http://u:s3cr3t@:80",
            "http://h/?X-Amz-Signature=s3cr3t",
            "http://h#s3cr3t",
        ] {
            let error = EndpointUrl::new(bad).unwrap_err();
            assert!(!error.to_string().contains("s3cr3t"), "{bad}: {error}");
        }
        let url = EndpointUrl::new("http://u:s3cr3t@h:1").unwrap();
        assert_eq!(url.to_string(), "http://***@h:1");
        assert_eq!(format!("{url:?}"), "EndpointUrl(http://***@h:1)");
        assert_eq!(url.expose(), "http://u:s3cr3t@h:1");
    }
}
