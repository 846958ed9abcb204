//! Summaries of the phases: per client, the median over runs; ddbpipe against the SDK as
//! ratios within the one bench run.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::json;

use crate::phase::{Client, PhaseReport};
use crate::server::Ready;

/// How the bench was run, for the report's header.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// Items in the table.
    pub items: u64,
    /// `TotalSegments`.
    pub segments: u32,
    /// Segments read at once.
    pub concurrency: usize,
    /// Items per page.
    pub page_items: u64,
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

impl Setup {
    /// The setup of a bench whose server announced `ready`.
    pub fn new(
        ready: &Ready,
        segments: u32,
        concurrency: usize,
        page_items: u64,
        runs: u32,
        clk: (u64, bool),
    ) -> Self {
        Setup {
            items: ready.items,
            segments,
            concurrency,
            page_items,
            runs,
            clk_tck: clk.0,
            clk_tck_measured: clk.1,
            mean_item_bytes: ready.mean_item_bytes,
            mean_wire_bytes: ready.mean_wire_bytes,
        }
    }
}

/// One client's figures: medians over its runs, and the highest peak RSS.
#[derive(Debug, Clone, Serialize)]
pub struct ClientSummary {
    /// Items per second of wall-clock time.
    pub items_per_sec: f64,
    /// User + system CPU microseconds per item.
    pub cpu_us_per_item: f64,
    /// User CPU seconds.
    pub user_secs: f64,
    /// System CPU seconds.
    pub system_secs: f64,
    /// Wall-clock seconds.
    pub wall_secs: f64,
    /// Peak RSS of the client process, MiB.
    pub peak_rss_mib: f64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The summary of one client's runs (`None` when it did not run).
pub fn summarize(reports: &[PhaseReport], client: Client) -> Option<ClientSummary> {
    let runs: Vec<&PhaseReport> = reports.iter().filter(|r| r.client == client).collect();
    if runs.is_empty() {
        return None;
    }
    let of = |f: &dyn Fn(&PhaseReport) -> f64| median(runs.iter().map(|r| f(r)).collect());
    Some(ClientSummary {
        items_per_sec: of(&|r| r.items as f64 / r.wall_secs.max(f64::MIN_POSITIVE)),
        cpu_us_per_item: of(&|r| (r.user_secs + r.system_secs) * 1e6 / (r.items.max(1) as f64)),
        user_secs: of(&|r| r.user_secs),
        system_secs: of(&|r| r.system_secs),
        wall_secs: of(&|r| r.wall_secs),
        peak_rss_mib: runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0,
    })
}

/// ddbpipe ÷ SDK.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ratios {
    /// CPU µs per item: below 1 means ddbpipe spends less CPU per item.
    pub cpu_us_per_item: f64,
    /// Items per second: above 1 means ddbpipe is faster.
    pub items_per_sec: f64,
    /// Peak RSS: below 1 means ddbpipe peaks lower.
    pub peak_rss: f64,
}

/// The ratios, when both clients ran.
pub fn ratios(ddbpipe: Option<&ClientSummary>, sdk: Option<&ClientSummary>) -> Option<Ratios> {
    let (d, s) = (ddbpipe?, sdk?);
    Some(Ratios {
        cpu_us_per_item: d.cpu_us_per_item / s.cpu_us_per_item,
        items_per_sec: d.items_per_sec / s.items_per_sec,
        peak_rss: d.peak_rss_mib / s.peak_rss_mib,
    })
}

/// The human report: a header, one line per client, the ratios.
pub fn table(setup: &Setup, clients: &[(Client, ClientSummary)], ratios: Option<Ratios>) -> String {
    let mut out = String::new();
    let clk = if setup.clk_tck_measured {
        format!("{} ticks/s (getconf CLK_TCK)", setup.clk_tck)
    } else {
        format!(
            "{} ticks/s (assumed; getconf CLK_TCK failed)",
            setup.clk_tck
        )
    };
    let _ = writeln!(
        out,
        "ddbpipe-bench: {}-segment scan of {} items (mean {:.0} B as DynamoDB counts, {:.0} B of \
         attribute JSON), concurrency {}, {} items per page, {} run(s), median shown; CPU at {clk}",
        setup.segments,
        setup.items,
        setup.mean_item_bytes,
        setup.mean_wire_bytes,
        setup.concurrency,
        setup.page_items,
        setup.runs,
    );
    let _ = writeln!(
        out,
        "{:<8} {:>11} {:>12} {:>8} {:>8} {:>8} {:>13}",
        "client", "items/s", "CPU µs/item", "user s", "sys s", "wall s", "peak RSS MiB"
    );
    for (client, s) in clients {
        let _ = writeln!(
            out,
            "{:<8} {:>11.0} {:>12.2} {:>8.2} {:>8.2} {:>8.3} {:>13.1}",
            client.name(),
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
            "ddbpipe/sdk: CPU µs/item {:.2} (<1: ddbpipe cheaper), items/s {:.2} (>1: ddbpipe \
             faster), peak RSS {:.2}",
            r.cpu_us_per_item, r.items_per_sec, r.peak_rss
        );
    }
    out
}

/// The machine-readable report: one JSON line.
pub fn json_line(
    setup: &Setup,
    clients: &[(Client, ClientSummary)],
    ratios: Option<Ratios>,
) -> String {
    let clients: serde_json::Map<String, serde_json::Value> = clients
        .iter()
        .map(|(client, summary)| (client.name().to_string(), json!(summary)))
        .collect();
    json!({"setup": setup, "clients": clients, "ddbpipe_over_sdk": ratios}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(client: Client, wall: f64, cpu: f64, rss: u64) -> PhaseReport {
        PhaseReport {
            client,
            items: 1000,
            wall_secs: wall,
            user_secs: cpu * 0.75,
            system_secs: cpu * 0.25,
            peak_rss_kib: rss,
        }
    }

    #[test]
    fn summaries_take_medians_and_ratios_compare_ddbpipe_with_sdk() {
        let reports = [
            report(Client::Ddbpipe, 1.0, 0.010, 2048),
            report(Client::Ddbpipe, 0.5, 0.005, 4096),
            report(Client::Ddbpipe, 2.0, 0.020, 1024),
            report(Client::Sdk, 2.0, 0.020, 8192),
        ];
        let d = summarize(&reports, Client::Ddbpipe).expect("ddbpipe ran");
        assert_eq!(d.items_per_sec, 1000.0);
        assert!((d.cpu_us_per_item - 10.0).abs() < 1e-9);
        assert_eq!(d.peak_rss_mib, 4.0);
        let s = summarize(&reports, Client::Sdk).expect("sdk ran");
        let r = ratios(Some(&d), Some(&s)).expect("both ran");
        assert!((r.cpu_us_per_item - 0.5).abs() < 1e-9);
        assert!((r.items_per_sec - 2.0).abs() < 1e-9);
        assert!(ratios(Some(&d), None).is_none());
    }
}
