//! What `state show` says of a streams or mirror position (docs/cli.md §8.4): its phase, the
//! open snapshot's progress (or its export) and capture, an open repair, and its shards.

use ddbpipe_source::position::{ShardProgress, SnapshotRecord, StreamKind, StreamsPosition};

/// Where a streams or mirror position stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// A snapshot (a mirror's first, or a resnapshot) is being read.
    Snapshot,
    /// The snapshot is read; its close (and cleanup) is left before the stream is read.
    Cleanup,
    /// A repair of a gap by incremental exports is open.
    Repair,
    /// The stream is read from the stored shard positions.
    Streaming,
}

impl Phase {
    /// The phase of `position`.
    pub(super) fn of(position: &StreamsPosition) -> Phase {
        match (&position.repair, &position.snapshot) {
            (Some(_), _) => Phase::Repair,
            (None, Some(snapshot)) if snapshot.complete => Phase::Cleanup,
            (None, Some(_)) => Phase::Snapshot,
            (None, None) => Phase::Streaming,
        }
    }

    /// The name `state show` prints.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Phase::Snapshot => "snapshot",
            Phase::Cleanup => "cleanup",
            Phase::Repair => "repair",
            Phase::Streaming => "streaming",
        }
    }
}

/// `snapshot (mirror) open: 3 of 16 segment(s) done` from a stored snapshot record (docs/state.md
/// §6.3); a snapshot read from an export names it and counts its data files.
pub(crate) fn snapshot_progress(record: &SnapshotRecord) -> String {
    let reason = record.reason.as_str();
    let done: u64 = record
        .done
        .iter()
        .map(|[first, last]| u64::from(last.saturating_sub(*first)) + 1)
        .sum();
    let segments = match &record.export_arn {
        Some(arn) => format!(
            "export {arn}, {done} of {} data file(s) done",
            record.total_segments
        ),
        None => format!("{done} of {} segment(s) done", record.total_segments),
    };
    if record.complete {
        format!("snapshot ({reason}) scanned, {segments}; streaming starts after its cleanup")
    } else {
        format!("snapshot ({reason}) open: {segments}")
    }
}

/// The labelled lines `state show` prints for `position`.
pub(super) fn lines(position: &StreamsPosition) -> Vec<(&'static str, String)> {
    let kind = match position.kind {
        StreamKind::Streams => "streams",
        StreamKind::Mirror => "mirror",
    };
    let mut lines = vec![(
        "position:",
        format!("{kind}, phase {}", Phase::of(position).as_str()),
    )];
    if let Some(arn) = &position.stream_arn {
        lines.push(("stream:", arn.clone()));
    }
    if let Some(snapshot) = &position.snapshot {
        lines.push(("snapshot:", snapshot_progress(snapshot)));
        lines.push((
            "capture:",
            format!(
                "at unix {} (snapshot id {}), {} shard(s) captured at their trim horizon or \
                 position",
                snapshot.captured_at,
                snapshot.id,
                position.shards.len()
            ),
        ));
    }
    if let Some(repair) = &position.repair {
        let done: u64 = repair
            .done
            .iter()
            .map(|[first, last]| u64::from(last.saturating_sub(*first)) + 1)
            .sum();
        let export = repair
            .export_arn
            .as_deref()
            .map_or("not started".to_string(), |arn| {
                format!(
                    "{arn}, {done} of {} data file(s) applied",
                    repair.total_files
                )
            });
        lines.push((
            "repair:",
            format!(
                "window unix ms {}..{} (now {}..{}), export {export}{}",
                repair.from_ms,
                repair.to_ms,
                repair.window_from_ms,
                repair.window_to_ms,
                if repair.applied {
                    "; applied, the stream is captured next"
                } else {
                    ""
                }
            ),
        ));
    }
    lines.push(("shards:", shards(position)));
    lines
}

/// `4 shard(s): 2 positioned, 1 at the trim horizon, 1 finished`.
fn shards(position: &StreamsPosition) -> String {
    let (mut positioned, mut horizon, mut finished) = (0, 0, 0);
    for progress in position.shards.values() {
        match progress {
            ShardProgress::After(_) => positioned += 1,
            ShardProgress::TrimHorizon { .. } => horizon += 1,
            ShardProgress::ShardEnd { .. } => finished += 1,
        }
    }
    format!(
        "{} shard(s): {positioned} positioned, {horizon} at the trim horizon, {finished} finished",
        position.shards.len()
    )
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::ids::{SequenceNumber, ShardId};
    use serde_json::json;

    use super::*;

    #[test]
    fn a_mirror_in_its_snapshot_shows_its_progress_capture_and_shards() {
        let mut position = StreamsPosition::new(StreamKind::Mirror, Some("arn:s".into()));
        position.admit(&ShardId::new("a"), Some(5), None);
        position.advance(&ShardId::new("b"), &SequenceNumber::parse("123").unwrap());
        position.finish(&ShardId::new("c"), None);
        let record = json!({"captured_at": 1_767_225_600, "complete": false, "cursors": {},
            "done": [[0, 3]], "gap_reasons": [], "id": 1_767_225_600_000_i64,
            "keys_written": 0, "reason": "mirror", "total_segments": 16});
        position.snapshot = Some(serde_json::from_value(record).unwrap());
        let shown = lines(&position);
        let text: Vec<String> = shown.iter().map(|(l, v)| format!("{l} {v}")).collect();
        assert_eq!(
            text,
            [
                "position: mirror, phase snapshot",
                "stream: arn:s",
                "snapshot: snapshot (mirror) open: 4 of 16 segment(s) done",
                "capture: at unix 1767225600 (snapshot id 1767225600000), 3 shard(s) captured \
                 at their trim horizon or position",
                "shards: 3 shard(s): 1 positioned, 1 at the trim horizon, 1 finished",
            ]
        );
        let snapshot = position.snapshot.as_mut().unwrap();
        snapshot.export_arn = Some("arn:export".into());
        snapshot.complete = true;
        assert_eq!(Phase::of(&position), Phase::Cleanup);
        let text = lines(&position)[2].1.clone();
        assert_eq!(
            text,
            "snapshot (mirror) scanned, export arn:export, 4 of 16 data file(s) done; streaming \
             starts after its cleanup"
        );
        position.snapshot = None;
        assert_eq!(lines(&position)[0].1, "mirror, phase streaming");
    }
}
