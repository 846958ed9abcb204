//! `source.discover` (docs/config.md §1.5): the tables a pipeline reads, found by name pattern
//! and tag instead of listed. Here the section and its matching rules; the lookup itself
//! (`ListTables`, `DescribeTable`, `ListTagsOfResource`) is `crate::discover::discovered`.

use std::collections::BTreeMap;

use ddbpipe_source::config::ConfigError;

use crate::yaml::fields::{Fields, convert};
use crate::yaml::schema::{Field, Shape, defaulted, of, optional};
use crate::yaml::types::FromYaml;

/// `interval_secs` unset: look again every five minutes.
pub const DEFAULT_INTERVAL_SECS: u64 = 300;

/// The keys of `source.discover`.
pub(super) static DISCOVER: &[Field] = &[
    optional(
        "names",
        of::<Vec<String>>(),
        "Glob patterns on table names (* any run of characters, ? one): a table matching any \
         is read.",
    ),
    optional(
        "tags",
        Shape::Map(<String as FromYaml>::schema),
        "Tags a table must all have, with these values (ListTagsOfResource).",
    ),
    optional(
        "exclude",
        of::<Vec<String>>(),
        "Glob patterns of table names never read, whatever else matches.",
    ),
    defaulted(
        "interval_secs",
        of::<u64>(),
        || serde_json::json!(DEFAULT_INTERVAL_SECS),
        "How often a run looks again for new tables (1..=86400 s).",
    ),
];

/// How a pipeline finds its tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Glob patterns on table names; a table matching any is taken. Empty: every name.
    pub names: Vec<String>,
    /// Tags a table must all have, with these values. Empty: no tag is asked.
    pub tags: BTreeMap<String, String>,
    /// Glob patterns of names never taken.
    pub exclude: Vec<String>,
    /// How often a run looks again for tables, in seconds.
    pub interval_secs: u64,
}

impl Discovery {
    /// Whether the table named `name` is taken by its name (its tags are asked apart).
    pub fn takes_name(&self, name: &str) -> bool {
        let named = self.names.is_empty() || self.names.iter().any(|glob| matches(glob, name));
        named && !self.exclude.iter().any(|glob| matches(glob, name))
    }

    /// Whether `tags` holds every tag asked, with its value.
    pub fn takes_tags(&self, tags: &[(String, String)]) -> bool {
        self.tags.iter().all(|(key, value)| {
            tags.iter()
                .any(|(have_key, have_value)| have_key == key && have_value == value)
        })
    }

    /// What it looks for, for messages: `names orders-*, tags env=prod, excluding *-tmp`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.names.is_empty() {
            parts.push(format!("names {}", self.names.join(", ")));
        }
        if !self.tags.is_empty() {
            let tags: Vec<String> = self.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
            parts.push(format!("tags {}", tags.join(", ")));
        }
        if !self.exclude.is_empty() {
            parts.push(format!("excluding {}", self.exclude.join(", ")));
        }
        parts.join("; ")
    }
}

/// Reads `source.discover`.
pub(super) fn read(mut f: Fields<'_>) -> Discovery {
    let discovery = Discovery {
        names: f.get("names").unwrap_or_default(),
        tags: f.map("tags", |report, path, value| {
            convert::<String>(report, path, value)
        }),
        exclude: f.get("exclude").unwrap_or_default(),
        interval_secs: f.or("interval_secs", DEFAULT_INTERVAL_SECS),
    };
    f.finish();
    discovery
}

/// The rules of `source.discover`: something to look for, patterns that can match a table
/// name, and an interval of 1 s to a day.
pub(super) fn validate(discovery: &Discovery, errors: &mut Vec<ConfigError>) {
    let mut fail = |path: String, message: String| errors.push(ConfigError::new(path, message));
    if discovery.names.is_empty() && discovery.tags.is_empty() {
        fail(
            "source.discover".into(),
            "discover needs names or tags to look for (a pattern of \"*\" takes every table)"
                .into(),
        );
    }
    for (field, globs) in [("names", &discovery.names), ("exclude", &discovery.exclude)] {
        for (index, glob) in globs.iter().enumerate() {
            if let Some(problem) = glob_problem(glob) {
                fail(
                    format!("source.discover.{field}[{index}]"),
                    format!("'{glob}' {problem}"),
                );
            }
        }
    }
    for key in discovery.tags.keys() {
        if key.is_empty() {
            fail(
                "source.discover.tags".into(),
                "a tag key must not be empty".into(),
            );
        }
    }
    if !(1..=86_400).contains(&discovery.interval_secs) {
        fail(
            "source.discover.interval_secs".into(),
            format!(
                "interval_secs must be 1..=86400 (got {})",
                discovery.interval_secs
            ),
        );
    }
}

/// Why `glob` can match no table name: empty, or a character no name holds.
fn glob_problem(glob: &str) -> Option<&'static str> {
    if glob.is_empty() {
        return Some("is empty: it matches no table");
    }
    let valid = glob
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '*' | '?'));
    (!valid).then_some(
        "holds a character no table name has: patterns are A-Z a-z 0-9 _ . - with * (any run \
         of characters) and ? (one)",
    )
}

/// Whether `name` matches the glob `pattern`: `*` any run of characters (none too), `?` one
/// character, every other character itself (names are ASCII).
pub fn matches(pattern: &str, name: &str) -> bool {
    let (pattern, name) = (pattern.as_bytes(), name.as_bytes());
    let (mut p, mut n) = (0, 0);
    // Where the last `*` was, and the name position it has taken up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                // The last `*` takes one more character, and the rest is tried again.
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        let cases = [
            ("orders-*", "orders-2024", true),
            ("orders-*", "orders-", true),
            ("orders-*", "orders", false),
            ("orders-*", "old-orders-1", false),
            ("*", "anything", true),
            ("*-tmp", "orders-tmp", true),
            ("*-tmp", "orders-tmp2", false),
            ("billing_?", "billing_1", true),
            ("billing_?", "billing_12", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("a*b*c", "abcbc", true),
            ("*a*", "bab", true),
            ("orders", "orders", true),
            ("orders", "Orders", false),
            ("**", "", true),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(matches(pattern, name), expected, "{pattern} against {name}");
        }
    }

    #[test]
    fn names_and_excludes_and_tags_decide_together() {
        let discovery = Discovery {
            names: vec!["orders-*".into(), "billing_*".into()],
            tags: BTreeMap::from([("env".into(), "prod".into())]),
            exclude: vec!["*-tmp".into()],
            interval_secs: 60,
        };
        assert!(discovery.takes_name("orders-eu"));
        assert!(discovery.takes_name("billing_2024"));
        assert!(!discovery.takes_name("orders-tmp"), "excluded");
        assert!(!discovery.takes_name("customers"), "matches no pattern");
        let tags = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(discovery.takes_tags(&tags(&[("env", "prod"), ("team", "a")])));
        assert!(!discovery.takes_tags(&tags(&[("env", "dev")])));
        assert!(!discovery.takes_tags(&tags(&[])));
        let any_name = Discovery {
            names: Vec::new(),
            ..discovery
        };
        assert!(
            any_name.takes_name("whatever"),
            "no names: every name, tags decide"
        );
    }
}
