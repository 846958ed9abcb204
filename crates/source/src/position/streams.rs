//! Where a streams read stands, per shard (docs/state.md §6.3). Stored in the state file (or the
//! sink's database) and read back strictly.
//!
//! # Per shard: one [`ShardProgress`]
//! - `TrimHorizon`: admitted, nothing delivered yet; the read starts at `TRIM_HORIZON` (with
//!   the shard's LATEST floor, if any). Its `verified_at` (unix s) says every record created
//!   before then was delivered or is not needed.
//! - `After(seq)`: every record up to and including `seq` was acknowledged; the read resumes
//!   `AFTER_SEQUENCE_NUMBER seq`.
//! - `ShardEnd`: the shard's last record was acknowledged, so its children may be read. It
//!   keeps its frontier (unix s) for its children until it is pruned.
//!
//! # Stored layout
//! The file keeps the layout of every earlier version: `shards` maps each open shard to `""`
//! (`TrimHorizon`) or its sequence number, `finished` lists the `ShardEnd` shards, and
//! `verified_at` / `latest_floor_ms` hold the numbers by shard id. `read_at` holds, for a
//! positioned shard, the creation time (unix s) of the earliest record of the hand-over that
//! reached its position, or the time of the first of two empty reads once it is caught up:
//! every record created before then was delivered. A repair of a gap
//! starts its window there (docs/streams.md §4.12). Reading checks that they agree: a shard both
//! open and finished, a floor of a shard that is not at its trim horizon, a `read_at` of a
//! shard that is not positioned, or a number for a shard the position does not hold is
//! corruption, named by its path. `repair` is the open repair, when there is one.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{PositionError, RepairRecord, SnapshotRecord, strict};
use crate::ids::{SequenceNumber, ShardId};

/// What has been committed for one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardProgress {
    /// Admitted, nothing acknowledged yet (stored as `""`).
    TrimHorizon {
        /// Unix s before which every record was delivered or is not needed.
        verified_at: Option<i64>,
        /// The time floor (unix ms) of a shard first read at `LATEST` (docs/streams.md §4.4).
        floor_ms: Option<i64>,
    },
    /// Everything up to and including this record was acknowledged.
    After(SequenceNumber),
    /// The shard's last record was acknowledged (stored in `finished`).
    ShardEnd {
        /// The shard's frontier (unix s), inherited by its children.
        frontier: Option<i64>,
    },
}

impl ShardProgress {
    /// Whether the shard was read to its end.
    pub fn is_finished(&self) -> bool {
        matches!(self, ShardProgress::ShardEnd { .. })
    }

    /// Unix s before which every record of the shard was delivered or is not needed: the
    /// verification of a shard at its trim horizon, the frontier of a finished one.
    pub fn verified_at(&self) -> Option<i64> {
        match self {
            ShardProgress::TrimHorizon { verified_at, .. } => *verified_at,
            ShardProgress::After(_) => None,
            ShardProgress::ShardEnd { frontier } => *frontier,
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

/// A streams or mirror position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Stored", into = "Stored")]
pub struct StreamsPosition {
    /// `streams` or `mirror`.
    pub kind: StreamKind,
    /// Per shard, what has been acknowledged.
    pub shards: BTreeMap<ShardId, ShardProgress>,
    /// The open snapshot of a mirror or resnapshot.
    pub snapshot: Option<Box<SnapshotRecord>>,
    /// The stream these shards belong to.
    pub stream_arn: Option<String>,
    /// Per positioned shard, unix s before which every record of it was delivered (see the
    /// module docs); absent when no record said when it was created.
    pub read_at: BTreeMap<ShardId, i64>,
    /// The open repair of a gap by incremental exports.
    pub repair: Option<Box<RepairRecord>>,
}

impl StreamsPosition {
    /// An empty position of `kind` for `stream_arn`.
    pub fn new(kind: StreamKind, stream_arn: Option<String>) -> Self {
        StreamsPosition {
            kind,
            shards: BTreeMap::new(),
            snapshot: None,
            stream_arn,
            read_at: BTreeMap::new(),
            repair: None,
        }
    }

    /// The open repair's id, the marker of its rows in a keyed sink.
    pub fn repair_id(&self) -> Option<i64> {
        self.repair.as_ref().map(|repair| repair.id)
    }

    /// Records that every record of positioned `shard` created before `at` (unix s) was
    /// delivered. The time only moves forward; a shard not positioned keeps none.
    pub fn read(&mut self, shard: &ShardId, at: i64) {
        if matches!(self.shards.get(shard), Some(ShardProgress::After(_))) {
            let entry = self.read_at.entry(shard.clone()).or_insert(at);
            *entry = (*entry).max(at);
        }
    }

    /// The time (unix s) before which every record of the position's open shards was
    /// delivered: the earliest of their `read_at` (positioned shards) and `verified_at`
    /// (shards at their trim horizon). `Err` names a shard that does not say.
    pub fn delivered_before(&self) -> Result<Option<i64>, ShardId> {
        let mut earliest: Option<i64> = None;
        for (id, progress) in self.open_shards() {
            let at = match progress {
                ShardProgress::After(_) => self.read_at.get(id).copied(),
                other => other.verified_at(),
            };
            let at = at.ok_or_else(|| id.clone())?;
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
        Ok(earliest)
    }

    /// The open snapshot's id, the marker of its rows in a keyed sink.
    pub fn snapshot_id(&self) -> Option<i64> {
        self.snapshot.as_ref().map(|snapshot| snapshot.id)
    }

    /// Whether `shard` is known to the position (at any progress).
    pub fn knows(&self, shard: &ShardId) -> bool {
        self.shards.contains_key(shard)
    }

    /// What has been acknowledged of `shard`.
    pub fn progress(&self, shard: &ShardId) -> Option<&ShardProgress> {
        self.shards.get(shard)
    }

    /// Whether `shard` was read to its end.
    pub fn is_finished(&self, shard: &ShardId) -> bool {
        self.shards
            .get(shard)
            .is_some_and(ShardProgress::is_finished)
    }

    /// The finished shards, sorted.
    pub fn finished(&self) -> impl Iterator<Item = &ShardId> {
        self.shards
            .iter()
            .filter(|(_, progress)| progress.is_finished())
            .map(|(id, _)| id)
    }

    /// The shards not yet read to their end, sorted, with their progress.
    pub fn open_shards(&self) -> impl Iterator<Item = (&ShardId, &ShardProgress)> {
        self.shards
            .iter()
            .filter(|(_, progress)| !progress.is_finished())
    }

    /// See [`ShardProgress::verified_at`].
    pub fn verified_at(&self, shard: &ShardId) -> Option<i64> {
        self.shards.get(shard).and_then(ShardProgress::verified_at)
    }

    /// Records that everything up to `seq` in `shard` was acknowledged. Positions never move
    /// backwards; the floor of the shard is dropped once it advances, its verification becomes
    /// its `read_at` until a later record says more.
    pub fn advance(&mut self, shard: &ShardId, seq: &SequenceNumber) {
        let newer = match self.shards.get(shard) {
            Some(ShardProgress::ShardEnd { .. }) => false,
            Some(ShardProgress::After(current)) => seq > current,
            Some(ShardProgress::TrimHorizon { .. }) | None => true,
        };
        if newer {
            // What the trim horizon's verification said stays true once the shard advances.
            if let Some(ShardProgress::TrimHorizon {
                verified_at: Some(at),
                ..
            }) = self.shards.get(shard)
            {
                self.read_at.entry(shard.clone()).or_insert(*at);
            }
            self.shards
                .insert(shard.clone(), ShardProgress::After(seq.clone()));
        }
    }

    /// Records that the shard's last record was acknowledged (`ShardEnd`), keeping `frontier`
    /// (unix s) for its children.
    pub fn finish(&mut self, shard: &ShardId, frontier: Option<i64>) {
        self.read_at.remove(shard);
        self.shards
            .insert(shard.clone(), ShardProgress::ShardEnd { frontier });
    }

    /// Admits a shard with nothing read, verified at `verified_at`; a known shard stays as
    /// it is.
    pub fn admit(&mut self, shard: &ShardId, verified_at: Option<i64>, floor_ms: Option<i64>) {
        self.shards
            .entry(shard.clone())
            .or_insert(ShardProgress::TrimHorizon {
                verified_at,
                floor_ms,
            });
    }

    /// Raises the verification of a shard still at its trim horizon to `at`; other shards
    /// are left as they are.
    pub fn verify(&mut self, shard: &ShardId, at: i64) {
        if let Some(ShardProgress::TrimHorizon { verified_at, .. }) = self.shards.get_mut(shard) {
            *verified_at = Some(at);
        }
    }

    /// Drops everything the position holds for `shard`.
    pub fn forget(&mut self, shard: &ShardId) {
        self.read_at.remove(shard);
        self.shards.remove(shard);
    }

    /// Reads a stored streams or mirror position strictly.
    pub(super) fn from_json(json: &Json) -> Result<Self, PositionError> {
        strict::<Stored>(json)?.decode()
    }

    /// The position as stored (sorted keys).
    pub(super) fn to_json(&self) -> Json {
        serde_json::to_value(Stored::from(self.clone())).unwrap_or(Json::Null)
    }
}

/// The stored layout (see the module docs).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    finished: BTreeSet<ShardId>,
    kind: StreamKind,
    #[serde(default)]
    latest_floor_ms: BTreeMap<ShardId, i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    read_at: BTreeMap<ShardId, i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repair: Option<Box<RepairRecord>>,
    shards: BTreeMap<ShardId, StoredShard>,
    snapshot: Option<Box<SnapshotRecord>>,
    stream_arn: Option<String>,
    #[serde(default)]
    verified_at: BTreeMap<ShardId, i64>,
}

/// A stored entry of `shards`: `""` or a sequence number.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredShard {
    #[serde(with = "empty")]
    TrimHorizon,
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

impl Stored {
    fn decode(self) -> Result<StreamsPosition, PositionError> {
        let Stored {
            finished,
            kind,
            mut latest_floor_ms,
            read_at,
            repair,
            shards: stored_shards,
            snapshot,
            stream_arn,
            mut verified_at,
        } = self;
        let mut shards = BTreeMap::new();
        for (id, stored) in stored_shards {
            let progress = match stored {
                StoredShard::TrimHorizon => ShardProgress::TrimHorizon {
                    verified_at: verified_at.remove(&id),
                    floor_ms: latest_floor_ms.remove(&id),
                },
                StoredShard::After(seq) => ShardProgress::After(seq),
            };
            shards.insert(id, progress);
        }
        for id in finished {
            if shards.contains_key(&id) {
                return Err(PositionError::new(
                    format!("finished.{id}"),
                    format!("shard '{id}' is finished and also listed in shards"),
                ));
            }
            if latest_floor_ms.contains_key(&id) {
                return Err(PositionError::new(
                    format!("latest_floor_ms.{id}"),
                    format!("shard '{id}' is finished: it has no floor"),
                ));
            }
            let frontier = verified_at.remove(&id);
            shards.insert(id, ShardProgress::ShardEnd { frontier });
        }
        for (field, left) in [
            ("verified_at", verified_at),
            ("latest_floor_ms", latest_floor_ms),
        ] {
            if let Some(id) = left.keys().next() {
                return Err(PositionError::new(
                    format!("{field}.{id}"),
                    format!(
                        "shard '{id}' is not at its trim horizon or finished, so it has no {field}"
                    ),
                ));
            }
        }
        if let Some(id) = read_at
            .keys()
            .find(|id| !matches!(shards.get(*id), Some(ShardProgress::After(_))))
        {
            return Err(PositionError::new(
                format!("read_at.{id}"),
                format!("shard '{id}' is not positioned, so it has no read_at"),
            ));
        }
        if let Some(repair) = &repair {
            repair
                .check()
                .map_err(|problem| PositionError::new("repair", problem))?;
            if snapshot.is_some() {
                return Err(PositionError::new(
                    "repair",
                    "a repair and a snapshot are both open",
                ));
            }
        }
        Ok(StreamsPosition {
            kind,
            shards,
            snapshot,
            stream_arn,
            read_at,
            repair,
        })
    }
}

impl From<StreamsPosition> for Stored {
    fn from(position: StreamsPosition) -> Self {
        let mut stored = Stored {
            finished: BTreeSet::new(),
            kind: position.kind,
            latest_floor_ms: BTreeMap::new(),
            read_at: position.read_at,
            repair: position.repair,
            shards: BTreeMap::new(),
            snapshot: position.snapshot,
            stream_arn: position.stream_arn,
            verified_at: BTreeMap::new(),
        };
        for (id, progress) in position.shards {
            match progress {
                ShardProgress::TrimHorizon {
                    verified_at,
                    floor_ms,
                } => {
                    if let Some(at) = verified_at {
                        stored.verified_at.insert(id.clone(), at);
                    }
                    if let Some(floor) = floor_ms {
                        stored.latest_floor_ms.insert(id.clone(), floor);
                    }
                    stored.shards.insert(id, StoredShard::TrimHorizon);
                }
                ShardProgress::After(seq) => {
                    stored.shards.insert(id, StoredShard::After(seq));
                }
                ShardProgress::ShardEnd { frontier } => {
                    if let Some(at) = frontier {
                        stored.verified_at.insert(id.clone(), at);
                    }
                    stored.finished.insert(id);
                }
            }
        }
        stored
    }
}

impl TryFrom<Stored> for StreamsPosition {
    type Error = String;

    fn try_from(stored: Stored) -> Result<Self, String> {
        stored
            .decode()
            .map_err(|e| format!("{}: {}", e.path, e.problem))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::position::Position;

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    fn decode(json: Json) -> Result<StreamsPosition, PositionError> {
        match Position::from_json(&json)? {
            Position::Streams(position) => Ok(position),
            Position::Scan(_) => panic!("not a streams position"),
        }
    }

    #[test]
    fn the_documented_layout_round_trips() {
        let json = json!({"finished":["s0"],"kind":"streams","latest_floor_ms":{"s2":5},"shards":{"s1":"4960","s2":""},
            "snapshot":null,"stream_arn":"arn:x","verified_at":{"s0":1767225000,"s2":1767225600}});
        let position = decode(json.clone()).unwrap();
        assert_eq!(
            position.shards[&ShardId::new("s2")],
            ShardProgress::TrimHorizon {
                verified_at: Some(1767225600),
                floor_ms: Some(5)
            }
        );
        assert_eq!(
            position.shards[&ShardId::new("s0")],
            ShardProgress::ShardEnd {
                frontier: Some(1767225000)
            }
        );
        assert_eq!(Position::Streams(position.clone()).to_json(), json);
        assert_eq!(serde_json::to_value(&position).unwrap(), json);
        let bad = json!({"finished":[],"kind":"streams","shards":{"s1":4960},"snapshot":null,"stream_arn":null});
        assert!(decode(bad).is_err());
    }

    #[test]
    fn stored_maps_that_disagree_are_corruption_at_their_path() {
        let base = |extra: Json| {
            let mut json = json!({"finished":["s0"],"kind":"streams","shards":{"s1":"4960","s2":""},
                "snapshot":null,"stream_arn":"arn:x"});
            for (key, value) in extra.as_object().unwrap() {
                json[key] = value.clone();
            }
            decode(json).map(|_| ()).map_err(|e| e.path)
        };
        assert_eq!(base(json!({})), Ok(()));
        assert_eq!(
            base(json!({"finished":["s1"]})),
            Err("finished.s1".to_string())
        );
        assert_eq!(
            base(json!({"verified_at":{"s1":1}})),
            Err("verified_at.s1".to_string())
        );
        assert_eq!(
            base(json!({"verified_at":{"gone":1}})),
            Err("verified_at.gone".to_string())
        );
        assert_eq!(
            base(json!({"latest_floor_ms":{"s0":1}})),
            Err("latest_floor_ms.s0".to_string())
        );
        assert_eq!(
            base(json!({"latest_floor_ms":{"s1":1}})),
            Err("latest_floor_ms.s1".to_string())
        );
    }

    #[test]
    fn positions_never_move_backwards_and_finished_shards_stay_finished() {
        let mut p = StreamsPosition::new(StreamKind::Streams, None);
        let s1 = ShardId::new("s1");
        p.admit(&s1, Some(100), Some(5));
        p.verify(&s1, 150);
        assert_eq!(p.verified_at(&s1), Some(150));
        p.advance(&s1, &seq("20"));
        assert_eq!(p.shards[&s1], ShardProgress::After(seq("20")));
        p.verify(&s1, 200);
        p.advance(&s1, &seq("9"));
        assert_eq!(p.shards[&s1], ShardProgress::After(seq("20")));
        p.finish(&s1, Some(1234));
        p.advance(&s1, &seq("30"));
        assert!(p.is_finished(&s1));
        assert_eq!(p.verified_at(&s1), Some(1234));
        p.admit(&s1, None, None);
        assert!(p.is_finished(&s1), "a finished shard is not admitted again");
        assert_eq!(p.finished().count(), 1);
        assert_eq!(p.open_shards().count(), 0);
        p.forget(&s1);
        assert!(!p.knows(&s1));
    }

    #[test]
    fn read_at_follows_the_delivered_records_and_is_stored_only_for_positioned_shards() {
        let mut p = StreamsPosition::new(StreamKind::Mirror, Some("arn:x".into()));
        let (a, b, c) = (ShardId::new("a"), ShardId::new("b"), ShardId::new("c"));
        p.admit(&a, Some(100), None);
        p.admit(&b, Some(300), None);
        p.admit(&c, None, None);
        // Leaving the trim horizon keeps what its verification said.
        p.advance(&a, &seq("10"));
        assert_eq!(p.read_at.get(&a), Some(&100));
        p.read(&a, 250);
        p.read(&a, 200);
        assert_eq!(p.read_at.get(&a), Some(&250), "the time only moves forward");
        p.read(&b, 999);
        assert!(!p.read_at.contains_key(&b), "b is not positioned");
        // c has no verification: the position cannot say when it was read.
        assert_eq!(p.delivered_before(), Err(c.clone()));
        p.verify(&c, 400);
        assert_eq!(p.delivered_before(), Ok(Some(250)));

        let json = Position::Streams(p.clone()).to_json();
        assert_eq!(json["read_at"], json!({"a": 250}));
        assert_eq!(decode(json.clone()).unwrap(), p);
        let mut bad = json.clone();
        bad["read_at"] = json!({"b": 1});
        assert_eq!(decode(bad).unwrap_err().path, "read_at.b");

        p.finish(&a, Some(260));
        assert!(
            p.read_at.is_empty(),
            "a finished shard keeps its frontier only"
        );
        let json = Position::Streams(p).to_json();
        assert!(json.get("read_at").is_none(), "an empty map is not written");
    }

    #[test]
    fn an_open_repair_round_trips_and_beside_a_snapshot_is_corruption() {
        let mut p = StreamsPosition::new(StreamKind::Mirror, Some("arn:x".into()));
        p.repair = Some(Box::new(RepairRecord::open(
            5_000_000,
            1_000_000,
            2_000_000,
            &[],
        )));
        let json = Position::Streams(p.clone()).to_json();
        assert_eq!(json["repair"]["window_to_ms"], json!(2_000_000));
        assert_eq!(decode(json.clone()).unwrap(), p);
        let mut both = json.clone();
        both["snapshot"] = serde_json::to_value(crate::position::SnapshotRecord::open(
            1,
            1,
            crate::position::SnapshotReason::Mirror,
            &[],
            0,
        ))
        .unwrap();
        assert_eq!(decode(both).unwrap_err().path, "repair");
        let mut long = json;
        long["repair"]["to_ms"] = json!(200_000_000);
        long["repair"]["window_to_ms"] = json!(200_000_000);
        assert_eq!(decode(long).unwrap_err().path, "repair");
    }
}
