//! What a stored position depends on, and its fingerprint (SPEC §6.2).
//!
//! A position is only valid for the source that made it: resuming a scan cursor under another
//! filter, index or segment count would silently read the wrong items. So a stored position
//! carries the identity of its source, and a run whose identity differs stops with the fields
//! that changed.

use ddbpipe_source::config::{Mode, SourceConfig};
use serde_json::{Map, Value as Json, json};
use sha2::{Digest, Sha256};

/// The source identity: the fields a position depends on, as a JSON object with sorted keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity(Json);

impl Identity {
    /// The identity of a configured source.
    pub fn of(source: &SourceConfig) -> Self {
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
            "stream_arn": source.stream_arn,
        }))
    }

    /// An identity read back from a state file.
    pub fn from_json(json: Json) -> Self {
        Identity(json)
    }

    /// The identity as JSON.
    pub fn as_json(&self) -> &Json {
        &self.0
    }

    /// `"sha256:"` + lowercase hex SHA-256 of the compact sorted JSON.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.0.to_string().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// The fields that differ from `stored`, as "<field> changed from <old> to <new>".
    /// `segments` counts only when `compare_segments` (the position has segment state).
    pub fn changes_from(&self, stored: &Identity, compare_segments: bool) -> Vec<String> {
        let empty = Map::new();
        let new = self.0.as_object().unwrap_or(&empty);
        let old = stored.0.as_object().unwrap_or(&empty);
        let mut keys: Vec<&String> = new.keys().chain(old.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|key| compare_segments || key.as_str() != "segments")
            .filter_map(|key| {
                let before = old.get(key).unwrap_or(&Json::Null);
                let after = new.get(key).unwrap_or(&Json::Null);
                (before != after).then(|| format!("{key} changed from {before} to {after}"))
            })
            .collect()
    }
}
