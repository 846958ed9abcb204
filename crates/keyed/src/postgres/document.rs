//! The document column: its SQL type, and the U+0000 that PostgreSQL cannot store.
//!
//! # U+0000 in a key
//! A string key attribute goes into a `text` column, and no PostgreSQL text value holds
//! U+0000, whatever `sink.document_type` says. Such an item (an upsert or a delete) fails its
//! batch before anything is sent, with a definite error naming the item's key and the key
//! attribute, saying that PostgreSQL cannot store it ([`nul_in_key`]).
//!
//! # U+0000 and `jsonb`
//! DynamoDB strings may hold U+0000; the rendered document keeps it as the escape `\u0000`.
//! `json` and `text` store that text as it is, `jsonb` refuses it (and every retry or rerun
//! would fail the same way), so with `jsonb`:
//! 1. Only a document whose text holds `\u0000` is looked at further (one substring search).
//! 2. Such a document is parsed; the first string or member name holding U+0000, in document
//!    order, gives the attribute path (`v.list[2]`). `\\u0000` (an escaped backslash) is no
//!    U+0000 and passes.
//! 3. The batch fails before anything is sent, with a definite error naming the item's key,
//!    that path and `sink.document_type`.
//!
//! Only a document the table keeps is looked at: without a document column
//! (`sink.document_column: null`) nothing is stored of it.
//!
//! # U+0000 in typed columns
//! 4. A typed `text` column or a `jsonb` one cannot hold U+0000 either ([`stores`]); such a
//!    value is a mismatch of its column (`sink.on_type_mismatch`), not a failed batch.

use std::fmt::Write as _;

use serde_json::Value;

use crate::{ColumnValue, DocumentType, KeyColumn, KeyValue};

/// The parameter cast of the document: it is bound as text.
pub(super) fn cast(kind: DocumentType) -> &'static str {
    match kind {
        DocumentType::Jsonb => "::text::jsonb",
        DocumentType::Json => "::text::json",
        DocumentType::Text => "::text",
    }
}

/// Why a document cannot go into a column of type `kind`: the attribute path of its first
/// U+0000 when `kind` is `jsonb` (rules 1 and 2).
pub(super) fn unstorable(kind: DocumentType, document: &str) -> Option<String> {
    // Most documents hold no backslash: one byte search rules them out.
    if kind != DocumentType::Jsonb || !document.contains('\\') || !document.contains("\\u0000") {
        return None;
    }
    let value: Value = serde_json::from_str(document).ok()?;
    let mut path = String::new();
    first_nul(&value, &mut path).then_some(path)
}

/// Appends to `path` the way to the first U+0000 below `value`; `false` when there is none.
fn first_nul(value: &Value, path: &mut String) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
            let len = path.len();
            let _ = write!(path, "[{i}]");
            first_nul(item, path) || {
                path.truncate(len);
                false
            }
        }),
        Value::Object(members) => members.iter().any(|(name, member)| {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            let _ = write!(path, "{}", name.escape_debug());
            name.contains('\0') || first_nul(member, path) || {
                path.truncate(len);
                false
            }
        }),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Whether a typed column's value can be stored: a `text` or a `jsonb` value holding U+0000
/// cannot (rule 4; `columns` rule 2 makes it a mismatch).
pub(super) fn stores(value: &ColumnValue) -> bool {
    match value {
        ColumnValue::Text(text) => !text.contains('\0'),
        ColumnValue::Json(json) => unstorable(DocumentType::Jsonb, json).is_none(),
        _ => true,
    }
}

/// The first string key attribute holding U+0000, which no PostgreSQL text column stores.
pub(super) fn nul_in_key<'a>(columns: &'a [KeyColumn], key: &[KeyValue]) -> Option<&'a str> {
    columns
        .iter()
        .zip(key)
        .find(|(_, value)| matches!(value, KeyValue::S(text) if text.contains('\0')))
        .map(|(column, _)| column.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonb_names_the_path_of_the_first_nul() {
        let cases = [
            (r#"{"pk":"a","v":"x\u0000y"}"#, Some("v")),
            (
                r#"{"a":{"b":[1,"ok",{"c":"\u0000"}]},"z":"\u0000"}"#,
                Some("a.b[2].c"),
            ),
            (r#"{"pk":"a","v":{"S":"\u0000"}}"#, Some("v.S")),
            (r#"{"k\u0000":1}"#, Some("k\\0")),
            (r#"{"pk":"a","v":"\\u0000"}"#, None),
            (r#"{"pk":"a","v":"plain"}"#, None),
        ];
        for (document, want) in cases {
            assert_eq!(
                unstorable(DocumentType::Jsonb, document).as_deref(),
                want,
                "{document}"
            );
        }
    }

    #[test]
    fn json_and_text_store_every_document() {
        for kind in [DocumentType::Json, DocumentType::Text] {
            assert_eq!(unstorable(kind, r#"{"v":"\u0000"}"#), None);
        }
    }

    #[test]
    fn the_first_string_key_holding_nul_is_named() {
        let column = |name: &str, kind| KeyColumn {
            name: name.into(),
            kind,
        };
        let columns = [
            column("pk", crate::KeyType::S),
            column("sk", crate::KeyType::S),
        ];
        let key = |pk: &str, sk: &str| [KeyValue::S(pk.into()), KeyValue::S(sk.into())];
        assert_eq!(nul_in_key(&columns, &key("a", "b")), None);
        assert_eq!(nul_in_key(&columns, &key("a", "b\0")), Some("sk"));
        assert_eq!(nul_in_key(&columns, &key("\0", "\0")), Some("pk"));
        let bytes = [column("b", crate::KeyType::B)];
        assert_eq!(nul_in_key(&bytes, &[KeyValue::B(vec![0])]), None);
    }

    #[test]
    fn typed_text_and_json_holding_nul_are_not_stored() {
        assert!(!stores(&ColumnValue::Text("a\0b".into())));
        assert!(stores(&ColumnValue::Text("a\\0b".into())));
        assert!(!stores(&ColumnValue::Json(r#"["\u0000"]"#.into())));
        assert!(stores(&ColumnValue::Json(r#"["\\u0000"]"#.into())));
        assert!(stores(&ColumnValue::Numeric("1".into())));
        assert!(stores(&ColumnValue::Null));
    }
}
