//! The open snapshot of a mirror or resnapshot (docs/state.md §6.3), stored beside the shards:
//! why it was opened, its id (the marker of its rows in a keyed sink), its scan progress and
//! whether the scan completed. Fields this version does not know are kept as stored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ScanKind, ScanPosition};

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

/// The open snapshot of a mirror or resnapshot, as stored (sorted keys). Its scan progress
/// (`cursors`, `done`, `total_segments`) is read and written through [`SnapshotRecord::progress`]
/// and [`SnapshotRecord::set_progress`].
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
    /// The export the snapshot reads (`snapshot.engine: export`), once started: its data
    /// files are the segments, `total_segments` their number once known (0 before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_arn: Option<String>,
    /// Fields of another version, kept as stored.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl SnapshotRecord {
    /// A snapshot opened at `captured_ms` (unix ms, also its id) for a scan of `segments`
    /// segments, nothing read yet.
    pub fn open(
        captured_ms: i64,
        segments: u32,
        reason: SnapshotReason,
        gap_reasons: &[String],
        destination_rows: u64,
    ) -> Self {
        SnapshotRecord {
            captured_at: captured_ms.div_euclid(1000),
            complete: false,
            cursors: BTreeMap::new(),
            destination_rows_at_start: Some(destination_rows),
            done: Vec::new(),
            gap_reasons: gap_reasons.to_vec(),
            id: captured_ms,
            keys_written: 0,
            reason,
            total_segments: segments,
            export_arn: None,
            other: BTreeMap::new(),
        }
    }

    /// The scan progress, checked as strictly as a scan position; the problem names its path
    /// below the record.
    pub fn progress(&self) -> Result<ScanPosition, String> {
        let kind = match self.export_arn {
            Some(_) => ScanKind::Export,
            None => ScanKind::Scan,
        };
        if self.total_segments < 1 && kind == ScanKind::Scan {
            return Err("total_segments is missing or not a segment count".into());
        }
        let mut progress =
            ScanPosition::decode(kind, self.total_segments, self.done.clone(), &self.cursors)
                .map_err(|e| format!("{}: {}", e.path, e.problem))?;
        progress.export_arn = self.export_arn.clone();
        Ok(progress)
    }

    /// Stores `progress` as the record's scan progress.
    pub fn set_progress(&mut self, progress: &ScanPosition) {
        self.cursors = progress.typed_cursors();
        self.done = progress.done.ranges().to_vec();
        self.total_segments = progress.total_segments;
        self.export_arn = progress.export_arn.clone();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
    fn progress_round_trips_and_bad_progress_names_its_path() {
        let mut record = SnapshotRecord::open(1_700_000_000_123, 4, SnapshotReason::Mirror, &[], 0);
        assert_eq!(record.captured_at, 1_700_000_000);
        let mut progress = record.progress().unwrap();
        assert!(!progress.has_progress());
        progress.done.insert(2);
        record.set_progress(&progress);
        assert_eq!(record.done, vec![[2, 2]]);
        assert_eq!(record.progress().unwrap(), progress);

        record.cursors.insert("7".into(), json!({"pk": {"S": "a"}}));
        let error = record.progress().unwrap_err();
        assert!(error.starts_with("cursors.7: "), "{error}");
        record.total_segments = 0;
        assert!(record.progress().unwrap_err().contains("total_segments"));
    }
}
