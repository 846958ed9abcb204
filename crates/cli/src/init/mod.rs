//! `ddbpipe init`: describe a table and write a commented pipeline file for it.
//!
//! # Rules
//! 1. The file names what was given (`--region`, `--endpoint-url`, `--profile`) and what the
//!    description says: the key schema, the size, the billing and the stream, as comments.
//! 2. `segments` follows the size: one per GiB, at least 1, at most 64 (a starting point
//!    for large tables; change it freely before the first run).
//! 3. Streams and mirror pipelines follow the stream until stopped (`follow: true`). When the
//!    table's stream cannot feed the pipeline (none, disabled, or no new images for a mirror
//!    or keyed sink), the file says how to enable it.
//! 4. The file is a valid pipeline: it is parsed before it is written, and a file that exists
//!    is never overwritten.
//! 5. `--columns auto` (sqlite and postgres only) samples `--sample` items of the table
//!    ([`sample`]) and writes the `columns:` list they suggest ([`columns`]).

mod columns;
mod sample;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::anyhow;
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws;
use ddbpipe_source::plan;
use ddbpipe_source::retry::{Cancel, NoObserver, RetryPolicy};

use crate::args::{InitArgs, InitColumns, InitMode, InitSink};
use crate::config;
use crate::failure::{Exit, Failure};
use crate::sinks::keyed::Dialect;
use crate::telemetry::note;
pub(crate) use columns::{Inference, infer};
use sample::SAMPLE_CAPACITY_FRACTION;

/// Segments per GiB of table (rule 2), and the most `init` suggests.
const BYTES_PER_SEGMENT: i64 = 1 << 30;
const MAX_SUGGESTED_SEGMENTS: i64 = 64;

/// Runs `ddbpipe init`.
pub async fn init(args: InitArgs) -> Result<Exit, Failure> {
    let dialect = match (args.columns, args.sink) {
        (None, _) => None,
        (Some(InitColumns::Auto), InitSink::Sqlite) => Some(Dialect::Sqlite),
        (Some(InitColumns::Auto), InitSink::Postgres) => Some(Dialect::Postgres),
        (Some(InitColumns::Auto), InitSink::Parquet | InitSink::Iceberg) => Some(Dialect::Lake),
        (Some(InitColumns::Auto), InitSink::Jsonl) => {
            return Err(Failure::usage(anyhow!(
                "--columns auto writes typed columns of a table: it needs --sink sqlite, \
                 postgres, parquet or iceberg"
            )));
        }
    };
    let sdk = aws::load_sdk_config(&args.aws.settings()).await;
    let api = aws::table_api(&sdk);
    let table = &args.table;
    let described = RetryPolicy::default()
        .run(
            "describe_table",
            || format!("DescribeTable '{table}'"),
            &Cancel::never(),
            &NoObserver,
            |_| ddbpipe_source::api::TableApi::describe_table(&api, table),
        )
        .await
        .map_err(|e| {
            Failure::runtime(e).hint("check --table, --region / --endpoint-url and the credentials")
        })?
        .ok_or_else(|| Failure::runtime(anyhow!("table '{table}' not found")))?;
    let inference = match dialect {
        None => None,
        Some(dialect) => {
            let items = sample::sample(Arc::new(api), &described, args.sample).await?;
            let keys: Vec<String> = described
                .key_schema
                .iter()
                .map(|key| key.name.clone())
                .collect();
            Some(infer(&items, &keys, dialect))
        }
    };
    let text = pipeline(&args, &described, inference.as_ref());
    // Rule 4: what `init` writes, `check` and `run` accept.
    config::parse(&text, Path::new("."), &|_| Some("x".to_string())).map_err(|errors| {
        Failure::runtime(anyhow!(
            "internal error: init wrote an invalid pipeline: {errors}"
        ))
    })?;
    match &args.output {
        None => print!("{text}"),
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| {
                    Failure::usage(anyhow!("cannot create {}: {e}", path.display()))
                        .hint("init never overwrites a file: choose another --output")
                })?;
            file.write_all(text.as_bytes())
                .map_err(|e| Failure::runtime(anyhow!("cannot write {}: {e}", path.display())))?;
            note!(
                "ddbpipe: wrote {}; `ddbpipe check {}` probes it",
                path.display(),
                path.display()
            );
        }
    }
    Ok(Exit::Ok)
}

/// The pipeline file for `table` (rules 1–3), with the typed columns `inference` suggests
/// (rule 5).
pub(crate) fn pipeline(
    args: &InitArgs,
    table: &TableDescription,
    inference: Option<&Inference>,
) -> String {
    let name = table_slug(&table.name);
    let mode = match args.mode {
        InitMode::Scan => "scan",
        InitMode::Streams => "streams",
        InitMode::Mirror => "mirror",
    };
    let keys: Vec<String> = table
        .key_schema
        .iter()
        .map(|k| format!("{} ({})", k.name, k.key_type.tag()))
        .collect();
    let mut out = String::new();
    out.push_str(&format!(
        "# Written by `ddbpipe init` for table '{}': key {}, ~{} items, {} bytes, billing {}.\n",
        table.name,
        keys.join(", "),
        table.item_count.unwrap_or(0),
        table.size_bytes.unwrap_or(0),
        table.billing_mode.as_deref().unwrap_or("unknown"),
    ));
    out.push_str("# Reference: README.md \"Configuration reference\" and docs/config.md.\n");
    out.push_str(&format!("name: {name}-{mode}\nsource:\n"));
    out.push_str(&format!("  table_name: {}\n", table.name));
    if let Some(region) = &args.aws.region {
        out.push_str(&format!("  region: {region}\n"));
    }
    if let Some(url) = &args.aws.endpoint_url {
        // The pipeline file asked for: the URL as given, not masked.
        out.push_str(&format!("  endpoint_url: {}\n", url.expose()));
    }
    if let Some(profile) = &args.aws.profile {
        out.push_str(&format!(
            "  credentials: {{type: profile, config: {{name: {profile}}}}}\n"
        ));
    }
    out.push_str(&format!("  mode: {mode}\n"));
    if args.mode != InitMode::Streams {
        let segments =
            (table.size_bytes.unwrap_or(0) / BYTES_PER_SEGMENT).clamp(1, MAX_SUGGESTED_SEGMENTS);
        out.push_str(&format!(
            "  segments: {segments}                      # parallel Scan segments: about one per GiB\n"
        ));
        out.push_str(&format!(
            "  # read_capacity_fraction: {SAMPLE_CAPACITY_FRACTION}         # at most this share of the table's read capacity\n",
        ));
    }
    if args.mode != InitMode::Scan {
        out.push_str("  follow: true                     # until SIGINT/SIGTERM (or idle_termination_secs)\n");
        // A jsonl file cannot delete what vanished, so its resnapshot would need
        // `resnapshot_deletes: false`: a jsonl mirror keeps the default `on_gap: fail`.
        if args.mode == InitMode::Mirror
            && matches!(args.sink, InitSink::Sqlite | InitSink::Postgres)
        {
            out.push_str("  on_gap: resnapshot               # a gap rescans the table and deletes what vanished\n");
        }
        let view = table
            .stream
            .as_ref()
            .filter(|s| s.enabled)
            .and_then(|s| s.view_type.clone());
        let needs_new_images = args.mode == InitMode::Mirror || args.sink != InitSink::Jsonl;
        let usable = match view.as_deref() {
            None => false,
            Some(view) => !(needs_new_images && plan::lacks_new_images(view)),
        };
        if !usable {
            out.push_str(&format!(
                "  # The table's stream is {}: enable it before the first run:\n  #   aws dynamodb update-table --table-name {} --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES\n",
                view.as_deref().unwrap_or("not enabled"),
                table.name
            ));
        }
    }
    out.push_str("sink:\n");
    match args.sink {
        InitSink::Jsonl => {
            out.push_str("  type: jsonl\n");
            out.push_str(&format!(
                "  path: {name}.jsonl                 # relative to this file's directory\n"
            ));
        }
        InitSink::Sqlite => {
            out.push_str("  type: sqlite\n");
            out.push_str(&format!("  path: {name}.db\n"));
        }
        InitSink::Postgres => {
            out.push_str("  type: postgres\n");
            out.push_str(
                "  url: \"postgres://app:${PGPASSWORD}@localhost:5432/app\"   # or libpq key=value; PG* variables fill in the rest\n",
            );
            out.push_str("  schema: public\n");
        }
        InitSink::Parquet => {
            out.push_str("  type: parquet\n");
            out.push_str(&format!(
                "  path: {name}-lake                # a directory, or s3://bucket/prefix/{{table}}/\n"
            ));
            out.push_str(PARTITION_BY_HINT);
        }
        InitSink::Iceberg => {
            out.push_str("  type: iceberg\n");
            out.push_str("  catalog:\n    type: sql\n");
            out.push_str(
                "    uri: sqlite:///catalog.db       # the pipeline file's directory; sqlite:////abs/path\n",
            );
            out.push_str(
                "    # or type: glue (the Glue Data Catalog), or type: s3tables with table_bucket_arn\n    \
                 # (an S3 table bucket: then no warehouse, S3 Tables places the files), or type: rest\n    \
                 # with uri: https://host/api/catalog (Polaris, Lakekeeper, Nessie…; token or credential)\n",
            );
            out.push_str(&format!(
                "  warehouse: {name}-warehouse      # a directory, or s3://bucket/prefix\n"
            ));
            out.push_str("  namespace: dynamodb\n");
            out.push_str(PARTITION_BY_HINT);
        }
    }
    if let Some(inference) = inference {
        out.push_str(&columns::yaml_lines(inference));
    }
    out
}

/// The lake sinks' `partition_by`, shown commented out (docs/sinks.md §7.10 rule 3).
const PARTITION_BY_HINT: &str =
    "  # partition_by: [bucket(16, pk)]  # Iceberg transforms; unset: changes by day(event_time)\n";

/// A pipeline-name-safe form of a table name (`A-Z a-z 0-9 _ . -`).
fn table_slug(table: &str) -> String {
    let name = table.rsplit_once(":table/").map_or(table, |(_, name)| name);
    let slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if slug.is_empty() {
        "table".to_string()
    } else {
        slug
    }
}
