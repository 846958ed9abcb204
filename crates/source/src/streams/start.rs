//! Where each shard's read starts (docs/streams.md §4.4), and the `latest` time floor.
//!
//! # Start positions
//! The first run is one with no stored streams position. Per shard, the first rule that
//! matches wins:
//! 1. Stored sequence `s` → `AFTER_SEQUENCE_NUMBER s`.
//! 2. Stored `""` → `TRIM_HORIZON`, with the shard's `latest_floor_ms` if it has one.
//! 3. First run, shard described at the run's start, `trim_horizon` → `TRIM_HORIZON`.
//! 4. First run, shard described at the run's start, `latest`, open → `LATEST`, floor = the
//!    run start.
//! 5. First run, shard described at the run's start, `latest`, closed → not read: recorded
//!    finished, frontier = the run start.
//! 6. Any other shard (a child, or a shard created since the last run) → `TRIM_HORIZON`.
//!
//! Rules 1 and 2 come first, so decide a first-run shard's start *before* admitting it: once
//! admitted, its `""` entry matches rule 2. After the first run `start_position` has no
//! effect.
//!
//! # The `latest` floor
//! `latest` means "changes made after the first run started". A floored shard re-acquired at
//! `TRIM_HORIZON` (iterator expiry before its first record, or a later run while it is still
//! `""`) reads older history; [`FloorFilter`] drops it:
//! 1. A record whose `ts_ms` is below `floor − 120 000` is dropped, until the first record
//!    kept (the margin covers the service's rounding and clock skew).
//! 2. A record exactly at `floor − 120 000` is kept, and so is a record without a timestamp.
//! 3. Once one record is kept, every later record is kept: stream order, not timestamps,
//!    decides from there on.
//!
//! The floor leaves the position once the shard advances (`StreamsPosition::advance`).

use crate::api::{ShardDescription, StartAt};
use crate::config::StartPosition;
use crate::position::{ShardProgress, StreamsPosition};

/// The slack below a `latest` floor within which records are still kept, in ms.
pub const FLOOR_MARGIN_MS: i64 = 120_000;

/// Where a shard's read starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardStart {
    /// Read from `at`; `floor_ms` is the `latest` floor to apply while the shard has read
    /// nothing (and to store with the shard when it is admitted).
    Read {
        /// Where the first iterator starts.
        at: StartAt,
        /// The time floor in unix ms, if any.
        floor_ms: Option<i64>,
    },
    /// First run, `latest`, shard closed at the start (rule 5): not read; recorded finished
    /// with frontier = the run start.
    FinishedAtStart,
}

/// Where `shard` starts (rules 1–6, first match wins). `first_run`: no stored streams
/// position; `described_at_start`: the shard was in the run's first discovery; `run_start_ms`
/// in unix ms.
pub fn start_for(
    shard: &ShardDescription,
    position: &StreamsPosition,
    first_run: bool,
    described_at_start: bool,
    start_position: StartPosition,
    run_start_ms: i64,
) -> ShardStart {
    match position.shards.get(&shard.id) {
        Some(ShardProgress::After(seq)) => {
            return ShardStart::Read {
                at: StartAt::After(seq.clone()),
                floor_ms: None,
            };
        }
        Some(ShardProgress::TrimHorizon { floor_ms, .. }) => {
            return ShardStart::Read {
                at: StartAt::TrimHorizon,
                floor_ms: *floor_ms,
            };
        }
        Some(ShardProgress::ShardEnd { .. }) | None => {}
    }
    let trim_horizon = ShardStart::Read {
        at: StartAt::TrimHorizon,
        floor_ms: None,
    };
    if !(first_run && described_at_start) {
        return trim_horizon;
    }
    match start_position {
        StartPosition::TrimHorizon => trim_horizon,
        StartPosition::Latest if shard.closed => ShardStart::FinishedAtStart,
        StartPosition::Latest => ShardStart::Read {
            at: StartAt::Latest,
            floor_ms: Some(run_start_ms),
        },
    }
}

/// The `latest` floor filter of a shard re-acquired at `TRIM_HORIZON` (floor rules 1–3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloorFilter {
    threshold_ms: i64,
    passed: bool,
}

impl FloorFilter {
    /// A filter for the floor `floor_ms` (unix ms) that has kept nothing yet.
    pub fn new(floor_ms: i64) -> Self {
        FloorFilter {
            threshold_ms: floor_ms.saturating_sub(FLOOR_MARGIN_MS),
            passed: false,
        }
    }

    /// Whether to keep the next record, whose `ts_ms` is given.
    pub fn keep(&mut self, ts_ms: Option<i64>) -> bool {
        if !self.passed && ts_ms.is_none_or(|ts| ts >= self.threshold_ms) {
            self.passed = true;
        }
        self.passed
    }

    /// Whether a record was kept: from then on the filter keeps everything.
    pub fn passed(&self) -> bool {
        self.passed
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::{SequenceNumber, ShardId};
    use crate::position::StreamKind;

    use super::*;

    const RUN_START_MS: i64 = 1_767_225_600_000;

    fn shard(closed: bool) -> ShardDescription {
        ShardDescription {
            id: ShardId::new("s1"),
            parent: None,
            closed,
        }
    }

    fn empty() -> StreamsPosition {
        StreamsPosition::new(StreamKind::Streams, Some("arn:s".into()))
    }

    fn start(
        position: &StreamsPosition,
        closed: bool,
        first_run: bool,
        described_at_start: bool,
        start_position: StartPosition,
    ) -> ShardStart {
        start_for(
            &shard(closed),
            position,
            first_run,
            described_at_start,
            start_position,
            RUN_START_MS,
        )
    }

    fn trim_horizon(floor_ms: Option<i64>) -> ShardStart {
        ShardStart::Read {
            at: StartAt::TrimHorizon,
            floor_ms,
        }
    }

    #[test]
    fn a_stored_sequence_resumes_after_it_whatever_the_start_position() {
        let mut position = empty();
        let seq = SequenceNumber::parse("4960").unwrap();
        position.admit(&ShardId::new("s1"), None, Some(RUN_START_MS));
        position.advance(&ShardId::new("s1"), &seq);
        let expected = ShardStart::Read {
            at: StartAt::After(seq),
            floor_ms: None,
        };
        for start_position in StartPosition::ALL {
            for closed in [false, true] {
                assert_eq!(
                    start(&position, closed, true, true, start_position),
                    expected
                );
            }
        }
    }

    #[test]
    fn a_stored_empty_entry_starts_at_trim_horizon_with_its_floor() {
        let mut position = empty();
        position.admit(&ShardId::new("s1"), Some(1), Some(RUN_START_MS));
        let got = start(&position, false, true, true, StartPosition::Latest);
        assert_eq!(got, trim_horizon(Some(RUN_START_MS)));
        let got = start(&position, true, false, false, StartPosition::Latest);
        assert_eq!(got, trim_horizon(Some(RUN_START_MS)));
    }

    #[test]
    fn a_stored_empty_entry_without_a_floor_starts_at_trim_horizon_unfloored() {
        let mut position = empty();
        position.admit(&ShardId::new("s1"), Some(1), None);
        let got = start(&position, false, true, true, StartPosition::Latest);
        assert_eq!(got, trim_horizon(None));
    }

    #[test]
    fn a_trim_horizon_first_run_reads_described_shards_from_the_trim_horizon() {
        for closed in [false, true] {
            let got = start(&empty(), closed, true, true, StartPosition::TrimHorizon);
            assert_eq!(got, trim_horizon(None));
        }
    }

    #[test]
    fn an_open_shard_at_a_latest_first_run_starts_at_latest_floored_at_the_run_start() {
        let got = start(&empty(), false, true, true, StartPosition::Latest);
        assert_eq!(
            got,
            ShardStart::Read {
                at: StartAt::Latest,
                floor_ms: Some(RUN_START_MS)
            }
        );
    }

    #[test]
    fn a_closed_shard_at_a_latest_first_run_is_finished_unread() {
        let got = start(&empty(), true, true, true, StartPosition::Latest);
        assert_eq!(got, ShardStart::FinishedAtStart);
    }

    #[test]
    fn a_shard_found_after_the_first_discovery_starts_at_trim_horizon_even_with_latest() {
        for closed in [false, true] {
            let got = start(&empty(), closed, true, false, StartPosition::Latest);
            assert_eq!(got, trim_horizon(None));
        }
    }

    #[test]
    fn a_later_run_ignores_the_start_position_for_new_shards() {
        for closed in [false, true] {
            for described_at_start in [false, true] {
                let got = start(
                    &empty(),
                    closed,
                    false,
                    described_at_start,
                    StartPosition::Latest,
                );
                assert_eq!(got, trim_horizon(None));
            }
        }
    }

    #[test]
    fn the_floor_drops_records_older_than_two_minutes_before_it() {
        let mut filter = FloorFilter::new(RUN_START_MS);
        assert!(!filter.keep(Some(RUN_START_MS - FLOOR_MARGIN_MS - 1)));
        assert!(!filter.keep(Some(0)));
        assert!(!filter.passed());
    }

    #[test]
    fn the_boundary_value_of_the_floor_is_kept() {
        let mut filter = FloorFilter::new(RUN_START_MS);
        assert!(filter.keep(Some(RUN_START_MS - FLOOR_MARGIN_MS)));
        assert!(filter.passed());
    }

    #[test]
    fn a_record_without_a_timestamp_is_kept_and_passes_the_floor() {
        let mut filter = FloorFilter::new(RUN_START_MS);
        assert!(!filter.keep(Some(0)));
        assert!(filter.keep(None));
        assert!(filter.passed());
        assert!(filter.keep(Some(0)));
    }

    #[test]
    fn the_floor_keeps_everything_after_the_first_kept_record() {
        let mut filter = FloorFilter::new(RUN_START_MS);
        let kept: Vec<bool> = [Some(0), Some(RUN_START_MS), Some(0), None, Some(1)]
            .into_iter()
            .map(|ts| filter.keep(ts))
            .collect();
        assert_eq!(kept, vec![false, true, true, true, true]);
    }

    #[test]
    fn a_floor_near_the_minimum_does_not_overflow() {
        let mut filter = FloorFilter::new(i64::MIN + 5);
        assert!(filter.keep(Some(i64::MIN)));
    }
}
