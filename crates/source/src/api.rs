//! The small traits the engine reads through, so it runs on AWS or on an in-memory fake.
//!
//! Nothing here names an AWS SDK type: [`crate::aws`] implements [`TableApi`] with the SDK,
//! and `fake` (feature `fake`) implements it in memory with scripted faults.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use ddbpipe_value::{Item, Value, ValueFormat};

use crate::envelope::{self, EnvelopeError};
use crate::error::ApiError;
use crate::ids::{SequenceNumber, ShardId};
use crate::records::Lines;

/// A stream record and what is kept of it as an envelope: [`crate::envelope`] owns them.
pub use crate::envelope::{
    ChangeData, ChangeMeta, ChangeOp, ChangeShape, Changes, StreamRecord, UserIdentity,
};
/// A table's key schema, as [`TableDescription`] gives it: [`crate::key_schema`] owns it.
pub use crate::key_schema::{KeyAttribute, KeyType};

/// What kind of read a [`ReadRequest`] is.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadKind {
    /// A `Scan`; `segment` is `Some((segment, total))` for a parallel scan of more than one.
    Scan {
        /// `Segment` and `TotalSegments`, sent only when the total is greater than 1.
        segment: Option<(u32, u32)>,
    },
    /// A `Query` by key condition.
    Query {
        /// `KeyConditionExpression`.
        key_condition: String,
        /// `ScanIndexForward`, always sent.
        scan_index_forward: bool,
    },
}

/// One `Scan` or `Query` page request (docs/scan.md §2.2). `ReturnConsumedCapacity` is always `TOTAL`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRequest {
    /// `TableName`.
    pub table_name: String,
    /// Scan or query, with their own parameters.
    pub kind: ReadKind,
    /// `IndexName`.
    pub index_name: Option<String>,
    /// `ProjectionExpression`.
    pub projection: Option<String>,
    /// `FilterExpression`.
    pub filter_expression: Option<String>,
    /// `ExpressionAttributeNames`, sent only when non-empty.
    pub expression_attribute_names: BTreeMap<String, String>,
    /// `ExpressionAttributeValues`, sent only when non-empty.
    pub expression_attribute_values: BTreeMap<String, Value>,
    /// `ConsistentRead`, sent only when true.
    pub consistent_read: bool,
    /// `Limit`.
    pub limit: Option<u32>,
    /// `ExclusiveStartKey`: where the previous page ended.
    pub exclusive_start_key: Option<Item>,
}

impl ReadRequest {
    /// The operation name, for metrics and errors.
    pub fn operation(&self) -> &'static str {
        match self.kind {
            ReadKind::Scan { .. } => "scan",
            ReadKind::Query { .. } => "query",
        }
    }
}

/// One page of items as DynamoDB returned it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The items, in response order.
    pub items: Vec<Item>,
    /// `LastEvaluatedKey`; `None` or empty means the segment is done.
    pub last_evaluated_key: Option<Item>,
    /// `ConsumedCapacity.CapacityUnits`, when the service reported it.
    pub consumed_capacity: Option<f64>,
}

impl Page {
    /// The page with its items written as records by `render`.
    pub fn render(self, render: &Render) -> RenderedPage {
        let mut records = Lines::with_capacity(self.items.len(), self.items.len() * 256);
        for item in &self.items {
            records.push_with(|out| render.write_item(item, out));
        }
        RenderedPage {
            records,
            last_evaluated_key: self.last_evaluated_key,
            consumed_capacity: self.consumed_capacity,
        }
    }
}

/// How each item of a page becomes one record.
#[derive(Debug, Clone)]
pub enum Render {
    /// The item itself (scan and query), in this format; with the table's key attribute
    /// names, a page's records note where their key values sit ([`Lines::noted`]).
    Items(ValueFormat, Option<Arc<[String]>>),
    /// The item's snapshot envelope (mirror and resnapshot rows, docs/streams.md §4.1).
    Snapshots(Arc<SnapshotShape>),
}

impl Render {
    /// Items in `format`, noting nothing.
    pub fn items(format: ValueFormat) -> Render {
        Render::Items(format, None)
    }

    /// Items in `format` whose records note where the values of the key attributes
    /// `key_schema` sit: the keyed and lake sinks then take each record's key without reading
    /// the record again.
    pub fn keyed_items(format: ValueFormat, key_schema: &[KeyAttribute]) -> Render {
        let names: Arc<[String]> = key_schema.iter().map(|key| key.name.clone()).collect();
        Render::Items(format, (!names.is_empty()).then_some(names))
    }

    /// The format of attribute values.
    pub fn format(&self) -> ValueFormat {
        match self {
            Render::Items(format, _) => *format,
            Render::Snapshots(shape) => shape.format,
        }
    }

    /// Appends the record of `item`, without newline.
    pub fn write_item(&self, item: &Item, out: &mut Vec<u8>) {
        match self {
            Render::Items(format, _) => format.write_item(item, out),
            Render::Snapshots(shape) => {
                envelope::write_snapshot(item, &shape.key_schema, &shape.table, shape.format, out)
            }
        }
    }
}

/// What a snapshot envelope needs besides the item.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotShape {
    /// The table's key attributes (`key_of(item)`, docs/values.md §3.6).
    pub key_schema: Vec<KeyAttribute>,
    /// The configured table name (the envelope's `table`).
    pub table: String,
    /// Plain or typed values.
    pub format: ValueFormat,
}

/// One page of items already written as records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderedPage {
    /// One record per item, in response order.
    pub records: Lines,
    /// `LastEvaluatedKey`; `None` means the segment is done.
    pub last_evaluated_key: Option<Item>,
    /// `ConsumedCapacity.CapacityUnits`, when the service reported it.
    pub consumed_capacity: Option<f64>,
}

/// Global or local secondary index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// Global secondary index.
    Gsi,
    /// Local secondary index.
    Lsi,
}

impl IndexKind {
    /// `"gsi"` or `"lsi"`.
    pub fn as_str(self) -> &'static str {
        match self {
            IndexKind::Gsi => "gsi",
            IndexKind::Lsi => "lsi",
        }
    }
}

/// A secondary index of a table.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexDescription {
    /// Index name.
    pub name: String,
    /// GSI or LSI.
    pub kind: IndexKind,
    /// Hash key, then range key.
    pub key_schema: Vec<KeyAttribute>,
    /// Provisioned read capacity of a GSI, when provisioned.
    pub read_capacity_units: Option<i64>,
    /// On-demand maximum read request units of a GSI, when set.
    pub max_read_request_units: Option<i64>,
}

/// The table's stream, as `DescribeTable` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// `StreamSpecification.StreamEnabled`.
    pub enabled: bool,
    /// `StreamSpecification.StreamViewType`.
    pub view_type: Option<String>,
    /// `LatestStreamArn`.
    pub arn: Option<String>,
}

/// What ddbpipe needs from `DescribeTable`.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDescription {
    /// Table name.
    pub name: String,
    /// `TableArn` (`arn:aws:dynamodb:<region>:<account>:table/<name>`), when reported.
    pub arn: Option<String>,
    /// `TableStatus`, e.g. `ACTIVE`.
    pub status: Option<String>,
    /// `ItemCount` (approximate, refreshed about every six hours).
    pub item_count: Option<i64>,
    /// `TableSizeBytes`.
    pub size_bytes: Option<i64>,
    /// `PROVISIONED` or `PAY_PER_REQUEST`.
    pub billing_mode: Option<String>,
    /// Hash key, then range key (docs/values.md §3.6).
    pub key_schema: Vec<KeyAttribute>,
    /// Provisioned `ReadCapacityUnits` (0 or absent for on-demand tables).
    pub read_capacity_units: Option<i64>,
    /// `OnDemandThroughput.MaxReadRequestUnits`, when set.
    pub max_read_request_units: Option<i64>,
    /// Secondary indexes.
    pub indexes: Vec<IndexDescription>,
    /// The stream, when the table has one.
    pub stream: Option<StreamInfo>,
}

impl TableDescription {
    /// The index named `name`, if the table has it.
    pub fn index(&self, name: &str) -> Option<&IndexDescription> {
        self.indexes.iter().find(|index| index.name == name)
    }

    /// Whether the table bills per request.
    pub fn is_on_demand(&self) -> bool {
        self.billing_mode.as_deref() == Some("PAY_PER_REQUEST")
    }
}

/// One page of `ListTables`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableNames {
    /// Table names of this page.
    pub names: Vec<String>,
    /// `LastEvaluatedTableName`: where the next page starts.
    pub last_evaluated: Option<String>,
}

/// Reads of a DynamoDB table: each method is one request attempt (retries are the caller's).
pub trait TableApi: Send + Sync + 'static {
    /// One `Scan` or `Query` page.
    fn read_page(
        &self,
        request: &ReadRequest,
    ) -> impl Future<Output = Result<Page, ApiError>> + Send;

    /// One `Scan` or `Query` page, each item written as its record by `render`. The scan
    /// engine reads through this; an implementation that can write records straight from the
    /// response overrides it, the others render [`Self::read_page`]'s items.
    fn read_records(
        &self,
        request: &ReadRequest,
        render: &Render,
    ) -> impl Future<Output = Result<RenderedPage, ApiError>> + Send {
        async move { Ok(self.read_page(request).await?.render(render)) }
    }

    /// `DescribeTable`. `Ok(None)` when the response held no table.
    fn describe_table(
        &self,
        table_name: &str,
    ) -> impl Future<Output = Result<Option<TableDescription>, ApiError>> + Send;

    /// One page of `ListTables`.
    fn list_tables(
        &self,
        exclusive_start: Option<&str>,
    ) -> impl Future<Output = Result<TableNames, ApiError>> + Send;

    /// Now in unix ms on this machine's clock: the time a page's request is sent, the version
    /// of its snapshot rows (docs/mirror.md §5.6). An in-memory table on tokio's paused clock
    /// answers its own.
    fn clock_ms(&self) -> i64 {
        crate::clock::unix_now_ms()
    }
}

/// One shard as `DescribeStream` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardDescription {
    /// The shard's id.
    pub id: ShardId,
    /// `ParentShardId`, when the shard was split or rotated from another.
    pub parent: Option<ShardId>,
    /// Whether `SequenceNumberRange.EndingSequenceNumber` is present. Some emulators report an
    /// ending number on an open shard: only a `GetRecords` without a next iterator proves a
    /// shard closed.
    pub closed: bool,
}

/// One page of `DescribeStream`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamPage {
    /// `StreamStatus`: `ENABLING`, `ENABLED`, `DISABLING`, `DISABLED`.
    pub status: Option<String>,
    /// `StreamViewType`.
    pub view_type: Option<String>,
    /// The shards of this page (entries without an id are skipped).
    pub shards: Vec<ShardDescription>,
    /// `LastEvaluatedShardId`: where the next page starts.
    pub last_evaluated_shard_id: Option<ShardId>,
}

/// Where a shard iterator starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest record still retained.
    TrimHorizon,
    /// Just after the newest record.
    Latest,
    /// Just after this record.
    After(SequenceNumber),
}

/// One `GetRecords` answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordsPage {
    /// Records in stream order.
    pub records: Vec<StreamRecord>,
    /// `NextShardIterator`; `None` means the shard is closed and fully read.
    pub next_iterator: Option<String>,
}

impl RecordsPage {
    /// The page with its records written as envelopes of `shape`.
    pub fn into_changes(self, shape: &ChangeShape<'_>) -> ChangePage {
        ChangePage {
            changes: envelope::write_changes(&self.records, shape),
            next_iterator: self.next_iterator,
        }
    }
}

/// One `GetRecords` answer written as envelopes.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangePage {
    /// The envelopes, or the first record that cannot become one (definite: the run fails).
    pub changes: Result<Changes, EnvelopeError>,
    /// `NextShardIterator`; `None` means the shard is closed and fully read.
    pub next_iterator: Option<String>,
}

/// Reads of a table's stream: each method is one request attempt. Errors carry their AWS code:
/// `ExpiredIteratorException`, `TrimmedDataAccessException` and `ResourceNotFoundException` are
/// handled by the shard reader before the retry policy sees them.
pub trait StreamsApi: Send + Sync + 'static {
    /// One page of `DescribeStream` (`Limit` ≤ 100). `child_of` asks only for the children of
    /// that shard (`ShardFilter {Type: CHILD_SHARDS}`).
    fn describe_stream(
        &self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
    ) -> impl Future<Output = Result<StreamPage, ApiError>> + Send;

    /// `GetShardIterator`; `Ok(None)` when the answer holds no iterator.
    fn shard_iterator(
        &self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
    ) -> impl Future<Output = Result<Option<String>, ApiError>> + Send;

    /// `GetRecords` with `Limit`.
    fn get_records(
        &self,
        iterator: &str,
        limit: u32,
    ) -> impl Future<Output = Result<RecordsPage, ApiError>> + Send;

    /// `GetRecords` with `Limit`, each record written as its envelope. The shard reader reads
    /// through this; an implementation that can write envelopes straight from the response
    /// overrides it, the others write [`Self::get_records`]'s records.
    fn get_changes(
        &self,
        iterator: &str,
        limit: u32,
        shape: &ChangeShape<'_>,
    ) -> impl Future<Output = Result<ChangePage, ApiError>> + Send {
        async move { Ok(self.get_records(iterator, limit).await?.into_changes(shape)) }
    }
}
