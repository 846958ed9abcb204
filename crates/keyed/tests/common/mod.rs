//! Builders shared by the backend tests (`sqlite.rs`, `postgres.rs`); each uses a part of them.
#![allow(dead_code)]

pub mod versions;

use ddbpipe_keyed::{KeyColumn, KeyType, KeyValue, RowChange, StateWrite, TableSpec, Version};

/// A table keyed by `key` (name, type) in `schema`, with the document in `doc`, created when
/// missing.
pub fn spec_in(schema: &str, table: &str, key: &[(&str, KeyType)]) -> TableSpec {
    TableSpec {
        table: table.to_string(),
        schema: schema.to_string(),
        key: key
            .iter()
            .map(|(name, kind)| KeyColumn {
                name: name.to_string(),
                kind: *kind,
            })
            .collect(),
        document_column: "doc".to_string(),
        document_type: ddbpipe_keyed::DocumentType::Jsonb,
        create_table: true,
    }
}

pub fn s(text: &str) -> KeyValue {
    KeyValue::S(text.to_string())
}

/// An upsert of any key.
pub fn upsert_key(key: Vec<KeyValue>, document: &str, snapshot: bool) -> RowChange {
    RowChange::Upsert {
        key,
        document: document.to_string(),
        snapshot,
        version: Version::default(),
    }
}

/// A delete of a one-string key.
pub fn delete(key: &str) -> RowChange {
    RowChange::Delete {
        key: vec![s(key)],
        version: Version::default(),
    }
}

/// A state write of `pipeline` stamped `updated_at`.
pub fn state_at(
    updated_at: &str,
    pipeline: &str,
    upserts: &[(&str, &str)],
    deletes: &[&str],
) -> StateWrite {
    StateWrite {
        pipeline: pipeline.to_string(),
        upserts: upserts
            .iter()
            .map(|(part, value)| (part.to_string(), value.to_string()))
            .collect(),
        deletes: deletes.iter().map(|part| part.to_string()).collect(),
        updated_at: updated_at.to_string(),
    }
}

/// Asserts that `message` holds every one of `texts`, naming `case` and the message if not.
pub fn assert_contains_all(case: &str, message: &str, texts: &[&str]) {
    for text in texts {
        assert!(message.contains(text), "{case}: no {text:?} in: {message}");
    }
}
