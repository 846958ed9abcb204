//! Driving a pipeline's batches from a test (`ddbpipe::Pipeline::batches`, docs/state.md §6.9):
//! the `sink: {type: custom}` section, starting the batches, taking the next one, its keys.

use std::num::NonZeroUsize;

use ddbpipe::Cancel;
use ddbpipe::drive::Batch;
use rand::SeedableRng;
use rand::seq::SliceRandom;

use super::Pipeline;

/// The `sink:` and `state:` sections of a driven pipeline (state in `state.json`).
pub const CUSTOM: &str =
    "sink:\n  type: custom\nstate:\n  path: state.json\n  flush_interval_ms: 0\n";

/// `files`' pipeline, at most `window` batches held.
pub fn pipeline(files: &Pipeline, window: usize) -> ddbpipe::Pipeline {
    let window = NonZeroUsize::new(window).expect("a window of at least one batch");
    ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_ack_window(window)
}

/// The batches of `files`' pipeline, `window` at most held.
pub async fn started(files: &Pipeline, window: usize, stop: Cancel) -> ddbpipe::Batches {
    pipeline(files, window)
        .batches(stop)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The next batch, which must come.
pub async fn next_batch(batches: &mut ddbpipe::Batches) -> Batch {
    batches.next().await.expect("a batch").expect("no failure")
}

/// The `pk` of each record's item (a scan's item, a snapshot row's, a change's new image).
pub fn keys(batch: &Batch) -> Vec<String> {
    batch
        .records()
        .iter()
        .map(|record| {
            let item = record.item().expect("an item");
            item["pk"].as_str().expect("a key").to_string()
        })
        .collect()
}

/// Drives every batch of `files`' pipeline, acknowledging a full window of `window` batches in
/// a random order (seeded); returns the summary and the keys handed out, in order.
pub fn drive_shuffled(
    files: &Pipeline,
    window: usize,
    seed: u64,
) -> (ddbpipe::Summary, Vec<String>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    super::rt().block_on(async {
        let mut batches = started(files, window, Cancel::never()).await;
        let mut got = Vec::new();
        let mut held: Vec<Batch> = Vec::new();
        while let Some(batch) = batches.next().await {
            let batch = batch.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            got.extend(keys(&batch));
            held.push(batch);
            if held.len() == window {
                held.shuffle(&mut rng);
                for batch in held.drain(..) {
                    batch.ack();
                }
            }
        }
        held.shuffle(&mut rng);
        for batch in held {
            batch.ack();
        }
        let summary = batches
            .finish()
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        (summary, got)
    })
}
