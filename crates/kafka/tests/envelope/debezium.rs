//! Rule 2: the Debezium value, per op, compared byte for byte.

use super::*;

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
        .messages(
            &super::one(br#"{"customer":"c1","order_id":7}"#),
            0,
            5,
            None,
            &mut out,
        )
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
