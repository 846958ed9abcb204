//! Keyed destinations: one table per source table in SQLite or PostgreSQL, with typed key
//! columns, a document column and a snapshot marker, and the pipeline's position in the same
//! database (docs/state.md §6.5, docs/sinks.md §7.2–§7.4).
//!
//! # The destination table
//! One column per key attribute (hash key first), named after it: `S` → text, `N` → the exact
//! number text (`TEXT` in SQLite, `numeric` in PostgreSQL), `B` → bytes. Then the document
//! column (the item JSON: `TEXT` / `jsonb`, `json` or `text` per [`DocumentType`]; none when
//! [`TableSpec::document_column`] is `None`), the typed columns of [`TableSpec::columns`] in
//! their order (nullable; docs/sinks.md §7.9: each holds one attribute converted to its type,
//! see [`TypedColumns`]), `_ddbpipe_snapshot` (integer, null), `_ddbpipe_updated_at` (RFC 3339 text in SQLite,
//! `timestamptz` in PostgreSQL), and the version
//! of the last write (docs/mirror.md §5.6): `_ddbpipe_version_ms` (integer, null: unix ms) and
//! `_ddbpipe_version_seq` (text, null: the stream record's sequence number, set only by stream
//! changes). Primary key: the key columns. A table created before versions existed gets the two
//! version columns from [`Database::prepare`]; its rows keep null versions.
//!
//! Beside it (in PostgreSQL, in the same schema) `_ddbpipe_deleted (table_name, key_text,
//! version_ms)`, primary key `(table_name, key_text)`, holds a deleted-key marker for each key a
//! stream change deleted while a snapshot was open. `key_text` is the JSON array of the typed
//! key values (`[{"S":"a"},{"N":"1"}]`, bytes in base64).
//!
//! # Rows
//! Changes apply in slice order, so several changes to one key in a batch end in the last.
//! An upsert writes its document and its typed columns ([`RowChange::Upsert`]'s `columns`)
//! together: every rule below that writes, keeps or replaces the document does the same to
//! the typed columns. Every upsert records its [`Version`]: a stream change its time and sequence number, a
//! snapshot row its page's request time and no sequence, an unversioned row nulls.
//!
//! - No snapshot open: [`RowChange::Upsert`] inserts or replaces the row and leaves
//!   `_ddbpipe_snapshot` as it is (null for a new row); [`RowChange::Delete`] deletes by key. A
//!   snapshot row is refused.
//! - A snapshot open (`snapshot_id` given to [`Database::apply`]): a stream upsert (`snapshot:
//!   false`) also sets the marker to the snapshot id, so its key counts as seen by the cleanup;
//!   a delete also leaves a deleted-key marker at the delete's time, in the same transaction.
//! - A snapshot row (`snapshot: true`) read at `p` is written, marked with the id, unless the
//!   stream may already have applied something newer for its key: a deleted-key marker, or a row
//!   written by a stream change during this snapshot (the id and a sequence), whose version is
//!   above `p − 1 s − 60 s` (a null time counts as newer). Rows from before the snapshot never
//!   hold it back. A snapshot row without a version is written as before versions. The check is
//!   part of the row's one statement.
//! - A repair change (a [`Version`] with `repair`, docs/streams.md §4.12) written at `w`: the
//!   upsert or delete applies only when the row is missing or older — its version null, a
//!   stream change's time below `w`, or another row's (a snapshot's read time, an earlier
//!   repair's write time) below `w` plus 60 s; the row is then marked with the repair id, no
//!   sequence. An older row the delete removes is gone; a newer row stays and is marked too.
//!   Closing a repair window ([`Database::close_repair_window`]) deletes the rows a stream
//!   change wrote at a time inside the window that the window did not mark: the item was
//!   created and deleted inside the window, which an incremental export leaves out.
//!
//! # Typed columns at the start of a run
//! [`Database::prepare_with`] compares the configured document and typed columns with an
//! existing table (`columns::plan`'s rules): a missing typed column is added and, when the
//! table has rows, filled from their documents by the same [`TypedColumns`] the writes use, in
//! one transaction with the `ALTER TABLE`; a column of another type, a column ddbpipe cannot
//! leave out of its inserts (`NOT NULL` without a default) and a table with rows whose new
//! column has no document to be filled from are refused. [`Database::check_columns`] reports
//! the same plan without changing anything.
//!
//! # State
//! Table `_ddbpipe_state (pipeline, part, value, updated_at)`, primary key `(pipeline, part)`;
//! `value` is JSON text (SQLite) or `jsonb` (PostgreSQL). A [`StateWrite`] upserts and deletes
//! parts. [`Database::apply`] writes the rows and the state in **one** transaction: its commit is
//! the acknowledgement of the batch, so a crash either keeps both or neither.
//!
//! # Complete-read cleanup (docs/mirror.md §5.3, docs/sinks.md §7.4)
//! [`Database::close_snapshot`] counts the rows marked with the snapshot id (`keys_written`,
//! which includes the keys stream changes wrote during the snapshot); if that is at most
//! `max_keys` and deletes are wanted, it deletes every row whose marker is null or another id;
//! it drops the table's deleted-key markers (whether or not it deleted); then it writes the
//! state; all in one transaction.
//!
//! # The pipeline's side
//! [`sink::KeyedSink`] is the `sqlite` / `postgres` sink of the pipeline crate's `Sink` trait,
//! and [`state::DatabaseStore`] its `CheckpointStore`: batches commit their state parts with
//! their rows.

use ddbpipe_pipeline::sink::SinkErrorClass;
use ddbpipe_value::ValueFormat;
pub use ddbpipe_value::{ColumnSpec, ColumnType, ColumnValue, TimeFormat};

mod backend;
mod columns;
mod database;
mod fence;
mod postgres;
pub mod sink;
mod sql;
mod sqlite;
pub mod state;

pub use columns::{ColumnCheck, TypedColumns, describe_metrics};
pub use database::Database;
/// The type of a key attribute, as the source reads it: `S` is stored as text, `N` as the
/// exact number text (SQLite) or `numeric` (PostgreSQL), `B` as bytes.
pub use ddbpipe_source::api::KeyType;
pub use postgres::{LIBPQ_ENVIRONMENT, PostgresDatabase, copy_text};
pub use sql::{RESERVED_PREFIX, describe_key};
pub use sqlite::SqliteDatabase;

/// The type of the PostgreSQL document column (`sink.document_type`). SQLite always stores
/// TEXT, which keeps every document exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DocumentType {
    /// `jsonb` (the default): queryable and indexable, but it cannot hold U+0000 inside a
    /// string; a document with one fails its batch, naming the item's key and the attribute.
    #[default]
    Jsonb,
    /// `json`: the document text exactly as written, `\u0000` included (validated as JSON).
    Json,
    /// `text`: the document text exactly as written, not validated.
    Text,
}

impl DocumentType {
    /// `"jsonb"`, `"json"` or `"text"`: the config value and the PostgreSQL type name.
    pub fn name(self) -> &'static str {
        match self {
            DocumentType::Jsonb => "jsonb",
            DocumentType::Json => "json",
            DocumentType::Text => "text",
        }
    }

    /// How records are rendered for a document column of this type when the pipeline's
    /// `value_format` is `chosen` (docs/values.md §3.7, docs/sinks.md §7.3): `json` and `jsonb`
    /// keep numbers as exact `numeric`, so plain documents get every number as a JSON number of
    /// its own digits ([`ValueFormat::PlainExact`]), and one attribute has one JSON type in
    /// every row. `text` keeps the plain rule (the bytes the jsonl sink writes); typed
    /// documents are unchanged.
    pub fn value_format(self, chosen: ValueFormat) -> ValueFormat {
        match (self, chosen) {
            (DocumentType::Jsonb | DocumentType::Json, ValueFormat::Plain) => {
                ValueFormat::PlainExact
            }
            (_, chosen) => chosen,
        }
    }
}

/// What a keyed sink does with an attribute whose value does not fit its typed column
/// (`sink.on_type_mismatch`, docs/sinks.md §7.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMismatch {
    /// `null` (the default): store NULL, count it in `ddbpipe_column_mismatches_total{column}`,
    /// log the first of each column.
    #[default]
    Null,
    /// `fail`: the batch fails (definite), naming the column, the record's key and the type
    /// found; nothing of it is written.
    Fail,
}

impl OnMismatch {
    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            OnMismatch::Null => "null",
            OnMismatch::Fail => "fail",
        }
    }
}

/// One key column of the destination table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    /// The attribute name, used as the column name (quoted).
    pub name: String,
    /// Its type.
    pub kind: KeyType,
}

/// The destination table of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// The table name (unquoted; quoted in SQL).
    pub table: String,
    /// PostgreSQL: the schema holding the table and `_ddbpipe_state` (default `public`).
    /// SQLite: ignored.
    pub schema: String,
    /// The key columns, hash key first.
    pub key: Vec<KeyColumn>,
    /// The document column's name; `None` (`sink.document_column: null`): no document column,
    /// only the key and the typed columns are stored (docs/sinks.md §7.9).
    pub document_column: Option<String>,
    /// The typed columns (`sink.columns`, docs/sinks.md §7.9), after the document column.
    pub columns: Vec<ColumnSpec>,
    /// PostgreSQL: the document column's type. SQLite: ignored (TEXT).
    pub document_type: DocumentType,
    /// Create the table (and `_ddbpipe_state`) when missing; otherwise a missing table is an
    /// error.
    pub create_table: bool,
}

/// One key value, in key-column order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyValue {
    /// Text.
    S(String),
    /// The number's text (exact; as written by ddbpipe).
    N(String),
    /// Bytes.
    B(Vec<u8>),
}

/// One change to the destination table.
#[derive(Debug, Clone, PartialEq)]
pub enum RowChange {
    /// Insert or replace the row of `key`.
    Upsert {
        /// The key values, in key-column order.
        key: Vec<KeyValue>,
        /// The document: a JSON object, as text.
        document: String,
        /// The typed columns' values, in the order of [`TableSpec::columns`] (a mismatch
        /// already resolved per `sink.on_type_mismatch`).
        columns: Vec<ColumnValue>,
        /// A snapshot row: marks the row with the open snapshot's id.
        snapshot: bool,
        /// When the document was true (docs/mirror.md §5.6).
        version: Version,
    },
    /// Delete the row of `key` (nothing when there is none).
    Delete {
        /// The key values, in key-column order.
        key: Vec<KeyValue>,
        /// When the item was deleted (docs/mirror.md §5.6).
        version: Version,
    },
}

/// The version a row change is written at (docs/mirror.md §5.6): for a stream change, its
/// record's `ApproximateCreationDateTime` and sequence number; for a snapshot row, when the Scan
/// request of its page was sent. Scan items and records without a time have no version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Version {
    /// Unix ms: the change's creation time (DynamoDB rounds it down to the second), or the
    /// page's request time (this machine's clock).
    pub at_ms: Option<i64>,
    /// The stream record's sequence number; `None` for snapshot rows.
    pub sequence: Option<String>,
    /// A change read from an incremental export by this repair (its id; docs/streams.md
    /// §4.12): `at_ms` is the exact write time, and the change applies only over an older row.
    pub repair: Option<i64>,
}

/// Parts of the pipeline state to write in a transaction (docs/state.md §6.5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateWrite {
    /// The pipeline name.
    pub pipeline: String,
    /// Parts to insert or replace: `(part, JSON text)`.
    pub upserts: Vec<(String, String)>,
    /// Parts to delete.
    pub deletes: Vec<String>,
    /// `updated_at` of the written parts (RFC 3339); rows written in the same transaction get
    /// it as their `_ddbpipe_updated_at` (empty: the time of the write).
    pub updated_at: String,
    /// Lease fences the transaction must pass (docs/coordination.md §11.7 rule 4): each
    /// advances the unit's stored counter in `_ddbpipe_fences` (and its position, when given),
    /// and a stored counter above it (a newer owner of the lease wrote) rolls the whole
    /// transaction back with a [`DbError`] whose `fenced` is set.
    pub fences: Vec<FenceWrite>,
    /// The shared snapshot record the transaction depends on (a mirror across workers,
    /// docs/coordination.md §11.12).
    pub snapshot: Option<SnapshotGuard>,
    /// The pipeline whose record `snapshot` reads when the fences are kept under a
    /// generation's name (docs/coordination.md §11.12 rule 8); `None`: `pipeline`'s.
    pub record_of: Option<String>,
}

/// The fence-table unit under which a mirror shared by several workers keeps its snapshot
/// record (docs/coordination.md §11.12): counter 0 while the snapshot is open, 1 once closed;
/// the position holds the record's JSON.
pub const SNAPSHOT_UNIT: &str = "snapshot";

/// How a transaction depends on the pipeline's shared snapshot record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotGuard {
    /// A batch of snapshot `id`'s rows: refused (fenced) unless that snapshot is open. The
    /// record is share-locked (PostgreSQL) so that batches of several workers do not wait on
    /// each other, only on the close.
    Open(i64),
    /// A batch of changes read by the generation of snapshot `id`: refused (fenced) unless
    /// the record is that snapshot's, open or closed, so a worker of an earlier generation
    /// writes nothing once another snapshot was opened in place of its own. Share-locked.
    Of(i64),
    /// Closing snapshot `id`: refused (fenced) unless it is open; the record is locked for the
    /// transaction and replaced by `record` (the closed record's JSON), counter 1.
    Close {
        /// The snapshot.
        id: i64,
        /// The closed record.
        record: String,
    },
}

impl SnapshotGuard {
    /// The snapshot guarded.
    pub fn id(&self) -> i64 {
        match self {
            SnapshotGuard::Open(id) | SnapshotGuard::Of(id) | SnapshotGuard::Close { id, .. } => {
                *id
            }
        }
    }
}

/// One lease fence a transaction passes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceWrite {
    /// The unit (`segment:<i>/<n>`, `shard:<id>`).
    pub unit: String,
    /// The lease counter the writer holds.
    pub counter: u64,
    /// Where the unit stands once the transaction's rows are in; stored with the counter, so
    /// the unit's next owner resumes exactly after them (`None`: the stored one stays).
    pub position: Option<String>,
}

impl FenceWrite {
    /// The fence of `unit` under `counter`, without a position.
    pub fn new(unit: impl Into<String>, counter: u64) -> Self {
        FenceWrite {
            unit: unit.into(),
            counter,
            position: None,
        }
    }
}

impl StateWrite {
    /// Whether nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty()
            && self.deletes.is_empty()
            && self.fences.is_empty()
            && self.snapshot.is_none()
    }
}

/// Closing a snapshot with the complete-read cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseSnapshot {
    /// The snapshot id (the marker of its rows).
    pub id: i64,
    /// Delete rows the snapshot did not write (`resnapshot_deletes`, and for a mirror only when
    /// the destination held rows at the capture).
    pub delete_unseen: bool,
    /// Delete nothing when the snapshot wrote more than this many keys.
    pub max_keys: u64,
}

/// What closing a snapshot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Rows marked with the snapshot id.
    pub keys_written: u64,
    /// Rows deleted.
    pub deleted: u64,
    /// `true` when deletes were wanted but skipped because `keys_written > max_keys`.
    pub ceiling_hit: bool,
}

/// A database error, classified for retries (docs/errors.md §9.4).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DbError {
    /// What went wrong, with the table or file; never a password.
    pub message: String,
    /// `Transient`: connection loss, serialization failure, deadlock, too many connections,
    /// admin shutdown, SQLite busy/locked: retry the whole transaction. `Fenced`: a lease fence
    /// refused the transaction, a newer owner of the unit wrote (nothing of the transaction
    /// was applied), definite for this worker's unit. `Definite`: anything else.
    pub class: SinkErrorClass,
}

impl DbError {
    /// A definite error.
    pub fn fatal(message: impl Into<String>) -> Self {
        DbError {
            message: message.into(),
            class: SinkErrorClass::Definite,
        }
    }

    /// An error the whole transaction is retried after when `retryable`, else definite.
    pub fn retryable_if(retryable: bool, message: impl Into<String>) -> Self {
        DbError {
            message: message.into(),
            class: if retryable {
                SinkErrorClass::Transient
            } else {
                SinkErrorClass::Definite
            },
        }
    }

    /// Whether the whole transaction may be retried.
    pub fn is_retryable(&self) -> bool {
        self.class == SinkErrorClass::Transient
    }

    /// Whether a lease fence (or the shared snapshot record) refused the transaction.
    pub fn is_fenced(&self) -> bool {
        self.class == SinkErrorClass::Fenced
    }

    /// A transaction refused by the pipeline's shared snapshot record: `why` says how.
    pub fn snapshot_refused(where_: &str, pipeline: &str, why: &str) -> Self {
        DbError {
            message: format!(
                "{where_}: pipeline '{pipeline}': {why}; the batch was not written (a worker \
                 still reading the snapshot's segments after it closed stops them)"
            ),
            class: SinkErrorClass::Fenced,
        }
    }

    /// A transaction refused by the fence of `unit`: this worker holds `held`, a newer owner
    /// stored `stored`.
    pub fn fenced(where_: &str, pipeline: &str, unit: &str, held: u64, stored: i64) -> Self {
        DbError {
            message: format!(
                "{where_}: the lease of {unit} (pipeline '{pipeline}') was taken over: its fence \
                 holds counter {stored}, this worker's lease {held}; the batch was not written \
                 (if no other worker runs, the lease table was reset without `ddbpipe state \
                 reset`: run it to clear the fences)"
            ),
            class: SinkErrorClass::Fenced,
        }
    }
}

/// The table of lease fences beside the state table (docs/coordination.md §11.7 rule 4).
pub const FENCE_TABLE: &str = "_ddbpipe_fences";

/// Who holds a pipeline's lock, when it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// Where the lock is ("postgres advisory lock 12345 on host/db").
    pub location: String,
    /// The pid of the ddbpipe process holding it (PostgreSQL: recorded beside the advisory lock,
    /// not the server backend's pid), when known.
    pub pid: Option<u32>,
}

/// What taking a pipeline's run lock found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockAttempt {
    /// This handle holds the lock now (or held it already).
    Acquired,
    /// Another run holds it.
    HeldBy(LockHolder),
}
