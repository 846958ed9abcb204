//! `ddbpipe-bench phase`: one client scanning the bench table once, in a process of its own,
//! printing what it measured as one JSON line.
//!
//! Only the scan is timed: building the client, the sink and the state file comes before the
//! meter starts. The peak RSS is the whole process's, setup included.

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use serde::{Deserialize, Serialize};

use crate::procfs::{self, Meter};
use crate::{ddbpipe_client, sdk_client};

/// Which client a phase runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Client {
    /// ddbpipe's engine, wired as `ddbpipe run` wires a scan.
    Ddbpipe,
    /// `aws_sdk_dynamodb::Client` + a recursive conversion to `serde_json::Value`.
    Sdk,
}

impl Client {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Client::Ddbpipe => "ddbpipe",
            Client::Sdk => "sdk",
        }
    }
}

/// What one phase is asked to do.
#[derive(Debug, Clone)]
pub struct PhaseSettings {
    /// The client.
    pub client: Client,
    /// `http://127.0.0.1:<port>` of the bench server.
    pub endpoint: String,
    /// Items the table holds: the scan must return exactly these.
    pub items: u64,
    /// `TotalSegments`.
    pub segments: u32,
    /// Segments read at once.
    pub concurrency: usize,
}

/// What a phase measured; printed as one JSON line on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseReport {
    /// The client.
    pub client: Client,
    /// Items received (equal to the table's, or the phase failed).
    pub items: u64,
    /// Wall-clock seconds of the scan.
    pub wall_secs: f64,
    /// User CPU seconds of the process during the scan.
    pub user_secs: f64,
    /// System CPU seconds of the process during the scan.
    pub system_secs: f64,
    /// Peak RSS of the process (`VmHWM`), KiB.
    pub peak_rss_kib: u64,
}

/// Runs one phase: set up, measure the scan, check the count, report.
pub fn run(settings: &PhaseSettings, clk_tck: u64) -> anyhow::Result<PhaseReport> {
    // The same runtime as `ddbpipe run` (crates/cli/src/main.rs), for both clients.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let settings = Arc::new(settings.clone());
    let (received, measured) = runtime.block_on(async {
        match settings.client {
            Client::Ddbpipe => {
                let prepared = ddbpipe_client::prepare(&settings).await?;
                let meter = Meter::start()?;
                let received = prepared.scan().await?;
                anyhow::Ok((received, meter.stop()?))
            }
            Client::Sdk => {
                let prepared = sdk_client::prepare(&settings).await;
                let meter = Meter::start()?;
                let received = prepared.scan().await?;
                anyhow::Ok((received, meter.stop()?))
            }
        }
    })?;
    ensure!(
        received == settings.items,
        "{} received {received} items, but the table holds {}",
        settings.client.name(),
        settings.items
    );
    let ticks = clk_tck as f64;
    Ok(PhaseReport {
        client: settings.client,
        items: received,
        wall_secs: measured.wall.as_secs_f64(),
        user_secs: measured.user_ticks as f64 / ticks,
        system_secs: measured.system_ticks as f64 / ticks,
        peak_rss_kib: procfs::peak_rss_kib()?,
    })
}
