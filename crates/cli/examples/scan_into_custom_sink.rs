//! Scan a table into a sink of your own: here, one that totals an attribute per customer.
//!
//! ```text
//! cargo run --example scan_into_custom_sink -- orders http://127.0.0.1:8000
//! ```
//!
//! The pipeline's config says `sink: {type: custom}`; the sink is given in code. Returning
//! `Ok` from `write` acknowledges a batch: its position is saved, so a stopped scan resumes
//! after the last acknowledged batch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ddbpipe::sink::{Batch, Op, Sink, SinkError};

/// Totals of `amount` per `customer`, shared with whoever started the pipeline.
#[derive(Clone, Default)]
pub struct Totals(pub Arc<Mutex<BTreeMap<String, f64>>>);

impl Sink for Totals {
    fn describe(&self) -> String {
        "totals per customer".to_string()
    }

    async fn write(&mut self, batch: &Batch) -> Result<(), SinkError> {
        let mut totals = self
            .0
            .lock()
            .map_err(|_| SinkError::definite("the totals were poisoned"))?;
        for record in batch.records() {
            let (Op::Item, Some(item)) = (record.op(), record.item()) else {
                continue;
            };
            let customer = item["customer"].as_str().unwrap_or("(none)").to_string();
            let amount = item["amount"].as_f64().unwrap_or(0.0);
            *totals.entry(customer).or_default() += amount;
        }
        Ok(())
    }
}

/// Scans `table` at `endpoint` (an emulator; `None`: AWS as the environment says) into
/// `totals`, keeping the scan's position in `state` (a file).
pub async fn scan(
    table: &str,
    endpoint: Option<&str>,
    state: &std::path::Path,
    totals: Totals,
) -> Result<ddbpipe::Summary, ddbpipe::Error> {
    let endpoint = endpoint.map_or(String::new(), |url| {
        format!(
            "  endpoint_url: {url}\n  region: us-east-1\n  credentials: {{type: access_key, \
             config: {{access_key_id: local, secret_access_key: local}}}}\n"
        )
    });
    let yaml = format!(
        "name: totals\nsource:\n  table_name: {table}\n  segments: 4\n{endpoint}\
         sink:\n  type: custom\nstate:\n  path: {}\n",
        state.display()
    );
    let dir = std::env::current_dir().unwrap_or_default();
    ddbpipe::Pipeline::from_yaml(&yaml, dir)?
        .with_sink(totals)
        .run(ddbpipe::Cancel::never())
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let table = args
        .next()
        .ok_or("usage: scan_into_custom_sink TABLE [ENDPOINT]")?;
    let endpoint = args.next();
    let state = std::env::temp_dir().join("scan_into_custom_sink.state.json");
    let totals = Totals::default();
    let summary = scan(&table, endpoint.as_deref(), &state, totals.clone()).await?;
    println!("{summary}");
    for (customer, total) in totals.0.lock().map_err(|_| "poisoned")?.iter() {
        println!("{customer}: {total}");
    }
    Ok(())
}
