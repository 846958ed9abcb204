//! Loading pipeline files end to end: YAML text in, `PipelineConfig` or error lines out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ddbpipe_keyed::DocumentType;
use ddbpipe_source::config::{
    Credentials, Mode, OnGap, RetryConfig, Secret, SourceConfig, StartPosition,
};
use ddbpipe_value::{Number, Value as AttributeValue, ValueFormat};

use super::*;
use crate::sinks::{KeyedConfig, SqliteConfig};

fn env(name: &str) -> Option<String> {
    match name {
        "TABLE" => Some("orders".to_owned()),
        "NUMERIC_TABLE" => Some("2024".to_owned()),
        "SEGMENTS" => Some("8".to_owned()),
        "FLAG" => Some("true".to_owned()),
        "BIG" => Some("123456789012345678901234567".to_owned()),
        "SECRET" => Some("wJalrXUtnFEMI".to_owned()),
        _ => None,
    }
}

fn parse_ok(yaml: &str) -> PipelineConfig {
    parse(yaml, Path::new("conf"), &env).unwrap_or_else(|errors| panic!("{errors}\n---\n{yaml}"))
}

/// The error lines of an invalid file.
fn errors(yaml: &str) -> Vec<String> {
    match parse(yaml, Path::new("conf"), &env) {
        Ok(config) => panic!("expected errors, got {config:#?}\n---\n{yaml}"),
        Err(errors) => errors.to_string().lines().map(str::to_owned).collect(),
    }
}

/// A file around the given `source:` lines (table `orders` unless they name one, jsonl to
/// stdout).
fn with_source(lines: &str) -> String {
    let mut indented: String = lines.lines().map(|line| format!("  {line}\n")).collect();
    if !lines.contains("table_name:") {
        indented.insert_str(0, "  table_name: orders\n");
    }
    format!("name: t\nsource:\n{indented}sink:\n  type: jsonl\n")
}

fn source_of(lines: &str) -> SourceConfig {
    parse_ok(&with_source(lines)).source
}

fn source_errors(lines: &str) -> Vec<String> {
    errors(&with_source(lines))
}

const STREAMS: &str = "mode: streams\nidle_termination_secs: 5";

mod columns;
mod coordination;
mod credentials;
mod file;
mod interpolation;
mod kafka;
mod sinks;
mod source;
mod tables;
mod values;
mod walk;
