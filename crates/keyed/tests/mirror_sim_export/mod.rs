//! The export half of the mirror simulation (`mirror_sim.rs`): one seed's export script, and
//! where a crash landed. The exports hold what `FakeStreamTable`, the simulated table, serves
//! as their source: its items when a full export starts, with the stream's clock then as
//! `ExportTime`, and its write history for an incremental export's window.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ddbpipe_pipeline::streams::StreamRun;
use ddbpipe_source::error::ApiError;
use ddbpipe_source::export::{ExportEngine, ExportPoll, SnapshotExports};
use ddbpipe_source::fake_export::FakeExports;
use ddbpipe_source::fake_streams::{FakeStreamTable, FakeStreams};
use ddbpipe_source::retry::NoObserver;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// One seed's exports: the fake service and bucket, and the engine's settings.
pub struct ExportScript {
    /// The export service and bucket (it outlives the runs of a seed).
    pub fake: FakeExports,
    max_concurrency: usize,
    page_lines: usize,
    /// The first export started (a snapshot's, or a repair's in a seed that scans) FAILED.
    pub fails: bool,
}

impl ExportScript {
    /// The exports of seed `seed` of the table behind `stream` (see `mirror_sim.rs`).
    pub fn seeded(seed: u64, stream: &Arc<FakeStreams>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6578_706f);
        let files = rng.random_range(1..=5);
        let fake = FakeExports::new("b", FakeStreamTable::of(Arc::clone(stream)))
            .with_files(files)
            .in_progress_for(rng.random_range(0..=6));
        let fails = rng.random_bool(0.2);
        if fails {
            fake.fail_next_export("S3AccessDenied", "Access denied writing to the bucket");
        }
        let transient = rng.random_range(0..=2);
        fake.fail_gets((0..transient).map(|_| {
            ApiError::from_code(
                Some("InternalError".into()),
                "We encountered an internal error.",
            )
        }));
        if rng.random_bool(0.5) {
            let file = rng.random_range(0..files);
            fake.cut_next_body(&format!("-{file:04}.json.gz"), rng.random_range(0..64));
        }
        ExportScript {
            fake,
            max_concurrency: rng.random_range(1..=3),
            page_lines: rng.random_range(1..=5),
            fails,
        }
    }

    /// The exports of seed `seed` of the table behind `stream` without faults: 1–3 data files,
    /// `IN_PROGRESS` for a describe or two (a repair's in the shared simulation).
    // Only the shared simulation calls it; the single-process one includes this module too.
    #[allow(dead_code)]
    pub fn plain(seed: u64, stream: &Arc<FakeStreams>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7265_7061);
        let fake = FakeExports::new("b", FakeStreamTable::of(Arc::clone(stream)))
            .with_files(rng.random_range(1..=3))
            .in_progress_for(rng.random_range(0..=2));
        ExportScript {
            fake,
            max_concurrency: rng.random_range(1..=3),
            page_lines: rng.random_range(1..=5),
            fails: false,
        }
    }

    /// The export engine over the fake, with the run's retry policy.
    pub fn engine(&self, settings: &StreamRun) -> Arc<dyn SnapshotExports> {
        Arc::new(ExportEngine {
            exports: Arc::new(self.fake.clone()),
            store: Arc::new(self.fake.clone()),
            prefix: "ddbpipe/p".into(),
            bucket_owner: None,
            given_arn: None,
            max_concurrency: self.max_concurrency,
            page_lines: self.page_lines,
            retry: settings.retry,
            observer: Arc::new(NoObserver),
            poll: ExportPoll::default(),
        })
    }
}

/// The committed state of pipeline `p`, by part (`meta`, `segment:<n>`, …).
pub fn state(path: &Path) -> BTreeMap<String, Value> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut statement = db
        .prepare("SELECT part, value FROM _ddbpipe_state WHERE pipeline = 'p'")
        .unwrap();
    statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .map(|(part, value)| (part, serde_json::from_str(&value).unwrap()))
        .collect()
}

/// Whether the committed state holds an open snapshot that has read part of an export's files
/// or all of them and is not yet closed, or an open repair that has read part of its current
/// window's files: a crash there landed among the files.
pub fn among_the_files(path: &Path) -> bool {
    let parts = state(path);
    let Some(meta) = parts.get("meta") else {
        return false;
    };
    let repair = &meta["position"]["repair"];
    if repair.is_object() {
        let progress = repair["done"].as_array().is_some_and(|d| !d.is_empty())
            || repair["cursors"].as_object().is_some_and(|c| !c.is_empty())
            || parts.keys().any(|part| part.starts_with("segment:"));
        return repair["export_arn"].is_string() && progress;
    }
    let snapshot = &meta["position"]["snapshot"];
    let reading = snapshot["export_arn"].is_string() && snapshot["complete"] == false;
    let progress = snapshot["done"]
        .as_array()
        .is_some_and(|done| !done.is_empty())
        || parts.keys().any(|part| part.starts_with("segment:"));
    reading && progress
}
