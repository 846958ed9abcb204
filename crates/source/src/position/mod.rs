//! Every stored position, in one place (docs/state.md §6.3). Positions are read strictly:
//! anything unexpected is corruption, reported with its JSON path below the position.
//!
//! - [`ScanPosition`] (`scan.rs`): a scan or query — finished segments and the cursors of
//!   started ones; an export data file's cursor is [`file_cursor`] (its items handed on).
//! - [`StreamsPosition`] (`streams.rs`): a streams or mirror read — one [`ShardProgress`] per
//!   shard (`TrimHorizon | After(seq) | ShardEnd`), the stream, the open snapshot.
//! - [`SnapshotRecord`] (`snapshot.rs`): the open snapshot of a mirror or resnapshot, with its
//!   scan progress.
//! - [`LeaseCheckpoint`] (`lease.rs`): where a leased unit stands, as its lease row keeps it
//!   (a segment cursor, `Done`, `After(seq)`, `Latest`, `ShardEnd`, the leader's settings).
//! - [`PositionParts`] (`parts.rs`): a position's segment cursors and shard entries taken out
//!   of it, for a database that keeps each in a row of its own.
//! - [`RepairRecord`] (`repair.rs`): the open repair of a stream gap by incremental exports,
//!   with its windows and the current export's file progress.
//!
//! The read requests' own start points are not stored positions: a page's cursor is
//! [`crate::records::SegmentCursor`], a shard iterator's start is [`crate::api::StartAt`].

mod lease;
mod parts;
mod repair;
mod scan;
mod snapshot;
mod streams;

use serde_json::Value as Json;

pub use lease::{CheckpointKind, LeaseCheckpoint};
pub use parts::{PositionParts, put_parts, take_parts};
pub use repair::{MAX_WINDOW_MS, MIN_WINDOW_MS, RepairRecord, SharedRepair};
pub use scan::{ScanKind, ScanPosition, cursor_lines, file_cursor};
pub use snapshot::{SnapshotReason, SnapshotRecord};
pub use streams::{ShardProgress, StreamKind, StreamsPosition};

/// A stored position of any mode.
#[derive(Debug, Clone, PartialEq)]
pub enum Position {
    /// Scan or query progress.
    Scan(ScanPosition),
    /// Streams or mirror progress.
    Streams(StreamsPosition),
}

/// A position that does not decode: the JSON path below the position and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionError {
    /// Path relative to the position, e.g. `shards.s1` (empty = the position itself).
    pub path: String,
    /// What is wrong.
    pub problem: String,
}

impl PositionError {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, problem: impl Into<String>) -> Self {
        PositionError {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

/// Deserializes `json` as `T`, naming the path of the first problem.
fn strict<T: serde::de::DeserializeOwned>(json: &Json) -> Result<T, PositionError> {
    serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        PositionError::new(
            if path == "." { String::new() } else { path },
            e.into_inner().to_string(),
        )
    })
}

impl Position {
    /// Reads a stored position strictly.
    pub fn from_json(json: &Json) -> Result<Position, PositionError> {
        match json.get("kind").and_then(Json::as_str) {
            Some("scan" | "query" | "export") => Ok(Position::Scan(ScanPosition::from_json(json)?)),
            Some("streams" | "mirror") => Ok(Position::Streams(StreamsPosition::from_json(json)?)),
            Some(other) => Err(PositionError::new(
                "kind",
                format!("unknown position kind '{other}'"),
            )),
            None => Err(PositionError::new("kind", "missing or not a string")),
        }
    }

    /// The position as stored (sorted keys).
    pub fn to_json(&self) -> Json {
        match self {
            Position::Scan(scan) => scan.to_json(),
            Position::Streams(streams) => streams.to_json(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_scan_position_round_trips() {
        let json = json!({"cursors":{"3":{"pk":{"S":"k17"}}},"done":[[0,2],[5,5]],"kind":"scan","total_segments":8});
        let position = Position::from_json(&json).unwrap();
        assert_eq!(position.to_json(), json);
    }

    #[test]
    fn a_shard_sequence_that_is_a_number_is_corruption_at_its_path() {
        let json = json!({"finished":[],"kind":"streams","latest_floor_ms":{},"shards":{"s1":4960},
            "snapshot":null,"stream_arn":"arn:x","verified_at":{}});
        let error = Position::from_json(&json).unwrap_err();
        assert_eq!(error.path, "shards.s1");
    }

    #[test]
    fn unknown_fields_and_bad_cursors_are_corruption() {
        let extra = json!({"cursors":{},"done":[],"kind":"scan","total_segments":1,"x":1});
        assert!(Position::from_json(&extra).is_err());
        let bad =
            json!({"cursors":{"0":{"pk":{"Q":"x"}}},"done":[],"kind":"scan","total_segments":1});
        let error = Position::from_json(&bad).unwrap_err();
        assert!(error.path.starts_with("cursors.0"), "{error:?}");
        let outside =
            json!({"cursors":{"4":{"pk":{"S":"x"}}},"done":[],"kind":"scan","total_segments":2});
        assert!(Position::from_json(&outside).is_err());
    }

    #[test]
    fn an_unknown_kind_is_corruption_at_kind() {
        let error = Position::from_json(&json!({"kind":"backup"})).unwrap_err();
        assert_eq!(error.path, "kind");
        assert!(error.problem.contains("'backup'"), "{error:?}");
    }
}
