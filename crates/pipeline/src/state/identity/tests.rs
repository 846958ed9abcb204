use ddbpipe_value::ValueFormat;
use serde_json::json;

use super::*;

fn east() -> Location {
    Location {
        region: Some("us-east-1".into()),
        endpoint_url: None,
        account: Some("111122223333".into()),
    }
}

#[test]
fn the_account_is_read_from_table_and_stream_arns_only() {
    let table = "arn:aws:dynamodb:us-east-1:111122223333:table/orders";
    let stream =
        "arn:aws:dynamodb:us-east-1:111122223333:table/orders/stream/2026-01-01T00:00:00.000";
    assert_eq!(Location::account_of(table).as_deref(), Some("111122223333"));
    assert_eq!(
        Location::account_of(stream).as_deref(),
        Some("111122223333")
    );
    assert_eq!(Location::account_of("orders"), None);
    assert_eq!(
        Location::account_of("arn:aws:dynamodb:us-east-1::table/x"),
        None
    );
}

#[test]
fn where_the_table_lives_is_part_of_the_identity() {
    let source = SourceConfig::new("orders");
    let here = Identity::of(&source, &east(), None);
    let west = Location {
        region: Some("us-west-2".into()),
        ..east()
    };
    let other_account = Location {
        account: Some("444455556666".into()),
        ..east()
    };
    let emulator = Location {
        endpoint_url: Some("http://127.0.0.1:8000".into()),
        ..east()
    };
    for (location, field) in [
        (west, "region"),
        (other_account, "account"),
        (emulator, "endpoint_url"),
    ] {
        let changes = Identity::of(&source, &location, None).changes_from(&here, true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            changes[0].starts_with(&format!("{field} changed from")),
            "{changes:?}"
        );
    }
}

#[test]
fn an_endpoint_is_kept_masked_and_one_stored_with_its_secrets_compares_equal() {
    let source = SourceConfig::new("orders");
    let at = |url: &str| Location {
        endpoint_url: Some(url.into()),
        ..east()
    };
    let secret = "http://user:s3cr3t@127.0.0.1:8000";
    let now = Identity::of(&source, &at(secret), None);
    assert_eq!(now.to_json()["endpoint_url"], "http://***@127.0.0.1:8000");
    // Stored by an earlier ddbpipe with the password: read masked, no change.
    let mut earlier = now.to_json();
    earlier["endpoint_url"] = json!(secret);
    let stored = Identity::from_json(earlier.clone());
    assert!(!stored.to_json().to_string().contains("s3cr3t"));
    assert!(now.changes_from(&stored, true).is_empty());
    assert_ne!(Identity::fingerprint_of(&earlier), stored.fingerprint());
    // Another host still counts, and the change shows no secret.
    let other = Identity::of(&source, &at("http://user:0ther@127.0.0.2:8000"), None);
    let changes = other.changes_from(&stored, true);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(!changes[0].contains("s3cr3t") && !changes[0].contains("0ther"));
    // Without secrets: stored as given, the fingerprint it always had.
    let plain = Identity::of(&source, &at("http://127.0.0.1:8000"), None);
    assert_eq!(plain.to_json()["endpoint_url"], "http://127.0.0.1:8000");
    assert_eq!(
        Identity::from_json(plain.to_json()).fingerprint(),
        Identity::fingerprint_of(&plain.to_json())
    );
}

#[test]
fn what_the_records_look_like_is_part_of_the_identity() {
    let source = SourceConfig::new("orders");
    let keyed = Output::Keyed {
        table: "orders".into(),
        document_column: Some("document".into()),
    };
    let here = Identity::of(&source, &east(), Some(&keyed));
    let mut typed = source.clone();
    typed.value_format = ValueFormat::Typed;
    let moved = Output::Keyed {
        table: "orders_copy".into(),
        document_column: Some("document".into()),
    };
    let renamed = Output::Keyed {
        table: "orders".into(),
        document_column: Some("doc".into()),
    };
    let appended = Output::File {
        path: "/data/orders.jsonl".into(),
        write: FileWrite::Append,
        compression: FileCompression::None,
    };
    let file = Identity::of(&source, &east(), Some(&appended));
    for (other, field) in [
        (
            Output::File {
                path: "/data/orders.jsonl".into(),
                write: FileWrite::Overwrite,
                compression: FileCompression::None,
            },
            "sink_write",
        ),
        (
            Output::File {
                path: "/data/orders.jsonl".into(),
                write: FileWrite::Append,
                compression: FileCompression::Gzip,
            },
            "gzip",
        ),
        (
            Output::File {
                path: "/data/orders-2.jsonl".into(),
                write: FileWrite::Append,
                compression: FileCompression::None,
            },
            "sink_path",
        ),
        (Output::Stdout, "sink_path"),
        // A Kafka topic instead of the file.
        (
            Output::Topic {
                topic: "dynamodb.orders".into(),
                shape: "debezium, tombstones".into(),
            },
            "sink_path",
        ),
        // A sink given in code instead of the file: its records would go elsewhere.
        (
            Output::Given {
                name: "orders-service".into(),
            },
            "sink_path",
        ),
    ] {
        let changes = Identity::of(&source, &east(), Some(&other)).changes_from(&file, true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            changes[0].starts_with(&format!("{field} changed from")),
            "{changes:?}"
        );
    }
    // The same topic with messages of another shape: the rest would not match the start.
    let topic = |shape: &str| Output::Topic {
        topic: "dynamodb.orders".into(),
        shape: shape.into(),
    };
    let debezium = Identity::of(&source, &east(), Some(&topic("debezium, tombstones")));
    for other in ["ddbpipe, tombstones", "debezium"] {
        let changes =
            Identity::of(&source, &east(), Some(&topic(other))).changes_from(&debezium, true);
        assert_eq!(changes.len(), 1, "{other}: {changes:?}");
        assert!(
            changes[0].starts_with("sink_path changed from"),
            "{changes:?}"
        );
    }
    for (identity, field) in [
        (Identity::of(&typed, &east(), Some(&keyed)), "value_format"),
        (Identity::of(&source, &east(), Some(&moved)), "sink_table"),
        (
            Identity::of(&source, &east(), Some(&renamed)),
            "document_column",
        ),
    ] {
        let changes = identity.changes_from(&here, true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            changes[0].starts_with(&format!("{field} changed from")),
            "{changes:?}"
        );
    }
}

#[test]
fn the_snapshot_engine_and_export_matter_only_to_segment_state() {
    use ddbpipe_source::config::SnapshotEngine;
    use ddbpipe_source::position::{ScanKind, ScanPosition, StreamKind, StreamsPosition};
    let source = SourceConfig::new("orders");
    let here = Identity::of(&source, &east(), None);
    let mut exported = source.clone();
    exported.snapshot.engine = SnapshotEngine::Export;
    let mut given = exported.clone();
    given.snapshot.export_arn = Some("arn:aws:dynamodb:us-east-1:1:table/orders/export/x".into());
    let scanning = Position::Scan(ScanPosition::new(ScanKind::Scan, 1));
    let streaming = Position::Streams(StreamsPosition::new(StreamKind::Mirror, None));
    let changes = Identity::of(&exported, &east(), None).changes_for(&here, &scanning);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(
        changes[0].starts_with("snapshot_engine changed from"),
        "{changes:?}"
    );
    let exporting = Identity::of(&exported, &east(), None);
    let changes = Identity::of(&given, &east(), None).changes_for(&exporting, &scanning);
    assert!(
        changes[0].starts_with("snapshot_export_arn changed from null"),
        "{changes:?}"
    );
    // No open snapshot: the engine may change between runs.
    assert!(exporting.changes_for(&here, &streaming).is_empty());
}

#[test]
fn a_field_one_side_does_not_hold_is_not_compared() {
    let source = SourceConfig::new("orders");
    let now = Identity::of(&source, &east(), None);
    // Written by an earlier ddbpipe: no location, no value format.
    let mut earlier = now.to_json();
    for field in ["region", "endpoint_url", "account", "value_format"] {
        earlier.as_object_mut().map(|o| o.remove(field));
    }
    assert!(
        now.changes_from(&Identity::from_json(earlier), true)
            .is_empty()
    );
    // This command could not learn the account: not compared, the rest is.
    let unknown_account = Location {
        account: None,
        ..east()
    };
    let without = Identity::of(&source, &unknown_account, None);
    assert!(without.changes_from(&now, true).is_empty());
    let west = Location {
        region: Some("us-west-2".into()),
        account: None,
        ..east()
    };
    assert_eq!(
        Identity::of(&source, &west, None)
            .changes_from(&now, true)
            .len(),
        1
    );
}

#[test]
fn what_a_newer_ddbpipe_recorded_is_kept_and_a_field_it_added_refuses_a_position() {
    let source = SourceConfig::new("orders");
    let appended = Output::File {
        path: "/data/orders.jsonl".into(),
        write: FileWrite::Append,
        compression: FileCompression::None,
    };
    let now = Identity::of(&source, &east(), Some(&appended));
    let mut newer = now.to_json();
    newer["consistent_read"] = json!(true);
    newer["sink_write"] = json!("rotate_daily");
    let stored = Identity::from_json(newer.clone());
    // Kept as stored: written back, and fingerprinted, as it was.
    assert_eq!(stored.to_json(), newer);
    assert_eq!(stored.fingerprint(), Identity::fingerprint_of(&newer));
    // A value it cannot read is compared as stored; a field it does not know is a change.
    assert_eq!(
        now.changes_from(&stored, true),
        [
            "consistent_read (true) was recorded by a newer ddbpipe and is unknown to this one: \
             run that version",
            "sink_write changed from \"rotate_daily\" to \"append\"",
        ]
    );
}

#[test]
fn every_field_an_identity_stores_is_compared() {
    use ddbpipe_source::config::SnapshotEngine;
    let mut one = SourceConfig::new("orders");
    one.mode = Mode::Query;
    one.index_name = Some("by-status".into());
    one.key_condition_expression = Some("pk = :p".into());
    one.filter_expression = Some("a = :p".into());
    one.projection = Some("pk".into());
    one.expression_attribute_names = [("#a".to_string(), "a".to_string())].into();
    one.expression_attribute_values = [(":p".to_string(), Value::S("x".into()))].into();
    one.segments = 2;
    one.snapshot.export_arn = Some("arn:aws:dynamodb:us-east-1:1:table/orders/export/x".into());
    one.stream_arn = Some("arn:aws:dynamodb:us-east-1:1:table/orders/stream/1".into());
    let mut other = SourceConfig::new("invoices");
    other.snapshot.engine = SnapshotEngine::Export;
    other.value_format = ValueFormat::Typed;
    let there = Location {
        region: Some("us-west-2".into()),
        endpoint_url: Some("http://127.0.0.1:8000".into()),
        account: Some("444455556666".into()),
    };
    let keyed = |table: &str, column: &str| Output::Keyed {
        table: table.into(),
        document_column: Some(column.into()),
    };
    let file = |path: &str, write, compression| Output::File {
        path: path.into(),
        write,
        compression,
    };
    let pairs = [
        (
            Identity::of(&one, &east(), Some(&keyed("a", "doc")))
                .of_shared_run("sqlite a".into(), None),
            Identity::of(&other, &there, Some(&keyed("b", "document")))
                .of_shared_run("sqlite b".into(), None),
        ),
        (
            Identity::of(
                &one,
                &east(),
                Some(&file("/a", FileWrite::Append, FileCompression::None)),
            ),
            Identity::of(
                &other,
                &there,
                Some(&file("/b", FileWrite::Overwrite, FileCompression::Gzip)),
            ),
        ),
    ];
    for (stored, now) in pairs {
        let fields: Vec<String> = stored
            .to_json()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let changed: Vec<String> = now
            .changes_from(&stored, true)
            .iter()
            .map(|change| change.split(' ').next().unwrap().to_string())
            .collect();
        assert_eq!(changed, fields);
    }
}

/// Issue 28 (rule 7): dropping the document column (`document_column: null`) where the
/// position was written with one, or bringing it back, is a change that says a resnapshot is
/// needed; the stored identity keeps null apart from an absent field.
#[test]
fn dropping_or_restoring_the_document_column_needs_a_resnapshot() {
    let source = SourceConfig::new("orders");
    let keyed = |column: Option<&str>| Output::Keyed {
        table: "orders".into(),
        document_column: column.map(str::to_string),
    };
    let with = Identity::of(&source, &east(), Some(&keyed(Some("document"))));
    let without = Identity::of(&source, &east(), Some(&keyed(None)));
    assert_eq!(without.to_json()["document_column"], Json::Null);
    // Stored and read back, null stays null (not "not recorded", which compares equal).
    let stored_without = Identity::from_json(without.to_json());
    assert_eq!(stored_without, without);
    for (now, stored, from, to) in [
        (&without, &with, "\"document\"", "null"),
        (&with, &stored_without, "null", "\"document\""),
    ] {
        let changes = now.changes_from(stored, true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        let change = &changes[0];
        assert!(
            change.starts_with(&format!("document_column changed from {from} to {to}")),
            "{change}"
        );
        assert!(
            change.contains("a resnapshot is needed, `ddbpipe state reset <config>` then run"),
            "{change}"
        );
    }
    assert!(without.changes_from(&stored_without, true).is_empty());
}

/// Rule 7: an identity stored before the document column could be null (a plain string)
/// reads as that name: the same fingerprint, no change.
#[test]
fn a_document_column_stored_as_a_name_still_reads() {
    let source = SourceConfig::new("orders");
    let keyed = Output::Keyed {
        table: "orders".into(),
        document_column: Some("doc".into()),
    };
    let now = Identity::of(&source, &east(), Some(&keyed));
    let stored_json = now.to_json();
    assert_eq!(stored_json["document_column"], "doc");
    let stored = Identity::from_json(stored_json.clone());
    assert_eq!(stored, now);
    assert_eq!(stored.fingerprint(), Identity::fingerprint_of(&stored_json));
    assert!(now.changes_from(&stored, true).is_empty());
}

/// A fingerprint is of the identity's keys in sorted order, whatever order its map keeps: the
/// text serde_json writes by default, so fingerprints stored before stay valid. Read back in
/// another order (PostgreSQL's `jsonb` reorders keys; with serde_json's `preserve_order`, which
/// a crate of an embedding program may enable, a map keeps that order) it is the same. Before,
/// the fingerprint was of the text as the map held it: with `preserve_order` a PostgreSQL
/// state entry read back "corrupt" (the workspace's tests met it when a dev-dependency enabled
/// the feature). Fails that way without the sorting under
/// `cargo test -p ddbpipe-pipeline --lib --features serde_json/preserve_order` (checked).
#[test]
fn a_fingerprint_is_of_the_keys_in_sorted_order_whatever_order_they_are_held_in() {
    let sorted = r#"{"a":2,"b":{"x":[{"p":2,"q":1}],"y":"\u00e9\""}}"#;
    let shuffled = r#"{"b":{"y":"é\"","x":[{"q":1,"p":2}]},"a":2}"#;
    let of = |text: &str| Identity::fingerprint_of(&serde_json::from_str(text).unwrap());
    assert_eq!(of(shuffled), of(sorted));
    let expected: String = Sha256::digest(r#"{"a":2,"b":{"x":[{"p":2,"q":1}],"y":"é\""}}"#)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(of(sorted), format!("sha256:{expected}"));
}
