//! Stream records and scanned items as change envelopes (docs/streams.md §4.1).
//!
//! # Shape
//! One compact JSON object per record, its fourteen keys in byte order:
//!
//! ```text
//! after before document_key event_id event_name key op sequence_number shard_id size_bytes
//! stream_view_type table ts_ms user_identity
//! ```
//!
//! `after`, `before`, `key` and `document_key` follow `value_format` (docs/values.md §3); `document_key`
//! is the same value as `key`. A snapshot envelope (mirror and resnapshot rows) has `op: "r"`,
//! `event_name: "SNAPSHOT"`, the item as `after`, `key_of(item)` as the key and `null` in every
//! stream field.
//!
//! # Hot path
//! Envelopes are written straight into the caller's buffer: no `serde_json::Value` per record.
//! Strings go through `serde_json`, so they are escaped exactly as it escapes them. The key is
//! converted once and its bytes copied for the second field.
//!
//! # Error handling
//! A record without its `dynamodb` part or without a sequence number cannot become an envelope
//! and cannot be skipped either (its position would be lost): an [`EnvelopeError`] is definite
//! and stops the run. It is detected before anything is written, so the buffer is unchanged.

use std::borrow::Cow;

use ddbpipe_value::{Item, ValueFormat};
use serde::Serialize;

use crate::api::{
    ChangeData, ChangeMeta, ChangeOp, ChangeShape, Changes, KeyAttribute, StreamRecord,
};
use crate::ids::{SequenceNumber, ShardId};
use crate::records::Lines;

/// A record that cannot become an envelope (definite: the run fails).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Definite: the record has no `dynamodb` part, so nothing says what changed.
    #[error(
        "record {} in {shard} has no stream record",
        .event_id.as_deref().unwrap_or("?")
    )]
    NoStreamRecord {
        /// The record's `eventID`, when it has one.
        event_id: Option<String>,
        /// The shard the record was read from.
        shard: ShardId,
    },
    /// Definite: the record has no sequence number, so no position can follow it.
    #[error(
        "record {} in {shard} has no sequence number",
        .event_id.as_deref().unwrap_or("?")
    )]
    NoSequenceNumber {
        /// The record's `eventID`, when it has one.
        event_id: Option<String>,
        /// The shard the record was read from.
        shard: ShardId,
    },
}

/// Appends the change envelope of `record` read from `shard` (docs/streams.md §4.1) as one compact JSON
/// object with keys in this (sorted) order: after, before, document_key, event_id, event_name,
/// key, op, sequence_number, shard_id, size_bytes, stream_view_type, table, ts_ms,
/// user_identity. No newline is written.
///
/// On error nothing is appended.
pub fn write_change(
    record: &StreamRecord,
    shard: &ShardId,
    table: &str,
    format: ValueFormat,
    out: &mut Vec<u8>,
) -> Result<(), EnvelopeError> {
    let (change, sequence_number) = parts(record, shard)?;
    let shape = ChangeShape {
        shard,
        table,
        format,
    };
    write_record(record, change, sequence_number, &shape, out);
    Ok(())
}

/// Appends the envelope of a record whose parts were checked.
fn write_record(
    record: &StreamRecord,
    change: &ChangeData,
    sequence_number: &SequenceNumber,
    shape: &ChangeShape<'_>,
    out: &mut Vec<u8>,
) {
    let fields = ChangeFields {
        event_id: record.event_id.as_deref(),
        event_name: record.event_name.as_deref(),
        sequence_number: sequence_number.as_str(),
        size_bytes: change.size_bytes,
        view_type: change.view_type.as_deref(),
        created_ms: change.created_ms,
        user_identity: record
            .user_identity
            .as_ref()
            .map(|identity| (identity.principal_id.as_deref(), identity.kind.as_deref())),
    };
    write_envelope(&fields, shape, out, |image, out| {
        let item = match image {
            Image::New => change.new_image.as_ref(),
            Image::Old => change.old_image.as_ref(),
            Image::Keys => change.keys.as_ref(),
        };
        match item {
            Some(item) => shape.format.write_item(item, out),
            None => out.extend_from_slice(b"null"),
        }
    });
}

/// The change part and the sequence number of `record`, which every envelope needs.
fn parts<'r>(
    record: &'r StreamRecord,
    shard: &ShardId,
) -> Result<(&'r ChangeData, &'r SequenceNumber), EnvelopeError> {
    let Some(change) = &record.change else {
        return Err(EnvelopeError::NoStreamRecord {
            event_id: record.event_id.clone(),
            shard: shard.clone(),
        });
    };
    let Some(sequence_number) = &change.sequence_number else {
        return Err(EnvelopeError::NoSequenceNumber {
            event_id: record.event_id.clone(),
            shard: shard.clone(),
        });
    };
    Ok((change, sequence_number))
}

/// Writes every record of a page as its envelope, stopping at the first that cannot be one.
pub fn write_changes(
    records: &[StreamRecord],
    shape: &ChangeShape<'_>,
) -> Result<Changes, EnvelopeError> {
    let mut changes = Changes {
        envelopes: Lines::with_capacity(records.len(), records.len() * 512),
        records: Vec::with_capacity(records.len()),
    };
    for record in records {
        let (change, sequence_number) = parts(record, shape.shard)?;
        changes
            .envelopes
            .push_with(|out| write_record(record, change, sequence_number, shape, out));
        changes.records.push(ChangeMeta {
            sequence_number: sequence_number.clone(),
            created_ms: change.created_ms,
            op: ChangeOp::of(record.event_name.as_deref()),
        });
    }
    Ok(changes)
}

/// The fields of a change envelope other than its images, borrowed from wherever the record
/// was read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChangeFields<'a> {
    pub(crate) event_id: Option<&'a str>,
    pub(crate) event_name: Option<&'a str>,
    pub(crate) sequence_number: &'a str,
    pub(crate) size_bytes: Option<i64>,
    pub(crate) view_type: Option<&'a str>,
    pub(crate) created_ms: Option<i64>,
    /// `userIdentity`: its `PrincipalId` and `Type`.
    pub(crate) user_identity: Option<(Option<&'a str>, Option<&'a str>)>,
}

/// The images of a change envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Image {
    /// `NewImage`: the envelope's `after`.
    New,
    /// `OldImage`: the envelope's `before`.
    Old,
    /// `Keys`: the envelope's `key` and `document_key`.
    Keys,
}

/// Appends a change envelope; `image` appends each image in the record's format, or `null`.
/// The keys are written once and their bytes copied for the second field.
pub(crate) fn write_envelope(
    fields: &ChangeFields<'_>,
    shape: &ChangeShape<'_>,
    out: &mut Vec<u8>,
    mut image: impl FnMut(Image, &mut Vec<u8>),
) {
    out.extend_from_slice(b"{\"after\":");
    image(Image::New, out);
    out.extend_from_slice(b",\"before\":");
    image(Image::Old, out);
    out.extend_from_slice(b",\"document_key\":");
    let key_start = out.len();
    image(Image::Keys, out);
    let key_end = out.len();
    out.extend_from_slice(b",\"event_id\":");
    write_optional_str(fields.event_id, out);
    out.extend_from_slice(b",\"event_name\":");
    write_json(fields.event_name.unwrap_or("UNKNOWN"), out);
    out.extend_from_slice(b",\"key\":");
    out.extend_from_within(key_start..key_end);
    out.extend_from_slice(b",\"op\":");
    write_json(op_of(fields.event_name).as_ref(), out);
    out.extend_from_slice(b",\"sequence_number\":");
    write_json(fields.sequence_number, out);
    out.extend_from_slice(b",\"shard_id\":");
    write_json(shape.shard.as_str(), out);
    out.extend_from_slice(b",\"size_bytes\":");
    write_optional_i64(fields.size_bytes, out);
    out.extend_from_slice(b",\"stream_view_type\":");
    write_optional_str(fields.view_type, out);
    out.extend_from_slice(b",\"table\":");
    write_json(shape.table, out);
    out.extend_from_slice(b",\"ts_ms\":");
    write_optional_i64(fields.created_ms, out);
    out.extend_from_slice(b",\"user_identity\":");
    match fields.user_identity {
        Some((principal_id, kind)) => {
            out.extend_from_slice(b"{\"principal_id\":");
            write_optional_str(principal_id, out);
            out.extend_from_slice(b",\"type\":");
            write_optional_str(kind, out);
            out.push(b'}');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
}

/// Appends the snapshot envelope of a scanned item (op "r", event_name "SNAPSHOT", after = item,
/// key = document_key = key_of(item, key_schema), all stream fields null). No newline is
/// written.
pub fn write_snapshot(
    item: &Item,
    key_schema: &[KeyAttribute],
    table: &str,
    format: ValueFormat,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"{\"after\":");
    format.write_item(item, out);
    finish_snapshot(key_schema, table, out, |name, out| match item.get(name) {
        Some(value) => {
            format.write_value(value, out);
            true
        }
        None => false,
    });
}

/// Appends what follows `after` in a snapshot envelope whose item was just written.
/// `value_of` appends the value of a key attribute in the item's format and says whether the
/// item has it.
pub(crate) fn finish_snapshot(
    key_schema: &[KeyAttribute],
    table: &str,
    out: &mut Vec<u8>,
    value_of: impl FnMut(&str, &mut Vec<u8>) -> bool,
) {
    out.extend_from_slice(b",\"before\":null,\"document_key\":");
    let key_start = out.len();
    write_key_of(key_schema, out, value_of);
    let key_end = out.len();
    out.extend_from_slice(b",\"event_id\":null,\"event_name\":\"SNAPSHOT\",\"key\":");
    out.extend_from_within(key_start..key_end);
    out.extend_from_slice(
        b",\"op\":\"r\",\"sequence_number\":null,\"shard_id\":null,\"size_bytes\":null,\
          \"stream_view_type\":null,\"table\":",
    );
    write_json(table, out);
    out.extend_from_slice(b",\"ts_ms\":null,\"user_identity\":null}");
}

/// op mapping: INSERT→"c", MODIFY→"u", REMOVE→"d", other names lower-cased, missing →
/// "unknown".
pub fn op_of(event_name: Option<&str>) -> Cow<'static, str> {
    match event_name {
        Some("INSERT") => Cow::Borrowed("c"),
        Some("MODIFY") => Cow::Borrowed("u"),
        Some("REMOVE") => Cow::Borrowed("d"),
        Some(other) => Cow::Owned(other.to_lowercase()),
        None => Cow::Borrowed("unknown"),
    }
}

/// `key_of(item)` (docs/values.md §3.6): one entry per key attribute copied from the item by
/// `value_of`, `null` when the item lacks it. The key schema lists the hash key first, which
/// need not be the first name in byte order, so the names are sorted here.
fn write_key_of(
    key_schema: &[KeyAttribute],
    out: &mut Vec<u8>,
    mut value_of: impl FnMut(&str, &mut Vec<u8>) -> bool,
) {
    // A key schema has one or two attributes: this allocation is a few words.
    let mut names: Vec<&str> = key_schema.iter().map(|key| key.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    out.push(b'{');
    for (index, name) in names.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_json(name, out);
        out.push(b':');
        if !value_of(name, out) {
            out.extend_from_slice(b"null");
        }
    }
    out.push(b'}');
}

fn write_optional_str(text: Option<&str>, out: &mut Vec<u8>) {
    match text {
        Some(text) => write_json(text, out),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_optional_i64(number: Option<i64>, out: &mut Vec<u8>) {
    match number {
        Some(number) => write_json(&number, out),
        None => out.extend_from_slice(b"null"),
    }
}

/// Writes a string or an integer as `serde_json` does.
fn write_json<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    serde_json::to_writer(out, value)
        .expect("a string or an integer serializes into a Vec<u8> without error");
}

#[cfg(test)]
mod tests {
    use ddbpipe_value::{Number, Value};

    use super::*;
    use crate::api::{KeyType, UserIdentity};

    fn shard() -> ShardId {
        ShardId::new("shardId-00000001700000000000-0123abcd")
    }

    fn item(entries: &[(&str, Value)]) -> Item {
        entries
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone()))
            .collect()
    }

    fn s(text: &str) -> Value {
        Value::S(text.to_string())
    }

    fn n(text: &str) -> Value {
        Value::N(Number::new(text))
    }

    fn record(
        event_name: &str,
        old_image: Option<Item>,
        new_image: Option<Item>,
        user_identity: Option<UserIdentity>,
    ) -> StreamRecord {
        StreamRecord {
            event_id: Some("ev-1".to_string()),
            event_name: Some(event_name.to_string()),
            change: Some(ChangeData {
                created_ms: Some(1_700_000_000_000),
                keys: Some(item(&[("pk", s("a"))])),
                new_image,
                old_image,
                sequence_number: Some(SequenceNumber::parse("4960000000000000000000001").unwrap()),
                size_bytes: Some(42),
                view_type: Some("NEW_AND_OLD_IMAGES".to_string()),
            }),
            user_identity,
        }
    }

    fn change(record: &StreamRecord, format: ValueFormat) -> String {
        let mut out = Vec::new();
        write_change(record, &shard(), "orders", format, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    fn schema(names: &[&str]) -> Vec<KeyAttribute> {
        names
            .iter()
            .map(|name| KeyAttribute {
                name: name.to_string(),
                key_type: KeyType::S,
            })
            .collect()
    }

    fn snapshot(item: &Item, key_schema: &[KeyAttribute], format: ValueFormat) -> String {
        let mut out = Vec::new();
        write_snapshot(item, key_schema, "orders", format, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_insert_is_op_c_with_an_after_image_only() {
        let insert = record("INSERT", None, Some(item(&[("pk", s("a"))])), None);
        let envelope = json(&change(&insert, ValueFormat::Plain));
        assert_eq!(envelope["op"], "c");
        assert_eq!(envelope["event_name"], "INSERT");
        assert_eq!(envelope["after"], json(r#"{"pk":"a"}"#));
        assert!(envelope["before"].is_null());
        assert_eq!(envelope["document_key"], envelope["key"]);
        assert!(envelope["user_identity"].is_null());
    }

    #[test]
    fn a_modify_is_op_u_with_before_and_after_images() {
        let before = item(&[("pk", s("a")), ("n", n("1"))]);
        let after = item(&[("pk", s("a")), ("n", n("2"))]);
        let modify = record("MODIFY", Some(before), Some(after), None);
        let envelope = json(&change(&modify, ValueFormat::Plain));
        assert_eq!(envelope["op"], "u");
        assert_eq!(envelope["before"], json(r#"{"n":1,"pk":"a"}"#));
        assert_eq!(envelope["after"], json(r#"{"n":2,"pk":"a"}"#));
        assert_eq!(envelope["document_key"], envelope["key"]);
    }

    #[test]
    fn a_remove_is_op_d_with_a_before_image_only() {
        let remove = record("REMOVE", Some(item(&[("pk", s("a"))])), None, None);
        let envelope = json(&change(&remove, ValueFormat::Plain));
        assert_eq!(envelope["op"], "d");
        assert!(envelope["after"].is_null());
        assert_eq!(envelope["before"], json(r#"{"pk":"a"}"#));
        assert_eq!(envelope["key"], json(r#"{"pk":"a"}"#));
        assert_eq!(envelope["document_key"], envelope["key"]);
    }

    #[test]
    fn a_ttl_delete_is_op_d_with_the_service_as_user_identity() {
        let ttl = UserIdentity {
            principal_id: Some("dynamodb.amazonaws.com".to_string()),
            kind: Some("Service".to_string()),
        };
        let remove = record("REMOVE", Some(item(&[("pk", s("a"))])), None, Some(ttl));
        let envelope = change(&remove, ValueFormat::Plain);
        assert_eq!(json(&envelope)["op"], "d");
        assert!(envelope.contains(
            r#""user_identity":{"principal_id":"dynamodb.amazonaws.com","type":"Service"}"#
        ));
    }

    #[test]
    fn a_user_identity_without_values_holds_nulls() {
        let nobody = UserIdentity {
            principal_id: None,
            kind: None,
        };
        let remove = record("REMOVE", None, None, Some(nobody));
        let envelope = change(&remove, ValueFormat::Plain);
        assert!(envelope.ends_with(r#""user_identity":{"principal_id":null,"type":null}}"#));
    }

    #[test]
    fn a_full_plain_envelope_has_exactly_these_bytes() {
        let before = item(&[("pk", s("a")), ("price", n("1.50"))]);
        let after = item(&[
            ("pk", s("a")),
            ("price", n("2")),
            ("blob", Value::B(vec![1, 2])),
        ]);
        let modify = record("MODIFY", Some(before), Some(after), None);
        assert_eq!(
            change(&modify, ValueFormat::Plain),
            concat!(
                r#"{"after":{"blob":"AQI=","pk":"a","price":2},"before":{"pk":"a","price":1.5},"#,
                r#""document_key":{"pk":"a"},"event_id":"ev-1","event_name":"MODIFY","#,
                r#""key":{"pk":"a"},"op":"u","sequence_number":"4960000000000000000000001","#,
                r#""shard_id":"shardId-00000001700000000000-0123abcd","size_bytes":42,"#,
                r#""stream_view_type":"NEW_AND_OLD_IMAGES","table":"orders","#,
                r#""ts_ms":1700000000000,"user_identity":null}"#,
            )
        );
    }

    #[test]
    fn a_full_typed_envelope_has_exactly_these_bytes() {
        let ttl = UserIdentity {
            principal_id: Some("dynamodb.amazonaws.com".to_string()),
            kind: Some("Service".to_string()),
        };
        let old = item(&[
            ("pk", s("a")),
            ("price", n("12345678901234567890.123456789")),
            ("tags", Value::Ss(vec!["x".to_string()])),
        ]);
        let remove = record("REMOVE", Some(old), None, Some(ttl));
        assert_eq!(
            change(&remove, ValueFormat::Typed),
            concat!(
                r#"{"after":null,"before":{"pk":{"S":"a"},"#,
                r#""price":{"N":"12345678901234567890.123456789"},"tags":{"SS":["x"]}},"#,
                r#""document_key":{"pk":{"S":"a"}},"event_id":"ev-1","event_name":"REMOVE","#,
                r#""key":{"pk":{"S":"a"}},"op":"d","sequence_number":"4960000000000000000000001","#,
                r#""shard_id":"shardId-00000001700000000000-0123abcd","size_bytes":42,"#,
                r#""stream_view_type":"NEW_AND_OLD_IMAGES","table":"orders","#,
                r#""ts_ms":1700000000000,"#,
                r#""user_identity":{"principal_id":"dynamodb.amazonaws.com","type":"Service"}}"#,
            )
        );
    }

    #[test]
    fn every_key_of_every_envelope_is_sorted_and_the_output_compact() {
        let identity = UserIdentity {
            principal_id: Some("p".to_string()),
            kind: Some("t".to_string()),
        };
        let nested = item(&[
            ("z", Value::M(item(&[("b", n("1")), ("a", Value::Null)]))),
            ("Z", Value::L(vec![Value::Bool(true)])),
            ("é", s("x")),
        ]);
        let full = record(
            "MODIFY",
            Some(nested.clone()),
            Some(nested.clone()),
            Some(identity),
        );
        let bare = StreamRecord {
            event_id: None,
            event_name: None,
            change: Some(ChangeData {
                created_ms: None,
                keys: None,
                new_image: None,
                old_image: None,
                sequence_number: Some(SequenceNumber::parse("1").unwrap()),
                size_bytes: None,
                view_type: None,
            }),
            user_identity: None,
        };
        let key_schema = schema(&["z", "Z"]);
        for format in [ValueFormat::Plain, ValueFormat::Typed] {
            let envelopes = [
                change(&full, format),
                change(&bare, format),
                snapshot(&nested, &key_schema, format),
            ];
            for envelope in envelopes {
                // serde_json (without `preserve_order`, as here) re-serializes objects with
                // their keys sorted and without whitespace.
                let reserialized = serde_json::to_string(&json(&envelope)).unwrap();
                assert_eq!(envelope, reserialized);
                assert_eq!(json(&envelope).as_object().unwrap().len(), 14);
            }
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut odd = record("INSERT\u{1}\"", None, None, None);
        odd.event_id = Some("ev\\\n\u{7f}é\u{2028}".to_string());
        let envelope = json(&change(&odd, ValueFormat::Plain));
        let mut out = Vec::new();
        write_change(&odd, &shard(), "or\"ders\t", ValueFormat::Plain, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for raw in ["INSERT\u{1}\"", "ev\\\n\u{7f}é\u{2028}", "or\"ders\t"] {
            assert!(
                text.contains(&serde_json::to_string(raw).unwrap()),
                "{raw:?}"
            );
        }
        assert_eq!(envelope["op"], "insert\u{1}\"");
    }

    #[test]
    fn a_record_without_an_event_name_is_unknown() {
        let mut nameless = record("INSERT", None, None, None);
        nameless.event_name = None;
        let envelope = json(&change(&nameless, ValueFormat::Plain));
        assert_eq!(envelope["event_name"], "UNKNOWN");
        assert_eq!(envelope["op"], "unknown");
    }

    #[test]
    fn a_record_without_keys_has_a_null_key_and_document_key() {
        let mut keyless = record("INSERT", None, None, None);
        if let Some(change) = &mut keyless.change {
            change.keys = None;
        }
        let envelope = change(&keyless, ValueFormat::Typed);
        assert!(envelope.contains(r#""document_key":null,"#));
        assert!(envelope.contains(r#""key":null,"#));
    }

    #[test]
    fn envelopes_are_appended_to_what_the_buffer_holds() {
        let insert = record("INSERT", None, None, None);
        let mut out = b"line\n".to_vec();
        write_change(&insert, &shard(), "orders", ValueFormat::Plain, &mut out).unwrap();
        let written = String::from_utf8(out).unwrap();
        let rest = written.strip_prefix("line\n").unwrap();
        assert_eq!(rest, change(&insert, ValueFormat::Plain));
        assert_eq!(json(rest)["key"], json(r#"{"pk":"a"}"#));
    }

    #[test]
    fn a_record_without_a_stream_record_fails_and_writes_nothing() {
        let mut broken = record("INSERT", None, None, None);
        broken.change = None;
        let mut out = b"kept".to_vec();
        let error =
            write_change(&broken, &shard(), "orders", ValueFormat::Plain, &mut out).unwrap_err();
        assert_eq!(
            error.to_string(),
            "record ev-1 in shardId-00000001700000000000-0123abcd has no stream record"
        );
        assert_eq!(out, b"kept");
        broken.event_id = None;
        let error = write_change(
            &broken,
            &ShardId::new("s1"),
            "t",
            ValueFormat::Plain,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(error.to_string(), "record ? in s1 has no stream record");
    }

    #[test]
    fn a_record_without_a_sequence_number_fails_and_writes_nothing() {
        let mut broken = record("INSERT", None, None, None);
        if let Some(change) = &mut broken.change {
            change.sequence_number = None;
        }
        let mut out = Vec::new();
        let error = write_change(
            &broken,
            &ShardId::new("s1"),
            "t",
            ValueFormat::Plain,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "record ev-1 in s1 has no sequence number"
        );
        assert_eq!(
            error,
            EnvelopeError::NoSequenceNumber {
                event_id: Some("ev-1".to_string()),
                shard: ShardId::new("s1"),
            }
        );
        assert!(out.is_empty());
        broken.event_id = None;
        let error = write_change(
            &broken,
            &ShardId::new("s1"),
            "t",
            ValueFormat::Plain,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(error.to_string(), "record ? in s1 has no sequence number");
    }

    #[test]
    fn event_names_map_to_ops() {
        assert_eq!(op_of(Some("INSERT")), "c");
        assert_eq!(op_of(Some("MODIFY")), "u");
        assert_eq!(op_of(Some("REMOVE")), "d");
        assert_eq!(op_of(Some("FOO")), "foo");
        assert_eq!(op_of(None), "unknown");
    }

    #[test]
    fn a_plain_snapshot_envelope_has_exactly_these_bytes() {
        let scanned = item(&[("pk", s("a")), ("sk", n("1.0")), ("x", Value::Bool(true))]);
        assert_eq!(
            snapshot(&scanned, &schema(&["pk", "sk"]), ValueFormat::Plain),
            concat!(
                r#"{"after":{"pk":"a","sk":1,"x":true},"before":null,"#,
                r#""document_key":{"pk":"a","sk":1},"event_id":null,"event_name":"SNAPSHOT","#,
                r#""key":{"pk":"a","sk":1},"op":"r","sequence_number":null,"shard_id":null,"#,
                r#""size_bytes":null,"stream_view_type":null,"table":"orders","ts_ms":null,"#,
                r#""user_identity":null}"#,
            )
        );
    }

    #[test]
    fn a_typed_snapshot_envelope_keeps_the_number_text() {
        let scanned = item(&[("pk", s("a")), ("sk", n("1.0"))]);
        let envelope = snapshot(&scanned, &schema(&["pk", "sk"]), ValueFormat::Typed);
        let expected_key = r#"{"pk":{"S":"a"},"sk":{"N":"1.0"}}"#;
        assert!(envelope.starts_with(&format!(r#"{{"after":{expected_key},"before":null,"#)));
        assert!(envelope.contains(&format!(r#""document_key":{expected_key},"#)));
        assert!(envelope.contains(&format!(r#""key":{expected_key},"op":"r","#)));
    }

    #[test]
    fn a_snapshot_key_attribute_missing_from_the_item_is_null() {
        let scanned = item(&[("pk", s("a"))]);
        let envelope = json(&snapshot(
            &scanned,
            &schema(&["pk", "sk"]),
            ValueFormat::Plain,
        ));
        assert_eq!(envelope["key"], json(r#"{"pk":"a","sk":null}"#));
        assert_eq!(envelope["document_key"], envelope["key"]);
    }

    #[test]
    fn a_snapshot_key_lists_its_attributes_in_byte_order_not_schema_order() {
        let scanned = item(&[("b", s("hash")), ("a", s("range")), ("c", s("other"))]);
        let envelope = snapshot(&scanned, &schema(&["b", "a"]), ValueFormat::Plain);
        assert!(envelope.contains(r#""key":{"a":"range","b":"hash"},"#));
    }
}
