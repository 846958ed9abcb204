//! The sqlite and postgres sinks' sections (docs/sinks.md §7.2, §7.3): the destination table
//! both have, the SQLite file, the PostgreSQL connection.

use std::path::PathBuf;

use ddbpipe_keyed::{DocumentType, OnMismatch, PostgresDatabase};
use ddbpipe_source::config::{ConfigError, Mode, Secret, SourceConfig};
use serde_json::json;

use super::super::SinkConfig;
use super::columns::{
    self, COLUMNS, ColumnConfig, DOCUMENT_COLUMN, Dialect, ON_TYPE_MISMATCH, RESERVED_PREFIX,
};
use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, defaulted, of, optional, required};
use crate::yaml::types::Choice;

/// `sink.schema` of the postgres sink when unset.
pub const DEFAULT_SCHEMA: &str = "public";
/// `sink.create_table` of the keyed sinks when unset.
pub const DEFAULT_CREATE_TABLE: bool = true;

/// The keys of the sqlite sink.
pub(crate) static SQLITE: &[Field] = &[
    required(
        "path",
        of::<String>(),
        "The database file, created when missing; a relative path is relative to this file's \
         directory.",
    ),
    TABLE,
    DOCUMENT_COLUMN,
    COLUMNS,
    ON_TYPE_MISMATCH,
    CREATE_TABLE,
];

/// The keys of the postgres sink.
pub(crate) static POSTGRES: &[Field] = &[
    required(
        "url",
        of::<Secret>(),
        "A postgres:// URL or a libpq key=value string; PG* variables fill in what it does not \
         name. The password is never printed.",
    ),
    defaulted(
        "schema",
        of::<String>(),
        || json!(DEFAULT_SCHEMA),
        "The schema of the table and of _ddbpipe_state.",
    ),
    defaulted(
        "document_type",
        of::<DocumentType>(),
        || json!(DocumentType::default().name()),
        "The type of the document column: jsonb, json (the exact text) or text.",
    ),
    TABLE,
    DOCUMENT_COLUMN,
    COLUMNS,
    ON_TYPE_MISMATCH,
    CREATE_TABLE,
];

/// The keys both keyed sinks have.
const TABLE: Field = optional(
    "table",
    of::<String>(),
    "The destination table; unset: the DynamoDB table's name.",
);
const CREATE_TABLE: Field = defaulted(
    "create_table",
    of::<bool>(),
    || json!(DEFAULT_CREATE_TABLE),
    "Create the table when it does not exist.",
);

/// What the sqlite and postgres sinks share: the destination table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedConfig {
    /// The destination table; default: the DynamoDB table name.
    pub table: Option<String>,
    /// The column holding the item JSON (per `value_format`). Default `document`; `None`
    /// (`document_column: null`): no document column, only the key and the typed columns
    /// are stored.
    pub document_column: Option<String>,
    /// The typed columns beside the key and the document (docs/sinks.md §7.9).
    pub columns: Vec<ColumnConfig>,
    /// What a value that does not fit its column's type does. Default `null`.
    pub on_type_mismatch: OnMismatch,
    /// Create the table when it does not exist. Default true.
    pub create_table: bool,
}

/// The `sqlite` sink: `{type: sqlite, path: <file>, table: <name>?, document_column:
/// "document", columns: [], on_type_mismatch: null, create_table: true}`.
///
/// One table per source table: a column per key attribute (`S` → TEXT, `N` → TEXT with the
/// exact number, `B` → BLOB), the document column (unless `null`), the typed columns,
/// `_ddbpipe_snapshot`, `_ddbpipe_updated_at`
/// and the row's version (`_ddbpipe_version_ms`, `_ddbpipe_version_seq`, docs/mirror.md §5.6).
/// Items and `c`/`u`/`r` envelopes are upserts, `d` deletes. Each batch is one transaction
/// together with the position (table `_ddbpipe_state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// The database file, created when missing. A relative path is relative to the directory
    /// of the pipeline file, wherever ddbpipe runs from.
    pub path: PathBuf,
    /// The destination table.
    pub keyed: KeyedConfig,
}

/// The `postgres` sink: `{type: postgres, url: <connection string>, schema: "public", table:
/// <name>?, document_column: "document", columns: [], on_type_mismatch: null, create_table:
/// true}`.
///
/// As sqlite, with `text`, `numeric` (exact) and `bytea` key columns and a `jsonb` (or `json`,
/// `text`) document; `sslmode` in the URL is honoured (`disable`, `prefer`, `require`). The
/// password never appears in output (`***`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// A `postgres://user:password@host:port/db?sslmode=…` URL or a libpq key=value string.
    pub url: Secret,
    /// The schema of the table and of `_ddbpipe_state`. Default `public`.
    pub schema: String,
    /// The type of the document column: `jsonb` (the default; cannot hold U+0000 in a string,
    /// such an item fails the run naming its key and attribute), `json` (the document text
    /// exactly, `\u0000` included) or `text`. An existing table must have this type.
    pub document_type: DocumentType,
    /// The destination table.
    pub keyed: KeyedConfig,
    /// The libpq environment variables that were set when the file was loaded (`PGPASSWORD`,
    /// `PGHOST`, `PGUSER`, `PGDATABASE`, `PGSSLMODE`, …), as the parameters they set: defaults
    /// for what `url` does not name, as libpq applies them.
    pub environment: Vec<(&'static str, Secret)>,
}

impl Choice for DocumentType {
    fn all() -> &'static [Self] {
        &[DocumentType::Jsonb, DocumentType::Json, DocumentType::Text]
    }
    fn name(self) -> &'static str {
        DocumentType::name(self)
    }
}

/// Reads the sqlite sink's keys.
pub(crate) fn read_sqlite(f: &mut Fields<'_>) -> SqliteConfig {
    let path = f.required::<String>("path").map(PathBuf::from);
    let keyed = read_keyed(f);
    SqliteConfig {
        path: path.unwrap_or_default(),
        keyed,
    }
}

/// Reads the postgres sink's keys.
pub(crate) fn read_postgres(f: &mut Fields<'_>) -> PostgresConfig {
    let url = f.required::<Secret>("url");
    let schema = f.or("schema", DEFAULT_SCHEMA.to_string());
    let document_type = f.or("document_type", DocumentType::default());
    let keyed = read_keyed(f);
    PostgresConfig {
        url: url.unwrap_or_else(|| Secret::new("")),
        schema,
        document_type,
        keyed,
        environment: Vec::new(),
    }
}

fn read_keyed(f: &mut Fields<'_>) -> KeyedConfig {
    let table = f.get("table");
    let (document_column, columns, on_type_mismatch) = columns::read(f);
    KeyedConfig {
        table,
        document_column,
        columns,
        on_type_mismatch,
        create_table: f.or("create_table", DEFAULT_CREATE_TABLE),
    }
}

/// A scan or query into a keyed sink upserts what it reads and deletes nothing: rows of items
/// deleted from the table since an earlier run stay. Said once, by `check` and at the start
/// and end of a run.
pub fn stale_rows_warning(source: &SourceConfig, sink: &SinkConfig) -> Option<String> {
    let keyed = matches!(sink, SinkConfig::Sqlite(_) | SinkConfig::Postgres(_));
    (keyed && matches!(source.mode, Mode::Scan | Mode::Query)).then(|| {
        format!(
            "mode: {} into the {} sink upserts the items it reads and deletes no row: rows of \
             items deleted from the table stay; use mode: mirror to keep an equal copy",
            source.mode,
            sink.kind()
        )
    })
}

/// The sqlite and postgres rules: a target, a usable table and document column, and no state
/// file (the position lives in the database).
pub(crate) fn validate(sink: &SinkConfig, errors: &mut Vec<ConfigError>) {
    match sink {
        SinkConfig::Sqlite(sqlite) if sqlite.path.as_os_str().is_empty() => {
            errors.push(ConfigError::new("sink.path", "path must not be empty"));
        }
        SinkConfig::Postgres(postgres) if postgres.url.expose().trim().is_empty() => {
            errors.push(ConfigError::new("sink.url", "url must not be empty"));
        }
        SinkConfig::Postgres(postgres)
            if let Err(problem) = PostgresDatabase::check_url(postgres.url.expose()) =>
        {
            // The problem names a key or a position, never a value.
            errors.push(ConfigError::new("sink.url", problem));
        }
        SinkConfig::Postgres(postgres) if postgres.schema.trim().is_empty() => {
            errors.push(ConfigError::new("sink.schema", "schema must not be empty"));
        }
        _ => {}
    }
    if let Some(keyed) = sink.keyed() {
        if keyed.table.as_deref().is_some_and(|t| t.trim().is_empty()) {
            errors.push(ConfigError::new("sink.table", "table must not be empty"));
        }
        if keyed
            .table
            .as_deref()
            .is_some_and(|t| t.starts_with(RESERVED_PREFIX))
        {
            errors.push(ConfigError::new(
                "sink.table",
                "names starting with _ddbpipe_ are reserved for ddbpipe's own tables",
            ));
        }
        let document_column = keyed.document_column.as_deref();
        if document_column.is_some_and(|column| column.trim().is_empty()) {
            errors.push(ConfigError::new(
                "sink.document_column",
                "document_column must not be empty (null stores no document)",
            ));
        } else if document_column.is_some_and(|column| column.starts_with(RESERVED_PREFIX)) {
            errors.push(ConfigError::new(
                "sink.document_column",
                "names starting with _ddbpipe_ are reserved for ddbpipe's own columns",
            ));
        }
        let dialect = match sink {
            SinkConfig::Postgres(_) => Dialect::Postgres,
            _ => Dialect::Sqlite,
        };
        columns::validate(dialect, document_column, &keyed.columns, errors);
    }
}
