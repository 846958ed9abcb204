//! A stream record as `GetRecords` returns it, and what the shard reader keeps of each record
//! once it is written as its envelope.

use ddbpipe_value::{Item, ValueFormat};

use crate::ids::{SequenceNumber, ShardId};
use crate::records::Lines;

/// `userIdentity` of a record (TTL deletes: `dynamodb.amazonaws.com`, `Service`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserIdentity {
    /// `PrincipalId`.
    pub principal_id: Option<String>,
    /// `Type`.
    pub kind: Option<String>,
}

/// The `dynamodb` part of a stream record.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeData {
    /// `ApproximateCreationDateTime` in unix ms.
    pub created_ms: Option<i64>,
    /// `Keys`.
    pub keys: Option<Item>,
    /// `NewImage`.
    pub new_image: Option<Item>,
    /// `OldImage`.
    pub old_image: Option<Item>,
    /// `SequenceNumber` (validated at the edge; `None` when missing).
    pub sequence_number: Option<SequenceNumber>,
    /// `SizeBytes`.
    pub size_bytes: Option<i64>,
    /// `StreamViewType`.
    pub view_type: Option<String>,
}

/// One stream record as `GetRecords` returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRecord {
    /// `eventID`.
    pub event_id: Option<String>,
    /// `eventName`: `INSERT`, `MODIFY`, `REMOVE`.
    pub event_name: Option<String>,
    /// `dynamodb`: `None` when the record lacks it (a definite error for the run).
    pub change: Option<ChangeData>,
    /// `userIdentity`.
    pub user_identity: Option<UserIdentity>,
}

/// Where the envelopes of a shard's records go, and in which format (docs/streams.md §4.1).
#[derive(Debug, Clone, Copy)]
pub struct ChangeShape<'a> {
    /// The shard read.
    pub shard: &'a ShardId,
    /// The configured table name (the envelope's `table`).
    pub table: &'a str,
    /// Plain or typed images.
    pub format: ValueFormat,
}

/// What the shard reader needs of one record besides its envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeMeta {
    /// The record's sequence number.
    pub sequence_number: SequenceNumber,
    /// `ApproximateCreationDateTime` in unix ms.
    pub created_ms: Option<i64>,
    /// The record's kind, for metrics.
    pub op: ChangeOp,
}

/// A change record's kind, from its `eventName` (the envelope's `op`, docs/streams.md §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOp {
    /// `INSERT`, `op: "c"`.
    Insert,
    /// `MODIFY`, `op: "u"`.
    Modify,
    /// `REMOVE`, `op: "d"`.
    Remove,
    /// Any other or no event name.
    Other,
}

impl ChangeOp {
    /// The kind of a record with `event_name`.
    pub fn of(event_name: Option<&str>) -> Self {
        match event_name {
            Some("INSERT") => ChangeOp::Insert,
            Some("MODIFY") => ChangeOp::Modify,
            Some("REMOVE") => ChangeOp::Remove,
            _ => ChangeOp::Other,
        }
    }

    /// The envelope's `op` of the kind (`c`, `u`, `d`); `None` for any other event name.
    pub fn code(self) -> Option<&'static str> {
        match self {
            ChangeOp::Insert => Some("c"),
            ChangeOp::Modify => Some("u"),
            ChangeOp::Remove => Some("d"),
            ChangeOp::Other => None,
        }
    }

    /// The kind's slot in counters kept in arrays: `c`, `u`, `d`, other.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The records of one `GetRecords` answer as envelopes, one per record, in stream order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// The envelopes.
    pub envelopes: Lines,
    /// Of each envelope, what the reader needs (same length as `envelopes`).
    pub records: Vec<ChangeMeta>,
}
