//! The lines of a full export's data files, `{"Item": {<attribute JSON>}}`, each written as its
//! record by the same writer as the items of a Scan page, so an exported item gives the same
//! bytes as the item scanned (docs/scan.md §2.10).

use std::fmt;

use ddbpipe_value::WireWriter;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::Text;
use super::page::RecordSeed;
use crate::api::Render;

/// Writes export lines as records, reusing its buffers from line to line.
pub(crate) struct ExportLineWriter {
    render: Render,
}

impl ExportLineWriter {
    /// A writer of records by `render`.
    pub(crate) fn new(render: Render) -> Self {
        ExportLineWriter { render }
    }

    /// Appends the record of one line to `out`; the problem when the line is not
    /// `{"Item": {…}}` with attribute JSON this version reads. `out` holds part of a record
    /// after an error: the caller drops it.
    pub(crate) fn write(&self, line: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let text = std::str::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
        let mut writer = WireWriter::new(self.render.format());
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let found = LineSeed {
            writer: &mut writer,
            render: &self.render,
            out,
        }
        .deserialize(&mut deserializer)
        .and_then(|found| deserializer.end().map(|()| found));
        match found {
            Ok(true) => Ok(()),
            Ok(false) => Err("the line has no \"Item\"".into()),
            Err(error) => Err(match writer.unknown_type() {
                Some(tag) => format!("unsupported attribute value type {tag}"),
                None => format!("not an export line: {error}"),
            }),
        }
    }
}

/// `{"Item": …}`: whether the item was there.
struct LineSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    render: &'w Render,
    out: &'w mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for LineSeed<'_, 'de> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LineSeed<'_, 'de> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an export line {\"Item\": …}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(field) = map.next_key::<Text<'de>>()? {
            if field.0 == "Item" && !found {
                map.next_value_seed(RecordSeed {
                    writer: &mut *self.writer,
                    render: self.render,
                    out: &mut *self.out,
                })?;
                found = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}
