//! The lines of an incremental export's data files as change envelopes (docs/streams.md §4.12):
//! `{"Metadata": {"WriteTimestampMicros": {"N": …}}, "Keys": {…}, "NewImage": {…},
//! "OldImage": {…}}`, one per item changed in the export's window, its last state there.
//!
//! # Rules
//! 1. `Metadata.WriteTimestampMicros` and `Keys` are required; an image is absent when the
//!    item did not exist at that end of the window (`NewImage` absent: deleted).
//! 2. The envelope's `ts_ms` is the write time in ms, rounded down: exact, unlike a stream
//!    record's second.
//! 3. A line that breaks rule 1, whose attribute values do not read, or whose keys or images
//!    DynamoDB could not hold (`validate`), is an error naming what is wrong; the caller names
//!    the file, the line and the key.
//!
//! Repairs are small next to snapshots (the changes of a gap), so the line is decoded into
//! items and written by the envelope writer, not by the Scan page's fast path.

use ddbpipe_value::{Item, item_from_typed_json};
use serde::Deserialize;

use super::validate::check_change;
use crate::api::{KeyAttribute, SnapshotShape};
use crate::envelope::write_export_change;

/// One line as stored.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Line {
    metadata: Option<Metadata>,
    keys: Option<serde_json::Value>,
    new_image: Option<serde_json::Value>,
    old_image: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Metadata {
    write_timestamp_micros: Option<Number>,
}

#[derive(Deserialize)]
struct Number {
    #[serde(rename = "N")]
    n: String,
}

/// Appends the change envelope of one incremental export line to `out` (rules 1–3).
pub(crate) fn write_change_line(
    line: &[u8],
    shape: &SnapshotShape,
    key_schema: &[KeyAttribute],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let line: Line =
        serde_json::from_slice(line).map_err(|e| format!("not an incremental export line: {e}"))?;
    let micros = line
        .metadata
        .and_then(|m| m.write_timestamp_micros)
        .ok_or("the line has no Metadata.WriteTimestampMicros")?;
    let micros: i64 = micros
        .n
        .parse()
        .map_err(|_| format!("WriteTimestampMicros {:?} is not a whole number", micros.n))?;
    let keys = image(line.keys.as_ref(), "Keys")?.ok_or("the line has no Keys")?;
    let new_image = image(line.new_image.as_ref(), "NewImage")?;
    let old_image = image(line.old_image.as_ref(), "OldImage")?;
    check_change(key_schema, &keys, [new_image.as_ref(), old_image.as_ref()])?;
    write_export_change(
        &keys,
        new_image.as_ref(),
        old_image.as_ref(),
        micros.div_euclid(1000),
        &shape.table,
        shape.format,
        out,
    );
    Ok(())
}

fn image(json: Option<&serde_json::Value>, name: &str) -> Result<Option<Item>, String> {
    json.map(|json| item_from_typed_json(json, name).map_err(|e| e.to_string()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use ddbpipe_value::ValueFormat;
    use serde_json::{Value, json};

    use super::*;

    fn shape(format: ValueFormat) -> SnapshotShape {
        SnapshotShape {
            key_schema: Vec::new(),
            table: "orders".into(),
            format,
        }
    }

    fn envelope(line: Value, format: ValueFormat) -> Result<Value, String> {
        let mut out = Vec::new();
        write_change_line(line.to_string().as_bytes(), &shape(format), &[], &mut out)?;
        Ok(serde_json::from_slice(&out).unwrap())
    }

    #[test]
    fn inserts_updates_and_deletes_become_change_envelopes_at_their_exact_write_time() {
        let meta = json!({"WriteTimestampMicros": {"N": "1700000000123456"}});
        let keys = json!({"pk": {"S": "a"}});
        let insert = envelope(
            json!({"Metadata": meta, "Keys": keys, "NewImage": {"pk": {"S": "a"}, "n": {"N": "1.50"}}}),
            ValueFormat::Plain,
        )
        .unwrap();
        assert_eq!(insert["op"], "c");
        assert_eq!(insert["event_name"], "INSERT");
        assert_eq!(insert["ts_ms"], 1_700_000_000_123_i64);
        assert_eq!(insert["key"], json!({"pk": "a"}));
        assert_eq!(insert["document_key"], json!({"pk": "a"}));
        assert_eq!(insert["before"], Value::Null);
        assert_eq!(insert["sequence_number"], Value::Null);
        assert_eq!(insert["shard_id"], Value::Null);
        assert_eq!(insert["table"], "orders");

        let update = envelope(
            json!({"Metadata": meta, "Keys": keys, "NewImage": {"pk": {"S": "a"}},
                "OldImage": {"pk": {"S": "a"}, "n": {"N": "1"}}}),
            ValueFormat::Typed,
        )
        .unwrap();
        assert_eq!(update["op"], "u");
        assert_eq!(update["before"], json!({"n": {"N": "1"}, "pk": {"S": "a"}}));

        let delete = envelope(
            json!({"Metadata": meta, "Keys": keys, "OldImage": {"pk": {"S": "a"}}}),
            ValueFormat::Plain,
        )
        .unwrap();
        assert_eq!(delete["op"], "d");
        assert_eq!(delete["after"], Value::Null);
    }

    #[test]
    fn a_line_without_its_time_or_keys_or_with_a_bad_value_says_what_is_wrong() {
        let keys = json!({"pk": {"S": "a"}});
        let no_time = envelope(json!({"Keys": keys}), ValueFormat::Plain).unwrap_err();
        assert!(no_time.contains("WriteTimestampMicros"), "{no_time}");
        let meta = json!({"WriteTimestampMicros": {"N": "1"}});
        let no_keys = envelope(json!({"Metadata": meta}), ValueFormat::Plain).unwrap_err();
        assert!(no_keys.contains("Keys"), "{no_keys}");
        let bad = envelope(
            json!({"Metadata": meta, "Keys": {"pk": {"Q": "a"}}}),
            ValueFormat::Plain,
        )
        .unwrap_err();
        assert!(bad.contains("Keys"), "{bad}");
        let not_json = write_change_line(b"{", &shape(ValueFormat::Plain), &[], &mut Vec::new());
        assert!(
            not_json
                .unwrap_err()
                .contains("not an incremental export line")
        );
    }

    /// Issue #24 item 5: a change whose keys or images DynamoDB could not hold is refused.
    #[test]
    fn a_change_with_a_wrong_key_type_or_a_bad_number_is_refused() {
        let schema = [KeyAttribute {
            name: "pk".into(),
            key_type: crate::api::KeyType::S,
        }];
        let write = |line: Value| {
            let mut out = Vec::new();
            write_change_line(
                line.to_string().as_bytes(),
                &shape(ValueFormat::Plain),
                &schema,
                &mut out,
            )
        };
        let meta = json!({"WriteTimestampMicros": {"N": "1"}});
        let wrong_key = write(json!({"Metadata": meta, "Keys": {"pk": {"N": "1"}}}));
        assert!(
            wrong_key
                .unwrap_err()
                .contains("key attribute 'pk' is of type N"),
            "wrong key type"
        );
        let bad_number = write(json!({"Metadata": meta, "Keys": {"pk": {"S": "a"}},
            "NewImage": {"pk": {"S": "a"}, "n": {"N": "1e999"}}}));
        assert!(bad_number.unwrap_err().contains("outside DynamoDB's range"));
        let fine = write(json!({"Metadata": meta, "Keys": {"pk": {"S": "a"}},
            "NewImage": {"pk": {"S": "a"}, "n": {"N": "1"}}}));
        assert!(fine.is_ok());
    }
}
