//! What a stored position depends on, and its fingerprint (`docs/state.md`, "Identity").
//!
//! A position is only valid for the source that made it: resuming a scan cursor under another
//! filter, index or segment count would silently read the wrong items, and resuming it against
//! a table of the same name in another region or account would silently skip the items the
//! cursor had not reached there. So a stored position carries the identity of its source, and
//! a run whose identity differs stops with the fields that changed.
//!
//! # Rules
//! 1. The identity holds what the position depends on — the table and its query (name, mode,
//!    index, key condition, filter, expression names and values, direction, segments, stream
//!    ARN) — where the table lives (region, endpoint, account), and what the records look like
//!    (value format, projection; for keyed sinks the destination table and document column,
//!    for jsonl files the write mode and compression). Changing any of them changes what a resumed run would produce.
//! 2. A field is compared only when both sides hold it. A stored identity written by an earlier
//!    ddbpipe lacks the fields added since (they are recorded from the next write on); a
//!    command that could not learn a field leaves it out (the account is known only from a
//!    table or stream ARN).
//! 3. `segments`, `snapshot_engine` and `snapshot_export_arn` count only when the position
//!    has segment state (a scan, or an open snapshot): segment progress means Scan segments
//!    or an export's data files, of the export the position names (docs/scan.md §2.10). A
//!    finished scan may be resumed with another segment count or engine.
//! 4. `stream_arn` is not a change when the configured value, before or after, is the stream
//!    the stored position reads: setting it to drain that stream (the remedy for a disabled
//!    stream), or removing it again, keeps reading the same shards. Whether the table's
//!    current stream is still that one is start-up gap detection's question (layer 1), not
//!    the identity's.
//! 5. The endpoint is kept masked (user-info and query values hidden, the rules of
//!    `ddbpipe_source::endpoint`): an identity is shown (`state show`, `check`, changes) and
//!    stored (state files, keyed state tables, a shared run's leader row). A stored identity
//!    is masked when read, so one written with its secrets by an earlier ddbpipe compares equal
//!    and is stored masked from the next write on; an endpoint without secrets is unchanged.
//! 6. A stored identity is kept as stored: a field this ddbpipe does not know, or whose value
//!    it cannot read, is written back and fingerprinted as it was (a newer ddbpipe wrote it).
//!    A value it cannot read is compared as stored; a field it does not know is a change (it
//!    cannot tell whether the position still holds under it: the newer ddbpipe resumes it).
//!    Only a position is refused: with none stored, the identity is replaced (as ever).
//! 7. A keyed sink's typed columns (`sink.columns`) are not part of the identity: a column
//!    added or removed is filled from (or left out of) the documents the rows are written
//!    from. The document column is: renaming it, and dropping it (`document_column: null`,
//!    stored as null) or bringing it back, changes what the rows already written hold, so
//!    the change says a resnapshot is needed ([`Identity::changes_from`]). An identity
//!    stored with a column name reads as that name.

use std::collections::BTreeMap;

use ddbpipe_source::api::TableDescription;
use ddbpipe_source::config::{Mode, SnapshotEngine, SourceConfig};
use ddbpipe_source::endpoint::mask_url;
use ddbpipe_source::position::Position;
use ddbpipe_value::{Value, ValueFormat};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

mod stored;

/// What a changed document column adds to its change (rule 7): the rows written hold the
/// document where the new config has none, or lack it where the new config wants it.
const DOCUMENT_COLUMN_CHANGED: &str = " (the rows already written were made with the old \
     document column: a resnapshot is needed, `ddbpipe state reset <config>` then run)";

/// The fields that matter only to a position with segment state (rule 3), as stored.
const SEGMENT_STATE: [&str; 3] = ["segments", "snapshot_engine", "snapshot_export_arn"];

/// The source identity: the fields a position depends on (rule 1), each stored under its own
/// name in a JSON object with sorted keys ([`Identity::to_json`]).
///
/// A field is `None` when the identity does not hold it (rule 2); a field that may be null
/// holds `Some(None)` for null. What a stored identity holds that this ddbpipe cannot read is
/// kept as stored (rule 6).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Identity {
    /// The table, by name or ARN, as configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    table_name: Option<String>,
    /// What the run reads.
    #[serde(skip_serializing_if = "Option::is_none", with = "stored::spelled")]
    mode: Option<Mode>,
    /// The index read instead of the table.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    index_name: Option<Option<String>>,
    /// A query's key condition.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    key_condition_expression: Option<Option<String>>,
    /// The filter applied after reading.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    filter_expression: Option<Option<String>>,
    /// The attributes returned.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    projection: Option<Option<String>>,
    /// The expressions' name placeholders.
    #[serde(skip_serializing_if = "Option::is_none")]
    expression_attribute_names: Option<BTreeMap<String, String>>,
    /// The expressions' values, plain and typed merged, as sent (stored as attribute JSON).
    #[serde(skip_serializing_if = "Option::is_none", with = "stored::typed_values")]
    expression_attribute_values: Option<BTreeMap<String, Value>>,
    /// A query's sort-key order; null for the other modes.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    scan_index_forward: Option<Option<bool>>,
    /// The parallel-scan segments (rule 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<u32>,
    /// How snapshots read the table (rule 3).
    #[serde(skip_serializing_if = "Option::is_none", with = "stored::spelled")]
    snapshot_engine: Option<SnapshotEngine>,
    /// The export read instead of starting one (rule 3).
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    snapshot_export_arn: Option<Option<String>>,
    /// The stream read: as configured, or for a shared run the one read (rule 4).
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    stream_arn: Option<Option<String>>,
    /// How attribute values are written, by its config spelling.
    #[serde(skip_serializing_if = "Option::is_none", with = "stored::spelled")]
    value_format: Option<ValueFormat>,
    /// The region the clients use.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    region: Option<Option<String>>,
    /// The endpoint override, masked (rule 5).
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    endpoint_url: Option<Option<String>>,
    /// The account owning the table, when the command learned it.
    #[serde(skip_serializing_if = "Option::is_none")]
    account: Option<String>,
    /// A keyed sink's destination table.
    #[serde(skip_serializing_if = "Option::is_none")]
    sink_table: Option<String>,
    /// A keyed sink's document column; null: no document column (rule 7).
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stored::held"
    )]
    document_column: Option<Option<String>>,
    /// Where a jsonl sink's lines go (or a sink given in code: its name).
    #[serde(skip_serializing_if = "Option::is_none")]
    sink_path: Option<SinkPath>,
    /// How runs write a jsonl file.
    #[serde(skip_serializing_if = "Option::is_none")]
    sink_write: Option<FileWrite>,
    /// Whether a jsonl file is gzip-compressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    gzip: Option<FileCompression>,
    /// A shared run's sink type and target ([`Identity::of_shared_run`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    sink: Option<String>,
    /// Fields this ddbpipe does not know, as stored: a newer ddbpipe wrote them (rule 6).
    #[serde(flatten)]
    unknown: BTreeMap<String, Json>,
    /// Fields this ddbpipe knows holding a value it cannot read (a newer ddbpipe's, say), as
    /// stored (rule 6).
    #[serde(skip)]
    unread: BTreeMap<String, Json>,
}

/// Where the table lives, as far as the command learned it (rule 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// The region the clients use (resolved by `aws-config`); `None` = no region.
    pub region: Option<String>,
    /// The endpoint override in use, as the SDK holds it (from the config or the
    /// environment); `None` = the AWS endpoint of the region. The identity keeps it masked
    /// (rule 5).
    pub endpoint_url: Option<String>,
    /// The account that owns the table, from its ARN; `None` = not learned (rule 2).
    pub account: Option<String>,
}

impl Location {
    /// Adds the account of a described table, when its ARN names one.
    pub fn learn(&mut self, table: &TableDescription) {
        if let Some(account) = table.arn.as_deref().and_then(Self::account_of) {
            self.account = Some(account);
        }
    }

    /// The account in an ARN (`arn:aws:dynamodb:<region>:<account>:table/…`), if it has one.
    pub fn account_of(arn: &str) -> Option<String> {
        let mut parts = arn.splitn(6, ':');
        let (Some("arn"), Some(_), Some(_), Some(_), Some(account)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        (!account.is_empty()).then(|| account.to_string())
    }
}

/// Where the records go and in what form (rule 1): what a resumed run must keep writing the
/// same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A keyed sink: the destination table and the column holding the item document (rule
    /// 7: its typed columns are not part of the identity).
    Keyed {
        /// The destination table.
        table: String,
        /// The column holding the item document; `None`: no document column.
        document_column: Option<String>,
    },
    /// A jsonl file: where it is (a resumed run writes the rest of a position's lines there,
    /// or into a temporary file named after it), how runs write it and whether it is
    /// gzip-compressed.
    File {
        /// The absolute path of `sink.path`.
        path: String,
        /// `sink.write`.
        write: FileWrite,
        /// `sink.gzip`.
        compression: FileCompression,
    },
    /// Standard output.
    Stdout,
    /// A Kafka topic (its template filled in) and the shape of its messages: another topic
    /// would get the rest of a position's messages, another shape would mix two kinds of
    /// message in one topic.
    Topic {
        /// The topic.
        topic: String,
        /// The messages' shape: `sink.envelope`, and `tombstones` when deletes are followed
        /// by one (`debezium, tombstones`).
        shape: String,
    },
    /// A sink the embedding program gave (`sink: {type: custom}`), by the name it gives
    /// itself (`Sink::describe`): another sink would get the rest of a position's records.
    Given {
        /// The sink's name.
        name: String,
    },
}

/// Where a jsonl, kafka or given sink's records go, stored as the file's path, `-`,
/// `kafka <topic>` or `custom <name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum SinkPath {
    /// Standard output: `-`.
    Stdout,
    /// The file at this absolute path.
    File(String),
    /// A sink given in code, by its name.
    Given(String),
    /// A Kafka topic, by its name and its messages' shape (`dynamodb.orders (debezium,
    /// tombstones)`).
    Topic(String),
}

/// How runs write a jsonl file (`sink.write`), stored as its config spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileWrite {
    /// `append`.
    Append,
    /// `overwrite`.
    Overwrite,
    /// `new_file_per_run`.
    NewFilePerRun,
}

/// Whether a jsonl file is compressed (`sink.gzip`), stored as `gzip: true | false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "bool", into = "bool")]
pub enum FileCompression {
    /// Plain lines: `false`.
    None,
    /// gzip members: `true`.
    Gzip,
}

impl Identity {
    /// The identity of a configured source at `location`, written to `output` (rule 1).
    pub fn of(source: &SourceConfig, location: &Location, output: Option<&Output>) -> Self {
        let query = source.mode == Mode::Query;
        let mut identity = Identity {
            table_name: Some(source.table_name.clone()),
            mode: Some(source.mode),
            index_name: Some(source.index_name.clone()),
            key_condition_expression: Some(source.key_condition_expression.clone()),
            filter_expression: Some(source.filter_expression.clone()),
            projection: Some(source.projection.clone()),
            expression_attribute_names: Some(source.expression_attribute_names.clone()),
            expression_attribute_values: Some(source.merged_expression_values()),
            scan_index_forward: Some(query.then_some(source.scan_index_forward)),
            segments: Some(source.segments),
            snapshot_engine: Some(source.snapshot.engine),
            snapshot_export_arn: Some(source.snapshot.export_arn.clone()),
            stream_arn: Some(source.stream_arn.clone()),
            // The choice the user made: `PlainExact` is spelled `plain`.
            value_format: Some(match source.value_format {
                ValueFormat::PlainExact => ValueFormat::Plain,
                format => format,
            }),
            region: Some(location.region.clone()),
            endpoint_url: Some(location.endpoint_url.as_deref().map(mask_url)),
            account: location.account.clone(),
            ..Identity::default()
        };
        match output {
            Some(Output::Keyed {
                table,
                document_column,
            }) => {
                identity.sink_table = Some(table.clone());
                identity.document_column = Some(document_column.clone());
            }
            Some(Output::File {
                path,
                write,
                compression,
            }) => {
                identity.sink_path = Some(SinkPath::File(path.clone()));
                identity.sink_write = Some(*write);
                identity.gzip = Some(*compression);
            }
            Some(Output::Stdout) => identity.sink_path = Some(SinkPath::Stdout),
            Some(Output::Topic { topic, shape }) => {
                identity.sink_path = Some(SinkPath::Topic(format!("{topic} ({shape})")));
            }
            Some(Output::Given { name }) => {
                identity.sink_path = Some(SinkPath::Given(name.clone()));
            }
            None => {}
        }
        identity
    }

    /// The identity a shared run keeps in its leader row (docs/coordination.md §11.10): this
    /// one with the sink's type and target (`sink`: a worker writing elsewhere would take a
    /// share of the data away from the others' destination) and, when given, the stream read in
    /// place of the one configured (a re-created table's new stream is refused while the old
    /// one's rows are in the lease table).
    pub fn of_shared_run(mut self, sink: String, stream_arn: Option<&str>) -> Self {
        self.sink = Some(sink);
        if let Some(arn) = stream_arn {
            self.stream_arn = Some(Some(arn.to_string()));
        }
        self
    }

    /// The stream this identity names (a shared run's: the one its workers read), if any.
    pub fn stream_arn(&self) -> Option<&str> {
        self.stream_arn.as_ref()?.as_deref()
    }

    /// `"sha256:"` + lowercase hex SHA-256 of the compact sorted JSON.
    pub fn fingerprint(&self) -> String {
        Self::fingerprint_of(&self.to_json())
    }

    /// The fingerprint of an identity as stored, before [`Identity::from_json`] masks it: what
    /// the stored fingerprint beside it was made from.
    pub fn fingerprint_of(json: &Json) -> String {
        let mut text = String::new();
        canonical(json, &mut text);
        let digest = Sha256::digest(text.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// Why `position`, stored under `stored`, cannot be resumed by this identity (rules 2–4,
    /// 6): "<field> changed from <old> to <new>", one per field; empty when it can.
    pub fn changes_for(&self, stored: &Identity, position: &Position) -> Vec<String> {
        let (segment_state, read_stream) = match position {
            Position::Scan(_) => (true, None),
            Position::Streams(streams) => {
                (streams.snapshot.is_some(), streams.stream_arn.as_deref())
            }
        };
        let same_stream = read_stream.is_some_and(|read| {
            [stored.stream_arn(), self.stream_arn()]
                .into_iter()
                .flatten()
                .all(|arn| arn == read)
        });
        self.changes_from(stored, segment_state)
            .into_iter()
            .filter(|change| !(same_stream && change.starts_with("stream_arn ")))
            .collect()
    }

    /// The fields that differ from `stored`, as "<field> changed from <old> to <new>", in the
    /// order of their names: those both hold (rule 2); the segment-state fields only when
    /// `compare_segments` (rule 3); each field `stored` holds that this ddbpipe does not know
    /// (rule 6).
    pub fn changes_from(&self, stored: &Identity, compare_segments: bool) -> Vec<String> {
        let (old, new) = (stored, self);
        let typed = differing!(old, new: account, document_column, endpoint_url,
            expression_attribute_names, expression_attribute_values, filter_expression, gzip,
            index_name, key_condition_expression, mode, projection, region, scan_index_forward,
            segments, sink, sink_path, sink_table, sink_write, snapshot_engine,
            snapshot_export_arn, stream_arn, table_name, value_format);
        // A value one side cannot read is compared as stored, by the same rules.
        let (before, after) = (old.to_json(), new.to_json());
        let unread = old
            .unread
            .keys()
            .chain(new.unread.keys())
            .map(String::as_str);
        let unread = unread.filter(|key| match (before.get(key), after.get(key)) {
            (Some(before), Some(after)) => before != after,
            _ => false,
        });
        let mut changes: BTreeMap<&str, String> = typed
            .into_iter()
            .filter_map(|(key, differs)| differs.then_some(key))
            .chain(unread)
            .filter(|key| compare_segments || !SEGMENT_STATE.contains(key))
            .map(|key| {
                let mut change = format!("{key} changed from {} to {}", before[key], after[key]);
                if key == "document_column" {
                    change.push_str(DOCUMENT_COLUMN_CHANGED);
                }
                (key, change)
            })
            .collect();
        for (key, value) in &old.unknown {
            let change = format!(
                "{key} ({value}) was recorded by a newer ddbpipe and is unknown to this one: \
                 run that version"
            );
            changes.insert(key, change);
        }
        changes.into_values().collect()
    }
}

/// For each named field, its name and whether both identities hold it with different values
/// (rule 2).
macro_rules! differing {
    ($old:ident, $new:ident: $($field:ident),+) => {
        [$((stringify!($field), differs(&$old.$field, &$new.$field))),+]
    };
}
use differing;

/// Whether a field both identities hold differs (rule 2).
fn differs<T: PartialEq>(old: &Option<T>, new: &Option<T>) -> bool {
    matches!((old, new), (Some(old), Some(new)) if old != new)
}

/// `json` as text with every object's keys in sorted order, whatever order its map keeps:
/// the text serde_json writes by default. With serde_json's `preserve_order` (enabled by
/// another crate of a program that embeds ddbpipe, or of the workspace's tests) a map keeps
/// the order it was read in, and PostgreSQL's `jsonb` gives an entry's keys back in its own
/// order: fingerprinted as read, a stored identity would no longer match its fingerprint.
fn canonical(json: &Json, out: &mut String) {
    match json {
        Json::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(key).unwrap_or_default());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests;
