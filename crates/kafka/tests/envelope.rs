//! Record lines to Kafka messages (docs/sinks.md §7.8): keys and values compared byte for byte
//! with golden JSON, from lines written by ddbpipe's own item and envelope writers.

use ddbpipe_kafka::envelope::{EnvelopeKind, Message, Shaper, ShaperSettings};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::envelope::{
    ChangeData, StreamRecord, UserIdentity, write_change, write_export_change, write_snapshot,
};
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::key_schema::{KeyAttribute, KeyType};
use ddbpipe_value::{Item, Number, Value, ValueFormat};

/// When the messages are produced: every value's top-level `ts_ms`.
const PRODUCED_MS: i64 = 1_700_000_005_123;
/// The batch's read time: `source.ts_ms` of snapshot rows and items.
const READ_MS: Option<i64> = Some(1_700_000_001_000);
/// `ApproximateCreationDateTime` of the stream records.
const CREATED_MS: i64 = 1_700_000_000_000;
const SHARD: &str = "shardId-00000001700000000000-0123abcd";

// ---- records, written by ddbpipe's own writers ------------------------------------------------

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

// ---- shaping ----------------------------------------------------------------------------------

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

fn shaper(envelope: EnvelopeKind, records: Records, tombstones: bool) -> Shaper {
    Shaper::new(settings(envelope, records, tombstones)).expect("a shaper")
}

fn messages(shaper: &Shaper, line: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    shaper
        .messages(line, PRODUCED_MS, READ_MS, &mut out)
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

fn error(shaper: &Shaper, line: &[u8]) -> String {
    let mut out = Vec::new();
    let error = shaper
        .messages(line, PRODUCED_MS, READ_MS, &mut out)
        .expect_err("the line is refused");
    assert!(out.is_empty(), "nothing is appended on error: {out:?}");
    error
}

fn debezium_envelopes() -> Shaper {
    shaper(EnvelopeKind::Debezium, Records::Envelopes, false)
}

// ---- rule 1: the key --------------------------------------------------------------------------

#[test]
fn an_item_and_every_envelope_of_it_give_the_same_key_bytes() {
    for (format, expected) in [
        (ValueFormat::Plain, r#"{"customer":"c1","order_id":7}"#),
        (ValueFormat::PlainExact, r#"{"customer":"c1","order_id":7}"#),
        (
            ValueFormat::Typed,
            r#"{"customer":{"S":"c1"},"order_id":{"N":"7"}}"#,
        ),
    ] {
        let old = order(n("7"), "10");
        let new = order(n("7"), "12.5");
        let mut export = Vec::new();
        write_export_change(
            &keys_of(&new),
            Some(&new),
            None,
            CREATED_MS,
            "orders",
            format,
            &mut export,
        );
        let lines = [
            snapshot_line(&new, KeyType::N, format),
            change_line(
                &record(Some("INSERT"), None, Some(new.clone()), None),
                format,
            ),
            change_line(
                &record(Some("MODIFY"), Some(old.clone()), Some(new.clone()), None),
                format,
            ),
            change_line(
                &record(Some("REMOVE"), Some(old), None, Some(ttl())),
                format,
            ),
            export,
        ];
        let item_key = message(
            &shaper(EnvelopeKind::Debezium, Records::Items, false),
            &item_line(&new, format),
        )
        .0;
        assert_eq!(item_key, expected, "{format:?}");
        for (envelope, line) in [EnvelopeKind::Debezium, EnvelopeKind::Ddbpipe]
            .into_iter()
            .flat_map(|envelope| lines.iter().map(move |line| (envelope, line)))
        {
            let key = message(&shaper(envelope, Records::Envelopes, false), line).0;
            assert_eq!(
                key.as_bytes(),
                item_key.as_bytes(),
                "{format:?} {envelope:?}: {}",
                String::from_utf8_lossy(line)
            );
        }
    }
}

#[test]
fn the_key_lists_its_attributes_in_byte_order_whatever_the_schema_or_the_line_says() {
    let hash_first = shaper(EnvelopeKind::Debezium, Records::Items, false);
    let range_first = Shaper::new(ShaperSettings {
        key_attributes: vec!["customer".to_string(), "order_id".to_string()],
        ..settings(EnvelopeKind::Debezium, Records::Items, false)
    })
    .expect("a shaper");
    let line = br#"{"total":3,"order_id":7,"customer":"c1"}"#;
    for shaper in [&hash_first, &range_first] {
        assert_eq!(message(shaper, line).0, r#"{"customer":"c1","order_id":7}"#);
    }
}

#[test]
fn a_38_digit_number_keeps_its_digits_in_the_key_and_the_value() {
    let digits = "12345678901234567890123456789012345678";
    let big = order(n(digits), digits);
    let items = shaper(EnvelopeKind::Debezium, Records::Items, false);
    let (key, value) = message(&items, &item_line(&big, ValueFormat::Plain));
    assert_eq!(key, format!(r#"{{"customer":"c1","order_id":"{digits}"}}"#));
    assert!(
        value.starts_with(&format!(
            r#"{{"before":null,"after":{{"customer":"c1","order_id":"{digits}","total":"{digits}"}},"#
        )),
        "{value}"
    );
    let (key, value) = message(&items, &item_line(&big, ValueFormat::Typed));
    assert_eq!(
        key,
        format!(r#"{{"customer":{{"S":"c1"}},"order_id":{{"N":"{digits}"}}}}"#)
    );
    assert!(
        value.contains(&format!(r#""total":{{"N":"{digits}"}}"#)),
        "{value}"
    );
    // A number written as a JSON number (an exact reader's line) is copied, not parsed: a
    // double would keep 17 of its digits.
    let line = format!(r#"{{"customer":"c1","order_id":{digits},"price":1.50e0}}"#);
    let (key, value) = message(&items, line.as_bytes());
    assert_eq!(key, format!(r#"{{"customer":"c1","order_id":{digits}}}"#));
    assert!(value.contains(&format!(r#""after":{line},"#)), "{value}");
}

#[test]
fn a_binary_key_stays_base64() {
    let blob = item(&[
        ("customer", s("c1")),
        ("order_id", Value::B(vec![1, 2, 255])),
    ]);
    for (format, expected) in [
        (ValueFormat::Plain, r#"{"customer":"c1","order_id":"AQL/"}"#),
        (
            ValueFormat::Typed,
            r#"{"customer":{"S":"c1"},"order_id":{"B":"AQL/"}}"#,
        ),
    ] {
        let items = shaper(EnvelopeKind::Debezium, Records::Items, false);
        assert_eq!(message(&items, &item_line(&blob, format)).0, expected);
        let insert = record(Some("INSERT"), None, Some(blob.clone()), None);
        assert_eq!(
            message(&debezium_envelopes(), &change_line(&insert, format)).0,
            expected
        );
        let row = snapshot_line(&blob, KeyType::B, format);
        assert_eq!(message(&debezium_envelopes(), &row).0, expected);
    }
}

// ---- rule 2: the Debezium value, per op -------------------------------------------------------

/// The `source` of a stream change read from [`SHARD`].
macro_rules! change_source {
    () => {
        concat!(
            r#""source":{"version":""#,
            env!("CARGO_PKG_VERSION"),
            r#"","connector":"dynamodb","name":"orders-to-kafka","ts_ms":1700000000000,"#,
            r#""snapshot":"false","table":"orders","region":"eu-west-1","#,
            r#""shard_id":"shardId-00000001700000000000-0123abcd","#,
            r#""sequence_number":"4960000000000000000000001","event_id":"ev-1","#,
        )
    };
}

/// The `source` of a snapshot row or a scanned item.
macro_rules! snapshot_source {
    () => {
        concat!(
            r#""source":{"version":""#,
            env!("CARGO_PKG_VERSION"),
            r#"","connector":"dynamodb","name":"orders-to-kafka","ts_ms":1700000001000,"#,
            r#""snapshot":"true","table":"orders","region":"eu-west-1","shard_id":null,"#,
            r#""sequence_number":null,"event_id":null,"user_identity":null},"#,
        )
    };
}

#[test]
fn an_insert_is_op_c_with_no_before() {
    let insert = record(Some("INSERT"), None, Some(order(n("7"), "12.5")), None);
    assert_eq!(
        message(
            &debezium_envelopes(),
            &change_line(&insert, ValueFormat::Plain)
        )
        .1,
        concat!(
            r#"{"before":null,"after":{"customer":"c1","order_id":7,"total":12.5},"#,
            change_source!(),
            r#""user_identity":null},"op":"c","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn an_update_is_op_u_with_its_old_image_or_without_one() {
    let old = order(n("7"), "10");
    let new = order(n("7"), "12.5");
    let both = record(Some("MODIFY"), Some(old), Some(new.clone()), None);
    assert_eq!(
        message(
            &debezium_envelopes(),
            &change_line(&both, ValueFormat::Plain)
        )
        .1,
        concat!(
            r#"{"before":{"customer":"c1","order_id":7,"total":10},"#,
            r#""after":{"customer":"c1","order_id":7,"total":12.5},"#,
            change_source!(),
            r#""user_identity":null},"op":"u","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
    // A stream of NEW_IMAGE view: no old image.
    let new_only = record(Some("MODIFY"), None, Some(new), None);
    assert_eq!(
        message(
            &debezium_envelopes(),
            &change_line(&new_only, ValueFormat::Plain)
        )
        .1,
        concat!(
            r#"{"before":null,"after":{"customer":"c1","order_id":7,"total":12.5},"#,
            change_source!(),
            r#""user_identity":null},"op":"u","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn a_delete_is_op_d_with_its_old_image_or_without_one() {
    let old = order(n("7"), "10");
    let with_old = record(Some("REMOVE"), Some(old.clone()), None, None);
    assert_eq!(
        message(
            &debezium_envelopes(),
            &change_line(&with_old, ValueFormat::Plain)
        )
        .1,
        concat!(
            r#"{"before":{"customer":"c1","order_id":7,"total":10},"after":null,"#,
            change_source!(),
            r#""user_identity":null},"op":"d","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
    // A stream of KEYS_ONLY view: only the keys say what was deleted.
    let mut keys_only = record(Some("REMOVE"), None, None, None);
    if let Some(change) = keys_only.change.as_mut() {
        change.keys = Some(keys_of(&old));
    }
    let (key, value) = message(
        &debezium_envelopes(),
        &change_line(&keys_only, ValueFormat::Plain),
    );
    assert_eq!(key, r#"{"customer":"c1","order_id":7}"#);
    assert_eq!(
        value,
        concat!(
            r#"{"before":null,"after":null,"#,
            change_source!(),
            r#""user_identity":null},"op":"d","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn a_ttl_delete_keeps_its_user_identity() {
    let expired = record(Some("REMOVE"), Some(order(n("7"), "10")), None, Some(ttl()));
    assert_eq!(
        message(
            &debezium_envelopes(),
            &change_line(&expired, ValueFormat::Plain)
        )
        .1,
        concat!(
            r#"{"before":{"customer":"c1","order_id":7,"total":10},"after":null,"#,
            change_source!(),
            r#""user_identity":{"principal_id":"dynamodb.amazonaws.com","type":"Service"}},"#,
            r#""op":"d","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn a_snapshot_row_is_op_r_at_the_batchs_read_time() {
    let row = snapshot_line(&order(n("7"), "12.5"), KeyType::N, ValueFormat::Plain);
    assert_eq!(
        message(&debezium_envelopes(), &row).1,
        concat!(
            r#"{"before":null,"after":{"customer":"c1","order_id":7,"total":12.5},"#,
            snapshot_source!(),
            r#""op":"r","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn a_scanned_item_is_op_r_with_the_line_as_after() {
    let items = shaper(EnvelopeKind::Debezium, Records::Items, false);
    let line = item_line(&order(n("7"), "12.5"), ValueFormat::Plain);
    assert_eq!(
        message(&items, &line).1,
        concat!(
            r#"{"before":null,"after":{"customer":"c1","order_id":7,"total":12.5},"#,
            snapshot_source!(),
            r#""op":"r","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn typed_lines_keep_their_attribute_json() {
    let old = order(n("7"), "10");
    let new = order(n("7"), "12.50");
    let modify = record(Some("MODIFY"), Some(old), Some(new), None);
    let (key, value) = message(
        &debezium_envelopes(),
        &change_line(&modify, ValueFormat::Typed),
    );
    assert_eq!(key, r#"{"customer":{"S":"c1"},"order_id":{"N":"7"}}"#);
    assert_eq!(
        value,
        concat!(
            r#"{"before":{"customer":{"S":"c1"},"order_id":{"N":"7"},"total":{"N":"10"}},"#,
            r#""after":{"customer":{"S":"c1"},"order_id":{"N":"7"},"total":{"N":"12.50"}},"#,
            change_source!(),
            r#""user_identity":null},"op":"u","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
    // docs/values.md §3.3's golden typed item, scanned from a table keyed by `pk`.
    let golden = concat!(
        r#"{"blob":{"B":"AQ=="},"pk":{"S":"a"},"#,
        r#""price":{"N":"12345678901234567890.123456789"},"tags":{"SS":["x"]}}"#
    );
    let by_pk = Shaper::new(ShaperSettings {
        key_attributes: vec!["pk".to_string()],
        ..settings(EnvelopeKind::Debezium, Records::Items, false)
    })
    .expect("a shaper");
    let (key, value) = message(&by_pk, golden.as_bytes());
    assert_eq!(key, r#"{"pk":{"S":"a"}}"#);
    assert!(
        value.starts_with(&format!(r#"{{"before":null,"after":{golden},"source":"#)),
        "{value}"
    );
}

#[test]
fn the_golden_envelope_of_the_source_tests_becomes_this_event() {
    // crates/source/src/envelope/tests.rs, a_full_plain_envelope_has_exactly_these_bytes.
    let line = concat!(
        r#"{"after":{"blob":"AQI=","pk":"a","price":2},"before":{"pk":"a","price":1.5},"#,
        r#""document_key":{"pk":"a"},"event_id":"ev-1","event_name":"MODIFY","#,
        r#""key":{"pk":"a"},"op":"u","sequence_number":"4960000000000000000000001","#,
        r#""shard_id":"shardId-00000001700000000000-0123abcd","size_bytes":42,"#,
        r#""stream_view_type":"NEW_AND_OLD_IMAGES","table":"orders","#,
        r#""ts_ms":1700000000000,"user_identity":null}"#,
    );
    let by_pk = Shaper::new(ShaperSettings {
        key_attributes: vec!["pk".to_string()],
        ..settings(EnvelopeKind::Debezium, Records::Envelopes, false)
    })
    .expect("a shaper");
    let (key, value) = message(&by_pk, line.as_bytes());
    assert_eq!(key, r#"{"pk":"a"}"#);
    assert_eq!(
        value,
        concat!(
            r#"{"before":{"pk":"a","price":1.5},"after":{"blob":"AQI=","pk":"a","price":2},"#,
            change_source!(),
            r#""user_identity":null},"op":"u","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn a_change_read_from_an_export_has_its_exact_time_and_no_stream_fields() {
    let new = order(n("7"), "12.5");
    let mut line = Vec::new();
    write_export_change(
        &keys_of(&new),
        Some(&new),
        None,
        1_700_000_000_456,
        "orders",
        ValueFormat::Plain,
        &mut line,
    );
    assert_eq!(
        message(&debezium_envelopes(), &line).1,
        concat!(
            r#"{"before":null,"after":{"customer":"c1","order_id":7,"total":12.5},"#,
            r#""source":{"version":""#,
            env!("CARGO_PKG_VERSION"),
            r#"","connector":"dynamodb","name":"orders-to-kafka","ts_ms":1700000000456,"#,
            r#""snapshot":"false","table":"orders","region":"eu-west-1","shard_id":null,"#,
            r#""sequence_number":null,"event_id":null,"user_identity":null},"#,
            r#""op":"c","ts_ms":1700000005123,"transaction":null}"#,
        )
    );
}

#[test]
fn the_source_names_pipeline_table_and_region_as_json_strings() {
    let shaper = Shaper::new(ShaperSettings {
        pipeline: "say \"hi\"".to_string(),
        table: "t\\1".to_string(),
        region: None,
        ..settings(EnvelopeKind::Debezium, Records::Items, false)
    })
    .expect("a shaper");
    let value = message(&shaper, br#"{"customer":"c1","order_id":7}"#).1;
    assert!(
        value.contains(r#""name":"say \"hi\"","ts_ms":1700000001000,"#),
        "{value}"
    );
    assert!(
        value.contains(r#""table":"t\\1","region":null,"shard_id""#),
        "{value}"
    );
    let mut out = Vec::new();
    shaper
        .messages(br#"{"customer":"c1","order_id":7}"#, 5, None, &mut out)
        .expect("a message");
    let value = text(out.remove(0).value.expect("a value"));
    assert!(
        value.contains(r#""ts_ms":null,"snapshot":"true""#),
        "{value}"
    );
    assert!(
        value.ends_with(r#""ts_ms":5,"transaction":null}"#),
        "{value}"
    );
}

// ---- rule 3: the ddbpipe value ----------------------------------------------------------------

#[test]
fn the_ddbpipe_value_is_the_line_itself() {
    let new = order(n("7"), "12.5");
    let item = item_line(&new, ValueFormat::Typed);
    let items = shaper(EnvelopeKind::Ddbpipe, Records::Items, false);
    assert_eq!(messages(&items, &item)[0].value.as_deref(), Some(&item[..]));
    let envelopes = shaper(EnvelopeKind::Ddbpipe, Records::Envelopes, false);
    for line in [
        change_line(
            &record(Some("INSERT"), None, Some(new.clone()), None),
            ValueFormat::Plain,
        ),
        change_line(
            &record(Some("REMOVE"), Some(new.clone()), None, Some(ttl())),
            ValueFormat::Plain,
        ),
        snapshot_line(&new, KeyType::N, ValueFormat::Plain),
    ] {
        let out = messages(&envelopes, &line);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value.as_deref(), Some(&line[..]));
        assert_eq!(out[0].key, br#"{"customer":"c1","order_id":7}"#);
    }
}

// ---- rule 4: tombstones -----------------------------------------------------------------------

#[test]
fn a_delete_is_followed_by_a_tombstone_only_when_asked() {
    let old = order(n("7"), "10");
    let remove = change_line(
        &record(Some("REMOVE"), Some(old.clone()), None, None),
        ValueFormat::Plain,
    );
    for envelope in [EnvelopeKind::Debezium, EnvelopeKind::Ddbpipe] {
        let with = messages(&shaper(envelope, Records::Envelopes, true), &remove);
        assert_eq!(with.len(), 2, "{envelope:?}");
        assert!(with[0].value.is_some());
        assert_eq!(
            with[1],
            Message {
                key: br#"{"customer":"c1","order_id":7}"#.to_vec(),
                value: None
            }
        );
        let without = messages(&shaper(envelope, Records::Envelopes, false), &remove);
        assert_eq!(without.len(), 1, "{envelope:?}");
        assert_eq!(without[0], with[0]);
    }
}

#[test]
fn no_other_op_gets_a_tombstone() {
    let old = order(n("7"), "10");
    let new = order(n("7"), "12.5");
    let envelopes = shaper(EnvelopeKind::Debezium, Records::Envelopes, true);
    for line in [
        change_line(
            &record(Some("INSERT"), None, Some(new.clone()), None),
            ValueFormat::Plain,
        ),
        change_line(
            &record(Some("MODIFY"), Some(old), Some(new.clone()), None),
            ValueFormat::Plain,
        ),
        snapshot_line(&new, KeyType::N, ValueFormat::Plain),
    ] {
        let out = messages(&envelopes, &line);
        assert_eq!(out.len(), 1, "{}", String::from_utf8_lossy(&line));
        assert!(out[0].value.is_some());
    }
    let items = shaper(EnvelopeKind::Debezium, Records::Items, true);
    assert_eq!(
        messages(&items, &item_line(&new, ValueFormat::Plain)).len(),
        1
    );
}

// ---- rule 5: errors ---------------------------------------------------------------------------

#[test]
fn an_op_other_than_c_u_d_r_is_refused_naming_the_record_and_the_op() {
    let new = order(n("7"), "12.5");
    for (event_name, op) in [(Some("WEIRD"), "weird"), (None, "unknown")] {
        let line = change_line(
            &record(event_name, None, Some(new.clone()), None),
            ValueFormat::Plain,
        );
        for envelope in [EnvelopeKind::Debezium, EnvelopeKind::Ddbpipe] {
            let error = error(&shaper(envelope, Records::Envelopes, true), &line);
            assert_eq!(
                error,
                format!(
                    "record ev-1 in {SHARD} has op '{op}', which a Kafka message cannot carry \
                     (only c, u, d and r)"
                )
            );
        }
    }
}

#[test]
fn an_envelope_without_a_key_is_refused_naming_the_record() {
    let mut keyless = record(Some("INSERT"), None, Some(order(n("7"), "1")), None);
    if let Some(change) = keyless.change.as_mut() {
        change.keys = None;
    }
    let line = change_line(&keyless, ValueFormat::Plain);
    assert_eq!(
        error(&debezium_envelopes(), &line),
        format!("record ev-1 in {SHARD} has no key")
    );
    // A snapshot row of an item without its range key: key_of writes null for it.
    let partial = item(&[("order_id", n("7"))]);
    let row = snapshot_line(&partial, KeyType::N, ValueFormat::Plain);
    let error = error(&debezium_envelopes(), &row);
    assert!(
        error.starts_with(r#"record {"after":{"order_id":7},"#),
        "{error}"
    );
    assert!(
        error.ends_with(": key attribute 'customer' is missing"),
        "{error}"
    );
}

#[test]
fn an_item_without_its_key_is_refused_naming_the_item() {
    let items = shaper(EnvelopeKind::Debezium, Records::Items, false);
    assert_eq!(
        error(&items, br#"{"customer":"c1","total":3}"#),
        r#"item {"customer":"c1","total":3}: key attribute 'order_id' is missing"#
    );
    assert_eq!(
        error(&items, br#"{"customer":"c1","order_id":null}"#),
        r#"item {"customer":"c1","order_id":null}: key attribute 'order_id' is missing"#
    );
}

#[test]
fn a_line_that_is_not_json_is_refused_naming_its_start() {
    let items = shaper(EnvelopeKind::Debezium, Records::Items, false);
    let long = format!(
        r#"{{"customer":"c1","order_id":7,"note":"{}"#,
        "x".repeat(500)
    );
    let error_text = error(&items, long.as_bytes());
    assert!(
        error_text.starts_with(r#"item {"customer":"c1","order_id":7,"note":"xxx"#),
        "{error_text}"
    );
    assert!(
        error_text.contains("…: not a JSON object: EOF while parsing"),
        "{error_text}"
    );
    assert!(error_text.len() < 300, "{error_text}");
    assert!(error(&items, b"[1,2]").starts_with("item [1,2]: not a JSON object: invalid type"));
    assert_eq!(
        error(&items, b"{\"customer\":\"c\xff\"}"),
        "item {\"customer\":\"c\u{fffd}\"} is not UTF-8"
    );
    let envelope_error = error(&debezium_envelopes(), br#"{"after":{},"op":"#);
    assert!(
        envelope_error.starts_with(r#"record {"after":{},"op":: not a change envelope: "#),
        "{envelope_error}"
    );
    let no_op = error(
        &debezium_envelopes(),
        br#"{"key":{"customer":"c1","order_id":7}}"#,
    );
    assert!(no_op.contains("missing field `op`"), "{no_op}");
}

#[test]
fn a_table_without_key_attributes_cannot_shape_messages() {
    let error = Shaper::new(ShaperSettings {
        key_attributes: Vec::new(),
        ..settings(EnvelopeKind::Debezium, Records::Items, false)
    })
    .expect_err("no key");
    assert_eq!(
        error,
        "table orders: no key attributes are known, and a Kafka message's key is made of them"
    );
}
