//! Differential tests of the wire decoders: a page as DynamoDB sends it gives, byte for byte,
//! the records of the value-tree path (SDK-shaped values → `Item` → writer), for items, snapshot
//! envelopes and change envelopes, plain and typed; and the same errors.

use std::sync::Arc;

use aws_smithy_types::DateTime;
use ddbpipe_value::{Item, ValueFormat};
use proptest::collection::vec;
use proptest::prelude::*;

use super::{change_page, rendered_page};
use crate::api::{
    ChangeData, ChangePage, ChangeShape, KeyAttribute, KeyType, Page, RecordsPage, Render,
    SnapshotShape, StreamRecord, UserIdentity,
};
use crate::envelope::EnvelopeError;
use crate::error::{ApiError, ErrorClass};
use crate::ids::{SequenceNumber, ShardId};

// The value crate's strategies and wire encoder, shared by path rather than copied.
#[path = "../../../value/tests/strategies/mod.rs"]
mod strategies;

use strategies::{item, text, wire_item};

fn json_text(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

fn optional<T: std::fmt::Debug>(
    inner: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(inner)
}

/// Every way a page can be rendered: items and snapshots, plain and typed. The key schema
/// names an attribute the random items usually lack, so `null` keys are covered too.
fn renders() -> Vec<Render> {
    let key_schema = key_schema();
    let mut renders = Vec::new();
    for format in [ValueFormat::Plain, ValueFormat::Typed] {
        renders.push(Render::items(format));
        renders.push(Render::keyed_items(format, &key_schema));
        renders.push(Render::Snapshots(Arc::new(SnapshotShape {
            key_schema: key_schema.clone(),
            table: "or\"ders".to_string(),
            format,
        })));
    }
    renders
}

fn key_schema() -> Vec<KeyAttribute> {
    ["pk", "a", ""]
        .into_iter()
        .map(|name| KeyAttribute {
            name: name.to_string(),
            key_type: KeyType::S,
        })
        .collect()
}

/// Where a keyed render noted each record's key attributes, the raw values are what reading
/// the record finds (`key_attributes`), absent ones included; an unkeyed render notes nothing.
fn noted_as_read(render: &Render, records: &crate::records::Lines) -> Result<(), String> {
    let names: Vec<String> = key_schema().into_iter().map(|key| key.name).collect();
    for (i, line) in records.iter().enumerate() {
        let noted = records.noted(i, &names, String::as_str);
        let keyed = matches!(render, Render::Items(_, Some(_)));
        if noted.is_some() != keyed {
            return Err(format!("record {i} noted {noted:?} under {render:?}"));
        }
        let text = std::str::from_utf8(line).map_err(|e| e.to_string())?;
        let read = ddbpipe_value::key_attributes(text, &names, String::as_str)
            .map_err(|e| e.to_string())?;
        let raw = |found: &[Option<&serde_json::value::RawValue>]| -> Vec<Option<String>> {
            found
                .iter()
                .map(|v| v.map(|v| v.get().to_string()))
                .collect()
        };
        if let Some(noted) = noted
            && raw(&noted) != raw(&read)
        {
            return Err(format!(
                "record {i} {text}: noted {:?}, read {:?}",
                raw(&noted),
                raw(&read)
            ));
        }
        let taken = records
            .attributes(i, text, &names, String::as_str)
            .map_err(|e| e.to_string())?;
        if raw(&taken) != raw(&read) {
            return Err(format!(
                "record {i} {text}: taken {:?}, read {:?}",
                raw(&taken),
                raw(&read)
            ));
        }
    }
    Ok(())
}

/// A Scan answer of `items` on the wire, with the other fields DynamoDB sends.
fn scan_body(items: &[Item], cursor: Option<&Item>, capacity: Option<f64>) -> String {
    let items: Vec<String> = items.iter().map(|item| wire_item(item, true)).collect();
    let mut fields = vec![
        format!("\"Count\":{}", items.len()),
        format!("\"Items\":[{}]", items.join(",")),
        "\"ScannedCount\":7".to_string(),
    ];
    if let Some(cursor) = cursor {
        fields.push(format!("\"LastEvaluatedKey\":{}", wire_item(cursor, false)));
    }
    if let Some(units) = capacity {
        fields.push(format!(
            "\"ConsumedCapacity\":{{\"TableName\":\"orders\",\"CapacityUnits\":{units}}}"
        ));
    }
    fields.reverse();
    format!("{{{}}}", fields.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_scan_page_decodes_to_the_records_of_the_value_tree_path(
        items in vec(item(), 0..4),
        cursor in optional(item()),
        capacity in optional(0u32..1000),
    ) {
        let capacity = capacity.map(|units| f64::from(units) / 2.0);
        let body = scan_body(&items, cursor.as_ref(), capacity);
        for render in renders() {
            let expected = Page {
                items: items.clone(),
                last_evaluated_key: cursor.clone().filter(|key| !key.is_empty()),
                consumed_capacity: capacity,
            }
            .render(&render);
            let decoded = rendered_page(body.as_bytes(), &render, "orders").unwrap();
            prop_assert_eq!(
                String::from_utf8_lossy(decoded.records.as_bytes()),
                String::from_utf8_lossy(expected.records.as_bytes()),
                "{:?} {}", render, body
            );
            if let Err(problem) = noted_as_read(&render, &decoded.records) {
                prop_assert!(false, "{}", problem);
            }
            if let Render::Snapshots(_) = render
                && let Err(problem) = envelopes_noted_as_read(&decoded.records)
            {
                prop_assert!(false, "{}", problem);
            }
            prop_assert_eq!(decoded, expected);
        }
    }
}

/// Key values with escapes, numbers of 38 digits, binary values and a missing attribute are
/// noted as the record holds them, in every value format; the notes survive batching.
#[test]
fn a_keyed_scan_page_notes_its_key_values_as_the_records_hold_them() {
    let body = r#"{"Items":[
        {"z":{"S":"last"},"pk":{"S":"k\"1\u00e9"},"a":{"N":"12345678901234567890123456789012345678"},"":{"B":"AAEC"}},
        {"a":{"N":"-0.5"},"pk":{"S":""},"m":{"M":{"pk":{"S":"inner"}}}},
        {"pk":{"S":"only"},"b":{"BOOL":true}}
    ],"Count":3}"#;
    for format in [
        ValueFormat::Plain,
        ValueFormat::PlainExact,
        ValueFormat::Typed,
    ] {
        let render = Render::keyed_items(format, &key_schema());
        let page = rendered_page(body.as_bytes(), &render, "orders").unwrap();
        assert_eq!(page.records.len(), 3);
        noted_as_read(&render, &page.records).unwrap();
        let names = ["pk".to_string()];
        let found = page.records.noted(1, &names, String::as_str).unwrap();
        assert_eq!(
            found[0].map(|v| v.get()),
            Some(match format {
                ValueFormat::Typed => r#"{"S":""}"#,
                _ => r#""""#,
            })
        );
        let absent = page
            .records
            .noted(2, &["a".to_string()], String::as_str)
            .unwrap();
        assert!(absent[0].is_none(), "{absent:?}");
        // An attribute the page did not note is read from the record instead.
        assert!(
            page.records
                .noted(0, &["z".to_string()], String::as_str)
                .is_none()
        );
        // Batched whole or in part, the records keep their notes.
        let mut batch = crate::records::Lines::default();
        batch.extend_from(&page.records, 1, 3);
        batch.extend_from(&page.records, 0, 1);
        noted_as_read(&render, &batch).unwrap();
    }
}

/// One generated stream record: the record and its wire JSON.
#[derive(Debug, Clone)]
struct WireRecord {
    record: StreamRecord,
    json: String,
}

fn event_name() -> impl Strategy<Value = Option<String>> {
    optional(prop_oneof![
        Just("INSERT".to_string()),
        Just("MODIFY".to_string()),
        Just("REMOVE".to_string()),
        text(),
    ])
}

prop_compose! {
    fn stream_record()(
        event_id in optional(text()),
        event_name in event_name(),
        images in (optional(item()), optional(item()), optional(item())),
        sequence_number in "[0-9]{21,40}",
        size_bytes in optional(any::<i64>()),
        view_type in optional(text()),
        created_s in optional((0u32..2_000_000_000, any::<bool>())),
        user_identity in optional((optional(text()), optional(text()))),
    ) -> WireRecord {
        let (keys, new_image, old_image) = images;
        // Some creation times carry a fraction, as the service may send them.
        let created_s = created_s.map(|(s, half)| f64::from(s) + if half { 0.5 } else { 0.0 });
        let mut change = vec![format!("\"SequenceNumber\":{}", json_text(&sequence_number))];
        let mut push = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                change.push(format!("\"{name}\":{value}"));
            }
        };
        push("ApproximateCreationDateTime", created_s.map(|s| s.to_string()));
        push("Keys", keys.as_ref().map(|item| wire_item(item, true)));
        push("NewImage", new_image.as_ref().map(|item| wire_item(item, true)));
        push("OldImage", old_image.as_ref().map(|item| wire_item(item, false)));
        push("SizeBytes", size_bytes.map(|n| n.to_string()));
        push("StreamViewType", view_type.as_deref().map(json_text));
        let mut fields = vec![
            "\"awsRegion\":\"us-east-1\"".to_string(),
            format!("\"dynamodb\":{{{}}}", change.join(",")),
            "\"eventSource\":\"aws:dynamodb\"".to_string(),
        ];
        if let Some(id) = &event_id {
            fields.push(format!("\"eventID\":{}", json_text(id)));
        }
        if let Some(name) = &event_name {
            fields.push(format!("\"eventName\":{}", json_text(name)));
        }
        if let Some((principal, kind)) = &user_identity {
            let mut identity = Vec::new();
            if let Some(principal) = principal {
                identity.push(format!("\"PrincipalId\":{}", json_text(principal)));
            }
            if let Some(kind) = kind {
                identity.push(format!("\"Type\":{}", json_text(kind)));
            }
            fields.push(format!("\"userIdentity\":{{{}}}", identity.join(",")));
        }
        let record = StreamRecord {
            event_id,
            event_name,
            change: Some(ChangeData {
                created_ms: created_s
                    .map(|s| DateTime::from_secs_f64(s).to_millis().expect("in range")),
                keys,
                new_image,
                old_image,
                sequence_number: Some(SequenceNumber::parse(&sequence_number).expect("digits")),
                size_bytes,
                view_type,
            }),
            user_identity: user_identity.map(|(principal_id, kind)| UserIdentity {
                principal_id,
                kind,
            }),
        };
        WireRecord { record, json: format!("{{{}}}", fields.join(",")) }
    }
}

/// The envelopes of a page as text, for a readable failure.
fn envelopes(page: &ChangePage) -> Result<String, EnvelopeError> {
    page.changes
        .clone()
        .map(|changes| String::from_utf8_lossy(changes.envelopes.as_bytes()).into_owned())
}

/// Every envelope of a decoded page is noted, and what the notes give is what reading the
/// line gives: `EnvelopeFields` field by field, and `user_identity`'s text.
fn envelopes_noted_as_read(lines: &crate::records::Lines) -> Result<(), String> {
    use crate::envelope::{EnvelopeFields, NotedEnvelope};
    for (i, line) in lines.iter().enumerate() {
        let text = std::str::from_utf8(line).map_err(|e| e.to_string())?;
        let noted =
            NotedEnvelope::of(lines, i, text).ok_or(format!("record {i} not noted: {text}"))?;
        let read = EnvelopeFields::read(text).map_err(|e| e.to_string())?;
        let taken = EnvelopeFields::of(lines, i, text).map_err(|e| e.to_string())?;
        if format!("{read:?}") != format!("{taken:?}") {
            return Err(format!("{text}: read {read:?}, noted {taken:?}"));
        }
        let identity = ddbpipe_value::key_attributes(text, &["user_identity"], |n| n)
            .map_err(|e| e.to_string())?[0]
            .map(|raw| raw.get())
            .filter(|raw| *raw != "null");
        if identity != noted.user_identity {
            return Err(format!("{text}: user_identity {:?}", noted.user_identity));
        }
    }
    Ok(())
}

fn records_body(records: &[String], next: Option<&str>) -> String {
    let next = next.map_or(String::new(), |next| {
        format!("\"NextShardIterator\":{},", json_text(next))
    });
    format!("{{{next}\"Records\":[{}]}}", records.join(","))
}

fn shard() -> ShardId {
    ShardId::new("shardId-00000001700000000000-0123abcd")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_records_page_decodes_to_the_envelopes_of_the_value_tree_path(
        records in vec(stream_record(), 0..4),
        next in optional("[a-z0-9/]{1,12}"),
    ) {
        let body = records_body(
            &records.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
            next.as_deref(),
        );
        let shard = shard();
        for format in [ValueFormat::Plain, ValueFormat::Typed] {
            let shape = ChangeShape { shard: &shard, table: "orders", format };
            let expected = RecordsPage {
                records: records.iter().map(|r| r.record.clone()).collect(),
                next_iterator: next.clone(),
            }
            .into_changes(&shape);
            let decoded = change_page(body.as_bytes(), &shape).unwrap();
            prop_assert_eq!(envelopes(&decoded), envelopes(&expected), "{}", body);
            if let Ok(changes) = &decoded.changes
                && let Err(problem) = envelopes_noted_as_read(&changes.envelopes)
            {
                prop_assert!(false, "{}", problem);
            }
            prop_assert_eq!(decoded, expected);
        }
    }
}

fn shape(shard: &ShardId) -> ChangeShape<'_> {
    ChangeShape {
        shard,
        table: "orders",
        format: ValueFormat::Plain,
    }
}

#[test]
fn a_record_without_its_stream_record_or_sequence_number_cannot_become_an_envelope() {
    let shard = shard();
    let no_change = records_body(&[r#"{"eventID":"e1","eventName":"INSERT"}"#.into()], None);
    let page = change_page(no_change.as_bytes(), &shape(&shard)).unwrap();
    assert_eq!(
        page.changes,
        Err(EnvelopeError::NoStreamRecord {
            event_id: Some("e1".into()),
            shard: shard.clone(),
        })
    );
    let no_sequence = records_body(
        &[r#"{"dynamodb":{"SizeBytes":3},"eventID":"e2"}"#.into()],
        None,
    );
    let page = change_page(no_sequence.as_bytes(), &shape(&shard)).unwrap();
    assert_eq!(
        page.changes,
        Err(EnvelopeError::NoSequenceNumber {
            event_id: Some("e2".into()),
            shard,
        })
    );
}

/// The error of a page holding `record` alone, which must be fatal.
fn fatal_error_of(record: &str) -> ApiError {
    let shard = shard();
    let body = records_body(&[record.into()], None);
    let error = change_page(body.as_bytes(), &shape(&shard)).unwrap_err();
    assert_eq!(error.class, ErrorClass::Fatal, "{error}");
    error
}

#[test]
fn an_unknown_attribute_type_in_an_image_is_fatal_and_names_the_record() {
    // The eventID follows the images on the wire, as DynamoDB orders a record's fields.
    let record = r#"{"dynamodb":{"Keys":{"pk":{"XS":"a"}},"SequenceNumber":"1"},"eventID":"e9"}"#;
    let error = fatal_error_of(record);
    assert_eq!(
        error.message,
        "unsupported attribute value type XS in stream record e9"
    );
}

#[test]
fn a_sequence_number_that_is_not_digits_is_fatal() {
    let record = r#"{"dynamodb":{"SequenceNumber":"12a"},"eventID":"e3"}"#;
    let error = fatal_error_of(record);
    assert!(error.message.starts_with("stream record e3: "), "{error}");
}

#[test]
fn an_unknown_attribute_type_in_a_scan_is_fatal_and_names_the_table() {
    let body = r#"{"Items":[{"pk":{"S":"a"}},{"pk":{"XS":"b"}}],"Count":2}"#;
    let error = rendered_page(
        body.as_bytes(),
        &Render::items(ValueFormat::Plain),
        "orders",
    )
    .unwrap_err();
    assert_eq!(error.class, ErrorClass::Fatal);
    assert_eq!(
        error.message,
        "unsupported attribute value type XS in table 'orders'"
    );
}

#[test]
fn a_body_cut_short_or_not_json_is_transient_like_an_unreadable_sdk_answer() {
    let render = Render::items(ValueFormat::Plain);
    for body in [&b"{\"Items\":[{\"pk\":{\"S\":\"a\"}}"[..], b"<html>", b""] {
        let error = rendered_page(body, &render, "orders").unwrap_err();
        assert_eq!(error.class, ErrorClass::Transient, "{error}");
        assert_eq!(error.code, None);
    }
    let shard = shard();
    let error = change_page(b"{\"Records\":[{\"dynamodb\":", &shape(&shard)).unwrap_err();
    assert_eq!(error.class, ErrorClass::Transient);
}

/// Issue 9 item 12: a complete answer that does not decode decodes the same way every time;
/// retrying it 9 times only waited ~25 s.
#[test]
fn a_complete_answer_that_does_not_decode_is_definite() {
    let render = Render::items(ValueFormat::Plain);
    for body in [
        &b"{\"Items\":[{\"pk\":{\"S\":1}}]}"[..],
        b"{\"Items\":[]} trailing",
        b"{\"Items\":[{\"pk\":{\"S\":\"\xff\"}}]}",
        b"{\"Items\":[{\"pk\":{\"S\":\"a\"}}]]",
    ] {
        let error = rendered_page(body, &render, "orders").unwrap_err();
        assert_eq!(error.class, ErrorClass::Fatal, "{error}");
        assert!(
            error
                .message
                .starts_with("the Scan or Query response cannot be read"),
            "{error}"
        );
    }
    let shard = shard();
    let error = change_page(b"{\"Records\":[{]}", &shape(&shard)).unwrap_err();
    assert_eq!(error.class, ErrorClass::Fatal);
}

#[test]
fn null_and_missing_parts_of_an_answer_are_absent() {
    let render = Render::items(ValueFormat::Plain);
    let page = rendered_page(br#"{"Items":null,"LastEvaluatedKey":{}}"#, &render, "t").unwrap();
    assert!(page.records.is_empty());
    assert_eq!(page.last_evaluated_key, None);
    assert_eq!(page.consumed_capacity, None);
    let shard = shard();
    let page = change_page(
        br#"{"Records":null,"NextShardIterator":null}"#,
        &shape(&shard),
    )
    .unwrap();
    assert_eq!(page.changes.map(|changes| changes.records.len()), Ok(0));
    assert_eq!(page.next_iterator, None);
}
