//! Rule 1: the key, the same bytes for an item and every envelope of it.

use super::*;

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
