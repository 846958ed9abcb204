//! Several tables in one pipeline file (`source.tables`, docs/config.md §1.5): each table is a
//! pipeline of its own, named `<name>:<table>`, with its own position and identity, its sink's
//! `{table}` filled in ([`PipelineConfig::per_table`]). The rules a list must keep are here
//! ([`validate`]); `{table}` in a single table's file is filled in when it is loaded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use ddbpipe_source::config::{ConfigError, Mode, SourceConfig};

use super::{JsonlTarget, PipelineConfig, SinkConfig, StateConfig};
use crate::sinks::keyed::table_name_of;
use crate::sinks::parquet::{CatalogType, stored_name};
use ddbpipe_lake::iceberg::s3tables_name_problem;

/// The placeholder for the table's name in `sink.path`, `sink.table`, `sink.topic` and
/// `state.path`.
pub const TABLE_PLACEHOLDER: &str = "{table}";

/// At most this many tables in one list: each is read by tasks and clients of its own.
pub const MAX_TABLES: usize = 500;

/// What separates the pipeline's name from a table's in the name of the table's own pipeline:
/// a character no pipeline name holds, so `orders:customers` is never a pipeline of its own.
pub const NAME_SEPARATOR: char = ':';

impl PipelineConfig {
    /// The pipelines this file runs: itself for one table (`source.table_name`), one per table
    /// of `source.tables` (or of the tables `discover` found, `crate::discover::each_table`: none before),
    /// in the list's order, each named `<name>:<table>` and with the table's name in place of
    /// `{table}`.
    pub fn per_table(&self) -> Vec<PipelineConfig> {
        if !self.is_multi_table() {
            return vec![self.clone()];
        }
        self.tables
            .iter()
            .map(|table| {
                let mut one = self.clone();
                one.name = format!("{}{NAME_SEPARATOR}{}", self.name, table_name_of(table));
                one.source.table_name = table.clone();
                one.tables = Vec::new();
                one.discover = None;
                fill_table(&mut one.sink, &mut one.state, table);
                one
            })
            .collect()
    }

    /// Whether the file reads several tables (`source.tables`, `source.discover`).
    pub fn is_multi_table(&self) -> bool {
        !self.tables.is_empty() || self.discover.is_some()
    }

    /// The file with the tables its `discover` found as its list.
    pub fn with_tables(&self, tables: Vec<String>) -> PipelineConfig {
        PipelineConfig {
            tables,
            ..self.clone()
        }
    }
}

/// Puts `table`'s name (of a name or an ARN) in place of `{table}` in the sink and the state
/// path. The kafka topic's `{table}` is filled in when the sink is built, from the source.
pub(super) fn fill_table(sink: &mut SinkConfig, state: &mut StateConfig, table: &str) {
    fill_sink(sink, table);
    fill_path(&mut state.path, &table_name_of(table));
}

fn fill_path(path: &mut PathBuf, name: &str) {
    if let Some(text) = path.to_str()
        && text.contains(TABLE_PLACEHOLDER)
    {
        *path = PathBuf::from(text.replace(TABLE_PLACEHOLDER, name));
    }
}

/// Puts `table`'s name in place of `{table}` in the sink ([`fill_table`]).
fn fill_sink(sink: &mut SinkConfig, table: &str) {
    let name = table_name_of(table);
    match sink {
        SinkConfig::Jsonl(jsonl) => {
            if let JsonlTarget::File(path) = &mut jsonl.path {
                fill_path(path, &name);
            }
        }
        SinkConfig::Sqlite(sqlite) => fill_text(&mut sqlite.keyed.table, &name),
        SinkConfig::Postgres(postgres) => fill_text(&mut postgres.keyed.table, &name),
        SinkConfig::Parquet(parquet) => {
            parquet.path = parquet.path.replace(TABLE_PLACEHOLDER, &name);
            if let Some(iceberg) = &mut parquet.iceberg {
                iceberg.table = iceberg.table.replace(TABLE_PLACEHOLDER, &name);
            }
        }
        SinkConfig::Kafka(_) | SinkConfig::Custom => {}
    }
}

/// The first two of `tables` whose rows `sink` would write into one table of a destination
/// that does not tell names apart by case (docs/config.md §1.5): a SQLite file, whose table
/// names compare ignoring ASCII case, the Glue Data Catalog, which keeps names in lowercase,
/// or S3 Tables, which keeps them in lowercase with underscores for hyphens.
/// `{table}` keeps every other destination's tables apart (DynamoDB's names are distinct).
pub(crate) fn one_destination<'a>(
    sink: &SinkConfig,
    tables: &'a [String],
) -> Option<(&'a str, &'a str, &'static str)> {
    let folded = |table: &str| {
        let mut one = sink.clone();
        fill_sink(&mut one, table);
        match one {
            SinkConfig::Sqlite(sqlite) => Some((
                (sqlite.keyed.table)
                    .unwrap_or_else(|| table_name_of(table))
                    .to_ascii_lowercase(),
                "one SQLite table (SQLite does not tell table names apart by case)",
            )),
            SinkConfig::Parquet(parquet) => (parquet.iceberg).and_then(|iceberg| {
                let what = match iceberg.catalog_type {
                    CatalogType::Sql | CatalogType::Rest => return None,
                    CatalogType::Glue => "one Glue table (Glue keeps table names in lowercase)",
                    CatalogType::S3Tables => {
                        "one S3 table (S3 Tables keeps table names in lowercase, with \
                         underscores for hyphens)"
                    }
                };
                Some((stored_name(&iceberg, &iceberg.table), what))
            }),
            _ => None,
        }
    };
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for table in tables {
        let (name, what) = folded(table)?;
        if let Some(first) = seen.insert(name, table) {
            return Some((first, table, what));
        }
    }
    None
}

/// What a destination refuses in the name `sink.table` gives `table`'s rows: an S3 table's name (lowercase letters, digits and underscores: S3 Tables keeps
/// `{table}` of `Orders-2026` as `orders_2026`, and refuses `_orders`). Every other
/// destination takes what `{table}` makes of a DynamoDB table's name.
pub(crate) fn destination_name_problem(sink: &SinkConfig, table: &str) -> Option<String> {
    let mut one = sink.clone();
    fill_sink(&mut one, table);
    let SinkConfig::Parquet(parquet) = one else {
        return None;
    };
    let iceberg = parquet
        .iceberg
        .filter(|iceberg| iceberg.catalog_type == CatalogType::S3Tables)?;
    let problem = s3tables_name_problem(&stored_name(&iceberg, &iceberg.table), false)?;
    Some(format!(
        "{problem} (the name of table '{table}'): give one it takes"
    ))
}

/// [`one_destination`]'s refusal of `first` and `second`.
pub(crate) fn one_destination_problem(first: &str, second: &str, what: &str) -> String {
    format!(
        "tables '{first}' and '{second}' would write {what}: read one of them in a pipeline \
         file of its own with another sink.table"
    )
}

fn fill_text(text: &mut Option<String>, name: &str) {
    if let Some(text) = text
        && text.contains(TABLE_PLACEHOLDER)
    {
        *text = text.replace(TABLE_PLACEHOLDER, name);
    }
}

/// The rules of `source.tables` (docs/config.md §1.5): a list of 1 to [`MAX_TABLES`] distinct
/// tables, each a table name or ARN; every place the tables' records or positions go names
/// `{table}`, so that no two tables share a file, a destination table or a topic; and what
/// one table's settings would name (an index, a key condition, a stream or export ARN) is
/// refused.
pub(super) fn validate(
    tables: Option<&[String]>,
    source: &SourceConfig,
    sink: &SinkConfig,
    state: &StateConfig,
    errors: &mut Vec<ConfigError>,
) {
    let mut fail = |path: &str, message: String| errors.push(ConfigError::new(path, message));
    // Tables found by `discover` keep its own rules (discovery::validate).
    let Some(tables) = tables else {
        return shared_rules(source, sink, state, &mut fail);
    };
    if tables.is_empty() {
        fail(
            "source.tables",
            "tables must list at least one table (or set table_name for one)".into(),
        );
    }
    if tables.len() > MAX_TABLES {
        fail(
            "source.tables",
            format!(
                "tables lists {} tables; at most {MAX_TABLES} fit one process: split them \
                 between pipeline files",
                tables.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (index, table) in tables.iter().enumerate() {
        let at = format!("source.tables[{index}]");
        let name = table_name_of(table);
        if let Some(problem) = table_name_problem(&name) {
            fail(&at, format!("'{table}' {problem}"));
        } else if !seen.insert(name.clone()) {
            fail(&at, format!("table '{name}' is listed twice"));
        }
    }
    if let Some((first, second, what)) = one_destination(sink, tables) {
        fail(
            "source.tables",
            one_destination_problem(first, second, what),
        );
    }
    for table in tables {
        if let Some(problem) = destination_name_problem(sink, table) {
            fail("sink.table", problem);
        }
    }
    shared_rules(source, sink, state, &mut fail);
}

/// The rules of several tables however they are named: what names one table is refused, and
/// every place records or positions go holds `{table}`.
fn shared_rules(
    source: &SourceConfig,
    sink: &SinkConfig,
    state: &StateConfig,
    fail: &mut impl FnMut(&str, String),
) {
    let one_table = |field: &str, what: &str| {
        format!(
            "{field} names {what} of one table, and the pipeline reads several (source.tables, \
             source.discover): use table_name, one pipeline file per table"
        )
    };
    if source.mode == Mode::Query {
        fail("source.mode", one_table("mode: query", "the key condition"));
    }
    if source.index_name.is_some() {
        fail("source.index_name", one_table("index_name", "an index"));
    }
    if source.stream_arn.is_some() {
        fail("source.stream_arn", one_table("stream_arn", "the stream"));
    }
    if source.snapshot.export_arn.is_some() {
        fail(
            "source.snapshot.export_arn",
            one_table("export_arn", "an export"),
        );
    }
    let needs = |field: &str, what: &str| {
        format!(
            "{field} must hold {TABLE_PLACEHOLDER} when the pipeline reads several tables: \
             otherwise every table would write {what}"
        )
    };
    match sink {
        SinkConfig::Jsonl(jsonl) => match &jsonl.path {
            JsonlTarget::Stdout => fail(
                "sink.path",
                "standard output cannot take several tables: set path to a file holding \
                 {table} (e.g. out/{table}.jsonl)"
                    .into(),
            ),
            JsonlTarget::File(path) if !holds_placeholder(path) => {
                fail("sink.path", needs("path", "the one file"));
            }
            JsonlTarget::File(_) => {}
        },
        SinkConfig::Sqlite(sqlite) => keyed_table(sqlite.keyed.table.as_deref(), fail),
        SinkConfig::Postgres(postgres) => keyed_table(postgres.keyed.table.as_deref(), fail),
        SinkConfig::Kafka(kafka) if !kafka.topic.contains(TABLE_PLACEHOLDER) => {
            fail(
                "sink.topic",
                needs(
                    "topic",
                    "one topic, where the keys of different tables collide",
                ),
            );
        }
        SinkConfig::Kafka(_) => {}
        SinkConfig::Parquet(parquet)
            if parquet
                .iceberg
                .as_ref()
                .is_some_and(|iceberg| !iceberg.table.contains(TABLE_PLACEHOLDER)) =>
        {
            fail(
                "sink.table",
                needs("table", "one Iceberg table, which takes one pipeline"),
            )
        }
        SinkConfig::Parquet(parquet)
            if parquet.iceberg.is_none() && !parquet.path.contains(TABLE_PLACEHOLDER) =>
        {
            fail(
                "sink.path",
                needs("path", "one location, whose commit log takes one pipeline"),
            )
        }
        SinkConfig::Parquet(_) => {}
        SinkConfig::Custom => fail(
            "sink.type",
            "a custom sink takes one table: build one Pipeline per table in code".into(),
        ),
    }
    if sink.keeps_position().is_none() && state.path_set && !holds_placeholder(&state.path) {
        fail("state.path", needs("path", "its position into one entry"));
    }

    fn keyed_table(table: Option<&str>, fail: &mut impl FnMut(&str, String)) {
        if let Some(table) = table
            && !table.contains(TABLE_PLACEHOLDER)
        {
            fail(
                "sink.table",
                format!(
                    "table must hold {TABLE_PLACEHOLDER} (or be left out: each table's own \
                     name) when the pipeline reads several tables; '{table}' would take \
                     every table's rows"
                ),
            );
        }
    }
}

fn holds_placeholder(path: &std::path::Path) -> bool {
    path.to_str()
        .is_some_and(|text| text.contains(TABLE_PLACEHOLDER))
}

/// Why `name` cannot be a DynamoDB table's name (3 to 255 characters from `A-Z a-z 0-9 _ . -`).
pub(super) fn table_name_problem(name: &str) -> Option<&'static str> {
    let valid = (3..=255).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    (!valid).then_some("is not a DynamoDB table name: 3-255 characters from A-Z a-z 0-9 _ . -")
}
