//! GetRecords answers: each record written as its envelope once it has been read.

use std::fmt;
use std::ops::Range;

use aws_smithy_types::DateTime;
use ddbpipe_value::WireWriter;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Optional, Text, parse, unreadable};
use crate::api::{ChangeMeta, ChangeOp, ChangePage, ChangeShape, Changes};
use crate::envelope::{self, ChangeFields, EnvelopeError, Image};
use crate::error::ApiError;
use crate::ids::SequenceNumber;
use crate::records::Lines;

/// Decodes a GetRecords answer, writing its records as envelopes of `shape`.
pub(crate) fn change_page(body: &[u8], shape: &ChangeShape<'_>) -> Result<ChangePage, ApiError> {
    let mut state = ChangeState {
        writer: WireWriter::new(shape.format),
        shape,
        images: Vec::new(),
        changes: Changes {
            envelopes: {
                // Each envelope notes where its fields' values are, for the sinks.
                let mut envelopes = Lines::with_capacity(0, body.len());
                envelopes.note_attributes(envelope::NOTED_NAMES.clone());
                envelopes
            },
            records: Vec::new(),
        },
        seen: 0,
        invalid: None,
        fatal: None,
    };
    let next_iterator = parse(body, |deserializer| {
        ChangePageSeed { state: &mut state }.deserialize(deserializer)
    });
    let next_iterator = match next_iterator {
        Ok(next_iterator) => next_iterator,
        Err(error) => {
            return Err(match state.writer.unknown_type() {
                Some(tag) => ApiError::fatal(format!(
                    "unsupported attribute value type {tag} in stream record {}",
                    event_id_of_record(body, state.seen.saturating_sub(1))
                )),
                None => unreadable("GetRecords", body, &error),
            });
        }
    };
    if let Some(error) = state.fatal {
        return Err(error);
    }
    Ok(ChangePage {
        changes: match state.invalid {
            Some(error) => Err(error),
            None => Ok(state.changes),
        },
        next_iterator,
    })
}

/// The `eventID` of record `index` of a GetRecords body, or `?`. Only for error messages: the
/// decoder writes images before it reaches the `eventID` that follows them on the wire.
fn event_id_of_record(body: &[u8], index: usize) -> String {
    let answer: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    answer["Records"][index]["eventID"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

/// What a GetRecords answer is decoded into.
struct ChangeState<'s, 'de> {
    writer: WireWriter<'de>,
    shape: &'s ChangeShape<'s>,
    /// The images of the record being read.
    images: Vec<u8>,
    changes: Changes,
    /// Records started so far.
    seen: usize,
    /// The first record that cannot become an envelope.
    invalid: Option<EnvelopeError>,
    /// The first record that cannot be read (a bad sequence number).
    fatal: Option<ApiError>,
}

/// The fields of a record's `dynamodb` part; images by their bytes in `ChangeState::images`.
#[derive(Debug, Default)]
struct ChangeParts<'de> {
    created_ms: Option<i64>,
    keys: Option<Range<usize>>,
    new_image: Option<Range<usize>>,
    old_image: Option<Range<usize>>,
    sequence_number: Option<Text<'de>>,
    size_bytes: Option<i64>,
    view_type: Option<Text<'de>>,
}

/// `userIdentity`.
#[derive(Debug, Deserialize)]
struct Identity<'a> {
    #[serde(rename = "PrincipalId", borrow, default)]
    principal_id: Option<Text<'a>>,
    #[serde(rename = "Type", borrow, default)]
    kind: Option<Text<'a>>,
}

/// One record's fields other than `dynamodb`.
#[derive(Debug, Default)]
struct RecordParts<'de> {
    event_id: Option<Text<'de>>,
    event_name: Option<Text<'de>>,
    user_identity: Option<Identity<'de>>,
}

fn text<'a>(text: &'a Option<Text<'_>>) -> Option<&'a str> {
    text.as_ref().map(|text| text.0.as_ref())
}

impl<'de> ChangeState<'_, 'de> {
    /// Writes the envelope of a record that was read whole, or notes why it cannot be one.
    fn finish_record(&mut self, record: &RecordParts<'de>, change: Option<&ChangeParts<'de>>) {
        let event_id = text(&record.event_id);
        let shard = self.shape.shard;
        let Some(change) = change else {
            self.invalid.get_or_insert(EnvelopeError::NoStreamRecord {
                event_id: event_id.map(str::to_string),
                shard: shard.clone(),
            });
            return;
        };
        let Some(sequence_number) = text(&change.sequence_number) else {
            self.invalid.get_or_insert(EnvelopeError::NoSequenceNumber {
                event_id: event_id.map(str::to_string),
                shard: shard.clone(),
            });
            return;
        };
        let sequence_number = match SequenceNumber::parse(sequence_number) {
            Ok(sequence_number) => sequence_number,
            Err(error) => {
                let event = event_id.unwrap_or("?");
                self.fatal
                    .get_or_insert(ApiError::fatal(format!("stream record {event}: {error}")));
                return;
            }
        };
        if self.invalid.is_some() {
            return;
        }
        let fields = ChangeFields {
            event_id,
            event_name: text(&record.event_name),
            sequence_number: Some(sequence_number.as_str()),
            shard_id: Some(self.shape.shard.as_str()),
            size_bytes: change.size_bytes,
            view_type: text(&change.view_type),
            created_ms: change.created_ms,
            user_identity: record
                .user_identity
                .as_ref()
                .map(|identity| (text(&identity.principal_id), text(&identity.kind))),
        };
        let images = &self.images;
        let mut spans = None;
        self.changes.envelopes.push_with(|out| {
            spans = Some(envelope::write_envelope(
                &fields,
                self.shape.table,
                out,
                |image, out| {
                    let range = match image {
                        Image::New => &change.new_image,
                        Image::Old => &change.old_image,
                        Image::Keys => &change.keys,
                    };
                    match range {
                        Some(range) => out.extend_from_slice(&images[range.clone()]),
                        None => out.extend_from_slice(b"null"),
                    }
                },
            ));
        });
        if let Some(spans) = spans {
            spans.note(&mut self.changes.envelopes);
        }
        let op = ChangeOp::of(fields.event_name);
        self.changes.records.push(ChangeMeta {
            sequence_number,
            created_ms: change.created_ms,
            op,
        });
    }
}

/// A GetRecords answer: `NextShardIterator`; the records go to the state.
struct ChangePageSeed<'w, 's, 'de> {
    state: &'w mut ChangeState<'s, 'de>,
}

impl<'de> DeserializeSeed<'de> for ChangePageSeed<'_, '_, 'de> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ChangePageSeed<'_, '_, 'de> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a GetRecords answer")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut next_iterator = None;
        while let Some(field) = map.next_key::<Text<'de>>()? {
            match field.0.as_ref() {
                "Records" => map.next_value_seed(Optional(StreamRecordsSeed {
                    state: &mut *self.state,
                }))?,
                "NextShardIterator" => next_iterator = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(next_iterator)
    }
}

/// `Records`: each record written as its envelope.
struct StreamRecordsSeed<'w, 's, 'de> {
    state: &'w mut ChangeState<'s, 'de>,
}

impl<'de> DeserializeSeed<'de> for StreamRecordsSeed<'_, '_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for StreamRecordsSeed<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of stream records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(StreamRecordSeed {
                state: &mut *self.state,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// One stream record.
struct StreamRecordSeed<'w, 's, 'de> {
    state: &'w mut ChangeState<'s, 'de>,
}

impl<'de> DeserializeSeed<'de> for StreamRecordSeed<'_, '_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StreamRecordSeed<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stream record")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let state = self.state;
        state.seen += 1;
        state.images.clear();
        let mut record = RecordParts::default();
        let mut change = None;
        while let Some(field) = map.next_key::<Text<'de>>()? {
            match field.0.as_ref() {
                "eventID" => record.event_id = map.next_value()?,
                "eventName" => record.event_name = map.next_value()?,
                "userIdentity" => record.user_identity = map.next_value()?,
                "dynamodb" => {
                    change = map.next_value_seed(OptionalChange { state: &mut *state })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        state.finish_record(&record, change.as_ref());
        Ok(())
    }
}

/// A record's `dynamodb` part, or `null`.
struct OptionalChange<'w, 's, 'de> {
    state: &'w mut ChangeState<'s, 'de>,
}

impl<'de> DeserializeSeed<'de> for OptionalChange<'_, '_, 'de> {
    type Value = Option<ChangeParts<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for OptionalChange<'_, '_, 'de> {
    type Value = Option<ChangeParts<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stream record's dynamodb part")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let state = self.state;
        let mut change = ChangeParts::default();
        while let Some(field) = map.next_key::<Text<'de>>()? {
            let image = match field.0.as_ref() {
                "Keys" => &mut change.keys,
                "NewImage" => &mut change.new_image,
                "OldImage" => &mut change.old_image,
                "ApproximateCreationDateTime" => {
                    // As the SDK reads it: epoch seconds as a double, then milliseconds.
                    let seconds: Option<f64> = map.next_value()?;
                    change.created_ms = seconds
                        .and_then(|seconds| DateTime::from_secs_f64(seconds).to_millis().ok());
                    continue;
                }
                "SequenceNumber" => {
                    change.sequence_number = map.next_value()?;
                    continue;
                }
                "SizeBytes" => {
                    change.size_bytes = map.next_value()?;
                    continue;
                }
                "StreamViewType" => {
                    change.view_type = map.next_value()?;
                    continue;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let start = state.images.len();
            let mut written = false;
            map.next_value_seed(Optional(ImageSeed {
                writer: &mut state.writer,
                out: &mut state.images,
                written: &mut written,
            }))?;
            *image = written.then_some(start..state.images.len());
        }
        Ok(Some(change))
    }
}

/// One image, written into the record's scratch buffer.
struct ImageSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    out: &'w mut Vec<u8>,
    written: &'w mut bool,
}

impl<'de> DeserializeSeed<'de> for ImageSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.writer.item(self.out).deserialize(deserializer)?;
        *self.written = true;
        Ok(())
    }
}
