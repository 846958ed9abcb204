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
//! The records envelopes are written from (`record.rs`: [`StreamRecord`], and what the shard
//! reader keeps of each, [`Changes`]) are defined here, below `crate::api`, which re-exports
//! them as the data of its `StreamsApi`: the API, the wire decoder, exports and streams all
//! write envelopes, so this module names none of them.
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

mod fields;
mod record;

pub use fields::{EnvelopeFields, NotedEnvelope, decoded, raw_text};

use std::borrow::Cow;
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use ddbpipe_value::{Item, ValueFormat};
use serde::Serialize;

use crate::ids::{SequenceNumber, ShardId};
use crate::key_schema::KeyAttribute;
use crate::records::Lines;

pub use record::{
    ChangeData, ChangeMeta, ChangeOp, ChangeShape, Changes, StreamRecord, UserIdentity,
};

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
        sequence_number: Some(sequence_number.as_str()),
        shard_id: Some(shape.shard.as_str()),
        size_bytes: change.size_bytes,
        view_type: change.view_type.as_deref(),
        created_ms: change.created_ms,
        user_identity: record
            .user_identity
            .as_ref()
            .map(|identity| (identity.principal_id.as_deref(), identity.kind.as_deref())),
    };
    let _ = write_envelope(&fields, shape.table, out, |image, out| {
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
    /// `None` for a change read from an incremental export.
    pub(crate) sequence_number: Option<&'a str>,
    /// `None` for a change read from an incremental export.
    pub(crate) shard_id: Option<&'a str>,
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

/// The fields of a change envelope whose values a page of changes notes where it writes them
/// ([`Lines::noted_values`](crate::records::Lines::noted_values)), in name order: what the keyed,
/// lake and Kafka sinks read back from an envelope without parsing it.
pub const NOTED_FIELDS: [&str; 9] = [
    "after",
    "before",
    "event_id",
    "key",
    "op",
    "sequence_number",
    "shard_id",
    "ts_ms",
    "user_identity",
];

/// [`NOTED_FIELDS`] as the lines of every page of changes note them: one list, shared, which
/// a reader of the notes recognises by its address.
pub(crate) static NOTED_NAMES: LazyLock<Arc<[String]>> =
    LazyLock::new(|| NOTED_FIELDS.iter().map(|name| name.to_string()).collect());

/// Where [`write_envelope`] wrote the values of [`NOTED_FIELDS`] in its output.
pub(crate) struct EnvelopeSpans([Range<usize>; NOTED_FIELDS.len()]);

impl EnvelopeSpans {
    /// Notes these spans as those of the record `lines` just took (lines noting
    /// [`NOTED_NAMES`]), in [`NOTED_FIELDS`]' order: no name is looked up.
    pub(crate) fn note(&self, lines: &mut Lines) {
        lines.note_last_in_order(&NOTED_NAMES, &self.0);
    }
}

/// Appends a change envelope; `image` appends each image in the record's format, or `null`.
/// The keys are written once and their bytes copied for the second field. Returns where the
/// values of [`NOTED_FIELDS`] went.
pub(crate) fn write_envelope(
    fields: &ChangeFields<'_>,
    table: &str,
    out: &mut Vec<u8>,
    mut image: impl FnMut(Image, &mut Vec<u8>),
) -> EnvelopeSpans {
    let mut spans: [Range<usize>; NOTED_FIELDS.len()] = Default::default();
    // Writes the field named `name` by `write`, noting its span when it is noted.
    let field = |name: &[u8], out: &mut Vec<u8>, write: &mut dyn FnMut(&mut Vec<u8>)| {
        out.extend_from_slice(name);
        let start = out.len();
        write(out);
        (start, out.len())
    };
    let (start, end) = field(b"{\"after\":", out, &mut |out| image(Image::New, out));
    spans[0] = start..end;
    let (start, end) = field(b",\"before\":", out, &mut |out| image(Image::Old, out));
    spans[1] = start..end;
    let (key_start, key_end) = field(b",\"document_key\":", out, &mut |out| {
        image(Image::Keys, out)
    });
    let (start, end) = field(b",\"event_id\":", out, &mut |out| {
        write_optional_str(fields.event_id, out)
    });
    spans[2] = start..end;
    out.extend_from_slice(b",\"event_name\":");
    write_json(fields.event_name.unwrap_or("UNKNOWN"), out);
    let (start, end) = field(b",\"key\":", out, &mut |out| {
        out.extend_from_within(key_start..key_end)
    });
    spans[3] = start..end;
    let (start, end) = field(b",\"op\":", out, &mut |out| {
        write_json(op_of(fields.event_name).as_ref(), out)
    });
    spans[4] = start..end;
    let (start, end) = field(b",\"sequence_number\":", out, &mut |out| {
        write_optional_str(fields.sequence_number, out)
    });
    spans[5] = start..end;
    let (start, end) = field(b",\"shard_id\":", out, &mut |out| {
        write_optional_str(fields.shard_id, out)
    });
    spans[6] = start..end;
    out.extend_from_slice(b",\"size_bytes\":");
    write_optional_i64(fields.size_bytes, out);
    out.extend_from_slice(b",\"stream_view_type\":");
    write_optional_str(fields.view_type, out);
    out.extend_from_slice(b",\"table\":");
    write_json(table, out);
    let (start, end) = field(b",\"ts_ms\":", out, &mut |out| {
        write_optional_i64(fields.created_ms, out)
    });
    spans[7] = start..end;
    let (start, end) = field(
        b",\"user_identity\":",
        out,
        &mut |out| match fields.user_identity {
            Some((principal_id, kind)) => {
                out.extend_from_slice(b"{\"principal_id\":");
                write_optional_str(principal_id, out);
                out.extend_from_slice(b",\"type\":");
                write_optional_str(kind, out);
                out.push(b'}');
            }
            None => out.extend_from_slice(b"null"),
        },
    );
    spans[8] = start..end;
    out.push(b'}');
    EnvelopeSpans(spans)
}

/// Appends the change envelope of one line of an incremental export (docs/streams.md §4.12):
/// `after` = its `NewImage`, `before` = its `OldImage`, `key` = its `Keys`; `op` `"c"`
/// (`INSERT`: no old image), `"u"` (`MODIFY`) or `"d"` (`REMOVE`: no new image); `ts_ms` = its
/// `WriteTimestampMicros` in ms (exact, not rounded to the second); `stream_view_type`
/// `"NEW_AND_OLD_IMAGES"`; `event_id`, `sequence_number`, `shard_id`, `size_bytes` and
/// `user_identity` null. No newline is written.
pub fn write_export_change(
    keys: &Item,
    new_image: Option<&Item>,
    old_image: Option<&Item>,
    written_ms: i64,
    table: &str,
    format: ValueFormat,
    out: &mut Vec<u8>,
) {
    let event_name = match (new_image, old_image) {
        (None, _) => "REMOVE",
        (Some(_), None) => "INSERT",
        (Some(_), Some(_)) => "MODIFY",
    };
    let fields = ChangeFields {
        event_id: None,
        event_name: Some(event_name),
        sequence_number: None,
        shard_id: None,
        size_bytes: None,
        view_type: Some("NEW_AND_OLD_IMAGES"),
        created_ms: Some(written_ms),
        user_identity: None,
    };
    let _ = write_envelope(&fields, table, out, |image, out| {
        let item = match image {
            Image::New => new_image,
            Image::Old => old_image,
            Image::Keys => Some(keys),
        };
        match item {
            Some(item) => format.write_item(item, out),
            None => out.extend_from_slice(b"null"),
        }
    });
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
    let after = out.len();
    format.write_item(item, out);
    let after = after..out.len();
    finish_snapshot(key_schema, table, out, after, |name, out| {
        match item.get(name) {
            Some(value) => {
                format.write_value(value, out);
                true
            }
            None => false,
        }
    });
}

/// Appends what follows `after` in a snapshot envelope whose item was just written at
/// `after` (a range of `out`). `value_of` appends the value of a key attribute in the item's
/// format and says whether the item has it. Returns where the values of [`NOTED_FIELDS`]
/// are, as [`write_envelope`] does.
pub(crate) fn finish_snapshot(
    key_schema: &[KeyAttribute],
    table: &str,
    out: &mut Vec<u8>,
    after: Range<usize>,
    value_of: impl FnMut(&str, &mut Vec<u8>) -> bool,
) -> EnvelopeSpans {
    // Writes `text`, then a literal value, returning the value's span.
    let literal = |out: &mut Vec<u8>, text: &[u8], value: &[u8]| {
        out.extend_from_slice(text);
        let start = out.len();
        out.extend_from_slice(value);
        start..out.len()
    };
    let before = literal(out, b",\"before\":", b"null");
    out.extend_from_slice(b",\"document_key\":");
    let key_start = out.len();
    write_key_of(key_schema, out, value_of);
    let key_end = out.len();
    let event_id = literal(out, b",\"event_id\":", b"null");
    out.extend_from_slice(b",\"event_name\":\"SNAPSHOT\",\"key\":");
    let key = out.len()..out.len() + (key_end - key_start);
    out.extend_from_within(key_start..key_end);
    let op = literal(out, b",\"op\":", b"\"r\"");
    let sequence_number = literal(out, b",\"sequence_number\":", b"null");
    let shard_id = literal(out, b",\"shard_id\":", b"null");
    out.extend_from_slice(b",\"size_bytes\":null,\"stream_view_type\":null,\"table\":");
    write_json(table, out);
    let ts_ms = literal(out, b",\"ts_ms\":", b"null");
    let user_identity = literal(out, b",\"user_identity\":", b"null");
    out.push(b'}');
    EnvelopeSpans([
        after,
        before,
        event_id,
        key,
        op,
        sequence_number,
        shard_id,
        ts_ms,
        user_identity,
    ])
}

/// op mapping: INSERT→"c", MODIFY→"u", REMOVE→"d", other names lower-cased, missing →
/// "unknown".
pub fn op_of(event_name: Option<&str>) -> Cow<'static, str> {
    match (ChangeOp::of(event_name).code(), event_name) {
        (Some(code), _) => Cow::Borrowed(code),
        (None, Some(other)) => Cow::Owned(other.to_lowercase()),
        (None, None) => Cow::Borrowed("unknown"),
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
mod tests;
