//! An in-memory [`StreamsApi`]: a scripted DynamoDB stream on tokio's clock, for deterministic
//! tests of the stream engine under paused time.
//!
//! # Model
//! - **Shards** have an id, an optional parent, a hash range of the key space, records, and
//!   are open or closed. Ids sort in creation order, which is also the listing order.
//! - **Time** is tokio's [`Instant`] relative to the fake's creation. Changes are scripted at
//!   offsets ([`FakeStreams::at`]) and applied lazily, in order, whenever a call sees that
//!   their time has come, so the same script gives the same stream however the engine polls.
//! - **Records** get sequence numbers from one counter for the whole stream (strictly
//!   increasing, 21 digits or more), a per-key version in the new image, `created_ms` on the
//!   fake's wall clock (an origin plus the fake time), and `INSERT`/`MODIFY`/`REMOVE`.
//!   A record may become visible to `GetRecords` only some time after it was written.
//! - **Reshards** close a parent and hand its hash range to one child (rotation) or two
//!   (split); the children take writes at once and are listed by `DescribeStream` only
//!   `listed_after` later.
//! - **Trims** mark a shard's first records as gone: `GetShardIterator(After s)` with a gone
//!   record after `s`, or `GetRecords` at a gone position, answer `TrimmedDataAccessException`;
//!   `TRIM_HORIZON` silently starts at the first record kept.
//!
//! # Faults
//! [`Faults`] sets seeded rates of throttles (`ProvisionedThroughputExceededException`), 5xx
//! (`InternalServerError`), empty answers with records pending, expiries of iterators that
//! came from `GetRecords`, an iterator lifetime, call latency, and whether the child-shard
//! filter is honoured, rejected or ignored. [`FakeStreams::fail_get_records`] scripts errors after a shard's n-th
//! successful read. Iterators are opaque strings holding the shard, the position and the
//! issue time.
//!
//! # Log
//! [`FakeStreams::written`] lists every record ever written (shard, index, sequence number,
//! key, version), so tests can check what the engine delivered against what exists.
//! [`FakeStreams::history`] lists every write the table took with its exact time on the
//! fake's wall clock (unix µs), so a test can rebuild the table at any moment, and
//! [`FakeStreamTable`] serves exports of the table, incremental ones from that history.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use ddbpipe_value::{Item, Number, Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::api::{
    ChangeData, RecordsPage, ShardDescription, StartAt, StreamPage, StreamRecord, StreamsApi,
};
use crate::error::ApiError;
use crate::ids::{SequenceNumber, ShardId};

/// The ARN of every fake stream.
pub const FAKE_STREAM_ARN: &str =
    "arn:aws:dynamodb:eu-west-1:123456789012:table/t/stream/2026-01-01T00:00:00.000";

/// `DescribeStream` page size (`Limit 100`).
const PAGE: usize = 100;
/// Calls kept in the journal.
const JOURNAL: usize = 64;
/// The hash space keys are routed in.
const HASH_SPACE: u32 = 1 << 16;

/// Seeded fault rates and timings. [`Faults::none`] is a well-behaved stream.
#[derive(Debug, Clone)]
pub struct Faults {
    /// Chance that a request is throttled.
    pub throttle: f64,
    /// Chance that a request fails with `InternalServerError`.
    pub transient: f64,
    /// Chance that `GetRecords` answers empty although records are visible.
    pub empty: f64,
    /// Chance that an iterator returned by `GetRecords` has expired when it is used.
    pub expire: f64,
    /// Iterators older than this have expired.
    pub iterator_ttl: Duration,
    /// Each call takes up to this long.
    pub latency: Duration,
    /// Chance that a written record is visible only after a delay (up to `visibility_delay`).
    pub late: f64,
    /// The longest delay before a late record becomes visible.
    pub visibility_delay: Duration,
    /// Chance that the page holding a closed shard's last record also ends the shard (no next
    /// iterator); otherwise an empty page without iterator follows.
    pub last_page_ends: f64,
    /// What `DescribeStream` does with `ShardFilter`.
    pub child_filter: ChildFilter,
}

/// What the fake's `DescribeStream` does with the child-shard filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildFilter {
    /// Lists only the children of the shard named, like DynamoDB.
    Honoured,
    /// Rejects the request with a `ValidationException`.
    Rejected,
    /// Answers as if there were no filter (a page of the full listing), like some emulators.
    Ignored,
}

impl Faults {
    /// No faults: every answer is immediate, complete and final.
    pub fn none() -> Self {
        Faults {
            throttle: 0.0,
            transient: 0.0,
            empty: 0.0,
            expire: 0.0,
            iterator_ttl: Duration::from_secs(15 * 60),
            latency: Duration::ZERO,
            late: 0.0,
            visibility_delay: Duration::ZERO,
            last_page_ends: 1.0,
            child_filter: ChildFilter::Honoured,
        }
    }
}

/// A change to the stream, applied now ([`FakeStreams::apply`]) or at a scripted time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Write `key` to the open shard whose hash range holds it (`REMOVE` when `remove`).
    Write {
        /// The item's `pk`.
        key: String,
        /// A delete instead of a put.
        remove: bool,
    },
    /// Write `key` into this open shard, whatever its hash range.
    WriteTo {
        /// The shard.
        shard: String,
        /// The item's `pk`.
        key: String,
    },
    /// Add an open shard without parent, listed at once, owning the whole key space (or the
    /// part `range` gives).
    Root {
        /// The shard.
        shard: String,
        /// Its hash range `[from, to)` in `0..65536`; `None`: everything.
        range: Option<(u32, u32)>,
    },
    /// Close `parent`; its children (one: rotation, two: split) share its hash range, take
    /// writes at once and are listed `listed_after` later.
    Reshard {
        /// The shard that closes.
        parent: String,
        /// The new shards.
        children: Vec<String>,
        /// How long after the parent closes the children are listed.
        listed_after: Duration,
    },
    /// Close a shard without children.
    Close {
        /// The shard.
        shard: String,
    },
    /// A closed shard's 24 h passed: it is no longer listed, and asking for its iterator
    /// answers `ResourceNotFoundException` (as DynamoDB does for a shard it dropped).
    Expire {
        /// The shard.
        shard: String,
    },
    /// Trim a shard's records up to and including index `through`.
    Trim {
        /// The shard.
        shard: String,
        /// Index of the last record trimmed.
        through: usize,
    },
}

/// A record as written, for checking what the engine delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The shard holding it.
    pub shard: ShardId,
    /// Its index in the shard.
    pub index: usize,
    /// Its sequence number.
    pub seq: SequenceNumber,
    /// The item's `pk`.
    pub key: String,
    /// The item's version: 1 for the key's first write, one more for each later write.
    pub version: u64,
    /// `INSERT`, `MODIFY` or `REMOVE`.
    pub event: &'static str,
}

/// A write as the table took it, at its exact time: what an incremental export is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableWrite {
    /// When it was written, on the fake's wall clock (unix µs, not rounded: a change scripted
    /// at a sub-millisecond offset keeps it).
    pub micros: i64,
    /// The item's `pk`.
    pub key: String,
    /// The item's version after it (a delete has its own version, one more than the item's).
    pub version: u64,
    /// It deleted the item.
    pub removed: bool,
}

/// One shard as the fake holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard.
    pub id: ShardId,
    /// Its parent.
    pub parent: Option<ShardId>,
    /// Closed (no more records).
    pub closed: bool,
    /// Listed by `DescribeStream` now.
    pub listed: bool,
    /// Records trimmed from its start.
    pub trimmed: usize,
    /// Its records, in order.
    pub records: Vec<Written>,
}

/// Calls received, by operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Calls {
    /// `DescribeStream` calls (with the ones for children).
    pub describe: u64,
    /// `DescribeStream` calls with the child-shard filter.
    pub describe_children: u64,
    /// `GetShardIterator` calls.
    pub shard_iterator: u64,
    /// `GetRecords` calls.
    pub get_records: u64,
}

#[derive(Debug)]
struct Record {
    written: Written,
    created_ms: i64,
    visible_at: Instant,
    old_version: Option<u64>,
}

#[derive(Debug)]
struct Shard {
    id: ShardId,
    parent: Option<ShardId>,
    range: (u32, u32),
    records: Vec<Record>,
    closed_at: Option<Instant>,
    listed_at: Instant,
    /// Dropped by the stream (`Change::Expire`).
    expired: bool,
    trimmed: usize,
    reads: u64,
    scripted: Option<(u64, VecDeque<ApiError>)>,
}

#[derive(Debug)]
struct State {
    epoch: Instant,
    wall_origin_ms: i64,
    rng: StdRng,
    faults: Faults,
    retention: Option<Duration>,
    shards: Vec<Shard>,
    index: HashMap<ShardId, usize>,
    script: Vec<(Instant, u64, Change)>,
    script_order: u64,
    next_seq: u128,
    versions: BTreeMap<String, (u64, bool)>,
    written: Vec<Written>,
    history: Vec<TableWrite>,
    calls: Calls,
    journal: VecDeque<String>,
}

/// An in-memory DynamoDB stream (see the module docs).
#[derive(Debug)]
pub struct FakeStreams {
    state: Mutex<State>,
    hooks: Hooks,
}

/// What a test asked to run when the stream answers an error of a code
/// ([`FakeStreams::on_error`]).
#[derive(Default)]
struct Hooks(Mutex<Vec<(String, Hook)>>);

/// One of [`Hooks`].
type Hook = Box<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hooks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let codes: Vec<&str> = hooks.iter().map(|(code, _)| code.as_str()).collect();
        f.debug_tuple("Hooks").field(&codes).finish()
    }
}

fn api(code: &str, message: impl Into<String>) -> ApiError {
    ApiError::from_code(Some(code.to_string()), message)
}

fn hash(key: &str) -> u32 {
    // FNV-1a: stable across runs and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % HASH_SPACE
}

impl Default for FakeStreams {
    fn default() -> Self {
        FakeStreams::new(0)
    }
}

impl FakeStreams {
    /// An empty stream without faults whose clock starts now; `seed` drives every random
    /// choice (faults, visibility delays).
    pub fn new(seed: u64) -> Self {
        let wall_origin_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        FakeStreams {
            state: Mutex::new(State {
                epoch: Instant::now(),
                wall_origin_ms,
                rng: StdRng::seed_from_u64(seed),
                faults: Faults::none(),
                retention: None,
                shards: Vec::new(),
                index: HashMap::new(),
                script: Vec::new(),
                script_order: 0,
                next_seq: 100_000_000_000_000_000_000,
                versions: BTreeMap::new(),
                written: Vec::new(),
                history: Vec::new(),
                calls: Calls::default(),
                journal: VecDeque::new(),
            }),
            hooks: Hooks::default(),
        }
    }

    /// Runs `then` each time the stream answers an error of `code`, once the answer is made:
    /// a test's way to act in that very moment (a signal as a worker finds a gap).
    pub fn on_error(&self, code: &str, then: impl Fn() + Send + Sync + 'static) {
        let mut hooks = self.hooks.0.lock().unwrap_or_else(|e| e.into_inner());
        hooks.push((code.to_string(), Box::new(then)));
    }

    /// `answer`, after running the hooks of its error's code.
    fn answered<T>(&self, answer: Result<T, ApiError>) -> Result<T, ApiError> {
        if let Err(error) = &answer {
            let hooks = self.hooks.0.lock().unwrap_or_else(|e| e.into_inner());
            for (code, then) in hooks.iter() {
                if error.code.as_deref() == Some(code.as_str()) {
                    then();
                }
            }
        }
        answer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the fault rates.
    pub fn with_faults(self, faults: Faults) -> Self {
        self.lock().faults = faults;
        self
    }

    /// `created_ms` of a record is this origin (unix ms) plus the fake time since creation.
    pub fn with_wall_origin_ms(self, origin_ms: i64) -> Self {
        self.lock().wall_origin_ms = origin_ms;
        self
    }

    /// The first sequence number handed out (later ones count up from it).
    pub fn with_first_sequence(self, first: u128) -> Self {
        self.lock().next_seq = first;
        self
    }

    /// Records older than this (fake time) are trimmed.
    pub fn with_retention(self, retention: Duration) -> Self {
        self.lock().retention = Some(retention);
        self
    }

    /// Applies `change` at `offset` after the fake's creation (at once if that has passed).
    pub fn at(self, offset: Duration, change: Change) -> Self {
        self.schedule(offset, change);
        self
    }

    /// Schedules `change` at `offset` after the fake's creation.
    pub fn schedule(&self, offset: Duration, change: Change) {
        let mut state = self.lock();
        let at = state.epoch + offset;
        let order = state.script_order;
        state.script_order += 1;
        let position = state
            .script
            .partition_point(|(t, o, _)| (*t, *o) <= (at, order));
        state.script.insert(position, (at, order, change));
    }

    /// Applies `change` now (after every scripted change that is due).
    pub fn apply(&self, change: Change) {
        let mut state = self.lock();
        let now = Instant::now();
        state.advance(now);
        state.change(now, change);
    }

    /// After `after_successes` successful `GetRecords` on `shard`, the next calls on it fail
    /// with `errors`, in order.
    pub fn fail_get_records(&self, shard: &str, after_successes: u64, errors: Vec<ApiError>) {
        let mut state = self.lock();
        state.advance(Instant::now());
        if let Some(&i) = state.index.get(&ShardId::new(shard)) {
            state.shards[i].scripted = Some((after_successes, errors.into()));
        }
    }

    /// Every record written so far, in write order.
    pub fn written(&self) -> Vec<Written> {
        let mut state = self.lock();
        state.advance(Instant::now());
        state.written.clone()
    }

    /// Every write the table took so far, in write order, with its exact time (see the
    /// module docs).
    pub fn history(&self) -> Vec<TableWrite> {
        let mut state = self.lock();
        state.advance(Instant::now());
        state.history.clone()
    }

    /// The fake time since its creation: the offset [`FakeStreams::at`] and
    /// [`FakeStreams::schedule`] take for now.
    pub fn elapsed(&self) -> Duration {
        let state = self.lock();
        Instant::now().saturating_duration_since(state.epoch)
    }

    /// Every shard as it stands now, in creation order.
    pub fn shards(&self) -> Vec<ShardInfo> {
        let mut state = self.lock();
        let now = Instant::now();
        state.advance(now);
        state
            .shards
            .iter()
            .map(|s| ShardInfo {
                id: s.id.clone(),
                parent: s.parent.clone(),
                closed: s.closed_at.is_some_and(|t| t <= now),
                listed: s.listed_at <= now && !s.expired,
                trimmed: s.trimmed,
                records: s.records.iter().map(|r| r.written.clone()).collect(),
            })
            .collect()
    }

    /// Whether every scripted change has been applied and every shard is listed.
    pub fn settled(&self) -> bool {
        let mut state = self.lock();
        let now = Instant::now();
        state.advance(now);
        state.script.is_empty() && state.shards.iter().all(|s| s.listed_at <= now)
    }

    /// Whether the stream is settled and every record written is visible to `GetRecords`.
    pub fn quiescent(&self) -> bool {
        let mut state = self.lock();
        let now = Instant::now();
        state.advance(now);
        state.script.is_empty()
            && state
                .shards
                .iter()
                .all(|s| s.listed_at <= now && s.records.iter().all(|r| r.visible_at <= now))
    }

    /// Calls received so far.
    pub fn calls(&self) -> Calls {
        self.lock().calls.clone()
    }

    /// The last calls received and their answers, oldest first.
    pub fn journal(&self) -> Vec<String> {
        self.lock().journal.iter().cloned().collect()
    }

    /// The fake's wall clock now, in unix ms.
    pub fn wall_now_ms(&self) -> i64 {
        let state = self.lock();
        state.wall_ms(Instant::now())
    }
}

mod state;
mod table;

pub use self::table::FakeStreamTable;

use self::state::summary;

impl StreamsApi for FakeStreams {
    async fn describe_stream(
        &self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
    ) -> Result<StreamPage, ApiError> {
        tokio::time::sleep(self.latency()).await;
        let answer = {
            let mut state = self.lock();
            let now = Instant::now();
            state.advance(now);
            let answer = state.describe_stream(stream_arn, exclusive_start, child_of, now);
            let call = format!("DescribeStream(start {exclusive_start:?}, child_of {child_of:?})");
            let shown = summary(&answer, |p| {
                format!(
                    "{} shards, last {:?}",
                    p.shards.len(),
                    p.last_evaluated_shard_id
                )
            });
            state.note(now, call, shown);
            answer
        };
        self.answered(answer)
    }

    async fn shard_iterator(
        &self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
    ) -> Result<Option<String>, ApiError> {
        tokio::time::sleep(self.latency()).await;
        let answer = {
            let mut state = self.lock();
            let now = Instant::now();
            state.advance(now);
            let answer = state.shard_iterator(stream_arn, shard, start, now);
            let shown = summary(&answer, |it| format!("{it:?}"));
            state.note(now, format!("GetShardIterator({shard}, {start:?})"), shown);
            answer
        };
        self.answered(answer)
    }

    async fn get_records(&self, iterator: &str, limit: u32) -> Result<RecordsPage, ApiError> {
        tokio::time::sleep(self.latency()).await;
        let answer = {
            let mut state = self.lock();
            let now = Instant::now();
            state.advance(now);
            state.calls.get_records += 1;
            let answer = state.get_records(iterator, limit, now);
            let shown = summary(&answer, |p| {
                format!("{} records, next {:?}", p.records.len(), p.next_iterator)
            });
            state.note(now, format!("GetRecords({iterator}, {limit})"), shown);
            answer
        };
        self.answered(answer)
    }
}

impl FakeStreams {
    fn latency(&self) -> Duration {
        let mut state = self.lock();
        let max = state.faults.latency.as_millis() as u64;
        if max == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(state.rng.random_range(0..=max))
    }
}

#[cfg(test)]
mod tests;
