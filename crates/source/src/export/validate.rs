//! What an export's item must be besides attribute JSON (rule 4 of `export`): an export's
//! files are read from a bucket, not from DynamoDB's API, so an item is checked against what
//! DynamoDB itself would hold before any line of its file is handed on.
//!
//! # Rules
//! 1. Every key attribute of the table's key schema is present with the schema's type
//!    (`key_schema::check_key`).
//! 2. Every number is one DynamoDB stores and the item is at most 400 KB
//!    (`ddbpipe_value::check_item`; the full export's fast path checks the same while it
//!    writes, `WireWriter::checking`).
//! 3. The error names the item's key as the line holds it (`key_of_line`), so the item can be
//!    found; the caller adds the file and the line number.

use ddbpipe_value::{Item, check_item};

use super::ExportType;
use crate::key_schema::{KeyAttribute, check_key};

/// Rules 1–2 for an incremental export's line: its `Keys`, and its images.
pub(crate) fn check_change(
    key_schema: &[KeyAttribute],
    keys: &Item,
    images: [Option<&Item>; 2],
) -> Result<(), String> {
    check_key(key_schema, |name| {
        keys.get(name).map(|value| value.type_tag())
    })?;
    check_item(keys)?;
    for image in images.into_iter().flatten() {
        check_key(key_schema, |name| {
            image.get(name).map(|value| value.type_tag())
        })?;
        check_item(image)?;
    }
    Ok(())
}

/// Rule 3: the key of the item on `line` as its attribute JSON, e.g. `pk={"S":"a"}`, or what
/// is missing; for an error line only (it parses the line again).
pub(crate) fn key_of_line(line: &[u8], kind: ExportType, key_schema: &[KeyAttribute]) -> String {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(line) else {
        return "unknown (the line is not JSON)".into();
    };
    let holder = match kind {
        ExportType::Full => &json["Item"],
        ExportType::Incremental => &json["Keys"],
    };
    let parts: Vec<String> = key_schema
        .iter()
        .map(|key| match holder.get(&key.name) {
            Some(value) => {
                let mut text = value.to_string();
                if text.len() > 200 {
                    let mut cut = 200;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push('…');
                }
                format!("{}={text}", key.name)
            }
            None => format!("{} missing", key.name),
        })
        .collect();
    parts.join(", ")
}
