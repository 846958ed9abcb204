//! Where a run's records and position go: the jsonl sink with its state file, or a keyed sink
//! (sqlite, postgres) whose database also holds the position (docs/state.md §6.1, docs/sinks.md §7).

use std::path::Path;

use anyhow::anyhow;
use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::state::DatabaseStore;
use ddbpipe_keyed::{
    Database, DocumentType, KeyColumn, LockAttempt, PostgresDatabase, SqliteDatabase, TableSpec,
};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::CleanupPolicy;
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;
use ddbpipe_pipeline::files;
use ddbpipe_pipeline::sink::{Fencing, Records, RunStart, Sink, SinkError, Staged, Versioned};
use ddbpipe_pipeline::sinks::jsonl::{self, JsonlSettings, JsonlSink};
use ddbpipe_pipeline::state::identity::{FileCompression, FileWrite, Output};
use ddbpipe_pipeline::state::{StateFile, StateLock};
use ddbpipe_source::api::TableDescription;

use crate::config::{
    JsonlConfig, JsonlTarget, KeyedConfig, PipelineConfig, PostgresConfig, SinkConfig, WriteMode,
};
use crate::failure::{Failure, state_failure};
use crate::given::Given;
use crate::sink::{CustomSink, GivenSink};

/// The sink a pipeline's config chose.
pub enum AnySink {
    /// JSON lines to stdout or files.
    Jsonl(JsonlSink),
    /// A SQLite or PostgreSQL table.
    Keyed(KeyedSink),
    /// The sink the embedding program gave (`type: custom`).
    Custom(CustomSink),
}

/// Why a `type: custom` pipeline without a sink given in code cannot run (`run` and `check`).
pub const NO_CUSTOM_SINK: &str = "sink.type: custom is a sink given in code by the program \
     that embeds ddbpipe (Pipeline::with_sink); this run has none: set sink.type to jsonl, \
     sqlite or postgres";

/// The failure of a `type: custom` pipeline run without a sink given in code (exit 2).
pub fn no_custom_sink() -> Failure {
    Failure::usage(anyhow!("config error: {NO_CUSTOM_SINK}"))
}

impl Sink for AnySink {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.write(batch, state).await,
            AnySink::Keyed(sink) => sink.write(batch, state).await,
            AnySink::Custom(sink) => sink.write(batch, state).await,
        }
    }

    async fn start(&mut self, start: RunStart) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.start(start).await,
            AnySink::Keyed(sink) => sink.start(start).await,
            AnySink::Custom(sink) => sink.start(start).await,
        }
    }

    async fn complete(&mut self) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.complete().await,
            AnySink::Keyed(sink) => sink.complete().await,
            AnySink::Custom(sink) => sink.complete().await,
        }
    }

    fn describe(&self) -> String {
        match self {
            AnySink::Jsonl(sink) => sink.describe(),
            AnySink::Keyed(sink) => sink.describe(),
            AnySink::Custom(sink) => sink.describe(),
        }
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        match self {
            AnySink::Keyed(sink) => sink.fencing(),
            AnySink::Jsonl(_) | AnySink::Custom(_) => None,
        }
    }

    fn versioned(&self) -> Option<&impl Versioned> {
        match self {
            AnySink::Keyed(sink) => sink.versioned(),
            AnySink::Jsonl(_) | AnySink::Custom(_) => None,
        }
    }
}

/// The sink of a run, where its position lives, and the run's lock.
pub struct Destination {
    /// The sink.
    pub sink: AnySink,
    /// The position store.
    pub store: Box<dyn CheckpointStore>,
    /// What to delete when a snapshot completes.
    pub cleanup: CleanupPolicy,
    // The state file's lock (a keyed sink's lock lives in its database handle).
    _lock: Option<StateLock>,
}

/// Opens the sink and the position store of a run and takes the pipeline's lock. A keyed
/// sink's table is created (or checked) from the described key schema.
pub async fn open(
    config: &PipelineConfig,
    config_path: &Path,
    table: Option<&TableDescription>,
    records: Records,
    given: &Given,
) -> Result<Destination, Failure> {
    distinct_paths(config, config_path)?;
    let source = &config.source;
    let cleanup = CleanupPolicy {
        deletes: source.resnapshot_deletes,
        max_keys: source.resnapshot_max_keys as u64,
    };
    // Apart from a keyed sink, the pipeline's lock first: a second run is refused as the
    // pipeline's before its sink's own output lock could answer. A store given in code is
    // the program's: no state file, no lock (docs/state.md §6.7).
    let file = StateFile::new(&config.state.path);
    let lock = match (config.sink.keyed(), &given.store) {
        (None, None) => Some(
            file.lock(&config.name)
                .map_err(|e| state_failure(e, config_path))?,
        ),
        _ => None,
    };
    let sink = match &config.sink {
        SinkConfig::Jsonl(jsonl) => AnySink::Jsonl(
            JsonlSink::open(jsonl_settings(jsonl, records), &config.name)
                .map_err(Failure::runtime)?,
        ),
        SinkConfig::Custom => AnySink::Custom(
            given
                .sink
                .as_ref()
                .ok_or_else(no_custom_sink)?
                .for_run(records),
        ),
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let (_, sink) = keyed_sink(config, table, records, true).await?;
            return Ok(Destination {
                store: Box::new(sink.state_store()),
                sink: AnySink::Keyed(sink),
                cleanup,
                _lock: None,
            });
        }
    };
    let store: Box<dyn CheckpointStore> = match &given.store {
        Some(store) => Box::new(store.clone()),
        None => Box::new(file),
    };
    Ok(Destination {
        sink,
        store,
        cleanup,
        _lock: lock,
    })
}

/// Deletes the pipeline's state and lease fences in its database (`state reset`); whether
/// anything was there.
pub async fn reset_database_state(db: &Database, pipeline: &str) -> Result<bool, Failure> {
    db.reset_state(pipeline)
        .await
        .map_err(|e| Failure::runtime(anyhow!("{}: {}", db.describe(), e.message)))
}

/// The keyed sink of `config`, prepared (its table created or checked), and its database.
/// With `lock`, the pipeline's run lock is taken first; the workers of a shared run take none
/// (their lease fences keep them apart, docs/coordination.md §11.10).
pub async fn keyed_sink(
    config: &PipelineConfig,
    table: Option<&TableDescription>,
    records: Records,
    lock_run: bool,
) -> Result<(Database, KeyedSink), Failure> {
    let source = &config.source;
    let Some(table) = table else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a keyed sink needs the table's key schema"
        )));
    };
    let spec = table_spec(config, Some(table))?;
    let db = connect(config)
        .await?
        .ok_or_else(|| Failure::runtime(anyhow!("the sink database could not be opened")))?;
    if lock_run {
        lock(&db, &config.name).await?;
    }
    let retry = source.retry.policy();
    let sink = KeyedSink::new(
        db.clone(),
        spec.clone(),
        source.value_format,
        records,
        SinkRetry {
            max_retries: retry.max_retries,
            initial_backoff: retry.initial_backoff,
            max_backoff: retry.max_backoff,
        },
    );
    sink.prepare().await.map_err(Failure::runtime)?;
    Ok((db, sink))
}

/// The settings of a jsonl sink. `records` says whether the run can complete (items: scan,
/// query) or never does (envelopes: streams, mirror), which decides when a
/// `new_file_per_run` file gets its name.
pub fn jsonl_settings(jsonl: &JsonlConfig, records: Records) -> JsonlSettings {
    JsonlSettings {
        target: match &jsonl.path {
            JsonlTarget::Stdout => jsonl::JsonlTarget::Stdout,
            JsonlTarget::File(path) => jsonl::JsonlTarget::File(path.clone()),
        },
        rotate_bytes: jsonl.rotate_bytes,
        fsync: jsonl.fsync,
        write: match jsonl.write {
            WriteMode::Append => jsonl::WriteMode::Append,
            WriteMode::Overwrite => jsonl::WriteMode::Overwrite,
            WriteMode::NewFilePerRun => jsonl::WriteMode::NewFilePerRun(match records {
                Records::Items => jsonl::Publish::OnCompletion,
                Records::Envelopes => jsonl::Publish::Immediately,
            }),
        },
        compression: if jsonl.gzip {
            jsonl::Compression::Gzip
        } else {
            jsonl::Compression::None
        },
    }
}

/// The files a run writes must differ from each other and from the config file, compared
/// where they lead (symlinks followed, relative paths made absolute):
/// 1. A jsonl `sink.path` that is `state.path`: the lines and the state would overwrite each
///    other.
/// 2. A `sink.path` (jsonl or sqlite) or `state.path` that is the config file: the run would
///    write into its own config.
///
/// `run` checks this before it writes anything, and `check` fails with the same message.
pub fn distinct_paths(config: &PipelineConfig, config_path: &Path) -> Result<(), Failure> {
    let config_file = files::resolve(config_path);
    let sink_path = match &config.sink {
        SinkConfig::Jsonl(jsonl) => match &jsonl.path {
            JsonlTarget::File(path) => Some(path),
            JsonlTarget::Stdout => None,
        },
        SinkConfig::Sqlite(sqlite) => Some(&sqlite.path),
        SinkConfig::Postgres(_) | SinkConfig::Custom => None,
    };
    let state_path = config.sink.keyed().is_none().then_some(&config.state.path);
    if let Some(sink) = sink_path {
        let resolved = files::resolve(sink);
        if resolved == config_file {
            return Err(Failure::usage(anyhow!(
                "config error: sink.path: {} is the config file {} itself; choose another sink.path",
                sink.display(),
                config_path.display()
            )));
        }
        if let Some(state) = state_path
            && files::resolve(state) == resolved
        {
            return Err(Failure::usage(anyhow!(
                "config error: sink.path: {} is also the state file (state.path {}); the lines \
                 and the state would overwrite each other: choose another sink.path or state.path",
                sink.display(),
                state.display()
            )));
        }
    }
    if let Some(state) = state_path
        && files::resolve(state) == config_file
    {
        return Err(Failure::usage(anyhow!(
            "config error: state.path: {} is the config file {} itself; choose another state.path",
            state.display(),
            config_path.display()
        )));
    }
    Ok(())
}

/// Takes the pipeline's run lock in a sink database; another run holding it is a failure
/// naming where and which process.
pub async fn lock(db: &Database, pipeline: &str) -> Result<(), Failure> {
    match db.lock(pipeline).await {
        Ok(LockAttempt::Acquired) => Ok(()),
        Ok(LockAttempt::HeldBy(holder)) => {
            let pid = holder.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
            Err(Failure::runtime(anyhow!(
                "pipeline '{pipeline}' is already running (lock {}{pid})",
                holder.location
            ))
            .hint("wait for the other run to finish, or stop it (SIGTERM drains it)"))
        }
        Err(error) => Err(sink_failure(db, error.message)),
    }
}

/// The position store for reading (`state`, `lag`, `check`): creates nothing and takes no
/// lock. `None` when a sqlite sink's database does not exist yet.
pub async fn read_store(
    config: &PipelineConfig,
) -> Result<Option<Box<dyn CheckpointStore>>, Failure> {
    match &config.sink {
        SinkConfig::Jsonl(_) | SinkConfig::Custom => {
            Ok(Some(Box::new(StateFile::new(&config.state.path))))
        }
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let spec = table_spec(config, None)?;
            Ok(open_existing(config)
                .await?
                .map(|db| Box::new(DatabaseStore::new(db, spec)) as Box<dyn CheckpointStore>))
        }
    }
}

/// Where the position of a pipeline is saved, for messages.
pub fn position_label(config: &PipelineConfig) -> String {
    match &config.sink {
        SinkConfig::Jsonl(_) | SinkConfig::Custom => config.state.path.display().to_string(),
        SinkConfig::Sqlite(sqlite) => format!("sqlite {}", sqlite.path.display()),
        SinkConfig::Postgres(postgres) => format!(
            "postgres {} (schema {})",
            PostgresDatabase::redact(postgres.url.expose()),
            postgres.schema
        ),
    }
}

/// Opens (creating a sqlite file when missing) or connects to a keyed sink's database.
pub async fn connect(config: &PipelineConfig) -> Result<Option<Database>, Failure> {
    match &config.sink {
        SinkConfig::Jsonl(_) | SinkConfig::Custom => Ok(None),
        SinkConfig::Sqlite(sqlite) => {
            if let Some(dir) = sqlite.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Failure::runtime(anyhow!(
                        "sink sqlite {}: cannot create the directory {}: {e}",
                        sqlite.path.display(),
                        dir.display()
                    ))
                })?;
            }
            SqliteDatabase::open(&sqlite.path)
                .map(|db| Some(Database::from(db)))
                .map_err(|e| db_failure("sqlite", &sqlite.path.display().to_string(), e.message))
        }
        SinkConfig::Postgres(postgres) => {
            let defaults = libpq_defaults(postgres);
            PostgresDatabase::connect_with(postgres.url.expose(), &defaults)
                .await
                .map(|db| Some(Database::from(db.with_schema(&postgres.schema))))
                .map_err(|e| {
                    db_failure(
                        "postgres",
                        &PostgresDatabase::redact(postgres.url.expose()),
                        e.message,
                    )
                })
        }
    }
}

/// Opens a keyed sink's database without creating anything; `None` for a missing sqlite file
/// or a jsonl sink.
pub async fn open_existing(config: &PipelineConfig) -> Result<Option<Database>, Failure> {
    match &config.sink {
        SinkConfig::Sqlite(sqlite) => SqliteDatabase::open_existing(&sqlite.path)
            .map(|db| db.map(Database::from))
            .map_err(|e| db_failure("sqlite", &sqlite.path.display().to_string(), e.message)),
        _ => connect(config).await,
    }
}

/// The libpq environment variables set when the file was loaded, as connection defaults.
fn libpq_defaults(postgres: &PostgresConfig) -> Vec<(&'static str, String)> {
    postgres
        .environment
        .iter()
        .map(|(parameter, value)| (*parameter, value.expose().to_string()))
        .collect()
}

fn db_failure(kind: &str, target: &str, message: String) -> Failure {
    Failure::runtime(anyhow!("sink {kind} {target}: {message}"))
}

fn sink_failure(db: &Database, message: String) -> Failure {
    Failure::runtime(anyhow!("sink {}: {message}", db.describe()))
}

/// The destination table of a keyed sink: its name (`sink.table`, else the DynamoDB table
/// name) and, when the table was described, its key columns. Key attributes that collide
/// with the document column or ddbpipe's reserved names, and a projection that leaves out a
/// key attribute, are config errors (exit 2).
pub fn table_spec(
    config: &PipelineConfig,
    table: Option<&TableDescription>,
) -> Result<TableSpec, Failure> {
    let (keyed, schema, document_type) = match &config.sink {
        SinkConfig::Sqlite(sqlite) => (&sqlite.keyed, "main".to_string(), DocumentType::Jsonb),
        SinkConfig::Postgres(postgres) => (
            &postgres.keyed,
            postgres.schema.clone(),
            postgres.document_type,
        ),
        SinkConfig::Jsonl(_) | SinkConfig::Custom => {
            return Err(Failure::runtime(anyhow!(
                "internal error: the {} sink has no table",
                config.sink.kind()
            )));
        }
    };
    let kind = config.sink.kind();
    let source = &config.source;
    let name = destination_table(config, keyed);
    let mut key = Vec::new();
    for attribute in table.map(|t| t.key_schema.as_slice()).unwrap_or_default() {
        if attribute.name == keyed.document_column {
            return Err(Failure::usage(anyhow!(
                "config error: sink.document_column: key attribute '{}' of table '{}' has the same name as the document column; choose another document_column",
                attribute.name,
                source.table_name
            )));
        }
        if attribute.name.starts_with("_ddbpipe_") {
            return Err(Failure::usage(anyhow!(
                "config error: sink: key attribute '{}' starts with the reserved prefix _ddbpipe_; the {kind} sink cannot mirror this table",
                attribute.name
            )));
        }
        if let Some(projection) = &source.projection
            && !projects(
                projection,
                &source.expression_attribute_names,
                &attribute.name,
            )
        {
            return Err(Failure::usage(anyhow!(
                "config error: source.projection: projection must include key attribute '{}' for the {kind} sink",
                attribute.name
            )));
        }
        key.push(KeyColumn {
            name: attribute.name.clone(),
            kind: attribute.key_type,
        });
    }
    Ok(TableSpec {
        table: name,
        schema,
        key,
        document_column: keyed.document_column.clone(),
        document_type,
        create_table: keyed.create_table,
    })
}

/// Where the records go and in what form, for the position's identity; a custom sink by the
/// name of the sink `given` in code (none known: not part of the identity, as for `check`).
pub fn output(config: &PipelineConfig, given: Option<&GivenSink>) -> Option<Output> {
    match &config.sink {
        SinkConfig::Jsonl(jsonl) => match &jsonl.path {
            JsonlTarget::Stdout => Some(Output::Stdout),
            JsonlTarget::File(path) => Some(Output::File {
                // Where the path leads (absolute, `..` and symlinks resolved), as the output
                // lock and the path-collision rule see it: runs started from other directories,
                // or through another spelling, name the same file.
                path: files::resolve(path).display().to_string(),
                write: match jsonl.write {
                    WriteMode::Append => FileWrite::Append,
                    WriteMode::Overwrite => FileWrite::Overwrite,
                    WriteMode::NewFilePerRun => FileWrite::NewFilePerRun,
                },
                compression: FileCompression::from(jsonl.gzip),
            }),
        },
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let keyed = config.sink.keyed()?;
            Some(Output::Keyed {
                table: destination_table(config, keyed),
                document_column: keyed.document_column.clone(),
            })
        }
        SinkConfig::Custom => given.map(|sink| Output::Given {
            name: sink.name().to_string(),
        }),
    }
}

/// The table a keyed sink writes: `sink.table`, else the DynamoDB table's name.
fn destination_table(config: &PipelineConfig, keyed: &KeyedConfig) -> String {
    keyed
        .table
        .clone()
        .unwrap_or_else(|| table_name_of(&config.source.table_name))
}

/// Where the records go, as one line a shared run's leader row keeps (docs/coordination.md
/// §11.10): the sink's type and target — a jsonl path as configured, `{worker}` unreplaced
/// (absolute, resolved as [`output`] does); a sqlite file (resolved) and its table; a
/// postgres host, port, database, schema and table, never a user or a password. Two workers
/// whose lines differ would each write part of the data somewhere else.
pub fn sink_identity(config: &PipelineConfig) -> String {
    match &config.sink {
        SinkConfig::Jsonl(jsonl) => match &jsonl.path {
            JsonlTarget::Stdout => "jsonl to standard output".to_string(),
            JsonlTarget::File(path) => format!("jsonl {}", files::resolve(path).display()),
        },
        SinkConfig::Sqlite(sqlite) => format!(
            "sqlite {}, table {}",
            files::resolve(&sqlite.path).display(),
            destination_table(config, &sqlite.keyed)
        ),
        SinkConfig::Postgres(postgres) => {
            let defaults = libpq_defaults(postgres);
            // The URL was checked when the file was loaded; should it not read now, the
            // problem (a key, never a value) stands in for the address.
            let address = PostgresDatabase::address(postgres.url.expose(), &defaults)
                .unwrap_or_else(|problem| format!("<unreadable url: {problem}>"));
            format!(
                "postgres {address}, schema {}, table {}",
                postgres.schema,
                destination_table(config, &postgres.keyed)
            )
        }
        SinkConfig::Custom => "custom".to_string(),
    }
}

/// The table name of a table name or table ARN (`arn:…:table/orders` → `orders`).
fn table_name_of(table: &str) -> String {
    match table.rsplit_once(":table/") {
        Some((_, name)) => name.to_string(),
        None => table.to_string(),
    }
}

/// Whether a projection expression names `attribute` at its top level (directly or through
/// an `expression_attribute_names` placeholder).
fn projects(
    projection: &str,
    names: &std::collections::BTreeMap<String, String>,
    attribute: &str,
) -> bool {
    projection.split(',').any(|path| {
        let top = path.trim().split(['.', '[']).next().unwrap_or("").trim();
        top == attribute || names.get(top).is_some_and(|name| name == attribute)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_projection_names_key_attributes_directly_or_by_placeholder() {
        let names = [("#k".to_string(), "pk".to_string())].into();
        assert!(projects("a, pk.x", &Default::default(), "pk"));
        assert!(projects("#k,b", &names, "pk"));
        assert!(!projects("pkx, b", &names, "pk"));
    }

    #[test]
    fn the_identity_names_the_file_a_sink_path_leads_to_whatever_its_spelling() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(dir.path().join("sub")).unwrap_or_else(|e| panic!("{e}"));
        let load = |name: &str, sink: &str| {
            let file = dir.path().join(name);
            let yaml = format!(
                "name: p\nsource:\n  table_name: t\nsink:\n  type: jsonl\n  path: {sink}\n"
            );
            std::fs::write(&file, yaml).unwrap_or_else(|e| panic!("{e}"));
            let config =
                crate::config::load(&file, &|_: &str| None).unwrap_or_else(|e| panic!("{e}"));
            output(&config, None)
        };
        let plain = load("a.yaml", "out.jsonl");
        assert_eq!(load("b.yaml", "sub/../out.jsonl"), plain);
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path(), dir.path().join("link"))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(load("c.yaml", "link/out.jsonl"), plain);
        }
    }

    #[test]
    fn the_sink_identity_names_type_and_target_without_credentials() {
        let load = |sink: &str| {
            let yaml = format!(
                "name: p\nsource:\n  table_name: orders\nsink: {sink}\n\
                 coordination: {{lease_table: leases}}\n"
            );
            crate::config::parse(&yaml, Path::new("/conf"), &|_: &str| None)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let postgres = sink_identity(&load(
            "{type: postgres, url: 'postgres://app:Wq7xK9zT@db.example:6543/shop', schema: s1}",
        ));
        assert_eq!(
            postgres,
            "postgres db.example:6543/shop, schema s1, table orders"
        );
        let key_values = sink_identity(&load(
            "{type: postgres, url: 'host=db.example port=6543 dbname=shop user=app password=Wq7xK9zT', schema: s1}",
        ));
        assert_eq!(key_values, postgres, "one address whatever the spelling");
        for other in [
            "{type: postgres, url: 'postgres://app@db.example:6543/other', schema: s1}",
            "{type: postgres, url: 'postgres://app@db.example:6543/shop', schema: s2}",
            "{type: postgres, url: 'postgres://app@db.example:6543/shop', schema: s1, table: t}",
            "{type: postgres, url: 'postgres://app@db.example:5432/shop', schema: s1}",
        ] {
            assert_ne!(sink_identity(&load(other)), postgres, "{other}");
        }
        assert_eq!(
            sink_identity(&load("{type: sqlite, path: /data/a.db}")),
            "sqlite /data/a.db, table orders"
        );
        assert_ne!(
            sink_identity(&load("{type: sqlite, path: /data/b.db}")),
            sink_identity(&load("{type: sqlite, path: /data/a.db}"))
        );
        let jsonl = load("{type: jsonl, path: '/out/orders-{worker}.jsonl'}");
        assert_eq!(sink_identity(&jsonl), "jsonl /out/orders-{worker}.jsonl");
    }

    #[test]
    fn an_arn_gives_its_table_name() {
        assert_eq!(
            table_name_of("arn:aws:dynamodb:eu-west-1:1:table/orders"),
            "orders"
        );
        assert_eq!(table_name_of("orders"), "orders");
    }
}
