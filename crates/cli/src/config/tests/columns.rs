//! Typed columns of the keyed sinks (issue 28, docs/sinks.md §7.9): `sink.columns`,
//! `document_column: null`, `on_type_mismatch`, and every rule of `sinks::keyed::columns`.

use ddbpipe_keyed::{ColumnType, OnMismatch, TimeFormat};
use ddbpipe_source::api::{KeyAttribute, KeyType, TableDescription};
use ddbpipe_value::ColumnPath;

use super::*;
use crate::sinks::keyed::columns::ColumnConfig;

/// A file with a `sink:` of `kind` (`sqlite` or `postgres`) holding `lines` (indented two
/// spaces under `sink:`).
fn keyed_file(kind: &str, lines: &str) -> String {
    let target = match kind {
        "postgres" => "url: 'host=h'",
        _ => "path: x.db",
    };
    let lines: String = lines.lines().map(|line| format!("  {line}\n")).collect();
    format!("name: t\nsource: {{table_name: orders}}\nsink:\n  type: {kind}\n  {target}\n{lines}")
}

fn keyed_of(kind: &str, lines: &str) -> KeyedConfig {
    match parse_ok(&keyed_file(kind, lines)).sink {
        SinkConfig::Sqlite(sqlite) => sqlite.keyed,
        SinkConfig::Postgres(postgres) => postgres.keyed,
        other => panic!("a keyed sink, not {other:?}"),
    }
}

fn keyed_errors(kind: &str, lines: &str) -> Vec<String> {
    errors(&keyed_file(kind, lines))
}

fn path(text: &str) -> ColumnPath {
    ColumnPath::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn typed_columns_are_read_in_order_with_their_formats() {
    let keyed = keyed_of(
        "postgres",
        "columns:\n\
         \x20 - {name: status, path: status, type: text}\n\
         \x20 - {name: total, path: total, type: numeric}\n\
         \x20 - {name: ratio, path: ratio, type: double precision}\n\
         \x20 - {name: created_at, path: created_at, type: timestamptz, format: epoch_millis}\n\
         \x20 - {name: city, path: address.city, type: text}\n\
         \x20 - {name: first_tag, path: 'tags[0]', type: jsonb}",
    );
    let column = |name: &str, path_text: &str, kind, format| ColumnConfig {
        name: name.into(),
        path: Some(path(path_text)),
        kind: Some(kind),
        format,
    };
    assert_eq!(
        keyed.columns,
        [
            column("status", "status", ColumnType::Text, None),
            column("total", "total", ColumnType::Numeric, None),
            column("ratio", "ratio", ColumnType::Double, None),
            column(
                "created_at",
                "created_at",
                ColumnType::Timestamptz,
                Some(TimeFormat::EpochMillis)
            ),
            column("city", "address.city", ColumnType::Text, None),
            column("first_tag", "tags[0]", ColumnType::Jsonb, None),
        ]
    );
    assert_eq!(keyed.document_column.as_deref(), Some("document"));
    assert_eq!(keyed.on_type_mismatch, OnMismatch::Null);
    let spec = keyed.columns[3].spec().expect("a complete column");
    assert_eq!(spec.time_format, TimeFormat::EpochMillis);
    // A timestamptz column without a format reads ISO 8601.
    let keyed = keyed_of(
        "sqlite",
        "columns: [{name: at, path: at, type: timestamptz}]",
    );
    let spec = keyed.columns[0].spec().expect("a complete column");
    assert_eq!(spec.time_format, TimeFormat::Iso8601);
}

#[test]
fn document_column_null_stores_no_document_and_unset_is_document() {
    assert_eq!(
        keyed_of("sqlite", "").document_column.as_deref(),
        Some("document")
    );
    assert_eq!(
        keyed_of("sqlite", "document_column: doc")
            .document_column
            .as_deref(),
        Some("doc")
    );
    let keyed = keyed_of(
        "postgres",
        "document_column: null\ncolumns: [{name: document, path: document, type: text}]",
    );
    assert_eq!(keyed.document_column, None);
    // With no document column, `document` is a name like any other.
    assert_eq!(keyed.columns[0].name, "document");
    assert_eq!(
        keyed_errors("sqlite", "document_column: ''"),
        [
            "config error: sink.document_column: document_column must not be empty (null stores no document)"
        ]
    );
    assert_eq!(
        keyed_errors("sqlite", "document_column: 5"),
        ["config error: sink.document_column: expected a string, found number 5"]
    );
}

#[test]
fn on_type_mismatch_is_null_or_fail_and_yaml_null_is_null() {
    for (text, policy) in [
        ("on_type_mismatch: fail", OnMismatch::Fail),
        ("on_type_mismatch: null", OnMismatch::Null),
        ("on_type_mismatch: 'null'", OnMismatch::Null),
        ("on_type_mismatch: ~", OnMismatch::Null),
        ("", OnMismatch::Null),
    ] {
        assert_eq!(keyed_of("sqlite", text).on_type_mismatch, policy, "{text}");
    }
    assert_eq!(
        keyed_errors("sqlite", "on_type_mismatch: skip"),
        ["config error: sink.on_type_mismatch: unknown value \"skip\", expected one of null, fail"]
    );
}

#[test]
fn a_column_needs_a_name_a_path_and_a_type() {
    assert_eq!(
        keyed_errors("sqlite", "columns: [{path: a}]"),
        [
            "config error: sink.columns[0].name: missing required field",
            "config error: sink.columns[0].type: missing required field",
        ]
    );
}

#[test]
fn columns_are_a_list_of_mappings_with_known_keys() {
    assert_eq!(
        keyed_errors("sqlite", "columns: {status: text}"),
        ["config error: sink.columns: expected a list, found a mapping"]
    );
    assert_eq!(
        keyed_errors(
            "sqlite",
            "columns: [x, {name: a, path: a, type: text, nmae: b}]"
        ),
        [
            "config error: sink.columns[1].nmae: unknown field (did you mean name?)",
            "config error: sink.columns[0]: expected a mapping, found string \"x\"",
        ]
    );
    // The other sinks have no typed columns.
    assert_eq!(
        errors("name: t\nsource: {table_name: o}\nsink: {type: jsonl, columns: []}\n"),
        ["config error: sink.columns: unknown field"]
    );
}

#[test]
fn a_column_path_that_does_not_parse_is_named_by_its_index() {
    let problem = ColumnPath::parse("a..b").expect_err("an empty name");
    assert_eq!(
        keyed_errors(
            "sqlite",
            "columns:\n\
             \x20 - {name: a, path: a, type: text}\n\
             \x20 - {name: b, path: b, type: text}\n\
             \x20 - {name: c, path: 'a..b', type: text}"
        ),
        [format!("config error: sink.columns[2].path: {problem}")]
    );
}

#[test]
fn an_unknown_column_type_lists_the_valid_ones() {
    assert_eq!(
        keyed_errors("sqlite", "columns: [{name: a, path: a, type: int}]"),
        [
            "config error: sink.columns[0].type: unknown type \"int\", expected one of text, \
             numeric, bigint, double, boolean, timestamptz, jsonb"
        ]
    );
    assert_eq!(
        keyed_errors("sqlite", "columns: [{name: a, path: a, type: bigin}]"),
        [
            "config error: sink.columns[0].type: unknown type \"bigin\", expected one of text, \
             numeric, bigint, double, boolean, timestamptz, jsonb (did you mean bigint?)"
        ]
    );
}

#[test]
fn a_format_is_known_and_only_on_a_timestamptz_column() {
    assert_eq!(
        keyed_errors(
            "sqlite",
            "columns: [{name: a, path: a, type: bigint, format: epoch_seconds}]"
        ),
        [
            "config error: sink.columns[0].format: format (epoch_seconds) applies only to \
             timestamptz columns; this one is bigint: remove format or make the type timestamptz"
        ]
    );
    assert_eq!(
        keyed_errors(
            "sqlite",
            "columns: [{name: a, path: a, type: timestamptz, format: rfc2822}]"
        ),
        [
            "config error: sink.columns[0].format: unknown value \"rfc2822\", expected one of \
             iso8601, epoch_seconds, epoch_millis"
        ]
    );
}

#[test]
fn a_column_name_is_not_empty_reserved_or_the_document_columns() {
    let one = |name: &str| format!("columns: [{{name: '{name}', path: a, type: text}}]");
    assert_eq!(
        keyed_errors("sqlite", &one("")),
        ["config error: sink.columns[0].name: name must not be empty"]
    );
    assert_eq!(
        keyed_errors("sqlite", &one("_ddbpipe_x")),
        [
            "config error: sink.columns[0].name: names starting with _ddbpipe_ are reserved \
             for ddbpipe's own columns"
        ]
    );
    assert_eq!(
        keyed_errors("postgres", &format!("document_column: doc\n{}", one("doc"))),
        [
            "config error: sink.columns[0].name: 'doc' is the document column's name \
             (sink.document_column); choose another name, or another document_column"
        ]
    );
    assert_eq!(
        keyed_errors("sqlite", &one("document")).len(),
        1,
        "the default document column counts"
    );
}

/// SQLite names compare without regard to ASCII case; PostgreSQL's as written.
#[test]
fn two_columns_of_one_name_are_refused_as_the_database_compares_names() {
    let two = "columns:\n\
               \x20 - {name: status, path: a, type: text}\n\
               \x20 - {name: Status, path: b, type: text}";
    assert_eq!(
        keyed_errors("sqlite", two),
        [
            "config error: sink.columns[1].name: column 'Status' is already sink.columns[0]; \
             each column needs a name of its own"
        ]
    );
    assert_eq!(keyed_of("postgres", two).columns.len(), 2);
    let same = two.replace("Status", "status");
    assert_eq!(keyed_errors("postgres", &same).len(), 1);
    assert_eq!(
        keyed_errors(
            "sqlite",
            "document_column: Doc\ncolumns: [{name: doc, path: a, type: text}]"
        )
        .len(),
        1
    );
}

#[test]
fn a_postgres_column_name_is_at_most_63_bytes() {
    let column = |name: &str| format!("columns: [{{name: {name}, path: a, type: text}}]");
    let longest = "a".repeat(63);
    let long = "é".repeat(32);
    assert_eq!(keyed_of("postgres", &column(&longest)).columns.len(), 1);
    assert_eq!(
        keyed_errors("postgres", &column(&long)),
        [format!(
            "config error: sink.columns[0].name: '{long}' is 64 bytes; PostgreSQL names are at \
             most 63 bytes (a longer one would be cut): choose a shorter name"
        )]
    );
    // SQLite has no such limit.
    assert_eq!(keyed_of("sqlite", &column(&long)).columns.len(), 1);
}

fn orders(keys: &[&str]) -> TableDescription {
    TableDescription {
        name: "orders".into(),
        arn: None,
        status: Some("ACTIVE".into()),
        item_count: None,
        size_bytes: None,
        billing_mode: None,
        key_schema: keys
            .iter()
            .map(|name| KeyAttribute {
                name: (*name).into(),
                key_type: KeyType::S,
            })
            .collect(),
        read_capacity_units: None,
        max_read_request_units: None,
        indexes: Vec::new(),
        stream: None,
    }
}

/// Rule 3 of `columns`: known only once the table is described (`check`, `run`).
#[test]
fn a_column_named_like_a_key_attribute_is_refused_when_the_table_is_known() {
    let file = |kind: &str, name: &str| {
        keyed_file(
            kind,
            &format!(
                "columns:\n\
                 \x20 - {{name: status, path: status, type: text}}\n\
                 \x20 - {{name: {name}, path: pk, type: text}}"
            ),
        )
    };
    let spec = |kind: &str, name: &str| {
        let config = parse_ok(&file(kind, name));
        crate::sinks::keyed::table_spec(config.target(), Some(&orders(&["pk", "sk"])))
            .map_err(|failure| failure.to_string())
    };
    assert_eq!(
        spec("postgres", "sk").expect_err("a key attribute's name"),
        "config error: sink.columns[1].name: 'sk' is key attribute 'sk' of table 'orders', \
         stored in a key column of its own already; choose another name or remove the column"
    );
    assert!(spec("sqlite", "PK").is_err(), "SQLite ignores case");
    assert!(spec("postgres", "PK").is_ok(), "PostgreSQL does not");
    let built = spec("sqlite", "pk_copy").expect("no clash");
    let names: Vec<&str> = built.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["status", "pk_copy"]);
    assert_eq!(built.document_column.as_deref(), Some("document"));
}
