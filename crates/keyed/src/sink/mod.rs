//! The `sqlite` and `postgres` sinks: records become row changes of a keyed table, committed
//! with the pipeline's position in one transaction (docs/sinks.md §7.2–§7.4, docs/state.md §6.5).
//!
//! # From records to rows
//! The sink reads the JSON lines the source rendered (the same bytes the jsonl sink writes):
//! - scan/query items → upsert of the item, the key taken from its key attributes;
//! - envelopes: `op` `c`, `u`, `r` → upsert of `after`; `d` → delete by `key`; any other `op`
//!   fails the run naming the record's `event_id` and shard. `r` rows written while a snapshot
//!   is open carry its id (docs/sinks.md §7.4).
//!
//! An upsert's typed columns (docs/sinks.md §7.9) are read from the same document (`after`)
//! by the sink's [`TypedColumns`]: the reader of `value_format` and `sink.on_type_mismatch`
//! ([`KeyedSink::on_type_mismatch`]; `crate::columns` says how a mismatch is stored, counted
//! or fails the batch). A mismatch under `fail` fails the batch before anything of it is
//! written, as a record that cannot become a row does.
//!
//! Key values follow `value_format`: plain `S` strings, `N` numbers (a JSON number's text, or
//! the string §3.2 writes for a number no double holds), `B` base64; typed `{"S": …}`,
//! `{"N": "<text>"}`, `{"B": "<base64>"}`. Scan and stream records of one pipeline render keys
//! the same way, so a key always maps to the same row.
//!
//! # Retries (docs/errors.md §9.4)
//! A retryable database error (connection loss, serialization failure, deadlock, busy) rolls
//! the transaction back; the whole batch is retried with the source's backoff and budget. When
//! the budget runs out the error is [`SinkErrorClass::Transient`] (a later run may succeed);
//! any other failure (a record that cannot become a row, a document the column cannot store, a
//! constraint) is [`SinkErrorClass::Definite`]: a rerun fails on the same batch.

use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{
    CleanedUp, CloseShared, Fence, Fencing, Records, SharedSnapshot, SharedSnapshots, Sink,
    SinkError, SinkErrorClass, SnapshotClosed, Staged, Versioned,
};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::retry::{Cancel, GaveUp, RetryPolicy};
use ddbpipe_value::ValueFormat;

mod rows;

use crate::state::DatabaseStore;
use crate::{
    CloseSnapshot, Database, DbError, FenceWrite, OnMismatch, RowChange, SnapshotGuard, StateWrite,
    TableSpec, TypedColumns,
};

/// The attributes an item is read for: `table`'s key attributes, then the roots of `columns`.
fn item_attributes(table: &TableSpec, columns: &TypedColumns) -> Vec<String> {
    let keys = table.key.iter().map(|column| column.name.clone());
    keys.chain(columns.reader().roots().iter().cloned())
        .collect()
}

/// How failed transactions are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkRetry {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The first backoff.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
}

/// A keyed sink over a SQLite or PostgreSQL database.
#[derive(Debug)]
pub struct KeyedSink {
    db: Database,
    table: TableSpec,
    /// The pipeline's state in `db`, shared with the checkpointer's store.
    state: DatabaseStore,
    format: ValueFormat,
    /// The typed columns' reader (of `format`) and `on_type_mismatch`.
    columns: TypedColumns,
    /// What an item's one pass reads: its key attributes (key-column order), then the
    /// attributes the typed columns' paths start at (`columns.reader().roots()`).
    item_attributes: Vec<String>,
    records: Records,
    retry: SinkRetry,
}

impl KeyedSink {
    /// A sink writing `records` into `table` of `db`, its documents rendered in `format`, a
    /// mismatch of a typed column stored as NULL (see [`on_type_mismatch`](Self::on_type_mismatch));
    /// call [`prepare`](Self::prepare) first.
    pub fn new(
        db: Database,
        table: TableSpec,
        format: ValueFormat,
        records: Records,
        retry: SinkRetry,
    ) -> Self {
        let columns = TypedColumns::new(table.columns.clone(), format, OnMismatch::default());
        KeyedSink {
            state: DatabaseStore::new(db.clone(), table.clone()),
            item_attributes: item_attributes(&table, &columns),
            columns,
            db,
            table,
            format,
            records,
            retry,
        }
    }

    /// What a value that does not fit its typed column does (`sink.on_type_mismatch`,
    /// docs/sinks.md §7.9): [`OnMismatch::Null`] (the default) or [`OnMismatch::Fail`]. It
    /// applies to the sink's batches and to the fill of a column `prepare` adds.
    pub fn on_type_mismatch(mut self, on_mismatch: OnMismatch) -> Self {
        self.columns = TypedColumns::new(self.table.columns.clone(), self.format, on_mismatch);
        self
    }

    /// The position store of the pipeline in the sink's database, sharing what the sink's
    /// batches commit: the checkpointer's store when the sink writes the batches.
    pub fn state_store(&self) -> DatabaseStore {
        self.state.clone()
    }

    /// Creates or checks the destination table and the state table, adding (and filling)
    /// the typed columns a table lacks ([`Database::prepare_with`]).
    pub async fn prepare(&self) -> Result<(), SinkError> {
        self.db
            .prepare_with(&self.table, &self.columns)
            .await
            .map_err(|e| self.db_error(e))
    }

    /// A definite failure: retrying cannot change it.
    fn error(&self, message: String) -> SinkError {
        SinkError {
            sink: self.db.describe(),
            message,
            class: SinkErrorClass::Definite,
        }
    }

    /// A database error after the sink's retries: transient when it was retryable.
    fn db_error(&self, error: DbError) -> SinkError {
        SinkError {
            class: error.class,
            ..self.error(error.message)
        }
    }

    async fn apply(
        &self,
        rows: &[RowChange],
        write: &StateWrite,
        snapshot_id: Option<i64>,
    ) -> Result<(), DbError> {
        self.retried(|| self.db.apply(&self.table, rows, snapshot_id, write))
            .await
    }

    /// Runs `transaction` again while it fails with a retryable error (a busy database, a lost
    /// connection), with the source's backoff and budget: a batch's apply, a lease's claim.
    async fn retried<T, F: Future<Output = Result<T, DbError>>>(
        &self,
        mut transaction: impl FnMut() -> F,
    ) -> Result<T, DbError> {
        let policy = RetryPolicy {
            max_retries: self.retry.max_retries,
            initial_backoff: self.retry.initial_backoff,
            max_backoff: self.retry.max_backoff,
            ..RetryPolicy::default()
        };
        let retrying = |n: u32, error: &DbError, _delay| {
            tracing::debug!(
                sink = %self.db.describe(),
                attempt = n + 1,
                error = %error.message,
                "Sink transaction failed; retrying the batch."
            );
            ddbpipe_source::retry::note_retry("sink_transaction", &error.message);
        };
        let applied = policy
            .retry(
                Duration::MAX,
                &Cancel::never(),
                DbError::is_retryable,
                retrying,
                |_| transaction(),
            )
            .await;
        match applied {
            Ok(value) => Ok(value),
            Err(GaveUp::Failed {
                mut error,
                attempts,
            }) => {
                if attempts > 1 {
                    error.message =
                        format!("{} (failed after {attempts} attempt(s))", error.message);
                }
                Err(error)
            }
            // `Cancel::never()` never fires.
            Err(GaveUp::Cancelled) => Err(DbError::fatal(format!(
                "{}: the transaction was cancelled",
                self.db.describe()
            ))),
        }
    }
}

impl KeyedSink {
    /// Writes `batch` with the state of `state` and the lease fence of `fence`, in one
    /// transaction.
    async fn write_with(
        &mut self,
        batch: &Batch,
        state: Option<&Staged>,
        fence: Option<&Fence>,
    ) -> Result<(), SinkError> {
        // A mirror shared by several workers names its open snapshot in the fence: its rows'
        // batches, refused once it is closed, and the changes read beside it, marked with it.
        let shared = fence.and_then(|fence| fence.snapshot);
        let beside = fence.and_then(|fence| fence.beside);
        let snapshot_id = state.and_then(Staged::snapshot_id).or(shared).or(beside);
        let repair_id = state.and_then(Staged::repair_id);
        let rows = self
            .rows_during(batch, snapshot_id.is_some(), repair_id)
            .map_err(|message| self.error(message))?;
        let (write, parts) = match state {
            Some(staged) => {
                let (write, parts) = self.state.changes(&staged.pipeline, Some(&staged.entry));
                (write, Some(parts))
            }
            None => (StateWrite::default(), None),
        };
        let mut write = write;
        if let Some(fence) = fence {
            write.pipeline.clone_from(&fence.pipeline);
            write.fences.push(FenceWrite {
                unit: fence.unit.to_string(),
                counter: fence.counter,
                position: fence.position.as_ref().map(LeaseCheckpoint::encode),
            });
            write.snapshot = shared.map(SnapshotGuard::Open);
        }
        if rows.is_empty() && write.is_empty() {
            return Ok(());
        }
        self.apply(&rows, &write, snapshot_id)
            .await
            .map_err(|e| self.db_error(e))?;
        if let Some(parts) = parts {
            self.state.written(parts);
        }
        Ok(())
    }
}

impl Sink for KeyedSink {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        self.write_with(batch, state, None).await
    }

    fn describe(&self) -> String {
        format!("{} table '{}'", self.db.describe(), self.table.table)
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        Some(self)
    }

    fn versioned(&self) -> Option<&impl Versioned> {
        Some(self)
    }
}

/// Every worker writes one database: fences are kept in its state table, committed with the
/// rows (docs/coordination.md §11.7 rule 4).
impl Fencing for KeyedSink {
    async fn write_fenced(&mut self, batch: &Batch, fence: &Fence) -> Result<(), SinkError> {
        self.write_with(batch, None, Some(fence)).await
    }

    async fn claim(&mut self, fence: &Fence) -> Result<Option<LeaseCheckpoint>, SinkError> {
        let unit = fence.unit.to_string();
        let write = StateWrite {
            pipeline: fence.pipeline.clone(),
            fences: vec![FenceWrite::new(unit.clone(), fence.counter)],
            ..StateWrite::default()
        };
        // Retried as a batch is: a claim that meets a busy database (another worker's
        // transaction, one stopped in the middle of it) waits as long as a write would.
        self.retried(|| async {
            self.db.store_state(&write).await?;
            self.db.fence_position(&fence.pipeline, &unit).await
        })
        .await
        .map(|stored| stored.map(|text| fence.unit.checkpoint(&text)))
        .map_err(|e| self.db_error(e))
    }
}

/// Snapshot rows are written by their versions (docs/mirror.md §5.6): the stream is read
/// beside a snapshot's scan.
impl Versioned for KeyedSink {}

impl SharedSnapshots for KeyedSink {
    async fn open_shared_snapshot(
        &mut self,
        pipeline: &str,
        id: i64,
    ) -> Result<SharedSnapshot, SinkError> {
        self.db
            .open_shared_snapshot(&self.table, pipeline, id)
            .await
            .map_err(|e| self.db_error(e))
    }

    async fn shared_export(
        &mut self,
        pipeline: &str,
        id: i64,
        expected: Option<&str>,
        arn: &str,
    ) -> Result<String, SinkError> {
        self.db
            .shared_export(pipeline, id, expected, arn)
            .await
            .map_err(|e| self.db_error(e))
    }

    async fn close_shared_snapshot(
        &mut self,
        pipeline: &str,
        snapshot: &SharedSnapshot,
        close: &CloseShared,
    ) -> Result<Option<CleanedUp>, SinkError> {
        let closed = SharedSnapshot {
            closed: Some(SnapshotClosed {
                by: close.by.clone(),
                at_ms: close.at_ms,
            }),
            ..snapshot.clone()
        };
        let record = serde_json::to_string(&closed)
            .map_err(|e| self.error(format!("the snapshot record: {e}")))?;
        let write = StateWrite {
            pipeline: pipeline.to_string(),
            snapshot: Some(SnapshotGuard::Close {
                id: snapshot.id,
                record,
            }),
            ..StateWrite::default()
        };
        let request = CloseSnapshot {
            id: snapshot.id,
            delete_unseen: close.delete_unseen,
            max_keys: close.max_keys,
        };
        match self.db.close_snapshot(&self.table, request, &write).await {
            Ok(done) => Ok(Some(CleanedUp {
                keys_written: done.keys_written,
                deleted: done.deleted,
                ceiling_hit: done.ceiling_hit,
            })),
            Err(error) if error.is_fenced() => {
                // Refused: closed already, or the record is not this snapshot's any more (a
                // reset): read, not opened again.
                let stored = self
                    .db
                    .shared_snapshot(pipeline)
                    .await
                    .map_err(|e| self.db_error(e))?;
                match stored {
                    Some(stored) if stored.id == snapshot.id && stored.closed.is_some() => Ok(None),
                    _ => Err(self.db_error(error)),
                }
            }
            Err(error) => Err(self.db_error(error)),
        }
    }
}

#[cfg(test)]
mod tests {
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
                &batch(&[r#"{"after":null,"event_id":"e9","key":{"pk":"a"},"op":"unknown","shard_id":"s7"}"#]),
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

    /// docs/errors.md §9.4: a busy database rolls the batch back and retries it whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_database_is_retried_with_the_whole_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = crate::SqliteDatabase::open(&path).unwrap();
        let mut sink = KeyedSink::new(
            Database::from(db),
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
        // Another writer holds the database longer than the 5 s busy timeout.
        let blocker = rusqlite::Connection::open(&path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5600));
            blocker.execute_batch("COMMIT").unwrap();
        });
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
        let mut sink = KeyedSink::new(
            Database::from(crate::SqliteDatabase::open(&path).unwrap()),
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
        let blocker = rusqlite::Connection::open(&path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5600));
            blocker.execute_batch("COMMIT").unwrap();
        });
        let unit = ddbpipe_source::lease::UnitId::Segment { index: 0, total: 1 };
        let fence = ddbpipe_pipeline::sink::Fence {
            pipeline: "p".into(),
            unit,
            counter: 3,
            position: None,
            snapshot: None,
            beside: None,
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
}
