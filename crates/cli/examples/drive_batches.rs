//! Drive the reading yourself: take a scan's batches into your own loop, process each on a task
//! of its own, and acknowledge it when that task is done — in whatever order they finish.
//!
//! ```text
//! cargo run --example drive_batches -- orders http://127.0.0.1:8000
//! ```
//!
//! The pipeline's config says `sink: {type: custom}`; `Pipeline::batches` hands its batches
//! out instead of writing them. The position saved is, per scan segment, the acknowledged
//! prefix of its batches, so a stopped run resumes after what was acknowledged (docs/state.md
//! §6.9). At most `with_ack_window` batches are held at a time: while they are, reading waits.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ddbpipe::drive::Batch;

/// Records processed, shared by the tasks.
#[derive(Clone, Default)]
pub struct Processed(pub Arc<AtomicU64>);

/// What processing a batch means here: counting its items with an `amount`, on a task of its
/// own (a service would call another service, write a database, …), then acknowledging it.
async fn process(batch: Batch, processed: Processed) {
    let with_amount = batch
        .records()
        .iter()
        .filter(|record| {
            record
                .item()
                .is_some_and(|item| item.get("amount").is_some())
        })
        .count();
    // Later batches may finish first: their acknowledgements come back out of order.
    tokio::task::yield_now().await;
    processed.0.fetch_add(with_amount as u64, Ordering::SeqCst);
    batch.ack();
}

/// Scans `table` at `endpoint` (an emulator; `None`: AWS as the environment says), keeping the
/// position in `state` (a file), processing each batch on a task of its own.
pub async fn drive(
    table: &str,
    endpoint: Option<&str>,
    state: &std::path::Path,
    processed: Processed,
) -> Result<ddbpipe::Summary, ddbpipe::Error> {
    let endpoint = endpoint.map_or(String::new(), |url| {
        format!(
            "  endpoint_url: {url}\n  region: us-east-1\n  credentials: {{type: access_key, \
             config: {{access_key_id: local, secret_access_key: local}}}}\n"
        )
    });
    let yaml = format!(
        "name: driven\nsource:\n  table_name: {table}\n  segments: 4\n  batch_size: 10\n\
         {endpoint}sink:\n  type: custom\nstate:\n  path: {}\n",
        state.display()
    );
    let dir = std::env::current_dir().unwrap_or_default();
    let window = NonZeroUsize::new(8).unwrap_or(ddbpipe::drive::DEFAULT_WINDOW);
    let (stop_handle, stop) = ddbpipe::Cancel::new();
    let mut batches = ddbpipe::Pipeline::from_yaml(&yaml, dir)?
        .with_ack_window(window)
        .batches(stop)
        .await?;
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(batch) = batches.next().await {
        tasks.spawn(process(batch?, processed.clone()));
    }
    // The scan's end is committed once every batch is acknowledged: wait for the tasks.
    while tasks.join_next().await.is_some() {}
    let summary = batches.finish().await?;
    // `stop_handle.cancel()` from anywhere (a signal handler) stops the run cleanly.
    drop(stop_handle);
    Ok(summary)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let table = args.next().ok_or("usage: drive_batches TABLE [ENDPOINT]")?;
    let endpoint = args.next();
    let state = std::env::temp_dir().join("drive_batches.state.json");
    let processed = Processed::default();
    let summary = drive(&table, endpoint.as_deref(), &state, processed.clone()).await?;
    println!("{summary}");
    println!(
        "items with an amount: {}",
        processed.0.load(Ordering::SeqCst)
    );
    Ok(())
}
