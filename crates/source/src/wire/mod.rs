//! Scan, Query and GetRecords answers, and a full export's lines, decoded straight into
//! records (docs/cli.md §8.7). DynamoDB's JSON, not the SDK's: `crate::aws` hands it the
//! bodies it took from the SDK (`raw_body`), `crate::export` the lines of its data files.
//!
//! # Scan and Query
//! Each of `Items` is written as its record by [`WireWriter`](ddbpipe_value::WireWriter) while
//! it is parsed, without an SDK value or an `Item` in between. `LastEvaluatedKey` (one per
//! page) becomes an `Item` for the cursor, `ConsumedCapacity.CapacityUnits` is read, every
//! other field is skipped.
//!
//! # GetRecords
//! The fields of a record arrive in wire order, not envelope order. Its images are written
//! into a scratch buffer as they arrive, its other fields are borrowed from the body, and when
//! the record closes its envelope is assembled by the same writer as for decoded records
//! (`envelope::write_envelope`).
//!
//! # Error handling
//! As on the SDK path: an attribute type this version does not know and a sequence number that
//! is not one are fatal, naming the table or the record's `eventID`; a record without its
//! `dynamodb` part or its sequence number is an
//! [`EnvelopeError`](crate::envelope::EnvelopeError) for the shard reader; a body
//! that does not parse is an error without a code (transient), like an answer the SDK cannot
//! read.
//!
//! # Modules
//! - `page`: Scan and Query answers.
//! - `records`: GetRecords answers.
//! - `export`: the `{"Item": …}` lines of a full export's data files (docs/scan.md §2.10).

mod export;
mod page;
mod records;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, Visitor};

use crate::error::ApiError;

pub(crate) use export::ExportLineWriter;
pub(crate) use page::rendered_page;
pub(crate) use records::change_page;

/// Parses the whole body with `read`, which must consume all of it. The body is checked to
/// be UTF-8 once, as a whole, rather than string by string.
pub(super) fn parse<'de, T>(
    body: &'de [u8],
    read: impl FnOnce(
        &mut serde_json::Deserializer<serde_json::de::StrRead<'de>>,
    ) -> serde_json::Result<T>,
) -> serde_json::Result<T> {
    let body = std::str::from_utf8(body).map_err(|error| {
        <serde_json::Error as serde::de::Error>::custom(format_args!(
            "the body is not UTF-8: {error}"
        ))
    })?;
    let mut deserializer = serde_json::Deserializer::from_str(body);
    let value = read(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// The error of a body that does not decode. Transient when the answer may differ next time:
/// cut short (the connection broke mid-body) or not JSON at all (something between us and
/// DynamoDB answered). Definite otherwise: a complete JSON answer with the wrong shape, bad
/// UTF-8 or trailing bytes decodes the same way every time, so retrying it only waits.
pub(super) fn unreadable(operation: &str, body: &[u8], error: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    let message = format!("the {operation} response cannot be read: {error}");
    let json = body.trim_ascii_start().starts_with(b"{");
    match error.classify() {
        Category::Io | Category::Eof => ApiError::transport(message),
        Category::Syntax | Category::Data if !json => ApiError::transport(message),
        Category::Syntax | Category::Data => ApiError::fatal(message),
    }
}

/// A string of the body, borrowed unless it holds escapes.
#[derive(Debug, Deserialize)]
pub(super) struct Text<'a>(#[serde(borrow)] pub(super) Cow<'a, str>);

/// A value that may be `null` (absent), read by the inner seed otherwise.
pub(super) struct Optional<S>(pub(super) S);

impl<'de, S: DeserializeSeed<'de, Value = ()>> DeserializeSeed<'de> for Optional<S> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de, Value = ()>> Visitor<'de> for Optional<S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or null")
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.0.deserialize(deserializer)
    }
}
