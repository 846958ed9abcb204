//! Scan and Query answers: each item written as its record while it is parsed.

use std::fmt;

use ddbpipe_value::{WireWriter, item_from_typed_json};
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Optional, Text, parse, unreadable};
use crate::api::{Render, RenderedPage};
use crate::envelope;
use crate::error::ApiError;
use crate::records::Lines;

/// Decodes a Scan or Query answer of `table`, writing its items as records by `render`.
pub(crate) fn rendered_page(
    body: &[u8],
    render: &Render,
    table: &str,
) -> Result<RenderedPage, ApiError> {
    let mut writer = WireWriter::new(render.format());
    // The records take about as many bytes as the items on the wire.
    let mut records = Lines::with_capacity(0, body.len());
    match render {
        Render::Items(_, Some(key)) => records.note_attributes(key.clone()),
        // Each snapshot envelope notes where its fields' values are, as a page of changes.
        Render::Snapshots(_) => records.note_attributes(envelope::NOTED_NAMES.clone()),
        Render::Items(_, None) => {}
    }
    let answer = parse(body, |deserializer| {
        PageSeed {
            writer: &mut writer,
            render,
            records: &mut records,
        }
        .deserialize(deserializer)
    });
    let (cursor, consumed_capacity) = match answer {
        Ok(answer) => answer,
        Err(error) => {
            return Err(match writer.unknown_type() {
                Some(tag) => ApiError::fatal(format!(
                    "unsupported attribute value type {tag} in table '{table}'"
                )),
                None => unreadable("Scan or Query", body, &error),
            });
        }
    };
    let last_evaluated_key = match cursor {
        Some(serde_json::Value::Object(key)) if !key.is_empty() => {
            let key = serde_json::Value::Object(key);
            let item = item_from_typed_json(&key, "LastEvaluatedKey").map_err(|error| {
                ApiError::fatal(format!(
                    "a cursor of table '{table}' cannot be read: {error}"
                ))
            })?;
            Some(item)
        }
        _ => None,
    };
    Ok(RenderedPage {
        records,
        last_evaluated_key,
        consumed_capacity,
    })
}

#[derive(Debug, Deserialize)]
struct ConsumedCapacity {
    #[serde(rename = "CapacityUnits")]
    capacity_units: Option<f64>,
}

/// A Scan or Query answer: the cursor (as JSON) and the consumed capacity; the items go to
/// `records`.
struct PageSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    render: &'w Render,
    records: &'w mut Lines,
}

type PageFields = (Option<serde_json::Value>, Option<f64>);

impl<'de> DeserializeSeed<'de> for PageSeed<'_, 'de> {
    type Value = PageFields;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<PageFields, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PageSeed<'_, 'de> {
    type Value = PageFields;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Scan or Query answer")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PageFields, A::Error> {
        let mut cursor = None;
        let mut capacity = None;
        while let Some(field) = map.next_key::<Text<'de>>()? {
            match field.0.as_ref() {
                "Items" => map.next_value_seed(Optional(ItemsSeed {
                    writer: &mut *self.writer,
                    render: self.render,
                    records: &mut *self.records,
                }))?,
                "LastEvaluatedKey" => cursor = map.next_value()?,
                "ConsumedCapacity" => {
                    let consumed: Option<ConsumedCapacity> = map.next_value()?;
                    capacity = consumed.and_then(|consumed| consumed.capacity_units);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((cursor, capacity))
    }
}

/// `Items`: each item written as its record.
struct ItemsSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    render: &'w Render,
    records: &'w mut Lines,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let ItemsSeed {
            writer,
            render,
            records,
        } = self;
        let mut spans = None;
        while records.try_push_with(|out| {
            let record = RecordSeed {
                writer: &mut *writer,
                render,
                out,
            };
            seq.next_element_seed(record).map(|read| match read {
                Some(noted) => {
                    spans = noted;
                    true
                }
                None => false,
            })
        })? {
            match &spans {
                // Where the snapshot envelope's fields went.
                Some(spans) => spans.note(records),
                // The writer knows where the item's top-level values went (its key's too).
                None => records.note_last(|name| writer.attribute(name)),
            }
        }
        Ok(())
    }
}

/// One item, written as its record.
pub(super) struct RecordSeed<'w, 'de> {
    pub(super) writer: &'w mut WireWriter<'de>,
    pub(super) render: &'w Render,
    pub(super) out: &'w mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_, 'de> {
    /// Where a snapshot envelope's noted fields went; `None` for an item.
    type Value = Option<envelope::EnvelopeSpans>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let RecordSeed {
            writer,
            render,
            out,
        } = self;
        match render {
            Render::Items(..) => writer.item(out).deserialize(deserializer).map(|()| None),
            Render::Snapshots(shape) => {
                out.extend_from_slice(b"{\"after\":");
                let after = out.len();
                writer.item(out).deserialize(deserializer)?;
                let after = after..out.len();
                let spans = envelope::finish_snapshot(
                    &shape.key_schema,
                    &shape.table,
                    out,
                    after,
                    |name, out| match writer.attribute(name) {
                        Some(value) => {
                            out.extend_from_within(value);
                            true
                        }
                        None => false,
                    },
                );
                Ok(Some(spans))
            }
        }
    }
}
