//! Where a streams read stands, per shard (docs/state.md §6.3). Stored in the state file (or the sink's
//! database) and read back strictly.
//!
//! # Per shard
//! - `shards[id] = ""`: admitted, nothing delivered yet; the read starts at `TRIM_HORIZON`
//!   (with the shard's `latest_floor_ms`, if any). `verified_at[id]` (unix s) says every record
//!   created before then was delivered or is not needed.
//! - `shards[id] = "<seq>"`: every record up to and including `<seq>` was acknowledged; the read
//!   resumes `AFTER_SEQUENCE_NUMBER <seq>`.
//! - `finished` holds shards whose last record was acknowledged (`ShardEnd`): their children
//!   may be read. A finished shard keeps its frontier in `verified_at` until it is pruned.
//!
//! # The open snapshot (docs/state.md §6.3)
//! A mirror's first scan or a resnapshot is a [`SnapshotRecord`] beside the shards: why it was
//! opened, its id (the marker of its rows in a keyed sink), its scan progress (`cursors`,
//! `done`, `total_segments`, decoded by the pipeline's checkpointer) and whether the scan
//! completed. Fields this version does not know are kept as stored.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{SequenceNumber, ShardId};

/// What has been committed for one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ShardCheckpoint {
    /// Admitted, nothing acknowledged yet (stored as `""`).
    #[serde(with = "empty")]
    TrimHorizon,
    /// Everything up to and including this record was acknowledged.
    After(SequenceNumber),
}

mod empty {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("")
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            Ok(())
        } else {
            Err(D::Error::custom("expected \"\""))
        }
    }
}

/// The kind of a stream position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// `mode: streams`.
    Streams,
    /// `mode: mirror`.
    Mirror,
}

/// Why a snapshot was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotReason {
    /// `on_gap: resnapshot` found a gap.
    Resnapshot,
    /// A mirror's first run.
    Mirror,
}

impl SnapshotReason {
    /// `"resnapshot"` or `"mirror"`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotReason::Resnapshot => "resnapshot",
            SnapshotReason::Mirror => "mirror",
        }
    }
}

/// The open snapshot of a mirror or resnapshot, as stored (sorted keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The capture time (unix s).
    pub captured_at: i64,
    /// Whether the scan completed (only the closing, with its cleanup, is left).
    pub complete: bool,
    /// Per segment in progress, its `ExclusiveStartKey` as typed JSON.
    pub cursors: BTreeMap<String, serde_json::Value>,
    /// Rows the destination held at the capture (a mirror deletes unseen rows only when it
    /// held some); absent = 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_rows_at_start: Option<u64>,
    /// Segments read to their end, as inclusive ranges.
    pub done: Vec<[u32; 2]>,
    /// Why the stream had a gap (a resnapshot).
    pub gap_reasons: Vec<String>,
    /// The snapshot id (the capture time in unix ms): the marker of its rows.
    pub id: i64,
    /// Keys written, as recorded at the capture.
    pub keys_written: u64,
    /// Why it was opened.
    pub reason: SnapshotReason,
    /// `TotalSegments` of its scan.
    pub total_segments: u32,
    /// Fields of another version, kept as stored.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A streams or mirror position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsPosition {
    /// Shards whose last record was acknowledged, sorted.
    pub finished: BTreeSet<ShardId>,
    /// `streams` or `mirror`.
    pub kind: StreamKind,
    /// Time floors (unix ms) of shards first read at `LATEST` (docs/streams.md §4.4).
    #[serde(default)]
    pub latest_floor_ms: BTreeMap<ShardId, i64>,
    /// Per shard, what has been acknowledged.
    pub shards: BTreeMap<ShardId, ShardCheckpoint>,
    /// The open snapshot of a mirror or resnapshot.
    pub snapshot: Option<Box<SnapshotRecord>>,
    /// The stream these shards belong to.
    pub stream_arn: Option<String>,
    /// Per shard stored `""` (and finished shards' frontiers): unix s before which every
    /// record was delivered or is not needed.
    #[serde(default)]
    pub verified_at: BTreeMap<ShardId, i64>,
}

impl StreamsPosition {
    /// An empty position of `kind` for `stream_arn`.
    pub fn new(kind: StreamKind, stream_arn: Option<String>) -> Self {
        StreamsPosition {
            finished: BTreeSet::new(),
            kind,
            latest_floor_ms: BTreeMap::new(),
            shards: BTreeMap::new(),
            snapshot: None,
            stream_arn,
            verified_at: BTreeMap::new(),
        }
    }

    /// The open snapshot's id, the marker of its rows in a keyed sink.
    pub fn snapshot_id(&self) -> Option<i64> {
        self.snapshot.as_ref().map(|snapshot| snapshot.id)
    }

    /// Whether `shard` is known to the position (positioned, `""` or finished).
    pub fn knows(&self, shard: &ShardId) -> bool {
        self.shards.contains_key(shard) || self.finished.contains(shard)
    }

    /// Records that everything up to `seq` in `shard` was acknowledged. Positions never move
    /// backwards; the floor and `verified_at` of the shard are dropped once it advances.
    pub fn advance(&mut self, shard: &ShardId, seq: &SequenceNumber) {
        if self.finished.contains(shard) {
            return;
        }
        let newer = match self.shards.get(shard) {
            Some(ShardCheckpoint::After(current)) => seq > current,
            _ => true,
        };
        if newer {
            self.shards
                .insert(shard.clone(), ShardCheckpoint::After(seq.clone()));
            self.latest_floor_ms.remove(shard);
            self.verified_at.remove(shard);
        }
    }

    /// Records that the shard's last record was acknowledged (`ShardEnd`), keeping `frontier`
    /// (unix s) in `verified_at` for its children.
    pub fn finish(&mut self, shard: &ShardId, frontier: Option<i64>) {
        self.shards.remove(shard);
        self.latest_floor_ms.remove(shard);
        self.finished.insert(shard.clone());
        match frontier {
            Some(at) => {
                self.verified_at.insert(shard.clone(), at);
            }
            None => {
                self.verified_at.remove(shard);
            }
        }
    }

    /// Admits a shard with nothing read: stored `""`, verified at `verified_at`.
    pub fn admit(&mut self, shard: &ShardId, verified_at: Option<i64>, floor_ms: Option<i64>) {
        if self.knows(shard) {
            return;
        }
        self.shards
            .insert(shard.clone(), ShardCheckpoint::TrimHorizon);
        if let Some(at) = verified_at {
            self.verified_at.insert(shard.clone(), at);
        }
        if let Some(floor) = floor_ms {
            self.latest_floor_ms.insert(shard.clone(), floor);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    #[test]
    fn the_documented_layout_round_trips() {
        let json = json!({"finished":["s0"],"kind":"streams","latest_floor_ms":{},"shards":{"s1":"4960","s2":""},
            "snapshot":null,"stream_arn":"arn:x","verified_at":{"s2":1767225600}});
        let position: StreamsPosition = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(
            position.shards[&ShardId::new("s2")],
            ShardCheckpoint::TrimHorizon
        );
        assert_eq!(serde_json::to_value(&position).unwrap(), json);
        let bad = json!({"finished":[],"kind":"streams","shards":{"s1":4960},"snapshot":null,"stream_arn":null});
        assert!(serde_json::from_value::<StreamsPosition>(bad).is_err());
    }

    #[test]
    fn a_snapshot_record_round_trips_keeping_fields_of_another_version() {
        let json = json!({"captured_at":1,"complete":false,"cursors":{"1":{"pk":{"S":"a"}}},
            "destination_rows_at_start":3,"done":[[0,0]],"gap_reasons":["g"],"id":1000,
            "keys_written":0,"later":{"x":1},"reason":"mirror","total_segments":4});
        let record: SnapshotRecord = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(record.reason, SnapshotReason::Mirror);
        assert_eq!(record.other["later"], json!({"x": 1}));
        assert_eq!(serde_json::to_value(&record).unwrap(), json);
    }

    #[test]
    fn positions_never_move_backwards_and_finished_shards_stay_finished() {
        let mut p = StreamsPosition::new(StreamKind::Streams, None);
        let s1 = ShardId::new("s1");
        p.admit(&s1, Some(100), Some(5));
        p.advance(&s1, &seq("20"));
        assert!(!p.verified_at.contains_key(&s1) && !p.latest_floor_ms.contains_key(&s1));
        p.advance(&s1, &seq("9"));
        assert_eq!(p.shards[&s1], ShardCheckpoint::After(seq("20")));
        p.finish(&s1, Some(1234));
        p.advance(&s1, &seq("30"));
        assert!(p.finished.contains(&s1) && !p.shards.contains_key(&s1));
        assert_eq!(p.verified_at[&s1], 1234);
        p.admit(&s1, None, None);
        assert!(
            !p.shards.contains_key(&s1),
            "a finished shard is not admitted again"
        );
    }
}
