//! The sinks, one folder each: its config section (the keys, their reading and validation)
//! and how a run builds it (`jsonl`, `keyed` for sqlite and postgres, `kafka`, `custom` for a
//! sink given in code); the writing itself is the engine's (`ddbpipe_pipeline::sinks::jsonl`,
//! `ddbpipe_keyed`, `ddbpipe_kafka`, `crate::sink`). Here: the `sink:` section's dispatch.

pub mod custom;
pub mod jsonl;
pub mod kafka;
pub mod keyed;
pub mod parquet;

use std::collections::BTreeSet;
use std::path::Path;

use ddbpipe_source::config::{ConfigError, SourceConfig};

use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, Shape, Variant, of, required};
use crate::yaml::types::Choice;
pub use jsonl::{JsonlConfig, JsonlTarget, WriteMode};
pub use kafka::KafkaConfig;
pub use keyed::{KeyedConfig, PostgresConfig, SqliteConfig, stale_rows_warning};
pub use parquet::ParquetConfig;

/// `sink:`: a `type`, then the keys of that sink (docs/sinks.md §7).
pub(crate) const SINK: Shape = Shape::Tagged {
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
        fields: jsonl::FIELDS,
    },
    Variant {
        tag: "sqlite",
        description: "A keyed table in a SQLite file, the position in the same database \
                      (docs/sinks.md §7.2).",
        fields: keyed::SQLITE,
    },
    Variant {
        tag: "postgres",
        description: "A keyed table in PostgreSQL, the position in the same database \
                      (docs/sinks.md §7.3).",
        fields: keyed::POSTGRES,
    },
    Variant {
        tag: "kafka",
        description: "Messages on a Kafka topic, Debezium-shaped, exactly once through \
                      transactions with the position in a compacted topic (docs/sinks.md §7.7).",
        fields: kafka::FIELDS,
    },
    Variant {
        tag: "parquet",
        description: "Parquet files on S3 or in a local directory, committed exactly once through \
                      a commit log that also keeps the position (docs/sinks.md §7.10).",
        fields: parquet::FIELDS,
    },
    Variant {
        tag: "iceberg",
        description: "An Apache Iceberg table in a SQL catalog, its files on S3 or in a local \
                      directory; every commit a snapshot holding the position \
                      (docs/sinks.md §7.11).",
        fields: parquet::ICEBERG_FIELDS,
    },
    Variant {
        tag: "custom",
        description: "A sink given in code by the program that embeds ddbpipe \
                      (`Pipeline::with_sink`, docs/sinks.md §7.5); the position in the state \
                      file. `ddbpipe run` has none to give.",
        fields: &[],
    },
];

/// What building a sink reads of its pipeline: the pipeline's name, its source and its sink
/// section.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The pipeline's name (its lock, its position, a jsonl file's lock).
    pub pipeline: &'a str,
    /// The source: the table, the retry policy and value format a keyed sink writes with.
    pub source: &'a SourceConfig,
    /// The sink section.
    pub sink: &'a SinkConfig,
}

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
    /// `type: kafka`: messages on a Kafka topic, the position in a compacted topic committed
    /// with them (`exactly_once`) or in the state file (`at_least_once`) (docs/sinks.md §7.7).
    Kafka(KafkaConfig),
    /// `type: parquet`: Parquet files on S3 or in a directory, the position in their commit
    /// log (docs/sinks.md §7.10); `type: iceberg` (`ParquetConfig::iceberg` set): the same
    /// files committed as the snapshots of an Iceberg table, which hold the position (§7.11).
    Parquet(ParquetConfig),
    /// `type: custom`: a sink the embedding program gives in code, the position in the state
    /// file (docs/sinks.md §7.5).
    Custom,
}

impl SinkConfig {
    /// `"jsonl"`, `"sqlite"`, `"postgres"`, `"kafka"`, `"parquet"` or `"custom"`.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Jsonl(_) => "jsonl",
            SinkConfig::Sqlite(_) => "sqlite",
            SinkConfig::Postgres(_) => "postgres",
            SinkConfig::Kafka(_) => "kafka",
            SinkConfig::Parquet(parquet) if parquet.iceberg.is_some() => "iceberg",
            SinkConfig::Parquet(_) => "parquet",
            SinkConfig::Custom => "custom",
        }
    }

    /// Where the sink keeps the position when it keeps it itself, for messages ("its
    /// database", "its positions topic"); `None` when the state file keeps it (jsonl, custom,
    /// kafka `at_least_once`).
    pub fn keeps_position(&self) -> Option<&'static str> {
        match self {
            SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => Some("its database"),
            SinkConfig::Kafka(kafka)
                if kafka.delivery == ddbpipe_kafka::client::Delivery::ExactlyOnce =>
            {
                Some("its positions topic")
            }
            SinkConfig::Parquet(parquet) if parquet.iceberg.is_some() => {
                Some("its table's snapshots")
            }
            SinkConfig::Parquet(_) => Some("its commit log"),
            SinkConfig::Jsonl(_) | SinkConfig::Kafka(_) | SinkConfig::Custom => None,
        }
    }

    /// Whether the sink commits each batch's position with its records, exactly once, and
    /// appends them: kafka `exactly_once` (its transaction), parquet and iceberg (their
    /// commit). A scan page is then never split between batches, or a resumed scan would send
    /// the records of a committed batch again (docs/scan.md §2.5); a keyed sink upserts them.
    pub fn commits_position_with_records(&self) -> bool {
        match self {
            SinkConfig::Kafka(kafka) => {
                kafka.delivery == ddbpipe_kafka::client::Delivery::ExactlyOnce
            }
            SinkConfig::Parquet(_) => true,
            SinkConfig::Jsonl(_)
            | SinkConfig::Sqlite(_)
            | SinkConfig::Postgres(_)
            | SinkConfig::Custom => false,
        }
    }

    /// Whether the sink needs the table's key schema (so a stream read from a configured
    /// `stream_arn` still describes the table): the keyed sinks (their key columns) and kafka
    /// (the message key, docs/sinks.md §7.8) and parquet (the key columns).
    pub fn needs_key_schema(&self) -> bool {
        matches!(
            self,
            SinkConfig::Sqlite(_)
                | SinkConfig::Postgres(_)
                | SinkConfig::Kafka(_)
                | SinkConfig::Parquet(_)
        )
    }

    /// Whether the sink stores changes by their new image, so a stream without new images
    /// (`KEYS_ONLY`, `OLD_IMAGE`) cannot feed it: the keyed sinks (the row) and parquet (the
    /// `document` a current-state query reads). `run` refuses such a stream before it reads,
    /// `check` fails on it (docs/streams.md §4.2).
    pub fn needs_new_images(&self) -> bool {
        matches!(
            self,
            SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) | SinkConfig::Parquet(_)
        )
    }

    /// The keyed part of a sqlite or postgres sink; `None` for the others.
    pub fn keyed(&self) -> Option<&KeyedConfig> {
        match self {
            SinkConfig::Jsonl(_)
            | SinkConfig::Kafka(_)
            | SinkConfig::Parquet(_)
            | SinkConfig::Custom => None,
            SinkConfig::Sqlite(sqlite) => Some(&sqlite.keyed),
            SinkConfig::Postgres(postgres) => Some(&postgres.keyed),
        }
    }
}

/// The `type` of `sink`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkType {
    Jsonl,
    Sqlite,
    Postgres,
    Kafka,
    Parquet,
    Iceberg,
    Custom,
}

impl Choice for SinkType {
    fn all() -> &'static [Self] {
        &[
            SinkType::Jsonl,
            SinkType::Sqlite,
            SinkType::Postgres,
            SinkType::Kafka,
            SinkType::Parquet,
            SinkType::Iceberg,
            SinkType::Custom,
        ]
    }
    fn name(self) -> &'static str {
        match self {
            SinkType::Jsonl => "jsonl",
            SinkType::Sqlite => "sqlite",
            SinkType::Postgres => "postgres",
            SinkType::Kafka => "kafka",
            SinkType::Parquet => "parquet",
            SinkType::Iceberg => "iceberg",
            SinkType::Custom => "custom",
        }
    }
    fn hint(found: &str) -> Option<&'static str> {
        match found {
            "postgresql" | "pg" => Some("the PostgreSQL sink is `type: postgres`"),
            "redpanda" | "msk" | "debezium" => Some("a Kafka-protocol broker is `type: kafka`"),
            "s3" | "lake" | "files" => {
                Some("Parquet files on S3 or in a directory are `type: parquet`")
            }
            _ => None,
        }
    }
}

/// Reads the sink section; also returns the keys it set. An unknown `type` stops here: the
/// other keys cannot be judged without it.
pub(crate) fn read_sink(mut f: Fields<'_>) -> Option<(SinkConfig, BTreeSet<String>)> {
    let kind = f.required::<SinkType>("type")?;
    f.select(kind.name());
    let sink = match kind {
        SinkType::Jsonl => SinkConfig::Jsonl(jsonl::read(&mut f)),
        SinkType::Sqlite => SinkConfig::Sqlite(keyed::read_sqlite(&mut f)),
        SinkType::Postgres => SinkConfig::Postgres(keyed::read_postgres(&mut f)),
        SinkType::Kafka => SinkConfig::Kafka(kafka::read(&mut f)),
        SinkType::Parquet => SinkConfig::Parquet(parquet::read(&mut f)),
        SinkType::Iceberg => SinkConfig::Parquet(parquet::read_iceberg(&mut f)),
        SinkType::Custom => SinkConfig::Custom,
    };
    Some((sink, f.finish()))
}

/// Makes the sink's relative file paths relative to `config_dir`, the pipeline file's
/// directory (`crate::yaml::anchor`).
pub(crate) fn anchor_paths(config_dir: &Path, sink: &mut SinkConfig) {
    match sink {
        SinkConfig::Jsonl(JsonlConfig {
            path: JsonlTarget::File(path),
            ..
        })
        | SinkConfig::Sqlite(SqliteConfig { path, .. }) => crate::yaml::anchor(config_dir, path),
        SinkConfig::Parquet(parquet) => parquet::anchor(config_dir, parquet),
        SinkConfig::Jsonl(_)
        | SinkConfig::Postgres(_)
        | SinkConfig::Kafka(_)
        | SinkConfig::Custom => {}
    }
}

/// The sink rules of docs/config.md §1.3 rule 12 (docs/sinks.md §7): each sink's own (the
/// state's are `crate::config`'s).
pub(crate) fn validate(sink: &SinkConfig, errors: &mut Vec<ConfigError>) {
    match sink {
        SinkConfig::Jsonl(config) => jsonl::validate(config, errors),
        SinkConfig::Sqlite(_) | SinkConfig::Postgres(_) => keyed::validate(sink, errors),
        SinkConfig::Kafka(config) => kafka::validate(config, errors),
        SinkConfig::Parquet(config) => parquet::validate(config, errors),
        SinkConfig::Custom => {}
    }
}
