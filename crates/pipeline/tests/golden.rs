//! Golden state files (`tests/golden/README.md`): every state file ddbpipe has written is read
//! and written back; the current format comes back byte-identical, an earlier one in today's
//! format.

// A failed unwrap in a test is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use serde_json::Value;

fn golden(name: &str) -> PathBuf {
    ddbpipe_testkit::package_dir()
        .join("tests/golden")
        .join(name)
}

/// Loads every pipeline of the golden file into a copy and stores it back; returns the copy's
/// bytes.
fn rewritten(name: &str) -> (Vec<u8>, Vec<u8>) {
    let original = std::fs::read(golden(name)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(name);
    std::fs::write(&copy, &original).unwrap();
    let doc: Value = serde_json::from_slice(&original).unwrap();
    let file = StateFile::new(&copy);
    for pipeline in doc["pipelines"].as_object().unwrap().keys() {
        let entry = file.load(pipeline).unwrap().unwrap();
        file.store(pipeline, Some(&entry)).unwrap();
    }
    (original, std::fs::read(&copy).unwrap())
}

#[test]
fn every_current_state_file_is_written_back_byte_identically() {
    for name in [
        "demo-scan-completed.state.json",
        "demo-streams.state.json",
        "v1-shared.state.json",
        "v1-resnapshot-open.state.json",
        "v1-mirror-open.state.json",
    ] {
        let (original, written) = rewritten(name);
        assert_eq!(
            String::from_utf8(written).unwrap(),
            String::from_utf8(original).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn an_earlier_state_file_is_read_and_written_in_todays_format() {
    let (_, written) = rewritten("v0-streams-without-floors.state.json");
    let expected = std::fs::read(golden("v0-streams-without-floors.expected.json")).unwrap();
    assert_eq!(
        String::from_utf8(written).unwrap(),
        String::from_utf8(expected).unwrap()
    );
}

/// The open snapshot's record is read: its id, its reason, its scan progress.
#[tokio::test]
async fn an_open_snapshot_resumes_with_its_progress() {
    for (name, mirror) in [
        ("v1-resnapshot-open.state.json", false),
        ("v1-mirror-open.state.json", true),
    ] {
        let file = StateFile::new(golden(name));
        let identity = file.load("orders-mirror").unwrap().unwrap().identity;
        let checkpointer = Checkpointer::open_streams(
            file,
            "orders-mirror",
            Identity::from_json(identity.to_json()),
            Duration::ZERO,
        )
        .await
        .unwrap();
        assert!(checkpointer.snapshot_open(), "{name}");
        assert!(!checkpointer.snapshot_complete(), "{name}");
        assert_eq!(
            checkpointer.snapshot_id(),
            Some(1_767_225_600_123),
            "{name}"
        );
        let progress = checkpointer.position();
        assert_eq!(progress.total_segments, 4);
        assert_eq!(progress.done.ranges(), [[0, 0]]);
        assert_eq!(progress.cursors.keys().copied().collect::<Vec<_>>(), [2, 3]);
        let kind = checkpointer.streams_position().unwrap().kind;
        assert_eq!(
            kind == ddbpipe_source::position::StreamKind::Mirror,
            mirror,
            "{name}"
        );
    }
}

/// The stored identities (`golden/identities.jsonl`, one `{case, fingerprint, identity}` a
/// line, as state files, keyed state tables and leader rows hold them): those today's
/// ddbpipe builds come out of its constructors byte-identically, with the same fingerprint.
#[test]
fn every_identity_ddbpipe_builds_is_stored_as_before() {
    let golden = std::fs::read_to_string(golden("identities.jsonl")).unwrap();
    let built = built_identities();
    let mut lines = golden.lines();
    for (case, identity) in &built {
        let line = serde_json::json!({
            "case": case,
            "fingerprint": identity.fingerprint(),
            "identity": identity.to_json(),
        })
        .to_string();
        assert_eq!(lines.next(), Some(line.as_str()), "{case}");
    }
}

/// Every stored identity — built by today's ddbpipe, by an earlier one (fewer fields, an
/// endpoint with its password), by a newer one (a field and a value this one does not know)
/// — is read and written back as stored, its fingerprint the one stored beside it; an
/// endpoint stored with its secrets comes back masked.
#[test]
fn every_stored_identity_is_read_and_written_back_as_stored() {
    let golden = std::fs::read_to_string(golden("identities.jsonl")).unwrap();
    let lines: Vec<Value> = golden
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let case = |name: &str| lines.iter().find(|l| l["case"] == name).unwrap().clone();
    for line in &lines {
        let name = line["case"].as_str().unwrap();
        let stored = &line["identity"];
        assert_eq!(
            Identity::fingerprint_of(stored),
            line["fingerprint"].as_str().unwrap(),
            "{name}"
        );
        let expected = match name {
            "earlier-unmasked-endpoint" => case("earlier-unmasked-endpoint-as-read"),
            _ => line.clone(),
        };
        let read = Identity::from_json(stored.clone());
        assert_eq!(
            read.to_json().to_string(),
            expected["identity"].to_string(),
            "{name}"
        );
        assert_eq!(
            read.fingerprint(),
            expected["fingerprint"].as_str().unwrap(),
            "{name}"
        );
    }
}

/// The identities today's ddbpipe builds, one per kind of run and destination.
fn built_identities() -> Vec<(&'static str, Identity)> {
    use ddbpipe_pipeline::state::identity::{FileCompression, FileWrite, Location, Output};
    use ddbpipe_source::config::{Mode, SnapshotEngine, SourceConfig};
    use ddbpipe_value::{Number, Value as V, ValueFormat};
    let east = Location {
        region: Some("us-east-1".into()),
        endpoint_url: None,
        account: Some("111122223333".into()),
    };
    let emulator = Location {
        region: Some("us-west-2".into()),
        endpoint_url: Some("http://127.0.0.1:8000".into()),
        account: None,
    };
    let stream =
        "arn:aws:dynamodb:us-east-1:111122223333:table/orders/stream/2026-01-01T00:00:00.000";

    let mut scan = SourceConfig::new("orders");
    scan.segments = 4;
    scan.filter_expression = Some("#s = :s AND amount > :n".into());
    scan.projection = Some("pk, sk, #s".into());
    scan.expression_attribute_names = [("#s".to_string(), "status".to_string())].into();
    scan.expression_attribute_values = [(":s".to_string(), V::S("open".into()))].into();
    scan.expression_attribute_values_typed = [(
        ":n".to_string(),
        V::N(Number::new("12345678901234567890123.5")),
    )]
    .into();
    let appended = Output::File {
        path: "/data/orders.jsonl".into(),
        write: FileWrite::Append,
        compression: FileCompression::None,
    };

    let mut query = SourceConfig::new("arn:aws:dynamodb:us-east-1:111122223333:table/orders");
    query.mode = Mode::Query;
    query.index_name = Some("by-status".into());
    query.key_condition_expression = Some("#s = :s".into());
    query.expression_attribute_names = [("#s".to_string(), "status".to_string())].into();
    query.expression_attribute_values = [(":s".to_string(), V::S("open".into()))].into();
    query.expression_attribute_values_typed = [
        (":b".to_string(), V::B(vec![0, 1, 255])),
        (":ss".to_string(), V::Ss(vec!["b".into(), "a".into()])),
        (
            ":m".to_string(),
            V::M(
                [
                    ("n".to_string(), V::Ns(vec![Number::new("1e3")])),
                    ("z".to_string(), V::Null),
                ]
                .into(),
            ),
        ),
        (
            ":l".to_string(),
            V::L(vec![V::Bool(true), V::Bs(vec![vec![7]])]),
        ),
    ]
    .into();
    query.scan_index_forward = false;
    query.value_format = ValueFormat::Typed;

    let mut streams = SourceConfig::new("orders");
    streams.mode = Mode::Streams;
    streams.stream_arn = Some(stream.into());
    let per_run = Output::File {
        path: "/data/changes.jsonl.gz".into(),
        write: FileWrite::NewFilePerRun,
        compression: FileCompression::Gzip,
    };

    let mut mirror = SourceConfig::new("orders");
    mirror.mode = Mode::Mirror;
    mirror.segments = 8;
    mirror.value_format = ValueFormat::PlainExact;
    let keyed = Output::Keyed {
        table: "orders_copy".into(),
        document_column: Some("document".into()),
    };

    let mut export = SourceConfig::new("orders");
    export.snapshot.engine = SnapshotEngine::Export;
    export.snapshot.export_arn = Some(
        "arn:aws:dynamodb:us-east-1:111122223333:table/orders/export/01767225600000-abcdef".into(),
    );
    let overwritten = Output::File {
        path: "/data/orders.jsonl.gz".into(),
        write: FileWrite::Overwrite,
        compression: FileCompression::Gzip,
    };

    let mut mirror_export = mirror.clone();
    mirror_export.snapshot.engine = SnapshotEngine::Export;
    let shared = Identity::of(&mirror_export, &east, Some(&keyed)).of_shared_run(
        "sqlite /data/orders.db, table orders_copy".to_string(),
        Some(stream),
    );
    let shared_scan = Identity::of(&scan, &east, Some(&appended))
        .of_shared_run("jsonl /data/orders-{worker}.jsonl".to_string(), None);

    vec![
        (
            "scan-jsonl-append",
            Identity::of(&scan, &east, Some(&appended)),
        ),
        (
            "query-stdout",
            Identity::of(&query, &emulator, Some(&Output::Stdout)),
        ),
        (
            "streams-jsonl-gzip",
            Identity::of(&streams, &east, Some(&per_run)),
        ),
        ("mirror-keyed", Identity::of(&mirror, &east, Some(&keyed))),
        (
            "export-jsonl-overwrite",
            Identity::of(&export, &east, Some(&overwritten)),
        ),
        (
            "no-output",
            Identity::of(&SourceConfig::new("orders"), &Location::default(), None),
        ),
        ("shared-mirror-leader-row", shared),
        ("shared-scan-leader-row", shared_scan),
        (
            "scan-custom-sink",
            Identity::of(
                &scan,
                &east,
                Some(&Output::Given {
                    name: "orders-service".to_string(),
                }),
            ),
        ),
    ]
}
