//! The source section: the contract example, defaults, every source rule, warnings.

use super::*;

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
    source.endpoint_url = Some("http://127.0.0.1:8000".parse().unwrap());
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
        tables: Vec::new(),
        discover: None,
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
        coordination: None,
        metrics: crate::config::MetricsConfig::default(),
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
        (
            source.batch_size,
            source.batch_max_bytes,
            source.value_format
        ),
        (1000, 32 * 1024 * 1024, ValueFormat::Plain)
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
        (
            "batch_max_bytes: 1000",
            "source.batch_max_bytes: batch_max_bytes must be 1024..=1073741824 (1 KiB to 1 GiB; \
             got 1000): it bounds the memory a batch holds",
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
            "read_concurrency: 0",
            "source.read_concurrency: read_concurrency must be at least 1",
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
            "mode: streams\nidle_termination_secs: 5\nmax_idle_poll_ms: 600001",
            "source.max_idle_poll_ms: max_idle_poll_ms must be at most 600000 (shard iterators \
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
    let streams = source_of(
        "mode: streams\nfollow: true\nrecords_per_request: 1\npoll_interval_ms: 600000\nmax_idle_poll_ms: 600000",
    );
    assert_eq!(
        (
            streams.records_per_request,
            streams.poll_interval_ms,
            streams.max_idle_poll_ms
        ),
        (1, 600_000, 600_000)
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
