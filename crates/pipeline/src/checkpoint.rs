//! The run's checkpointer: applies acknowledged positions and writes them, debounced.
//!
//! # Rules (SPEC §6.4)
//! 1. A position advances only after the sink acknowledged the batch carrying it and every
//!    batch before it. Sinks acknowledge in order, so applying each acknowledged batch's
//!    positions in turn keeps the committed position a contiguous acknowledged prefix.
//! 2. Writes are debounced by `flush_interval` (0 = after every batch) and always happen at a
//!    clean end, a drain and after a failure. Nothing changed → nothing written.
//! 3. A completed scan clears the position and records `last_completed`.

use std::time::{Duration, Instant};

use ddbpipe_source::position::{StreamKind, StreamsPosition};
use ddbpipe_source::records::SegmentCursor;
use ddbpipe_source::streams::handover;
use serde_json::json;

use crate::batch::Batch;
use crate::events::CheckpointAged;
use crate::state::identity::Identity;
use crate::state::position::{Position, ScanKind, ScanPosition};
use crate::state::{Entry, StateError, StateFile};

/// Why a run cannot start from the stored state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The state could not be read (or is corrupt).
    #[error(transparent)]
    State(#[from] StateError),
    /// Definite: the stored position belongs to another source (exit 2).
    #[error(
        "stored position of pipeline '{pipeline}' was made with a different source: {changes}. \
         Restore the config, use a new pipeline name, or run `ddbpipe state reset <config>`."
    )]
    IdentityChanged {
        /// The pipeline.
        pipeline: String,
        /// The changed fields, joined by "; ".
        changes: String,
    },
    /// Definite: the stored position is of another mode than the configured one.
    #[error(
        "stored position of pipeline '{pipeline}' is a {stored} position but the source is in \
         mode: {mode}. Run `ddbpipe state reset <config>` to start afresh."
    )]
    WrongKind {
        /// The pipeline.
        pipeline: String,
        /// The stored kind.
        stored: &'static str,
        /// The configured mode.
        mode: String,
    },
}

/// Applies and stores one pipeline's position.
#[derive(Debug)]
pub struct Checkpointer {
    file: StateFile,
    pipeline: String,
    identity: Identity,
    last_completed: Option<serde_json::Value>,
    position: ScanPosition,
    streams: Option<StreamsPosition>,
    flush_interval: Duration,
    written_at: Option<Instant>,
    dirty: bool,
}

/// RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    now.format(&format).unwrap_or_else(|_| now.to_string())
}

impl Checkpointer {
    /// Loads the stored entry and checks it belongs to this source; returns the checkpointer
    /// and the scan position to resume from (fresh when none is stored).
    pub fn open_scan(
        file: StateFile,
        pipeline: &str,
        identity: Identity,
        kind: ScanKind,
        total_segments: u32,
        flush_interval: Duration,
    ) -> Result<Self, StartError> {
        let stored = file.load(pipeline)?;
        let (last_completed, position) = match stored {
            None => (None, None),
            Some(entry) => {
                if let Some(position) = &entry.position {
                    let changes = identity.changes_from(&entry.identity, true);
                    if !changes.is_empty() {
                        return Err(StartError::IdentityChanged {
                            pipeline: pipeline.to_string(),
                            changes: changes.join("; "),
                        });
                    }
                    let stored_kind = match position {
                        Position::Scan(scan) => match scan.kind {
                            ScanKind::Scan => "scan",
                            ScanKind::Query => "query",
                        },
                        Position::Streams(_) => "streams",
                    };
                    let wanted = match kind {
                        ScanKind::Scan => "scan",
                        ScanKind::Query => "query",
                    };
                    if stored_kind != wanted {
                        return Err(StartError::WrongKind {
                            pipeline: pipeline.to_string(),
                            stored: stored_kind,
                            mode: wanted.to_string(),
                        });
                    }
                }
                let position = match entry.position {
                    Some(Position::Scan(scan)) if scan.total_segments == total_segments => {
                        Some(scan)
                    }
                    _ => None,
                };
                (entry.last_completed, position)
            }
        };
        Ok(Checkpointer {
            file,
            pipeline: pipeline.to_string(),
            identity,
            last_completed,
            position: position.unwrap_or_else(|| ScanPosition::new(kind, total_segments)),
            streams: None,
            flush_interval,
            written_at: None,
            dirty: false,
        })
    }

    /// Loads the stored entry of a streams pipeline and checks it belongs to this source.
    /// Returns the checkpointer; [`streams_position`](Self::streams_position) is `None` on a
    /// first run.
    pub fn open_streams(
        file: StateFile,
        pipeline: &str,
        identity: Identity,
        flush_interval: Duration,
    ) -> Result<Self, StartError> {
        let stored = file.load(pipeline)?;
        let (last_completed, streams) = match stored {
            None => (None, None),
            Some(entry) => match entry.position {
                None => (entry.last_completed, None),
                Some(Position::Streams(position)) => {
                    let changes =
                        identity.changes_from(&entry.identity, position.snapshot.is_some());
                    if !changes.is_empty() {
                        return Err(StartError::IdentityChanged {
                            pipeline: pipeline.to_string(),
                            changes: changes.join("; "),
                        });
                    }
                    (entry.last_completed, Some(position))
                }
                Some(Position::Scan(scan)) => {
                    return Err(StartError::WrongKind {
                        pipeline: pipeline.to_string(),
                        stored: match scan.kind {
                            ScanKind::Scan => "scan",
                            ScanKind::Query => "query",
                        },
                        mode: "streams".to_string(),
                    });
                }
            },
        };
        let position = match streams.as_ref().and_then(|s| s.snapshot.as_ref()) {
            Some(snapshot) => snapshot_progress(snapshot).map_err(|problem| {
                StartError::State(StateError::Corrupt {
                    path: file.path().to_path_buf(),
                    location: format!(
                        "pipeline '{pipeline}' at pipelines.{pipeline}.position.snapshot"
                    ),
                    problem,
                })
            })?,
            None => ScanPosition::new(ScanKind::Scan, 1),
        };
        Ok(Checkpointer {
            file,
            pipeline: pipeline.to_string(),
            identity,
            last_completed,
            position,
            streams,
            flush_interval,
            written_at: None,
            dirty: false,
        })
    }

    /// Whether a snapshot (resnapshot or mirror scan) is open: segment progress then lives in
    /// the snapshot record, and completing the scan closes the snapshot instead of clearing
    /// the position.
    pub fn snapshot_open(&self) -> bool {
        self.streams.as_ref().is_some_and(|s| s.snapshot.is_some())
    }

    /// Commits a capture with its open snapshot record **before** the first Scan request, so
    /// a crash resumes the snapshot instead of detecting the gap again (SPEC §4.7).
    pub fn begin_snapshot(
        &mut self,
        capture: StreamsPosition,
        total_segments: u32,
    ) -> Result<(), StateError> {
        self.position = ScanPosition::new(ScanKind::Scan, total_segments);
        self.streams = Some(capture);
        self.dirty = true;
        self.flush()
    }

    /// The stored streams position (`None` before the first run committed one).
    pub fn streams_position(&self) -> Option<&StreamsPosition> {
        self.streams.as_ref()
    }

    /// Replaces the streams position and writes it now (start-up: the first run's initial
    /// position, the current ARN, pruning).
    pub fn set_streams(&mut self, position: StreamsPosition) -> Result<(), StateError> {
        self.streams = Some(position);
        self.dirty = true;
        self.flush()
    }

    /// The position the run resumes from / has reached.
    pub fn position(&self) -> &ScanPosition {
        &self.position
    }

    /// The last completed scan, if recorded.
    pub fn last_completed(&self) -> Option<&serde_json::Value> {
        self.last_completed.as_ref()
    }

    /// Applies the positions of an acknowledged batch and writes them when due.
    pub fn acknowledged(&mut self, batch: &Batch) -> Result<(), StateError> {
        for (segment, cursor) in &batch.segments {
            match cursor {
                SegmentCursor::Next(key) => {
                    self.position.cursors.insert(*segment, key.clone());
                }
                SegmentCursor::Done => {
                    self.position.cursors.remove(segment);
                    self.position.done.insert(*segment);
                }
            }
            self.dirty = true;
        }
        if !batch.shards.is_empty() {
            let streams = self
                .streams
                .get_or_insert_with(|| StreamsPosition::new(StreamKind::Streams, None));
            for mark in &batch.shards {
                handover::apply(streams, mark);
            }
            self.dirty = true;
        }
        let due = self
            .written_at
            .is_none_or(|at| at.elapsed() >= self.flush_interval);
        if self.dirty && due {
            self.flush()?;
        }
        if let Some(at) = self.written_at {
            CheckpointAged {
                seconds: at.elapsed().as_secs_f64(),
            }
            .emit();
        }
        Ok(())
    }

    /// Writes the position now if it changed since the last write.
    pub fn flush(&mut self) -> Result<(), StateError> {
        if !self.dirty {
            return Ok(());
        }
        let position = match &self.streams {
            Some(streams) => {
                let mut streams = streams.clone();
                if let Some(snapshot) = streams.snapshot.as_mut() {
                    write_snapshot_progress(snapshot, &self.position);
                }
                Some(Position::Streams(streams))
            }
            None => self
                .position
                .has_progress()
                .then(|| Position::Scan(self.position.clone())),
        };
        self.write(position)
    }

    /// The scan completed: clear the position, record `last_completed`, write now. With an open
    /// snapshot, the snapshot is closed instead (the jsonl sink deletes nothing) and the stream
    /// position — the capture — stays, so streaming starts from it.
    pub fn complete(&mut self, items: u64, capacity_units: f64) -> Result<(), StateError> {
        if let Some(streams) = self.streams.as_mut()
            && let Some(snapshot) = streams.snapshot.take()
        {
            tracing::info!(
                items,
                capacity_units,
                snapshot = %snapshot.get("id").unwrap_or(&serde_json::Value::Null),
                "Snapshot complete."
            );
            self.dirty = true;
            return self.flush();
        }
        self.last_completed = Some(json!({
            "at": now_rfc3339(),
            "capacity_units": capacity_units,
            "items": items,
        }));
        self.position = ScanPosition::new(self.position.kind, self.position.total_segments);
        self.write(None)
    }

    fn write(&mut self, position: Option<Position>) -> Result<(), StateError> {
        let entry = Entry {
            identity: self.identity.clone(),
            last_completed: self.last_completed.clone(),
            position,
            updated_at: now_rfc3339(),
        };
        self.file.store(&self.pipeline, Some(&entry))?;
        self.written_at = Some(Instant::now());
        self.dirty = false;
        Ok(())
    }
}

/// The scan progress stored in an open snapshot record (`cursors`, `done`, `total_segments`).
fn snapshot_progress(snapshot: &serde_json::Value) -> Result<ScanPosition, String> {
    let total = snapshot
        .get("total_segments")
        .and_then(serde_json::Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .filter(|t| *t >= 1)
        .ok_or("total_segments is missing or not a segment count")?;
    let mut json = serde_json::json!({
        "cursors": snapshot.get("cursors").cloned().unwrap_or_else(|| serde_json::json!({})),
        "done": snapshot.get("done").cloned().unwrap_or_else(|| serde_json::json!([])),
        "kind": "scan",
        "total_segments": total,
    });
    if let Some(map) = json.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    match Position::from_json(&json) {
        Ok(Position::Scan(scan)) => Ok(scan),
        Ok(Position::Streams(_)) => Err("not a scan progress".into()),
        Err(e) => Err(format!("{}: {}", e.path, e.problem)),
    }
}

/// Writes scan progress into an open snapshot record.
fn write_snapshot_progress(snapshot: &mut serde_json::Value, progress: &ScanPosition) {
    let as_scan = Position::Scan(progress.clone()).to_json();
    if let Some(record) = snapshot.as_object_mut() {
        for key in ["cursors", "done", "total_segments"] {
            if let Some(value) = as_scan.get(key) {
                record.insert(key.to_string(), value.clone());
            }
        }
    }
}
