//! The window of a driven run's batches: which were handed out, which came back acknowledged,
//! and which of their positions may be committed now. A plain decision: batches and
//! acknowledgements in, positions out; no clock, no I/O.
//!
//! # Rules (docs/state.md §6.9)
//! 1. A batch's positions are marks, each of one unit: a scan segment's cursor, or a mark of
//!    one stream shard (advance, finish, admission, verification, read time).
//! 2. A mark commits once its batch is acknowledged and every earlier batch carrying a mark of
//!    the same unit committed that mark: what is committed of each unit is an acknowledged
//!    prefix of its batches, whatever the order of the acknowledgements.
//! 3. A shard admitted while other shards' ends (`Finish`) are handed out but not committed
//!    commits none of its marks before those ends are committed: the engine admits a child
//!    only after its parents' ends, so a child never commits before every batch of its
//!    parents (and, through them, of their ancestors). The ends it waits for may include
//!    shards that are not its parents: that only delays it.
//! 4. A batch that is never acknowledged (dropped, failed, or not handed out because the run
//!    stopped) blocks its units from that batch on: none of their later marks commits.
//! 5. A batch is retired once all its marks are committed; the window holds the batches not
//!    retired, so a batch held unacknowledged keeps at most a window of later batches waiting.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use ddbpipe_source::ids::ShardId;
use ddbpipe_source::streams::handover::StreamMark;

use crate::batch::Batch;

/// A batch's number in the order the run cut them, from 1.
pub type BatchNumber = u64;

/// Where a batch of the window stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Handed out, not yet acknowledged.
    Out,
    /// Acknowledged: its marks commit as rule 2 allows.
    Acknowledged,
    /// Never to be acknowledged (rule 4).
    Lost,
}

/// The unit a mark belongs to (rule 1).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Unit {
    Segment(u32),
    Shard(ShardId),
}

/// One position a batch reaches.
#[derive(Debug, Clone)]
enum Mark {
    Segment(u32, ddbpipe_source::records::SegmentCursor),
    Shard(StreamMark),
}

impl Mark {
    fn unit(&self) -> Unit {
        match self {
            Mark::Segment(segment, _) => Unit::Segment(*segment),
            Mark::Shard(mark) => Unit::Shard(shard_of(mark).clone()),
        }
    }
}

fn shard_of(mark: &StreamMark) -> &ShardId {
    match mark {
        StreamMark::Advance(shard, _)
        | StreamMark::Finish(shard, _)
        | StreamMark::Admit { shard, .. }
        | StreamMark::Verify(shard, _)
        | StreamMark::ReadAt(shard, _) => shard,
    }
}

#[derive(Debug)]
struct Entry {
    number: BatchNumber,
    fate: Fate,
    /// The marks not yet committed, in the batch's order.
    marks: Vec<Mark>,
}

/// The batches handed out and not retired (module docs).
#[derive(Debug, Default)]
pub(crate) struct Window {
    entries: VecDeque<Entry>,
    last: BatchNumber,
    /// Shards whose end is handed out and not committed.
    ending: BTreeSet<ShardId>,
    /// The ends each admitted shard waits for (rule 3).
    waits_for: BTreeMap<ShardId, BTreeSet<ShardId>>,
}

impl Window {
    /// Adds the next batch in the run's order, with its fate; returns its number.
    pub(crate) fn push(&mut self, batch: &Batch, fate: Fate) -> BatchNumber {
        self.last += 1;
        let segments = batch
            .segments
            .iter()
            .map(|(segment, cursor)| Mark::Segment(*segment, cursor.clone()));
        let shards = batch.shards.iter().map(|mark| {
            match mark {
                StreamMark::Finish(shard, _) => {
                    self.ending.insert(shard.clone());
                }
                StreamMark::Admit { shard, .. } if !self.ending.is_empty() => {
                    let ending = self.ending.iter().filter(|end| *end != shard).cloned();
                    self.waits_for
                        .entry(shard.clone())
                        .or_default()
                        .extend(ending);
                }
                _ => {}
            }
            Mark::Shard(mark.clone())
        });
        let marks = segments.chain(shards).collect();
        self.entries.push_back(Entry {
            number: self.last,
            fate,
            marks,
        });
        self.last
    }

    /// Records what became of batch `number`. A batch already acknowledged stays so.
    pub(crate) fn settle(&mut self, number: BatchNumber, fate: Fate) {
        if let Some(entry) = self.entries.iter_mut().find(|e| e.number == number)
            && entry.fate == Fate::Out
        {
            entry.fate = fate;
        }
    }

    /// Batches not retired (rule 5).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether a batch is still out (neither acknowledged nor lost).
    pub(crate) fn any_out(&self) -> bool {
        self.entries.iter().any(|e| e.fate == Fate::Out)
    }

    /// Every batch still out is lost (the run ends without it).
    pub(crate) fn lose_out(&mut self) {
        for entry in &mut self.entries {
            if entry.fate == Fate::Out {
                entry.fate = Fate::Lost;
            }
        }
    }

    /// Takes the marks that may commit now (rules 2–4), as a batch of positions in the order
    /// they must be applied, and retires the batches left with none.
    pub(crate) fn ready(&mut self) -> Batch {
        let mut ready = Batch::default();
        let mut blocked: HashSet<Unit> = HashSet::new();
        for entry in &mut self.entries {
            if entry.fate != Fate::Acknowledged {
                blocked.extend(entry.marks.iter().map(Mark::unit));
                continue;
            }
            let mut kept = Vec::new();
            for mark in entry.marks.drain(..) {
                let unit = mark.unit();
                let waits = match &unit {
                    Unit::Shard(shard) => self
                        .waits_for
                        .get(shard)
                        .is_some_and(|ends| ends.iter().any(|end| self.ending.contains(end))),
                    Unit::Segment(_) => false,
                };
                if waits || blocked.contains(&unit) {
                    blocked.insert(unit);
                    kept.push(mark);
                    continue;
                }
                match mark {
                    Mark::Segment(segment, cursor) => ready.segments.push((segment, cursor)),
                    Mark::Shard(mark) => {
                        if let StreamMark::Finish(shard, _) = &mark {
                            self.ending.remove(shard);
                        }
                        ready.shards.push(mark);
                    }
                }
            }
            entry.marks = kept;
        }
        self.entries
            .retain(|e| !(e.fate == Fate::Acknowledged && e.marks.is_empty()));
        let ending = &self.ending;
        self.waits_for.retain(|_, ends| {
            ends.retain(|end| ending.contains(end));
            !ends.is_empty()
        });
        ready
    }
}

#[cfg(test)]
mod tests {
    use ddbpipe_source::ids::SequenceNumber;
    use ddbpipe_source::records::SegmentCursor;
    use ddbpipe_value::{Item, Value};

    use super::*;

    fn key(k: &str) -> SegmentCursor {
        SegmentCursor::Next(Item::from([("pk".into(), Value::S(k.into()))]))
    }

    fn scan(marks: &[(u32, &str)]) -> Batch {
        Batch {
            segments: marks.iter().map(|(s, k)| (*s, key(k))).collect(),
            ..Batch::default()
        }
    }

    fn stream(marks: Vec<StreamMark>) -> Batch {
        Batch {
            shards: marks,
            ..Batch::default()
        }
    }

    fn advance(shard: &str, seq: u32) -> StreamMark {
        let seq = SequenceNumber::parse(&format!("{}", 100 + seq)).expect("a sequence number");
        StreamMark::Advance(ShardId::new(shard), seq)
    }

    fn admit(shard: &str) -> StreamMark {
        StreamMark::Admit {
            shard: ShardId::new(shard),
            verified_at: None,
            floor_ms: None,
        }
    }

    fn segments(batch: &Batch) -> Vec<(u32, SegmentCursor)> {
        batch.segments.clone()
    }

    #[test]
    fn a_later_batch_acknowledged_first_commits_only_the_units_no_earlier_batch_holds() {
        let mut window = Window::default();
        let first = window.push(&scan(&[(0, "a"), (1, "b")]), Fate::Out);
        let second = window.push(&scan(&[(0, "c"), (2, "d")]), Fate::Out);
        window.settle(second, Fate::Acknowledged);
        assert_eq!(segments(&window.ready()), [(2, key("d"))]);
        assert_eq!(window.len(), 2, "the second batch's segment 0 waits");
        window.settle(first, Fate::Acknowledged);
        assert_eq!(
            segments(&window.ready()),
            [(0, key("a")), (1, key("b")), (0, key("c"))]
        );
        assert_eq!(window.len(), 0);
    }

    #[test]
    fn a_lost_batch_blocks_its_units_from_it_on_and_nothing_else() {
        let mut window = Window::default();
        let lost = window.push(&scan(&[(0, "a")]), Fate::Out);
        window.push(&scan(&[(0, "b"), (1, "c")]), Fate::Acknowledged);
        window.settle(lost, Fate::Lost);
        assert_eq!(segments(&window.ready()), [(1, key("c"))]);
        window.push(&scan(&[(1, "e")]), Fate::Acknowledged);
        assert_eq!(segments(&window.ready()), [(1, key("e"))]);
        assert_eq!(window.len(), 2, "segment 0 stays blocked");
    }

    #[test]
    fn a_child_admitted_after_its_parents_end_commits_nothing_before_that_end() {
        let mut window = Window::default();
        let parent = window.push(&stream(vec![advance("p", 1)]), Fate::Out);
        let end = window.push(
            &stream(vec![
                StreamMark::Finish(ShardId::new("p"), None),
                admit("c"),
            ]),
            Fate::Out,
        );
        let child = window.push(&stream(vec![advance("c", 2)]), Fate::Acknowledged);
        window.settle(end, Fate::Acknowledged);
        assert!(
            window.ready().shards.is_empty(),
            "the end waits for the parent's first batch, the child for the end"
        );
        window.settle(parent, Fate::Acknowledged);
        let ready = window.ready();
        assert_eq!(
            ready.shards,
            [
                advance("p", 1),
                StreamMark::Finish(ShardId::new("p"), None),
                admit("c"),
                advance("c", 2)
            ]
        );
        let _ = child;
        assert_eq!(window.len(), 0);
    }

    #[test]
    fn a_shard_known_before_any_end_commits_on_its_own() {
        let mut window = Window::default();
        window.push(&stream(vec![advance("p", 1)]), Fate::Out);
        window.push(&stream(vec![advance("q", 1)]), Fate::Acknowledged);
        assert_eq!(window.ready().shards, [advance("q", 1)]);
    }
}
