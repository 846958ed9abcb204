//! How a run builds the sqlite and postgres sinks: the database (opened, created or
//! connected), the run's lock in it, the destination table's shape from the described key
//! schema, and the prepared `KeyedSink` (crates/keyed) that writes the rows.

use anyhow::anyhow;
use ddbpipe_keyed::sink::{KeyedSink, SinkRetry};
use ddbpipe_keyed::{
    Database, DocumentType, KeyColumn, LockAttempt, PostgresDatabase, SqliteDatabase, TableSpec,
};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::api::TableDescription;

use super::columns::Dialect;
use super::{KeyedConfig, PostgresConfig};
use ddbpipe_source::config::SourceConfig;

use crate::failure::Failure;
use crate::sinks::{SinkConfig, Target};

/// Deletes the pipeline's state and lease fences in its database (`state reset`); whether
/// anything was there.
pub async fn reset_database_state(db: &Database, pipeline: &str) -> Result<bool, Failure> {
    db.reset_state(pipeline)
        .await
        .map_err(|e| Failure::runtime(anyhow!("{}: {}", db.describe(), e.message)))
}

/// The keyed sink of `target`, prepared (its table created or checked), and its database.
/// With `lock`, the pipeline's run lock is taken first; the workers of a shared run take none
/// (their lease fences keep them apart, docs/coordination.md §11.10).
pub async fn keyed_sink(
    target: Target<'_>,
    table: Option<&TableDescription>,
    records: Records,
    lock_run: bool,
) -> Result<(Database, KeyedSink), Failure> {
    let source = target.source;
    let Some(table) = table else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a keyed sink needs the table's key schema"
        )));
    };
    let spec = table_spec(target, Some(table))?;
    let db = connect(target.sink)
        .await?
        .ok_or_else(|| Failure::runtime(anyhow!("the sink database could not be opened")))?;
    if lock_run {
        lock(&db, target.pipeline).await?;
        if let Some(refused) = another_writer(&db, &spec, target.pipeline).await? {
            return Err(refused);
        }
    }
    let retry = source.retry.policy();
    let on_mismatch = target.sink.keyed().map(|keyed| keyed.on_type_mismatch);
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
    )
    .on_type_mismatch(on_mismatch.unwrap_or_default());
    sink.prepare().await.map_err(Failure::runtime)?;
    Ok((db, sink))
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

/// Refuses `pipeline`'s run into `spec`'s table when the database holds another pipeline's
/// position of rows written there (`ddbpipe_keyed::state::other_writer`): `check` says the
/// same.
pub async fn another_writer(
    db: &Database,
    spec: &TableSpec,
    pipeline: &str,
) -> Result<Option<Failure>, Failure> {
    let other = ddbpipe_keyed::state::other_writer(db, spec, pipeline)
        .await
        .map_err(|error| sink_failure(db, error.message))?;
    Ok(other.map(|other| {
        Failure::runtime(anyhow!(
            "sink {}: table '{}' holds the rows of pipeline '{other}' (its position is in \
             _ddbpipe_state): pipeline '{pipeline}' would mix its rows with them",
            db.describe(),
            spec.table
        ))
        .hint(format!(
            "give pipeline '{pipeline}' a table of its own (sink.table); or, when pipeline \
             '{other}' no longer writes there (renamed, moved), clear its position: `ddbpipe \
             state reset` with its file, or delete its rows (pipeline = '{other}') from \
             the _ddbpipe_state beside the table"
        ))
    }))
}

/// Opens (creating a sqlite file when missing) or connects to a keyed sink's database.
pub async fn connect(sink: &SinkConfig) -> Result<Option<Database>, Failure> {
    match sink {
        SinkConfig::Jsonl(_)
        | SinkConfig::Kafka(_)
        | SinkConfig::Parquet(_)
        | SinkConfig::Custom => Ok(None),
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
pub async fn open_existing(sink: &SinkConfig) -> Result<Option<Database>, Failure> {
    match sink {
        SinkConfig::Sqlite(sqlite) => SqliteDatabase::open_existing(&sqlite.path)
            .map(|db| db.map(Database::from))
            .map_err(|e| db_failure("sqlite", &sqlite.path.display().to_string(), e.message)),
        _ => connect(sink).await,
    }
}

/// The libpq environment variables set when the file was loaded, as connection defaults.
pub fn libpq_defaults(postgres: &PostgresConfig) -> Vec<(&'static str, String)> {
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
/// name), its document and typed columns and, when the table was described, its key columns.
/// Key attributes that collide with the document column, a typed column or ddbpipe's
/// reserved names, and a projection that leaves out a key attribute, are config errors
/// (exit 2).
pub fn table_spec(
    target: Target<'_>,
    table: Option<&TableDescription>,
) -> Result<TableSpec, Failure> {
    let (keyed, schema, document_type) = match target.sink {
        SinkConfig::Sqlite(sqlite) => (&sqlite.keyed, "main".to_string(), DocumentType::Jsonb),
        SinkConfig::Postgres(postgres) => (
            &postgres.keyed,
            postgres.schema.clone(),
            postgres.document_type,
        ),
        SinkConfig::Jsonl(_)
        | SinkConfig::Kafka(_)
        | SinkConfig::Parquet(_)
        | SinkConfig::Custom => {
            return Err(Failure::runtime(anyhow!(
                "internal error: the {} sink has no table",
                target.sink.kind()
            )));
        }
    };
    let kind = target.sink.kind();
    let dialect = match target.sink {
        SinkConfig::Postgres(_) => Dialect::Postgres,
        _ => Dialect::Sqlite,
    };
    let source = target.source;
    let name = destination_table(source, keyed);
    let mut key = Vec::new();
    for attribute in table.map(|t| t.key_schema.as_slice()).unwrap_or_default() {
        if let Some(document) = &keyed.document_column
            && dialect.same_name(&attribute.name, document)
        {
            return Err(Failure::usage(anyhow!(
                "config error: sink.document_column: key attribute '{}' of table '{}' has the same name as the document column; choose another document_column",
                attribute.name,
                source.table_name
            )));
        }
        // Rule 3 of `columns`: the key has its own columns already.
        if let Some(index) = keyed
            .columns
            .iter()
            .position(|column| dialect.same_name(&attribute.name, &column.name))
        {
            return Err(Failure::usage(anyhow!(
                "config error: sink.columns[{index}].name: '{}' is key attribute '{}' of table '{}', stored in a key column of its own already; choose another name or remove the column",
                keyed.columns[index].name,
                attribute.name,
                source.table_name
            )));
        }
        if attribute.name.starts_with(ddbpipe_keyed::RESERVED_PREFIX) {
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
        // Loading the file read every column (it does not load otherwise).
        columns: super::columns::specs(&keyed.columns),
        document_type,
        create_table: keyed.create_table,
    })
}

/// The table a keyed sink writes: `sink.table`, else the DynamoDB table's name.
pub fn destination_table(source: &SourceConfig, keyed: &KeyedConfig) -> String {
    keyed
        .table
        .clone()
        .unwrap_or_else(|| table_name_of(&source.table_name))
}

/// The table name of a table name or table ARN (`arn:…:table/orders` → `orders`).
pub(crate) fn table_name_of(table: &str) -> String {
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
    fn an_arn_gives_its_table_name() {
        assert_eq!(
            table_name_of("arn:aws:dynamodb:eu-west-1:1:table/orders"),
            "orders"
        );
        assert_eq!(table_name_of("orders"), "orders");
    }
}
