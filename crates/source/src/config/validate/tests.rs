//! Tests of the source configuration's validation rules.

use std::collections::BTreeMap;

use ddbpipe_value::Value;

use super::*;
use crate::config::StartPosition;

fn paths(config: &SourceConfig) -> Vec<String> {
    let mut errors = Vec::new();
    config.validate(&mut errors);
    errors.into_iter().map(|error| error.path).collect()
}

#[test]
fn a_config_at_its_defaults_is_valid_and_warns_about_nothing() {
    let config = SourceConfig::new("orders");
    assert!(paths(&config).is_empty());
    let every_field: BTreeSet<String> = ["segments", "consistent_read", "batch_size"]
        .map(String::from)
        .into();
    assert!(config.ineffective_fields(&every_field).is_empty());
}

#[test]
fn every_failing_rule_is_reported_in_rule_order() {
    let mut config = SourceConfig::new(" ");
    config.batch_size = 0;
    config.segments = 0;
    config.page_limit = Some(0);
    config.key_condition_expression = Some("pk = :p".into());
    config.expression_attribute_names = BTreeMap::from([("n".into(), "name".into())]);
    config.expression_attribute_values = BTreeMap::from([(":v".into(), Value::Null)]);
    config.expression_attribute_values_typed = BTreeMap::from([(":v".into(), Value::Null)]);
    config.follow = true;
    config.discovery_interval_secs = 0;
    assert_eq!(
        paths(&config),
        [
            "source.table_name",
            "source.batch_size",
            "source.segments",
            "source.page_limit",
            "source.key_condition_expression",
            "source.expression_attribute_names",
            "source.expression_attribute_values_typed",
            "source.follow",
            "source.discovery_interval_secs",
        ]
    );
}

#[test]
fn a_batch_byte_bound_outside_1_kib_to_1_gib_is_refused() {
    for (bytes, refused) in [
        (0, true),
        (1023, true),
        (1024, false),
        (1 << 30, false),
        ((1 << 30) + 1, true),
    ] {
        let mut config = SourceConfig::new("orders");
        config.batch_max_bytes = bytes;
        let want: &[&str] = if refused {
            &["source.batch_max_bytes"]
        } else {
            &[]
        };
        assert_eq!(paths(&config), want, "{bytes}");
    }
}

#[test]
fn the_streams_rules_are_reported_in_their_order() {
    let mut config = SourceConfig::new("orders");
    config.mode = Mode::Mirror;
    config.records_per_request = 0;
    config.projection = Some("a".into());
    config.poll_interval_ms = 600_001;
    config.start_position = Some(StartPosition::Latest);
    assert_eq!(
        paths(&config),
        [
            "source.records_per_request",
            "source.mode",
            "source.projection",
            "source.poll_interval_ms",
            "source.start_position",
        ]
    );
}

#[test]
fn the_export_engine_refuses_what_an_export_has_not_and_needs_a_bucket() {
    let mut config = SourceConfig::new("orders");
    config.snapshot.engine = SnapshotEngine::Export;
    assert_eq!(paths(&config), ["source.snapshot.s3_bucket"]);
    config.snapshot.s3_bucket = Some("exports".into());
    assert!(paths(&config).is_empty());
    config.filter_expression = Some("a = :a".into());
    config.expression_attribute_values = BTreeMap::from([(":a".into(), Value::Null)]);
    config.projection = Some("a".into());
    config.index_name = Some("by_a".into());
    config.segments = 4;
    config.consistent_read = true;
    config.snapshot.s3_prefix = Some("/p".into());
    config.snapshot.export_arn = Some("arn:aws:dynamodb:us-east-1:1:table/orders".into());
    assert_eq!(
        paths(&config),
        [
            "source.filter_expression",
            "source.projection",
            "source.index_name",
            "source.segments",
            "source.consistent_read",
            "source.snapshot.s3_prefix",
            "source.snapshot.export_arn",
        ]
    );
    let mut errors = Vec::new();
    config.validate(&mut errors);
    assert!(
        errors[0]
            .message
            .contains("does not apply to snapshot.engine: export"),
        "{}",
        errors[0]
    );
    let mut query = SourceConfig::new("orders");
    query.mode = Mode::Query;
    query.key_condition_expression = Some("pk = :p".into());
    query.expression_attribute_values = BTreeMap::from([(":p".into(), Value::Null)]);
    query.snapshot.engine = SnapshotEngine::Export;
    query.snapshot.s3_bucket = Some("b".into());
    assert_eq!(paths(&query), ["source.snapshot.engine"]);
}

#[test]
fn a_snapshot_engine_of_a_run_that_never_snapshots_is_ineffective() {
    let mut config = SourceConfig::new("orders");
    config.mode = Mode::Streams;
    config.follow = true;
    config.snapshot.engine = SnapshotEngine::Export;
    let present: BTreeSet<String> = ["snapshot".to_string()].into();
    let warnings = config.ineffective_fields(&present);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("source.snapshot has no effect in mode: streams with on_gap: fail"),
        "{warnings:?}"
    );
    config.on_gap = OnGap::Resnapshot;
    assert!(config.ineffective_fields(&present).is_empty());
    // With a bucket it finishes a repair left open, whatever `on_gap` says now (rule 13).
    config.on_gap = OnGap::Fail;
    config.snapshot.s3_bucket = Some("exports".into());
    assert!(config.ineffective_fields(&present).is_empty());
}

#[test]
fn export_fields_without_the_export_engine_are_errors() {
    let mut config = SourceConfig::new("orders");
    config.snapshot.s3_bucket = Some("exports".into());
    config.snapshot.export_arn = Some("arn:x".into());
    assert_eq!(
        paths(&config),
        ["source.snapshot.s3_bucket", "source.snapshot.export_arn"]
    );
}

/// A repair left open is finished whatever `on_gap` says now, as long as the run has the bucket
/// (docs/streams.md §4.12, docs/coordination.md §11.12 rule 9): streams and mirror accept the
/// bucket fields with the scan engine and any `on_gap`; `export_arn` still needs the export
/// engine.
#[test]
fn the_bucket_fields_of_a_repair_are_accepted_with_any_on_gap_where_a_stream_is_read() {
    for (mode, on_gap) in [
        (Mode::Mirror, OnGap::Fail),
        (Mode::Mirror, OnGap::Resnapshot),
        (Mode::Streams, OnGap::Fail),
    ] {
        let mut config = SourceConfig::new("orders");
        config.mode = mode;
        config.follow = true;
        config.on_gap = on_gap;
        config.snapshot.s3_bucket = Some("exports".into());
        config.snapshot.s3_prefix = Some("p".into());
        assert!(paths(&config).is_empty(), "{mode} {on_gap:?}");
        config.snapshot.export_arn = Some("arn:x".into());
        assert_eq!(paths(&config), ["source.snapshot.export_arn"]);
    }
}

#[test]
fn the_typed_value_wins_when_both_maps_set_a_key() {
    let mut config = SourceConfig::new("orders");
    config.expression_attribute_values = BTreeMap::from([(":v".into(), Value::Null)]);
    config.expression_attribute_values_typed = BTreeMap::from([(":v".into(), Value::Bool(true))]);
    assert_eq!(config.merged_expression_values()[":v"], Value::Bool(true));
}
