//! `ddbpipe init --columns auto`: the typed columns (docs/sinks.md §7.9) a sample of the
//! table's items suggests, and the `columns:` lines that write them.
//!
//! # Rules
//! 1. Every top-level attribute the sample holds becomes a column of its name, in attribute
//!    name order, its path the attribute (quoted where a path needs it). The key attributes
//!    are left out: they are key columns already.
//! 2. `NULL` values say nothing of the type: a NULL fits every column (it is stored as NULL).
//! 3. An attribute of one DynamoDB type in every sample (NULLs aside) gets that type's
//!    column: `S` → `timestamptz` when every sample converts as an ISO 8601 time, else `text`
//!    (so a column is a time only when no sample would be a mismatch); `N` → `bigint` when
//!    every sample is an integer within i64, else `numeric` (exact); `BOOL` → `boolean`;
//!    `B` → `text` (base64); `SS`, `NS`, `BS`, `L`, `M` → `jsonb`.
//! 4. An attribute of several types (mixed), or only ever NULL, is `jsonb`: any value fits.
//! 5. Each column's comment gives the share of the sample that matched: items holding the
//!    attribute with the column's type out of the items sampled (`998/1000 N, all
//!    integers`).
//! 6. An attribute whose name is no usable column name for the sink (`_ddbpipe_…`, over 63
//!    bytes for PostgreSQL, the document column's name, a name SQLite already has in another
//!    case, or no path can name it) is left out, with a comment saying why.

use std::collections::BTreeMap;

use ddbpipe_value::{ColumnPath, ColumnType, Item, TimeFormat, Value, convert, parse_timestamp};

use crate::sinks::keyed::{DEFAULT_DOCUMENT_COLUMN, Dialect, unusable_name};

/// What the sample held of one attribute.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Seen {
    /// Items holding it, by DynamoDB type tag (NULL included).
    by_type: BTreeMap<&'static str, u64>,
    /// `N` samples that are no integer within i64.
    not_bigint: u64,
    /// `S` samples that are no ISO 8601 time a `timestamptz` column takes.
    not_timestamp: u64,
}

/// The columns a sample suggests (rules 1–6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inference {
    /// Items sampled.
    pub(crate) sampled: u64,
    /// The key attributes left out (rule 1).
    pub(crate) keys: Vec<String>,
    /// One entry per other attribute, in name order.
    pub(crate) attributes: Vec<Inferred>,
}

/// What became of one attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inferred {
    /// A column (rules 3–5).
    Column {
        /// The column's name: the attribute's.
        name: String,
        /// Its path, as the config writes it.
        path: String,
        /// Its type.
        kind: ColumnType,
        /// The share that matched and why the type (rule 5).
        note: String,
    },
    /// Left out (rule 6).
    Skipped {
        /// The attribute.
        attribute: String,
        /// Why.
        why: String,
    },
}

/// Infers the columns of `items` for a sink writing to `dialect` (rules 1–6).
pub(crate) fn infer(items: &[Item], keys: &[String], dialect: Dialect) -> Inference {
    let mut seen: BTreeMap<&str, Seen> = BTreeMap::new();
    for item in items {
        for (name, value) in item {
            if keys.contains(name) {
                continue;
            }
            let entry = seen.entry(name.as_str()).or_default();
            *entry.by_type.entry(value.type_tag()).or_default() += 1;
            match value {
                Value::N(_) if !fits_bigint(value) => entry.not_bigint += 1,
                Value::S(text) if parse_timestamp(text).is_none() => entry.not_timestamp += 1,
                _ => {}
            }
        }
    }
    let sampled = items.len() as u64;
    let mut taken: Vec<&str> = Vec::new();
    let attributes = seen
        .into_iter()
        .map(|(name, seen)| match name_problem(name, dialect, &taken) {
            Some(why) => Inferred::Skipped {
                attribute: name.to_string(),
                why,
            },
            None => {
                taken.push(name);
                let (kind, note) = column_type(&seen, sampled);
                Inferred::Column {
                    name: name.to_string(),
                    path: path_text(name).unwrap_or_default(),
                    kind,
                    note,
                }
            }
        })
        .collect();
    Inference {
        sampled,
        keys: keys.to_vec(),
        attributes,
    }
}

/// Whether `value` converts to `bigint` (the conversions of `ddbpipe_value`, the one place
/// they are decided; a time is what `parse_timestamp` reads, as a `timestamptz` column).
fn fits_bigint(value: &Value) -> bool {
    convert(value, ColumnType::Bigint, TimeFormat::default()).is_ok()
}

/// The columns the parquet sink adds to changes beside the key and the document
/// (docs/sinks.md §7.10 rule 2).
const LAKE_COLUMNS: [&str; 5] = ["op", "sequence_number", "event_time", "shard_id", "before"];

/// Why `name` cannot be a column of its own (rule 6), given the names `taken` already.
fn name_problem(name: &str, dialect: Dialect, taken: &[&str]) -> Option<String> {
    if let Some(problem) = unusable_name(dialect, name) {
        return Some(problem);
    }
    if dialect.same_name(name, DEFAULT_DOCUMENT_COLUMN) {
        return Some("the document column's name".to_string());
    }
    if dialect == Dialect::Lake && LAKE_COLUMNS.contains(&name) {
        return Some("a column the parquet sink adds to changes".to_string());
    }
    if let Some(other) = taken.iter().find(|other| dialect.same_name(other, name)) {
        return Some(format!("SQLite takes it for column '{other}' (case aside)"));
    }
    if path_text(name).is_none() {
        return Some("no column path names it".to_string());
    }
    None
}

/// The path of a top-level attribute as the config writes it: the name, or the name in
/// double quotes where a path needs them (`ddbpipe_value::columns` rule 1). `None` when the
/// path would not name it.
fn path_text(name: &str) -> Option<String> {
    let plain = !name.is_empty() && !name.contains(['.', '[', ']', '"']);
    let text = if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('\\', "\\\\").replace('"', "\\\""))
    };
    let path = ColumnPath::parse(&text).ok()?;
    (path.steps().len() == 1 && path.root() == name).then_some(text)
}

/// The column type of one attribute and its comment (rules 2–5).
fn column_type(seen: &Seen, sampled: u64) -> (ColumnType, String) {
    let nulls = seen.by_type.get("NULL").copied().unwrap_or_default();
    let types: Vec<(&str, u64)> = seen
        .by_type
        .iter()
        .filter(|(tag, _)| **tag != "NULL")
        .map(|(tag, count)| (*tag, *count))
        .collect();
    let null_note = match nulls {
        0 => String::new(),
        nulls => format!(", {nulls} NULL"),
    };
    let (kind, note) = match types.as_slice() {
        [] => (
            ColumnType::Jsonb,
            format!("{nulls}/{sampled} NULL only: no type seen, as JSON"),
        ),
        [(tag, count)] => {
            let (kind, detail) = one_type(tag, *count, seen);
            (kind, format!("{count}/{sampled} {tag}{detail}{null_note}"))
        }
        mixed => {
            let count: u64 = mixed.iter().map(|(_, count)| count).sum();
            let parts: Vec<String> = mixed
                .iter()
                .map(|(tag, count)| format!("{count} {tag}"))
                .collect();
            (
                ColumnType::Jsonb,
                format!(
                    "{count}/{sampled} mixed ({}), as JSON{null_note}",
                    parts.join(", ")
                ),
            )
        }
    };
    (kind, note)
}

/// The column of an attribute whose every sample is of type `tag` (rule 3), and what the
/// comment adds.
fn one_type(tag: &str, count: u64, seen: &Seen) -> (ColumnType, String) {
    match tag {
        "N" if seen.not_bigint == 0 => (ColumnType::Bigint, ", all integers".to_string()),
        "N" => (
            ColumnType::Numeric,
            format!(
                ", {} not integers within bigint: exact numeric",
                seen.not_bigint
            ),
        ),
        "S" if seen.not_timestamp == 0 => {
            (ColumnType::Timestamptz, ", all ISO 8601 times".to_string())
        }
        "S" if seen.not_timestamp < count => (
            ColumnType::Text,
            format!(
                ", {} of them ISO 8601 times (not all: text)",
                count - seen.not_timestamp
            ),
        ),
        "S" => (ColumnType::Text, String::new()),
        "BOOL" => (ColumnType::Boolean, String::new()),
        "B" => (ColumnType::Text, ", as base64 text".to_string()),
        _ => (ColumnType::Jsonb, ", as JSON".to_string()),
    }
}

/// The `columns:` lines of `inference` for the `sink:` section (two spaces in), with the
/// comments of rules 1, 5 and 6; nothing when no attribute was seen.
pub(crate) fn yaml_lines(inference: &Inference) -> String {
    let mut out = String::new();
    let sampled = inference.sampled;
    if !inference.keys.is_empty() {
        out.push_str(&format!(
            "  # key attributes {}: key columns already\n",
            inference
                .keys
                .iter()
                .map(|key| yaml_scalar(key))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let columns = inference
        .attributes
        .iter()
        .filter(|inferred| matches!(inferred, Inferred::Column { .. }))
        .count();
    if columns == 0 {
        out.push_str(&format!(
            "  # columns: none inferred from {sampled} sampled items\n"
        ));
    } else {
        out.push_str(&format!(
            "  columns:                         # inferred from {sampled} sampled items by `ddbpipe init --columns auto`\n"
        ));
    }
    for inferred in &inference.attributes {
        match inferred {
            Inferred::Column {
                name,
                path,
                kind,
                note,
            } => {
                let entry = format!(
                    "    - {{name: {}, path: {}, type: {kind}}}",
                    yaml_scalar(name),
                    yaml_scalar(path)
                );
                out.push_str(&format!("{entry:<60} # {note}\n"));
            }
            Inferred::Skipped { attribute, why } => {
                out.push_str(&format!(
                    "    # skipped attribute {}: {why}\n",
                    yaml_scalar(attribute)
                ));
            }
        }
    }
    out
}

/// `text` as a YAML scalar in a flow mapping: plain when it is a simple word YAML reads as
/// that string, else double-quoted (JSON's escapes are YAML's).
fn yaml_scalar(text: &str) -> String {
    const READ_AS_OTHER: [&str; 11] = [
        "null", "true", "false", "yes", "no", "on", "off", "y", "n", "~", "",
    ];
    let word = text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if word && !READ_AS_OTHER.contains(&text.to_ascii_lowercase().as_str()) {
        text.to_string()
    } else {
        serde_json::to_string(text).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
