//! Loading pipeline files end to end: YAML text in, `PipelineConfig` or error lines out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ddbpipe_keyed::DocumentType;
use ddbpipe_source::config::{
    Credentials, Mode, OnGap, RetryConfig, Secret, SourceConfig, StartPosition,
};
use ddbpipe_value::{Number, Value as AttributeValue, ValueFormat};

use super::*;

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

#[test]
fn the_cli_contract_example_parses_to_the_expected_struct() {
    let config = parse_ok(
        "name: orders-export
source:
  table_name: orders
  region: us-east-1
  endpoint_url: http://127.0.0.1:8000
  credentials: {type: access_key, config: {access_key_id: x, secret_access_key: y}}
  mode: scan
  segments: 4
sink:
  type: jsonl
  path: out/orders.jsonl
state:
  path: state/orders.state.json
",
    );
    let mut source = SourceConfig::new("orders");
    source.region = Some("us-east-1".into());
    source.endpoint_url = Some("http://127.0.0.1:8000".into());
    source.credentials = Credentials::AccessKey {
        access_key_id: "x".into(),
        secret_access_key: Secret::new("y"),
        session_token: None,
    };
    source.mode = Mode::Scan;
    source.segments = 4;
    let expected = PipelineConfig {
        name: "orders-export".into(),
        source,
        sink: SinkConfig::Jsonl(JsonlConfig {
            // Issue 11: relative to the directory of the pipeline file (`conf` here).
            path: JsonlTarget::File(PathBuf::from("conf/out/orders.jsonl")),
            rotate_bytes: None,
            fsync: true,
            write: WriteMode::Append,
            gzip: false,
        }),
        state: StateConfig {
            path: PathBuf::from("conf/state/orders.state.json"),
            flush_interval_ms: 1000,
            path_set: true,
        },
        warnings: vec![],
    };
    assert_eq!(config, expected);
}

#[test]
fn a_minimal_file_takes_every_documented_default() {
    let config = parse_ok("name: orders\nsource: {table_name: orders}\nsink: {type: jsonl}\n");
    let source = &config.source;
    assert_eq!(source, &SourceConfig::new("orders"));
    assert_eq!(source.credentials, Credentials::Default);
    assert_eq!(
        (source.mode, source.segments, source.max_concurrency),
        (Mode::Scan, 1, 8)
    );
    assert!(!source.consistent_read && source.scan_index_forward && !source.follow);
    assert_eq!((source.on_gap, source.start_position), (OnGap::Fail, None));
    assert!(source.resnapshot_deletes);
    assert_eq!(source.resnapshot_max_keys, 1_000_000);
    assert_eq!(
        (
            source.poll_interval_ms,
            source.records_per_request,
            source.shard_concurrency
        ),
        (1000, 1000, 4)
    );
    assert_eq!(source.discovery_interval_secs, 60);
    assert_eq!(source.retry, RetryConfig::default());
    assert_eq!(
        (source.retry.max_retries, source.retry.initial_backoff_ms),
        (8, 100)
    );
    assert_eq!(
        (source.retry.max_backoff_ms, source.retry.attempt_timeout_ms),
        (10_000, 30_000)
    );
    assert_eq!(
        (source.batch_size, source.value_format),
        (1000, ValueFormat::Plain)
    );
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!(
        (&jsonl.path, jsonl.rotate_bytes, jsonl.fsync),
        (&JsonlTarget::Stdout, None, true)
    );
    assert_eq!(
        config.state.path,
        Path::new("conf").join("orders.state.json")
    );
    assert_eq!(config.state.flush_interval_ms, 1000);
    assert!(config.warnings.is_empty());
}

#[test]
fn scenario_18_reports_every_problem_on_its_own_line_in_rule_order() {
    let lines = errors(
        "name: t
bogus: 1
source:
  table_name: orders
  segments: 0
  batch_size: 0
  resnapshot_deletes: \"false\"
sink:
  type: jsonl
",
    );
    assert_eq!(
        lines,
        [
            "config error: bogus: unknown field",
            "config error: source.resnapshot_deletes: expected a boolean (true or false), found \
             string \"false\"",
            "config error: source.batch_size: batch_size must be 1..=1000000 (got 0); 0 (one \
             batch for the whole run) is not supported: it holds the whole table in memory",
            "config error: source.segments: segments must be 1..=1000000 (got 0)",
        ]
    );
}

#[test]
fn query_without_a_key_condition_is_an_error() {
    assert_eq!(
        source_errors("mode: query"),
        [
            "config error: source.key_condition_expression: mode: query requires \
          key_condition_expression"
        ]
    );
}

#[test]
fn streams_without_a_way_to_terminate_is_an_error() {
    assert_eq!(
        source_errors("mode: streams"),
        [
            "config error: source.mode: mode: streams needs a way to terminate: set \
          idle_termination_secs, max_messages, or follow: true"
        ]
    );
    assert!(source_errors("mode: mirror")[0].contains("mode: mirror needs a way to terminate"));
    for ending in [
        "follow: true",
        "idle_termination_secs: 1",
        "max_messages: 1",
    ] {
        source_of(&format!("mode: streams\n{ending}"));
    }
}

#[test]
fn follow_with_idle_termination_is_an_error() {
    assert_eq!(
        source_errors("mode: streams\nfollow: true\nidle_termination_secs: 30"),
        [
            "config error: source.follow: follow: true runs until stopped; remove \
          idle_termination_secs/max_messages"
        ]
    );
}

#[test]
fn every_source_rule_reports_its_wording() {
    let cases: &[(&str, &str)] = &[
        // 1
        (
            "table_name: '  '",
            "source.table_name: table_name must not be empty",
        ),
        // 2
        (
            "batch_size: 1000001",
            "source.batch_size: batch_size must be 1..=1000000 (got 1000001)",
        ),
        // 3
        (
            "segments: 1000001",
            "source.segments: segments must be 1..=1000000 (got 1000001)",
        ),
        // 4
        (
            "mode: query\nkey_condition_expression: pk = :p\nsegments: 2",
            "source.segments: segments > 1 is not valid in mode: query",
        ),
        // 5
        (
            "max_concurrency: 0",
            "source.max_concurrency: max_concurrency must be at least 1",
        ),
        (
            "resnapshot_max_keys: 0",
            "source.resnapshot_max_keys: resnapshot_max_keys must be at least 1",
        ),
        (
            "page_limit: 0",
            "source.page_limit: page_limit must be at least 1",
        ),
        (
            "shard_concurrency: 0",
            "source.shard_concurrency: shard_concurrency must be at least 1",
        ),
        (
            "mode: streams\nidle_termination_secs: 0",
            "source.idle_termination_secs: idle_termination_secs must be at least 1",
        ),
        (
            "mode: streams\nmax_messages: 0",
            "source.max_messages: max_messages must be at least 1",
        ),
        // 6
        (
            "key_condition_expression: pk = :p",
            "source.key_condition_expression: key_condition_expression is only valid in query \
             mode (mode: scan)",
        ),
        // 7
        (
            "expression_attribute_names: {n: name}",
            "source.expression_attribute_names: key 'n' must start with '#'",
        ),
        (
            "projection: \"order_id, created_at, total\"",
            "source.projection: 'total' is a DynamoDB reserved word: write #total in the \
             expression and add expression_attribute_names: {\"#total\": total}",
        ),
        (
            "filter_expression: \"status = :s AND size(tags) > :n\"",
            "source.filter_expression: 'status' is a DynamoDB reserved word: write #status in \
             the expression and add expression_attribute_names: {\"#status\": status}",
        ),
        // 8
        (
            "expression_attribute_values: {v: 1}",
            "source.expression_attribute_values: key 'v' must start with ':'",
        ),
        (
            "expression_attribute_values_typed: {v: {S: a}}",
            "source.expression_attribute_values_typed: key 'v' must start with ':'",
        ),
        (
            "expression_attribute_values: {':k': 1}\nexpression_attribute_values_typed: {':k': {N: '1'}}",
            "source.expression_attribute_values_typed: ':k' is set in both \
             expression_attribute_values and expression_attribute_values_typed",
        ),
        // 9
        (
            "mode: streams\nidle_termination_secs: 5\nrecords_per_request: 1001",
            "source.records_per_request: records_per_request must be 1..=1000 (got 1001)",
        ),
        (
            "mode: streams\nidle_termination_secs: 5\nprojection: a\nfilter_expression: b = :b",
            "source.projection: projection, filter_expression do not apply to mode: streams",
        ),
        (
            "mode: mirror\nfollow: true\nindex_name: gsi",
            "source.index_name: index_name does not apply to mode: mirror",
        ),
        (
            "mode: streams\nidle_termination_secs: 5\npoll_interval_ms: 600001",
            "source.poll_interval_ms: poll_interval_ms must be at most 600000 (shard iterators \
             expire after 15 minutes); got 600001",
        ),
        (
            "mode: mirror\nfollow: true\nstart_position: latest",
            "source.start_position: start_position does not apply to mode: mirror (mirror \
             captures its own start positions)",
        ),
        // 10
        (
            "stream_arn: arn:aws:dynamodb:x",
            "source.stream_arn: stream_arn is only valid in streams and mirror modes",
        ),
        (
            "mode: query\nkey_condition_expression: pk = :p\nfollow: true",
            "source.follow: follow is only valid in streams and mirror modes",
        ),
        // 11
        (
            "max_read_units_per_second: 0",
            "source.max_read_units_per_second: max_read_units_per_second must be finite and \
             greater than 0 (got 0)",
        ),
        (
            "max_read_units_per_second: .inf",
            "source.max_read_units_per_second: max_read_units_per_second must be finite and \
             greater than 0 (got inf)",
        ),
        (
            "max_read_units_per_second: 1e-320",
            "source.max_read_units_per_second: max_read_units_per_second must be at least 0.01 \
             and at most 1e9 read units per second (got 1e-320)",
        ),
        (
            "read_capacity_fraction: 1e-300",
            "source.read_capacity_fraction: read_capacity_fraction must be at least 1e-6 (got \
             1e-300); for a fixed small rate set max_read_units_per_second",
        ),
        (
            "retry: {initial_backoff_ms: 20000, max_backoff_ms: 10000}",
            "source.retry.initial_backoff_ms: initial_backoff_ms (20000) must not be greater \
             than max_backoff_ms (10000)",
        ),
        (
            "read_capacity_fraction: 1.5",
            "source.read_capacity_fraction: read_capacity_fraction must be greater than 0 and at \
             most 1 (got 1.5)",
        ),
        (
            "retry: {attempt_timeout_ms: 999}",
            "source.retry.attempt_timeout_ms: attempt_timeout_ms must be 1000..=600000 (got 999)",
        ),
        (
            "discovery_interval_secs: 5",
            "source.discovery_interval_secs: discovery_interval_secs must be 10..=3600 (got 5)",
        ),
    ];
    for (lines, expected) in cases {
        assert_eq!(
            source_errors(lines),
            [format!("config error: {expected}")],
            "for source lines:\n{lines}"
        );
    }
}

#[test]
fn the_boundaries_of_the_ranges_are_valid() {
    let source = source_of(
        "segments: 1000000\nbatch_size: 1000000\nread_capacity_fraction: 1\n\
         max_read_units_per_second: 0.5\ndiscovery_interval_secs: 3600\n\
         retry: {attempt_timeout_ms: 1000}",
    );
    assert_eq!((source.segments, source.batch_size), (1_000_000, 1_000_000));
    assert_eq!(source.read_capacity_fraction, Some(1.0));
    let streams =
        source_of("mode: streams\nfollow: true\nrecords_per_request: 1\npoll_interval_ms: 600000");
    assert_eq!(
        (streams.records_per_request, streams.poll_interval_ms),
        (1, 600_000)
    );
}

#[test]
fn the_jsonl_write_mode_and_gzip_are_read() {
    let source = "source: {table_name: orders}\n";
    let config = parse_ok(&format!(
        "name: t\n{source}sink: {{type: jsonl, path: o.jsonl.gz, write: overwrite, gzip: true}}"
    ));
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!((jsonl.write, jsonl.gzip), (WriteMode::Overwrite, true));
    let config = parse_ok(&format!(
        "name: t\n{source}sink: {{type: jsonl, path: o.jsonl, write: new_file_per_run}}"
    ));
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!((jsonl.write, jsonl.gzip), (WriteMode::NewFilePerRun, false));
    assert_eq!(
        errors(&format!(
            "name: t\n{source}sink: {{type: jsonl, path: o.jsonl, write: truncate}}"
        )),
        [
            "config error: sink.write: unknown value \"truncate\", expected one of append, \
             overwrite, new_file_per_run (a run that replaces the file is `write: overwrite`)"
        ]
    );
}

#[test]
fn every_pipeline_rule_reports_its_wording() {
    let sink = "sink:\n  type: jsonl\n";
    let source = "source: {table_name: orders}\n";
    let long_name = "a".repeat(129);
    let cases = [
        (
            format!("name: .hidden\n{source}{sink}"),
            "name: name must not start with '.'",
        ),
        (
            format!("name: a b/c\n{source}{sink}"),
            "name: name may only contain A-Z, a-z, 0-9, '_', '.' and '-' (found \" /\")",
        ),
        (
            format!("name: ''\n{source}{sink}"),
            "name: name must not be empty",
        ),
        (
            format!("name: {long_name}\n{source}{sink}"),
            "name: name must be at most 128 characters (got 129)",
        ),
        (
            format!(
                "name: t\nsource: {{table_name: o, mode: streams, follow: true, on_gap: \
                 resnapshot}}\n{sink}"
            ),
            "source.resnapshot_deletes: the jsonl sink cannot delete rows; set \
             resnapshot_deletes: false or use a sqlite/postgres sink",
        ),
        (
            format!("name: t\n{source}sink: {{type: jsonl, path: o.jsonl, rotate_bytes: 1048575}}"),
            "sink.rotate_bytes: rotate_bytes must be at least 1048576 (got 1048575)",
        ),
        (
            format!("name: t\n{source}sink: {{type: jsonl, rotate_bytes: 1048576}}"),
            "sink.rotate_bytes: rotate_bytes needs a file path: stdout cannot be rotated",
        ),
        (
            format!("name: t\n{source}sink: {{type: jsonl, path: ''}}"),
            "sink.path: path must not be empty: use \"-\" for stdout or a file path",
        ),
        (
            format!("name: t\n{source}sink: {{type: jsonl, path: o.jsonl, gzip: true}}"),
            "sink.gzip: gzip: true needs write: overwrite or write: new_file_per_run: a gzip \
             file is written whole by one run, never appended to by the next",
        ),
        (
            format!("name: t\n{source}sink: {{type: jsonl, write: overwrite}}"),
            "sink.write: write: overwrite needs a file path: stdout cannot be replaced or renamed",
        ),
        (
            "name: t\nsource: {table_name: o, mode: streams, follow: true}\nsink: \
             {type: jsonl, path: o.jsonl, write: overwrite}"
                .to_string(),
            "sink.write: write: overwrite needs mode: scan or query: a streams run never \
             completes, so its file would never replace sink.path; use write: append or \
             new_file_per_run",
        ),
        (
            format!(
                "name: t\n{source}sink: {{type: jsonl, path: o.jsonl, write: new_file_per_run, \
                 rotate_bytes: 1048576}}"
            ),
            "sink.rotate_bytes: rotate_bytes needs write: append (got write: \
             new_file_per_run): rotated files are continued, never replaced",
        ),
    ];
    for (yaml, expected) in &cases {
        assert_eq!(
            errors(yaml),
            [format!("config error: {expected}")],
            "{yaml}"
        );
    }
    let names = ["a", "orders.v2_x-1", &"Z".repeat(128)];
    for name in names {
        assert_eq!(
            parse_ok(&format!("name: '{name}'\n{source}{sink}")).name,
            name
        );
    }
    let resnapshot = parse_ok(&format!(
        "name: t\nsource: {{table_name: o, mode: streams, follow: true, on_gap: resnapshot, \
         resnapshot_deletes: false}}\n{sink}"
    ));
    assert_eq!(resnapshot.source.on_gap, OnGap::Resnapshot);
}

#[test]
fn unknown_keys_are_reported_at_every_level() {
    let lines = errors(
        "name: t
source:
  table_name: orders
  bogus: 1
  retry: {max_retries: 2, jitter: true}
  credentials: {type: profile, config: {name: p, region: x}}
sink: {type: jsonl, format: csv}
state: {path: s.json, bogus: 1}
extra: 2
",
    );
    assert_eq!(
        lines,
        [
            "config error: source.credentials.config.region: unknown field",
            "config error: source.retry.jitter: unknown field",
            "config error: source.bogus: unknown field",
            "config error: sink.format: unknown field",
            "config error: state.bogus: unknown field",
            "config error: extra: unknown field",
        ]
    );
}

#[test]
fn missing_required_fields_are_reported() {
    assert_eq!(
        errors("source: {region: x}\n"),
        [
            "config error: name: missing required field",
            "config error: source.table_name: missing required field",
            "config error: sink: missing required field",
        ]
    );
    assert_eq!(
        errors("name: t\nsource: {table_name: o}\nsink: {path: x}\n"),
        ["config error: sink.type: missing required field"]
    );
}

#[test]
fn types_are_strict() {
    let cases = [
        (
            "segments: '8'",
            "source.segments: expected a whole number, found string \"8\"",
        ),
        (
            "segments: 1.5",
            "source.segments: expected a whole number, found number 1.5",
        ),
        (
            "segments: -1",
            "source.segments: expected a whole number from 0 to 4294967295, found number -1",
        ),
        (
            "consistent_read: yes",
            "source.consistent_read: expected a boolean (true or false), found string \"yes\"",
        ),
        (
            "consistent_read: ~",
            "source.consistent_read: expected a boolean (true or false), found null",
        ),
        (
            "region: 5",
            "source.region: expected a string, found number 5",
        ),
        (
            "mode: stream",
            // Issue 11: a near miss gets a suggestion.
            "source.mode: unknown value \"stream\", expected one of scan, query, streams, mirror \
             (did you mean streams?)",
        ),
        (
            "start_position: earliest",
            "source.start_position: unknown value \"earliest\", expected one of trim_horizon, \
             latest",
        ),
        (
            "on_gap: skip",
            "source.on_gap: unknown value \"skip\", expected one of fail, resnapshot",
        ),
        (
            "value_format: json",
            "source.value_format: unknown value \"json\", expected one of plain, typed",
        ),
        (
            "read_capacity_fraction: half",
            "source.read_capacity_fraction: expected a number, found string \"half\"",
        ),
        (
            "retry: 3",
            "source.retry: expected a mapping, found number 3",
        ),
        (
            "expression_attribute_names: {'#n': 1}",
            "source.expression_attribute_names.#n: expected a string, found number 1",
        ),
        ("1: x", "source: keys must be strings, found number 1"),
    ];
    for (lines, expected) in cases {
        assert_eq!(
            source_errors(lines),
            [format!("config error: {expected}")],
            "for source lines:\n{lines}"
        );
    }
    assert_eq!(
        errors("name: t\nsource: [a]\nsink: {type: jsonl}\n"),
        ["config error: source: expected a mapping, found a list"]
    );
}

#[test]
fn a_bad_value_falls_back_to_its_default_and_the_rest_is_still_validated() {
    assert_eq!(
        source_errors("mode: stream\nsegments: 0\nfollow: true"),
        [
            "config error: source.mode: unknown value \"stream\", expected one of scan, query, \
             streams, mirror (did you mean streams?)",
            "config error: source.segments: segments must be 1..=1000000 (got 0)",
            "config error: source.follow: follow is only valid in streams and mirror modes",
        ]
    );
}

#[test]
fn keyed_sinks_are_read_with_their_defaults() {
    let config = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: x.db}\n");
    assert_eq!(
        config.sink,
        SinkConfig::Sqlite(SqliteConfig {
            path: PathBuf::from("conf/x.db"),
            keyed: KeyedConfig {
                table: None,
                document_column: "document".into(),
                create_table: true,
            },
        })
    );
    let config = parse_ok(
        "name: t\nsource: {table_name: o}\nsink: {type: postgres, url: 'postgres://u:hunter22@h/db', schema: s, table: m, document_column: doc, create_table: false}\n",
    );
    let SinkConfig::Postgres(pg) = &config.sink else {
        panic!("a postgres sink");
    };
    assert_eq!(pg.url.expose(), "postgres://u:hunter22@h/db");
    assert_eq!(pg.schema, "s");
    assert_eq!(
        pg.keyed,
        KeyedConfig {
            table: Some("m".into()),
            document_column: "doc".into(),
            create_table: false,
        }
    );
    assert!(!format!("{config:?}").contains("hunter22"));
    assert_eq!(
        errors("name: t\nsource: {table_name: o}\nsink: {type: kafka}\n"),
        [
            "config error: sink.type: unknown value \"kafka\", expected one of jsonl, sqlite, postgres"
        ]
    );
}

/// Issue 9 item 3: `document_type` on postgres sinks, `jsonb` unless set.
#[test]
fn a_postgres_sink_takes_a_document_type() {
    let sink = |extra: &str| {
        format!(
            "name: t\nsource: {{table_name: o}}\nsink: {{type: postgres, url: 'host=h'{extra}}}\n"
        )
    };
    for (extra, want) in [
        ("", DocumentType::Jsonb),
        (", document_type: json", DocumentType::Json),
        (", document_type: text", DocumentType::Text),
        (", document_type: jsonb", DocumentType::Jsonb),
    ] {
        let config = parse_ok(&sink(extra));
        let SinkConfig::Postgres(pg) = &config.sink else {
            panic!("a postgres sink");
        };
        assert_eq!(pg.document_type, want, "{extra}");
    }
    assert_eq!(
        errors(&sink(", document_type: bson")),
        [
            "config error: sink.document_type: unknown value \"bson\", expected one of jsonb, json, \
             text (did you mean json?)"
        ]
    );
}

/// Issue 9 item 4(b): a misspelled libpq key is a config error naming the key, never the
/// value or the string.
#[test]
fn a_misspelled_connection_string_key_is_named_without_its_value() {
    for url in [
        "host=db user=app pasword=Wq7xK9zT dbname=app",
        "postgres://app@db/app?pasword=Wq7xK9zT",
    ] {
        let lines = errors(&format!(
            "name: t\nsource: {{table_name: o}}\nsink: {{type: postgres, url: '{url}'}}\n"
        ));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("config error: sink.url: unknown parameter 'pasword'"),
            "{lines:?}"
        );
        assert!(!lines[0].contains("Wq7"), "{lines:?}");
    }
}

#[test]
fn keyed_sinks_keep_the_position_in_their_database() {
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: x.db}\nstate: {path: s.json}\n"
        ),
        [
            "config error: state.path: the sqlite sink keeps the position in its database; remove state.path"
        ]
    );
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: o}\nsink: {type: postgres, url: '', document_column: _ddbpipe_x}\n"
        ),
        [
            "config error: sink.url: url must not be empty",
            "config error: sink.document_column: names starting with _ddbpipe_ are reserved for ddbpipe's own columns",
        ]
    );
    // Deletes need a keyed sink; with one, a resnapshot may delete.
    let ok = parse_ok(
        "name: t\nsource: {table_name: o, mode: mirror, idle_termination_secs: 1, on_gap: resnapshot}\nsink: {type: sqlite, path: x.db}\n",
    );
    assert!(ok.source.resnapshot_deletes);
}

#[test]
fn sink_and_state_fields_are_read() {
    let config = parse_ok(
        "name: t
source: {table_name: o}
sink: {type: jsonl, path: '-', fsync: false}
state: {flush_interval_ms: 0}
",
    );
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!((&jsonl.path, jsonl.fsync), (&JsonlTarget::Stdout, false));
    assert_eq!(config.state.path, Path::new("conf/t.state.json"));
    assert_eq!(config.state.flush_interval_ms, 0);
    let rotated = parse_ok(
        "name: t\nsource: {table_name: o}\nsink: {type: jsonl, path: /o/x.jsonl, rotate_bytes: 1048576}\n",
    );
    let SinkConfig::Jsonl(jsonl) = &rotated.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!(jsonl.path, JsonlTarget::File(PathBuf::from("/o/x.jsonl")));
    assert_eq!(jsonl.rotate_bytes, Some(1_048_576));
}

#[test]
fn interpolation_substitutes_variables_and_defaults() {
    let config = parse_ok(
        "name: ${TABLE}-export
source:
  table_name: ${TABLE}
  region: ${REGION:-eu-west-1}
  filter_expression: price > $${cheap}
  segments: ${SEGMENTS}
  consistent_read: ${FLAG}
  index_name: ${UNSET_INDEX:-}
sink: {type: jsonl}
",
    );
    assert_eq!(config.name, "orders-export");
    assert_eq!(config.source.table_name, "orders");
    assert_eq!(config.source.region.as_deref(), Some("eu-west-1"));
    assert_eq!(
        config.source.filter_expression.as_deref(),
        Some("price > ${cheap}")
    );
    assert_eq!(config.source.segments, 8);
    assert!(config.source.consistent_read);
    assert_eq!(config.source.index_name, None);
}

#[test]
fn a_number_from_a_variable_is_still_text_where_a_string_is_expected() {
    let config = parse_ok(
        "name: t
source:
  table_name: ${NUMERIC_TABLE}
  credentials: {type: access_key, config: {access_key_id: '${SEGMENTS}', secret_access_key: '${SEGMENTS}'}}
  expression_attribute_values: {':n': '${SEGMENTS}'}
  expression_attribute_values_typed: {':big': {N: '${BIG}'}}
sink: {type: jsonl}
",
    );
    let source = config.source;
    assert_eq!(source.table_name, "2024");
    let Credentials::AccessKey {
        access_key_id,
        secret_access_key,
        ..
    } = &source.credentials
    else {
        panic!("{:?}", source.credentials);
    };
    assert_eq!(
        (access_key_id.as_str(), secret_access_key.expose()),
        ("8", "8")
    );
    assert_eq!(
        source.expression_attribute_values[":n"],
        AttributeValue::N(Number::new("8"))
    );
    assert_eq!(
        source.expression_attribute_values_typed[":big"],
        AttributeValue::N(Number::new("123456789012345678901234567"))
    );
}

#[test]
fn an_unset_variable_is_an_error_naming_the_variable_and_the_path() {
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: '${NO_TABLE}', segments: '${NO_SEGMENTS}'}\nsink: {type: jsonl}\n"
        ),
        [
            "config error: source.table_name: environment variable NO_TABLE is not set (write \
             ${NO_TABLE:-default} to give a default)",
            "config error: source.segments: environment variable NO_SEGMENTS is not set (write \
             ${NO_SEGMENTS:-default} to give a default)",
        ]
    );
}

#[test]
fn keys_are_never_interpolated() {
    assert_eq!(
        errors("name: t\nsource: {table_name: o, '${TABLE}': 1}\nsink: {type: jsonl}\n"),
        ["config error: source.${TABLE}: unknown field"]
    );
    let source = source_of("expression_attribute_names: {'#${TABLE}': '${TABLE}'}");
    assert_eq!(
        source.expression_attribute_names,
        BTreeMap::from([("#${TABLE}".to_owned(), "orders".to_owned())])
    );
}

#[test]
fn interpolation_happens_before_type_checking() {
    assert_eq!(
        source_errors("segments: ${FLAG}"),
        ["config error: source.segments: expected a whole number, found boolean true"]
    );
    assert_eq!(
        source_errors("segments: x${SEGMENTS}"),
        ["config error: source.segments: expected a whole number, found string \"x8\""]
    );
}

#[test]
fn credentials_read_every_variant() {
    let cases = [
        ("{type: default}", Credentials::Default),
        ("{type: web_identity}", Credentials::WebIdentity),
        (
            "{type: profile, config: {name: prod}}",
            Credentials::Profile {
                name: "prod".into(),
            },
        ),
        (
            "{type: access_key, config: {access_key_id: AKIA, secret_access_key: '${SECRET}', \
             session_token: tok}}",
            Credentials::AccessKey {
                access_key_id: "AKIA".into(),
                secret_access_key: Secret::new("wJalrXUtnFEMI"),
                session_token: Some(Secret::new("tok")),
            },
        ),
        (
            "{type: assume_role, config: {role_arn: 'arn:aws:iam::1:role/r'}}",
            Credentials::AssumeRole {
                role_arn: "arn:aws:iam::1:role/r".into(),
                session_name: "ddbpipe".into(),
                external_id: None,
            },
        ),
        (
            "{type: assume_role, config: {role_arn: r, session_name: s, external_id: e}}",
            Credentials::AssumeRole {
                role_arn: "r".into(),
                session_name: "s".into(),
                external_id: Some("e".into()),
            },
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(
            source_of(&format!("credentials: {yaml}")).credentials,
            expected,
            "{yaml}"
        );
    }
}

#[test]
fn credentials_refuse_a_wrong_shape() {
    let cases = [
        (
            "{type: default, config: {name: x}}",
            vec!["source.credentials.config: credentials of type default take no config"],
        ),
        (
            "{type: profile}",
            vec!["source.credentials.config.name: missing required field"],
        ),
        (
            "{type: access_key, config: {access_key_id: a, secret_key: b}}",
            vec![
                "source.credentials.config.secret_key: unknown field",
                "source.credentials.config.secret_access_key: missing required field",
            ],
        ),
        (
            "{type: sso}",
            vec![
                // Issue 9 item 4(c): no value under credentials is shown, not even a type.
                "source.credentials.type: unknown value \"***\", expected one of default, \
                 profile, access_key, assume_role, web_identity",
            ],
        ),
        (
            "{config: {name: x}}",
            vec!["source.credentials.type: missing required field"],
        ),
    ];
    for (yaml, expected) in cases {
        let expected: Vec<String> = expected
            .iter()
            .map(|line| format!("config error: {line}"))
            .collect();
        assert_eq!(
            source_errors(&format!("credentials: {yaml}")),
            expected,
            "{yaml}"
        );
    }
}

#[test]
fn secrets_never_appear_in_debug_output_or_errors() {
    let credentials = source_of(
        "credentials: {type: access_key, config: {access_key_id: AKIAEXAMPLE, \
         secret_access_key: wJalrXUtnFEMI, session_token: sessiontok}}",
    )
    .credentials;
    let debug = format!("{credentials:?}");
    assert!(debug.contains("AKIAEXAMPLE"), "{debug}");
    assert!(debug.contains("***"), "{debug}");
    assert!(
        !debug.contains("wJalrXUtnFEMI") && !debug.contains("sessiontok"),
        "{debug}"
    );
    assert_eq!(Secret::new("x").to_string(), "***");

    let lines = source_errors(
        "credentials: {type: access_key, config: {access_key_id: a, secret_access_key: 12345}}",
    );
    assert_eq!(
        lines,
        [
            "config error: source.credentials.config.secret_access_key: expected a string, found a \
          number"
        ]
    );
}

#[test]
fn expression_values_are_converted_plain_and_typed() {
    let source = source_of(
        "mode: query
key_condition_expression: pk = :pk
expression_attribute_names: {'#s': status}
expression_attribute_values:
  ':pk': a
  ':n': 42
  ':f': 1.5
  ':t': true
  ':z': null
  ':l': [1, x]
  ':m': {k: -3}
expression_attribute_values_typed:
  ':b': {B: AQI=}
  ':ss': {SS: [x, y]}
",
    );
    let n = |text: &str| AttributeValue::N(Number::new(text));
    let plain = BTreeMap::from([
        (":pk".to_owned(), AttributeValue::S("a".into())),
        (":n".to_owned(), n("42")),
        (":f".to_owned(), n("1.5")),
        (":t".to_owned(), AttributeValue::Bool(true)),
        (":z".to_owned(), AttributeValue::Null),
        (
            ":l".to_owned(),
            AttributeValue::L(vec![n("1"), AttributeValue::S("x".into())]),
        ),
        (
            ":m".to_owned(),
            AttributeValue::M(BTreeMap::from([("k".to_owned(), n("-3"))])),
        ),
    ]);
    assert_eq!(source.expression_attribute_values, plain);
    let typed = BTreeMap::from([
        (":b".to_owned(), AttributeValue::B(vec![1, 2])),
        (
            ":ss".to_owned(),
            AttributeValue::Ss(vec!["x".into(), "y".into()]),
        ),
    ]);
    assert_eq!(source.expression_attribute_values_typed, typed);
    let merged = source.merged_expression_values();
    assert_eq!(merged.len(), 9);
    assert_eq!(merged[":b"], AttributeValue::B(vec![1, 2]));
    assert_eq!(merged[":n"], n("42"));
}

#[test]
fn a_typed_value_that_does_not_decode_names_the_key_and_the_problem() {
    let lines = source_errors("expression_attribute_values_typed: {':k': {N: 1}, ':b': {X: a}}");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with(
        "config error: source.expression_attribute_values_typed.:k: malformed typed attribute \
         value: "
    ));
    assert!(lines[1].starts_with(
        "config error: source.expression_attribute_values_typed.:b: malformed typed attribute \
         value: "
    ));
    assert_eq!(
        source_errors("expression_attribute_values: {':x': .nan}"),
        [
            "config error: source.expression_attribute_values.:x: expected a finite number, found \
          number .nan"
        ]
    );
}

#[test]
fn fields_without_effect_in_the_mode_become_warnings() {
    let scan = parse_ok(&with_source(
        "poll_interval_ms: 500\nscan_index_forward: false",
    ));
    assert_eq!(
        scan.warnings,
        [
            "source.scan_index_forward has no effect in mode: scan; it is ignored.",
            "source.poll_interval_ms has no effect in mode: scan; it is ignored.",
        ]
    );
    let streams = parse_ok(&with_source(&format!(
        "{STREAMS}\nsegments: 4\npage_limit: 10"
    )));
    assert_eq!(
        streams.warnings,
        [
            "source.segments has no effect in mode: streams with on_gap: fail (only a \
             resnapshot scans); it is ignored.",
            "source.page_limit has no effect in mode: streams with on_gap: fail (only a \
             resnapshot scans); it is ignored.",
        ]
    );
    let query = parse_ok(&with_source(
        "mode: query\nkey_condition_expression: pk = :p\nscan_index_forward: false\nmax_concurrency: 2",
    ));
    assert_eq!(
        query.warnings,
        ["source.max_concurrency has no effect in mode: query; it is ignored."]
    );
    let mirror = parse_ok(&with_source(
        "mode: mirror\nfollow: true\nsegments: 4\nresnapshot_max_keys: 10\nstart_position: ~",
    ));
    assert!(mirror.warnings.is_empty(), "{:?}", mirror.warnings);
}

#[test]
fn the_start_position_of_streams_is_read() {
    let source = source_of(&format!(
        "{STREAMS}\nstart_position: latest\nmax_messages: 10"
    ));
    assert_eq!(source.start_position, Some(StartPosition::Latest));
    assert_eq!(
        (source.idle_termination_secs, source.max_messages),
        (Some(5), Some(10))
    );
}

#[test]
fn a_file_that_is_not_a_pipeline_mapping_is_one_error() {
    assert_eq!(
        errors(""),
        ["config error: the file is empty: it needs name, source and sink"]
    );
    assert_eq!(
        errors("- a\n"),
        ["config error: expected a mapping, found a list"]
    );
    let syntax = errors("name: [unclosed\n");
    assert_eq!(syntax.len(), 1);
    assert!(
        syntax[0].starts_with("config error: invalid YAML: "),
        "{syntax:?}"
    );
}

#[test]
fn loading_reads_the_file_and_puts_the_state_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.yaml");
    std::fs::write(
        &path,
        "name: orders\nsource: {table_name: o}\nsink: {type: jsonl}\n",
    )
    .unwrap();
    let config = load(&path, &env).unwrap();
    assert_eq!(config.state.path, dir.path().join("orders.state.json"));

    let missing = dir.path().join("missing.yaml");
    let error = load(&missing, &env).unwrap_err();
    assert!(matches!(error, LoadError::Read { .. }));
    assert_eq!(
        error.to_string(),
        format!("cannot read config file {}", missing.display())
    );
    assert!(std::error::Error::source(&error).is_some());

    std::fs::write(
        &path,
        "name: orders\nsource: {table_name: o, bogus: 1}\nsink: {type: jsonl}\n",
    )
    .unwrap();
    let error = load(&path, &env).unwrap_err();
    assert_eq!(
        error.to_string(),
        "config error: source.bogus: unknown field"
    );
}

#[test]
fn plain_expression_numbers_are_sent_with_every_digit_of_their_text() {
    let source = source_of(
        "expression_attribute_values:\n  ':a': 123456789.123456789\n  ':b': 1.00000000000000001\n  \
         ':c': [1e3, {d: -0.000000000000000000001}]\n  ':e': 7\n  ':f': +2.50",
    );
    let values = &source.expression_attribute_values;
    let n = |text: &str| AttributeValue::N(Number::new(text));
    assert_eq!(values[":a"], n("123456789.123456789"));
    assert_eq!(values[":b"], n("1.00000000000000001"));
    assert_eq!(
        values[":c"],
        AttributeValue::L(vec![
            n("1e3"),
            AttributeValue::M([("d".to_string(), n("-0.000000000000000000001"))].into()),
        ])
    );
    assert_eq!(values[":e"], n("7"));
    assert_eq!(values[":f"], n("2.50"));
    // From `${…}` the substituted text is used.
    let config = parse(
        &with_source("expression_attribute_values: {':v': '${V}'}"),
        Path::new(""),
        &|name| (name == "V").then(|| "1.00000000000000001".to_string()),
    )
    .unwrap();
    assert_eq!(
        config.source.expression_attribute_values[":v"],
        n("1.00000000000000001")
    );
}

#[test]
fn a_plain_number_that_cannot_be_sent_exactly_is_refused_pointing_at_the_typed_map() {
    let lines = source_errors(
        "expression_attribute_values: {':big': 123456789012345678901234567890123456789012}",
    );
    assert_eq!(
        lines,
        ["config error: source.expression_attribute_values.:big: \
             123456789012345678901234567890123456789012 has 42 significant digits and DynamoDB \
             numbers have at most 38; write it as text in expression_attribute_values_typed, \
             e.g. {\":v\": {N: \"12.5\"}}"]
    );
    let lines = source_errors("expression_attribute_values: {':wide': 99999999999999999999}");
    assert_eq!(
        lines,
        [
            "config error: source.expression_attribute_values.:wide: the integer \
             99999999999999999999 is wider than 64 bits, which plain YAML values cannot hold; \
             write it as text in expression_attribute_values_typed, e.g. {\":v\": {N: \
             \"99999999999999999999\"}}"
        ]
    );
}

#[test]
fn a_byte_order_mark_is_not_content() {
    let text = format!("\u{feff}{}", with_source("segments: 2"));
    assert_eq!(parse_ok(&text).source.segments, 2);
}

#[test]
fn a_duplicate_key_is_reported_at_its_second_entry() {
    let block = "name: t\nsource:\n  table_name: orders\n  segments: 2\n  max_concurrency: 2\n  \
                 segments: 3\nsink:\n  type: jsonl\n";
    assert_eq!(
        errors(block),
        [
            "config error: invalid YAML: duplicate key \"segments\" in source at line 6 (first \
             at line 4); remove one of them"
        ]
    );
    let flow = "name: t\nsource: {table_name: orders,\n  segments: 2, segments: 3}\nsink:\n  type: jsonl\n";
    assert_eq!(
        errors(flow),
        [
            "config error: invalid YAML: duplicate key \"segments\" in source at line 3 (first \
             at line 3); remove one of them"
        ]
    );
    let top =
        "# a pipeline\nname: t\nsource: {table_name: orders}\nname: u\nsink:\n  type: jsonl\n";
    assert_eq!(
        errors(top),
        [
            "config error: invalid YAML: duplicate key \"name\" at line 4 (first at line 2); \
             remove one of them"
        ]
    );
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let flow = format!("name: t\nsource: {}", "[".repeat(100_000));
    let lines = errors(&flow);
    assert_eq!(
        lines,
        [
            "config error: invalid YAML: nested more than 64 levels deep at line 2; a pipeline \
             file is a few levels deep"
        ]
    );
    let block: String = (0..70)
        .map(|depth| format!("{}k{depth}:\n", " ".repeat(depth)))
        .collect();
    assert!(errors(&block)[0].contains("nested more than 64 levels deep at line 65"));
    // Brackets in quotes and comments do not count; a real file passes.
    let quoted = with_source(&format!(
        "filter_expression: \"{}\" # {}",
        "[".repeat(100),
        "{".repeat(100)
    ));
    assert_eq!(
        parse_ok(&quoted).source.filter_expression.unwrap().len(),
        100
    );
}

/// Every pipeline example of the README is a valid pipeline file (issue 11: its GSI query
/// example named the reserved word `total` bare and failed at run time).
#[test]
fn every_pipeline_example_in_the_readme_is_valid() {
    let readme = include_str!("../../../../README.md");
    let mut examples = 0;
    for block in readme.split("```yaml\n").skip(1) {
        let Some((yaml, _)) = block.split_once("```") else {
            continue;
        };
        if !yaml.starts_with("name:") {
            continue;
        }
        examples += 1;
        let parsed = parse(yaml, Path::new("/etc/ddbpipe"), &|_| Some("x".to_string()));
        if let Err(errors) = parsed {
            panic!("README example is invalid:\n{yaml}\n{errors}");
        }
    }
    assert!(examples >= 5, "found {examples} examples");
}

#[test]
fn a_mistyped_key_or_choice_gets_a_suggestion() {
    assert_eq!(
        source_errors("segmnets: 4\nmode: scna\nvalue_format: Typed\nbogus: 1"),
        [
            "config error: source.segmnets: unknown field (did you mean segments?)",
            "config error: source.bogus: unknown field",
            "config error: source.mode: unknown value \"scna\", expected one of scan, query, \
             streams, mirror (did you mean scan?)",
            "config error: source.value_format: unknown value \"Typed\", expected one of plain, \
             typed (did you mean typed?)",
        ]
    );
}

#[test]
fn a_scan_into_a_keyed_sink_warns_that_deleted_items_stay() {
    let config = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: x.db}\n");
    assert_eq!(
        config.warnings,
        [
            "mode: scan into the sqlite sink upserts the items it reads and deletes no row: rows of \
          items deleted from the table stay; use mode: mirror to keep an equal copy"
        ]
    );
    let mirror = parse_ok(
        "name: t\nsource: {table_name: o, mode: mirror, follow: true}\nsink: {type: sqlite, path: x.db}\n",
    );
    assert!(mirror.warnings.is_empty(), "{:?}", mirror.warnings);
    let jsonl = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: jsonl}\n");
    assert!(jsonl.warnings.is_empty());
}
