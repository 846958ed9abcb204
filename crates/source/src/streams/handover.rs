//! The one place where change records leave the stream reader for the pipeline.
//!
//! # Rules
//! 1. Records and position marks travel through one bounded channel in the order they were
//!    handed over, so a child's admission always follows its parent's last record and the
//!    sequential sink acknowledges them in that order (docs/streams.md §4.8).
//! 2. `max_messages`: the handover counts records and cuts the page that reaches the limit,
//!    so exactly N records are handed over and the shard's mark is the N-th record's sequence
//!    number (docs/streams.md §4.10). After that nothing more is accepted.
//! 3. The idle clock restarts at every non-empty read and after every hand-over that had to
//!    wait for room (time spent waiting for the sink is not idleness).
//! 4. The handed view of the position (what has been handed over, not yet acknowledged) is
//!    what admission decisions use: a child is admitted once its parent's last record was
//!    handed over.
//! 5. A hand-over waits for room in the channel before it takes the handover's lock: while the
//!    sink is slow, other shards' reads of the view and the idle clock are not held up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use crate::api::ChangeOp;
use crate::ids::{SequenceNumber, ShardId};
use crate::position::StreamsPosition;
use crate::records::Lines;

/// A change to the stored position, applied once the batch carrying it is acknowledged.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamMark {
    /// Every record of the shard up to and including this one was delivered.
    Advance(ShardId, SequenceNumber),
    /// The shard's last record was delivered (`ShardEnd`); `frontier` (unix s) is kept for its
    /// children's `verified_at`.
    Finish(ShardId, Option<i64>),
    /// A shard joins the position with nothing read (`""`).
    Admit {
        /// The shard.
        shard: ShardId,
        /// Unix s before which every record is delivered or not needed.
        verified_at: Option<i64>,
        /// The `latest` floor (unix ms), on a first run's `LATEST` shards.
        floor_ms: Option<i64>,
    },
    /// A shard still at `""` was read empty twice: refresh its `verified_at` (unix s).
    Verify(ShardId, i64),
    /// Every record of the shard created before this time (unix s) was delivered: its
    /// `read_at`, which a repair starts from (docs/streams.md §4.12). Follows an `Advance`.
    ReadAt(ShardId, i64),
}

/// Records of one shard read in one response, with the marks they reach.
#[derive(Debug, Default)]
pub struct Handed {
    /// The envelopes, in stream order.
    pub records: Lines,
    /// Sequence number of each record (same length as `records`).
    pub seqs: Vec<SequenceNumber>,
    /// The kind of each record, for metrics.
    pub ops: Vec<ChangeOp>,
    /// The shard they came from (`None` for a pure mark message).
    pub shard: Option<ShardId>,
    /// Marks that follow the records (finish, admissions, verifications).
    pub marks: Vec<StreamMark>,
    /// The creation time (unix s) of the earliest record, when the records say: every record
    /// of the shard before it was delivered once these are.
    pub created_s: Option<i64>,
}

/// Why the handover accepts nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// `max_messages` records were handed over.
    MaxMessages,
    /// The pipeline is gone (the run is stopping).
    Gone,
}

#[derive(Debug)]
struct State {
    view: StreamsPosition,
    handed: u64,
    limit: Option<u64>,
    last_activity: Instant,
}

/// Shared by the engine and its slices.
#[derive(Debug)]
pub struct Handover {
    tx: mpsc::Sender<Handed>,
    state: Mutex<State>,
    /// Hand-overs with records waiting for room in the channel (rule 3).
    waiting: AtomicUsize,
}

/// Counts one hand-over waiting for room while it lives (a cancelled wait included).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Handover {
    /// A handover into `tx`, starting from `view` (the committed position), stopping after
    /// `limit` records.
    pub fn new(tx: mpsc::Sender<Handed>, view: StreamsPosition, limit: Option<u64>) -> Self {
        Handover {
            tx,
            state: Mutex::new(State {
                view,
                handed: 0,
                limit,
                last_activity: Instant::now(),
            }),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Hands over records (and marks). Returns how many records were accepted; `Err` when the
    /// handover is closed (the records after the limit are dropped, to be read again).
    pub async fn hand(&self, mut handed: Handed) -> Result<usize, Closed> {
        // Room in the channel is waited for before the state is locked (rule 5); the view is
        // then updated and the message sent under one lock, so the channel keeps the order of
        // the view's changes (rule 1).
        let permit = match self.tx.try_reserve() {
            Ok(permit) => permit,
            Err(mpsc::error::TrySendError::Full(())) => {
                // Waiting for the sink with records in hand is not idleness (rule 3).
                let _waiting = (!handed.seqs.is_empty()).then(|| Waiting::new(&self.waiting));
                self.tx.reserve().await.map_err(|_| Closed::Gone)?
            }
            Err(mpsc::error::TrySendError::Closed(())) => return Err(Closed::Gone),
        };
        let mut state = self.state.lock().await;
        if let Some(limit) = state.limit {
            let room = limit.saturating_sub(state.handed) as usize;
            // Past the limit nothing may finish a shard (its unread records would be lost);
            // admissions and verifications alone are harmless.
            if room == 0 {
                if !handed.seqs.is_empty() {
                    return Err(Closed::MaxMessages);
                }
                handed
                    .marks
                    .retain(|mark| !matches!(mark, StreamMark::Finish(..)));
            }
            if handed.seqs.len() > room {
                let mut cut = Lines::default();
                cut.extend_from(&handed.records, 0, room);
                handed.records = cut;
                handed.seqs.truncate(room);
                handed.ops.truncate(room);
                // The rest of the shard is read again next run: no finish, no admissions.
                handed.marks.clear();
            }
        }
        let accepted = handed.seqs.len();
        if let Some(shard) = &handed.shard
            && let Some(last) = handed.seqs.last()
        {
            state.view.advance(shard, last);
        }
        for mark in &handed.marks {
            apply(&mut state.view, mark);
        }
        state.handed += accepted as u64;
        // A non-empty read restarts the idle clock, and so does waiting for the sink with
        // records in hand (that is not idleness); marks alone do not.
        if accepted > 0 {
            state.last_activity = Instant::now();
        }
        permit.send(handed);
        Ok(accepted)
    }

    /// Records a non-empty read (restarts the idle clock) without handing anything over.
    pub async fn touch(&self) {
        self.state.lock().await.last_activity = Instant::now();
    }

    /// How long since the last non-empty read or blocked hand-over; none while a hand-over
    /// with records waits for room.
    pub async fn idle_for(&self) -> Duration {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.state.lock().await.last_activity.elapsed()
    }

    /// Restarts the idle clock (streaming starts).
    pub async fn reset_idle(&self) {
        self.state.lock().await.last_activity = Instant::now();
    }

    /// Records handed over so far.
    pub async fn handed(&self) -> u64 {
        self.state.lock().await.handed
    }

    /// Whether `max_messages` records were handed over.
    pub async fn limit_reached(&self) -> bool {
        let state = self.state.lock().await;
        state.limit.is_some_and(|limit| state.handed >= limit)
    }

    /// Runs `f` on the handed-over position (what admission decisions use).
    pub async fn with_view<R>(&self, f: impl FnOnce(&mut StreamsPosition) -> R) -> R {
        f(&mut self.state.lock().await.view)
    }
}

/// Applies a mark to a position (the committed one at acknowledgement, the handed view here).
pub fn apply(position: &mut StreamsPosition, mark: &StreamMark) {
    match mark {
        StreamMark::Advance(shard, seq) => position.advance(shard, seq),
        StreamMark::Finish(shard, frontier) => position.finish(shard, *frontier),
        StreamMark::Admit {
            shard,
            verified_at,
            floor_ms,
        } => position.admit(shard, *verified_at, *floor_ms),
        StreamMark::Verify(shard, at) => position.verify(shard, *at),
        StreamMark::ReadAt(shard, at) => position.read(shard, *at),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::position::StreamKind;

    fn seq_of(text: &str) -> SequenceNumber {
        SequenceNumber::parse(text).unwrap()
    }

    fn records(shard: &str, seqs: &[&str]) -> Handed {
        let mut lines = Lines::default();
        for seq in seqs {
            lines
                .push_with(|out| out.extend_from_slice(format!(r#"{{"seq":"{seq}"}}"#).as_bytes()));
        }
        Handed {
            records: lines,
            seqs: seqs.iter().map(|seq| seq_of(seq)).collect(),
            ops: seqs.iter().map(|_| ChangeOp::Insert).collect(),
            shard: Some(ShardId::new(shard)),
            ..Handed::default()
        }
    }

    /// While the sink is slow, a hand-over waiting for room holds up neither the view nor the
    /// idle clock, and the wait does not count as idleness; the channel keeps the order.
    #[tokio::test(start_paused = true)]
    async fn a_hand_over_waiting_for_room_holds_nothing_up_and_is_not_idleness() {
        let (tx, mut rx) = mpsc::channel(1);
        let view = StreamsPosition::new(StreamKind::Streams, None);
        let handover = Arc::new(Handover::new(tx, view, None));
        handover.hand(records("a", &["1"])).await.unwrap();
        let waiting = tokio::spawn({
            let handover = Arc::clone(&handover);
            async move { handover.hand(records("b", &["2"])).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiting.is_finished(), "the channel is full");
        let answered = tokio::time::timeout(Duration::from_secs(1), async {
            (handover.idle_for().await, handover.with_view(|_| ()).await)
        })
        .await
        .expect("the view and the idle clock answer while a hand-over waits");
        assert_eq!(
            answered.0,
            Duration::ZERO,
            "waiting for the sink is not idleness"
        );
        assert_eq!(rx.recv().await.unwrap().seqs, [seq_of("1")]);
        assert_eq!(waiting.await.unwrap(), Ok(1));
        assert_eq!(rx.recv().await.unwrap().seqs, [seq_of("2")]);
        assert_eq!(
            handover.idle_for().await,
            Duration::ZERO,
            "the wait ended just now"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(handover.idle_for().await, Duration::from_secs(5));
        assert_eq!(handover.handed().await, 2);
    }
}
