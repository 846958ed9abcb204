//! What both backends' SQL shares: ddbpipe's own table and column names, identifier quoting,
//! the key check, row counts and the clock of `_ddbpipe_updated_at`.
//!
//! # Rules
//! 1. An identifier is always double-quoted, an embedded `"` doubled (`or"ders` →
//!    `"or""ders"`), in SQLite and PostgreSQL alike.
//! 2. A row's key fits the table when it has one value per key column, in order, each of its
//!    column's type; otherwise the first misfit is reported: a different number of values, or
//!    else the first value of another type. The backends word the message.
//! 3. A count from the database below zero (never expected) reads as 0.
//! 4. Times are RFC 3339 UTC with milliseconds: `2026-11-29T21:00:00.123Z`.

use crate::{KeyColumn, KeyType, KeyValue, TableSpec};

/// The state table's name.
pub(crate) const STATE_TABLE: &str = "_ddbpipe_state";
/// The snapshot marker column.
pub(crate) const SNAPSHOT_COLUMN: &str = "_ddbpipe_snapshot";
/// The last-write time column.
pub(crate) const UPDATED_AT_COLUMN: &str = "_ddbpipe_updated_at";

/// A double-quoted identifier, embedded `"` doubled (rule 1).
pub(crate) fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// The type of a key value.
pub(crate) fn key_type(value: &KeyValue) -> KeyType {
    match value {
        KeyValue::S(_) => KeyType::S,
        KeyValue::N(_) => KeyType::N,
        KeyValue::B(_) => KeyType::B,
    }
}

/// How a row's key does not fit the key columns (rule 2).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyMisfit<'a> {
    /// Another number of values than key columns.
    Count,
    /// The first value whose type is not its column's.
    Type {
        /// The value's type.
        found: KeyType,
        /// The column it is for.
        column: &'a KeyColumn,
    },
}

/// The first way `key` does not fit `spec`'s key columns, or `None` when it fits (rule 2).
pub(crate) fn key_misfit<'a>(spec: &'a TableSpec, key: &[KeyValue]) -> Option<KeyMisfit<'a>> {
    if key.len() != spec.key.len() {
        return Some(KeyMisfit::Count);
    }
    key.iter()
        .zip(&spec.key)
        .map(|(value, column)| (key_type(value), column))
        .find(|(found, column)| *found != column.kind)
        .map(|(found, column)| KeyMisfit::Type { found, column })
}

/// A `count(*)` as `u64` (rule 3).
pub(crate) fn row_count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Now, RFC 3339 UTC with milliseconds (rule 4): the one clock of the workspace.
pub use ddbpipe_source::clock::now_rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(key: &[(&str, KeyType)]) -> TableSpec {
        TableSpec {
            table: "t".into(),
            schema: "public".into(),
            key: key
                .iter()
                .map(|(name, kind)| KeyColumn {
                    name: (*name).into(),
                    kind: *kind,
                })
                .collect(),
            document_column: "doc".into(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        }
    }

    #[test]
    fn an_identifier_is_quoted_with_its_quotes_doubled() {
        assert_eq!(quote("orders"), "\"orders\"");
        assert_eq!(quote("or\"ders"), "\"or\"\"ders\"");
    }

    #[test]
    fn a_key_of_the_columns_types_in_order_fits() {
        let spec = spec(&[("pk", KeyType::S), ("sk", KeyType::N)]);
        let key = [KeyValue::S("a".into()), KeyValue::N("1".into())];
        assert_eq!(key_misfit(&spec, &key), None);
    }

    #[test]
    fn a_key_with_another_number_of_values_is_a_count_misfit() {
        let spec = spec(&[("pk", KeyType::S), ("sk", KeyType::N)]);
        let key = [KeyValue::N("1".into())];
        assert_eq!(key_misfit(&spec, &key), Some(KeyMisfit::Count));
    }

    #[test]
    fn the_first_value_of_another_type_is_the_misfit() {
        let spec = spec(&[("pk", KeyType::S), ("sk", KeyType::N)]);
        let key = [KeyValue::B(vec![1]), KeyValue::S("x".into())];
        assert_eq!(
            key_misfit(&spec, &key),
            Some(KeyMisfit::Type {
                found: KeyType::B,
                column: &spec.key[0],
            })
        );
    }

    #[test]
    fn a_negative_count_reads_as_zero() {
        assert_eq!(row_count(-1), 0);
        assert_eq!(row_count(7), 7);
    }

    #[test]
    fn the_clock_writes_utc_with_milliseconds() {
        let now = now_rfc3339();
        assert_eq!(now.len(), "2026-11-29T21:00:00.123Z".len(), "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
    }
}
