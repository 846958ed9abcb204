//! An envelope line read back (docs/streams.md §4.1): the fields the destinations that apply or
//! store changes take from it, borrowed from the line (the keyed sinks, the lake).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// The fields of an envelope a destination reads, borrowed from its line; the images and the
/// key stay raw JSON (nothing re-formatted: a 38-digit number keeps its digits).
#[derive(Debug, Deserialize)]
pub struct EnvelopeFields<'a> {
    /// `c`, `u`, `d`, `r`, or another op name.
    #[serde(borrow)]
    pub op: Cow<'a, str>,
    /// The key attributes.
    #[serde(borrow, default)]
    pub key: Option<&'a RawValue>,
    /// The new image (`null` for a delete).
    #[serde(borrow, default)]
    pub after: Option<&'a RawValue>,
    /// The old image, when the stream's view has it.
    #[serde(borrow, default)]
    pub before: Option<&'a RawValue>,
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

impl<'a> EnvelopeFields<'a> {
    /// Reads the envelope line `text`.
    pub fn read(text: &'a str) -> serde_json::Result<EnvelopeFields<'a>> {
        serde_json::from_str(text)
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
