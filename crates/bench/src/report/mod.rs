//! Summaries of the phases: per case and client, the median over runs; ddbpipe against the SDK
//! (and ddbpipe's export read against its scan) as ratios within the one bench run.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::json;

use crate::phase::{Case, Client, PhaseReport};

mod setup;

pub use setup::{ExportSetup, ScanSetup, Setup, StreamsSetup, pacing_floor};

/// One client's figures: medians over its runs, and the highest peak RSS.
#[derive(Debug, Clone, Serialize)]
pub struct ClientSummary {
    /// Items (or records) per second of wall-clock time.
    pub items_per_sec: f64,
    /// User + system CPU microseconds per item (or record).
    pub cpu_us_per_item: f64,
    /// User CPU seconds.
    pub user_secs: f64,
    /// System CPU seconds.
    pub system_secs: f64,
    /// Wall-clock seconds.
    pub wall_secs: f64,
    /// Peak RSS of the client process, MiB.
    pub peak_rss_mib: f64,
    /// Why each run ended, when the client says (ddbpipe's stream reads).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ends: Vec<String>,
}

/// The median of `values` (NaN when there are none).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The summary of one client's runs of one case (`None` when it did not run).
pub fn summarize(reports: &[PhaseReport], case: Case, client: Client) -> Option<ClientSummary> {
    let runs: Vec<&PhaseReport> = reports
        .iter()
        .filter(|r| r.case == case && r.client == client)
        .collect();
    if runs.is_empty() {
        return None;
    }
    let of = |f: &dyn Fn(&PhaseReport) -> f64| median(runs.iter().map(|r| f(r)).collect());
    Some(ClientSummary {
        items_per_sec: of(&|r| r.received as f64 / r.wall_secs.max(f64::MIN_POSITIVE)),
        cpu_us_per_item: of(&|r| (r.user_secs + r.system_secs) * 1e6 / (r.received.max(1) as f64)),
        user_secs: of(&|r| r.user_secs),
        system_secs: of(&|r| r.system_secs),
        wall_secs: of(&|r| r.wall_secs),
        peak_rss_mib: runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0,
        ends: runs.iter().filter_map(|r| r.end.clone()).collect(),
    })
}

/// ddbpipe ÷ SDK (export ÷ scan in the export case).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ratios {
    /// CPU µs per item: below 1 means ddbpipe (the export) spends less CPU per item.
    pub cpu_us_per_item: f64,
    /// Items per second: above 1 means ddbpipe (the export) is faster.
    pub items_per_sec: f64,
    /// Peak RSS: below 1 means ddbpipe (the export) peaks lower.
    pub peak_rss: f64,
}

/// One row of a case's report: its name (the client, or the read path) and its figures.
pub type Row = (&'static str, ClientSummary);

/// The rows of `case` and their ratios, from every phase's report: the scan and streams cases
/// have a row per client of `clients` that ran, and ddbpipe ÷ sdk; the export case has the
/// export read and ddbpipe's scan (its baseline), and export ÷ scan.
pub fn rows(reports: &[PhaseReport], case: Case, clients: &[Client]) -> (Vec<Row>, Option<Ratios>) {
    let rows: Vec<Row> = match case {
        Case::Scan | Case::Streams => clients
            .iter()
            .filter_map(|c| summarize(reports, case, *c).map(|s| (c.name(), s)))
            .collect(),
        Case::Export => [
            ("export", summarize(reports, Case::Export, Client::Ddbpipe)),
            ("scan", summarize(reports, Case::Scan, Client::Ddbpipe)),
        ]
        .into_iter()
        .filter_map(|(name, s)| s.map(|s| (name, s)))
        .collect(),
    };
    let (top, bottom) = match case {
        Case::Scan | Case::Streams => ("ddbpipe", "sdk"),
        Case::Export => ("export", "scan"),
    };
    let find = |wanted: &str| rows.iter().find(|(n, _)| *n == wanted).map(|(_, s)| s);
    let ratios = ratios(find(top), find(bottom));
    (rows, ratios)
}

/// The ratios, when both clients (or paths) ran.
pub fn ratios(ddbpipe: Option<&ClientSummary>, sdk: Option<&ClientSummary>) -> Option<Ratios> {
    let (d, s) = (ddbpipe?, sdk?);
    Some(Ratios {
        cpu_us_per_item: d.cpu_us_per_item / s.cpu_us_per_item,
        items_per_sec: d.items_per_sec / s.items_per_sec,
        peak_rss: d.peak_rss_mib / s.peak_rss_mib,
    })
}

/// The concurrency curve of one case: per concurrency and client (or path), throughput, CPU
/// and memory.
pub fn curve(case: Case, points: &[(usize, Vec<Row>)]) -> String {
    let noun = case.noun();
    let title = match case {
        Case::Scan | Case::Streams => "client",
        Case::Export => "path",
    };
    let mut out = String::new();
    let _ = writeln!(out, "ddbpipe-bench: {} concurrency curve", case.name());
    let _ = writeln!(
        out,
        "{:>11} {:<8} {:>11} {:>14} {:>13}",
        "concurrency",
        title,
        format!("{noun}s/s"),
        format!("CPU µs/{noun}"),
        "peak RSS MiB"
    );
    for (concurrency, clients) in points {
        for (client, s) in clients {
            let _ = writeln!(
                out,
                "{:>11} {:<8} {:>11.0} {:>14.2} {:>13.1}",
                concurrency, client, s.items_per_sec, s.cpu_us_per_item, s.peak_rss_mib
            );
        }
    }
    out
}

/// The human report: a header, one line per client (or path), the ratios, notes.
pub fn table(setup: &Setup, clients: &[Row], ratios: Option<Ratios>) -> String {
    let noun = setup.case().noun();
    let (title, _, _, top, bottom) = setup.comparison();
    let mut out = String::new();
    let _ = writeln!(out, "{}", setup.header());
    let _ = writeln!(
        out,
        "{:<8} {:>11} {:>14} {:>8} {:>8} {:>8} {:>13}",
        title,
        format!("{noun}s/s"),
        format!("CPU µs/{noun}"),
        "user s",
        "sys s",
        "wall s",
        "peak RSS MiB"
    );
    for (client, s) in clients {
        let _ = writeln!(
            out,
            "{:<8} {:>11.0} {:>14.2} {:>8.2} {:>8.2} {:>8.3} {:>13.1}",
            client,
            s.items_per_sec,
            s.cpu_us_per_item,
            s.user_secs,
            s.system_secs,
            s.wall_secs,
            s.peak_rss_mib
        );
    }
    if let Some(r) = ratios {
        let _ = writeln!(
            out,
            "{top}/{bottom}: CPU µs/{noun} {:.2} (<1: {top} cheaper), {noun}s/s {:.2} (>1: \
             {top} faster), peak RSS {:.2}",
            r.cpu_us_per_item, r.items_per_sec, r.peak_rss
        );
    }
    for note in setup.notes() {
        let _ = writeln!(out, "{note}");
    }
    for (client, s) in clients {
        if let Some(note) = ends_note(client, &s.ends) {
            let _ = writeln!(out, "{note}");
        }
    }
    out
}

/// How a client's runs ended, when it says: `stream disabled` (on the drained stream, at once)
/// or `idle` (after `idle_termination_secs` without a record, counted in its wall time).
fn ends_note(client: &str, ends: &[String]) -> Option<String> {
    if ends.is_empty() {
        return None;
    }
    let mut counted: Vec<(&str, usize)> = Vec::new();
    for end in ends {
        match counted.iter_mut().find(|(name, _)| name == end) {
            Some((_, n)) => *n += 1,
            None => counted.push((end, 1)),
        }
    }
    let list: Vec<String> = counted
        .iter()
        .map(|(name, n)| format!("{name} ×{n}"))
        .collect();
    let idle = if counted.iter().any(|(name, _)| *name == "idle") {
        " (an idle end waited 1 s without a record after the last one, and that second is in \
         its wall time)"
    } else {
        ""
    };
    Some(format!("{client} runs ended: {}{idle}", list.join(", ")))
}

/// `value` with `item` in its key names replaced by the case's noun (`record`).
fn with_noun(value: serde_json::Value, noun: &str) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) if noun != "item" => map
            .into_iter()
            .map(|(key, value)| (key.replace("item", noun), value))
            .collect(),
        other => other,
    }
}

/// The machine-readable report of one case: one JSON line. Field names say `item` in the
/// scan and export cases and `record` in the streams case (`records_per_sec`,
/// `cpu_us_per_record`). The scan and streams cases give `clients` and `ddbpipe_over_sdk`;
/// the export case gives `paths` (`export`, `scan`) and `export_over_scan`.
pub fn json_line(setup: &Setup, clients: &[Row], ratios: Option<Ratios>) -> String {
    let noun = setup.case().noun();
    let (_, rows_key, ratios_key, _, _) = setup.comparison();
    let clients: serde_json::Map<String, serde_json::Value> = clients
        .iter()
        .map(|(client, summary)| (client.to_string(), with_noun(json!(summary), noun)))
        .collect();
    let mut line = serde_json::Map::new();
    line.insert("case".into(), json!(setup.case().name()));
    line.insert("setup".into(), setup.json());
    line.insert(rows_key.into(), serde_json::Value::Object(clients));
    line.insert(ratios_key.into(), with_noun(json!(ratios), noun));
    serde_json::Value::Object(line).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::server::Ready;

    fn report(case: Case, client: Client, wall: f64, cpu: f64, rss: u64) -> PhaseReport {
        PhaseReport {
            case,
            client,
            received: 1000,
            wall_secs: wall,
            user_secs: cpu * 0.75,
            system_secs: cpu * 0.25,
            peak_rss_kib: rss,
            end: None,
        }
    }

    #[test]
    fn summaries_take_medians_and_ratios_compare_ddbpipe_with_sdk() {
        let reports = [
            report(Case::Scan, Client::Ddbpipe, 1.0, 0.010, 2048),
            report(Case::Scan, Client::Ddbpipe, 0.5, 0.005, 4096),
            report(Case::Scan, Client::Ddbpipe, 2.0, 0.020, 1024),
            report(Case::Scan, Client::Sdk, 2.0, 0.020, 8192),
            report(Case::Streams, Client::Sdk, 9.0, 9.0, 9999),
        ];
        let d = summarize(&reports, Case::Scan, Client::Ddbpipe).expect("ddbpipe ran");
        assert_eq!(d.items_per_sec, 1000.0);
        assert!((d.cpu_us_per_item - 10.0).abs() < 1e-9);
        assert_eq!(d.peak_rss_mib, 4.0);
        let s = summarize(&reports, Case::Scan, Client::Sdk).expect("sdk ran");
        let r = ratios(Some(&d), Some(&s)).expect("both ran");
        assert!((r.cpu_us_per_item - 0.5).abs() < 1e-9);
        assert!((r.items_per_sec - 2.0).abs() < 1e-9);
        assert!(ratios(Some(&d), None).is_none());
        assert!(summarize(&reports, Case::Streams, Client::Ddbpipe).is_none());
    }

    #[test]
    fn streams_reports_count_records() {
        let ready = Ready {
            port: 1,
            items: 0,
            mean_item_bytes: 0.0,
            mean_wire_bytes: 0.0,
            records: 4000,
            shards: 4,
            mean_record_bytes: 900.0,
            mean_record_wire_bytes: 1700.0,
        };
        let setup = Setup::Streams(StreamsSetup::new(
            &ready,
            4,
            1000,
            Duration::from_millis(100),
            0,
            1,
            (100, true),
        ));
        let summary = ClientSummary {
            items_per_sec: 10.0,
            cpu_us_per_item: 1.0,
            user_secs: 1.0,
            system_secs: 0.0,
            wall_secs: 1.0,
            peak_rss_mib: 1.0,
            ends: Vec::new(),
        };
        let ddbpipe = ClientSummary {
            ends: vec![
                "stream disabled".into(),
                "idle".into(),
                "stream disabled".into(),
            ],
            ..summary.clone()
        };
        let clients = [("ddbpipe", ddbpipe), ("sdk", summary)];
        let r = ratios(Some(&clients[0].1), Some(&clients[1].1));
        let text = table(&setup, &clients, r);
        assert!(
            text.contains("records/s") && text.contains("CPU µs/record"),
            "{text}"
        );
        assert!(
            text.contains("ddbpipe runs ended: stream disabled ×2, idle ×1 (an idle end"),
            "{text}"
        );
        assert!(!text.contains("sdk runs ended"), "{text}");
        let line: serde_json::Value =
            serde_json::from_str(&json_line(&setup, &clients, r)).expect("JSON");
        assert_eq!(line["case"], "streams");
        assert_eq!(line["clients"]["sdk"]["records_per_sec"], 10.0);
        assert_eq!(line["ddbpipe_over_sdk"]["cpu_us_per_record"], 1.0);
    }

    #[test]
    fn the_export_case_compares_the_export_read_with_ddbpipe_s_scan() {
        let reports = [
            report(Case::Export, Client::Ddbpipe, 1.0, 0.004, 1024),
            report(Case::Scan, Client::Ddbpipe, 0.5, 0.002, 2048),
            report(Case::Scan, Client::Sdk, 2.0, 0.020, 8192),
        ];
        // The scan case keeps its clients; the export case is the export and ddbpipe's scan.
        let (scan, _) = rows(&reports, Case::Scan, &[Client::Sdk]);
        assert_eq!(scan.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["sdk"]);
        let (export, r) = rows(&reports, Case::Export, &[Client::Sdk]);
        assert_eq!(
            export.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["export", "scan"]
        );
        let r = r.expect("both paths ran");
        assert!((r.cpu_us_per_item - 2.0).abs() < 1e-9);
        assert!((r.items_per_sec - 0.5).abs() < 1e-9);
        assert!((r.peak_rss - 0.5).abs() < 1e-9);
        let setup = Setup::Export(ExportSetup {
            items: 1000,
            files: 8,
            concurrency: 4,
            page_lines: 1000,
            stored_bytes: 200_000,
            mean_line_bytes: 840.0,
            mean_item_bytes: 450.0,
            scan_segments: 4,
            scan_page_items: 1000,
            latency_ms: 0,
            runs: 1,
            clk_tck: 100,
            clk_tck_measured: true,
        });
        let text = table(&setup, &export, Some(r));
        assert!(
            text.contains("full export of 1000 items in 8 gzip files"),
            "{text}"
        );
        assert!(text.contains("\npath "), "{text}");
        assert!(text.contains("export/scan: CPU µs/item 2.00"), "{text}");
        let line: serde_json::Value =
            serde_json::from_str(&json_line(&setup, &export, Some(r))).expect("JSON");
        assert_eq!(line["case"], "export");
        assert_eq!(line["paths"]["export"]["items_per_sec"], 1000.0);
        assert_eq!(line["paths"]["scan"]["items_per_sec"], 2000.0);
        assert_eq!(line["export_over_scan"]["items_per_sec"], 0.5);
        assert!(line.get("clients").is_none(), "{line}");
    }

    #[test]
    fn the_pacing_floor_counts_sequential_reads() {
        let spacing = Duration::from_millis(100);
        // 4 shards of 100 pages, 4 at once: 100 reads in a row per shard.
        assert!((pacing_floor(400_000, 4, 4, 1000, spacing) - 9.9).abs() < 1e-9);
        // 2 at once: 200 reads per slot.
        assert!((pacing_floor(400_000, 4, 2, 1000, spacing) - 19.9).abs() < 1e-9);
        // More slots than shards change nothing.
        assert!((pacing_floor(400_000, 4, 8, 1000, spacing) - 9.9).abs() < 1e-9);
    }
}
