//! Reads the `source:` section into a [`SourceConfig`] (fields and rules in `ddbpipe_source`).

use std::collections::BTreeSet;

use ddbpipe_source::capacity::ReadSlots;
use ddbpipe_source::config::{
    Mode, OnGap, RetryConfig, SnapshotConfig, SnapshotEngine, SourceConfig, StartPosition, defaults,
};
use ddbpipe_source::endpoint::EndpointUrl;
use ddbpipe_value::{Number, Value as AttributeValue, ValueFormat, value_from_typed_json};
use serde_json::json;
use yaml_serde::Value;

use super::credentials::{CREDENTIALS, CREDENTIALS_TYPE, read_credentials};
use super::discovery::Discovery;
use super::numbers;
use crate::yaml::fields::{Fields, Report, Stage, convert, join};
use crate::yaml::schema::{Field, Shape, any_mapping, any_value, defaulted, either, of, optional};
use crate::yaml::types::{FromYaml, expected, found};

/// The keys of `source:` (docs/config.md §1.2), as the walker reads them and the schema shows
/// them.
pub(super) static SOURCE: &[Field] = &[
    either(
        "table_name",
        &["tables", "discover"],
        of::<String>(),
        "The table to read: its name or its ARN (or tables, discover: several).",
    ),
    either(
        "discover",
        &["table_name", "tables"],
        Shape::Section(super::discovery::DISCOVER),
        "Several tables found by name pattern and tag, each read by a pipeline of its own \
         (docs/config.md §1.5); instead of table_name.",
    ),
    either(
        "tables",
        &["table_name", "discover"],
        of::<Vec<String>>(),
        "Several tables to read, each a pipeline of its own named <name>:<table> (docs/config.md \
         §1.5); instead of table_name.",
    ),
    optional(
        "region",
        of::<String>(),
        "AWS region; unset: the AWS default region chain.",
    ),
    optional(
        "endpoint_url",
        of::<EndpointUrl>(),
        "Endpoint of both the DynamoDB and the Streams client (an emulator, a VPC endpoint).",
    ),
    optional(
        "credentials",
        Shape::Tagged {
            tag: &CREDENTIALS_TYPE,
            variants: CREDENTIALS,
        },
        "Where the AWS credentials come from: {type: <variant>, config: {...}}; unset: the \
         default chain.",
    ),
    defaulted(
        "mode",
        of::<Mode>(),
        || json!(defaults::MODE.as_str()),
        "What to read: a parallel scan, a query, the change stream, or a mirror (snapshot, \
         then stream).",
    ),
    defaulted(
        "segments",
        of::<u32>(),
        || json!(defaults::SEGMENTS),
        "Parallel Scan segments (TotalSegments), 1..=1000000; only 1 in query mode.",
    ),
    defaulted(
        "max_concurrency",
        of::<usize>(),
        || json!(defaults::MAX_CONCURRENCY),
        "Segments read at once, at least 1.",
    ),
    optional(
        "index_name",
        of::<String>(),
        "A global or local secondary index to read instead of the table (scan and query).",
    ),
    optional(
        "projection",
        of::<String>(),
        "ProjectionExpression: the attributes to read (scan and query).",
    ),
    optional(
        "filter_expression",
        of::<String>(),
        "FilterExpression: items to drop after reading (scan and query).",
    ),
    optional(
        "key_condition_expression",
        of::<String>(),
        "KeyConditionExpression: required in query mode, refused in the others.",
    ),
    optional(
        "expression_attribute_names",
        Shape::Map(<String as FromYaml>::schema),
        "Placeholders for attribute names in the expressions: keys start with #.",
    ),
    optional(
        "expression_attribute_values",
        Shape::Map(any_value),
        "Values of the expressions as plain YAML: keys start with :; numbers keep every digit \
         of their text.",
    ),
    optional(
        "expression_attribute_values_typed",
        Shape::Map(any_mapping),
        "Values of the expressions as attribute JSON ({\"N\": \"1.5\"}, sets, binary): keys \
         start with :.",
    ),
    defaulted(
        "consistent_read",
        of::<bool>(),
        || json!(defaults::CONSISTENT_READ),
        "Strongly consistent reads (not on a global secondary index).",
    ),
    defaulted(
        "scan_index_forward",
        of::<bool>(),
        || json!(defaults::SCAN_INDEX_FORWARD),
        "Query only: ascending sort-key order; false reads backwards.",
    ),
    optional(
        "page_limit",
        of::<u32>(),
        "The Limit of each Scan or Query request, at least 1; unset: DynamoDB's 1 MB pages.",
    ),
    optional(
        "stream_arn",
        of::<String>(),
        "Streams and mirror: read this stream; unset: the table's current stream.",
    ),
    optional(
        "start_position",
        of::<StartPosition>(),
        "Streams, first run only: all retained records (trim_horizon, the default) or only \
         later ones (latest).",
    ),
    defaulted(
        "on_gap",
        of::<OnGap>(),
        || json!(defaults::ON_GAP.as_str()),
        "Streams and mirror: what a gap found at start-up does: stop, or scan the table again.",
    ),
    defaulted(
        "resnapshot_deletes",
        of::<bool>(),
        || json!(defaults::RESNAPSHOT_DELETES),
        "A complete resnapshot deletes the rows of items it did not see (keyed sinks; false \
         with jsonl).",
    ),
    defaulted(
        "resnapshot_max_keys",
        of::<usize>(),
        || json!(defaults::RESNAPSHOT_MAX_KEYS),
        "Cleanup ceiling: a snapshot that wrote more keys than this deletes nothing.",
    ),
    defaulted(
        "poll_interval_ms",
        of::<u64>(),
        || json!(defaults::POLL_INTERVAL_MS),
        "Wait before re-reading a caught-up shard, in milliseconds (at most 600000, at least \
         200 in effect).",
    ),
    defaulted(
        "max_idle_poll_ms",
        of::<u64>(),
        || json!(defaults::MAX_IDLE_POLL_MS),
        "Longest wait before re-reading a shard that keeps reading empty, in milliseconds: \
         the wait doubles from poll_interval_ms up to this (at most 600000; at or below \
         poll_interval_ms, no backoff).",
    ),
    defaulted(
        "records_per_request",
        of::<u32>(),
        || json!(defaults::RECORDS_PER_REQUEST),
        "The Limit of each GetRecords request, 1..=1000.",
    ),
    defaulted(
        "shard_concurrency",
        of::<usize>(),
        || json!(defaults::SHARD_CONCURRENCY),
        "Shards read at once, at least 1.",
    ),
    defaulted(
        "read_concurrency",
        of::<usize>(),
        || json!(defaults::READ_CONCURRENCY),
        "Scan, Query and GetRecords requests at once over every table of the file, first come \
         first served, at least 1.",
    ),
    optional(
        "idle_termination_secs",
        of::<u64>(),
        "Streams and mirror: end after this many seconds without a new record.",
    ),
    optional(
        "max_messages",
        of::<usize>(),
        "Streams and mirror: end after exactly this many change records.",
    ),
    defaulted(
        "follow",
        of::<bool>(),
        || json!(defaults::FOLLOW),
        "Streams and mirror: run until SIGINT or SIGTERM.",
    ),
    defaulted(
        "discovery_interval_secs",
        of::<u64>(),
        || json!(defaults::DISCOVERY_INTERVAL_SECS),
        "How often the stream's shards are listed again, in seconds, 10..=3600.",
    ),
    optional(
        "max_read_units_per_second",
        of::<f64>(),
        "Read-capacity limit in read units per second, 0.01..=1e9.",
    ),
    optional(
        "read_capacity_fraction",
        of::<f64>(),
        "At most this share (1e-6..=1) of the table's or index's read capacity.",
    ),
    optional(
        "retry",
        Shape::Section(RETRY),
        "Retries of DynamoDB requests; each field defaults on its own.",
    ),
    defaulted(
        "batch_size",
        of::<usize>(),
        || json!(defaults::BATCH_SIZE),
        "Records handed to the sink at once, 1..=1000000; when not given, 5000 into a sqlite or \
         postgres sink (a transaction per batch).",
    ),
    defaulted(
        "batch_max_bytes",
        of::<usize>(),
        || json!(defaults::BATCH_MAX_BYTES),
        "A batch is handed to the sink once its records hold this many bytes of output, \
         1024..=1073741824 (1 KiB to 1 GiB), however few they are: memory stays bounded \
         whatever the items' size. A larger record is a batch of its own.",
    ),
    optional(
        "snapshot",
        Shape::Section(SNAPSHOT),
        "How snapshots (mode: scan, a mirror's first run, a resnapshot) read the table: Scan \
         requests, or an export to S3 that consumes no read capacity.",
    ),
    defaulted(
        "value_format",
        of::<ValueFormat>(),
        || json!(defaults::VALUE_FORMAT.as_str()),
        "How attribute values are written: plain JSON, or typed attribute JSON. Plain into a \
         PostgreSQL json/jsonb document writes every number as a JSON number of its own digits \
         (docs/values.md §3.7).",
    ),
];

/// The keys of `source.retry:`.
static RETRY: &[Field] = &[
    defaulted(
        "max_retries",
        of::<u32>(),
        || json!(defaults::MAX_RETRIES),
        "Retries after the first attempt of a request.",
    ),
    defaulted(
        "initial_backoff_ms",
        of::<u64>(),
        || json!(defaults::INITIAL_BACKOFF_MS),
        "The first back-off delay, in milliseconds; not above max_backoff_ms.",
    ),
    defaulted(
        "max_backoff_ms",
        of::<u64>(),
        || json!(defaults::MAX_BACKOFF_MS),
        "The longest back-off delay, in milliseconds.",
    ),
    defaulted(
        "attempt_timeout_ms",
        of::<u64>(),
        || json!(defaults::ATTEMPT_TIMEOUT_MS),
        "The time one attempt may take, in milliseconds, 1000..=600000.",
    ),
];

/// The keys of `source.snapshot:` (docs/scan.md §2.10).
static SNAPSHOT: &[Field] = &[
    defaulted(
        "engine",
        of::<SnapshotEngine>(),
        || json!(SnapshotEngine::Scan.as_str()),
        "scan: parallel Scan requests; export: ExportTableToPointInTime to S3, then its files \
         (needs point-in-time recovery; no read capacity).",
    ),
    optional(
        "s3_bucket",
        of::<String>(),
        "The bucket the export is written to; required with engine: export.",
    ),
    optional(
        "s3_prefix",
        of::<String>(),
        "The key prefix of exports; unset: ddbpipe/<pipeline name>.",
    ),
    optional(
        "s3_bucket_owner",
        of::<String>(),
        "The account id owning the bucket, when it is another account's.",
    ),
    crate::sinks::parquet::S3_REGION,
    crate::sinks::parquet::S3_ENDPOINT_URL,
    optional(
        "export_arn",
        of::<String>(),
        "A completed full export of the table to read instead of starting one.",
    ),
];

/// Reads the source section; also returns the keys it set, for the mode warnings.
/// `source.tables` goes to `tables`, `source.discover` to `discover` (docs/config.md §1.5);
/// exactly one of them and `table_name` must be set.
pub(super) fn read_source(
    mut f: Fields<'_>,
    tables: &mut Option<Vec<String>>,
    discover: &mut Option<Discovery>,
) -> (SourceConfig, BTreeSet<String>) {
    let table_name = f.get::<String>("table_name");
    *tables = f.get::<Vec<String>>("tables");
    *discover = f.section("discover").map(super::discovery::read);
    let set = [table_name.is_some(), tables.is_some(), discover.is_some()];
    match set.iter().filter(|set| **set).count() {
        0 => f.missing("table_name"),
        1 => {}
        _ => {
            let second = if tables.is_some() && discover.is_some() {
                "discover"
            } else if tables.is_some() {
                "tables"
            } else {
                "discover"
            };
            let path = join(f.path(), second);
            f.report().error(
                Stage::Validate,
                &path,
                "set one of table_name (one table), tables (a list) and discover (by name \
                 pattern and tag)",
            );
        }
    }
    let mut source = SourceConfig::new(table_name.unwrap_or_default());
    source.region = f.get("region");
    source.endpoint_url = f.get("endpoint_url");
    source.credentials = f
        .section("credentials")
        .map(read_credentials)
        .unwrap_or_default();
    source.mode = f.or("mode", source.mode);
    source.segments = f.or("segments", source.segments);
    source.max_concurrency = f.or("max_concurrency", source.max_concurrency);
    source.index_name = f.get("index_name");
    source.projection = f.get("projection");
    source.filter_expression = f.get("filter_expression");
    source.key_condition_expression = f.get("key_condition_expression");
    source.expression_attribute_names = f
        .map("expression_attribute_names", |report, path, value| {
            convert::<String>(report, path, value)
        });
    source.expression_attribute_values = f.map(
        "expression_attribute_values",
        |report, path, value| match plain_value(report, path, value) {
            Ok(value) => Some(value),
            Err((path, message)) => {
                report.error(Stage::Type, &path, message);
                None
            }
        },
    );
    source.expression_attribute_values_typed =
        f.map("expression_attribute_values_typed", decode_typed);
    source.consistent_read = f.or("consistent_read", source.consistent_read);
    source.scan_index_forward = f.or("scan_index_forward", source.scan_index_forward);
    source.page_limit = f.get("page_limit");
    source.stream_arn = f.get("stream_arn");
    source.start_position = f.get("start_position");
    source.on_gap = f.or("on_gap", source.on_gap);
    source.resnapshot_deletes = f.or("resnapshot_deletes", source.resnapshot_deletes);
    source.resnapshot_max_keys = f.or("resnapshot_max_keys", source.resnapshot_max_keys);
    source.poll_interval_ms = f.or("poll_interval_ms", source.poll_interval_ms);
    source.max_idle_poll_ms = f.or("max_idle_poll_ms", source.max_idle_poll_ms);
    source.records_per_request = f.or("records_per_request", source.records_per_request);
    source.shard_concurrency = f.or("shard_concurrency", source.shard_concurrency);
    source.read_concurrency =
        ReadSlots::new(f.or("read_concurrency", source.read_concurrency.size()));
    source.idle_termination_secs = f.get("idle_termination_secs");
    source.max_messages = f.get("max_messages");
    source.follow = f.or("follow", source.follow);
    source.discovery_interval_secs =
        f.or("discovery_interval_secs", source.discovery_interval_secs);
    source.max_read_units_per_second = f.get("max_read_units_per_second");
    source.read_capacity_fraction = f.get("read_capacity_fraction");
    source.retry = f.section("retry").map(read_retry).unwrap_or_default();
    source.batch_size = f.or("batch_size", source.batch_size);
    source.batch_max_bytes = f.or("batch_max_bytes", source.batch_max_bytes);
    source.value_format = f.or("value_format", source.value_format);
    source.snapshot = f.section("snapshot").map(read_snapshot).unwrap_or_default();
    (source, f.finish())
}

/// `snapshot: {engine, s3_bucket, s3_prefix, s3_bucket_owner, s3_region, s3_endpoint_url,
/// export_arn}`.
fn read_snapshot(mut f: Fields<'_>) -> SnapshotConfig {
    let snapshot = SnapshotConfig {
        engine: f.or("engine", SnapshotEngine::Scan),
        s3_bucket: f.get("s3_bucket"),
        s3_prefix: f.get("s3_prefix"),
        s3_bucket_owner: f.get("s3_bucket_owner"),
        s3_region: f.get("s3_region"),
        s3_endpoint_url: f.get("s3_endpoint_url"),
        export_arn: f.get("export_arn"),
    };
    f.finish();
    snapshot
}

/// `retry: {max_retries, initial_backoff_ms, max_backoff_ms, attempt_timeout_ms}`, each field
/// defaulting on its own.
fn read_retry(mut f: Fields<'_>) -> RetryConfig {
    let retry = RetryConfig {
        max_retries: f.or("max_retries", defaults::MAX_RETRIES),
        initial_backoff_ms: f.or("initial_backoff_ms", defaults::INITIAL_BACKOFF_MS),
        max_backoff_ms: f.or("max_backoff_ms", defaults::MAX_BACKOFF_MS),
        attempt_timeout_ms: f.or("attempt_timeout_ms", defaults::ATTEMPT_TIMEOUT_MS),
    };
    f.finish();
    retry
}

/// An entry of `expression_attribute_values` (docs/values.md §3.4): null → NULL, bool → BOOL, number →
/// N from its exact text (`numbers`), string → S, list → L, mapping → M.
fn plain_value(
    report: &Report,
    path: &str,
    value: Value,
) -> Result<AttributeValue, (String, String)> {
    Ok(match value {
        Value::Null => AttributeValue::Null,
        Value::Bool(flag) => AttributeValue::Bool(flag),
        Value::Number(number) if number.is_nan() || number.is_infinite() => {
            return Err((
                path.to_owned(),
                expected("a finite number", &Value::Number(number)),
            ));
        }
        Value::Number(number) => {
            let text = report
                .substituted
                .get(path)
                .or_else(|| report.number_texts.get(path));
            let exact = numbers::exact(&number, text.map(String::as_str))
                .map_err(|message| (path.to_owned(), message))?;
            AttributeValue::N(Number::new(exact))
        }
        Value::String(text) => AttributeValue::S(text),
        Value::Sequence(items) => AttributeValue::L(
            items
                .into_iter()
                .enumerate()
                .map(|(index, item)| plain_value(report, &format!("{path}[{index}]"), item))
                .collect::<Result<_, _>>()?,
        ),
        Value::Mapping(mapping) => {
            let mut entries = ddbpipe_value::Item::new();
            for (key, item) in mapping {
                let Value::String(key) = key else {
                    let message = format!("keys must be strings, found {}", found(&key));
                    return Err((path.to_owned(), message));
                };
                let item = plain_value(report, &join(path, &key), item)?;
                entries.insert(key, item);
            }
            AttributeValue::M(entries)
        }
        Value::Tagged(tagged) => {
            let message = format!("YAML tags are not supported here (found {})", tagged.tag);
            return Err((path.to_owned(), message));
        }
    })
}

/// An entry of `expression_attribute_values_typed`, decoded strictly (docs/values.md §3.5). Attribute
/// JSON holds no JSON numbers, so a number re-read from `${…}` goes back to its text:
/// `{N: ${BIG}}` keeps every digit of `BIG`.
fn decode_typed(report: &mut Report, path: &str, value: Value) -> Option<AttributeValue> {
    let json = to_json(report, path, value)?;
    match value_from_typed_json(&json, path) {
        Ok(value) => Some(value),
        Err(error) => {
            let message = format!("malformed typed attribute value: {}", error.problem);
            report.error(Stage::Type, &error.path, message);
            None
        }
    }
}

/// A YAML value as JSON, or a type error at the path of the part that has no JSON form.
fn to_json(report: &mut Report, path: &str, value: Value) -> Option<serde_json::Value> {
    match json_of(report, path, value) {
        Ok(json) => Some(json),
        Err((path, message)) => {
            report.error(Stage::Type, &path, message);
            None
        }
    }
}

fn json_of(
    report: &Report,
    path: &str,
    value: Value,
) -> Result<serde_json::Value, (String, String)> {
    Ok(match value {
        Value::Null => serde_json::Value::Null,
        Value::Bool(flag) => serde_json::Value::Bool(flag),
        Value::Number(number) => {
            if let Some(text) = report.substituted.get(path) {
                serde_json::Value::String(text.clone())
            } else if let Some(unsigned) = number.as_u64() {
                unsigned.into()
            } else if let Some(signed) = number.as_i64() {
                signed.into()
            } else {
                let float = number.as_f64().and_then(serde_json::Number::from_f64);
                let message = || expected("a finite number", &Value::Number(number.clone()));
                serde_json::Value::Number(float.ok_or_else(|| (path.to_owned(), message()))?)
            }
        }
        Value::String(text) => serde_json::Value::String(text),
        Value::Sequence(items) => items
            .into_iter()
            .enumerate()
            .map(|(index, item)| json_of(report, &format!("{path}[{index}]"), item))
            .collect::<Result<_, _>>()?,
        Value::Mapping(mapping) => {
            let mut object = serde_json::Map::new();
            for (key, item) in mapping {
                let Value::String(key) = key else {
                    let message = format!("keys must be strings, found {}", found(&key));
                    return Err((path.to_owned(), message));
                };
                let item = json_of(report, &join(path, &key), item)?;
                object.insert(key, item);
            }
            serde_json::Value::Object(object)
        }
        Value::Tagged(tagged) => {
            let message = format!("YAML tags are not supported here (found {})", tagged.tag);
            return Err((path.to_owned(), message));
        }
    })
}
