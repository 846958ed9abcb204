//! The walker: pipeline rules, unknown and missing keys, strict types, fallbacks, suggestions.

use super::*;

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
            "source.on_gap: unknown value \"skip\", expected one of fail, resnapshot, repair",
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
