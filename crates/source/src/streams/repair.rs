//! `on_gap: repair` as a plan (docs/streams.md §4.12): the window of changes a gap lost, or why
//! it cannot be repaired by incremental exports and needs a full resnapshot.
//!
//! # Rules
//! 1. A re-created stream is not repairable: its stored positions say nothing about the new
//!    stream (a full resnapshot).
//! 2. Point-in-time recovery must be on: an incremental export reads its backups.
//! 3. The window starts where the position says every record was delivered before: the
//!    earliest `read_at` of its positioned shards and `verified_at` of its shards at their
//!    trim horizon (finished shards' frontiers when no shard is open), minus
//!    [`REPAIR_MARGIN_MS`], down to the second. A shard that does not say (a position written
//!    before `read_at` existed) makes the window unknown: a full resnapshot.
//! 4. It ends at the table's latest restorable time (DynamoDB's clock; this machine's now when not
//!    reported), down to the
//!    second; the stream, recaptured once the repair is applied, covers what follows.
//! 5. A window shorter than AWS's shortest incremental export ([`MIN_WINDOW_MS`]) starts
//!    earlier; it is then exported whole. Starting earlier only re-applies changes the
//!    destination has, which the version rule makes harmless.
//! 6. A window that would start before the table's earliest restorable time cannot be
//!    exported: a full resnapshot.
//!
//! Every "full resnapshot" comes with its reason in one line, which the run logs.

use crate::export::api::Recovery;
use crate::position::{MIN_WINDOW_MS, StreamsPosition};

/// How far before the position's delivery time a repair starts: more than any difference
/// between a stream record's second and its item's write time.
pub const REPAIR_MARGIN_MS: i64 = 60_000;

/// What a gap with `on_gap: repair` leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairPlan {
    /// Export and apply the changes of `[from_ms, to_ms)`.
    Repair {
        /// The window's start (unix ms, a whole second).
        from_ms: i64,
        /// The window's end (unix ms, a whole second).
        to_ms: i64,
    },
    /// A full resnapshot, because of this.
    Resnapshot(String),
}

/// The repair of `stored`'s gap on the table `table` whose stream is now `current_arn`, with
/// its point-in-time recovery `recovery`, at `now_ms` (rules 1–6).
pub fn plan(
    stored: &StreamsPosition,
    current_arn: &str,
    table: &str,
    recovery: &Recovery,
    now_ms: i64,
) -> RepairPlan {
    let resnapshot = |why: String| RepairPlan::Resnapshot(why);
    if stored
        .stream_arn
        .as_deref()
        .is_some_and(|stored| stored != current_arn)
    {
        return resnapshot(format!(
            "the stream of table '{table}' was re-created, so its stored positions say nothing about \
             the changes of the new one"
        ));
    }
    if !recovery.enabled {
        return resnapshot(format!(
            "point-in-time recovery is off on table '{table}', and an incremental export needs it"
        ));
    }
    let delivered_s = match stored.delivered_before() {
        Ok(Some(at)) => at,
        Ok(None) => match stored
            .shards
            .values()
            .filter_map(|progress| progress.verified_at())
            .min()
        {
            Some(at) => at,
            None => {
                return resnapshot(
                    "the stored position does not say when its shards were last read".into(),
                );
            }
        },
        Err(shard) => {
            return resnapshot(format!(
                "the stored position does not say when shard {shard} was last read (it was \
                 written by an older ddbpipe)"
            ));
        }
    };
    let second = |ms: i64| ms.div_euclid(1000) * 1000;
    let wanted_from = second(delivered_s * 1000 - REPAIR_MARGIN_MS);
    // DynamoDB's own clock says how far its backups reach; this machine's only when it does not.
    let to_ms = second(recovery.latest_ms.unwrap_or(now_ms));
    let from_ms = wanted_from.min(to_ms - MIN_WINDOW_MS);
    if let Some(earliest) = recovery.earliest_ms
        && from_ms < earliest
    {
        return resnapshot(format!(
            "the repair window would start at {from_ms} (unix ms), before the earliest time table \
             '{table}' can be exported from ({earliest}): the lost changes are no longer in its \
             backups, or the backups are younger than the shortest incremental export (15 min)"
        ));
    }
    RepairPlan::Repair { from_ms, to_ms }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{SequenceNumber, ShardId};
    use crate::position::StreamKind;

    const NOW: i64 = 1_800_000_000_000;
    const H: i64 = 3_600_000;

    fn id(s: &str) -> ShardId {
        ShardId::new(s)
    }

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    fn on() -> Recovery {
        Recovery {
            enabled: true,
            earliest_ms: Some(NOW - 30 * 24 * H),
            latest_ms: Some(NOW - 300_000),
        }
    }

    /// Shard a read until `a_s`, shard b at its trim horizon verified at `b_s`.
    fn position(a_s: i64, b_s: i64) -> StreamsPosition {
        let mut position = StreamsPosition::new(StreamKind::Mirror, Some("arn:s".into()));
        position.admit(&id("a"), None, None);
        position.advance(&id("a"), &seq("10"));
        position.read(&id("a"), a_s);
        position.admit(&id("b"), Some(b_s), None);
        position
    }

    #[test]
    fn the_window_starts_at_the_earliest_delivery_time_minus_the_margin_and_ends_at_the_latest_restorable_time()
     {
        let a = (NOW - 30 * H) / 1000;
        let stored = position(a, a + 3600);
        assert_eq!(
            plan(&stored, "arn:s", "t", &on(), NOW),
            RepairPlan::Repair {
                from_ms: a * 1000 - REPAIR_MARGIN_MS,
                to_ms: NOW - 300_000
            }
        );
        // The trim horizon shard is the earlier one.
        let stored = position(a + 3600, a);
        assert!(matches!(
            plan(&stored, "arn:s", "t", &on(), NOW),
            RepairPlan::Repair { from_ms, .. } if from_ms == a * 1000 - REPAIR_MARGIN_MS
        ));
    }

    #[test]
    fn a_short_window_starts_earlier_to_be_exportable() {
        let recent = (NOW - 400_000) / 1000;
        let stored = position(recent, recent);
        let RepairPlan::Repair { from_ms, to_ms } = plan(&stored, "arn:s", "t", &on(), NOW) else {
            panic!("a repair")
        };
        assert_eq!(to_ms - from_ms, MIN_WINDOW_MS);
        assert_eq!(from_ms % 1000, 0);
    }

    #[test]
    fn what_cannot_be_repaired_is_resnapshotted_with_its_reason() {
        let a = (NOW - 30 * H) / 1000;
        let stored = position(a, a);
        let why = |plan: RepairPlan| match plan {
            RepairPlan::Resnapshot(why) => why,
            other => panic!("a resnapshot, not {other:?}"),
        };
        assert!(why(plan(&stored, "arn:other", "t", &on(), NOW)).contains("re-created"));
        let off = Recovery {
            enabled: false,
            ..on()
        };
        assert!(why(plan(&stored, "arn:s", "t", &off, NOW)).contains("point-in-time recovery"));
        let young = Recovery {
            earliest_ms: Some(NOW - 2 * H),
            ..on()
        };
        assert!(why(plan(&stored, "arn:s", "t", &young, NOW)).contains("earliest time"));
        let mut unknown = stored.clone();
        unknown.read_at.clear();
        assert!(why(plan(&unknown, "arn:s", "t", &on(), NOW)).contains("shard a"));
    }
}
