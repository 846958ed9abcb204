//! The lines of a full export's data files, `{"Item": {<attribute JSON>}}`, each written as its
//! record by the same writer as the items of a Scan page, so an exported item gives the same
//! bytes as the item scanned (docs/scan.md §2.10).

use std::fmt;

use ddbpipe_value::WireWriter;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::page::RecordSeed;
use super::{Text, parse};
use crate::api::{KeyAttribute, Render};

/// Writes export lines as records. Each line is its own JSON document, and a [`WireWriter`]'s
/// entries borrow from its input: the one writer is recycled from line to line, keeping its
/// buffers (no allocation per item once they have grown).
///
/// An export's file did not come from DynamoDB's API: every item is held to DynamoDB's limits
/// (numbers, 400 KB, [`WireWriter::checking`]) and to the table's key schema.
pub(crate) struct ExportLineWriter {
    render: Render,
    key_schema: Vec<KeyAttribute>,
    spare: Option<WireWriter<'static>>,
}

impl ExportLineWriter {
    /// A writer of records by `render`, of items with the key `key_schema`.
    pub(crate) fn new(render: Render, key_schema: Vec<KeyAttribute>) -> Self {
        let spare = Some(WireWriter::checking(render.format()));
        ExportLineWriter {
            render,
            key_schema,
            spare,
        }
    }

    /// Appends the record of one line to `out`; the problem when the line is not
    /// `{"Item": {…}}` with attribute JSON this version reads. `out` holds part of a record
    /// after an error: the caller drops it.
    pub(crate) fn write(&mut self, line: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let mut writer = match self.spare.take() {
            Some(spare) => spare.recycle(),
            None => WireWriter::checking(self.render.format()),
        };
        let found = parse(line, |deserializer| {
            LineSeed {
                writer: &mut writer,
                render: &self.render,
                out,
            }
            .deserialize(deserializer)
        });
        let result = match found {
            Ok(true) => {
                crate::key_schema::check_key(&self.key_schema, |name| writer.attribute_type(name))
            }
            Ok(false) => Err("the line has no \"Item\"".into()),
            Err(error) => Err(match writer.unknown_type() {
                Some(tag) => format!("unsupported attribute value type {tag}"),
                None => format!("not an export line: {error}"),
            }),
        };
        self.spare = Some(writer.recycle());
        result
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
