//! Stream start-up as a plan (docs/streams.md §4.4–§4.7, docs/mirror.md §5.1): what a run does
//! before its first `GetRecords`, decided from the shard graph, the stored position, the gap
//! findings and probe answers, and the clock. The decisions are pure functions; the one request
//! they need, the layer-4 probe, is [`probe`]. The pipeline's driver runs the snapshot scans the
//! plan asks for and commits what it returns.
//!
//! # Rules
//! 1. **First run** (no stored position): every shard described now is admitted per
//!    `start_position` ([`first_run`]); that position is committed before reading.
//! 2. **Mirror's first run**: every described shard at its trim horizon, verified at the capture
//!    time, with an open snapshot record ([`mirror_capture`]); committed before the first Scan.
//! 3. **Resume** ([`resume`]): the gap findings of layers 1–3, else the layer-4 probe answers.
//!    No reason: stream on with the current ARN, finished shards nobody needs pruned.
//! 4. **A gap**: with `on_gap: resnapshot` (or `repair`), a table to scan and no snapshot (or
//!    repair) taken in this run, a resnapshot (a repair); otherwise the run fails and the state
//!    stays as it was. A gap found right
//!    after this run's snapshot says the snapshot outlived the retention margin.
//! 5. **Resnapshot capture** ([`resnapshot_capture`]): the current ARN; on the same stream,
//!    finished shards stay finished and a positioned shard keeps its position unless its probe
//!    was trimmed; every other described shard is admitted at its trim horizon, verified at the
//!    capture time. The open snapshot record goes with it.
//! 6. **Repair** (`on_gap: repair`, docs/streams.md §4.12): as rule 4, a repair instead of a
//!    resnapshot; once its exports are applied the stream is captured again as in rule 5
//!    ([`recapture`], at that time), without a snapshot record.

use std::collections::BTreeMap;

use super::engine::first_run_marks;
use super::gaps;
use super::handover;
use super::lineage::{self, ShardGraph};
use crate::api::{StartAt, StreamsApi};
use crate::config::{OnGap, StartPosition};
use crate::error::ReadError;
use crate::ids::{SequenceNumber, ShardId};
use crate::position::{ShardProgress, SnapshotReason, SnapshotRecord, StreamKind, StreamsPosition};
use crate::retry::{AttemptObserver, Cancel, RetryPolicy};

/// What start-up knows about the run.
#[derive(Debug, Clone, Copy)]
pub struct Startup<'a> {
    /// `streams` or `mirror`.
    pub kind: StreamKind,
    /// The stream resolved now.
    pub stream_arn: &'a str,
    /// The configured table name (messages).
    pub table: &'a str,
    /// `trim_horizon` or `latest` (first run only).
    pub start_position: StartPosition,
    /// What a gap found at start-up does.
    pub on_gap: OnGap,
}

/// What a run with a stored position does (rules 3 and 4).
#[derive(Debug, Clone, PartialEq)]
pub enum Resume {
    /// No gap: stream from this position.
    Stream(StreamsPosition),
    /// A gap to repair by scanning the table again, for these reasons.
    Resnapshot(Vec<String>),
    /// A gap to repair by incremental exports (`on_gap: repair`), for these reasons; where
    /// that cannot work, a resnapshot (docs/streams.md §4.12).
    Repair(Vec<String>),
    /// A gap that stops the run, with the message; the state stays as it was.
    Fail(String),
}

impl Startup<'_> {
    /// Rule 1: the first run's position, committed before reading.
    pub fn first_run(&self, graph: &ShardGraph, run_start_ms: i64) -> StreamsPosition {
        let mut position = StreamsPosition::new(self.kind, Some(self.stream_arn.to_string()));
        for mark in first_run_marks(graph, &position, self.start_position, run_start_ms) {
            handover::apply(&mut position, &mark);
        }
        position
    }

    /// Rule 2: a mirror's first capture at `now_ms` for a scan of `segments` segments into a
    /// destination holding `destination_rows` rows.
    pub fn mirror_capture(
        &self,
        graph: &ShardGraph,
        segments: u32,
        destination_rows: u64,
        now_ms: i64,
    ) -> StreamsPosition {
        let mut capture = StreamsPosition::new(self.kind, Some(self.stream_arn.to_string()));
        for id in graph.ids() {
            capture.admit(id, Some(now_ms.div_euclid(1000)), None);
        }
        capture.snapshot = Some(Box::new(SnapshotRecord::open(
            now_ms,
            segments,
            SnapshotReason::Mirror,
            &[],
            destination_rows,
        )));
        capture
    }

    /// Rules 3 and 4: what to do with `stored`, given the gap `reasons` found (layers 1–3, or
    /// the layer-4 probe answers). `can_resnapshot`: the run can scan the table;
    /// `snapshotted`: it already took a snapshot.
    pub fn resume(
        &self,
        mut stored: StreamsPosition,
        graph: &ShardGraph,
        reasons: Vec<String>,
        can_resnapshot: bool,
        snapshotted: bool,
    ) -> Resume {
        if reasons.is_empty() {
            stored.stream_arn = Some(self.stream_arn.to_string());
            lineage::prune(graph, &mut stored);
            return Resume::Stream(stored);
        }
        if can_resnapshot && !snapshotted {
            match self.on_gap {
                OnGap::Resnapshot => return Resume::Resnapshot(reasons),
                OnGap::Repair => return Resume::Repair(reasons),
                OnGap::Fail => {}
            }
        }
        let message = gaps::cannot_resume(self.table, &reasons);
        Resume::Fail(if snapshotted {
            format!(
                "{message} (found right after a snapshot: the snapshot took longer than the stream retention margin — raise segments, max_concurrency or the read limit)"
            )
        } else {
            message
        })
    }

    /// Rule 5: the capture of a resnapshot at `now_ms` for `reasons`, where `trimmed` lists the
    /// positioned shards whose probe was trimmed.
    pub fn resnapshot_capture(
        &self,
        stored: &StreamsPosition,
        graph: &ShardGraph,
        trimmed: &[ShardId],
        reasons: &[String],
        segments: u32,
        now_ms: i64,
    ) -> StreamsPosition {
        let mut capture = self.recapture(stored, graph, trimmed, now_ms);
        capture.snapshot = Some(Box::new(SnapshotRecord::open(
            now_ms,
            segments,
            SnapshotReason::Resnapshot,
            reasons,
            0,
        )));
        capture
    }
}

impl Startup<'_> {
    /// Rules 5 and 6: the stream captured again at `now_ms` after a resnapshot's scan or a
    /// repair's exports: on the same stream finished shards stay finished and a positioned shard
    /// keeps its position (and its `read_at`) unless its probe was trimmed; every other
    /// described shard is admitted at its trim horizon, verified at `now_ms`. No snapshot or
    /// repair record goes with it.
    pub fn recapture(
        &self,
        stored: &StreamsPosition,
        graph: &ShardGraph,
        trimmed: &[ShardId],
        now_ms: i64,
    ) -> StreamsPosition {
        let captured_s = now_ms.div_euclid(1000);
        let same_stream = stored.stream_arn.as_deref() == Some(self.stream_arn);
        let mut capture = StreamsPosition::new(self.kind, Some(self.stream_arn.to_string()));
        if same_stream {
            for id in stored.finished() {
                capture.finish(id, stored.verified_at(id));
            }
        }
        for id in graph.ids() {
            if capture.is_finished(id) {
                continue;
            }
            match stored.progress(id) {
                Some(ShardProgress::After(seq)) if same_stream && !trimmed.contains(id) => {
                    capture.advance(id, seq);
                    if let Some(at) = stored.read_at.get(id) {
                        capture.read(id, *at);
                    }
                }
                _ => capture.admit(id, Some(captured_s), None),
            }
        }
        capture
    }
}

/// Every gap the start-up of a later run finds in `stored` (docs/streams.md §4.5): layers 1–3
/// on `graph` at `now_s`, then, when they find nothing, the layer-4 [`probe`], whose
/// iterators go into `probed`. The run, `lag` and `check` all ask it, so the commands that
/// only look report the gaps the next run stops (or resnapshots) on. Warnings are the
/// caller's to log.
#[allow(clippy::too_many_arguments)] // The position, the stream and the probe's inputs.
pub async fn gap_findings<A: StreamsApi>(
    api: &A,
    stored: &StreamsPosition,
    stream_arn: &str,
    graph: &ShardGraph,
    table: &str,
    now_s: i64,
    concurrency: usize,
    retry: &RetryPolicy,
    stop: &Cancel,
    probed: &mut BTreeMap<ShardId, String>,
    observer: &dyn AttemptObserver,
) -> Result<gaps::Findings, ReadError> {
    let mut findings = gaps::check(stored, stream_arn, graph, table, now_s);
    if findings.is_gap() {
        return Ok(findings);
    }
    let trimmed = probe(
        api,
        stream_arn,
        &findings.probes,
        concurrency,
        retry,
        stop,
        probed,
        observer,
    )
    .await?;
    findings
        .reasons
        .extend(trimmed.into_iter().map(|(_, reason)| reason));
    Ok(findings)
}

/// Layer 4 (docs/streams.md §4.5): `GetShardIterator(AFTER_SEQUENCE_NUMBER)` for each positioned
/// shard, `concurrency` at once. Returns the trimmed shards with their reason; the iterators
/// of the others go into `probed` for their first slices.
#[allow(clippy::too_many_arguments)] // One request's inputs and the retry layer's.
pub async fn probe<A: StreamsApi>(
    api: &A,
    stream_arn: &str,
    probes: &[(ShardId, SequenceNumber)],
    concurrency: usize,
    retry: &RetryPolicy,
    stop: &Cancel,
    probed: &mut BTreeMap<ShardId, String>,
    observer: &dyn AttemptObserver,
) -> Result<Vec<(ShardId, String)>, ReadError> {
    let mut reasons = Vec::new();
    for chunk in probes.chunks(concurrency.max(1)) {
        let answers = chunk.iter().map(|(shard, seq)| async move {
            let start = StartAt::After(seq.clone());
            let answer = retry
                .run(
                    "get_shard_iterator",
                    || format!("GetShardIterator for {shard}"),
                    stop,
                    observer,
                    |_| api.shard_iterator(stream_arn, shard, &start),
                )
                .await;
            (shard, seq, answer)
        });
        for (shard, seq, answer) in futures_util::future::join_all(answers).await {
            match answer {
                Ok(Some(iterator)) => {
                    probed.insert(shard.clone(), iterator);
                }
                Ok(None) => {}
                Err(error) if error.code() == Some("TrimmedDataAccessException") => {
                    reasons.push((shard.clone(), gaps::trimmed(shard, seq)));
                }
                Err(error) => return Err(error),
            }
        }
    }
    Ok(reasons)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ShardDescription;

    const ARN: &str = "arn:aws:dynamodb:us-east-1:1:table/orders/stream/2026";
    const NOW_MS: i64 = 1_767_225_600_250;

    fn id(s: &str) -> ShardId {
        ShardId::new(s)
    }

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    fn startup(on_gap: OnGap) -> Startup<'static> {
        Startup {
            kind: StreamKind::Mirror,
            stream_arn: ARN,
            table: "orders",
            start_position: StartPosition::TrimHorizon,
            on_gap,
        }
    }

    fn graph(shards: &[(&str, Option<&str>)]) -> ShardGraph {
        let mut graph = ShardGraph::new();
        graph.merge(shards.iter().map(|(shard, parent)| ShardDescription {
            id: id(shard),
            parent: parent.map(id),
            closed: false,
        }));
        graph
    }

    #[test]
    fn a_first_run_admits_every_described_shard_verified_at_the_run_start() {
        let position = startup(OnGap::Fail).first_run(&graph(&[("a", None), ("b", None)]), NOW_MS);
        assert_eq!(position.stream_arn.as_deref(), Some(ARN));
        assert_eq!(position.kind, StreamKind::Mirror);
        for shard in ["a", "b"] {
            assert_eq!(
                position.shards[&id(shard)],
                ShardProgress::TrimHorizon {
                    verified_at: Some(NOW_MS / 1000),
                    floor_ms: None
                }
            );
        }
    }

    #[test]
    fn a_mirror_capture_opens_a_snapshot_with_every_shard_at_its_trim_horizon() {
        let capture = startup(OnGap::Fail).mirror_capture(&graph(&[("a", None)]), 8, 12, NOW_MS);
        let snapshot = capture.snapshot.as_deref().unwrap();
        assert_eq!(
            (snapshot.id, snapshot.reason, snapshot.total_segments),
            (NOW_MS, SnapshotReason::Mirror, 8)
        );
        assert_eq!(snapshot.destination_rows_at_start, Some(12));
        assert_eq!(capture.verified_at(&id("a")), Some(NOW_MS / 1000));
    }

    #[test]
    fn a_resume_without_reasons_streams_on_the_current_arn_with_finished_shards_pruned() {
        let mut stored = StreamsPosition::new(StreamKind::Mirror, Some("arn:old".into()));
        stored.finish(&id("gone"), Some(1));
        stored.advance(&id("a"), &seq("10"));
        let graph = graph(&[("a", None)]);
        let Resume::Stream(position) =
            startup(OnGap::Fail).resume(stored, &graph, Vec::new(), false, false)
        else {
            panic!("expected to stream on");
        };
        assert_eq!(position.stream_arn.as_deref(), Some(ARN));
        assert!(!position.knows(&id("gone")));
        assert_eq!(position.shards[&id("a")], ShardProgress::After(seq("10")));
    }

    #[test]
    fn a_gap_resnapshots_only_when_configured_possible_and_not_done_in_this_run() {
        let stored = StreamsPosition::new(StreamKind::Streams, Some(ARN.into()));
        let graph = graph(&[]);
        let reasons = vec!["shard s1 expired before it was fully read".to_string()];
        let decide = |on_gap, can, done| {
            startup(on_gap).resume(stored.clone(), &graph, reasons.clone(), can, done)
        };
        assert_eq!(
            decide(OnGap::Resnapshot, true, false),
            Resume::Resnapshot(reasons.clone())
        );
        assert_eq!(
            decide(OnGap::Repair, true, false),
            Resume::Repair(reasons.clone())
        );
        for (on_gap, can, done) in [
            (OnGap::Fail, true, false),
            (OnGap::Resnapshot, false, false),
            (OnGap::Resnapshot, true, true),
            (OnGap::Repair, false, false),
            (OnGap::Repair, true, true),
        ] {
            let Resume::Fail(message) = decide(on_gap, can, done) else {
                panic!("{on_gap:?} {can} {done}: expected a failure");
            };
            assert!(
                message.contains("cannot resume table 'orders'"),
                "{message}"
            );
            assert!(message.contains(&reasons[0]), "{message}");
            // The remedy is the caller's: a command names its pipeline file.
            assert!(!message.contains("ddbpipe"), "{message}");
            assert_eq!(
                message.contains("found right after a snapshot"),
                done,
                "{message}"
            );
        }
    }

    #[test]
    fn a_resnapshot_capture_keeps_untrimmed_positions_and_finished_shards_of_the_same_stream() {
        let mut stored = StreamsPosition::new(StreamKind::Streams, Some(ARN.into()));
        stored.finish(&id("p"), Some(77));
        stored.advance(&id("kept"), &seq("5"));
        stored.advance(&id("trimmed"), &seq("6"));
        let graph = graph(&[
            ("kept", None),
            ("trimmed", None),
            ("c", Some("p")),
            ("new", None),
        ]);
        let reasons = vec!["gap".to_string()];
        let capture = startup(OnGap::Resnapshot).resnapshot_capture(
            &stored,
            &graph,
            &[id("trimmed")],
            &reasons,
            4,
            NOW_MS,
        );
        let at_capture = ShardProgress::TrimHorizon {
            verified_at: Some(NOW_MS / 1000),
            floor_ms: None,
        };
        assert_eq!(
            capture.shards[&id("p")],
            ShardProgress::ShardEnd { frontier: Some(77) }
        );
        assert_eq!(capture.shards[&id("kept")], ShardProgress::After(seq("5")));
        assert_eq!(capture.shards[&id("trimmed")], at_capture);
        assert_eq!(capture.shards[&id("c")], at_capture);
        assert_eq!(capture.shards[&id("new")], at_capture);
        let snapshot = capture.snapshot.as_deref().unwrap();
        assert_eq!(snapshot.reason, SnapshotReason::Resnapshot);
        assert_eq!(snapshot.gap_reasons, reasons);
        assert_eq!(snapshot.destination_rows_at_start, Some(0));

        // Another stream: nothing of the old one is kept.
        let other = StreamsPosition {
            stream_arn: Some("arn:old".into()),
            ..stored
        };
        let capture =
            startup(OnGap::Resnapshot).resnapshot_capture(&other, &graph, &[], &reasons, 4, NOW_MS);
        assert!(!capture.knows(&id("p")));
        assert_eq!(capture.shards[&id("kept")], at_capture);
    }

    #[test]
    fn a_recapture_after_a_repair_keeps_untrimmed_positions_with_their_read_at_and_no_record() {
        let mut stored = StreamsPosition::new(StreamKind::Mirror, Some(ARN.into()));
        stored.advance(&id("kept"), &seq("5"));
        stored.read(&id("kept"), 1_000);
        stored.advance(&id("trimmed"), &seq("6"));
        stored.read(&id("trimmed"), 900);
        stored.repair = Some(Box::new(crate::position::RepairRecord::open(
            NOW_MS,
            0,
            1_000_000,
            &[],
        )));
        let graph = graph(&[("kept", None), ("trimmed", None), ("new", None)]);
        let capture = startup(OnGap::Repair).recapture(&stored, &graph, &[id("trimmed")], NOW_MS);
        assert_eq!(capture.shards[&id("kept")], ShardProgress::After(seq("5")));
        assert_eq!(capture.read_at.get(&id("kept")), Some(&1_000));
        assert!(!capture.read_at.contains_key(&id("trimmed")));
        assert_eq!(capture.verified_at(&id("trimmed")), Some(NOW_MS / 1000));
        assert_eq!(capture.verified_at(&id("new")), Some(NOW_MS / 1000));
        assert!(capture.repair.is_none() && capture.snapshot.is_none());
    }
}
