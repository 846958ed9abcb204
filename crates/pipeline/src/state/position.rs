//! Positions by mode (docs/state.md §6.3), read strictly: anything unexpected is corruption.

use std::collections::BTreeMap;

use ddbpipe_source::position::StreamsPosition;
use ddbpipe_source::segments::SegmentRanges;
use ddbpipe_value::Item;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// Where a scan or query stands: finished segments and the cursors of started ones.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanPosition {
    /// `"scan"` or `"query"`.
    pub kind: ScanKind,
    /// `TotalSegments` the cursors belong to.
    pub total_segments: u32,
    /// Segments read to their end.
    pub done: SegmentRanges,
    /// `ExclusiveStartKey` of each segment in progress.
    pub cursors: BTreeMap<u32, Item>,
}

/// The two kinds of paged read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanKind {
    /// Parallel `Scan`.
    Scan,
    /// `Query`.
    Query,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScanPositionJson {
    cursors: BTreeMap<String, Json>,
    done: Vec<[u32; 2]>,
    kind: ScanKind,
    total_segments: u32,
}

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

fn strict<T: serde::de::DeserializeOwned>(json: &Json) -> Result<T, PositionError> {
    serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        PositionError {
            path: if path == "." { String::new() } else { path },
            problem: e.into_inner().to_string(),
        }
    })
}

impl ScanPosition {
    /// A fresh position: nothing done, no cursor.
    pub fn new(kind: ScanKind, total_segments: u32) -> Self {
        ScanPosition {
            kind,
            total_segments,
            done: SegmentRanges::new(),
            cursors: BTreeMap::new(),
        }
    }

    /// The cursors as stored: segment number → the key as typed JSON.
    pub fn typed_cursors(&self) -> BTreeMap<String, Json> {
        self.cursors
            .iter()
            .map(|(segment, item)| (segment.to_string(), ddbpipe_value::item_to_typed_json(item)))
            .collect()
    }

    /// Whether any segment has started.
    pub fn has_progress(&self) -> bool {
        self.done.count() > 0 || !self.cursors.is_empty()
    }
}

impl Position {
    /// Reads a stored position strictly.
    pub fn from_json(json: &Json) -> Result<Position, PositionError> {
        let kind = json.get("kind").and_then(Json::as_str);
        match kind {
            Some("scan" | "query") => {
                let raw: ScanPositionJson = strict(json)?;
                let done =
                    SegmentRanges::from_ranges(raw.done).map_err(|problem| PositionError {
                        path: "done".into(),
                        problem,
                    })?;
                let mut cursors = BTreeMap::new();
                for (segment, cursor) in raw.cursors {
                    let path = format!("cursors.{segment}");
                    let number: u32 = segment.parse().map_err(|_| PositionError {
                        path: path.clone(),
                        problem: format!("segment '{segment}' is not a segment number"),
                    })?;
                    if number >= raw.total_segments {
                        return Err(PositionError {
                            path,
                            problem: format!(
                                "segment {number} is outside total_segments {}",
                                raw.total_segments
                            ),
                        });
                    }
                    let item =
                        ddbpipe_value::item_from_typed_json(&cursor, &path).map_err(|e| {
                            PositionError {
                                path: e.path.clone(),
                                problem: e.to_string(),
                            }
                        })?;
                    cursors.insert(number, item);
                }
                Ok(Position::Scan(ScanPosition {
                    kind: raw.kind,
                    total_segments: raw.total_segments,
                    done,
                    cursors,
                }))
            }
            Some("streams" | "mirror") => Ok(Position::Streams(strict(json)?)),
            Some(other) => Err(PositionError {
                path: "kind".into(),
                problem: format!("unknown position kind '{other}'"),
            }),
            None => Err(PositionError {
                path: "kind".into(),
                problem: "missing or not a string".into(),
            }),
        }
    }

    /// The position as stored (sorted keys).
    pub fn to_json(&self) -> Json {
        match self {
            Position::Scan(scan) => serde_json::to_value(ScanPositionJson {
                cursors: scan.typed_cursors(),
                done: scan.done.ranges().to_vec(),
                kind: scan.kind,
                total_segments: scan.total_segments,
            })
            .unwrap_or(Json::Null),
            Position::Streams(streams) => serde_json::to_value(streams).unwrap_or(Json::Null),
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
}
