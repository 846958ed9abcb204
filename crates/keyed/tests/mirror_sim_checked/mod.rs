//! The mirror simulation's sink (`mirror_sim.rs`): the keyed sink into SQLite, checked after
//! every batch it acknowledges, and the destination's rows as the checks read them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ddbpipe_keyed::sink::KeyedSink;
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Sink, SinkError, Staged, Versioned};
use ddbpipe_source::fake_export::FakeExports;
use ddbpipe_source::fake_streams::{FakeStreamTable, FakeStreams};
use serde_json::Value;
use tokio::sync::Notify;

use super::mirror_sim_repair;

/// The latest committed change per key: its version, and whether it deleted the item.
pub type Committed = BTreeMap<String, (u64, bool)>;

/// The keyed sink, checked after every batch it acknowledges.
pub struct Checked {
    pub seed: u64,
    pub inner: KeyedSink,
    pub path: std::path::PathBuf,
    pub stream: Arc<FakeStreams>,
    /// Carried across the seed's runs.
    pub committed: Committed,
    /// Batches with rows read from an export (a snapshot's, or a repair's changes) or a `Scan`
    /// written so far.
    pub read_batches: u64,
    /// Crash once this many such batches are written.
    pub crash_after: Option<u64>,
    pub crash: Arc<Notify>,
    /// In a repair phase, the exports the repair reads (they say its windows).
    pub repairs: Option<FakeExports>,
    /// See `Carried::repair_end` (`mirror_sim.rs`).
    pub repair_end: bool,
}

impl Checked {
    /// The version of the delete a repair change at `ts_ms` stands for: an incremental
    /// export's line keeps the item as it was before the window, not before the delete.
    fn deleted_version(&self, key: &str, ts_ms: i64) -> u64 {
        let history = self.stream.history();
        let write = history
            .iter()
            .rev()
            .find(|w| w.key == key && w.removed && w.micros.div_euclid(1000) == ts_ms);
        write.unwrap().version
    }

    /// What the repair committed without a batch: closing a window deleted the rows of its
    /// items created and deleted inside it (the sweep), as if their deletes were committed.
    /// Once the repair is applied, before the first batch of stream records, the destination
    /// is the table as it was at the end of the repair's last window.
    fn repair_committed(&mut self, exports: &FakeExports, stream_records: bool) {
        let repair = mirror_sim_repair::repair_record(&self.path);
        let windows = mirror_sim_repair::windows(&exports.calls());
        let closed = windows.iter().filter(|((_, to), _)| match &repair {
            None => true,
            Some(record) => {
                record["applied"] == true || record["window_from_ms"].as_i64() >= Some(*to)
            }
        });
        let history = self.stream.history();
        for &((from, to), _) in closed {
            for (key, version) in mirror_sim_repair::vanished(&history, from, to) {
                if self.committed.get(&key).is_none_or(|(v, _)| *v < version) {
                    self.committed.insert(key, (version, true));
                }
            }
        }
        if self.repair_end && stream_records && repair.is_none() {
            let &((_, to_ms), _) = windows.last().unwrap();
            let table = FakeStreamTable::of(Arc::clone(&self.stream)).items_before(to_ms);
            assert_eq!(
                rows(&self.path),
                table,
                "seed {}: once the repair is applied, the destination is the table at its end",
                self.seed
            );
            self.repair_end = false;
        }
    }
}

impl Sink for Checked {
    async fn write(&mut self, batch: &Batch, state: Option<&Staged>) -> Result<(), SinkError> {
        let seed = self.seed;
        let envelopes: Vec<Value> = batch
            .records
            .iter()
            .map(|line| serde_json::from_slice(line).unwrap())
            .collect();
        if let Some(exports) = self.repairs.clone() {
            let stream_records = envelopes.iter().any(|e| e["sequence_number"].is_string());
            self.repair_committed(&exports, stream_records);
        }
        self.inner.write(batch, state).await?;
        let mut read_rows = false;
        for envelope in &envelopes {
            let key = envelope["key"]["pk"].as_str().unwrap().to_string();
            let op = envelope["op"].as_str().unwrap();
            // A change without a sequence number comes from a repair's incremental export.
            let repair = op != "r" && envelope["sequence_number"].is_null();
            read_rows |= op == "r" || repair;
            let change = match op {
                "c" | "u" => (envelope["after"]["v"].as_u64().unwrap(), false),
                // A delete of version n is the item's version n + 1.
                "d" if !repair => (envelope["before"]["v"].as_u64().map_or(1, |v| v + 1), true),
                "d" => (
                    self.deleted_version(&key, envelope["ts_ms"].as_i64().unwrap()),
                    true,
                ),
                _ => continue,
            };
            // A repair change applies only over an older row (docs/streams.md §4.12); a stream
            // change always applies, also when the stream replays changes the repair
            // already wrote.
            if !repair || self.committed.get(&key).is_none_or(|(v, _)| *v < change.0) {
                self.committed.insert(key, change);
            }
        }
        let rows = rows(&self.path);
        for (key, (version, deleted)) in &self.committed {
            match rows.get(key) {
                Some(row) if *row < *version && !deleted => panic!(
                    "seed {seed}: row {key} holds version {row}, older than the committed change \
                     to {version}"
                ),
                Some(row) if *deleted && *row < *version => panic!(
                    "seed {seed}: row {key} holds version {row}, though its delete (version \
                     {version}) was committed"
                ),
                None if !deleted => panic!(
                    "seed {seed}: row {key} is missing after its change to {version} was committed"
                ),
                _ => {}
            }
        }
        if read_rows {
            self.read_batches += 1;
            if self.crash_after == Some(self.read_batches) {
                // The batch is committed; the run dies before it hears so.
                self.crash.notify_one();
                std::future::pending::<()>().await;
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn versioned(&self) -> Option<&impl Versioned> {
        Some(self)
    }
}

/// The keyed sink it checks writes by version.
impl Versioned for Checked {
    fn rows_without_sequence_since(&self, since_ms: i64) -> ddbpipe_pipeline::sink::Detached<u64> {
        self.inner.rows_without_sequence_since(since_ms)
    }
}

/// `pk → v` of the destination table.
pub fn rows(path: &Path) -> BTreeMap<String, u64> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut statement = db.prepare("SELECT pk, document FROM \"t\"").unwrap();
    statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .map(|(pk, document)| {
            let document: Value = serde_json::from_str(&document).unwrap();
            (pk, document["v"].as_u64().unwrap())
        })
        .collect()
}
