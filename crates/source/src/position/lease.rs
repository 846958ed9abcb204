//! What a lease row's checkpoint says (docs/coordination.md §11.1, §11.10, §11.11), like KCL's
//! `ExtendedSequenceNumber`: where a leased unit stands, encoded and decoded here only.
//!
//! # Stored forms (the `checkpoint` attribute, a string)
//! | Checkpoint                  | Stored as                          | Unit     |
//! |-----------------------------|------------------------------------|----------|
//! | [`LeaseCheckpoint::Cursor`] | the key as typed JSON (`{"pk":{"S":"k"}}`) | segment |
//! | [`LeaseCheckpoint::Done`]   | `done`                             | segment  |
//! | [`LeaseCheckpoint::After`]  | `after:<sequence number>`, or `after:<sequence number>,read:<unix s>` with its `read_at` | shard |
//! | [`LeaseCheckpoint::Latest`] | `latest:<unix ms>`                 | shard    |
//! | [`LeaseCheckpoint::Verified`] | `verified:<unix ms>`, or `verified:<unix ms>,latest:<unix ms>` with a floor | shard |
//! | [`LeaseCheckpoint::ShardEnd`] | `end`                            | shard    |
//! | [`LeaseCheckpoint::Settings`] | the run's settings as JSON text  | leader   |
//!
//! A row without the attribute has no checkpoint: its unit starts at its beginning (a segment
//! at its first page, a shard at `TRIM_HORIZON`, unverified: rows written before `verified:`
//! existed).
//!
//! # Verification of a shard not read yet
//! A shard row with nothing read from it (`Latest`, `Verified`, or none) is read from
//! `TRIM_HORIZON`, so records the stream trimmed before anyone read them would be lost
//! unseen. Such a row keeps the time before which every record of the shard was delivered or
//! is not needed ([`LeaseCheckpoint::verified_ms`], one process's `verified_at`,
//! docs/streams.md §4.5): a worker taking it more than 23 h later stops on a gap
//! (docs/coordination.md §11.11). `latest:<ms>` is verified at its own time. A text none of these forms reads (an edit by
//! hand, a newer version's form) decodes to [`LeaseCheckpoint::Unknown`], so the row can still be
//! listed, shown and reset; a worker that takes it stops, naming the row
//! ([`LeaseCheckpoint::unreadable`]). The forms are pinned by golden tests: lease tables written
//! by earlier versions keep loading.
//!
//! # When a positioned shard was read
//! A positioned row keeps its `read_at` (one process's, docs/streams.md
//! §4.12): every record of the shard created before that time (unix s) was delivered. A repair
//! of a gap across workers starts its window there (docs/coordination.md §11.12 rule 9). A row
//! without it (`after:<seq>` alone, written before `read_at` was kept) says nothing: such a gap is mended
//! by a new snapshot instead.

use ddbpipe_value::Item;

use crate::ids::SequenceNumber;

/// Where a leased unit stands, as its lease row keeps it (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCheckpoint {
    /// A segment read up to this key: its next page starts after it.
    Cursor(Item),
    /// A segment read to its end.
    Done,
    /// A shard read up to this sequence number: it resumes after it.
    After {
        /// The last sequence number delivered.
        seq: SequenceNumber,
        /// Every record of the shard created before this time (unix s) was delivered (module
        /// docs, When a positioned shard was read); `None` in an earlier version's row.
        read_at_s: Option<i64>,
    },
    /// A shard not read yet whose first run started from `latest`: it is read from
    /// `TRIM_HORIZON`, dropping records created before this time (unix ms), so a take-over
    /// before the first checkpoint loses nothing.
    Latest {
        /// The run's start, unix ms.
        since_ms: i64,
    },
    /// A shard not read yet, read from `TRIM_HORIZON`: every record of it created before
    /// `at_ms` (unix ms) was delivered or is not needed (module docs, Verification). Written
    /// when the leader creates the row and refreshed while its reader finds it empty.
    Verified {
        /// The verification time, unix ms.
        at_ms: i64,
        /// As [`LeaseCheckpoint::Latest`]'s `since_ms`, for a row that was `latest:`: records
        /// created before it are dropped.
        floor_ms: Option<i64>,
    },
    /// A shard read to its end, its last record acknowledged.
    ShardEnd,
    /// The leader row's: the settings of the run whose units the rows are (JSON text, written
    /// and read by the pipeline, docs/coordination.md §11.10).
    Settings(String),
    /// A text this version does not read, kept as stored.
    Unknown(String),
}

/// What a unit's reader may find in its row, by the kind of unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// The leader row: [`LeaseCheckpoint::Settings`].
    Leader,
    /// A scan segment: [`LeaseCheckpoint::Cursor`] or [`LeaseCheckpoint::Done`].
    Segment,
    /// A stream shard: `After`, `Latest` or `ShardEnd`.
    Shard,
    /// A worker's presence row: none.
    Presence,
}

impl CheckpointKind {
    /// The forms a row of this kind takes, for messages.
    pub fn forms(self) -> &'static str {
        match self {
            CheckpointKind::Leader => "the run's settings",
            CheckpointKind::Segment => {
                "a segment's cursor (its last key as attribute JSON, or done)"
            }
            CheckpointKind::Shard => {
                "an unfinished shard's position (after:<sequence number>, latest:<unix ms>, \
                 verified:<unix ms>)"
            }
            CheckpointKind::Presence => "no checkpoint",
        }
    }
}

const DONE: &str = "done";
const SHARD_END: &str = "end";
const AFTER: &str = "after:";
const LATEST: &str = "latest:";
const VERIFIED: &str = "verified:";
const FLOOR: &str = ",latest:";
const READ_AT: &str = ",read:";

impl LeaseCheckpoint {
    /// The stored text.
    pub fn encode(&self) -> String {
        match self {
            LeaseCheckpoint::Cursor(key) => ddbpipe_value::item_to_typed_json(key).to_string(),
            LeaseCheckpoint::Done => DONE.to_string(),
            LeaseCheckpoint::After { seq, read_at_s } => match read_at_s {
                None => format!("{AFTER}{}", seq.as_str()),
                Some(at) => format!("{AFTER}{}{READ_AT}{at}", seq.as_str()),
            },
            LeaseCheckpoint::Latest { since_ms } => format!("{LATEST}{since_ms}"),
            LeaseCheckpoint::Verified { at_ms, floor_ms } => match floor_ms {
                None => format!("{VERIFIED}{at_ms}"),
                Some(floor_ms) => format!("{VERIFIED}{at_ms}{FLOOR}{floor_ms}"),
            },
            LeaseCheckpoint::ShardEnd => SHARD_END.to_string(),
            LeaseCheckpoint::Settings(text) | LeaseCheckpoint::Unknown(text) => text.clone(),
        }
    }

    /// The checkpoint a row of `kind` stores as `text`: a form of another kind of unit, or no
    /// form at all, is [`LeaseCheckpoint::Unknown`].
    pub fn decode(kind: CheckpointKind, text: &str) -> LeaseCheckpoint {
        let unknown = || LeaseCheckpoint::Unknown(text.to_string());
        match kind {
            CheckpointKind::Leader => LeaseCheckpoint::Settings(text.to_string()),
            CheckpointKind::Segment if text == DONE => LeaseCheckpoint::Done,
            CheckpointKind::Segment => serde_json::from_str(text)
                .ok()
                .and_then(|json| ddbpipe_value::item_from_typed_json(&json, "checkpoint").ok())
                .map_or_else(unknown, LeaseCheckpoint::Cursor),
            CheckpointKind::Shard if text == SHARD_END => LeaseCheckpoint::ShardEnd,
            CheckpointKind::Shard => {
                if let Some(rest) = text.strip_prefix(AFTER) {
                    after(rest).unwrap_or_else(unknown)
                } else if let Some(ms) = text.strip_prefix(LATEST) {
                    ms.parse().map_or_else(
                        |_| unknown(),
                        |since_ms| LeaseCheckpoint::Latest { since_ms },
                    )
                } else if let Some(rest) = text.strip_prefix(VERIFIED) {
                    verified(rest).unwrap_or_else(unknown)
                } else {
                    unknown()
                }
            }
            CheckpointKind::Presence => unknown(),
        }
    }

    /// A shard read up to `seq`, without a `read_at`.
    pub fn after(seq: SequenceNumber) -> LeaseCheckpoint {
        LeaseCheckpoint::After {
            seq,
            read_at_s: None,
        }
    }

    /// When every record of a positioned shard created before it was delivered (unix s):
    /// its `read_at`; `None` for every other checkpoint and for an earlier version's row.
    pub fn read_at_s(&self) -> Option<i64> {
        match self {
            LeaseCheckpoint::After { read_at_s, .. } => *read_at_s,
            _ => None,
        }
    }

    /// A shard row with nothing read, verified at `at_ms`, keeping `floor_ms`.
    pub fn verified(at_ms: i64, floor_ms: Option<i64>) -> LeaseCheckpoint {
        LeaseCheckpoint::Verified { at_ms, floor_ms }
    }

    /// When a shard row with nothing read was last verified (unix ms, module docs): a
    /// `Verified` row's time, a `Latest` row's own; `None` for every other checkpoint.
    pub fn verified_ms(&self) -> Option<i64> {
        match self {
            LeaseCheckpoint::Latest { since_ms } => Some(*since_ms),
            LeaseCheckpoint::Verified { at_ms, .. } => Some(*at_ms),
            _ => None,
        }
    }

    /// The floor of a shard row with nothing read (unix ms): records created before it are
    /// dropped until the first one kept.
    pub fn floor_ms(&self) -> Option<i64> {
        match self {
            LeaseCheckpoint::Latest { since_ms } => Some(*since_ms),
            LeaseCheckpoint::Verified { floor_ms, .. } => *floor_ms,
            _ => None,
        }
    }

    /// Whether the unit is read to its end.
    pub fn is_finished(&self) -> bool {
        matches!(self, LeaseCheckpoint::Done | LeaseCheckpoint::ShardEnd)
    }

    /// Why a worker cannot read a unit from this checkpoint, when it cannot: the message names
    /// the lease, the text and what to do. `expected` says which forms the unit takes.
    pub fn unreadable(&self, unit: &dyn std::fmt::Display, expected: &str) -> String {
        let shown: String = self.encode().chars().take(80).collect();
        format!(
            "lease {unit}: its checkpoint '{shown}' is not {expected}; run `ddbpipe state \
             reset` once no worker runs to start the pipeline afresh"
        )
    }
}

/// `after:`'s rest: `<seq>` or `<seq>,read:<s>`.
fn after(rest: &str) -> Option<LeaseCheckpoint> {
    let (seq, read_at_s) = match rest.split_once(READ_AT) {
        Some((seq, at)) => (seq, Some(at.parse().ok()?)),
        None => (rest, None),
    };
    Some(LeaseCheckpoint::After {
        seq: SequenceNumber::parse(seq).ok()?,
        read_at_s,
    })
}

/// `verified:`'s rest: `<ms>` or `<ms>,latest:<ms>`.
fn verified(rest: &str) -> Option<LeaseCheckpoint> {
    let (at, floor) = match rest.split_once(FLOOR) {
        Some((at, floor)) => (at, Some(floor.parse().ok()?)),
        None => (rest, None),
    };
    Some(LeaseCheckpoint::verified(at.parse().ok()?, floor))
}

#[cfg(test)]
mod tests {
    use ddbpipe_value::{Item, Number, Value};

    use super::*;

    fn key(pk: &str) -> Item {
        Item::from([("pk".to_string(), Value::S(pk.to_string()))])
    }

    fn seq(text: &str) -> SequenceNumber {
        SequenceNumber::parse(text).unwrap()
    }

    /// Golden forms: what every version wrote into lease rows keeps decoding to the same
    /// checkpoint, and encodes back to the same text.
    #[test]
    fn every_stored_form_decodes_and_encodes_back() {
        let golden = [
            (
                CheckpointKind::Segment,
                r#"{"pk":{"S":"k17"}}"#,
                LeaseCheckpoint::Cursor(key("k17")),
            ),
            (CheckpointKind::Segment, "done", LeaseCheckpoint::Done),
            (
                CheckpointKind::Shard,
                "after:000000000000000000123",
                LeaseCheckpoint::after(seq("000000000000000000123")),
            ),
            (
                CheckpointKind::Shard,
                "after:000000000000000000123,read:1767225600",
                LeaseCheckpoint::After {
                    seq: seq("000000000000000000123"),
                    read_at_s: Some(1_767_225_600),
                },
            ),
            (
                CheckpointKind::Shard,
                "latest:1767225600000",
                LeaseCheckpoint::Latest {
                    since_ms: 1_767_225_600_000,
                },
            ),
            (
                CheckpointKind::Shard,
                "verified:1767225600000",
                LeaseCheckpoint::Verified {
                    at_ms: 1_767_225_600_000,
                    floor_ms: None,
                },
            ),
            (
                CheckpointKind::Shard,
                "verified:1767229200000,latest:1767225600000",
                LeaseCheckpoint::Verified {
                    at_ms: 1_767_229_200_000,
                    floor_ms: Some(1_767_225_600_000),
                },
            ),
            (CheckpointKind::Shard, "end", LeaseCheckpoint::ShardEnd),
            (
                CheckpointKind::Leader,
                r#"{"mode":"streams","stream_arn":"arn:1","table":"t"}"#,
                LeaseCheckpoint::Settings(
                    r#"{"mode":"streams","stream_arn":"arn:1","table":"t"}"#.to_string(),
                ),
            ),
        ];
        for (kind, text, checkpoint) in golden {
            assert_eq!(LeaseCheckpoint::decode(kind, text), checkpoint, "{text}");
            assert_eq!(checkpoint.encode(), text);
        }
    }

    #[test]
    fn a_cursor_with_every_key_type_round_trips() {
        let cursor = LeaseCheckpoint::Cursor(Item::from([
            ("pk".to_string(), Value::N(Number::new("-1.5E+130"))),
            ("sk".to_string(), Value::B(vec![0, 255])),
        ]));
        let text = cursor.encode();
        assert_eq!(text, r#"{"pk":{"N":"-1.5E+130"},"sk":{"B":"AP8="}}"#);
        assert_eq!(
            LeaseCheckpoint::decode(CheckpointKind::Segment, &text),
            cursor
        );
    }

    /// A form of another kind of unit, or garbage, is kept as stored: the row lists and
    /// resets, and a worker taking it names it.
    #[test]
    fn a_text_of_another_kind_or_of_no_form_is_unknown_and_kept() {
        let cases = [
            (CheckpointKind::Segment, "after:000000000000000000123"),
            (CheckpointKind::Segment, "end"),
            (CheckpointKind::Segment, r#"{"pk":{"Q":"x"}}"#),
            (CheckpointKind::Shard, "done"),
            (CheckpointKind::Shard, "after:12a"),
            (CheckpointKind::Shard, "after:"),
            (CheckpointKind::Shard, "after:123,read:"),
            (CheckpointKind::Shard, "after:123,read:soon"),
            (CheckpointKind::Shard, "after:,read:5"),
            (CheckpointKind::Shard, "latest:soon"),
            (CheckpointKind::Shard, "verified:"),
            (CheckpointKind::Shard, "verified:soon"),
            (CheckpointKind::Shard, "verified:5,latest:"),
            (CheckpointKind::Shard, "verified:5,floor:4"),
            (CheckpointKind::Segment, "verified:5"),
            (CheckpointKind::Shard, r#"{"pk":{"S":"k"}}"#),
            (CheckpointKind::Presence, "done"),
        ];
        for (kind, text) in cases {
            let decoded = LeaseCheckpoint::decode(kind, text);
            assert_eq!(
                decoded,
                LeaseCheckpoint::Unknown(text.to_string()),
                "{kind:?} {text}"
            );
            assert_eq!(decoded.encode(), text);
        }
        let message = LeaseCheckpoint::Unknown("after:12a".into()).unreadable(
            &"shard:s1",
            "a shard position (after:<sequence number>, latest:<unix ms>)",
        );
        assert!(message.contains("lease shard:s1"), "{message}");
        assert!(message.contains("'after:12a'"), "{message}");
        assert!(message.contains("ddbpipe state reset"), "{message}");
    }

    /// A row with nothing read says when it was verified: `latest:` at its own time, an old
    /// row without a checkpoint (or a positioned one) not at all.
    #[test]
    fn a_shard_row_with_nothing_read_keeps_its_verification_and_floor() {
        let latest = LeaseCheckpoint::Latest { since_ms: 7 };
        assert_eq!(
            (latest.verified_ms(), latest.floor_ms()),
            (Some(7), Some(7))
        );
        let refreshed = LeaseCheckpoint::verified(9, latest.floor_ms());
        assert_eq!(refreshed.encode(), "verified:9,latest:7");
        assert_eq!(
            (refreshed.verified_ms(), refreshed.floor_ms()),
            (Some(9), Some(7))
        );
        let plain = LeaseCheckpoint::verified(9, None);
        assert_eq!((plain.verified_ms(), plain.floor_ms()), (Some(9), None));
        let after = LeaseCheckpoint::after(seq("1"));
        assert_eq!((after.verified_ms(), after.floor_ms()), (None, None));
    }

    #[test]
    fn only_the_ends_are_finished() {
        assert!(LeaseCheckpoint::Done.is_finished());
        assert!(LeaseCheckpoint::ShardEnd.is_finished());
        assert!(!LeaseCheckpoint::after(seq("1")).is_finished());
        assert!(!LeaseCheckpoint::Latest { since_ms: 0 }.is_finished());
        assert!(!LeaseCheckpoint::verified(0, None).is_finished());
        assert!(!LeaseCheckpoint::Cursor(key("k")).is_finished());
    }
}
