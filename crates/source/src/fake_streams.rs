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
    calls: Calls,
    journal: VecDeque<String>,
}

/// An in-memory DynamoDB stream (see the module docs).
#[derive(Debug)]
pub struct FakeStreams {
    state: Mutex<State>,
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
                calls: Calls::default(),
                journal: VecDeque::new(),
            }),
        }
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
                listed: s.listed_at <= now,
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

impl State {
    fn wall_ms(&self, at: Instant) -> i64 {
        self.wall_origin_ms + at.saturating_duration_since(self.epoch).as_millis() as i64
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    /// Applies every scripted change that is due, then the retention.
    fn advance(&mut self, now: Instant) {
        let due = self.script.partition_point(|(t, _, _)| *t <= now);
        let changes: Vec<(Instant, u64, Change)> = self.script.drain(..due).collect();
        for (at, _, change) in changes {
            self.change(at, change);
        }
        if let Some(retention) = self.retention
            && let Some(horizon) = now.checked_sub(retention)
        {
            let horizon_ms = self.wall_ms(horizon);
            for shard in &mut self.shards {
                let old = shard
                    .records
                    .iter()
                    .take_while(|r| r.created_ms < horizon_ms)
                    .count();
                shard.trimmed = shard.trimmed.max(old);
            }
        }
    }

    fn shard_mut(&mut self, id: &str) -> Option<&mut Shard> {
        let i = *self.index.get(&ShardId::new(id))?;
        Some(&mut self.shards[i])
    }

    fn add_shard(
        &mut self,
        id: &str,
        parent: Option<ShardId>,
        range: (u32, u32),
        listed_at: Instant,
    ) {
        let id = ShardId::new(id);
        if self.index.contains_key(&id) {
            return;
        }
        self.index.insert(id.clone(), self.shards.len());
        self.shards.push(Shard {
            id,
            parent,
            range,
            records: Vec::new(),
            closed_at: None,
            listed_at,
            trimmed: 0,
            reads: 0,
            scripted: None,
        });
    }

    fn change(&mut self, at: Instant, change: Change) {
        match change {
            Change::Root { shard, range } => {
                self.add_shard(&shard, None, range.unwrap_or((0, HASH_SPACE)), at);
            }
            Change::Write { key, remove } => {
                let h = hash(&key);
                let target = self
                    .shards
                    .iter()
                    .position(|s| s.closed_at.is_none() && s.range.0 <= h && h < s.range.1);
                if let Some(i) = target {
                    self.write(at, i, key, remove);
                }
            }
            Change::WriteTo { shard, key } => {
                if let Some(&i) = self.index.get(&ShardId::new(&shard))
                    && self.shards[i].closed_at.is_none()
                {
                    self.write(at, i, key, false);
                }
            }
            Change::Reshard {
                parent,
                children,
                listed_after,
            } => {
                let Some(p) = self.shard_mut(&parent) else {
                    return;
                };
                if p.closed_at.is_some() {
                    return;
                }
                p.closed_at = Some(at);
                let (from, to) = p.range;
                let parent_id = p.id.clone();
                // A shard is never listed before its parent.
                let listed_at = (at + listed_after).max(p.listed_at);
                let n = children.len().max(1) as u32;
                for (k, child) in children.iter().enumerate() {
                    let k = k as u32;
                    let range = (from + (to - from) * k / n, from + (to - from) * (k + 1) / n);
                    self.add_shard(child, Some(parent_id.clone()), range, listed_at);
                }
            }
            Change::Close { shard } => {
                if let Some(s) = self.shard_mut(&shard) {
                    s.closed_at.get_or_insert(at);
                }
            }
            Change::Trim { shard, through } => {
                if let Some(s) = self.shard_mut(&shard) {
                    s.trimmed = s.trimmed.max((through + 1).min(s.records.len()));
                }
            }
        }
    }

    fn write(&mut self, at: Instant, shard: usize, key: String, remove: bool) {
        let (version, exists) = self.versions.get(&key).copied().unwrap_or((0, false));
        let event = match (remove, exists) {
            (true, _) => "REMOVE",
            (false, true) => "MODIFY",
            (false, false) => "INSERT",
        };
        let version = version + 1;
        self.versions.insert(key.clone(), (version, !remove));
        let seq = self.next_seq;
        self.next_seq += 1;
        let delay = if self.chance(self.faults.late) {
            let max = self.faults.visibility_delay.as_millis().max(1) as u64;
            Duration::from_millis(self.rng.random_range(0..=max))
        } else {
            Duration::ZERO
        };
        let created_ms = self.wall_ms(at);
        let s = &mut self.shards[shard];
        let previous = s.records.last().map_or(at, |r| r.visible_at);
        let written = Written {
            shard: s.id.clone(),
            index: s.records.len(),
            seq: SequenceNumber::parse(&seq.to_string()).expect("a u128 prints as digits"),
            key,
            version,
            event,
        };
        s.records.push(Record {
            written: written.clone(),
            created_ms,
            visible_at: previous.max(at + delay),
            old_version: exists.then_some(version - 1),
        });
        self.written.push(written);
    }

    /// A scripted throttle or 5xx, if the dice say so.
    fn random_fault(&mut self, what: &str) -> Option<ApiError> {
        if self.chance(self.faults.throttle) {
            return Some(api(
                "ProvisionedThroughputExceededException",
                format!("{what}: rate exceeded (fake)"),
            ));
        }
        if self.chance(self.faults.transient) {
            return Some(api(
                "InternalServerError",
                format!("{what}: internal error (fake)"),
            ));
        }
        None
    }

    fn iterator(&self, shard: usize, pos: usize, now: Instant, fresh: bool) -> String {
        let issued = now.saturating_duration_since(self.epoch).as_millis();
        let kind = if fresh { 'f' } else { 'n' };
        format!("fake-iterator/{shard}/{pos}/{issued}/{kind}")
    }

    fn image(key: &str, version: u64) -> Item {
        Item::from([
            ("pk".to_string(), Value::S(key.to_string())),
            ("v".to_string(), Value::N(Number::new(version.to_string()))),
        ])
    }

    fn stream_record(record: &Record) -> StreamRecord {
        let w = &record.written;
        let keys = Item::from([("pk".to_string(), Value::S(w.key.clone()))]);
        StreamRecord {
            event_id: Some(format!("event-{}", w.seq)),
            event_name: Some(w.event.to_string()),
            change: Some(ChangeData {
                created_ms: Some(record.created_ms),
                keys: Some(keys),
                new_image: (w.event != "REMOVE").then(|| Self::image(&w.key, w.version)),
                old_image: record.old_version.map(|v| Self::image(&w.key, v)),
                sequence_number: Some(w.seq.clone()),
                size_bytes: Some(64),
                view_type: Some("NEW_AND_OLD_IMAGES".into()),
            }),
            user_identity: None,
        }
    }

    fn get_records(
        &mut self,
        iterator: &str,
        limit: u32,
        now: Instant,
    ) -> Result<RecordsPage, ApiError> {
        let invalid = || {
            api(
                "ValidationException",
                format!("invalid shard iterator '{iterator}'"),
            )
        };
        let parts: Vec<&str> = iterator.split('/').collect();
        let [_, shard, pos, issued, kind] = parts[..] else {
            return Err(invalid());
        };
        let (Ok(i), Ok(pos), Ok(issued)) = (
            shard.parse::<usize>(),
            pos.parse::<usize>(),
            issued.parse::<u64>(),
        ) else {
            return Err(invalid());
        };
        if i >= self.shards.len() || pos > self.shards[i].records.len() {
            return Err(invalid());
        }
        let reads = self.shards[i].reads;
        if let Some((after, errors)) = &mut self.shards[i].scripted
            && reads >= *after
            && let Some(error) = errors.pop_front()
        {
            return Err(error);
        }
        if let Some(error) = self.random_fault("GetRecords") {
            return Err(error);
        }
        let age = now.saturating_duration_since(self.epoch + Duration::from_millis(issued));
        let expired =
            age > self.faults.iterator_ttl || (kind == "n" && self.chance(self.faults.expire));
        if expired {
            return Err(api("ExpiredIteratorException", "Iterator expired (fake)"));
        }
        let shard = &self.shards[i];
        if pos < shard.trimmed {
            return Err(api(
                "TrimmedDataAccessException",
                format!(
                    "records of {} before the trim horizon are gone (fake)",
                    shard.id
                ),
            ));
        }
        let closed = shard.closed_at.is_some_and(|t| t <= now);
        let visible = shard.records[pos..]
            .iter()
            .take_while(|r| r.visible_at <= now)
            .count();
        let take = if visible > 0 && self.chance(self.faults.empty) {
            0
        } else {
            visible.min(limit.max(1) as usize)
        };
        let shard = &self.shards[i];
        let records: Vec<StreamRecord> = shard.records[pos..pos + take]
            .iter()
            .map(Self::stream_record)
            .collect();
        let end = pos + take;
        let at_end = closed && end == shard.records.len();
        let next = if at_end && (take == 0 || self.chance(self.faults.last_page_ends)) {
            None
        } else {
            Some(self.iterator(i, end, now, false))
        };
        self.shards[i].reads += 1;
        Ok(RecordsPage {
            records,
            next_iterator: next,
        })
    }
}

impl State {
    fn describe_stream(
        &mut self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
        now: Instant,
    ) -> Result<StreamPage, ApiError> {
        self.calls.describe += 1;
        if child_of.is_some() {
            self.calls.describe_children += 1;
        }
        if stream_arn != FAKE_STREAM_ARN {
            return Err(api(
                "ResourceNotFoundException",
                format!("no stream {stream_arn}"),
            ));
        }
        if let Some(error) = self.random_fault("DescribeStream") {
            return Err(error);
        }
        let describe = |s: &Shard| ShardDescription {
            id: s.id.clone(),
            parent: s.parent.clone(),
            closed: s.closed_at.is_some_and(|t| t <= now),
        };
        let listed = self.shards.iter().filter(|s| s.listed_at <= now);
        let mut page = StreamPage {
            status: Some("ENABLED".into()),
            view_type: Some("NEW_AND_OLD_IMAGES".into()),
            ..StreamPage::default()
        };
        if let Some(parent) = child_of {
            match self.faults.child_filter {
                ChildFilter::Honoured => {
                    page.shards = listed
                        .filter(|s| s.parent.as_ref() == Some(parent))
                        .map(describe)
                        .collect();
                    return Ok(page);
                }
                ChildFilter::Rejected => {
                    return Err(api(
                        "ValidationException",
                        "ShardFilter is not supported (fake)",
                    ));
                }
                ChildFilter::Ignored => {}
            }
        }
        let after: Vec<&Shard> = match exclusive_start {
            None => listed.collect(),
            Some(start) => listed.skip_while(|s| &s.id != start).skip(1).collect(),
        };
        page.shards = after.iter().take(PAGE).map(|s| describe(s)).collect();
        if after.len() > PAGE {
            page.last_evaluated_shard_id = page.shards.last().map(|s| s.id.clone());
        }
        Ok(page)
    }

    fn shard_iterator(
        &mut self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
        now: Instant,
    ) -> Result<Option<String>, ApiError> {
        self.calls.shard_iterator += 1;
        let Some(&i) = self
            .index
            .get(shard)
            .filter(|_| stream_arn == FAKE_STREAM_ARN)
        else {
            return Err(api(
                "ResourceNotFoundException",
                format!("no shard {shard}"),
            ));
        };
        if let Some(error) = self.random_fault("GetShardIterator") {
            return Err(error);
        }
        let s = &self.shards[i];
        let pos = match start {
            StartAt::TrimHorizon => s.trimmed,
            StartAt::Latest => s.records.len(),
            StartAt::After(seq) => {
                let Some(at) = s.records.iter().position(|r| &r.written.seq == seq) else {
                    return Err(api(
                        "ValidationException",
                        format!("sequence number {seq} is not in shard {shard}"),
                    ));
                };
                if s.trimmed > at + 1 {
                    return Err(api(
                        "TrimmedDataAccessException",
                        format!("records of {shard} after {seq} were trimmed (fake)"),
                    ));
                }
                at + 1
            }
        };
        Ok(Some(self.iterator(i, pos, now, true)))
    }

    /// Keeps the last calls and their answers, for a failing test to print.
    fn note(&mut self, now: Instant, call: String, answer: String) {
        if self.journal.len() == JOURNAL {
            self.journal.pop_front();
        }
        let at = now.saturating_duration_since(self.epoch);
        self.journal.push_back(format!("{at:?} {call} -> {answer}"));
    }
}

fn summary<T>(answer: &Result<T, ApiError>, ok: impl FnOnce(&T) -> String) -> String {
    match answer {
        Ok(value) => ok(value),
        Err(error) => error.to_string(),
    }
}

impl StreamsApi for FakeStreams {
    async fn describe_stream(
        &self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
    ) -> Result<StreamPage, ApiError> {
        tokio::time::sleep(self.latency()).await;
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
    }

    async fn shard_iterator(
        &self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
    ) -> Result<Option<String>, ApiError> {
        tokio::time::sleep(self.latency()).await;
        let mut state = self.lock();
        let now = Instant::now();
        state.advance(now);
        let answer = state.shard_iterator(stream_arn, shard, start, now);
        let shown = summary(&answer, |it| format!("{it:?}"));
        state.note(now, format!("GetShardIterator({shard}, {start:?})"), shown);
        answer
    }

    async fn get_records(&self, iterator: &str, limit: u32) -> Result<RecordsPage, ApiError> {
        tokio::time::sleep(self.latency()).await;
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
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn root(id: &str) -> Change {
        Change::Root {
            shard: id.into(),
            range: None,
        }
    }

    fn write_to(shard: &str, key: &str) -> Change {
        Change::WriteTo {
            shard: shard.into(),
            key: key.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_shard_is_read_to_its_end_and_then_has_no_next_iterator() {
        let fake = FakeStreams::new(1).at(Duration::ZERO, root("s1"));
        for key in ["a", "b", "a"] {
            fake.apply(write_to("s1", key));
        }
        fake.apply(Change::Close { shard: "s1".into() });
        let s1 = ShardId::new("s1");
        let it = fake
            .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::TrimHorizon)
            .await
            .unwrap()
            .unwrap();
        let page = fake.get_records(&it, 2).await.unwrap();
        assert_eq!(page.records.len(), 2);
        let page = fake
            .get_records(&page.next_iterator.unwrap(), 2)
            .await
            .unwrap();
        assert_eq!(page.records.len(), 1);
        assert_eq!(page.records[0].event_name.as_deref(), Some("MODIFY"));
        assert!(page.next_iterator.is_none());
        let versions: Vec<u64> = fake.written().iter().map(|w| w.version).collect();
        assert_eq!(versions, vec![1, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn children_are_listed_only_after_their_delay_and_take_the_parents_keys() {
        let fake = FakeStreams::new(2).at(Duration::ZERO, root("p")).at(
            Duration::from_secs(1),
            Change::Reshard {
                parent: "p".into(),
                children: vec!["c1".into(), "c2".into()],
                listed_after: Duration::from_secs(5),
            },
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        fake.apply(Change::Write {
            key: "k".into(),
            remove: false,
        });
        let page = fake
            .describe_stream(FAKE_STREAM_ARN, None, None)
            .await
            .unwrap();
        assert_eq!(page.shards.len(), 1);
        assert!(page.shards[0].closed);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let page = fake
            .describe_stream(FAKE_STREAM_ARN, None, Some(&ShardId::new("p")))
            .await
            .unwrap();
        assert_eq!(page.shards.len(), 2);
        let written = fake.written();
        assert_eq!(written.len(), 1);
        assert!(written[0].shard.as_str().starts_with('c'));
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_of_more_than_a_hundred_shards_comes_in_pages() {
        let fake = FakeStreams::new(3);
        for i in 0..150 {
            fake.apply(root(&format!("s{i:03}")));
        }
        let first = fake
            .describe_stream(FAKE_STREAM_ARN, None, None)
            .await
            .unwrap();
        assert_eq!(first.shards.len(), 100);
        let last = first.last_evaluated_shard_id.unwrap();
        let second = fake
            .describe_stream(FAKE_STREAM_ARN, Some(&last), None)
            .await
            .unwrap();
        assert_eq!(second.shards.len(), 50);
        assert!(second.last_evaluated_shard_id.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trimmed_position_is_refused_and_trim_horizon_skips_it() {
        let fake = FakeStreams::new(4).at(Duration::ZERO, root("s1"));
        for key in ["a", "b", "c"] {
            fake.apply(write_to("s1", key));
        }
        let s1 = ShardId::new("s1");
        let old = fake
            .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::TrimHorizon)
            .await
            .unwrap()
            .unwrap();
        let first = fake.written()[0].seq.clone();
        fake.apply(Change::Trim {
            shard: "s1".into(),
            through: 1,
        });
        let error = fake.get_records(&old, 10).await.unwrap_err();
        assert_eq!(error.code.as_deref(), Some("TrimmedDataAccessException"));
        let error = fake
            .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::After(first))
            .await
            .unwrap_err();
        assert_eq!(error.code.as_deref(), Some("TrimmedDataAccessException"));
        let it = fake
            .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::TrimHorizon)
            .await
            .unwrap()
            .unwrap();
        let page = fake.get_records(&it, 10).await.unwrap();
        assert_eq!(page.records.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_iterator_has_expired() {
        let fake = FakeStreams::new(5).at(Duration::ZERO, root("s1"));
        let s1 = ShardId::new("s1");
        let it = fake
            .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::Latest)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_secs(16 * 60)).await;
        let error = fake.get_records(&it, 10).await.unwrap_err();
        assert_eq!(error.code.as_deref(), Some("ExpiredIteratorException"));
    }
}
