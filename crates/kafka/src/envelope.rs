//! A record to a Kafka message: its key and its value (docs/sinks.md §7.8).
//!
//! A record is one line of a batch: an item (scan, query) or a change envelope (streams,
//! mirror; docs/streams.md §4.1). A [`Shaper`] turns each line into one [`Message`], or two for
//! a delete followed by its tombstone.
//!
//! # Rules
//! 1. **Key.** The item's key attributes as one compact JSON object, the names in byte order
//!    (the order of the envelope's `key`, docs/values.md §3.6), each value copied from the
//!    record as its bytes are: a 38-digit number keeps its digits, binary its base64, a typed
//!    line its `{"N": …}`. An item line's key and the `key` field of any envelope of the same
//!    item give the same bytes, so every change of an item and its snapshot row land in one
//!    partition, in order. A key attribute that is missing or `null` is an error.
//! 2. **Debezium value** (`envelope: debezium`, the default): one compact object with keys in
//!    this order: `before`, `after` (the images copied from the line, or `null`), `source`,
//!    `op`, `ts_ms` (when the message was produced) and `transaction` (`null`). `source` holds
//!    `version` (ddbpipe's), `connector` (`"dynamodb"`), `name` (the pipeline), `ts_ms` (the
//!    record's time; the batch's read time for snapshot rows and items), `snapshot` (`"true"`
//!    for snapshot rows and items, `"false"` for changes), `table`, `region`, and from the
//!    envelope `shard_id`, `sequence_number`, `event_id` and `user_identity` (`null` for items
//!    and snapshot rows). An item is `op: "r"`, its `after` the whole line.
//! 3. **ddbpipe value** (`envelope: ddbpipe`): the line itself, byte for byte, items and
//!    envelopes alike.
//! 4. **Tombstones** (`tombstones: true`): an `op: "d"` message is followed by a second one with
//!    the same key and no value, so a compacted topic forgets the item. No other op gets one.
//! 5. **Errors.** An envelope whose `op` is none of `c`, `u`, `d`, `r` is refused, whatever the
//!    value's shape (it might be a delete whose tombstone would be lost), naming the record by
//!    its event id and shard, and the op. A line that is not UTF-8 or not JSON, or has no key,
//!    is refused naming the record: an envelope by event id and shard, an item (or an envelope
//!    without either) by the start of its text.
//! 6. **Hot path.** This runs for every record: a line is parsed once into borrowed
//!    [`RawValue`]s (the key object a second time, a few bytes), and each part is written by
//!    copying its bytes into one buffer reserved near the line's size. No `serde_json::Value`
//!    and no re-serialisation of a value.

use std::borrow::Cow;
use std::io::Write as _;

use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::envelope::{NotedEnvelope, decoded, raw_text};
use ddbpipe_source::records::Lines;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The value a message carries: the `envelope:` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EnvelopeKind {
    /// A Debezium-shaped change event (rule 2), what existing Debezium consumers read.
    #[default]
    Debezium,
    /// The record's line as ddbpipe writes it to jsonl (rule 3).
    Ddbpipe,
}

/// What a [`Shaper`] is built from: the sink's settings and the table's key.
#[derive(Debug, Clone)]
pub struct ShaperSettings {
    /// The value's shape.
    pub envelope: EnvelopeKind,
    /// Whether the lines are items (scan, query) or envelopes (streams, mirror).
    pub records: Records,
    /// The table's key attribute names, hash key first (docs/values.md §3.6).
    pub key_attributes: Vec<String>,
    /// The pipeline's name: the Debezium `source.name`.
    pub pipeline: String,
    /// The configured table name: the Debezium `source.table`.
    pub table: String,
    /// The table's region, when known: the Debezium `source.region`.
    pub region: Option<String>,
    /// Whether a delete is followed by a tombstone (rule 4).
    pub tombstones: bool,
}

/// Turns record lines into Kafka messages (module docs).
#[derive(Debug, Clone)]
pub struct Shaper {
    envelope: EnvelopeKind,
    records: Records,
    /// The key attributes in byte order of their names: the order of the message key.
    key: Vec<KeyName>,
    /// `,"source":{"version":…,"connector":"dynamodb","name":…,"ts_ms":`, the same for
    /// every message.
    source_head: Vec<u8>,
    /// `,"table":…,"region":…`, the same for every message.
    source_place: Vec<u8>,
    tombstones: bool,
}

/// One key attribute: its name, and the name as a JSON string followed by `:`.
#[derive(Debug, Clone)]
struct KeyName {
    name: String,
    json: Vec<u8>,
}

/// One Kafka message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The key: the item's key attributes as a JSON object (rule 1).
    pub key: Vec<u8>,
    /// The value; `None` for a tombstone (rule 4).
    pub value: Option<Vec<u8>>,
}

/// What a record line was, as [`Shaper::messages`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shaped {
    /// A snapshot row or a scanned item (`op: r`).
    Row,
    /// A stream change (`c`, `u`, `d`).
    Change,
}

/// The operation of a message (Debezium's `op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `r`: a snapshot row or a scanned item.
    Read,
    /// `c`: an insert.
    Create,
    /// `u`: an update.
    Update,
    /// `d`: a delete.
    Delete,
}

impl Op {
    /// The op of an envelope's `op` field; `None` for any other.
    fn of(code: &str) -> Option<Self> {
        match code {
            "r" => Some(Op::Read),
            "c" => Some(Op::Create),
            "u" => Some(Op::Update),
            "d" => Some(Op::Delete),
            _ => None,
        }
    }

    /// The `"op":…` bytes of a Debezium value.
    fn field(self) -> &'static [u8] {
        match self {
            Op::Read => b"\"op\":\"r\"",
            Op::Create => b"\"op\":\"c\"",
            Op::Update => b"\"op\":\"u\"",
            Op::Delete => b"\"op\":\"d\"",
        }
    }
}

/// The parts of a Debezium value taken from a record: raw JSON texts, `None` written as
/// `null`.
struct Event<'a> {
    before: Option<&'a str>,
    after: Option<&'a str>,
    op: Op,
    source_ts_ms: Option<i64>,
    shard_id: Option<&'a str>,
    sequence_number: Option<&'a str>,
    event_id: Option<&'a str>,
    user_identity: Option<&'a str>,
}

/// The fields of a change envelope a message needs, borrowed from the line: its images, key
/// and ids as the JSON text the line holds (`None` for `null`).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    key: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    before: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    after: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    event_id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    shard_id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    sequence_number: Option<&'a str>,
    #[serde(default)]
    ts_ms: Option<i64>,
    #[serde(borrow, default, deserialize_with = "raw_text")]
    user_identity: Option<&'a str>,
}

impl<'a> Envelope<'a> {
    /// Record `i` of `records`, whose text is `text`: from where its page noted its fields
    /// (the images not read at all), else read from `text`.
    fn of(records: &'a Lines, i: usize, text: &'a str) -> serde_json::Result<Envelope<'a>> {
        let Some(noted) = NotedEnvelope::of(records, i, text) else {
            return serde_json::from_str(text);
        };
        Ok(Envelope {
            op: decoded(noted.op)?,
            key: noted.key,
            before: noted.before,
            after: noted.after,
            event_id: noted.event_id,
            shard_id: noted.shard_id,
            sequence_number: noted.sequence_number,
            ts_ms: noted.ts_ms.map(serde_json::from_str).transpose()?,
            user_identity: noted.user_identity,
        })
    }
}

/// Bytes a Debezium value adds to its images besides the shaper's fixed parts: field names,
/// the op, two times, a shard id, a sequence number and an event id.
const DEBEZIUM_OVERHEAD_BYTES: usize = 320;

impl Shaper {
    /// A shaper for one table's records; an error when `key_attributes` is empty (no message
    /// could have a key).
    pub fn new(settings: ShaperSettings) -> Result<Self, String> {
        let mut names = settings.key_attributes;
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Err(format!(
                "table {}: no key attributes are known, and a Kafka message's key is made of them",
                settings.table
            ));
        }
        let key = names
            .into_iter()
            .map(|name| {
                let mut json = json_string(&name);
                json.push(b':');
                KeyName { name, json }
            })
            .collect();
        let mut source_head = b",\"source\":{\"version\":".to_vec();
        source_head.extend_from_slice(&json_string(env!("CARGO_PKG_VERSION")));
        source_head.extend_from_slice(b",\"connector\":\"dynamodb\",\"name\":");
        source_head.extend_from_slice(&json_string(&settings.pipeline));
        source_head.extend_from_slice(b",\"ts_ms\":");
        let mut source_place = b",\"table\":".to_vec();
        source_place.extend_from_slice(&json_string(&settings.table));
        source_place.extend_from_slice(b",\"region\":");
        match &settings.region {
            Some(region) => source_place.extend_from_slice(&json_string(region)),
            None => source_place.extend_from_slice(b"null"),
        }
        Ok(Shaper {
            envelope: settings.envelope,
            records: settings.records,
            key,
            source_head,
            source_place,
            tombstones: settings.tombstones,
        })
    }

    /// Appends the messages of record `i` of `records` to `out`: one, or two for a delete
    /// with tombstones. `produced_ms`: now (the event's top-level `ts_ms`); `read_ms`: the
    /// batch's read time (the `source.ts_ms` of snapshot rows `op: r` and of scan items).
    /// Returns whether the record was a row or a change. On error nothing is appended.
    pub fn messages(
        &self,
        records: &Lines,
        i: usize,
        produced_ms: i64,
        read_ms: Option<i64>,
        out: &mut Vec<Message>,
    ) -> Result<Shaped, String> {
        let line = records.get(i).unwrap_or_default();
        let (key, value, op) = match self.records {
            Records::Items => self.item_message(records, i, line, produced_ms, read_ms)?,
            Records::Envelopes => self.envelope_message(records, i, line, produced_ms, read_ms)?,
        };
        if op == Op::Delete && self.tombstones {
            out.push(Message {
                key: key.clone(),
                value: Some(value),
            });
            out.push(Message { key, value: None });
        } else {
            out.push(Message {
                key,
                value: Some(value),
            });
        }
        Ok(if op == Op::Read {
            Shaped::Row
        } else {
            Shaped::Change
        })
    }

    /// The key and value of a scanned item (`op: r`): record `i` of `records`, `line`; its key
    /// from the page's notes where it has them.
    fn item_message(
        &self,
        records: &Lines,
        i: usize,
        line: &[u8],
        produced_ms: i64,
        read_ms: Option<i64>,
    ) -> Result<(Vec<u8>, Vec<u8>, Op), String> {
        let text = std::str::from_utf8(line)
            .map_err(|_| format!("item {} is not UTF-8", short_lossy(line)))?;
        let found = records
            .attributes(i, text, &self.key, |key| key.name.as_str())
            .map_err(|e| format!("item {}: not a JSON object: {e}", short(text)))?;
        let key = self
            .key_bytes(&found)
            .map_err(|problem| format!("item {}: {problem}", short(text)))?;
        let value = match self.envelope {
            EnvelopeKind::Ddbpipe => line.to_vec(),
            EnvelopeKind::Debezium => self.debezium(
                &Event {
                    before: None,
                    after: Some(text),
                    op: Op::Read,
                    source_ts_ms: read_ms,
                    shard_id: None,
                    sequence_number: None,
                    event_id: None,
                    user_identity: None,
                },
                produced_ms,
                line.len(),
            ),
        };
        Ok((key, value, Op::Read))
    }

    /// The key and value of a change or snapshot envelope: record `i` of `records`, `line`.
    fn envelope_message(
        &self,
        records: &Lines,
        i: usize,
        line: &[u8],
        produced_ms: i64,
        read_ms: Option<i64>,
    ) -> Result<(Vec<u8>, Vec<u8>, Op), String> {
        let text = std::str::from_utf8(line)
            .map_err(|_| format!("record {} is not UTF-8", short_lossy(line)))?;
        let envelope = Envelope::of(records, i, text)
            .map_err(|e| format!("record {}: not a change envelope: {e}", short(text)))?;
        let record = || record_name(&envelope, text);
        let op = Op::of(&envelope.op).ok_or_else(|| {
            format!(
                "{} has op '{}', which a Kafka message cannot carry (only c, u, d and r)",
                record(),
                envelope.op
            )
        })?;
        let raw_key = envelope
            .key
            .filter(|raw| *raw != "null")
            .ok_or_else(|| format!("{} has no key", record()))?;
        let found = self
            .key_attributes(raw_key)
            .map_err(|e| format!("{}: its key is not an object: {e}", record()))?;
        let key = self
            .key_bytes(&found)
            .map_err(|problem| format!("{}: {problem}", record()))?;
        let value = match self.envelope {
            EnvelopeKind::Ddbpipe => line.to_vec(),
            EnvelopeKind::Debezium => {
                let event = Event {
                    before: envelope.before,
                    after: envelope.after,
                    op,
                    source_ts_ms: if op == Op::Read {
                        read_ms
                    } else {
                        envelope.ts_ms
                    },
                    shard_id: envelope.shard_id,
                    sequence_number: envelope.sequence_number,
                    event_id: envelope.event_id,
                    user_identity: envelope.user_identity,
                };
                let images = event.before.map_or(0, str::len) + event.after.map_or(0, str::len);
                self.debezium(&event, produced_ms, images)
            }
        };
        Ok((key, value, op))
    }

    /// The values of the key attributes of the JSON object `text`, in [`Self::key`] order.
    fn key_attributes<'a>(&self, text: &'a str) -> serde_json::Result<Vec<Option<&'a RawValue>>> {
        ddbpipe_value::key_attributes(text, &self.key, |key| key.name.as_str())
    }

    /// The message key from the key attributes `found` (of [`Self::key_attributes`]).
    fn key_bytes(&self, found: &[Option<&RawValue>]) -> Result<Vec<u8>, String> {
        let size: usize = self
            .key
            .iter()
            .zip(found)
            .map(|(name, raw)| name.json.len() + raw.map_or(0, |raw| raw.get().len()) + 1)
            .sum();
        let mut key = Vec::with_capacity(size + 1);
        key.push(b'{');
        for (index, (name, raw)) in self.key.iter().zip(found).enumerate() {
            let raw = raw
                .filter(|raw| raw.get() != "null")
                .ok_or_else(|| format!("key attribute '{}' is missing", name.name))?;
            if index > 0 {
                key.push(b',');
            }
            key.extend_from_slice(&name.json);
            key.extend_from_slice(raw.get().as_bytes());
        }
        key.push(b'}');
        Ok(key)
    }

    /// A Debezium value (rule 2); `images` is the length of the images it copies.
    fn debezium(&self, event: &Event<'_>, produced_ms: i64, images: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            images
                + self.source_head.len()
                + self.source_place.len()
                + event.user_identity.map_or(0, str::len)
                + DEBEZIUM_OVERHEAD_BYTES,
        );
        out.extend_from_slice(b"{\"before\":");
        write_raw(event.before, &mut out);
        out.extend_from_slice(b",\"after\":");
        write_raw(event.after, &mut out);
        out.extend_from_slice(&self.source_head);
        write_optional_i64(event.source_ts_ms, &mut out);
        out.extend_from_slice(if event.op == Op::Read {
            b",\"snapshot\":\"true\""
        } else {
            b",\"snapshot\":\"false\""
        });
        out.extend_from_slice(&self.source_place);
        out.extend_from_slice(b",\"shard_id\":");
        write_raw(event.shard_id, &mut out);
        out.extend_from_slice(b",\"sequence_number\":");
        write_raw(event.sequence_number, &mut out);
        out.extend_from_slice(b",\"event_id\":");
        write_raw(event.event_id, &mut out);
        out.extend_from_slice(b",\"user_identity\":");
        write_raw(event.user_identity, &mut out);
        out.extend_from_slice(b"},");
        out.extend_from_slice(event.op.field());
        out.extend_from_slice(b",\"ts_ms\":");
        write_optional_i64(Some(produced_ms), &mut out);
        out.extend_from_slice(b",\"transaction\":null}");
        out
    }
}

/// How an error names an envelope: `record <event id> in <shard>` (`?` for a missing event
/// id, "the snapshot" for a missing shard), or by the start of its text when it has neither
/// (snapshot rows, changes read from an export).
fn record_name<'a>(envelope: &Envelope<'a>, text: &str) -> String {
    let string = |raw: Option<&'a str>| raw.and_then(|raw| decoded(raw).ok());
    match (string(envelope.event_id), string(envelope.shard_id)) {
        (None, None) => format!("record {}", short(text)),
        (event_id, shard) => format!(
            "record {} in {}",
            event_id.as_deref().unwrap_or("?"),
            shard.as_deref().unwrap_or("the snapshot")
        ),
    }
}

/// `text` as a JSON string, escaped as `serde_json` (and so ddbpipe's writers) escape it.
fn json_string(text: &str) -> Vec<u8> {
    serde_json::to_vec(text).expect("a string serializes to JSON without error")
}

/// Appends a raw JSON text, or `null`.
fn write_raw(raw: Option<&str>, out: &mut Vec<u8>) {
    out.extend_from_slice(raw.unwrap_or("null").as_bytes());
}

/// Appends an integer, or `null`.
fn write_optional_i64(number: Option<i64>, out: &mut Vec<u8>) {
    match number {
        Some(number) => write!(out, "{number}").expect("writing into a Vec<u8> cannot fail"),
        None => out.extend_from_slice(b"null"),
    }
}

/// The characters a message shows of a record.
const SHORT_CHARS: usize = 120;

/// The start of a record, for messages.
fn short(text: &str) -> String {
    match text.char_indices().nth(SHORT_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The start of a record that is not UTF-8, for messages.
fn short_lossy(line: &[u8]) -> String {
    short(&String::from_utf8_lossy(
        &line[..line.len().min(SHORT_CHARS * 4)],
    ))
}
