//! Where a run's records and position go: the jsonl sink with its state file, a keyed sink
//! (sqlite, postgres) whose database also holds the position, or the kafka sink with its
//! positions topic or the state file (docs/state.md §6.1, docs/sinks.md §7).

use std::path::Path;

use anyhow::anyhow;
use ddbpipe_kafka::client::Delivery;
use ddbpipe_kafka::positions::KafkaPositions;
use ddbpipe_kafka::sink::KafkaSink;
use ddbpipe_keyed::PostgresDatabase;
use ddbpipe_keyed::sink::KeyedSink;
use ddbpipe_keyed::state::DatabaseStore;
use ddbpipe_lake::parquet::ParquetSink;
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::CleanupPolicy;
use ddbpipe_pipeline::checkpoint::store::CheckpointStore;
use ddbpipe_pipeline::files;
use ddbpipe_pipeline::sink::{
    Fence, Fencing, Records, RunStart, Sink, SinkError, Staged, Versioned,
};
use ddbpipe_pipeline::sinks::jsonl::JsonlSink;
use ddbpipe_pipeline::state::identity::{FileCompression, FileWrite, Output};
use ddbpipe_pipeline::state::{StateFile, StateLock};
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws;
use ddbpipe_source::position::LeaseCheckpoint;

use crate::config::{JsonlTarget, PipelineConfig, SinkConfig, WriteMode};
use crate::failure::{Failure, state_failure};
use crate::given::Given;
use crate::origin::Origin;
use crate::sink::{CustomSink, GivenSink};
use crate::sinks::parquet::{IcebergConfig, ParquetConfig};
use crate::sinks::{self, kafka, keyed, parquet};

/// The sink a pipeline's config chose.
pub enum AnySink {
    /// JSON lines to stdout or files.
    Jsonl(JsonlSink),
    /// A SQLite or PostgreSQL table.
    Keyed(KeyedSink),
    /// A Kafka topic.
    Kafka(KafkaSink),
    /// Parquet files.
    Parquet(ParquetSink),
    /// The sink the embedding program gave (`type: custom`).
    Custom(CustomSink),
}

impl Sink for AnySink {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.write(batch, state).await,
            AnySink::Keyed(sink) => sink.write(batch, state).await,
            AnySink::Kafka(sink) => sink.write(batch, state).await,
            AnySink::Parquet(sink) => sink.write(batch, state).await,
            AnySink::Custom(sink) => sink.write(batch, state).await,
        }
    }

    async fn start(&mut self, start: RunStart) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.start(start).await,
            AnySink::Keyed(sink) => sink.start(start).await,
            AnySink::Kafka(sink) => sink.start(start).await,
            AnySink::Parquet(sink) => sink.start(start).await,
            AnySink::Custom(sink) => sink.start(start).await,
        }
    }

    async fn complete(&mut self) -> Result<(), SinkError> {
        match self {
            AnySink::Jsonl(sink) => sink.complete().await,
            AnySink::Keyed(sink) => sink.complete().await,
            AnySink::Kafka(sink) => sink.complete().await,
            AnySink::Parquet(sink) => sink.complete().await,
            AnySink::Custom(sink) => sink.complete().await,
        }
    }

    fn describe(&self) -> String {
        match self {
            AnySink::Jsonl(sink) => sink.describe(),
            AnySink::Keyed(sink) => sink.describe(),
            AnySink::Kafka(sink) => sink.describe(),
            AnySink::Parquet(sink) => sink.describe(),
            AnySink::Custom(sink) => sink.describe(),
        }
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        let fences = match self {
            AnySink::Keyed(sink) => sink.fencing().is_some(),
            AnySink::Kafka(sink) => sink.fencing().is_some(),
            AnySink::Jsonl(_) | AnySink::Parquet(_) | AnySink::Custom(_) => false,
        };
        fences.then_some(self)
    }

    fn versioned(&self) -> Option<&impl Versioned> {
        let versioned = match self {
            AnySink::Keyed(sink) => sink.versioned().is_some(),
            AnySink::Kafka(sink) => sink.versioned().is_some(),
            AnySink::Jsonl(_) | AnySink::Parquet(_) | AnySink::Custom(_) => false,
        };
        versioned.then_some(self)
    }
}

/// The fences of the sink inside: a keyed sink's (its database) or a shared `exactly_once`
/// kafka sink's (a producer per unit); [`Sink::fencing`] answers `Some` only for those.
impl Fencing for AnySink {
    async fn write_fenced(&mut self, batch: &Batch, fence: &Fence) -> Result<(), SinkError> {
        match self {
            AnySink::Keyed(sink) => match sink.fencing() {
                Some(fences) => fences.write_fenced(batch, fence).await,
                None => Err(unfenced(sink.describe())),
            },
            AnySink::Kafka(sink) => match sink.fencing() {
                Some(fences) => fences.write_fenced(batch, fence).await,
                None => Err(unfenced(sink.describe())),
            },
            other => Err(unfenced(other.describe())),
        }
    }

    async fn claim(&mut self, fence: &Fence) -> Result<Option<LeaseCheckpoint>, SinkError> {
        match self {
            AnySink::Keyed(sink) => match sink.fencing() {
                Some(fences) => fences.claim(fence).await,
                None => Err(unfenced(sink.describe())),
            },
            AnySink::Kafka(sink) => match sink.fencing() {
                Some(fences) => fences.claim(fence).await,
                None => Err(unfenced(sink.describe())),
            },
            other => Err(unfenced(other.describe())),
        }
    }
}

/// The versioned apply of the sink inside: a keyed sink's, or an `exactly_once` kafka sink's
/// (docs/mirror.md §5.6, docs/sinks.md §7.7 rule 7).
impl Versioned for AnySink {
    fn rows_without_sequence_since(&self, since_ms: i64) -> ddbpipe_pipeline::sink::Detached<u64> {
        match self {
            AnySink::Keyed(sink) => sink.rows_without_sequence_since(since_ms),
            // A topic keeps every change: its repairs sweep nothing.
            _ => Box::pin(async { Ok(0) }),
        }
    }
}

/// A fenced write asked of a sink that keeps no fences.
fn unfenced(sink: String) -> SinkError {
    SinkError {
        sink,
        message: "internal error: a fenced write to a sink without fences".into(),
        class: ddbpipe_pipeline::sink::SinkErrorClass::Definite,
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
    /// The state file's lock, held while the run runs (a keyed sink's lock lives in its
    /// database handle; an `exactly_once` kafka sink's producer fences every older run).
    pub lock: Option<StateLock>,
}

/// Opens the sink and the position store of a run and takes the pipeline's lock. A keyed
/// sink's table is created (or checked) from the described key schema.
pub async fn open(
    config: &PipelineConfig,
    origin: &Origin,
    sdk: &aws::SdkSettings,
    table: Option<&TableDescription>,
    records: Records,
    given: &Given,
) -> Result<Destination, Failure> {
    distinct_paths(config, origin.file())?;
    let source = &config.source;
    let cleanup = CleanupPolicy {
        deletes: source.resnapshot_deletes,
        max_keys: source.resnapshot_max_keys as u64,
    };
    // Apart from a keyed sink, the pipeline's lock first: a second run is refused as the
    // pipeline's before its sink's own output lock could answer. A store given in code is
    // the program's: no state file, no lock (docs/state.md §6.7).
    let file = StateFile::new(&config.state.path);
    let lock = match (config.sink.keeps_position(), &given.store) {
        (None, None) => Some(
            file.lock(&config.name)
                .map_err(|e| state_failure(e, origin))?,
        ),
        _ => None,
    };
    let sink = match &config.sink {
        SinkConfig::Jsonl(jsonl) => AnySink::Jsonl(
            JsonlSink::open(sinks::jsonl::jsonl_settings(jsonl, records), &config.name)
                .map_err(Failure::runtime)?,
        ),
        SinkConfig::Custom => AnySink::Custom(
            given
                .sink
                .as_ref()
                .ok_or_else(sinks::custom::no_custom_sink)?
                .for_run(records),
        ),
        SinkConfig::Kafka(settings) => {
            let (sink, positions) =
                kafka::open_kafka(settings, config.target(), table, records, false, Some(sdk))
                    .await?;
            if let Some(positions) = positions {
                return Ok(Destination {
                    sink: AnySink::Kafka(sink),
                    store: Box::new(positions),
                    cleanup,
                    lock,
                });
            }
            AnySink::Kafka(sink)
        }
        SinkConfig::Parquet(settings) => {
            let (sink, positions) =
                parquet::open_parquet(settings, config.target(), sdk, table, records).await?;
            return Ok(Destination {
                sink: AnySink::Parquet(sink),
                store: Box::new(positions),
                cleanup,
                lock,
            });
        }
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let (_, sink) = keyed::keyed_sink(config.target(), table, records, true).await?;
            return Ok(Destination {
                store: Box::new(sink.state_store()),
                sink: AnySink::Keyed(sink),
                cleanup,
                lock: None,
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
        lock,
    })
}

/// The files a run writes must differ from each other and from the config file, compared
/// where they lead (symlinks followed, relative paths made absolute):
/// 1. A jsonl `sink.path` that is `state.path`: the lines and the state would overwrite each
///    other.
/// 2. A `sink.path` (jsonl or sqlite) or `state.path` that is the config file: the run would
///    write into its own config.
///
/// `run` checks this before it writes anything, and `check` fails with the same message.
pub fn distinct_paths(config: &PipelineConfig, config_path: Option<&Path>) -> Result<(), Failure> {
    // YAML given in code has no file of its own the run could write into.
    let config_file = config_path.map(files::resolve);
    let sink_path = match &config.sink {
        SinkConfig::Jsonl(jsonl) => match &jsonl.path {
            JsonlTarget::File(path) => Some(path),
            JsonlTarget::Stdout => None,
        },
        SinkConfig::Sqlite(sqlite) => Some(&sqlite.path),
        SinkConfig::Postgres(_)
        | SinkConfig::Kafka(_)
        | SinkConfig::Parquet(_)
        | SinkConfig::Custom => None,
    };
    let state_path = config
        .sink
        .keeps_position()
        .is_none()
        .then_some(&config.state.path);
    if let Some(sink) = sink_path {
        let resolved = files::resolve(sink);
        if let Some(config_path) = config_path
            && config_file.as_ref() == Some(&resolved)
        {
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
    if let (Some(state), Some(config_path)) = (state_path, config_path)
        && config_file.as_ref() == Some(&files::resolve(state))
    {
        return Err(Failure::usage(anyhow!(
            "config error: state.path: {} is the config file {} itself; choose another state.path",
            state.display(),
            config_path.display()
        )));
    }
    Ok(())
}

/// The position store for reading (`state`, `lag`, `check`): creates nothing and takes no
/// lock. `None` when a sqlite sink's database or an S3 table does not exist yet.
pub async fn read_store(
    config: &PipelineConfig,
) -> Result<Option<Box<dyn CheckpointStore>>, Failure> {
    match &config.sink {
        SinkConfig::Parquet(settings) => Ok(parquet::positions_reader(settings, config.target())
            .await?
            .map(|positions| Box::new(positions) as Box<dyn CheckpointStore>)),
        SinkConfig::Kafka(settings) => Ok(Some(
            match kafka::positions_reader(settings, config.target()).await? {
                Some(positions) => Box::new(positions),
                None => Box::new(StateFile::new(&config.state.path)),
            },
        )),
        SinkConfig::Jsonl(_) | SinkConfig::Custom => {
            Ok(Some(Box::new(StateFile::new(&config.state.path))))
        }
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => {
            let spec = keyed::table_spec(config.target(), None)?;
            Ok(keyed::open_existing(&config.sink)
                .await?
                .map(|db| Box::new(DatabaseStore::new(db, spec)) as Box<dyn CheckpointStore>))
        }
    }
}

/// Where the position of a pipeline is saved, for messages.
pub fn position_label(config: &PipelineConfig) -> String {
    match &config.sink {
        SinkConfig::Kafka(settings) if settings.delivery == Delivery::ExactlyOnce => {
            KafkaPositions::label(&settings.brokers, &settings.positions_topic)
        }
        SinkConfig::Kafka(_) => config.state.path.display().to_string(),
        SinkConfig::Jsonl(_) | SinkConfig::Custom => config.state.path.display().to_string(),
        SinkConfig::Sqlite(sqlite) => format!("sqlite {}", sqlite.path.display()),
        SinkConfig::Parquet(settings) => match &settings.iceberg {
            // The position is in the table's snapshots.
            Some(iceberg) => iceberg_table(config, settings, iceberg),
            None => match parquet::location(settings, config.target()) {
                Ok(location) => format!("parquet {}", location.describe()),
                Err(_) => format!("parquet {}", settings.path),
            },
        },
        SinkConfig::Postgres(postgres) => format!(
            "postgres {} (schema {})",
            PostgresDatabase::redact(postgres.url.expose()),
            postgres.schema
        ),
    }
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
                table: keyed::destination_table(&config.source, keyed),
                document_column: keyed.document_column.clone(),
            })
        }
        SinkConfig::Kafka(settings) => Some(Output::Topic {
            topic: kafka::topic_name(settings, config.target()),
            shape: kafka::message_shape(settings),
        }),
        // The position lives with the files: another location has a position of its own.
        SinkConfig::Parquet(_) => None,
        SinkConfig::Custom => given.map(|sink| Output::Given {
            name: sink.name().to_string(),
        }),
    }
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
            keyed::destination_table(&config.source, &sqlite.keyed)
        ),
        SinkConfig::Postgres(postgres) => {
            let defaults = keyed::libpq_defaults(postgres);
            // The URL was checked when the file was loaded; should it not read now, the
            // problem (a key, never a value) stands in for the address.
            let address = PostgresDatabase::address(postgres.url.expose(), &defaults)
                .unwrap_or_else(|problem| format!("<unreadable url: {problem}>"));
            format!(
                "postgres {address}, schema {}, table {}",
                postgres.schema,
                keyed::destination_table(&config.source, &postgres.keyed)
            )
        }
        // Workers of one run must keep their positions in one place: `exactly_once` in the
        // positions topic with the unit's batches, `at_least_once` in the lease rows
        // (docs/coordination.md §11.13). A worker of the other kind would resume from a
        // position the others do not write.
        SinkConfig::Kafka(settings) => {
            let topic = kafka::topic_name(settings, config.target());
            match settings.delivery {
                Delivery::ExactlyOnce => format!(
                    "kafka {}, topic {topic}, exactly_once, positions topic {}",
                    settings.brokers, settings.positions_topic
                ),
                Delivery::AtLeastOnce => {
                    format!("kafka {}, topic {topic}, at_least_once", settings.brokers)
                }
            }
        }
        SinkConfig::Parquet(settings) => match &settings.iceberg {
            Some(iceberg) => iceberg_table(config, settings, iceberg),
            None => format!("parquet {}", settings.path),
        },
        SinkConfig::Custom => "custom".to_string(),
    }
}

/// An iceberg sink's table for messages and the output's identity: its names as the catalog
/// keeps them, the catalog as messages name it (a PostgreSQL catalog's address, never its user
/// or password) and its warehouse (an S3 table's is the service's: none is configured).
fn iceberg_table(
    config: &PipelineConfig,
    settings: &ParquetConfig,
    iceberg: &IcebergConfig,
) -> String {
    let mut said = format!(
        "iceberg {}.{}, {}",
        parquet::stored_name(iceberg, &iceberg.namespace),
        parquet::stored_name(iceberg, &iceberg.table),
        parquet::describe_catalog(settings, iceberg, config.target()),
    );
    if iceberg.catalog_type != parquet::CatalogType::S3Tables {
        said.push_str(&format!(", warehouse {}", settings.path));
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Issue 28: typed columns added or removed keep the position (they are filled from the
    /// documents); dropping the document column does not.
    #[test]
    fn typed_columns_are_not_part_of_the_identity_and_the_document_column_is() {
        let load = |extra: &str| {
            let yaml = format!(
                "name: p\nsource:\n  table_name: orders\nsink:\n  type: sqlite\n  path: /data/a.db\n{extra}"
            );
            let config = crate::config::parse(&yaml, Path::new("/conf"), &|_: &str| None)
                .unwrap_or_else(|e| panic!("{e}"));
            output(&config, None)
        };
        let plain = load("");
        let with_columns = load(
            "  columns:\n    - {name: status, path: status, type: text}\n    - {name: total, path: total, type: numeric}\n",
        );
        assert_eq!(with_columns, plain);
        assert_eq!(
            load("  document_column: null\n"),
            Some(Output::Keyed {
                table: "orders".into(),
                document_column: None,
            })
        );
        assert_ne!(load("  document_column: null\n"), plain);
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
        // Kafka workers agree on where the positions live, not only on the topic.
        let exactly = sink_identity(&load("{type: kafka, brokers: 'k:9092', topic: t}"));
        assert_eq!(
            exactly,
            "kafka k:9092, topic t, exactly_once, positions topic _ddbpipe_positions"
        );
        for other in [
            "{type: kafka, brokers: 'k:9092', topic: t, delivery: at_least_once}",
            "{type: kafka, brokers: 'k:9092', topic: t, positions_topic: p2}",
        ] {
            assert_ne!(sink_identity(&load(other)), exactly, "{other}");
        }
    }

    /// An iceberg sink is named by its table, its catalog (a PostgreSQL one by its address,
    /// never its password) and its warehouse, not as a parquet location.
    #[test]
    fn an_iceberg_sinks_identity_is_its_table_and_catalog_without_the_password() {
        let load = |catalog: &str, table: &str| {
            let yaml = format!(
                "name: p\nsource: {{table_name: orders}}\nsink: {{type: iceberg, catalog: \
                 {{type: sql, uri: '{catalog}'}}, warehouse: 's3://b/wh', table: {table}}}\n"
            );
            let config = crate::config::parse(&yaml, Path::new("/conf"), &|_: &str| None)
                .unwrap_or_else(|e| panic!("{e}"));
            sink_identity(&config)
        };
        let postgres = load("postgres://app:Wq7xK9zT@db.example:6543/lake", "orders");
        assert_eq!(
            postgres,
            "iceberg dynamodb.orders, SQL catalog 'ddbpipe' in postgres db.example:6543/lake, \
             warehouse s3://b/wh"
        );
        assert_ne!(
            load("postgres://app:Wq7xK9zT@db.example:6543/lake", "other"),
            postgres
        );
        assert_eq!(
            load("sqlite:////var/c.db", "orders"),
            "iceberg dynamodb.orders, SQL catalog 'ddbpipe' in /var/c.db, warehouse s3://b/wh"
        );
        // A Glue catalog by its account, region and endpoint, the endpoint's password masked.
        let yaml = "name: p\nsource: {table_name: orders}\nsink: {type: iceberg, catalog: \
                    {type: glue, catalog_id: '123456789012', region: eu-west-1, endpoint_url: \
                    'http://app:Wq7xK9zT@glue.example:4566'}, warehouse: 's3://b/wh'}\n";
        let config = crate::config::parse(yaml, Path::new("/conf"), &|_: &str| None)
            .unwrap_or_else(|e| panic!("{e}"));
        let glue = sink_identity(&config);
        assert!(
            glue.starts_with(
                "iceberg dynamodb.orders, Glue Data Catalog of account 123456789012 in eu-west-1 \
                 at http://"
            ) && glue.contains("glue.example:4566")
                && glue.ends_with(", warehouse s3://b/wh"),
            "{glue}"
        );
        assert!(!glue.contains("Wq7xK9zT"), "{glue}");
    }
}
