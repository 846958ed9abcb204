//! The envelope's shape, per record kind and value format (docs/streams.md §4.1).
use ddbpipe_value::{Number, Value};

use super::*;
use crate::key_schema::KeyType;

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
    assert!(
        envelope.contains(
            r#""user_identity":{"principal_id":"dynamodb.amazonaws.com","type":"Service"}"#
        )
    );
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
