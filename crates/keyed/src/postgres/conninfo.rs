//! Connection strings: one parse, used both to connect and to show the string without its
//! password, so the two can never disagree about where the password is.
//!
//! # The URL form (`postgres://` or `postgresql://`)
//! 1. The query begins at the first `?` that is followed by a parameter name (letters, digits,
//!    `_`) and `=`, and that comes after the userinfo (rule 2). A `?` inside a password is
//!    therefore part of the password unless the password holds `?name=`.
//! 2. The userinfo ends at the **last** `@` before the query (an `@` inside a query value such
//!    as `application_name=a@b` is not a userinfo end). So an unencoded `@`, `/`, `?` or `:` in
//!    the password stays in the password. The user name ends at the first `:`.
//! 3. After the userinfo come the hosts (`h1:5432,[::1]:5433`), up to the first `/` or `?`;
//!    then `/dbname` up to the query.
//! 4. The query is `name=value` pairs joined by `&`; every name must be a known parameter.
//! 5. Userinfo, hosts, dbname and query values are percent-decoded (`%40` is `@`).
//!
//! # The key=value form (libpq)
//! `key = value` pairs separated by white space; a value is either a run of non-blank
//! characters or single-quoted, and `\` escapes the next character in both. Every key must be a
//! known parameter.
//!
//! # Secrets
//! The parse records where every password value lies in the original string. [`redact`] puts
//! `***` there; when the string does not parse, everything from the point the parse stopped is
//! hidden as well. Errors name keys and positions, never a value.

use std::ops::Range;
use std::str::FromStr;

use tokio_postgres::Config;

/// The parameters ddbpipe's driver knows (libpq's names).
const KNOWN: &[&str] = &[
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// The libpq environment variables ddbpipe honours, with the parameter each one sets: a
/// default for a parameter the connection string does not name (as libpq does).
pub const ENVIRONMENT: &[(&str, &str)] = &[
    ("PGHOST", "host"),
    ("PGHOSTADDR", "hostaddr"),
    ("PGPORT", "port"),
    ("PGDATABASE", "dbname"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGOPTIONS", "options"),
    ("PGAPPNAME", "application_name"),
    ("PGSSLMODE", "sslmode"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
    ("PGCHANNELBINDING", "channel_binding"),
];

/// A parsed connection string: its parameters in order (a later one wins), and where the
/// password values are in the original text.
#[derive(Debug)]
pub(crate) struct ConnInfo<'a> {
    text: &'a str,
    params: Vec<(&'static str, String)>,
    secrets: Vec<Range<usize>>,
}

/// A connection string that does not parse.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unparsable {
    /// What is wrong, naming a key or a position, never a value.
    pub problem: String,
    /// The string with its passwords and everything from the failing point on hidden.
    pub redacted: String,
}

impl<'a> ConnInfo<'a> {
    /// Parses the URL or the key=value form (see the module docs).
    pub(crate) fn parse(text: &'a str) -> Result<Self, Unparsable> {
        let mut parsed = ConnInfo {
            text,
            params: Vec::new(),
            secrets: Vec::new(),
        };
        let trimmed = text.trim_start();
        let start = text.len() - trimmed.len();
        let body = ["postgres://", "postgresql://"]
            .iter()
            .find(|scheme| trimmed.starts_with(**scheme))
            .map(|scheme| start + scheme.len());
        let result = match body {
            Some(body) => parsed.parse_url(body),
            None => parsed.parse_key_values(),
        };
        match result {
            Ok(()) => Ok(parsed),
            Err((problem, at)) => Err(Unparsable {
                problem,
                redacted: parsed.masked(Some(at)),
            }),
        }
    }

    /// The string with `***` for every password value.
    pub(crate) fn redacted(&self) -> String {
        self.masked(None)
    }

    /// The driver's configuration. Fails naming the parameter whose value the driver rejects.
    pub(crate) fn config(&self) -> Result<Config, String> {
        self.config_with(&[])
    }

    /// The driver's configuration, with `defaults` (parameter, value: from [`ENVIRONMENT`])
    /// for the parameters the string does not name. Fails naming the parameter whose value
    /// the driver rejects.
    pub(crate) fn config_with(&self, defaults: &[(&str, String)]) -> Result<Config, String> {
        let named = |key: &str| self.params.iter().any(|(k, _)| *k == key);
        let inherited: Vec<(&str, &String)> = defaults
            .iter()
            .filter(|(key, _)| !named(key))
            .map(|(key, value)| (*key, value))
            .collect();
        // The driver parses a key=value string we write from our parse: quoted values, `\` and
        // `'` escaped, so it reads exactly the values we found.
        let mut canonical = String::new();
        let all = inherited
            .iter()
            .copied()
            .chain(self.params.iter().map(|(key, value)| (*key, value)));
        for (key, value) in all {
            canonical.push_str(key);
            canonical.push_str("='");
            for c in value.chars() {
                if matches!(c, '\\' | '\'') {
                    canonical.push('\\');
                }
                canonical.push(c);
            }
            canonical.push_str("' ");
        }
        // The driver's messages name the option ("invalid value for option `port`").
        Config::from_str(&canonical).map_err(|e| match std::error::Error::source(&e) {
            Some(cause) => cause.to_string(),
            None => e.to_string(),
        })
    }

    fn masked(&self, hide_from: Option<usize>) -> String {
        let end = hide_from.unwrap_or(self.text.len());
        let mut out = String::with_capacity(self.text.len());
        let mut copied = 0;
        for secret in self.secrets.iter().filter(|s| s.start < end) {
            out.push_str(&self.text[copied..secret.start.max(copied)]);
            out.push_str("***");
            copied = secret.end.min(end);
        }
        out.push_str(&self.text[copied..end]);
        if hide_from.is_some() {
            out.push_str("***");
        }
        out
    }

    fn push(&mut self, key: &str, value: String, span: Range<usize>) -> Result<(), String> {
        let Some(known) = KNOWN.iter().find(|k| **k == key) else {
            return Err(format!(
                "unknown parameter '{}'; the known ones are {}",
                key.escape_debug(),
                KNOWN.join(", ")
            ));
        };
        if *known == "password" {
            self.secrets.push(span);
        }
        self.params.push((known, value));
        Ok(())
    }

    /// Rules 1–5 of the module docs; `body` is where the text after `://` begins.
    fn parse_url(&mut self, body: usize) -> Result<(), (String, usize)> {
        let text = self.text;
        let rest = &text[body..];
        let query = query_start(rest);
        let before_query = &rest[..query.unwrap_or(rest.len())];
        let mut at = body;
        if let Some(userinfo_end) = before_query.rfind('@') {
            let userinfo = &rest[..userinfo_end];
            let (user, password) = match userinfo.find(':') {
                Some(colon) => (
                    &userinfo[..colon],
                    Some((colon + 1, &userinfo[colon + 1..])),
                ),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                let user = decode(user, "the user name").map_err(|p| (p, body))?;
                self.params.push(("user", user));
            }
            if let Some((offset, password)) = password {
                let span = body + offset..body + userinfo_end;
                // Hide the password even when it does not decode.
                self.secrets.push(span.clone());
                let password = decode(password, "the password").map_err(|p| (p, span.end))?;
                self.params.push(("password", password));
            }
            at = body + userinfo_end + 1;
        }
        let query_at = query.map_or(text.len(), |q| body + q);
        let hosts_end = text[at..query_at].find('/').map_or(query_at, |i| at + i);
        self.parse_hosts(at, hosts_end)?;
        if hosts_end < query_at {
            let dbname = &text[hosts_end + 1..query_at];
            if !dbname.is_empty() {
                let dbname = decode(dbname, "the database name").map_err(|p| (p, hosts_end))?;
                self.params.push(("dbname", dbname));
            }
        }
        let Some(_) = query else {
            return Ok(());
        };
        let mut start = query_at + 1;
        for (n, pair) in text[query_at + 1..].split('&').enumerate() {
            let span = start..start + pair.len();
            start = span.end + 1;
            if pair.is_empty() {
                continue;
            }
            let Some((key, value)) = pair.split_once('=') else {
                return Err((
                    format!(
                        "query parameter {} has no '='; percent-encode '@', '/', '?' and ':' in the \
                         user name and password (%40, %2F, %3F, %3A)",
                        n + 1
                    ),
                    span.start,
                ));
            };
            let value_span = span.start + key.len() + 1..span.end;
            // A failure hides the text from the pair on, its value included.
            let decoded = decode(value, "a query value").map_err(|p| (p, span.start))?;
            self.push(key, decoded, value_span)
                .map_err(|p| (p, span.start))?;
        }
        Ok(())
    }

    /// `h1:5432,[::1]:5433`, percent-decoded, as the `host` and `port` parameters.
    fn parse_hosts(&mut self, start: usize, end: usize) -> Result<(), (String, usize)> {
        let hosts = &self.text[start..end];
        if hosts.is_empty() {
            return Ok(());
        }
        let mut names = Vec::new();
        let mut ports = Vec::new();
        for chunk in hosts.split(',') {
            let (host, port) = match chunk.strip_prefix('[') {
                Some(bracketed) => {
                    let Some((host, after)) = bracketed.split_once(']') else {
                        return Err(("an IPv6 host without its closing ']'".into(), start));
                    };
                    match after.strip_prefix(':') {
                        Some(port) => (host, Some(port)),
                        None if after.is_empty() => (host, None),
                        None => return Err(("text after an IPv6 host's ']'".into(), start)),
                    }
                }
                None => match chunk.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (chunk, None),
                },
            };
            names.push(decode(host, "a host").map_err(|p| (p, start))?);
            ports.push(decode(port.unwrap_or(""), "a port").map_err(|p| (p, start))?);
        }
        self.params.push(("host", names.join(",")));
        if ports.iter().any(|p| !p.is_empty()) {
            self.params.push(("port", ports.join(",")));
        }
        Ok(())
    }

    /// The libpq key=value form.
    fn parse_key_values(&mut self) -> Result<(), (String, usize)> {
        let text = self.text;
        let mut chars = text.char_indices().peekable();
        let skip_blanks = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
            while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        };
        loop {
            skip_blanks(&mut chars);
            let Some(&(key_start, _)) = chars.peek() else {
                return Ok(());
            };
            while chars
                .next_if(|(_, c)| *c != '=' && !c.is_whitespace())
                .is_some()
            {}
            let key_end = chars.peek().map_or(text.len(), |(i, _)| *i);
            let key = &text[key_start..key_end];
            skip_blanks(&mut chars);
            if chars.next_if(|(_, c)| *c == '=').is_none() {
                let problem = if KNOWN.contains(&key) {
                    format!("'{key}' has no '=' and value")
                } else {
                    format!("a word at byte {key_start} is not a key=value pair")
                };
                return Err((problem, key_start));
            }
            skip_blanks(&mut chars);
            let value_start = chars.peek().map_or(text.len(), |(i, _)| *i);
            let mut value = String::new();
            let value_end = if chars.next_if(|(_, c)| *c == '\'').is_some() {
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next().map(|(_, c)| c)),
                        '\'' => {
                            end = Some(i + 1);
                            break;
                        }
                        c => value.push(c),
                    }
                }
                let Some(end) = end else {
                    if key == "password" {
                        self.secrets.push(value_start..text.len());
                    }
                    return Err((
                        format!("the quoted value of '{key}' has no closing quote"),
                        value_start,
                    ));
                };
                end
            } else {
                while let Some(&(_, c)) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    chars.next();
                    if c == '\\' {
                        value.extend(chars.next().map(|(_, c)| c));
                    } else {
                        value.push(c);
                    }
                }
                chars.peek().map_or(text.len(), |(i, _)| *i)
            };
            self.push(key, value, value_start..value_end)
                .map_err(|problem| (problem, key_start))?;
        }
    }
}

/// The string with every password shown as `***` (and, when it does not parse, everything from
/// where the parse stopped).
pub(crate) fn redact(text: &str) -> String {
    match ConnInfo::parse(text) {
        Ok(parsed) => parsed.redacted(),
        Err(unparsable) => unparsable.redacted,
    }
}

/// Where the query begins in the text after `://` (rule 1): the first `?name=` after the last
/// `@` that precedes every `?name=`.
fn query_start(rest: &str) -> Option<usize> {
    let is_query = |q: usize| {
        let after = &rest[q + 1..];
        let name = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        name > 0 && after[name..].starts_with('=')
    };
    let first_query = rest
        .char_indices()
        .find(|&(i, c)| c == '?' && is_query(i))
        .map(|(i, _)| i);
    let userinfo_end = rest[..first_query.unwrap_or(rest.len())].rfind('@');
    let from = userinfo_end.map_or(0, |at| at + 1);
    // After the userinfo, the query is the first `?` of all (a dbname holds no `?`).
    rest[from..].find('?').map(|q| from + q)
}

fn decode(text: &str, what: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("{what} is not UTF-8 after percent-decoding"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(text: &str) -> Vec<(&'static str, String)> {
        ConnInfo::parse(text).unwrap().params
    }

    fn pairs(list: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        list.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn an_unencoded_at_sign_in_the_password_belongs_to_the_password() {
        let url = "postgres://app:pa@Wq7xK9zT@db.example.com:6432/app?sslmode=disable";
        assert_eq!(
            params(url),
            pairs(&[
                ("user", "app"),
                ("password", "pa@Wq7xK9zT"),
                ("host", "db.example.com"),
                ("port", "6432"),
                ("dbname", "app"),
                ("sslmode", "disable"),
            ])
        );
        assert_eq!(
            redact(url),
            "postgres://app:***@db.example.com:6432/app?sslmode=disable"
        );
        let config = ConnInfo::parse(url).unwrap().config().unwrap();
        assert_eq!(config.get_password(), Some(&b"pa@Wq7xK9zT"[..]));
        assert_eq!(
            config.get_hosts(),
            &[tokio_postgres::config::Host::Tcp("db.example.com".into())]
        );
        assert_eq!(config.get_ports(), &[6432]);
    }

    #[test]
    fn colons_slashes_and_question_marks_stay_in_the_password() {
        for (url, password) in [
            ("postgres://app:a:b:c@db/app", "a:b:c"),
            ("postgres://app:p@ss/w?rd@db/app", "p@ss/w?rd"),
            ("postgresql://app:x?y@db/app?application_name=a@b", "x?y"),
        ] {
            let parsed = params(url);
            assert!(parsed.contains(&("password", password.into())), "{url}");
            assert!(parsed.contains(&("host", "db".into())), "{url}");
            assert!(!redact(url).contains(password), "{url}");
        }
        assert!(
            params("postgresql://app:x?y@db/app?application_name=a@b")
                .contains(&("application_name", "a@b".into()))
        );
    }

    #[test]
    fn percent_encoded_parts_are_decoded_and_their_text_hidden() {
        let url = "postgres://us%40er:p%40ss%3Aw%2Frd@%2Ftmp%2Fsock/my%20db?options=-c%20x%3D1";
        assert_eq!(
            params(url),
            pairs(&[
                ("user", "us@er"),
                ("password", "p@ss:w/rd"),
                ("host", "/tmp/sock"),
                ("dbname", "my db"),
                ("options", "-c x=1"),
            ])
        );
        assert_eq!(
            redact(url),
            "postgres://us%40er:***@%2Ftmp%2Fsock/my%20db?options=-c%20x%3D1"
        );
    }

    #[test]
    fn hosts_ports_and_query_passwords() {
        let url = "postgres://u@[::1]:5433,h2/db?password=s3cr%65t&host=h3";
        assert_eq!(
            params(url),
            pairs(&[
                ("user", "u"),
                ("host", "::1,h2"),
                ("port", "5433,"),
                ("dbname", "db"),
                ("password", "s3cret"),
                ("host", "h3"),
            ])
        );
        assert_eq!(
            redact(url),
            "postgres://u@[::1]:5433,h2/db?password=***&host=h3"
        );
        assert_eq!(
            redact("postgres://db/app?password=s3cret&application_name=a@b"),
            "postgres://db/app?password=***&application_name=a@b"
        );
    }

    #[test]
    fn key_values_with_quotes_and_escapes() {
        let text = r"host=db password = 'se cr\'e\\t' user=app dbname=x\ y";
        assert_eq!(
            params(text),
            pairs(&[
                ("host", "db"),
                ("password", r"se cr'e\t"),
                ("user", "app"),
                ("dbname", "x y"),
            ])
        );
        assert_eq!(redact(text), r"host=db password = *** user=app dbname=x\ y");
        let config = ConnInfo::parse(text).unwrap().config().unwrap();
        assert_eq!(config.get_password(), Some(&br"se cr'e\t"[..]));
        assert_eq!(config.get_dbname(), Some("x y"));
        assert_eq!(redact("password=pl\\ ain x"), "password=*** ***");
    }

    #[test]
    fn a_misspelled_key_is_named_without_its_value() {
        for text in [
            "host=db pasword=Wq7xK9zT user=app",
            "host=db pasword='Wq7 xK9zT' user=app",
            "postgres://app@db/app?pasword=Wq7xK9zT",
        ] {
            let error = ConnInfo::parse(text).unwrap_err();
            assert!(
                error.problem.starts_with("unknown parameter 'pasword'"),
                "{error:?}"
            );
            assert!(!error.problem.contains("Wq7"), "{error:?}");
            assert!(!error.redacted.contains("Wq7"), "{error:?}");
        }
        let error = ConnInfo::parse("host=db pasword=Wq7xK9zT").unwrap_err();
        assert_eq!(error.redacted, "host=db ***");
    }

    #[test]
    fn unparsable_strings_hide_everything_from_the_failing_point() {
        for (text, redacted) in [
            ("host='db password=s3cret", "host=***"),
            ("host=db password", "host=db ***"),
            ("host=db password='s3cret", "host=db password=***"),
            (
                "postgres://u:pw@db/app?sslmode=disable&junk",
                "postgres://u:***@db/app?sslmode=disable&***",
            ),
        ] {
            let error = ConnInfo::parse(text).unwrap_err();
            assert_eq!(error.redacted, redacted, "{text}");
            assert!(!error.problem.contains("s3cret"), "{error:?}");
        }
    }

    #[test]
    fn driver_errors_name_the_option_not_the_value() {
        let parsed = ConnInfo::parse("postgres://u:hunter22@db:notaport/app").unwrap();
        assert_eq!(parsed.redacted(), "postgres://u:***@db:notaport/app");
        let error = parsed.config().unwrap_err();
        assert!(error.contains("port"), "{error}");
        assert!(
            !error.contains("hunter22") && !error.contains("notaport"),
            "{error}"
        );
    }
}
