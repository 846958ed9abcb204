//! The pipeline file: YAML, `${ENV}` interpolation, strict types and validation (docs/config.md §1).
//!
//! [`load`] reads one file and [`parse`] does the rest, in this order:
//! 1. **Parse** the YAML (a syntax error is the only problem that stops at once).
//! 2. **Interpolate** `${VAR}` in string scalars (`interpolate`).
//! 3. **Type-check** by walking every section key by key (`fields`, `source`, `sink`): unknown
//!    keys, values of the wrong type and missing fields are all reported, and a bad field falls
//!    back to its default so the next stage still runs.
//! 4. **Validate**: the source rules 1–11 of docs/config.md §1.3 (`SourceConfig::validate`), then the
//!    pipeline rules (rule 12: name, sink, state).
//!
//! Nothing here touches the network or the state store, and the environment is read only
//! through the `env` function the caller passes.
//!
//! # Error handling
//! Every problem is one line, `config error: <path>: <message>`, in stage order and within a
//! stage in file order (see `fields`). Fields that are valid but do nothing in the chosen mode
//! are not errors: they become [`PipelineConfig::warnings`].

mod coordination;
mod credentials;
mod discovery;
mod interpolate;
mod metrics;
mod numbers;
#[cfg(test)]
mod schema_tests;
mod source;
mod state;
mod tables;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use ddbpipe_source::config::{ConfigError, Mode, SnapshotEngine, SourceConfig};
use yaml_serde::Value;

pub use self::coordination::{CoordinationConfig, process_token};
pub use self::discovery::Discovery;
pub use self::metrics::MetricsConfig;
pub use self::state::StateConfig;
pub use self::tables::{NAME_SEPARATOR, TABLE_PLACEHOLDER};
pub(crate) use self::tables::{destination_name_problem, one_destination};
use crate::failure::Failure;
use crate::origin::Origin;
use crate::sinks;
pub use crate::sinks::{JsonlConfig, JsonlTarget, SinkConfig, WriteMode, stale_rows_warning};
use crate::yaml::fields::{Fields, Report, Stage};
use crate::yaml::schema::{Field, Shape, of, optional, required};

/// The longest pipeline `name`.
const MAX_NAME_CHARS: usize = 128;
/// The largest pipeline file read, in bytes (4 MiB; real ones are a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// The deepest nesting of mappings and lists a pipeline file may have (real ones have ~5).
const MAX_NESTING: usize = 64;

/// A config that cannot be loaded, with the remedy the command prints.
pub fn load_failure(error: LoadError, origin: &Origin) -> Failure {
    match (error, origin) {
        (error @ (LoadError::Read { .. } | LoadError::TooLarge { .. }), _) => Failure::usage(error),
        (error, Origin::File(path)) => Failure::usage(error).hint(format!(
            "fix the lines above in {}; `ddbpipe check {}` shows them again",
            path.display(),
            path.display()
        )),
        (error, Origin::Code) => {
            Failure::usage(error).hint("fix the fields above in the YAML given in code")
        }
    }
}

/// The JSON Schema of the pipeline file (`ddbpipe schema`), from its declared fields.
pub fn json_schema() -> serde_json::Value {
    crate::yaml::schema::json_schema(TOP)
}

/// The top level of the pipeline file (docs/config.md §1.1).
static TOP: &[Field] = &[
    required(
        "name",
        of::<String>(),
        "The pipeline name: 1-128 characters from A-Z a-z 0-9 _ . -, not starting with '.'; it \
         keys the stored position.",
    ),
    required(
        "source",
        Shape::Section(source::SOURCE),
        "The DynamoDB table to read, and how (docs/config.md §1.2).",
    ),
    required(
        "sink",
        sinks::SINK,
        "Where the records are written (docs/sinks.md §7).",
    ),
    optional(
        "state",
        Shape::Section(state::STATE),
        "Where the position of a jsonl pipeline is kept (docs/state.md §6.1).",
    ),
    optional(
        "coordination",
        Shape::Section(coordination::COORDINATION),
        "Several workers share the pipeline's work through a lease table; absent: one process \
         (docs/coordination.md §11.10).",
    ),
    optional(
        "metrics",
        Shape::Section(metrics::METRICS),
        "How the metrics listener of --metrics-addr judges the run's health (docs/cli.md §8.6).",
    ),
];

/// One pipeline, loaded and validated: what to read, where to write it, where the position
/// lives.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// The pipeline name: 1–128 characters from `A-Z a-z 0-9 _ . -`, not starting with `.`.
    /// It keys the stored position.
    pub name: String,
    /// The DynamoDB source. Of a file of several tables (`tables`), `table_name` is empty:
    /// each table's pipeline ([`PipelineConfig::per_table`]) names its own.
    pub source: SourceConfig,
    /// `source.tables`: the tables of a file that lists several, each read by a pipeline of
    /// its own ([`PipelineConfig::per_table`]); empty for one table (`source.table_name`).
    /// With `discover`, the tables found ([`PipelineConfig::with_tables`]).
    pub tables: Vec<String>,
    /// `source.discover`: the tables are found by name pattern and tag
    /// (`crate::discover::discovered`), and looked for again at its interval while a run goes.
    pub discover: Option<Discovery>,
    /// Where records are written.
    pub sink: SinkConfig,
    /// Where the position is kept.
    pub state: StateConfig,
    /// The lease table several workers share the work through; `None`: one process.
    pub coordination: Option<CoordinationConfig>,
    /// How `/health` on the metrics listener judges the run.
    pub metrics: MetricsConfig,
    /// Fields that are valid but have no effect in the chosen mode, one sentence each. `check`
    /// and `run` print them as warnings.
    pub warnings: Vec<String>,
}

impl PipelineConfig {
    /// What building its sink reads: its name, source and sink section.
    pub fn target(&self) -> sinks::Target<'_> {
        sinks::Target {
            pipeline: &self.name,
            source: &self.source,
            sink: &self.sink,
        }
    }
}

/// Every problem of a config file, in report order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Why a config file could not be loaded.
// Written by hand: the cli crate does not depend on thiserror.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read (missing, unreadable, not UTF-8).
    Read {
        /// The config file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The file is larger than a pipeline file can be ([`MAX_CONFIG_BYTES`]).
    TooLarge {
        /// The config file.
        path: PathBuf,
    },
    /// The file was read and has problems, all listed.
    Invalid(ConfigErrors),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, .. } => {
                write!(f, "cannot read config file {}", path.display())
            }
            LoadError::TooLarge { path } => write!(
                f,
                "config file {} is larger than {} MiB: that is not a pipeline file",
                path.display(),
                MAX_CONFIG_BYTES >> 20
            ),
            LoadError::Invalid(errors) => errors.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Read { source, .. } => Some(source),
            // The lines are the whole message; repeating them as a source would print them twice.
            LoadError::Invalid(_) | LoadError::TooLarge { .. } => None,
        }
    }
}

/// Loads, interpolates, type-checks and validates the pipeline file at `path`. `env` looks up
/// environment variables (`main` passes `std::env::var`, tests a closure).
pub fn load(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PipelineConfig, LoadError> {
    let read_error = |source| LoadError::Read {
        path: path.to_owned(),
        source,
    };
    // Bounded: `/dev/zero` or a runaway file must not be read into memory whole.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(LoadError::TooLarge {
            path: path.to_owned(),
        });
    }
    let text = String::from_utf8(bytes)
        .map_err(|error| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, error)))?;
    let config_dir = path.parent().unwrap_or(Path::new(""));
    parse(&text, config_dir, env).map_err(LoadError::Invalid)
}

/// [`load`] without the file: `text` is its content and `config_dir` its directory (for the
/// default state path).
pub fn parse(
    text: &str,
    config_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PipelineConfig, ConfigErrors> {
    let (mut document, number_texts) = parse_yaml(text)?;
    let mut report = Report::default();
    report.number_texts = number_texts;
    interpolate::interpolate(&mut document, "", env, &mut report);

    if document.is_null() {
        let message = "the file is empty: it needs name, source and sink";
        return Err(ConfigErrors(vec![ConfigError::new("", message)]));
    }
    let Some(mut top) = Fields::open(&mut report, "", document, TOP) else {
        return Err(ConfigErrors(report.into_errors()));
    };
    let name = top.required::<String>("name");
    let mut tables = None;
    let mut discover = None;
    let source = top
        .required_section("source")
        .map(|f| source::read_source(f, &mut tables, &mut discover));
    let sink = top.required_section("sink").and_then(sinks::read_sink);
    let several = tables.is_some() || discover.is_some();
    let state_name = match several {
        // One entry per table: `<name>.<table>.state.json`.
        true => format!("{}.{TABLE_PLACEHOLDER}", name.as_deref().unwrap_or("")),
        false => name.clone().unwrap_or_default(),
    };
    let default_state = state::default_state_path(config_dir, &state_name);
    let mut state = state::read_state(top.section("state"), default_state);
    // The default state path is built in `config_dir` already.
    if state.path_set {
        crate::yaml::anchor(config_dir, &mut state.path);
    }
    let coordination = top.section("coordination").map(coordination::read);
    let metrics = metrics::read(top.section("metrics"));
    top.finish();
    let mut sink = sink;
    if let Some((sink, _)) = &mut sink {
        sinks::anchor_paths(config_dir, sink);
        if let SinkConfig::Postgres(postgres) = sink {
            postgres.environment = ddbpipe_keyed::LIBPQ_ENVIRONMENT
                .iter()
                .filter_map(|(variable, parameter)| {
                    env(variable)
                        .filter(|value| !value.is_empty())
                        .map(|value| (*parameter, ddbpipe_source::config::Secret::new(value)))
                })
                .collect();
        }
    }

    let mut source = source;
    if let (Some((source, keys)), Some((sink, _))) = (&mut source, &sink)
        && !keys.contains("batch_size")
        && matches!(
            sink,
            SinkConfig::Sqlite(_)
                | SinkConfig::Postgres(_)
                | SinkConfig::Kafka(_)
                | SinkConfig::Parquet(_)
        )
    {
        // A keyed sink commits a transaction per batch, the kafka sink a transaction (or waits
        // for the broker's acknowledgements) per batch, the parquet sink encodes a record
        // batch per batch: larger batches by default (docs/config.md).
        source.batch_size = ddbpipe_source::config::defaults::KEYED_BATCH_SIZE;
    }
    if let (Some((source, _)), Some((sink, _))) = (&mut source, &sink) {
        // The position commits with each batch exactly once: a scan page is never split, so a
        // resumed scan never re-sends a committed record (docs/scan.md §2.5).
        source.whole_pages = sink.commits_position_with_records();
    }
    if let (Some((source, _)), Some((SinkConfig::Postgres(postgres), _))) = (&mut source, &sink) {
        // A json/jsonb document keeps numbers as exact numeric: plain records get every number
        // as a JSON number of its own digits (docs/values.md §3.7). The spelling stays `plain`,
        // so the pipeline's identity does not change.
        source.value_format = postgres.document_type.value_format(source.value_format);
    }
    let mut errors = Vec::new();
    if let Some((source, _)) = &source {
        match several {
            // The rules of one table hold for each: checked on the first one's settings.
            true => {
                let mut first = source.clone();
                first.table_name = tables
                    .as_ref()
                    .and_then(|listed| listed.first().cloned())
                    .unwrap_or_else(|| "-".into());
                first.validate(&mut errors);
            }
            false => source.validate(&mut errors),
        }
    }
    if let (true, Some((source, _)), Some((sink, _))) = (several, &source, &sink) {
        tables::validate(tables.as_deref(), source, sink, &state, &mut errors);
    }
    if let Some(discover) = &discover {
        discovery::validate(discover, &mut errors);
    }
    if let Some(name) = &name {
        validate_name(name, &mut errors);
    }
    if let (Some((source, _)), Some((sink, _))) = (&source, &sink) {
        validate_sink_for_source(source, sink, &mut errors);
    }
    if let Some((sink, _)) = &sink {
        sinks::validate(sink, &mut errors);
        state::validate(&state, sink, &mut errors);
    }
    // A section that failed interpolation was not read: its absence proves nothing (a
    // `{worker}` path is not "without a coordination section").
    let coordination_unread = coordination.is_none() && report.interpolation_failed("coordination");
    if let (Some((source, _)), Some((sink, _)), false) = (&source, &sink, coordination_unread) {
        coordination::validate(coordination.as_ref(), source, sink, &mut errors);
    }
    metrics::validate(&metrics, &mut errors);
    for error in errors {
        report.error(Stage::Validate, &error.path, error.message);
    }

    let errors = report.into_errors();
    match (name, source, sink) {
        (Some(name), Some((mut source, source_keys)), Some((mut sink, _))) if errors.is_empty() => {
            let mut state = state;
            if !several {
                // `{table}` in one table's file is its table's name.
                tables::fill_table(&mut sink, &mut state, &source.table_name);
            }
            if source.snapshot.engine == SnapshotEngine::Export
                && source.snapshot.s3_prefix.is_none()
            {
                source.snapshot.s3_prefix = Some(format!("ddbpipe/{name}"));
            }
            let mut warnings = source.ineffective_fields(&source_keys);
            if let Some(warning) = sinks::stale_rows_warning(&source, &sink) {
                warnings.push(warning);
            }
            if coordination.is_some() && state.path_set {
                warnings.push(
                    "state.path has no effect with coordination: a shared run keeps its \
                     position in the lease rows (state.flush_interval_ms still spaces their \
                     checkpoints)"
                        .to_string(),
                );
            }
            Ok(PipelineConfig {
                name,
                source,
                tables: tables.unwrap_or_default(),
                discover,
                sink,
                state,
                coordination,
                metrics,
                warnings,
            })
        }
        _ => Err(ConfigErrors(errors)),
    }
}

/// Parses the YAML text and applies `<<` merge keys; also returns the text of the numbers
/// of `expression_attribute_values` (`numbers`).
fn parse_yaml(text: &str) -> Result<(Value, BTreeMap<String, String>), ConfigErrors> {
    let invalid = |error: yaml_serde::Error| {
        ConfigErrors(vec![ConfigError::new("", format!("invalid YAML: {error}"))])
    };
    // A UTF-8 byte order mark (some editors write one) is not content.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some(line) = too_deep(text, MAX_NESTING) {
        return Err(ConfigErrors(vec![ConfigError::new(
            "",
            format!(
                "invalid YAML: nested more than {MAX_NESTING} levels deep at line {line}; a \
                 pipeline file is a few levels deep"
            ),
        )]));
    }
    let mut document: Value = yaml_serde::from_str(text).map_err(|error| {
        let message = error.to_string();
        if let Some((path, problem)) = numbers::wide_integer(&message) {
            return ConfigErrors(vec![ConfigError::new(path, problem)]);
        }
        match duplicate_key(text, &message) {
            Some(problem) => ConfigErrors(vec![ConfigError::new("", problem)]),
            None => invalid(error),
        }
    })?;
    let number_texts = numbers::texts(text, &document);
    document.apply_merge().map_err(invalid)?;
    Ok((document, number_texts))
}

/// The parser's duplicate-key error (`<path>: duplicate entry with key "k" at line L column
/// C`) names where the mapping starts; this finds the lines of the key's first and second
/// entries in that mapping, for a message that points at the duplicate. `None` when the
/// error is another one, or the lines cannot be found (the parser's message stands).
fn duplicate_key(text: &str, message: &str) -> Option<String> {
    const DUPLICATE: &str = "duplicate entry with key \"";
    let lines: Vec<&str> = text.lines().collect();
    let (path, rest) = match message.strip_prefix(DUPLICATE) {
        Some(rest) => ("", rest),
        None => message.split_once(&format!(": {DUPLICATE}"))?,
    };
    let (key, line, column) = match rest.split_once("\" at line ") {
        Some((key, location)) => {
            let (line, column) = location.split_once(" column ")?;
            let column = column.split_whitespace().next()?;
            (key, line.parse().ok()?, column.parse().ok()?)
        }
        // The top-level mapping without a location: it starts at the first line with content.
        None => {
            let first = lines.iter().position(|l| {
                let l = l.trim();
                !(l.is_empty() || l.starts_with('#') || l.starts_with("---"))
            })?;
            (rest.strip_suffix('"')?, first + 1, 1usize)
        }
    };
    let start = lines.get(line.checked_sub(1)?)?;
    let is_entry = |content: &str| {
        [
            format!("{key}:"),
            format!("\"{key}\":"),
            format!("'{key}':"),
        ]
        .iter()
        .any(|entry| content.starts_with(entry.as_str()))
    };
    let mut found = Vec::new();
    if start.get(column.checked_sub(1)?..)?.starts_with('{') {
        // A flow mapping: entries follow `{` or `,` on the lines from its start.
        for (offset, text_line) in lines[line - 1..].iter().enumerate() {
            let from = if offset == 0 { column } else { 0 };
            for piece in text_line.get(from..).unwrap_or("").split([',', '{']) {
                if is_entry(piece.trim_start()) {
                    found.push(line + offset);
                }
            }
            if found.len() >= 2 {
                break;
            }
        }
    } else {
        // A block mapping: entries sit at its column until a line is indented less.
        let indent = column - 1;
        for (offset, text_line) in lines[line - 1..].iter().enumerate() {
            let content = text_line.trim_start();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let at = text_line.len() - content.len();
            if at < indent && offset > 0 {
                break;
            }
            if at == indent && is_entry(content) {
                found.push(line + offset);
            }
        }
    }
    let [first, second, ..] = found[..] else {
        return None;
    };
    let within = if path.is_empty() || path == "." {
        String::new()
    } else {
        format!(" in {path}")
    };
    Some(format!(
        "invalid YAML: duplicate key \"{key}\"{within} at line {second} (first at line {first}); \
         remove one of them"
    ))
}

/// The first line (1-based) at which `text` nests flow collections (`[`, `{`) and block
/// indentation deeper than `limit`, if any. Checked before parsing, which takes time
/// quadratic in the depth. Quoted scalars and comments are skipped; a bracket inside a plain
/// scalar counts, which only makes the bound stricter for files far beyond any real one.
fn too_deep(text: &str, limit: usize) -> Option<usize> {
    let mut flow = 0usize;
    let mut indents: Vec<usize> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let content = line.trim_start_matches([' ', '-']);
        if flow == 0 && !content.is_empty() && !content.starts_with('#') {
            let indent = line.len() - content.len();
            while indents.last().is_some_and(|&top| top >= indent) {
                indents.pop();
            }
            indents.push(indent);
        }
        let mut quote = None;
        let mut previous = ' ';
        for c in line.chars() {
            match (quote, c) {
                (Some(q), _) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(c),
                (None, '#') if previous.is_whitespace() => break,
                (None, '[' | '{') => flow += 1,
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
            previous = c;
        }
        if flow + indents.len() > limit {
            return Some(number + 1);
        }
    }
    None
}

/// Rule 12: `name` is 1–128 characters from `[A-Za-z0-9_.-]`, not starting with `.`.
fn validate_name(name: &str, errors: &mut Vec<ConfigError>) {
    let mut fail = |message: String| errors.push(ConfigError::new("name", message));
    if name.is_empty() {
        fail("name must not be empty".into());
        return;
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        fail(format!(
            "name must be at most {MAX_NAME_CHARS} characters (got {chars})"
        ));
    }
    let mut bad: Vec<char> = name
        .chars()
        .filter(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .collect();
    bad.dedup();
    if !bad.is_empty() {
        let bad: String = bad.into_iter().collect();
        fail(format!(
            "name may only contain A-Z, a-z, 0-9, '_', '.' and '-' (found {bad:?})"
        ));
    }
    if name.starts_with('.') {
        fail("name must not start with '.'".into());
    }
}

/// Rule 12: the source and the sink must agree.
fn validate_sink_for_source(
    source: &SourceConfig,
    sink: &SinkConfig,
    errors: &mut Vec<ConfigError>,
) {
    // One table's name (several tables': `tables::validate`, `discover::each_table`).
    if !source.table_name.is_empty()
        && let Some(problem) = tables::destination_name_problem(sink, &source.table_name)
    {
        errors.push(ConfigError::new("sink.table", problem));
    }
    if sink.keyed().is_none() && source.on_gap.may_resnapshot() && source.resnapshot_deletes {
        errors.push(ConfigError::new(
            "source.resnapshot_deletes",
            format!(
                "the {} sink cannot delete rows; set resnapshot_deletes: false or use a \
                 sqlite/postgres sink",
                sink.kind()
            ),
        ));
    }
    if let SinkConfig::Jsonl(jsonl) = sink
        && jsonl.write == WriteMode::Overwrite
        && !matches!(source.mode, Mode::Scan | Mode::Query)
    {
        errors.push(ConfigError::new(
            "sink.write",
            format!(
                "write: overwrite needs mode: scan or query: a {} run never completes, so its \
                 file would never replace sink.path; use write: append or new_file_per_run",
                source.mode
            ),
        ));
    }
}
