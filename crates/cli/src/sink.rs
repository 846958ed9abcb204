//! Bring your own sink (docs/sinks.md §7.5): a [`Sink`] the embedding program writes, given to
//! a pipeline whose config says `sink: {type: custom}` with [`Pipeline::with_sink`]. It gets
//! every mode's records in order, in batches; a batch it acknowledges (returns `Ok`) is done:
//! the position advances past it and is saved in the state file (`state:`), so a later run
//! resumes after the last acknowledged batch. A batch it fails is never acknowledged: the run
//! stops, and a rerun delivers it again (at least once).
//!
//! [`Pipeline::with_sink`]: crate::Pipeline::with_sink

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use ddbpipe_pipeline::batch::Batch as Read;
use ddbpipe_pipeline::sink::{Records, SinkError as PipelineSinkError, SinkErrorClass, Staged};
use ddbpipe_source::records::Lines;
use serde_json::Value;
use tokio::sync::Mutex;

/// Where a pipeline's records go when the program gives the sink.
pub trait Sink: Send + 'static {
    /// Names the sink and its target ("kafka orders", "my-service"): in messages, and in the
    /// identity of the pipeline's position, so a run with a sink of another name does not
    /// resume a position this one left (docs/state.md §6.2).
    fn describe(&self) -> String;

    /// Writes every record of `batch` and returns once they are durable: `Ok` is the
    /// acknowledgement. Batches come one at a time, in order.
    fn write(&mut self, batch: &Batch) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// Records to write, in the order they were read.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    records: Vec<Record>,
}

impl Batch {
    /// The records of `lines`, read as `records`; the lines are shared by them.
    pub(crate) fn of(lines: Lines, records: Records) -> Batch {
        let lines = Arc::new(lines);
        let records = (0..lines.len())
            .map(|index| Record {
                lines: Arc::clone(&lines),
                index,
                records,
                value: OnceLock::new(),
            })
            .collect();
        Batch { records }
    }

    /// The records.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// How many records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// An item of a scan or query (`mode: scan | query`).
    Item,
    /// An item of a snapshot (a mirror's, a resnapshot's): `op: "r"`.
    Snapshot,
    /// A change that created the item: `op: "c"`.
    Insert,
    /// A change that modified it: `op: "u"`.
    Modify,
    /// A change that removed it (a TTL expiry too): `op: "d"`.
    Remove,
    /// A change of a kind this version does not know.
    Other,
}

/// One record: the JSON line ddbpipe's jsonl sink would write (an item, or a change envelope,
/// docs/streams.md §4.1), parsed the first time a field is asked for (a sink that forwards
/// [`Record::json`] pays no parsing). Values are in the pipeline's `value_format`: `plain`
/// writes a number that a 64-bit float cannot hold exactly as a string of its digits, `typed`
/// keeps every number as DynamoDB's `{"N": "…"}` text, so nothing read here lost a digit.
#[derive(Debug, Clone)]
pub struct Record {
    /// The batch's lines, shared by its records (one copy a batch).
    lines: Arc<Lines>,
    index: usize,
    records: Records,
    value: OnceLock<Value>,
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        self.records == other.records && self.json() == other.json()
    }
}

impl Record {
    /// What the record is.
    pub fn op(&self) -> Op {
        match self.records {
            Records::Items => Op::Item,
            Records::Envelopes => match self.value().get("op").and_then(Value::as_str) {
                Some("r") => Op::Snapshot,
                Some("c") => Op::Insert,
                Some("u") => Op::Modify,
                Some("d") => Op::Remove,
                _ => Op::Other,
            },
        }
    }

    /// The item: a scan's item, a snapshot row's, or a change's new image (`after`); `None`
    /// for a removal or a stream without new images.
    pub fn item(&self) -> Option<&Value> {
        match self.records {
            Records::Items => Some(self.value()),
            Records::Envelopes => self.field("after"),
        }
    }

    /// A change's old image (`before`), when the stream has old images.
    pub fn before(&self) -> Option<&Value> {
        self.field("before")
    }

    /// The item's key attributes, for changes and snapshot rows; `None` for scan items (the
    /// key is in the item).
    pub fn key(&self) -> Option<&Value> {
        self.field("key")
    }

    /// A change's sequence number in its shard.
    pub fn sequence_number(&self) -> Option<&str> {
        self.field("sequence_number").and_then(Value::as_str)
    }

    /// The shard a change was read from.
    pub fn shard_id(&self) -> Option<&str> {
        self.field("shard_id").and_then(Value::as_str)
    }

    /// When the change was made (unix ms, DynamoDB's second rounding).
    pub fn ts_ms(&self) -> Option<i64> {
        self.field("ts_ms").and_then(Value::as_i64)
    }

    /// The whole record as a JSON value.
    pub fn value(&self) -> &Value {
        self.value.get_or_init(|| {
            // ddbpipe rendered the line: JSON whose every number a float holds exactly.
            serde_json::from_slice(self.json()).unwrap_or(Value::Null)
        })
    }

    /// The record as the JSON text ddbpipe's jsonl sink writes (without the newline).
    pub fn json(&self) -> &[u8] {
        self.lines.get(self.index).unwrap_or_default()
    }

    fn field(&self, name: &str) -> Option<&Value> {
        match self.records {
            Records::Items => None,
            Records::Envelopes => self.value().get(name).filter(|value| !value.is_null()),
        }
    }
}

/// A failed write: the batch is not acknowledged, the run stops, and its position stays
/// before the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkError {
    message: String,
    transient: bool,
}

impl SinkError {
    /// A failure a later run may not meet (a lost connection, a busy service): the run's
    /// remedy says a rerun resumes.
    pub fn transient(message: impl Into<String>) -> SinkError {
        SinkError {
            message: message.into(),
            transient: true,
        }
    }

    /// A failure every rerun meets until its cause is fixed (a record the sink refuses).
    pub fn definite(message: impl Into<String>) -> SinkError {
        SinkError {
            message: message.into(),
            transient: false,
        }
    }
}

impl SinkError {
    /// What the failure means for the next run.
    pub(crate) fn class(&self) -> SinkErrorClass {
        if self.transient {
            SinkErrorClass::Transient
        } else {
            SinkErrorClass::Definite
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SinkError {}

/// A write in flight.
type Written<'a> = Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send + 'a>>;

/// A [`Sink`] behind a pointer: what a pipeline keeps of the sink it was given.
trait ErasedSink: Send {
    fn write<'a>(&'a mut self, batch: &'a Batch) -> Written<'a>;
}

impl<S: Sink> ErasedSink for S {
    fn write<'a>(&'a mut self, batch: &'a Batch) -> Written<'a> {
        Box::pin(Sink::write(self, batch))
    }
}

/// The sink a program gave a pipeline, shared by the pipeline's runs (one at a time).
#[derive(Clone)]
pub(crate) struct GivenSink {
    sink: Arc<Mutex<Box<dyn ErasedSink>>>,
    name: String,
}

impl GivenSink {
    pub(crate) fn new(sink: impl Sink) -> GivenSink {
        GivenSink {
            name: sink.describe(),
            sink: Arc::new(Mutex::new(Box::new(sink))),
        }
    }

    /// The name the sink gives itself (`Sink::describe`), part of the position's identity.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The pipeline's sink for a run writing `records`.
    pub(crate) fn for_run(&self, records: Records) -> CustomSink {
        CustomSink {
            given: self.clone(),
            records,
        }
    }
}

impl fmt::Debug for GivenSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GivenSink({})", self.name)
    }
}

/// A run's view of the given sink: each batch's lines as [`Record`]s.
pub(crate) struct CustomSink {
    given: GivenSink,
    records: Records,
}

impl CustomSink {
    fn error(&self, message: String, class: SinkErrorClass) -> PipelineSinkError {
        PipelineSinkError {
            sink: format!("custom {}", self.given.name),
            message,
            class,
        }
    }
}

impl ddbpipe_pipeline::sink::Sink for CustomSink {
    async fn write(
        &mut self,
        batch: &Read,
        state: Option<&Staged>,
    ) -> Result<(), PipelineSinkError> {
        debug_assert!(
            state.is_none(),
            "a custom sink's position is in the state file"
        );
        if batch.records.is_empty() {
            return Ok(());
        }
        let batch = Batch::of(batch.records.clone(), self.records);
        let written = self.given.sink.lock().await.write(&batch).await;
        written.map_err(|error| {
            let class = error.class();
            self.error(error.message, class)
        })
    }

    fn describe(&self) -> String {
        format!("custom {}", self.given.name)
    }
}
