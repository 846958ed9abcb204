//! The pipeline file: YAML, `${ENV}` interpolation, strict types and validation (SPEC §1).
//!
//! [`load`] reads one file and [`parse`] does the rest, in this order:
//! 1. **Parse** the YAML (a syntax error is the only problem that stops at once).
//! 2. **Interpolate** `${VAR}` in string scalars (`interpolate`).
//! 3. **Type-check** by walking every section key by key (`fields`, `source`, `sink`): unknown
//!    keys, values of the wrong type and missing fields are all reported, and a bad field falls
//!    back to its default so the next stage still runs.
//! 4. **Validate**: the source rules 1–11 of SPEC §1.3 (`SourceConfig::validate`), then the
//!    pipeline rules (rule 12: name, sink, state).
//!
//! Nothing here touches the network or the state store, and the environment is read only
//! through the `env` function the caller passes.
//!
//! # Error handling
//! Every problem is one line, `config error: <path>: <message>`, in stage order and within a
//! stage in file order (see `fields`). Fields that are valid but do nothing in the chosen mode
//! are not errors: they become [`PipelineConfig::warnings`].

mod fields;
mod interpolate;
mod numbers;
mod sink;
mod source;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use ddbpipe_source::config::{ConfigError, OnGap, SourceConfig};
use yaml_serde::Value;

use self::fields::{Fields, Report, Stage};
// The public names of the config; the binary does not need to name every one of them.
#[allow(unused_imports)]
pub use self::sink::{
    JsonlConfig, JsonlTarget, KeyedConfig, PostgresConfig, SinkConfig, SqliteConfig, StateConfig,
};

/// The longest pipeline `name`.
const MAX_NAME_CHARS: usize = 128;

/// One pipeline, loaded and validated: what to read, where to write it, where the position
/// lives.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// The pipeline name: 1–128 characters from `A-Z a-z 0-9 _ . -`, not starting with `.`.
    /// It keys the stored position.
    pub name: String,
    /// The DynamoDB source.
    pub source: SourceConfig,
    /// Where records are written.
    pub sink: SinkConfig,
    /// Where the position is kept.
    pub state: StateConfig,
    /// Fields that are valid but have no effect in the chosen mode, one sentence each. `check`
    /// and `run` print them as warnings.
    pub warnings: Vec<String>,
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
    /// The file was read and has problems, all listed.
    Invalid(ConfigErrors),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, .. } => {
                write!(f, "cannot read config file {}", path.display())
            }
            LoadError::Invalid(errors) => errors.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Read { source, .. } => Some(source),
            // The lines are the whole message; repeating them as a source would print them twice.
            LoadError::Invalid(_) => None,
        }
    }
}

/// Loads, interpolates, type-checks and validates the pipeline file at `path`. `env` looks up
/// environment variables (`main` passes `std::env::var`, tests a closure).
pub fn load(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PipelineConfig, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
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
    let Some(mut top) = Fields::open(&mut report, "", document) else {
        return Err(ConfigErrors(report.into_errors()));
    };
    let name = top.required::<String>("name");
    let source = top.required_section("source").map(source::read_source);
    let sink = top.required_section("sink").and_then(sink::read_sink);
    let default_state = sink::default_state_path(config_dir, name.as_deref().unwrap_or(""));
    let state = sink::read_state(top.section("state"), default_state);
    top.finish();

    let mut errors = Vec::new();
    if let Some((source, _)) = &source {
        source.validate(&mut errors);
    }
    if let Some(name) = &name {
        validate_name(name, &mut errors);
    }
    if let (Some((source, _)), Some((sink, _))) = (&source, &sink) {
        validate_sink_for_source(source, sink, &mut errors);
    }
    if let Some((sink, _)) = &sink {
        sink::validate(sink, &state, &mut errors);
    }
    for error in errors {
        report.error(Stage::Validate, &error.path, error.message);
    }

    let errors = report.into_errors();
    match (name, source, sink) {
        (Some(name), Some((source, source_keys)), Some((sink, _))) if errors.is_empty() => {
            let warnings = source.ineffective_fields(&source_keys);
            Ok(PipelineConfig {
                name,
                source,
                sink,
                state,
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
    let mut document: Value = yaml_serde::from_str(text).map_err(|error| {
        match numbers::wide_integer(&error.to_string()) {
            Some((path, problem)) => ConfigErrors(vec![ConfigError::new(path, problem)]),
            None => invalid(error),
        }
    })?;
    let number_texts = numbers::texts(text, &document);
    document.apply_merge().map_err(invalid)?;
    Ok((document, number_texts))
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
    if matches!(sink, SinkConfig::Jsonl(_))
        && source.on_gap == OnGap::Resnapshot
        && source.resnapshot_deletes
    {
        errors.push(ConfigError::new(
            "source.resnapshot_deletes",
            "the jsonl sink cannot delete rows; set resnapshot_deletes: false or use a \
             sqlite/postgres sink",
        ));
    }
}
