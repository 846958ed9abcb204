//! How each case was run, for the report's header: the table, stream or export, the
//! concurrency, and the floor a stream read cannot go below.

use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::phase::Case;
use crate::server::Ready;

/// How the scan case was run, for the report's header.
#[derive(Debug, Clone, Serialize)]
pub struct ScanSetup {
    /// Items in the table.
    pub items: u64,
    /// `TotalSegments`.
    pub segments: u32,
    /// Segments read at once.
    pub concurrency: usize,
    /// Items per page.
    pub page_items: u64,
    /// Milliseconds every answer of the server waited.
    pub latency_ms: u64,
    /// Runs of each client.
    pub runs: u32,
    /// Clock ticks per second used to convert CPU time.
    pub clk_tck: u64,
    /// Whether `clk_tck` came from `getconf CLK_TCK` (else 100 was assumed).
    pub clk_tck_measured: bool,
    /// Mean DynamoDB size of an item, bytes.
    pub mean_item_bytes: f64,
    /// Mean attribute-JSON size of an item on the wire, bytes.
    pub mean_wire_bytes: f64,
}

impl ScanSetup {
    /// The setup of a bench whose server announced `ready`.
    pub fn new(
        ready: &Ready,
        segments: u32,
        concurrency: usize,
        page_items: u64,
        latency_ms: u64,
        runs: u32,
        clk: (u64, bool),
    ) -> Self {
        ScanSetup {
            items: ready.items,
            segments,
            concurrency,
            page_items,
            latency_ms,
            runs,
            clk_tck: clk.0,
            clk_tck_measured: clk.1,
            mean_item_bytes: ready.mean_item_bytes,
            mean_wire_bytes: ready.mean_wire_bytes,
        }
    }
}

/// How the streams case was run, for the report's header.
#[derive(Debug, Clone, Serialize)]
pub struct StreamsSetup {
    /// Change records in the stream.
    pub records: u64,
    /// Closed shards holding them.
    pub shards: u32,
    /// Shards read at once.
    pub concurrency: usize,
    /// `GetRecords` `Limit` (and most records per answer).
    pub records_per_page: u64,
    /// Milliseconds every answer of the server waited.
    pub latency_ms: u64,
    /// Runs of each client.
    pub runs: u32,
    /// Clock ticks per second used to convert CPU time.
    pub clk_tck: u64,
    /// Whether `clk_tck` came from `getconf CLK_TCK` (else 100 was assumed).
    pub clk_tck_measured: bool,
    /// Mean `SizeBytes` of a record (keys and images as DynamoDB counts them), bytes.
    pub mean_record_bytes: f64,
    /// Mean JSON size of a record on the wire, bytes.
    pub mean_wire_bytes: f64,
    /// The least wall time ddbpipe can take here: it starts the `GetRecords` of one shard at
    /// least `READ_SPACING` apart, and a shard holds a slot while it waits.
    pub ddbpipe_floor_secs: f64,
}

impl StreamsSetup {
    /// The setup of a bench whose server announced `ready`.
    pub fn new(
        ready: &Ready,
        concurrency: usize,
        records_per_page: u64,
        read_spacing: Duration,
        latency_ms: u64,
        runs: u32,
        clk: (u64, bool),
    ) -> Self {
        StreamsSetup {
            records: ready.records,
            shards: ready.shards,
            concurrency,
            records_per_page,
            latency_ms,
            runs,
            clk_tck: clk.0,
            clk_tck_measured: clk.1,
            mean_record_bytes: ready.mean_record_bytes,
            mean_wire_bytes: ready.mean_record_wire_bytes,
            ddbpipe_floor_secs: pacing_floor(
                ready.records,
                ready.shards,
                concurrency,
                records_per_page,
                read_spacing,
            ),
        }
    }
}

/// How the export case was run, for the report's header.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSetup {
    /// Items in the export (and in the table its baseline scans).
    pub items: u64,
    /// Gzip data files holding them.
    pub files: u32,
    /// Data files read at once (the scan's segments read at once).
    pub concurrency: usize,
    /// Records per page the export reader hands on.
    pub page_lines: usize,
    /// Bytes of the data files as stored (gzip).
    pub stored_bytes: u64,
    /// Mean bytes of an uncompressed export line (`{"Item":…}` and its newline).
    pub mean_line_bytes: f64,
    /// Mean DynamoDB size of an item, bytes.
    pub mean_item_bytes: f64,
    /// `TotalSegments` of the baseline scan.
    pub scan_segments: u32,
    /// Items per page of the baseline scan.
    pub scan_page_items: u64,
    /// Milliseconds every answer of the scan's server waited (the export waits for none).
    pub latency_ms: u64,
    /// Runs of each path.
    pub runs: u32,
    /// Clock ticks per second used to convert CPU time.
    pub clk_tck: u64,
    /// Whether `clk_tck` came from `getconf CLK_TCK` (else 100 was assumed).
    pub clk_tck_measured: bool,
}

/// The least time to read `records` in `shards` (split as the server splits them) with
/// `concurrency` slots, when the reads of one shard start `spacing` apart and a slot is held
/// while waiting: every slot does at most one read per `spacing`, and a shard's reads are
/// sequential.
pub fn pacing_floor(
    records: u64,
    shards: u32,
    concurrency: usize,
    per_page: u64,
    spacing: Duration,
) -> f64 {
    let shards = shards.max(1);
    let pages: Vec<u64> = (0..shards)
        .map(|k| {
            let (low, high) = crate::records::shard_range(k, shards, records);
            (high - low).div_ceil(per_page.max(1)).max(1)
        })
        .collect();
    let total: u64 = pages.iter().sum();
    let slots = (concurrency.max(1) as u64).min(u64::from(shards));
    let longest = pages.iter().copied().max().unwrap_or(1);
    let reads_in_a_row = total.div_ceil(slots).max(longest);
    reads_in_a_row.saturating_sub(1) as f64 * spacing.as_secs_f64()
}

/// How one case was run.
#[derive(Debug, Clone)]
pub enum Setup {
    /// The parallel scan.
    Scan(ScanSetup),
    /// The stream read.
    Streams(StreamsSetup),
    /// The export read, against ddbpipe's scan.
    Export(ExportSetup),
}

impl Setup {
    pub(super) fn case(&self) -> Case {
        match self {
            Setup::Scan(_) => Case::Scan,
            Setup::Streams(_) => Case::Streams,
            Setup::Export(_) => Case::Export,
        }
    }

    pub(super) fn clk(&self) -> (u64, bool) {
        match self {
            Setup::Scan(s) => (s.clk_tck, s.clk_tck_measured),
            Setup::Streams(s) => (s.clk_tck, s.clk_tck_measured),
            Setup::Export(s) => (s.clk_tck, s.clk_tck_measured),
        }
    }

    pub(super) fn json(&self) -> serde_json::Value {
        match self {
            Setup::Scan(s) => json!(s),
            Setup::Streams(s) => json!(s),
            Setup::Export(s) => json!(s),
        }
    }

    /// What the rows of the case compare, and the names of its ratio: `(rows' title, JSON key
    /// of the rows, JSON key of the ratios, numerator, denominator)`.
    pub(super) fn comparison(
        &self,
    ) -> (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    ) {
        match self {
            Setup::Scan(_) | Setup::Streams(_) => {
                ("client", "clients", "ddbpipe_over_sdk", "ddbpipe", "sdk")
            }
            Setup::Export(_) => ("path", "paths", "export_over_scan", "export", "scan"),
        }
    }

    /// The first line of the human report.
    pub(super) fn header(&self) -> String {
        let latency = match self {
            Setup::Scan(s) => s.latency_ms,
            Setup::Streams(s) => s.latency_ms,
            Setup::Export(s) => s.latency_ms,
        };
        let latency = match latency {
            0 => String::new(),
            ms => format!(", {ms} ms per answer"),
        };
        let (ticks, measured) = self.clk();
        let clk = if measured {
            format!("{ticks} ticks/s (getconf CLK_TCK)")
        } else {
            format!("{ticks} ticks/s (assumed; getconf CLK_TCK failed)")
        };
        match self {
            Setup::Scan(s) => format!(
                "ddbpipe-bench: {}-segment scan of {} items (mean {:.0} B as DynamoDB counts, \
                 {:.0} B of attribute JSON), concurrency {}, {} items per page{latency}, {} run(s), \
                 median shown; CPU at {clk}",
                s.segments,
                s.items,
                s.mean_item_bytes,
                s.mean_wire_bytes,
                s.concurrency,
                s.page_items,
                s.runs,
            ),
            Setup::Streams(s) => format!(
                "ddbpipe-bench: stream of {} change records in {} closed shards \
                 (NEW_AND_OLD_IMAGES, mean {:.0} B as DynamoDB counts, {:.0} B of JSON), \
                 concurrency {}, {} records per GetRecords{latency}, {} run(s), median shown; \
                 CPU at {clk}",
                s.records,
                s.shards,
                s.mean_record_bytes,
                s.mean_wire_bytes,
                s.concurrency,
                s.records_per_page,
                s.runs,
            ),
            Setup::Export(s) => format!(
                "ddbpipe-bench: full export of {} items in {} gzip files ({:.1} MB stored, mean \
                 {:.0} B of export JSON a line, {:.0} B as DynamoDB counts), {} files at once, {} \
                 lines per page, against ddbpipe's {}-segment scan of the same items at \
                 concurrency {}, {} items per page{latency}; {} run(s), median shown; CPU at {clk}",
                s.items,
                s.files,
                s.stored_bytes as f64 / 1e6,
                s.mean_line_bytes,
                s.mean_item_bytes,
                s.concurrency,
                s.page_lines,
                s.scan_segments,
                s.concurrency,
                s.scan_page_items,
                s.runs,
            ),
        }
    }

    /// Lines after the ratios.
    pub(super) fn notes(&self) -> Vec<String> {
        match self {
            Setup::Scan(_) => Vec::new(),
            Setup::Export(_) => vec![
                "note: export = DescribeExport, the manifests, then every data file streamed \
                 from local disk (page cache) through gunzip, MD5 and the line writer, in its \
                 process; scan = the scan case's ddbpipe phase, whose server's CPU is not its \
                 own"
                .to_string(),
            ],
            Setup::Streams(s) => vec![format!(
                "note: ddbpipe starts the GetRecords of one shard at least 100 ms apart (AWS \
                 allows 5 a second per shard), so it cannot take less than about {:.1} s here; \
                 the sdk baseline does not pace its reads",
                s.ddbpipe_floor_secs
            )],
        }
    }
}
