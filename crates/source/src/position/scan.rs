//! Where a scan or query stands (docs/state.md §6.3): finished segments as ranges and the
//! `ExclusiveStartKey` of each started one, as typed JSON.

use std::collections::BTreeMap;

use ddbpipe_value::{Item, Number, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::{PositionError, strict};
use crate::segments::SegmentRanges;

/// The attribute of a data file's cursor: the number of its items already handed on.
const LINES: &str = "lines";

/// A data file's cursor as stored in a scan position's `cursors`: `{"lines": {"N": "<n>"}}`,
/// the number of its items handed on (docs/state.md §6.3).
pub fn file_cursor(lines: u64) -> Item {
    Item::from([(LINES.to_string(), Value::N(Number::new(lines.to_string())))])
}

/// The items handed on that a data file's cursor records; the problem when it is not one.
pub fn cursor_lines(cursor: &Item) -> Result<u64, String> {
    match cursor.get(LINES) {
        Some(Value::N(n)) if cursor.len() == 1 => n
            .as_str()
            .parse()
            .map_err(|_| format!("'{n}' is not a count of lines")),
        _ => Err("an export file's cursor is {\"lines\": {\"N\": …}}".into()),
    }
}

/// Where a scan or query stands: finished segments and the cursors of started ones.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanPosition {
    /// `"scan"` or `"query"`.
    pub kind: ScanKind,
    /// `TotalSegments` the cursors belong to.
    pub total_segments: u32,
    /// Segments read to their end.
    pub done: SegmentRanges,
    /// `ExclusiveStartKey` of each segment in progress (an export file: its items handed on).
    pub cursors: BTreeMap<u32, Item>,
    /// The export read (kind `export`), once started.
    pub export_arn: Option<String>,
}

/// The two kinds of paged read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanKind {
    /// Parallel `Scan`.
    Scan,
    /// `Query`.
    Query,
    /// The data files of an export (`source.snapshot.engine: export`).
    Export,
}

impl ScanKind {
    /// `"scan"`, `"query"` or `"export"`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            ScanKind::Scan => "scan",
            ScanKind::Query => "query",
            ScanKind::Export => "export",
        }
    }
}

/// The stored layout.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    cursors: BTreeMap<String, Json>,
    done: Vec<[u32; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    export_arn: Option<String>,
    kind: ScanKind,
    total_segments: u32,
}

impl ScanPosition {
    /// A fresh position: nothing done, no cursor.
    pub fn new(kind: ScanKind, total_segments: u32) -> Self {
        ScanPosition {
            kind,
            total_segments,
            done: SegmentRanges::new(),
            cursors: BTreeMap::new(),
            export_arn: None,
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

    /// Reads a stored scan or query position strictly.
    pub(super) fn from_json(json: &Json) -> Result<Self, PositionError> {
        let stored: Stored = strict(json)?;
        let mut position = Self::decode(
            stored.kind,
            stored.total_segments,
            stored.done,
            &stored.cursors,
        )?;
        position.export_arn = stored.export_arn;
        Ok(position)
    }

    /// The position as stored (sorted keys).
    pub(super) fn to_json(&self) -> Json {
        serde_json::to_value(Stored {
            cursors: self.typed_cursors(),
            done: self.done.ranges().to_vec(),
            export_arn: self.export_arn.clone(),
            kind: self.kind,
            total_segments: self.total_segments,
        })
        .unwrap_or(Json::Null)
    }

    /// Decodes stored progress: `done` ranges, and cursors keyed by segment number inside
    /// `total_segments` (an export's files: any number, checked against its manifest when
    /// read), each a key as typed JSON. Paths are relative to the progress.
    pub(super) fn decode(
        kind: ScanKind,
        total_segments: u32,
        done: Vec<[u32; 2]>,
        cursors: &BTreeMap<String, Json>,
    ) -> Result<Self, PositionError> {
        let done = SegmentRanges::from_ranges(done)
            .map_err(|problem| PositionError::new("done", problem))?;
        let mut decoded = BTreeMap::new();
        for (segment, cursor) in cursors {
            let path = format!("cursors.{segment}");
            let number: u32 = segment.parse().map_err(|_| {
                PositionError::new(
                    &path,
                    format!("segment '{segment}' is not a segment number"),
                )
            })?;
            if kind != ScanKind::Export && number >= total_segments {
                return Err(PositionError::new(
                    path,
                    format!("segment {number} is outside total_segments {total_segments}"),
                ));
            }
            let item = ddbpipe_value::item_from_typed_json(cursor, &path)
                .map_err(|e| PositionError::new(e.path.clone(), e.to_string()))?;
            if kind == ScanKind::Export {
                cursor_lines(&item).map_err(|problem| PositionError::new(&path, problem))?;
            }
            decoded.insert(number, item);
        }
        Ok(ScanPosition {
            kind,
            total_segments,
            done,
            cursors: decoded,
            export_arn: None,
        })
    }
}
