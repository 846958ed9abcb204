//! The sample `init --columns auto` infers columns from: the first items of one Scan of the
//! table, read by the scan machinery every run uses.
//!
//! # Rules
//! 1. One segment, one request in flight, `Limit` the items still wanted at most: the reader
//!    stops once it has them (the page in flight when it has enough is its last).
//! 2. The read rate is what the pipeline `init` writes suggests, a quarter of the table's
//!    read capacity ([`SAMPLE_CAPACITY_FRACTION`], the limiter and its refresher of a run);
//!    a table without a capacity base (on demand with no maximum) is read unlimited, one
//!    request at a time.
//! 3. Items arrive as attribute JSON, so every DynamoDB type is seen as it is stored.
//! 4. Retries are the one retry policy's (its defaults: init has no pipeline file).

use std::sync::Arc;

use anyhow::anyhow;
use ddbpipe_source::api::{Render, TableApi, TableDescription};
use ddbpipe_source::config::SourceConfig;
use ddbpipe_source::error::ReadError;
use ddbpipe_source::plan::{ReadRule, ScanPlan};
use ddbpipe_source::retry::Cancel;
use ddbpipe_value::{Item, ValueFormat, item_from_typed_json};
use tokio::sync::mpsc;

use crate::failure::Failure;
use crate::run::scan::segment_reader;

/// The share of the table's read capacity the sample may use (rule 2), the one `init`'s
/// file suggests for the run.
pub(crate) const SAMPLE_CAPACITY_FRACTION: f64 = 0.25;

/// Reads up to `wanted` items of `table` (rules 1–4).
pub(crate) async fn sample<A: TableApi>(
    api: Arc<A>,
    table: &TableDescription,
    wanted: u32,
) -> Result<Vec<Item>, Failure> {
    let mut source = SourceConfig::new(&table.name);
    source.segments = 1;
    source.max_concurrency = 1;
    source.page_limit = Some(wanted.max(1));
    source.value_format = ValueFormat::Typed;
    if ReadRule::of(&source).capacity_base(table).is_some() {
        source.read_capacity_fraction = Some(SAMPLE_CAPACITY_FRACTION);
    }
    let plan = ScanPlan::build(&source, table).map_err(|e| Failure::runtime(anyhow!(e)))?;
    let (stop_handle, stop) = Cancel::new();
    let (reader, refresher) = segment_reader(api, &plan, Render::items(plan.format), &stop);
    let (pages_in, mut pages) = mpsc::channel(1);
    let read = reader.read_segment(0, None, pages_in, stop.clone());
    let wanted = wanted as usize;
    let collect = async move {
        let mut items = Vec::with_capacity(wanted.min(10_000));
        'pages: while let Some(page) = pages.recv().await {
            for record in page.records.iter() {
                let json: serde_json::Value = serde_json::from_slice(record)
                    .map_err(|e| anyhow!("internal error: a sampled item is not JSON: {e}"))?;
                items.push(item_from_typed_json(&json, "item")?);
                if items.len() >= wanted {
                    break 'pages;
                }
            }
        }
        // Enough (or the table's end): the reader stops at its next request or page.
        stop_handle.cancel();
        anyhow::Ok(items)
    };
    let (read, items) = tokio::join!(read, collect);
    drop(refresher);
    let items = items.map_err(Failure::runtime)?;
    match read {
        Ok(()) | Err(ReadError::Cancelled) => Ok(items),
        Err(error) => Err(Failure::runtime(error)
            .hint("check --table, --region / --endpoint-url and the credentials' dynamodb:Scan")),
    }
}
