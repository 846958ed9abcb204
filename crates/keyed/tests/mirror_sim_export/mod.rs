//! The export half of the mirror simulation (`mirror_sim.rs`): what an export of the
//! simulated table holds, one seed's export script, and where a crash landed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ddbpipe_pipeline::streams::StreamRun;
use ddbpipe_source::error::ApiError;
use ddbpipe_source::export::{ExportEngine, ExportPoll, SnapshotExports};
use ddbpipe_source::fake_export::{ExportSource, FakeExports};
use ddbpipe_source::fake_streams::{FakeStreamTable, FakeStreams};
use ddbpipe_source::retry::NoObserver;
use ddbpipe_value::{Item, Number, Value as AttributeValue};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// What an export of the table holds: its items as the stream's writes left them when the
/// export starts, and the stream's clock then as its `ExportTime`.
struct TableAsExported(Arc<FakeStreams>);

impl ExportSource for TableAsExported {
    fn items(&self) -> Vec<Item> {
        FakeStreamTable::of(Arc::clone(&self.0))
            .items()
            .into_iter()
            .map(|(key, version)| {
                Item::from([
                    ("pk".to_string(), AttributeValue::S(key)),
                    (
                        "v".to_string(),
                        AttributeValue::N(Number::new(version.to_string())),
                    ),
                ])
            })
            .collect()
    }

    fn now_ms(&self) -> i64 {
        self.0.wall_now_ms()
    }
}

/// One seed's exports: the fake service and bucket, and the engine's settings.
pub struct ExportScript {
    /// The export service and bucket (it outlives the runs of a seed).
    pub fake: FakeExports,
    max_concurrency: usize,
    page_lines: usize,
    /// The first export started FAILED.
    pub fails: bool,
}

impl ExportScript {
    /// The exports of seed `seed` of the table behind `stream` (see `mirror_sim.rs`).
    pub fn seeded(seed: u64, stream: &Arc<FakeStreams>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6578_706f);
        let files = rng.random_range(1..=5);
        let fake = FakeExports::new("b", TableAsExported(Arc::clone(stream)))
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

/// Whether the committed state holds an open snapshot that has read part of an export's files
/// or all of them and is not yet closed: a crash there landed among the files.
pub fn among_the_files(path: &Path) -> bool {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut statement = db
        .prepare("SELECT part, value FROM _ddbpipe_state WHERE pipeline = 'p'")
        .unwrap();
    let parts: BTreeMap<String, Value> = statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .map(|(part, value)| (part, serde_json::from_str(&value).unwrap()))
        .collect();
    let Some(meta) = parts.get("meta") else {
        return false;
    };
    let snapshot = &meta["position"]["snapshot"];
    let reading = snapshot["export_arn"].is_string() && snapshot["complete"] == false;
    let progress = snapshot["done"]
        .as_array()
        .is_some_and(|done| !done.is_empty())
        || parts.keys().any(|part| part.starts_with("segment:"));
    reading && progress
}
