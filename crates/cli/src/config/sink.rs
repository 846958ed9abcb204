//! The `sink:` and `state:` sections: where records go and where the position is kept.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ddbpipe_keyed::{DocumentType, PostgresDatabase};
use ddbpipe_source::config::{ConfigError, Mode, Secret, SourceConfig};
use serde_json::json;

use super::fields::Fields;
use super::schema::{Field, Shape, Variant, defaulted, of, optional, required};
use super::types::Choice;

/// `state.flush_interval_ms` when unset.
pub const DEFAULT_FLUSH_INTERVAL_MS: u64 = 1000;
/// `sink.fsync` when unset.
pub const DEFAULT_FSYNC: bool = true;
/// `sink.path` of the jsonl sink when unset: standard output.
pub const STDOUT_PATH: &str = "-";
/// `sink.schema` of the postgres sink when unset.
pub const DEFAULT_SCHEMA: &str = "public";
/// `sink.create_table` of the keyed sinks when unset.
pub const DEFAULT_CREATE_TABLE: bool = true;

/// `sink:`: a `type`, then the keys of that sink (docs/sinks.md §7).
pub(super) const SINK: Shape = Shape::Tagged {
    tag: &SINK_TYPE,
    variants: SINKS,
};

/// `sink.type`.
static SINK_TYPE: Field = required("type", of::<SinkType>(), "The kind of sink.");

/// The sinks and their keys.
static SINKS: &[Variant] = &[
    Variant {
        tag: "jsonl",
        description: "JSON Lines to stdout or to files (docs/sinks.md §7.1).",
        fields: JSONL,
    },
    Variant {
        tag: "sqlite",
        description: "A keyed table in a SQLite file, the position in the same database \
                      (docs/sinks.md §7.2).",
        fields: SQLITE,
    },
    Variant {
        tag: "postgres",
        description: "A keyed table in PostgreSQL, the position in the same database \
                      (docs/sinks.md §7.3).",
        fields: POSTGRES,
    },
    Variant {
        tag: "custom",
        description: "A sink given in code by the program that embeds ddbpipe \
                      (`Pipeline::with_sink`, docs/sinks.md §7.5); the position in the state \
                      file. `ddbpipe run` has none to give.",
        fields: &[],
    },
];

static JSONL: &[Field] = &[
    defaulted(
        "path",
        of::<String>(),
        || json!(STDOUT_PATH),
        "\"-\" for stdout, or a file; a relative path is relative to this file's directory.",
    ),
    optional(
        "rotate_bytes",
        of::<u64>(),
        "Start the next numbered file once one reaches this size, in bytes (at least 1048576; \
         write: append only).",
    ),
    defaulted(
        "fsync",
        of::<bool>(),
        || json!(DEFAULT_FSYNC),
        "Acknowledge a batch only after fdatasync.",
    ),
    defaulted(
        "write",
        of::<WriteMode>(),
        || json!(WriteMode::default().as_str()),
        "What a run does with an earlier run's file: append to it, overwrite it at completion, \
         or write a new timestamped file.",
    ),
    defaulted(
        "gzip",
        of::<bool>(),
        || json!(false),
        "Gzip-compress the file, one member per batch (write: overwrite or new_file_per_run).",
    ),
];

static SQLITE: &[Field] = &[
    required(
        "path",
        of::<String>(),
        "The database file, created when missing; a relative path is relative to this file's \
         directory.",
    ),
    TABLE,
    DOCUMENT_COLUMN,
    CREATE_TABLE,
];

static POSTGRES: &[Field] = &[
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
    CREATE_TABLE,
];

/// The keys both keyed sinks have.
const TABLE: Field = optional(
    "table",
    of::<String>(),
    "The destination table; unset: the DynamoDB table's name.",
);
const DOCUMENT_COLUMN: Field = defaulted(
    "document_column",
    of::<String>(),
    || json!(DEFAULT_DOCUMENT_COLUMN),
    "The column holding the item as JSON.",
);
const CREATE_TABLE: Field = defaulted(
    "create_table",
    of::<bool>(),
    || json!(DEFAULT_CREATE_TABLE),
    "Create the table when it does not exist.",
);

/// The keys of `state:`.
pub(super) static STATE: &[Field] = &[
    optional(
        "path",
        of::<String>(),
        "The state file (jsonl sink only); unset: <name>.state.json beside this file; a \
         relative path is relative to this file's directory.",
    ),
    defaulted(
        "flush_interval_ms",
        of::<u64>(),
        || json!(DEFAULT_FLUSH_INTERVAL_MS),
        "Least time between two writes of the state file while running, in milliseconds; 0: \
         after every batch.",
    ),
];
/// The smallest `sink.rotate_bytes`: 1 MiB.
pub const MIN_ROTATE_BYTES: u64 = 1_048_576;

/// Where the records of a run are written: the `sink:` section, `{type: <sink>, ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConfig {
    /// `type: jsonl`: one JSON object per line, to stdout or files (docs/sinks.md §7.1).
    Jsonl(JsonlConfig),
    /// `type: sqlite`: a keyed table in a SQLite file, the position in the same database
    /// (docs/sinks.md §7.2).
    Sqlite(SqliteConfig),
    /// `type: postgres`: a keyed table in PostgreSQL, the position in the same database
    /// (docs/sinks.md §7.3).
    Postgres(PostgresConfig),
    /// `type: custom`: a sink the embedding program gives in code, the position in the state
    /// file (docs/sinks.md §7.5).
    Custom,
}

impl SinkConfig {
    /// `"jsonl"`, `"sqlite"` or `"postgres"`.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Jsonl(_) => "jsonl",
            SinkConfig::Sqlite(_) => "sqlite",
            SinkConfig::Postgres(_) => "postgres",
            SinkConfig::Custom => "custom",
        }
    }

    /// The keyed part of a sqlite or postgres sink; `None` for jsonl and custom.
    pub fn keyed(&self) -> Option<&KeyedConfig> {
        match self {
            SinkConfig::Jsonl(_) | SinkConfig::Custom => None,
            SinkConfig::Sqlite(sqlite) => Some(&sqlite.keyed),
            SinkConfig::Postgres(postgres) => Some(&postgres.keyed),
        }
    }
}

/// What the sqlite and postgres sinks share: the destination table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedConfig {
    /// The destination table; default: the DynamoDB table name.
    pub table: Option<String>,
    /// The column holding the item JSON (per `value_format`). Default `document`.
    pub document_column: String,
    /// Create the table when it does not exist. Default true.
    pub create_table: bool,
}

/// The `sqlite` sink: `{type: sqlite, path: <file>, table: <name>?, document_column:
/// "document", create_table: true}`.
///
/// One table per source table: a column per key attribute (`S` → TEXT, `N` → TEXT with the
/// exact number, `B` → BLOB), the document column, `_ddbpipe_snapshot`, `_ddbpipe_updated_at`
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
/// <name>?, document_column: "document", create_table: true}`.
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

/// The `jsonl` sink: `{type: jsonl, path: "-" | <file>, rotate_bytes: <bytes>, fsync: true,
/// write: append | overwrite | new_file_per_run, gzip: false}`.
///
/// Lines are UTF-8 JSON objects with sorted keys, each ending in `\n`. With `write: append` a
/// file is opened for appending, never truncated; a partial last line left by a crash is cut
/// off first. The jsonl sink cannot delete rows, so `on_gap: resnapshot` needs
/// `resnapshot_deletes: false`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlConfig {
    /// Where lines go: `"-"` (the default) for stdout, or a file path. A relative path is
    /// relative to the directory of the pipeline file. Logs and progress always go to stderr.
    pub path: JsonlTarget,
    /// Start a new file once the current one has reached this size, in bytes; at least
    /// 1048576 (1 MiB), and only with a file `path`. Files are then `<stem>.000001<ext>`,
    /// `<stem>.000002<ext>`, … next to `path`; a batch is never split across files. Unset: one
    /// file.
    pub rotate_bytes: Option<u64>,
    /// Acknowledge a batch only after `fdatasync`, so a crash cannot lose a line whose position
    /// was saved. Default true.
    pub fsync: bool,
    /// What a run does with the file of an earlier run (docs/sinks.md §7.1). Named `write`
    /// because `mode` is the source's (`source.mode: scan`). Default `append`.
    pub write: WriteMode,
    /// Write the lines gzip-compressed, one gzip member per batch. Only with `write:
    /// overwrite` or `new_file_per_run`, and without `rotate_bytes`. Default false.
    pub gzip: bool,
}

/// `sink.write` of the jsonl sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// `append`: lines are added after those of earlier runs (a rerun of a scan adds the
    /// table again).
    #[default]
    Append,
    /// `overwrite`: a scan or query writes a temporary file beside `path` and renames it over
    /// `path` when it completes; an interrupted run leaves `path` as it was. Scan and query
    /// only.
    Overwrite,
    /// `new_file_per_run`: each run writes `<stem>.<YYYYMMDDTHHMMSSZ><ext>` beside `path`
    /// (UTC); a scan or query renames its temporary file to that name when it completes.
    NewFilePerRun,
}

impl WriteMode {
    /// The name in the config file.
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteMode::Append => "append",
            WriteMode::Overwrite => "overwrite",
            WriteMode::NewFilePerRun => "new_file_per_run",
        }
    }
}

impl Choice for WriteMode {
    fn all() -> &'static [Self] {
        &[
            WriteMode::Append,
            WriteMode::Overwrite,
            WriteMode::NewFilePerRun,
        ]
    }
    fn name(self) -> &'static str {
        self.as_str()
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "truncate" | "replace")
            .then_some("a run that replaces the file is `write: overwrite`")
    }
}

/// The target of the jsonl sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonlTarget {
    /// `"-"`: standard output.
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// Where the position of a pipeline with a `jsonl` sink is kept: the `state:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The state file. Default `<directory of the config file>/<name>.state.json`; a relative
    /// path given here is relative to that directory too. One file may hold several pipelines.
    pub path: PathBuf,
    /// The least time between two writes of the state file while running, in milliseconds; 0
    /// writes after every acknowledged batch. The file is always written at the end of a run,
    /// on a signal and after a failure. Default 1000.
    pub flush_interval_ms: u64,
    /// Whether `path` was set in the file (an error with a keyed sink).
    pub path_set: bool,
}

/// The `type` of `sink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkType {
    Jsonl,
    Sqlite,
    Postgres,
    Custom,
}

impl Choice for SinkType {
    fn all() -> &'static [Self] {
        &[
            SinkType::Jsonl,
            SinkType::Sqlite,
            SinkType::Postgres,
            SinkType::Custom,
        ]
    }
    fn name(self) -> &'static str {
        match self {
            SinkType::Jsonl => "jsonl",
            SinkType::Sqlite => "sqlite",
            SinkType::Postgres => "postgres",
            SinkType::Custom => "custom",
        }
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "postgresql" | "pg").then_some("the PostgreSQL sink is `type: postgres`")
    }
}

impl Choice for DocumentType {
    fn all() -> &'static [Self] {
        &[DocumentType::Jsonb, DocumentType::Json, DocumentType::Text]
    }
    fn name(self) -> &'static str {
        DocumentType::name(self)
    }
}

/// The default `document_column`.
pub const DEFAULT_DOCUMENT_COLUMN: &str = "document";

/// Reads the sink section; also returns the keys it set. An unknown `type` stops here: the
/// other keys cannot be judged without it.
pub(super) fn read_sink(mut f: Fields<'_>) -> Option<(SinkConfig, BTreeSet<String>)> {
    let kind = f.required::<SinkType>("type")?;
    f.select(kind.name());
    let sink = match kind {
        SinkType::Jsonl => SinkConfig::Jsonl(read_jsonl(&mut f)),
        SinkType::Sqlite => {
            let path = f.required::<String>("path").map(PathBuf::from);
            let keyed = read_keyed(&mut f);
            SinkConfig::Sqlite(SqliteConfig {
                path: path.unwrap_or_default(),
                keyed,
            })
        }
        SinkType::Postgres => {
            let url = f.required::<Secret>("url");
            let schema = f.or("schema", DEFAULT_SCHEMA.to_string());
            let document_type = f.or("document_type", DocumentType::default());
            let keyed = read_keyed(&mut f);
            SinkConfig::Postgres(PostgresConfig {
                url: url.unwrap_or_else(|| Secret::new("")),
                schema,
                document_type,
                keyed,
                environment: Vec::new(),
            })
        }
        SinkType::Custom => SinkConfig::Custom,
    };
    Some((sink, f.finish()))
}

fn read_keyed(f: &mut Fields<'_>) -> KeyedConfig {
    KeyedConfig {
        table: f.get("table"),
        document_column: f.or("document_column", DEFAULT_DOCUMENT_COLUMN.to_string()),
        create_table: f.or("create_table", DEFAULT_CREATE_TABLE),
    }
}

fn read_jsonl(f: &mut Fields<'_>) -> JsonlConfig {
    let path = match f.get::<String>("path") {
        Some(path) if path == STDOUT_PATH => JsonlTarget::Stdout,
        Some(path) => JsonlTarget::File(PathBuf::from(path)),
        None => JsonlTarget::Stdout,
    };
    JsonlConfig {
        path,
        rotate_bytes: f.get("rotate_bytes"),
        fsync: f.or("fsync", DEFAULT_FSYNC),
        write: f.or("write", WriteMode::default()),
        gzip: f.or("gzip", false),
    }
}

/// Reads the state section, if any. `default_path` is where the file goes without `path`.
pub(super) fn read_state(f: Option<Fields<'_>>, default_path: PathBuf) -> StateConfig {
    let mut state = StateConfig {
        path: default_path,
        flush_interval_ms: DEFAULT_FLUSH_INTERVAL_MS,
        path_set: false,
    };
    if let Some(mut f) = f {
        if let Some(path) = f.get::<String>("path") {
            state.path = PathBuf::from(path);
            state.path_set = true;
        }
        state.flush_interval_ms = f.or("flush_interval_ms", state.flush_interval_ms);
        f.finish();
    }
    state
}

/// Makes the relative file paths of the sink and the state relative to `config_dir`, the
/// directory of the pipeline file, so a run from cron or another directory reads and writes
/// the same files as one from beside the config. Empty paths stay empty (validation names
/// them).
pub(super) fn anchor_paths(config_dir: &Path, sink: &mut SinkConfig, state: &mut StateConfig) {
    let anchor = |path: &mut PathBuf| {
        if !path.as_os_str().is_empty() && path.is_relative() {
            *path = config_dir.join(&*path);
        }
    };
    match sink {
        SinkConfig::Jsonl(JsonlConfig {
            path: JsonlTarget::File(path),
            ..
        })
        | SinkConfig::Sqlite(SqliteConfig { path, .. }) => anchor(path),
        SinkConfig::Jsonl(_) | SinkConfig::Postgres(_) | SinkConfig::Custom => {}
    }
    // The default state path is built in `config_dir` already.
    if state.path_set {
        anchor(&mut state.path);
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

/// The default state file of pipeline `name` whose config file is in `config_dir`.
pub(super) fn default_state_path(config_dir: &Path, name: &str) -> PathBuf {
    config_dir.join(format!("{name}.state.json"))
}

/// The sink and state rules of docs/config.md §1.3 rule 12 (docs/state.md §6.1, docs/sinks.md §7.1).
pub(super) fn validate(sink: &SinkConfig, state: &StateConfig, errors: &mut Vec<ConfigError>) {
    let jsonl = match sink {
        SinkConfig::Jsonl(jsonl) => jsonl,
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            validate_keyed(sink, state, errors);
            return;
        }
        SinkConfig::Custom => return,
    };
    if let JsonlTarget::File(path) = &jsonl.path
        && path.as_os_str().is_empty()
    {
        errors.push(ConfigError::new(
            "sink.path",
            "path must not be empty: use \"-\" for stdout or a file path",
        ));
    }
    if let Some(bytes) = jsonl.rotate_bytes {
        if bytes < MIN_ROTATE_BYTES {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                format!("rotate_bytes must be at least {MIN_ROTATE_BYTES} (got {bytes})"),
            ));
        }
        if jsonl.path == JsonlTarget::Stdout {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                "rotate_bytes needs a file path: stdout cannot be rotated",
            ));
        }
        if jsonl.write != WriteMode::Append {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                format!(
                    "rotate_bytes needs write: append (got write: {}): rotated files are \
                     continued, never replaced",
                    jsonl.write.name()
                ),
            ));
        }
        if jsonl.gzip {
            errors.push(ConfigError::new(
                "sink.rotate_bytes",
                "rotate_bytes cannot be combined with gzip: true",
            ));
        }
    }
    if jsonl.write != WriteMode::Append && jsonl.path == JsonlTarget::Stdout {
        errors.push(ConfigError::new(
            "sink.write",
            format!(
                "write: {} needs a file path: stdout cannot be replaced or renamed",
                jsonl.write.name()
            ),
        ));
    }
    if jsonl.gzip && jsonl.write == WriteMode::Append {
        errors.push(ConfigError::new(
            "sink.gzip",
            "gzip: true needs write: overwrite or write: new_file_per_run: a gzip file is \
             written whole by one run, never appended to by the next",
        ));
    }
    if state.path.as_os_str().is_empty() {
        errors.push(ConfigError::new("state.path", "path must not be empty"));
    }
}

/// The sqlite and postgres rules: a target, a usable table and document column, and no state
/// file (the position lives in the database).
fn validate_keyed(sink: &SinkConfig, state: &StateConfig, errors: &mut Vec<ConfigError>) {
    let kind = sink.kind();
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
            .is_some_and(|t| t.starts_with("_ddbpipe_"))
        {
            errors.push(ConfigError::new(
                "sink.table",
                "names starting with _ddbpipe_ are reserved for ddbpipe's own tables",
            ));
        }
        if keyed.document_column.trim().is_empty() {
            errors.push(ConfigError::new(
                "sink.document_column",
                "document_column must not be empty",
            ));
        } else if keyed.document_column.starts_with("_ddbpipe_") {
            errors.push(ConfigError::new(
                "sink.document_column",
                "names starting with _ddbpipe_ are reserved for ddbpipe's own columns",
            ));
        }
    }
    if state.path_set {
        errors.push(ConfigError::new(
            "state.path",
            format!("the {kind} sink keeps the position in its database; remove state.path"),
        ));
    }
}
