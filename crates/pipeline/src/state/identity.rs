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

use ddbpipe_source::api::TableDescription;
use ddbpipe_source::config::{Mode, SourceConfig};
use ddbpipe_source::endpoint::mask_url;
use ddbpipe_source::position::Position;
use serde_json::{Map, Value as Json, json};
use sha2::{Digest, Sha256};

/// The fields that matter only to a position with segment state (rule 3).
const SEGMENT_STATE: [&str; 3] = ["segments", "snapshot_engine", "snapshot_export_arn"];

/// The source identity: the fields a position depends on, as a JSON object with sorted keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(Json);

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
    /// A keyed sink: the destination table and the column holding the item document.
    Keyed {
        /// The destination table.
        table: String,
        /// The column holding the item document.
        document_column: String,
    },
    /// A jsonl file: where it is (a resumed run writes the rest of a position's lines there,
    /// or into a temporary file named after it), how runs write it (`append`, `overwrite`,
    /// `new_file_per_run`) and whether it is gzip-compressed.
    File {
        /// The absolute path of `sink.path`.
        path: String,
        /// `sink.write`.
        write: &'static str,
        /// `sink.gzip`.
        gzip: bool,
    },
    /// Standard output.
    Stdout,
}

impl Identity {
    /// The identity of a configured source at `location`, written to `output` (rule 1).
    pub fn of(source: &SourceConfig, location: &Location, output: Option<&Output>) -> Self {
        let mut identity = Self::of_source(source);
        let Json::Object(fields) = &mut identity.0 else {
            unreachable!("the source identity is an object")
        };
        fields.insert("region".into(), json!(location.region));
        let endpoint = location.endpoint_url.as_deref().map(mask_url);
        fields.insert("endpoint_url".into(), json!(endpoint));
        if let Some(account) = &location.account {
            fields.insert("account".into(), json!(account));
        }
        match output {
            Some(Output::Keyed {
                table,
                document_column,
            }) => {
                fields.insert("sink_table".into(), json!(table));
                fields.insert("document_column".into(), json!(document_column));
            }
            Some(Output::File { path, write, gzip }) => {
                fields.insert("sink_path".into(), json!(path));
                fields.insert("sink_write".into(), json!(write));
                fields.insert("gzip".into(), json!(gzip));
            }
            Some(Output::Stdout) => {
                fields.insert("sink_path".into(), json!("-"));
            }
            None => {}
        }
        identity
    }

    /// The fields of the source configuration alone.
    fn of_source(source: &SourceConfig) -> Self {
        let values: Map<String, Json> = source
            .merged_expression_values()
            .iter()
            .map(|(k, v)| (k.clone(), ddbpipe_value::value_to_typed_json(v)))
            .collect();
        let names: Map<String, Json> = source
            .expression_attribute_names
            .iter()
            .map(|(k, v)| (k.clone(), Json::String(v.clone())))
            .collect();
        Identity(json!({
            "table_name": source.table_name,
            "mode": source.mode.as_str(),
            "index_name": source.index_name,
            "key_condition_expression": source.key_condition_expression,
            "filter_expression": source.filter_expression,
            "projection": source.projection,
            "expression_attribute_names": names,
            "expression_attribute_values": values,
            "scan_index_forward": (source.mode == Mode::Query).then_some(source.scan_index_forward),
            "segments": source.segments,
            "snapshot_engine": source.snapshot.engine.as_str(),
            "snapshot_export_arn": source.snapshot.export_arn,
            "stream_arn": source.stream_arn,
            "value_format": source.value_format.as_str(),
        }))
    }

    /// The identity a shared run keeps in its leader row (docs/coordination.md §11.10): this
    /// one with the sink's type and target (`sink`: a worker writing elsewhere would take a
    /// share of the data away from the others' destination) and, when given, the stream read in
    /// place of the one configured (a re-created table's new stream is refused while the old
    /// one's rows are in the lease table).
    pub fn of_shared_run(&self, sink: Json, stream_arn: Option<&str>) -> Self {
        let mut identity = self.clone();
        let Json::Object(fields) = &mut identity.0 else {
            unreachable!("an identity is an object")
        };
        fields.insert("sink".into(), sink);
        if let Some(arn) = stream_arn {
            fields.insert("stream_arn".into(), json!(arn));
        }
        identity
    }

    /// An identity read back from a state file or a leader row, its endpoint masked (rule 5).
    pub fn from_json(mut json: Json) -> Self {
        if let Some(endpoint) = json.get_mut("endpoint_url")
            && let Json::String(url) = endpoint
        {
            *url = mask_url(url);
        }
        Identity(json)
    }

    /// The identity as JSON.
    pub fn as_json(&self) -> &Json {
        &self.0
    }

    /// `"sha256:"` + lowercase hex SHA-256 of the compact sorted JSON.
    pub fn fingerprint(&self) -> String {
        Self::fingerprint_of(&self.0)
    }

    /// The fingerprint of an identity as stored, before [`Identity::from_json`] masks it: what
    /// the stored fingerprint beside it was made from.
    pub fn fingerprint_of(json: &Json) -> String {
        let digest = Sha256::digest(json.to_string().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// Why `position`, stored under `stored`, cannot be resumed by this identity (rules 2–4):
    /// "<field> changed from <old> to <new>", one per field; empty when it can.
    pub fn changes_for(&self, stored: &Identity, position: &Position) -> Vec<String> {
        let (segment_state, read_stream) = match position {
            Position::Scan(_) => (true, None),
            Position::Streams(streams) => {
                (streams.snapshot.is_some(), streams.stream_arn.as_deref())
            }
        };
        let configured = |identity: &Identity| {
            identity
                .0
                .get("stream_arn")
                .and_then(Json::as_str)
                .map(str::to_string)
        };
        let same_stream = read_stream.is_some_and(|read| {
            let (before, after) = (configured(stored), configured(self));
            [before.as_deref(), after.as_deref()]
                .into_iter()
                .flatten()
                .all(|arn| arn == read)
        });
        self.changes_from(stored, segment_state)
            .into_iter()
            .filter(|change| !(same_stream && change.starts_with("stream_arn ")))
            .collect()
    }

    /// The fields that differ from `stored`, as "<field> changed from <old> to <new>": those
    /// both hold (rule 2); the segment-state fields only when `compare_segments` (rule 3).
    pub fn changes_from(&self, stored: &Identity, compare_segments: bool) -> Vec<String> {
        let empty = Map::new();
        let new = self.0.as_object().unwrap_or(&empty);
        let old = stored.0.as_object().unwrap_or(&empty);
        let mut keys: Vec<&String> = new.keys().chain(old.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|key| compare_segments || !SEGMENT_STATE.contains(&key.as_str()))
            .filter_map(|key| {
                let (before, after) = (old.get(key)?, new.get(key)?);
                (before != after).then(|| format!("{key} changed from {before} to {after}"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddbpipe_value::ValueFormat;

    fn east() -> Location {
        Location {
            region: Some("us-east-1".into()),
            endpoint_url: None,
            account: Some("111122223333".into()),
        }
    }

    #[test]
    fn the_account_is_read_from_table_and_stream_arns_only() {
        let table = "arn:aws:dynamodb:us-east-1:111122223333:table/orders";
        let stream =
            "arn:aws:dynamodb:us-east-1:111122223333:table/orders/stream/2026-01-01T00:00:00.000";
        assert_eq!(Location::account_of(table).as_deref(), Some("111122223333"));
        assert_eq!(
            Location::account_of(stream).as_deref(),
            Some("111122223333")
        );
        assert_eq!(Location::account_of("orders"), None);
        assert_eq!(
            Location::account_of("arn:aws:dynamodb:us-east-1::table/x"),
            None
        );
    }

    #[test]
    fn where_the_table_lives_is_part_of_the_identity() {
        let source = SourceConfig::new("orders");
        let here = Identity::of(&source, &east(), None);
        let west = Location {
            region: Some("us-west-2".into()),
            ..east()
        };
        let other_account = Location {
            account: Some("444455556666".into()),
            ..east()
        };
        let emulator = Location {
            endpoint_url: Some("http://127.0.0.1:8000".into()),
            ..east()
        };
        for (location, field) in [
            (west, "region"),
            (other_account, "account"),
            (emulator, "endpoint_url"),
        ] {
            let changes = Identity::of(&source, &location, None).changes_from(&here, true);
            assert_eq!(changes.len(), 1, "{changes:?}");
            assert!(
                changes[0].starts_with(&format!("{field} changed from")),
                "{changes:?}"
            );
        }
    }

    #[test]
    fn an_endpoint_is_kept_masked_and_one_stored_with_its_secrets_compares_equal() {
        let source = SourceConfig::new("orders");
        let at = |url: &str| Location {
            endpoint_url: Some(url.into()),
            ..east()
        };
        let secret = "http://user:s3cr3t@127.0.0.1:8000";
        let now = Identity::of(&source, &at(secret), None);
        assert_eq!(now.as_json()["endpoint_url"], "http://***@127.0.0.1:8000");
        // Stored by an earlier ddbpipe with the password: read masked, no change.
        let mut earlier = now.as_json().clone();
        earlier["endpoint_url"] = json!(secret);
        let stored = Identity::from_json(earlier.clone());
        assert!(!stored.as_json().to_string().contains("s3cr3t"));
        assert!(now.changes_from(&stored, true).is_empty());
        assert_ne!(Identity::fingerprint_of(&earlier), stored.fingerprint());
        // Another host still counts, and the change shows no secret.
        let other = Identity::of(&source, &at("http://user:0ther@127.0.0.2:8000"), None);
        let changes = other.changes_from(&stored, true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(!changes[0].contains("s3cr3t") && !changes[0].contains("0ther"));
        // Without secrets: stored as given, the fingerprint it always had.
        let plain = Identity::of(&source, &at("http://127.0.0.1:8000"), None);
        assert_eq!(plain.as_json()["endpoint_url"], "http://127.0.0.1:8000");
        assert_eq!(
            Identity::from_json(plain.as_json().clone()).fingerprint(),
            Identity::fingerprint_of(plain.as_json())
        );
    }

    #[test]
    fn what_the_records_look_like_is_part_of_the_identity() {
        let source = SourceConfig::new("orders");
        let keyed = Output::Keyed {
            table: "orders".into(),
            document_column: "document".into(),
        };
        let here = Identity::of(&source, &east(), Some(&keyed));
        let mut typed = source.clone();
        typed.value_format = ValueFormat::Typed;
        let moved = Output::Keyed {
            table: "orders_copy".into(),
            document_column: "document".into(),
        };
        let renamed = Output::Keyed {
            table: "orders".into(),
            document_column: "doc".into(),
        };
        let appended = Output::File {
            path: "/data/orders.jsonl".into(),
            write: "append",
            gzip: false,
        };
        let file = Identity::of(&source, &east(), Some(&appended));
        for (other, field) in [
            (
                Output::File {
                    path: "/data/orders.jsonl".into(),
                    write: "overwrite",
                    gzip: false,
                },
                "sink_write",
            ),
            (
                Output::File {
                    path: "/data/orders.jsonl".into(),
                    write: "append",
                    gzip: true,
                },
                "gzip",
            ),
            (
                Output::File {
                    path: "/data/orders-2.jsonl".into(),
                    write: "append",
                    gzip: false,
                },
                "sink_path",
            ),
            (Output::Stdout, "sink_path"),
        ] {
            let changes = Identity::of(&source, &east(), Some(&other)).changes_from(&file, true);
            assert_eq!(changes.len(), 1, "{changes:?}");
            assert!(
                changes[0].starts_with(&format!("{field} changed from")),
                "{changes:?}"
            );
        }
        for (identity, field) in [
            (Identity::of(&typed, &east(), Some(&keyed)), "value_format"),
            (Identity::of(&source, &east(), Some(&moved)), "sink_table"),
            (
                Identity::of(&source, &east(), Some(&renamed)),
                "document_column",
            ),
        ] {
            let changes = identity.changes_from(&here, true);
            assert_eq!(changes.len(), 1, "{changes:?}");
            assert!(
                changes[0].starts_with(&format!("{field} changed from")),
                "{changes:?}"
            );
        }
    }

    #[test]
    fn the_snapshot_engine_and_export_matter_only_to_segment_state() {
        use ddbpipe_source::config::SnapshotEngine;
        use ddbpipe_source::position::{ScanKind, ScanPosition, StreamKind, StreamsPosition};
        let source = SourceConfig::new("orders");
        let here = Identity::of(&source, &east(), None);
        let mut exported = source.clone();
        exported.snapshot.engine = SnapshotEngine::Export;
        let mut given = exported.clone();
        given.snapshot.export_arn =
            Some("arn:aws:dynamodb:us-east-1:1:table/orders/export/x".into());
        let scanning = Position::Scan(ScanPosition::new(ScanKind::Scan, 1));
        let streaming = Position::Streams(StreamsPosition::new(StreamKind::Mirror, None));
        let changes = Identity::of(&exported, &east(), None).changes_for(&here, &scanning);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(
            changes[0].starts_with("snapshot_engine changed from"),
            "{changes:?}"
        );
        let exporting = Identity::of(&exported, &east(), None);
        let changes = Identity::of(&given, &east(), None).changes_for(&exporting, &scanning);
        assert!(
            changes[0].starts_with("snapshot_export_arn changed from null"),
            "{changes:?}"
        );
        // No open snapshot: the engine may change between runs.
        assert!(exporting.changes_for(&here, &streaming).is_empty());
    }

    #[test]
    fn a_field_one_side_does_not_hold_is_not_compared() {
        let source = SourceConfig::new("orders");
        let now = Identity::of(&source, &east(), None);
        // Written by an earlier ddbpipe: no location, no value format.
        let mut earlier = now.as_json().clone();
        for field in ["region", "endpoint_url", "account", "value_format"] {
            earlier.as_object_mut().map(|o| o.remove(field));
        }
        assert!(
            now.changes_from(&Identity::from_json(earlier), true)
                .is_empty()
        );
        // This command could not learn the account: not compared, the rest is.
        let unknown_account = Location {
            account: None,
            ..east()
        };
        let without = Identity::of(&source, &unknown_account, None);
        assert!(without.changes_from(&now, true).is_empty());
        let west = Location {
            region: Some("us-west-2".into()),
            account: None,
            ..east()
        };
        assert_eq!(
            Identity::of(&source, &west, None)
                .changes_from(&now, true)
                .len(),
            1
        );
    }
}
