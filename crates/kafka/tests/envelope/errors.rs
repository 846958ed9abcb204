//! Rule 5: records refused, named.

use super::*;

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
    let trailing = error(&items, br#"{"customer":"c1","order_id":7} {}"#);
    assert!(
        trailing
            .starts_with(r#"item {"customer":"c1","order_id":7} {}: not a JSON object: trailing"#),
        "{trailing}"
    );
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
