//! Typed columns (docs/sinks.md §7.9): attributes of an item read out of its JSON document into
//! values of a column type, losslessly, for the table destinations' `sink.columns`.
//!
//! # Rules
//! 1. **Paths.** A column's `path` names an attribute (`status`), an attribute of a map
//!    (`address.city`) or an element of a list (`tags[0]`, `lines[2].sku`). A name holding `.`,
//!    `[`, `]` or `"`, or an empty name, is written in double quotes (`"a.b".c`, `\"` and `\\`
//!    inside). A path starts with a name. Sets have no order: an index into a set is a
//!    mismatch.
//! 2. **Absent is null.** A missing attribute, a missing map entry, an index past a list's end
//!    and a `NULL` anywhere on the path give [`ColumnValue::Null`], never a mismatch. A step
//!    into a value that is not a map (for a name) or not a list (for an index) is a mismatch.
//! 3. **Documents in either format.** A typed document (§3.3) says each value's DynamoDB type.
//!    A plain document (§3.1, §3.7) is read as JSON: a string as `S`, a number as `N` (its
//!    digits as written), a boolean as `BOOL`, `null` as `NULL`, an array as `L`, an object as
//!    `M`. Because plain output writes a number no double holds as a string (§3.2), a string
//!    that is a number's text counts as that number for `numeric`, `bigint`, `double` and the
//!    epoch formats of `timestamptz`.
//! 4. **Conversions** ([`convert`], the one place they are decided):
//!    - `text`: `S` as is; `N` its digits as written; `BOOL` `true`/`false`; `B` base64
//!      (standard, padded). Maps, lists and sets are mismatches (use `jsonb`).
//!    - `numeric`: an `N` DynamoDB can hold (38 significant digits, magnitude 1E-130 to
//!      9.99…E+125), exactly its text (surrounding whitespace trimmed).
//!    - `bigint`: an `N` whose value is an integer within i64 (`1.0`, `1E+3` included); any
//!      other number is a mismatch, never a rounded value.
//!    - `double`: an `N` whose nearest double prints back (shortest round trip) to the same
//!      value (`0.1`, `1.5e300`); a number with more digits than a double holds is a mismatch.
//!      `-0` is `0.0`: DynamoDB numbers have no negative zero.
//!    - `boolean`: `BOOL` only.
//!    - `timestamptz` (UTC, microseconds): per [`TimeFormat`]. `iso8601`: an `S` in RFC 3339 /
//!      ISO 8601 ([`parse_timestamp`]: `2024-05-01T12:30:00Z`,
//!      `2024-05-01T12:30:00.123456+02:00`, a space for `T`; without an offset it is UTC; a
//!      date alone is midnight UTC). `epoch_seconds` / `epoch_millis`: an `N` (fractions and
//!      negatives allowed). A time with digits below the microsecond, or outside years
//!      1–9999 (UTC), is a mismatch, never a rounded value.
//!    - `jsonb`: any value, as plain JSON with every number a JSON number of its own digits
//!      (§3.7); sets are arrays, binary is base64.
//! 5. **Mismatches** are values, not errors: the destination decides (`on_type_mismatch`).
//!    A [`Mismatch`] names the DynamoDB type found and why it does not fit, never the value.
//!
//! # Layout
//! `path` parses and prints paths (rule 1), `read` walks documents (rules 2 and 3),
//! `convert` decides conversions (rule 4), `time` reads and writes times.

use std::borrow::Cow;
use std::fmt;

mod convert;
mod path;
mod read;
mod time;

pub use convert::convert;
pub use path::ColumnPath;
pub use read::ColumnReader;
pub use time::{parse_timestamp, timestamp_text};

/// The type of a typed column (`type:` of an entry of `sink.columns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// `text`: PostgreSQL `text`, SQLite `TEXT`.
    Text,
    /// `numeric`: PostgreSQL `numeric`, SQLite `TEXT` holding the exact digits.
    Numeric,
    /// `bigint`: PostgreSQL `bigint`, SQLite `INTEGER`.
    Bigint,
    /// `double`: PostgreSQL `double precision`, SQLite `REAL`.
    Double,
    /// `boolean`: PostgreSQL `boolean`, SQLite `INTEGER` 0/1.
    Boolean,
    /// `timestamptz`: PostgreSQL `timestamptz`, SQLite `TEXT` in RFC 3339, UTC, six fraction
    /// digits (`2024-05-01T12:30:00.000000Z`: text order is time order).
    Timestamptz,
    /// `jsonb`: PostgreSQL `jsonb`, SQLite `TEXT` holding the JSON.
    Jsonb,
}

impl ColumnType {
    /// Every type, in the order the docs list them.
    pub const ALL: [ColumnType; 7] = [
        ColumnType::Text,
        ColumnType::Numeric,
        ColumnType::Bigint,
        ColumnType::Double,
        ColumnType::Boolean,
        ColumnType::Timestamptz,
        ColumnType::Jsonb,
    ];

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::Text => "text",
            ColumnType::Numeric => "numeric",
            ColumnType::Bigint => "bigint",
            ColumnType::Double => "double",
            ColumnType::Boolean => "boolean",
            ColumnType::Timestamptz => "timestamptz",
            ColumnType::Jsonb => "jsonb",
        }
    }

    /// The type of a config spelling (`double precision` is `double`).
    pub fn parse(text: &str) -> Option<ColumnType> {
        match text {
            "double precision" => Some(ColumnType::Double),
            _ => ColumnType::ALL.into_iter().find(|kind| kind.name() == text),
        }
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a `timestamptz` column reads its attribute (`format:` of a column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TimeFormat {
    /// `iso8601` (the default): an `S` in RFC 3339 / ISO 8601.
    #[default]
    Iso8601,
    /// `epoch_seconds`: an `N` of seconds since 1970-01-01 UTC.
    EpochSeconds,
    /// `epoch_millis`: an `N` of milliseconds since 1970-01-01 UTC.
    EpochMillis,
}

impl TimeFormat {
    /// Every format.
    pub const ALL: [TimeFormat; 3] = [
        TimeFormat::Iso8601,
        TimeFormat::EpochSeconds,
        TimeFormat::EpochMillis,
    ];

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            TimeFormat::Iso8601 => "iso8601",
            TimeFormat::EpochSeconds => "epoch_seconds",
            TimeFormat::EpochMillis => "epoch_millis",
        }
    }

    /// The format of a config spelling.
    pub fn parse(text: &str) -> Option<TimeFormat> {
        TimeFormat::ALL
            .into_iter()
            .find(|format| format.name() == text)
    }
}

/// One step of a [`ColumnPath`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathStep {
    /// An attribute of the item, or an entry of a map.
    Name(String),
    /// An element of a list.
    Index(usize),
}

/// One typed column: its name in the table, where its value is, and its type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ColumnSpec {
    /// The column's name in the table.
    pub name: String,
    /// Where the value is in the item.
    pub path: ColumnPath,
    /// The column's type.
    pub kind: ColumnType,
    /// How a `timestamptz` column reads its attribute (ignored by the other types).
    pub time_format: TimeFormat,
}

impl ColumnSpec {
    /// What decides the column's values, as one line: its type, its path and, for
    /// `timestamptz`, its format (`timestamptz from created_at as epoch_millis`). Two
    /// definitions that are equal give every item the same value; a destination records it
    /// to tell when a column's values were written by another definition.
    pub fn definition(&self) -> String {
        match self.kind {
            ColumnType::Timestamptz => format!(
                "{} from {} as {}",
                self.kind,
                self.path,
                self.time_format.name()
            ),
            _ => format!("{} from {}", self.kind, self.path),
        }
    }
}

/// A column's value for one row.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValue {
    /// SQL NULL: the attribute is absent or `NULL` (rule 2), or a mismatch stored as null.
    Null,
    /// `text`.
    Text(String),
    /// `numeric`: the number's exact text as the document held it.
    Numeric(String),
    /// `bigint`.
    Bigint(i64),
    /// `double`: a double whose shortest round trip is the attribute's exact value.
    Double(f64),
    /// `boolean`.
    Boolean(bool),
    /// `timestamptz`: microseconds since 1970-01-01 UTC.
    Timestamp(i64),
    /// `jsonb`: compact JSON text (rule 4).
    Json(String),
}

impl ColumnValue {
    /// The value as text a database parses into the column's type (PostgreSQL's input
    /// functions, a COPY field), `None` for NULL: numbers and booleans as PostgreSQL spells
    /// them, a double in its shortest round-trip form, a timestamp as [`timestamp_text`].
    pub fn sql_text(&self) -> Option<Cow<'_, str>> {
        match self {
            ColumnValue::Null => None,
            ColumnValue::Text(text) | ColumnValue::Numeric(text) | ColumnValue::Json(text) => {
                Some(Cow::Borrowed(text))
            }
            ColumnValue::Bigint(n) => Some(Cow::Owned(n.to_string())),
            // serde_json's shortest form (`1e+20`, `0.0025`) is the one `convert` compared
            // digits with; where two forms are equally short it picks the same one.
            // PostgreSQL's float8 reads `NaN` and `inf`, which `convert` never gives.
            ColumnValue::Double(x) => Some(Cow::Owned(
                serde_json::Number::from_f64(*x)
                    .map_or_else(|| format!("{x:?}"), |n| n.to_string()),
            )),
            ColumnValue::Boolean(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
            ColumnValue::Timestamp(micros) => Some(Cow::Owned(timestamp_text(*micros))),
        }
    }
}

/// Why an attribute's value does not fit its column (rule 5): the value's DynamoDB type and
/// why, for messages (`an N with 21 integer digits is beyond bigint (…)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The DynamoDB type tag of the value found (`"S"`, `"N"`, …; for a path step into the
    /// wrong type, that value's tag).
    pub found: &'static str,
    /// What does not fit, without the value itself (values may be secrets or personal data).
    pub why: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.why)
    }
}

impl Mismatch {
    /// A mismatch of a value whose type tag is `found`.
    pub(crate) fn new(found: &'static str, why: String) -> Mismatch {
        Mismatch { found, why }
    }
}

/// A DynamoDB type tag with its indefinite article, as messages say it (`an S`, `a BOOL`).
pub fn a_tag(tag: &str) -> &'static str {
    match tag {
        "S" => "an S",
        "N" => "an N",
        "B" => "a B",
        "BOOL" => "a BOOL",
        "NULL" => "a NULL",
        "M" => "an M",
        "L" => "an L",
        "SS" => "an SS",
        "NS" => "an NS",
        "BS" => "a BS",
        _ => "a value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_types_and_time_formats_read_their_config_spellings() {
        for kind in ColumnType::ALL {
            assert_eq!(ColumnType::parse(kind.name()), Some(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(
            ColumnType::parse("double precision"),
            Some(ColumnType::Double)
        );
        assert_eq!(ColumnType::parse("int"), None);
        for format in TimeFormat::ALL {
            assert_eq!(TimeFormat::parse(format.name()), Some(format));
        }
        assert_eq!(TimeFormat::parse("epoch"), None);
        assert_eq!(TimeFormat::default(), TimeFormat::Iso8601);
    }

    #[test]
    fn a_mismatch_displays_its_reason() {
        let mismatch = Mismatch::new("SS", "an SS has no order: [0] cannot index it".to_owned());
        assert_eq!(
            mismatch.to_string(),
            "an SS has no order: [0] cannot index it"
        );
    }

    #[test]
    fn every_type_tag_has_its_article() {
        let tags = ["S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS"];
        let said: Vec<&str> = tags.into_iter().map(a_tag).collect();
        assert_eq!(
            said,
            [
                "an S", "an N", "a B", "a BOOL", "a NULL", "an M", "an L", "an SS", "an NS", "a BS"
            ]
        );
    }
}
