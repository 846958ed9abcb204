#![warn(missing_docs)]
//! DynamoDB attribute values and their lossless JSON forms.
//!
//! This is the leaf crate of ddbpipe: no AWS, no tokio, no I/O. It holds the item model every
//! other crate shares and the two ways of writing it as JSON (docs/values.md §3). Every object it writes
//! is compact, with keys in UTF-8 byte order, strings escaped exactly as `serde_json` escapes
//! them.
//!
//! # Tour
//! * [`Value`] and [`Item`]: one variant per DynamoDB attribute type; an item is a
//!   `BTreeMap`, so its keys are already in output order.
//! * [`Number`]: a DynamoDB number as its original decimal text. Nothing here passes it through
//!   `f64` except to decide whether plain output may show it as a JSON number.
//! * [`ValueFormat`]: `Plain` (§3.1) or `Typed` (§3.3), and `PlainExact` (plain with every
//!   number a JSON number of its own digits, §3.7) for destinations that keep decimals exactly.
//!   [`ValueFormat::write_item`] appends an item to the caller's buffer; it is the hot path
//!   and builds no intermediate values.
//! * [`plain_number`] / [`PlainNumber`]: the number rule (§3.2) on its own.
//! * [`item_to_typed_json`] / [`item_from_typed_json`]: attribute JSON as `serde_json` values,
//!   for scan cursors in state files. Decoding is strict (§3.5) and fails with a
//!   [`DecodeError`] naming where the bad value sits.
//! * [`value_from_plain_json`]: a plain config value (YAML) as an attribute value (§3.4).
//! * [`check_number`], [`check_item`], [`ItemSize`]: DynamoDB's limits (38 digits, the
//!   number range, 400 KB items) for items read from files rather than from DynamoDB.
//! * [`ColumnReader`], [`convert`]: typed columns (`sink.columns`) read losslessly out of a
//!   document (docs/sinks.md §7.9); [`parse_timestamp`] and [`timestamp_text`] for their
//!   times.
//! * [`WireWriter`]: attribute JSON as DynamoDB sends it, written in either format while it is
//!   parsed, without building values (the data plane's hot path); [`write_wire_item`] for one
//!   item.
//!
//! # Example
//! ```
//! use ddbpipe_value::{Item, Number, Value, ValueFormat};
//!
//! let item = Item::from([
//!     ("pk".to_owned(), Value::S("a".to_owned())),
//!     ("price".to_owned(), Value::N(Number::new("12.50"))),
//!     ("big".to_owned(), Value::N(Number::new("12345678901234567890.123456789"))),
//! ]);
//!
//! let mut line = Vec::new();
//! ValueFormat::Plain.write_item(&item, &mut line);
//! assert_eq!(line, br#"{"big":"12345678901234567890.123456789","pk":"a","price":12.5}"#);
//!
//! line.clear();
//! ValueFormat::Typed.write_item(&item, &mut line);
//! assert_eq!(
//!     line,
//!     br#"{"big":{"N":"12345678901234567890.123456789"},"pk":{"S":"a"},"price":{"N":"12.50"}}"#
//! );
//! ```
//!
//! # Feature flags
//! None.

mod columns;
mod decode;
mod exact;
mod format;
mod json;
mod key_attributes;
mod limits;
mod number;
mod plain;
mod typed;
mod value;
mod wire;

pub use columns::{
    ColumnPath, ColumnReader, ColumnSpec, ColumnType, ColumnValue, Mismatch, PathStep, TimeFormat,
    a_tag, convert, parse_timestamp, timestamp_text,
};
pub use decode::{DecodeError, item_from_typed_json, value_from_typed_json};
pub use format::ValueFormat;
pub use key_attributes::key_attributes;
pub use limits::{ItemSize, MAX_ITEM_BYTES, check_item, check_number};
pub use number::{Number, PlainNumber, plain_number};
pub use plain::value_from_plain_json;
pub use typed::{item_to_typed_json, value_to_typed_json};
pub use value::{Item, Value};
pub use wire::{ItemSeed, WireWriter, write_wire_item};
