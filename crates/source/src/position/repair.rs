//! The open repair of a stream gap by incremental exports (docs/streams.md §4.12,
//! docs/state.md §6.3), stored beside the shards: the whole window to export, the window being
//! read now, its export once started and that export's file progress.
//!
//! # Windows
//! The repair covers `[from_ms, to_ms)`. It is exported in windows of at most
//! [`MAX_WINDOW_MS`] (AWS's longest incremental export), read one after the other, oldest
//! first: the current one is `[window_from_ms, window_to_ms)`. When a window's files are all
//! applied the next begins where it ended, with no export and no file progress. The last
//! window ends at `to_ms`; after it the repair is closed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ScanKind, ScanPosition};

/// AWS's longest incremental export window: 24 h.
pub const MAX_WINDOW_MS: i64 = 24 * 3_600_000;
/// AWS's shortest incremental export window: 15 min.
pub const MIN_WINDOW_MS: i64 = 15 * 60_000;

/// The open repair, as stored (sorted keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairRecord {
    /// The repair id (when it was opened, unix ms): the marker of the rows it wrote in a keyed
    /// sink.
    pub id: i64,
    /// Why the stream had a gap.
    pub gap_reasons: Vec<String>,
    /// The start of the whole window (unix ms, inclusive).
    pub from_ms: i64,
    /// The end of the whole window (unix ms, exclusive).
    pub to_ms: i64,
    /// The start of the window read now.
    pub window_from_ms: i64,
    /// The end of the window read now.
    pub window_to_ms: i64,
    /// The current window's export, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_arn: Option<String>,
    /// Per data file in progress, its cursor (`{"lines": {"N": …}}`) as typed JSON.
    pub cursors: BTreeMap<String, serde_json::Value>,
    /// Data files applied, as inclusive ranges.
    pub done: Vec<[u32; 2]>,
    /// The current export's data files, once known (0 before).
    pub total_files: u32,
    /// Every window was applied: only recapturing the stream is left.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub applied: bool,
    /// Fields of another version, kept as stored.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl RepairRecord {
    /// A repair of `[from_ms, to_ms)` opened at `opened_ms` for `gap_reasons`, nothing read.
    pub fn open(opened_ms: i64, from_ms: i64, to_ms: i64, gap_reasons: &[String]) -> Self {
        RepairRecord {
            id: opened_ms,
            gap_reasons: gap_reasons.to_vec(),
            from_ms,
            to_ms,
            window_from_ms: from_ms,
            window_to_ms: window_end(from_ms, to_ms),
            export_arn: None,
            cursors: BTreeMap::new(),
            done: Vec::new(),
            total_files: 0,
            applied: false,
            other: BTreeMap::new(),
        }
    }

    /// Whether the current window is the last one.
    pub fn last_window(&self) -> bool {
        self.window_to_ms >= self.to_ms
    }

    /// Moves on to the next window, with no export and no file progress; `false` when the
    /// current window was the last.
    pub fn next_window(&mut self) -> bool {
        if self.last_window() {
            return false;
        }
        self.window_from_ms = self.window_to_ms;
        self.window_to_ms = window_end(self.window_from_ms, self.to_ms);
        self.export_arn = None;
        self.cursors.clear();
        self.done.clear();
        self.total_files = 0;
        true
    }

    /// The number of windows of the whole repair.
    pub fn windows(&self) -> i64 {
        (self.to_ms - self.from_ms + MAX_WINDOW_MS - 1).div_euclid(MAX_WINDOW_MS)
    }

    /// The current export's file progress, checked as strictly as a scan position; the
    /// problem names its path below the record.
    pub fn progress(&self) -> Result<ScanPosition, String> {
        let mut progress = ScanPosition::decode(
            ScanKind::Export,
            self.total_files,
            self.done.clone(),
            &self.cursors,
        )
        .map_err(|e| format!("{}: {}", e.path, e.problem))?;
        progress.export_arn = self.export_arn.clone();
        Ok(progress)
    }

    /// Stores `progress` as the current export's file progress.
    pub fn set_progress(&mut self, progress: &ScanPosition) {
        self.cursors = progress.typed_cursors();
        self.done = progress.done.ranges().to_vec();
        self.total_files = progress.total_segments;
        self.export_arn = progress.export_arn.clone();
    }

    /// Whether the record is consistent: a window inside the whole, not longer than AWS's
    /// longest. The problem names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.from_ms >= self.to_ms {
            return Err(format!(
                "from_ms ({}) is not before to_ms ({})",
                self.from_ms, self.to_ms
            ));
        }
        if self.window_from_ms < self.from_ms
            || self.window_to_ms > self.to_ms
            || self.window_from_ms >= self.window_to_ms
            || self.window_to_ms - self.window_from_ms > MAX_WINDOW_MS
        {
            return Err(format!(
                "window_from_ms..window_to_ms ({}..{}) is not a window of at most 24 h inside \
                 from_ms..to_ms ({}..{})",
                self.window_from_ms, self.window_to_ms, self.from_ms, self.to_ms
            ));
        }
        Ok(())
    }
}

/// The end of the window starting at `from_ms` of a repair ending at `to_ms`.
/// The window of a shared mirror's snapshot record that repairs a gap instead of reading the
/// table (docs/coordination.md §11.12 rule 9): the whole gap is `[from_ms, to_ms)`, exported in
/// windows of at most [`MAX_WINDOW_MS`], one generation of the record per window, oldest first;
/// this generation applies `[window_from_ms, window_to_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedRepair {
    /// The start of the whole window (unix ms, inclusive).
    pub from_ms: i64,
    /// The end of the whole window (unix ms, exclusive).
    pub to_ms: i64,
    /// The start of this generation's window.
    pub window_from_ms: i64,
    /// The end of this generation's window.
    pub window_to_ms: i64,
}

impl SharedRepair {
    /// The first window of a repair of `[from_ms, to_ms)`.
    pub fn open(from_ms: i64, to_ms: i64) -> Self {
        SharedRepair {
            from_ms,
            to_ms,
            window_from_ms: from_ms,
            window_to_ms: window_end(from_ms, to_ms),
        }
    }

    /// The window after this one; `None` after the last.
    pub fn next(&self) -> Option<SharedRepair> {
        (self.window_to_ms < self.to_ms).then(|| SharedRepair {
            window_from_ms: self.window_to_ms,
            window_to_ms: window_end(self.window_to_ms, self.to_ms),
            ..*self
        })
    }

    /// This window and the whole repair's number of windows, counted from 1.
    pub fn window_of(&self) -> (i64, i64) {
        let count =
            |to_ms: i64| (to_ms - self.from_ms + MAX_WINDOW_MS - 1).div_euclid(MAX_WINDOW_MS);
        (count(self.window_to_ms), count(self.to_ms))
    }
}

fn window_end(from_ms: i64, to_ms: i64) -> i64 {
    to_ms.min(from_ms.saturating_add(MAX_WINDOW_MS))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const H: i64 = 3_600_000;

    /// A shared repair of 50 h is three windows of at most 24 h, one after the other, oldest
    /// first; its stored form names the whole window and the current one.
    #[test]
    fn a_shared_repair_walks_its_windows_oldest_first() {
        let first = SharedRepair::open(0, 50 * H);
        assert_eq!((first.window_from_ms, first.window_to_ms), (0, 24 * H));
        assert_eq!(first.window_of(), (1, 3));
        let second = first.next().unwrap();
        assert_eq!(
            (second.window_from_ms, second.window_to_ms),
            (24 * H, 48 * H)
        );
        let third = second.next().unwrap();
        assert_eq!((third.window_from_ms, third.window_to_ms), (48 * H, 50 * H));
        assert_eq!(third.window_of(), (3, 3));
        assert_eq!(third.next(), None);
        assert_eq!(SharedRepair::open(5, 10).next(), None);
        assert_eq!(
            serde_json::to_value(second).unwrap(),
            json!({"from_ms": 0, "to_ms": 50 * H, "window_from_ms": 24 * H, "window_to_ms": 48 * H})
        );
    }

    #[test]
    fn a_long_repair_is_read_in_windows_of_at_most_a_day_oldest_first() {
        let mut record = RepairRecord::open(100 * H, 0, 50 * H, &["g".into()]);
        assert_eq!(record.windows(), 3);
        assert_eq!((record.window_from_ms, record.window_to_ms), (0, 24 * H));
        record.export_arn = Some("arn:e1".into());
        record.done = vec![[0, 1]];
        assert!(record.next_window());
        assert_eq!(
            (record.window_from_ms, record.window_to_ms),
            (24 * H, 48 * H)
        );
        assert_eq!(record.export_arn, None);
        assert!(record.done.is_empty());
        assert!(record.next_window());
        assert_eq!(
            (record.window_from_ms, record.window_to_ms),
            (48 * H, 50 * H)
        );
        assert!(record.last_window());
        assert!(!record.next_window());
        record.check().unwrap();
    }

    #[test]
    fn a_record_round_trips_and_a_bad_window_names_its_fields() {
        let mut record = RepairRecord::open(5 * H, H, 2 * H, &[]);
        record.other.insert("later".into(), json!(1));
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["window_to_ms"], json!(2 * H));
        let back: RepairRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
        record.window_to_ms = 3 * H;
        assert!(record.check().unwrap_err().contains("window_from_ms"));
        record.to_ms = 0;
        assert!(record.check().unwrap_err().contains("from_ms"));
    }

    #[test]
    fn file_progress_round_trips() {
        let mut record = RepairRecord::open(5 * H, H, 2 * H, &[]);
        let mut progress = record.progress().unwrap();
        progress.export_arn = Some("arn:e".into());
        progress.total_segments = 3;
        progress.done.insert(1);
        record.set_progress(&progress);
        assert_eq!(record.total_files, 3);
        assert_eq!(record.progress().unwrap(), progress);
    }
}
