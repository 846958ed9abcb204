//! The keyed sink's unit tests: records into rows, retries of a busy database.

use super::rows::conversion_threads;
use crate::{KeyColumn, KeyType, KeyValue, Version};
use ddbpipe_source::records::Lines;

use super::*;

fn sink(format: ValueFormat, records: Records, key: &[(&str, KeyType)]) -> KeyedSink {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::SqliteDatabase::open(&dir.path().join("t.db")).unwrap();
    KeyedSink::new(
        Database::from(db),
        TableSpec {
            table: "t".into(),
            schema: "public".into(),
            key: key
                .iter()
                .map(|(name, kind)| KeyColumn {
                    name: (*name).into(),
                    kind: *kind,
                })
                .collect(),
            document_column: Some("document".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        },
        format,
        records,
        SinkRetry {
            max_retries: 0,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        },
    )
}

fn batch(lines: &[&str]) -> Batch {
    let mut records = Lines::default();
    for line in lines {
        records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    }
    Batch {
        records,
        ..Batch::default()
    }
}

/// A large batch is converted on several threads: the rows keep the records' order, and
/// of two bad records the first is the one named.
#[test]
fn a_large_batch_converted_on_threads_keeps_order_and_names_the_first_bad_record() {
    let sink = sink(ValueFormat::Plain, Records::Items, &[("pk", KeyType::S)]);
    let lines: Vec<String> = (0..3000)
        .map(|i| format!(r#"{{"pk":"k{i}","v":{i}}}"#))
        .collect();
    let texts: Vec<&str> = lines.iter().map(String::as_str).collect();
    assert!(conversion_threads(texts.len()) > 1 || num_cpus_is_one());
    let rows = sink.rows(&batch(&texts), false).unwrap();
    let keys: Vec<String> = rows
        .iter()
        .map(|row| match row {
            RowChange::Upsert { key, document, .. } => {
                let KeyValue::S(key) = &key[0] else {
                    panic!("an S key")
                };
                assert!(document.contains(&format!(r#""pk":"{key}""#)));
                key.clone()
            }
            RowChange::Delete { .. } => panic!("an upsert"),
        })
        .collect();
    let want: Vec<String> = (0..3000).map(|i| format!("k{i}")).collect();
    assert_eq!(keys, want);

    let mut bad = texts.clone();
    bad[2900] = r#"{"v":"late"}"#;
    bad[1700] = r#"{"v":"first"}"#;
    let error = sink.rows(&batch(&bad), false).unwrap_err();
    assert!(error.contains("first"), "{error}");
    assert!(error.contains("'pk' is missing"), "{error}");
}

fn num_cpus_is_one() -> bool {
    std::thread::available_parallelism().map_or(true, |n| n.get() == 1)
}

#[test]
fn plain_items_give_typed_keys_and_the_item_as_document() {
    let sink = sink(
        ValueFormat::Plain,
        Records::Items,
        &[("pk", KeyType::S), ("n", KeyType::N), ("b", KeyType::B)],
    );
    let line = r#"{"b":"AQI=","n":12345678901234567890123,"pk":"a","x":1}"#;
    let big = r#"{"b":"/w==","n":"99999999999999999999","pk":"\u00e9"}"#;
    let rows = sink.rows(&batch(&[line, big]), false).unwrap();
    assert_eq!(
        rows[0],
        RowChange::Upsert {
            key: vec![
                KeyValue::S("a".into()),
                KeyValue::N("12345678901234567890123".into()),
                KeyValue::B(vec![1, 2]),
            ],
            document: line.into(),
            columns: Vec::new(),
            snapshot: false,
            version: Version::default(),
        }
    );
    let RowChange::Upsert { key, .. } = &rows[1] else {
        panic!("upsert expected");
    };
    assert_eq!(key[0], KeyValue::S("é".into()));
    assert_eq!(key[1], KeyValue::N("99999999999999999999".into()));
}

#[test]
fn typed_keys_keep_their_text() {
    let sink = sink(ValueFormat::Typed, Records::Items, &[("pk", KeyType::N)]);
    let rows = sink
        .rows(&batch(&[r#"{"pk":{"N":"1.50"}}"#]), false)
        .unwrap();
    assert!(
        matches!(&rows[0], RowChange::Upsert { key, .. } if key == &[KeyValue::N("1.50".into())])
    );
    let wrong = sink
        .rows(&batch(&[r#"{"pk":{"S":"1"}}"#]), false)
        .unwrap_err();
    assert!(wrong.contains("key attribute 'pk' (N)"), "{wrong}");
}

#[test]
fn envelopes_become_upserts_of_after_and_deletes_by_key() {
    let sink = sink(
        ValueFormat::Plain,
        Records::Envelopes,
        &[("pk", KeyType::S)],
    );
    let rows = sink
        .rows(
            &Batch {
                read_ms: Some(1767225602123),
                ..batch(&[
                r#"{"after":{"pk":"a","v":1},"before":null,"event_id":"e1","key":{"pk":"a"},"op":"c","sequence_number":"100","shard_id":"s1","ts_ms":1767225600000}"#,
                r#"{"after":null,"before":{"pk":"a"},"event_id":"e2","key":{"pk":"a"},"op":"d","sequence_number":"200","shard_id":"s1","ts_ms":1767225601000}"#,
                r#"{"after":{"pk":"b"},"before":null,"event_id":null,"key":{"pk":"b"},"op":"r","sequence_number":null,"shard_id":null,"ts_ms":null}"#,
            ])
            },
            true,
        )
        .unwrap();
    let change = |ms: i64, seq: &str| Version {
        at_ms: Some(ms),
        sequence: Some(seq.into()),
        repair: None,
    };
    assert_eq!(
        rows,
        vec![
            RowChange::Upsert {
                key: vec![KeyValue::S("a".into())],
                document: r#"{"pk":"a","v":1}"#.into(),
                columns: Vec::new(),
                snapshot: false,
                version: change(1767225600000, "100"),
            },
            RowChange::Delete {
                key: vec![KeyValue::S("a".into())],
                version: change(1767225601000, "200"),
            },
            RowChange::Upsert {
                key: vec![KeyValue::S("b".into())],
                document: r#"{"pk":"b"}"#.into(),
                columns: Vec::new(),
                snapshot: true,
                version: Version {
                    at_ms: Some(1767225602123),
                    sequence: None,
                    repair: None,
                },
            },
        ]
    );
}

#[test]
fn unknown_ops_and_missing_images_name_the_record_and_shard() {
    let sink = sink(
        ValueFormat::Plain,
        Records::Envelopes,
        &[("pk", KeyType::S)],
    );
    let error = sink
        .rows(
            &batch(&[
                r#"{"after":null,"event_id":"e9","key":{"pk":"a"},"op":"unknown","shard_id":"s7"}"#,
            ]),
            false,
        )
        .unwrap_err();
    assert!(
        error.contains("record e9 in s7 has op 'unknown'"),
        "{error}"
    );
    let error = sink
        .rows(
            &batch(&[
                r#"{"after":null,"event_id":"e8","key":{"pk":"a"},"op":"u","shard_id":"s7"}"#,
            ]),
            false,
        )
        .unwrap_err();
    assert!(
        error.contains("record e8 in s7 has no new image"),
        "{error}"
    );
    assert!(error.contains("NEW_AND_OLD_IMAGES"), "{error}");
}

/// A prepared sink into table `t` of a SQLite file at `path`, retrying 3 times 50 ms apart.
async fn sqlite_sink(path: &std::path::Path) -> KeyedSink {
    let sink = KeyedSink::new(
        Database::from(crate::SqliteDatabase::open(path).unwrap()),
        TableSpec {
            table: "t".into(),
            schema: "main".into(),
            key: vec![KeyColumn {
                name: "pk".into(),
                kind: KeyType::S,
            }],
            document_column: Some("document".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        },
        ValueFormat::Plain,
        Records::Items,
        SinkRetry {
            max_retries: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(50),
        },
    );
    sink.prepare().await.unwrap();
    sink
}

/// Another writer holding the file at `path` longer than the 5 s busy timeout: join the
/// thread once the sink's call returned.
fn hold_past_the_busy_timeout(path: &std::path::Path) -> std::thread::JoinHandle<()> {
    let blocker = rusqlite::Connection::open(path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5600));
        blocker.execute_batch("COMMIT").unwrap();
    })
}

/// docs/errors.md §9.4: a busy database rolls the batch back and retries it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_database_is_retried_with_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut sink = sqlite_sink(&path).await;
    let release = hold_past_the_busy_timeout(&path);
    sink.write(&batch(&[r#"{"pk":"a"}"#, r#"{"pk":"b"}"#]), None)
        .await
        .unwrap();
    release.join().unwrap();
    let check = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = check
        .query_row("SELECT count(*) FROM \"t\"", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 2);
}

/// A lease's claim meets a busy database as a batch does (issue 30: a gate saw a worker
/// stop when another, SIGSTOPped inside a transaction, held the file past the busy
/// timeout): it is retried, and the fence is stored once the database is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_busy_database_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut sink = sqlite_sink(&path).await;
    let release = hold_past_the_busy_timeout(&path);
    let fence = ddbpipe_pipeline::sink::Fence {
        pipeline: "p".into(),
        unit: ddbpipe_source::lease::UnitId::Segment { index: 0, total: 1 },
        counter: 3,
        position: None,
        snapshot: None,
        beside: None,
        of: None,
        repair: None,
    };
    let claimed = sink.fencing().unwrap().claim(&fence).await.unwrap();
    assert_eq!(claimed, None, "nothing stored for the unit yet");
    release.join().unwrap();
    let check = rusqlite::Connection::open(&path).unwrap();
    let counter: i64 = check
        .query_row(
            "SELECT counter FROM _ddbpipe_fences WHERE pipeline = 'p'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(counter, 3);
}

#[test]
fn a_missing_key_attribute_is_named() {
    let sink = sink(
        ValueFormat::Plain,
        Records::Items,
        &[("pk", KeyType::S), ("sk", KeyType::N)],
    );
    let error = sink.rows(&batch(&[r#"{"pk":"a"}"#]), false).unwrap_err();
    assert!(error.contains("key attribute 'sk' is missing"), "{error}");
}

/// Items whose page noted their key (`Lines::noted`) give their key from the notes, without
/// reading the record again: here a note that points elsewhere than the record's `pk`, which
/// only a sink taking the notes would follow; a record without notes is read.
#[test]
fn an_item_takes_its_key_from_the_pages_notes() {
    let sink = sink(ValueFormat::Plain, Records::Items, &[("pk", KeyType::S)]);
    let line = r#"{"other":"noted","pk":"read"}"#;
    let noted = line.find(r#""noted""#).unwrap();
    let mut records = Lines::default();
    records.note_attributes(std::sync::Arc::from(vec!["pk".to_string()]));
    records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    records.note_last(|_| Some(noted..noted + r#""noted""#.len()));
    let key_of = |records: Lines| match &sink
        .rows(
            &Batch {
                records,
                ..Batch::default()
            },
            false,
        )
        .unwrap()[0]
    {
        RowChange::Upsert { key, .. } => key.clone(),
        RowChange::Delete { .. } => panic!("an upsert"),
    };
    assert_eq!(key_of(records.clone()), vec![KeyValue::S("noted".into())]);
    // Another record pushed without its notes: the sink reads every record.
    records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    assert_eq!(key_of(records), vec![KeyValue::S("read".into())]);
}
