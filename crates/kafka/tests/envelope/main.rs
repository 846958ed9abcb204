//! Record lines to Kafka messages (docs/sinks.md §7.8): keys and values compared byte for byte
//! with golden JSON, from lines written by ddbpipe's own item and envelope writers.

use ddbpipe_kafka::envelope::{EnvelopeKind, Message, Shaper, ShaperSettings};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::envelope::{
    ChangeData, StreamRecord, UserIdentity, write_change, write_export_change, write_snapshot,
};
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::key_schema::{KeyAttribute, KeyType};
use ddbpipe_source::records::Lines;
use ddbpipe_value::{Item, Number, Value, ValueFormat};

mod ddbpipe_and_tombstones;
mod debezium;
mod docs;
mod errors;
mod key;

// Records, written by ddbpipe's own writers.

/// When the messages are produced: every value's top-level `ts_ms`.
const PRODUCED_MS: i64 = 1_700_000_005_123;
/// The batch's read time: `source.ts_ms` of snapshot rows and items.
const READ_MS: Option<i64> = Some(1_700_000_001_000);
/// `ApproximateCreationDateTime` of the stream records.
const CREATED_MS: i64 = 1_700_000_000_000;
/// The shard the stream records are read from.
const SHARD: &str = "shardId-00000001700000000000-0123abcd";

fn s(text: &str) -> Value {
    Value::S(text.to_string())
}

fn n(text: &str) -> Value {
    Value::N(Number::new(text))
}

fn item(entries: &[(&str, Value)]) -> Item {
    entries
        .iter()
        .map(|(name, value)| (name.to_string(), value.clone()))
        .collect()
}

/// The table's key schema: hash key `order_id` (N), range key `customer` (S). The hash key
/// comes first in the schema and second in byte order.
fn schema(hash: KeyType) -> Vec<KeyAttribute> {
    vec![
        KeyAttribute {
            name: "order_id".to_string(),
            key_type: hash,
        },
        KeyAttribute {
            name: "customer".to_string(),
            key_type: KeyType::S,
        },
    ]
}

fn order(order_id: Value, total: &str) -> Item {
    item(&[
        ("customer", s("c1")),
        ("order_id", order_id),
        ("total", n(total)),
    ])
}

fn keys_of(item: &Item) -> Item {
    item.iter()
        .filter(|(name, _)| *name == "customer" || *name == "order_id")
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// A scanned item as its line (`value_format` `format`).
fn item_line(item: &Item, format: ValueFormat) -> Vec<u8> {
    let mut out = Vec::new();
    format.write_item(item, &mut out);
    out
}

/// A mirror's snapshot row of `item`.
fn snapshot_line(item: &Item, hash: KeyType, format: ValueFormat) -> Vec<u8> {
    let mut out = Vec::new();
    write_snapshot(item, &schema(hash), "orders", format, &mut out);
    out
}

/// A stream record of `event_name` with the keys of whichever image it has.
fn record(
    event_name: Option<&str>,
    old_image: Option<Item>,
    new_image: Option<Item>,
    user_identity: Option<UserIdentity>,
) -> StreamRecord {
    let keys = new_image.as_ref().or(old_image.as_ref()).map(keys_of);
    StreamRecord {
        event_id: Some("ev-1".to_string()),
        event_name: event_name.map(str::to_string),
        change: Some(ChangeData {
            created_ms: Some(CREATED_MS),
            keys,
            new_image,
            old_image,
            sequence_number: Some(
                SequenceNumber::parse("4960000000000000000000001").expect("a sequence number"),
            ),
            size_bytes: Some(42),
            view_type: Some("NEW_AND_OLD_IMAGES".to_string()),
        }),
        user_identity,
    }
}

fn change_line(record: &StreamRecord, format: ValueFormat) -> Vec<u8> {
    let mut out = Vec::new();
    write_change(record, &ShardId::new(SHARD), "orders", format, &mut out).expect("an envelope");
    out
}

fn ttl() -> UserIdentity {
    UserIdentity {
        principal_id: Some("dynamodb.amazonaws.com".to_string()),
        kind: Some("Service".to_string()),
    }
}

/// The settings of the tests' pipeline: table `orders`, key given hash first.
fn settings(envelope: EnvelopeKind, records: Records, tombstones: bool) -> ShaperSettings {
    ShaperSettings {
        envelope,
        records,
        key_attributes: vec!["order_id".to_string(), "customer".to_string()],
        pipeline: "orders-to-kafka".to_string(),
        table: "orders".to_string(),
        region: Some("eu-west-1".to_string()),
        tombstones,
    }
}

/// A shaper of the tests' pipeline.
fn shaper(envelope: EnvelopeKind, records: Records, tombstones: bool) -> Shaper {
    Shaper::new(settings(envelope, records, tombstones)).expect("a shaper")
}

/// Lines of one record.
pub(crate) fn one(line: &[u8]) -> Lines {
    let mut records = Lines::default();
    records.push_with(|buf| buf.extend_from_slice(line));
    records
}

/// The messages of one line, which must be accepted.
fn messages(shaper: &Shaper, line: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    shaper
        .messages(&one(line), 0, PRODUCED_MS, READ_MS, &mut out)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(line)));
    out
}

/// The one message of a line, as text: (key, value).
fn message(shaper: &Shaper, line: &[u8]) -> (String, String) {
    let mut out = messages(shaper, line);
    assert_eq!(
        out.len(),
        1,
        "one message for {}",
        String::from_utf8_lossy(line)
    );
    let Message { key, value } = out.remove(0);
    let value = value.expect("a value");
    (text(key), text(value))
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).expect("UTF-8")
}

/// The error of a refused line; checks nothing was appended.
fn error(shaper: &Shaper, line: &[u8]) -> String {
    let mut out = Vec::new();
    let error = shaper
        .messages(&one(line), 0, PRODUCED_MS, READ_MS, &mut out)
        .expect_err("the line is refused");
    assert!(out.is_empty(), "nothing is appended on error: {out:?}");
    error
}

fn debezium_envelopes() -> Shaper {
    shaper(EnvelopeKind::Debezium, Records::Envelopes, false)
}

/// A scanned item whose page noted its key takes the message key from the notes without reading the record again: here notes that point elsewhere than the record's
/// own attributes, which only a shaper taking the notes would follow.
#[test]
fn an_item_takes_its_message_key_from_the_pages_notes() {
    let shaper = shaper(EnvelopeKind::Debezium, Records::Items, false);
    let line = br#"{"customer":"c1","n1":"c9","n2":8,"order_id":7}"#;
    let text = std::str::from_utf8(line).unwrap();
    let at = |value: &str| {
        let start = text.find(value).unwrap();
        start..start + value.len()
    };
    let mut records = Lines::default();
    records.note_attributes(vec!["customer".to_string(), "order_id".to_string()].into());
    records.push_with(|buf| buf.extend_from_slice(line));
    records.note_last(|name| {
        Some(if name == "customer" {
            at(r#""c9""#)
        } else {
            at("8")
        })
    });
    let mut out = Vec::new();
    shaper
        .messages(&records, 0, PRODUCED_MS, READ_MS, &mut out)
        .unwrap();
    assert_eq!(text_of(&out[0].key), r#"{"customer":"c9","order_id":8}"#);
    out.clear();
    shaper
        .messages(&one(line), 0, PRODUCED_MS, READ_MS, &mut out)
        .unwrap();
    assert_eq!(text_of(&out[0].key), r#"{"customer":"c1","order_id":7}"#);
}

fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
