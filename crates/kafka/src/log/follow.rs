//! A partition's last committed record per key, kept by reading only what was appended since
//! the last read (rule 11 of the [module docs](super)): a worker's units read their positions
//! here, so a claim costs the records written since the worker's previous claim, not the
//! partition's history.

use std::collections::HashMap;

use bytes::Bytes;

use super::view::View;
use super::{Fold, LogRecord};

/// The last committed record of each key with a given prefix in one partition, as of the end
/// of the last read ([`LogReader::follow`](super::LogReader::follow)).
///
/// Between reads it keeps the transactions still open at the end of the last one, so a
/// transaction whose records were read before its marker is decided by the marker a later read
/// brings, as in one read of the whole log.
#[derive(Debug)]
pub struct Follower {
    /// Only keys beginning with it are kept (a pipeline's units: `<pipeline>/`).
    prefix: Vec<u8>,
    /// The markers' fold, carried from read to read.
    view: View,
    /// Where the next read begins; `None` before the first read and after a reset.
    next: Option<i64>,
    /// The topic's id at the last read (0: the broker gives none).
    topic_id: u128,
    /// Each kept key's last committed record.
    last: HashMap<Bytes, LogRecord>,
    /// Records taken before the view was last replaced.
    taken_before: u64,
    /// Reads that began at the partition's first offset.
    full_reads: u64,
}

impl Follower {
    /// A follower of the keys beginning with `prefix` that has read nothing yet.
    pub fn new(prefix: &[u8]) -> Follower {
        Follower {
            prefix: prefix.to_vec(),
            view: View::default(),
            next: None,
            topic_id: 0,
            last: HashMap::new(),
            taken_before: 0,
            full_reads: 0,
        }
    }

    /// `key`'s last committed record as of the last read; `None` when it has none (a
    /// tombstone is a record without a value).
    pub fn last(&self, key: &[u8]) -> Option<&LogRecord> {
        self.last.get(key)
    }

    /// Every kept key's last committed record, in no order.
    pub fn records(&self) -> impl Iterator<Item = &LogRecord> {
        self.last.values()
    }

    /// Records read over all reads, control records included.
    pub fn records_read(&self) -> u64 {
        self.taken_before + self.view.taken()
    }

    /// Reads that began at the partition's first offset: the first, and one after each reset.
    pub fn full_reads(&self) -> u64 {
        self.full_reads
    }

    /// Where a read of the partition, whose first offset is now `earliest` and whose topic id
    /// is `topic_id`, begins: after the last read, or at `earliest` when nothing was read
    /// yet, when records after the last read were deleted (`earliest` moved past it), or when
    /// the topic is another one of the same name (deleted and created again). A reset forgets
    /// every key.
    pub(super) fn begin(&mut self, topic_id: u128, earliest: i64) -> i64 {
        let same_topic = self.topic_id == topic_id || self.topic_id == 0 || topic_id == 0;
        match self.next {
            Some(next) if earliest <= next && same_topic => next,
            _ => {
                self.forget();
                self.topic_id = topic_id;
                self.full_reads += 1;
                earliest
            }
        }
    }

    /// Takes what joined the view: each kept key's record replaces an earlier one (by
    /// offset: a transaction committed late may hold a key's older record).
    fn take_joined(&mut self) {
        for record in self.view.take_committed() {
            let Some(key) = record.key.clone() else {
                continue;
            };
            if !key.starts_with(&self.prefix) {
                continue;
            }
            match self.last.get(&key) {
                Some(kept) if kept.offset > record.offset => {}
                _ => {
                    self.last.insert(key, record);
                }
            }
        }
    }

    /// Ends a read from its outcome: one that stopped at `next` is kept and the next read
    /// begins there; a failed one forgets everything, since what it took before the failure
    /// would be taken again from where it began (its records folded twice), so the next read
    /// begins at the partition's first offset.
    pub(super) fn end<E>(&mut self, read: Result<i64, E>) -> Result<(), E> {
        match read {
            Ok(next) => {
                self.take_joined();
                self.next = Some(next);
                Ok(())
            }
            Err(error) => {
                self.forget();
                Err(error)
            }
        }
    }

    /// Forgets everything: the next read begins at the partition's first offset.
    pub(super) fn forget(&mut self) {
        self.taken_before += self.view.taken();
        self.view = View::default();
        self.next = None;
        self.last.clear();
    }
}

impl Fold for Follower {
    fn view(&mut self) -> &mut View {
        &mut self.view
    }

    /// A read holds one answer's records, not the partition's.
    fn answered(&mut self) {
        self.take_joined();
    }
}
