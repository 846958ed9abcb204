//! An envelope line read back (docs/streams.md §4.1): the fields the destinations that apply or
//! store changes take from it, borrowed from the line (the keyed sinks, the lake).

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::{NOTED_FIELDS, NOTED_NAMES};
use crate::records::Lines;

/// The fields of an envelope a destination reads, borrowed from its line; the images and the
/// key stay raw JSON text (nothing re-formatted: a 38-digit number keeps its digits), `None`
/// for `null`.
#[derive(Debug, Deserialize)]
pub struct EnvelopeFields<'a> {
    /// `c`, `u`, `d`, `r`, or another op name.
    #[serde(borrow)]
    pub op: Cow<'a, str>,
    /// The key attributes.
    #[serde(borrow, default, deserialize_with = "raw_text")]
    pub key: Option<&'a str>,
    /// The new image (`null` for a delete).
    #[serde(borrow, default, deserialize_with = "raw_text")]
    pub after: Option<&'a str>,
    /// The old image, when the stream's view has it.
    #[serde(borrow, default, deserialize_with = "raw_text")]
    pub before: Option<&'a str>,
    /// The record's `eventID`.
    #[serde(borrow, default)]
    pub event_id: Option<Cow<'a, str>>,
    /// The shard it was read from (`null` for a snapshot row).
    #[serde(borrow, default)]
    pub shard_id: Option<Cow<'a, str>>,
    /// The record's sequence number (`null` for a snapshot row or an export's change).
    #[serde(borrow, default)]
    pub sequence_number: Option<Cow<'a, str>>,
    /// `ApproximateCreationDateTime`, unix ms.
    #[serde(default)]
    pub ts_ms: Option<i64>,
}

/// A field's raw JSON text; `None` for `null` (serde's `deserialize_with` of the images, the
/// key and the ids, here and in the Kafka shaper's view of an envelope).
pub fn raw_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de str>, D::Error> {
    Ok(Option::<&'de RawValue>::deserialize(deserializer)?.map(RawValue::get))
}

impl<'a> EnvelopeFields<'a> {
    /// Reads the envelope line `text`.
    pub fn read(text: &'a str) -> serde_json::Result<EnvelopeFields<'a>> {
        serde_json::from_str(text)
    }

    /// The envelope of record `i` of `records`, whose text is `text`: from where its page
    /// noted the fields' values when it wrote them (the images not read at all), else read
    /// from `text`.
    pub fn of(
        records: &'a Lines,
        i: usize,
        text: &'a str,
    ) -> serde_json::Result<EnvelopeFields<'a>> {
        let Some(noted) = NotedEnvelope::of(records, i, text) else {
            return Self::read(text);
        };
        Ok(EnvelopeFields {
            op: decoded(noted.op)?,
            key: noted.key,
            after: noted.after,
            before: noted.before,
            event_id: noted.event_id.map(decoded).transpose()?,
            shard_id: noted.shard_id.map(decoded).transpose()?,
            sequence_number: noted.sequence_number.map(decoded).transpose()?,
            ts_ms: noted.ts_ms.map(serde_json::from_str).transpose()?,
        })
    }

    /// The record for messages: `record <event id> in <shard>` (`?` and `the snapshot` when
    /// unknown).
    pub fn record(&self) -> String {
        format!(
            "record {} in {}",
            self.event_id.as_deref().unwrap_or("?"),
            self.shard_id.as_deref().unwrap_or("the snapshot")
        )
    }
}

/// The values of a change envelope's [`NOTED_FIELDS`] as the JSON text its line holds (`None`
/// for `null`), taken from where its page noted them when it wrote the line: nothing of the
/// line is read. What the keyed, lake and Kafka sinks build their view of an envelope from.
#[derive(Debug, Clone, Copy)]
pub struct NotedEnvelope<'a> {
    /// `after`: the new image.
    pub after: Option<&'a str>,
    /// `before`: the old image.
    pub before: Option<&'a str>,
    /// `event_id`, a JSON string.
    pub event_id: Option<&'a str>,
    /// `key`: the key attributes.
    pub key: Option<&'a str>,
    /// `op`, a JSON string.
    pub op: &'a str,
    /// `sequence_number`, a JSON string.
    pub sequence_number: Option<&'a str>,
    /// `shard_id`, a JSON string.
    pub shard_id: Option<&'a str>,
    /// `ts_ms`, a JSON number.
    pub ts_ms: Option<&'a str>,
    /// `user_identity`, an object.
    pub user_identity: Option<&'a str>,
}

impl<'a> NotedEnvelope<'a> {
    /// Record `i` of `records`, whose text is `text`, as its page noted it; `None` when it was
    /// not noted (a snapshot row or a change read from an export, lines built otherwise).
    pub fn of(records: &Lines, i: usize, text: &'a str) -> Option<NotedEnvelope<'a>> {
        let found: [Option<&'a str>; NOTED_FIELDS.len()] =
            records.noted_values(i, text, &NOTED_NAMES)?;
        let present = |raw: Option<&'a str>| raw.filter(|raw| *raw != "null");
        let [
            after,
            before,
            event_id,
            key,
            op,
            sequence_number,
            shard_id,
            ts_ms,
            user_identity,
        ] = found;
        Some(NotedEnvelope {
            after: present(after),
            before: present(before),
            event_id: present(event_id),
            key: present(key),
            op: present(op)?,
            sequence_number: present(sequence_number),
            shard_id: present(shard_id),
            ts_ms: present(ts_ms),
            user_identity: present(user_identity),
        })
    }
}

/// A JSON string's text: borrowed when it has no escape (as ddbpipe writes ids and ops).
pub fn decoded(raw: &str) -> serde_json::Result<Cow<'_, str>> {
    match raw
        .strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'))
    {
        Some(inner) if !inner.contains(['\\', '"']) => Ok(Cow::Borrowed(inner)),
        _ => serde_json::from_str::<String>(raw).map(Cow::Owned),
    }
}
