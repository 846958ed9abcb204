//! What both backends' SQL shares: ddbpipe's own table and column names, identifier quoting,
//! the key check, how a row change is written (docs/mirror.md §5.6), row counts and the clock
//! of `_ddbpipe_updated_at`.
//!
//! # Rules
//! 1. An identifier is always double-quoted, an embedded `"` doubled (`or"ders` →
//!    `"or""ders"`), in SQLite and PostgreSQL alike.
//! 2. A row's key fits the table when it has one value per key column, in order, each of its
//!    column's type; otherwise the first misfit is reported: a different number of values, or
//!    else the first value of another type. The backends word the message.
//! 3. A count from the database below zero (never expected) reads as 0.
//! 4. Times are RFC 3339 UTC with milliseconds: `2026-11-29T21:00:00.123Z`.
//! 5. How a row change is written ([`plan`], docs/mirror.md §5.6):
//!    - no snapshot open: an upsert replaces the document and records its version, leaving the
//!      marker as it is; a delete deletes;
//!    - a snapshot open, a stream upsert (`snapshot: false`): as above, and the marker becomes
//!      the snapshot id; a delete also leaves a deleted-key marker in `_ddbpipe_deleted`;
//!    - a snapshot row with a version read at `p`: written (marker = id, version `p`, no
//!      sequence) unless the key has a deleted-key marker newer than [`cutoff_ms`]`(p)`, or its
//!      row was written by a stream change during this snapshot (marker = id, a sequence) at a
//!      version newer than the cutoff. A marker or stream row whose time is unknown (null)
//!      counts as newer: skipping is always safe, since the stream covers the key (§5.6);
//!    - a snapshot row without a version: marker = id, version null, as before versions.
//!    - a snapshot row with no snapshot open is refused.
//! 7. A repair change (docs/streams.md §4.12) at `w` applies over a missing or older row
//!    ([`repair_older`]) and marks the row with the repair id whether or not it applied.
//! 6. The key of a deleted-key marker is [`key_text`]: the JSON array of the typed key values,
//!    `[{"S":"a"},{"N":"1"},{"B":"AAE="}]` (base64 bytes). Stream and scan records of one
//!    pipeline render a key the same way (see `sink`), so one key has one text.
//! 8. An upsert writes, after the key columns, the document column when the table keeps one
//!    ([`value_columns`]), then the typed columns in configuration order: one value per typed
//!    column, in that order, or the batch is refused ([`columns_misfit`]).
//! 9. A key in a message reads `pk "a", sk 12, b 0x0102` ([`describe_key`]): the attribute
//!    names with the values, text quoted, bytes in hex.

use std::fmt::Write as _;

use base64::Engine as _;

use crate::{ColumnValue, KeyColumn, KeyType, KeyValue, RowChange, TableSpec, Version};

/// The prefix of ddbpipe's own tables and columns, which no table, key attribute, document
/// column or typed column may take.
pub const RESERVED_PREFIX: &str = "_ddbpipe_";

/// The state table's name.
pub(crate) const STATE_TABLE: &str = "_ddbpipe_state";
/// The snapshot marker column.
pub(crate) const SNAPSHOT_COLUMN: &str = "_ddbpipe_snapshot";
/// The last-write time column.
pub(crate) const UPDATED_AT_COLUMN: &str = "_ddbpipe_updated_at";
/// The version time column (unix ms, null when unknown; docs/mirror.md §5.6).
pub(crate) const VERSION_MS_COLUMN: &str = "_ddbpipe_version_ms";
/// The version sequence column: the stream record's sequence number, null for snapshot rows.
pub(crate) const VERSION_SEQ_COLUMN: &str = "_ddbpipe_version_seq";
/// The deleted-key markers table: `(table_name, key_text, version_ms)`, primary key
/// `(table_name, key_text)`, beside the destination table.
pub(crate) const DELETED_TABLE: &str = "_ddbpipe_deleted";

/// How far a stream record's `ApproximateCreationDateTime` may be ahead of this machine's
/// clock and still be recognised as newer than a page read at the same moment
/// (docs/mirror.md §5.6, rule 3). Larger only skips more snapshot rows, which is safe.
pub(crate) const CLOCK_MARGIN_MS: i64 = 60_000;
/// DynamoDB rounds a record's creation time down to the second.
pub(crate) const CREATION_ROUNDING_MS: i64 = 1_000;

/// The cutoff of a snapshot row read at `read_ms`: a deleted-key marker or a stream-written
/// row with a version above it holds the row back (rule 5; ties go to the stream).
pub(crate) fn cutoff_ms(read_ms: i64) -> i64 {
    read_ms.saturating_sub(CREATION_ROUNDING_MS + CLOCK_MARGIN_MS)
}

/// The canonical text of a key for `_ddbpipe_deleted` (rule 6).
pub(crate) fn key_text(key: &[KeyValue]) -> String {
    // Written straight into one buffer (this runs for every guarded row): the bytes of the JSON
    // array of `{"<tag>": "<text>"}` objects serde_json writes.
    let mut out = Vec::with_capacity(16 * key.len() + 2);
    out.push(b'[');
    for (index, value) in key.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        let (tag, text): (&[u8], std::borrow::Cow<'_, str>) = match value {
            KeyValue::S(text) => (b"{\"S\":", text.as_str().into()),
            KeyValue::N(text) => (b"{\"N\":", text.as_str().into()),
            KeyValue::B(bytes) => (
                b"{\"B\":",
                base64::engine::general_purpose::STANDARD
                    .encode(bytes)
                    .into(),
            ),
        };
        out.extend_from_slice(tag);
        // A string always serializes.
        let _ = serde_json::to_writer(&mut out, text.as_ref());
        out.push(b'}');
    }
    out.push(b']');
    String::from_utf8(out).unwrap_or_default()
}

/// How one row change is written (rule 5).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Write<'a> {
    /// Insert or replace; the marker stays as it is (null for a new row).
    Upsert {
        /// The version's time.
        version_ms: Option<i64>,
        /// The version's sequence number.
        version_seq: Option<&'a str>,
    },
    /// Insert or replace, marking the row with the open snapshot's id.
    UpsertMarked {
        /// The snapshot id.
        id: i64,
        /// The version's time.
        version_ms: Option<i64>,
        /// The version's sequence number (`None` for a snapshot row).
        version_seq: Option<&'a str>,
    },
    /// A snapshot row read at `read_ms`: as `UpsertMarked` without a sequence, unless the
    /// stream may hold something newer for the key than `cutoff_ms`.
    UpsertUnlessNewer {
        /// The snapshot id.
        id: i64,
        /// The page's request time: the row's version.
        read_ms: i64,
        /// [`cutoff_ms`] of `read_ms`.
        cutoff_ms: i64,
    },
    /// Delete by key.
    Delete,
    /// Delete by key and leave a deleted-key marker at `version_ms`.
    DeleteMarked {
        /// The delete's time.
        version_ms: Option<i64>,
    },
    /// A repair's upsert written at `version_ms`: replaces an older row ([`repair_older`]),
    /// marks the row with the repair id either way.
    RepairUpsert {
        /// The repair id.
        id: i64,
        /// The exact write time.
        version_ms: i64,
    },
    /// A repair's delete at `version_ms`: deletes an older row, marks a newer one.
    RepairDelete {
        /// The repair id.
        id: i64,
        /// The exact delete time.
        version_ms: i64,
    },
}

/// The SQL condition "the row (`{table}`'s columns) is older than a repair change written at
/// `{written}`" (rule 7): no version, a stream change's time below it, or another row's below
/// it plus [`CLOCK_MARGIN_MS`] (a snapshot's read time on this machine's clock).
pub(crate) fn repair_older(table: &str, written: &str) -> String {
    let ms = quote(VERSION_MS_COLUMN);
    let seq = quote(VERSION_SEQ_COLUMN);
    format!(
        "({table}.{ms} IS NULL OR ({table}.{seq} IS NOT NULL AND {table}.{ms} < {written}) \
         OR ({table}.{seq} IS NULL AND {table}.{ms} < {written} + {CLOCK_MARGIN_MS}))"
    )
}

/// A snapshot row came with no snapshot open (a bug of the caller).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NoSnapshotOpen;

/// How `row` is written with `snapshot_id` open (rule 5).
pub(crate) fn plan(row: &RowChange, snapshot_id: Option<i64>) -> Result<Write<'_>, NoSnapshotOpen> {
    let write = match (row, snapshot_id) {
        (
            RowChange::Upsert {
                version:
                    Version {
                        repair: Some(id),
                        at_ms,
                        ..
                    },
                ..
            },
            _,
        ) => Write::RepairUpsert {
            id: *id,
            version_ms: at_ms.unwrap_or(i64::MIN),
        },
        (
            RowChange::Delete {
                version:
                    Version {
                        repair: Some(id),
                        at_ms,
                        ..
                    },
                ..
            },
            _,
        ) => Write::RepairDelete {
            id: *id,
            version_ms: at_ms.unwrap_or(i64::MIN),
        },
        (RowChange::Upsert { snapshot: true, .. }, None) => return Err(NoSnapshotOpen),
        (
            RowChange::Upsert {
                snapshot: false,
                version,
                ..
            },
            None,
        ) => Write::Upsert {
            version_ms: version.at_ms,
            version_seq: version.sequence.as_deref(),
        },
        (
            RowChange::Upsert {
                snapshot: false,
                version,
                ..
            },
            Some(id),
        ) => Write::UpsertMarked {
            id,
            version_ms: version.at_ms,
            version_seq: version.sequence.as_deref(),
        },
        (
            RowChange::Upsert {
                snapshot: true,
                version:
                    Version {
                        at_ms: Some(read_ms),
                        ..
                    },
                ..
            },
            Some(id),
        ) => Write::UpsertUnlessNewer {
            id,
            read_ms: *read_ms,
            cutoff_ms: cutoff_ms(*read_ms),
        },
        (RowChange::Upsert { snapshot: true, .. }, Some(id)) => Write::UpsertMarked {
            id,
            version_ms: None,
            version_seq: None,
        },
        (RowChange::Delete { .. }, None) => Write::Delete,
        (RowChange::Delete { version, .. }, Some(_)) => Write::DeleteMarked {
            version_ms: version.at_ms,
        },
    };
    Ok(write)
}

/// The key of a row change.
pub(crate) fn row_key(row: &RowChange) -> &[KeyValue] {
    match row {
        RowChange::Upsert { key, .. } | RowChange::Delete { key, .. } => key,
    }
}

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

/// The columns an upsert writes after the key columns, in table order (rule 8): the document
/// column when the table keeps one, then the typed columns.
pub(crate) fn value_columns(spec: &TableSpec) -> Vec<&str> {
    let typed = spec.columns.iter().map(|column| column.name.as_str());
    spec.document_column
        .as_deref()
        .into_iter()
        .chain(typed)
        .collect()
}

/// The typed values of a row change: an upsert's, none for a delete.
pub(crate) fn row_columns(row: &RowChange) -> &[ColumnValue] {
    match row {
        RowChange::Upsert { columns, .. } => columns,
        RowChange::Delete { .. } => &[],
    }
}

/// Why upsert `index` does not fit `spec`'s typed columns (rule 8): another number of values.
pub(crate) fn columns_misfit(spec: &TableSpec, index: usize, row: &RowChange) -> Option<String> {
    let RowChange::Upsert { columns, .. } = row else {
        return None;
    };
    (columns.len() != spec.columns.len()).then(|| {
        format!(
            "change {index} has {} typed column value(s) but the table has {} typed column(s)",
            columns.len(),
            spec.columns.len()
        )
    })
}

/// A row's key for messages: `pk "a", sk 12, b 0x0102` (rule 9).
pub fn describe_key(columns: &[KeyColumn], key: &[KeyValue]) -> String {
    let parts: Vec<String> = columns
        .iter()
        .zip(key)
        .map(|(column, value)| match value {
            KeyValue::S(text) => format!("{} {text:?}", column.name),
            KeyValue::N(number) => format!("{} {number}", column.name),
            KeyValue::B(bytes) => {
                let mut hex = format!("{} 0x", column.name);
                for byte in bytes {
                    let _ = write!(hex, "{byte:02x}");
                }
                hex
            }
        })
        .collect();
    parts.join(", ")
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
            document_column: Some("doc".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        }
    }

    fn upsert(snapshot: bool, at_ms: Option<i64>, sequence: Option<&str>) -> RowChange {
        RowChange::Upsert {
            key: vec![KeyValue::S("a".into())],
            document: "{}".into(),
            columns: Vec::new(),
            snapshot,
            version: Version {
                at_ms,
                sequence: sequence.map(str::to_string),
                repair: None,
            },
        }
    }

    fn delete(at_ms: Option<i64>) -> RowChange {
        RowChange::Delete {
            key: vec![KeyValue::S("a".into())],
            version: Version {
                at_ms,
                sequence: Some("9".into()),
                repair: None,
            },
        }
    }

    #[test]
    fn the_cutoff_is_a_second_and_the_margin_before_the_read() {
        assert_eq!(cutoff_ms(100_000), 39_000);
        assert_eq!(cutoff_ms(i64::MIN), i64::MIN);
    }

    #[test]
    fn a_key_text_is_the_json_of_the_typed_values() {
        let key = [
            KeyValue::S("a\"b".into()),
            KeyValue::N("1E1".into()),
            KeyValue::B(vec![0, 1]),
        ];
        assert_eq!(key_text(&key), r#"[{"S":"a\"b"},{"N":"1E1"},{"B":"AAE="}]"#);
    }

    #[test]
    fn outside_a_snapshot_upserts_keep_the_marker_and_deletes_leave_no_marker() {
        assert_eq!(
            plan(&upsert(false, Some(5), Some("1")), None),
            Ok(Write::Upsert {
                version_ms: Some(5),
                version_seq: Some("1")
            })
        );
        assert_eq!(plan(&delete(Some(5)), None), Ok(Write::Delete));
        assert_eq!(
            plan(&upsert(true, Some(5), None), None),
            Err(NoSnapshotOpen)
        );
    }

    #[test]
    fn during_a_snapshot_stream_changes_mark_and_snapshot_rows_with_a_version_are_guarded() {
        let cases = [
            (
                upsert(false, Some(5), Some("1")),
                Write::UpsertMarked {
                    id: 7,
                    version_ms: Some(5),
                    version_seq: Some("1"),
                },
            ),
            (
                upsert(true, Some(100_000), None),
                Write::UpsertUnlessNewer {
                    id: 7,
                    read_ms: 100_000,
                    cutoff_ms: 39_000,
                },
            ),
            // Without a version, as before versions; a snapshot row never records a sequence.
            (
                upsert(true, None, Some("1")),
                Write::UpsertMarked {
                    id: 7,
                    version_ms: None,
                    version_seq: None,
                },
            ),
            (
                delete(Some(5)),
                Write::DeleteMarked {
                    version_ms: Some(5),
                },
            ),
        ];
        for (row, want) in &cases {
            assert_eq!(plan(row, Some(7)).as_ref(), Ok(want), "{row:?}");
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
    fn keys_are_described_by_attribute() {
        let spec = spec(&[("pk", KeyType::S), ("n", KeyType::N), ("b", KeyType::B)]);
        let key = [
            KeyValue::S("a\"b".into()),
            KeyValue::N("12.5".into()),
            KeyValue::B(vec![1, 0xff]),
        ];
        assert_eq!(
            describe_key(&spec.key, &key),
            r#"pk "a\"b", n 12.5, b 0x01ff"#
        );
    }

    #[test]
    fn the_values_follow_the_key_document_first_and_a_row_has_one_per_typed_column() {
        let mut spec = spec(&[("pk", KeyType::S)]);
        assert_eq!(value_columns(&spec), ["doc"]);
        spec.document_column = None;
        assert!(value_columns(&spec).is_empty());
        let row = upsert(false, None, None);
        assert_eq!(columns_misfit(&spec, 0, &row), None);
        let mut extra = row.clone();
        if let RowChange::Upsert { columns, .. } = &mut extra {
            columns.push(ColumnValue::Bigint(1));
        }
        let misfit = columns_misfit(&spec, 3, &extra).expect("one value too many");
        assert!(
            misfit.contains("change 3 has 1 typed column value(s)"),
            "{misfit}"
        );
        assert_eq!(columns_misfit(&spec, 0, &delete(None)), None);
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
