//! Which shard is read next: a FIFO queue of (shard, due time) and a fixed number of slots.
//!
//! # Fairness (docs/streams.md §4.8)
//! 1. A free slot takes the **first** queued shard whose due time has passed.
//! 2. A slice ends by yielding (the shard goes to the **back** of the queue with a due time),
//!    by draining, or by failing; so every readable shard gets turns, and with one slot and
//!    three always-busy shards each is read within the first three slices.
//!
//! Plain data in, decision out: no clock (the caller passes `now`), no I/O.

use std::collections::VecDeque;

use tokio::time::Instant;

use crate::ids::ShardId;

/// The queue of readable shards and the count of active slices.
#[derive(Debug)]
pub struct Scheduler {
    queue: VecDeque<(ShardId, Instant)>,
    active: usize,
    slots: usize,
}

impl Scheduler {
    /// A scheduler with `slots` concurrent slices (at least 1).
    pub fn new(slots: usize) -> Self {
        Scheduler {
            queue: VecDeque::new(),
            active: 0,
            slots: slots.max(1),
        }
    }

    /// Queues `shard` at the back, readable from `due`.
    pub fn push(&mut self, shard: ShardId, due: Instant) {
        self.queue.push_back((shard, due));
    }

    /// Takes the first queued shard that is due, if a slot is free; the slot becomes active.
    pub fn take(&mut self, now: Instant) -> Option<ShardId> {
        if self.active >= self.slots {
            return None;
        }
        let index = self.queue.iter().position(|(_, due)| *due <= now)?;
        let (shard, _) = self.queue.remove(index)?;
        self.active += 1;
        Some(shard)
    }

    /// A slice ended: its slot is free again.
    pub fn release(&mut self) {
        self.active = self.active.saturating_sub(1);
    }

    /// The earliest due time of a queued shard (when a slot is free).
    pub fn next_due(&self) -> Option<Instant> {
        if self.active >= self.slots {
            return None;
        }
        self.queue.iter().map(|(_, due)| *due).min()
    }

    /// Slices running now.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Shards waiting for a turn.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn id(s: &str) -> ShardId {
        ShardId::new(s)
    }

    #[test]
    fn a_free_slot_takes_the_first_due_shard_and_yielded_shards_go_to_the_back() {
        let now = Instant::now();
        let mut s = Scheduler::new(1);
        for name in ["a", "b", "c"] {
            s.push(id(name), now);
        }
        let mut order = Vec::new();
        for _ in 0..6 {
            let shard = s.take(now).unwrap();
            assert!(s.take(now).is_none(), "one slot");
            order.push(shard.as_str().to_string());
            s.release();
            s.push(shard, now);
        }
        assert_eq!(order, ["a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn a_shard_that_is_not_due_is_skipped_not_blocking() {
        let now = Instant::now();
        let mut s = Scheduler::new(2);
        s.push(id("later"), now + Duration::from_secs(5));
        s.push(id("now"), now);
        assert_eq!(s.take(now), Some(id("now")));
        assert_eq!(s.take(now), None);
        assert_eq!(s.next_due(), Some(now + Duration::from_secs(5)));
        assert_eq!(s.take(now + Duration::from_secs(5)), Some(id("later")));
        assert_eq!(s.active(), 2);
        assert_eq!(s.next_due(), None, "no free slot");
    }
}
