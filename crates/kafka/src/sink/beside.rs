//! A mirror's snapshot read beside its stream into Kafka (docs/sinks.md §7.7 rule 7; the
//! version rules of docs/mirror.md §5.6 as a topic can keep them): while a snapshot is open, a
//! snapshot row (`op: r`) of a key for which a change was produced since the snapshot opened
//! is not produced.
//!
//! # Why that is enough
//! Every change to a key after the snapshot's capture reaches the topic through the stream, in
//! stream order (docs/mirror.md §5.6, why this converges). So for a key with a change produced
//! during the snapshot, the key's last message is its last change whatever the snapshot does,
//! and skipping its row is always safe. A row produced before any change of its key comes
//! before all of them in the key's partition. So per key and snapshot there is at most one
//! `op: r`, before the key's changes, and the key's last message is its newest state: a
//! consumer that keeps the last value per key (a compacted topic, a table) converges on the
//! table. (Produced later, a row read before a change could be the key's last message, older
//! than the change: the row is held back for that.)
//!
//! # Memory, and a crash
//! The keys are kept as 128-bit SipHash-1-3 digests under a key drawn per process (a false
//! match of two keys, which would skip a row, has a chance of about n²/2¹²⁹ for n keys), in
//! memory: about 32 bytes per key changed while the snapshot is open, dropped when it closes or
//! another opens. A restart begins with none: every row read after it is newer than every
//! change produced before it (the rows in flight at the crash were not committed and are
//! read again), so only changes produced after the restart can be newer than a row.

use std::collections::HashSet;
use std::hash::{BuildHasher as _, Hasher as _};

use siphasher::sip128::{Hasher128 as _, SipHasher13};

use crate::envelope::Shaped;

/// The keys changed while the current snapshot is open.
pub(crate) struct Beside {
    /// The open snapshot's id; `None`: no snapshot open, nothing is skipped.
    snapshot: Option<i64>,
    /// Digests of the keys changed since it opened.
    changed: HashSet<u128>,
    /// The digest's key, drawn per process.
    keys: (u64, u64),
    /// Rows skipped, for the log.
    skipped: u64,
}

impl Beside {
    pub(crate) fn new() -> Self {
        let random = std::collections::hash_map::RandomState::new();
        let draw = |n: u64| {
            let mut hasher = random.build_hasher();
            hasher.write_u64(n);
            hasher.finish()
        };
        Beside {
            snapshot: None,
            changed: HashSet::new(),
            keys: (draw(0), draw(1)),
            skipped: 0,
        }
    }

    /// The snapshot open as of the batch about to be shaped (`None`: none): another one than
    /// before starts with no key changed.
    pub(crate) fn open(&mut self, snapshot: Option<i64>) {
        if snapshot != self.snapshot {
            if self.skipped > 0 {
                tracing::info!(
                    snapshot = self.snapshot,
                    skipped = self.skipped,
                    "Snapshot rows not produced: their keys had changes produced beside the snapshot."
                );
            }
            self.snapshot = snapshot;
            self.changed = HashSet::new();
            self.skipped = 0;
        }
    }

    /// Whether the message of a line shaped as `shaped`, keyed `key`, is produced (module
    /// docs); a change's key is remembered while a snapshot is open.
    pub(crate) fn keeps(&mut self, shaped: Shaped, key: &[u8]) -> bool {
        if self.snapshot.is_none() {
            return true;
        }
        let digest = self.digest(key);
        match shaped {
            Shaped::Change => {
                self.changed.insert(digest);
                true
            }
            Shaped::Row if self.changed.contains(&digest) => {
                self.skipped += 1;
                false
            }
            Shaped::Row => true,
        }
    }

    fn digest(&self, key: &[u8]) -> u128 {
        let mut hasher = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        hasher.write(key);
        hasher.finish128().as_u128()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_skipped_only_after_a_change_of_its_key_in_the_same_snapshot() {
        let mut beside = Beside::new();
        // No snapshot open: nothing is skipped, nothing remembered.
        assert!(beside.keeps(Shaped::Change, b"a"));
        assert!(beside.keeps(Shaped::Row, b"a"));
        beside.open(Some(1));
        assert!(beside.keeps(Shaped::Row, b"a"), "a row before any change");
        assert!(beside.keeps(Shaped::Change, b"a"));
        assert!(
            !beside.keeps(Shaped::Row, b"a"),
            "a row after a change of its key"
        );
        assert!(beside.keeps(Shaped::Row, b"b"), "another key's row");
        assert!(
            beside.keeps(Shaped::Change, b"a"),
            "changes are always produced"
        );
        beside.open(Some(1));
        assert!(
            !beside.keeps(Shaped::Row, b"a"),
            "the same snapshot keeps its keys"
        );
        // Another snapshot (a resnapshot after a gap) needs every row again.
        beside.open(Some(2));
        assert!(beside.keeps(Shaped::Row, b"a"));
        beside.open(None);
        beside.open(Some(2));
        assert!(
            beside.keeps(Shaped::Row, b"a"),
            "a closed snapshot's keys are gone"
        );
    }
}
