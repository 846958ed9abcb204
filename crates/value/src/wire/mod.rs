//! DynamoDB attribute JSON as the service sends it, written as plain or typed output while it is
//! parsed (docs/values.md §3, docs/cli.md §8.7).
//!
//! The data plane hands response bytes here instead of building SDK values and then an
//! [`Item`](crate::Item): strings are borrowed from the input unless they hold escapes, no value
//! is built, and every scalar goes through the writers [`ValueFormat::write_value`] uses, so the
//! bytes are the ones the value-tree path writes.
//!
//! # Strings
//! A string the parser could borrow held no escape in the input, so it holds no byte that
//! needs one in the output either (JSON forbids raw control characters, `"` and `\` in
//! strings): it is copied between quotes as it is. Only strings that held escapes go through
//! the escaping writer.
//!
//! # Maps
//! Output keys are sorted (docs/values.md §3), wire keys are not. A map is written in two steps:
//! 1. each entry `"name":value` is written as it arrives, and its name and byte range are
//!    pushed on a stack that every level of the item shares;
//! 2. when the map closes, its entries are checked for order; unless they already are sorted,
//!    they are ordered by name (of a repeated name the last one wins, as when the JSON is read
//!    into a map), moved aside and copied back.
//!
//! # Checks
//! A writer made by [`WireWriter::checking`] also holds each item to DynamoDB's limits
//! (`limits`): every number must be one DynamoDB stores, and the item at most 400 KB. It
//! remembers the type of each top-level attribute ([`WireWriter::attribute_type`]), so the
//! caller can check the key schema. Items from DynamoDB's API need none of this; items from
//! an export's files do.
//!
//! # Errors
//! Malformed JSON and a payload of the wrong type are errors of the deserializer. So is a type
//! tag this version does not know; [`WireWriter::unknown_type`] then names the tag, so that the
//! caller can report "unsupported attribute value type".

use std::borrow::Cow;
use std::ops::Range;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::de::{self, DeserializeSeed};

use crate::ValueFormat;
use crate::json::write_str;
use crate::limits::{check_number, number_bytes};
use crate::{exact, plain};

mod seeds;

pub use seeds::ItemSeed;

/// What a [`WireWriter`] checks besides the JSON's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Nothing more: DynamoDB's API answered it.
    Shape,
    /// DynamoDB's limits on numbers and item size (`limits`).
    DynamoDb,
}

/// Writes items of attribute JSON in one [`ValueFormat`], reusing its buffers from item to item.
///
/// `'de` is the lifetime of the input: names of the last item written borrow from it.
#[derive(Debug)]
pub struct WireWriter<'de> {
    format: ValueFormat,
    /// Entries of the maps being written, innermost last.
    stack: Vec<Entry<'de>>,
    /// The top-level attributes of the last item, sorted by name.
    top: Vec<Entry<'de>>,
    /// Where a map's entries wait while they are copied back in order.
    moved: Vec<u8>,
    /// Maps open around the one being written.
    depth: usize,
    unknown: Option<String>,
    checks: Checks,
    /// The size of the item being written, as DynamoDB counts it (with `Checks::DynamoDb`).
    size: usize,
}

/// An emptied vector of entries borrowing from other input: collected in place (the layouts are
/// equal), so the allocation is kept.
fn relabel<'next>(mut entries: Vec<Entry<'_>>) -> Vec<Entry<'next>> {
    entries.clear();
    entries
        .into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

/// One `"name":value` entry of a map, by byte offsets into the output.
#[derive(Debug, Clone)]
struct Entry<'de> {
    name: Cow<'de, str>,
    start: usize,
    value: usize,
    end: usize,
    tag: Tag,
}

impl<'de> WireWriter<'de> {
    /// A writer of `format` output.
    pub fn new(format: ValueFormat) -> Self {
        WireWriter {
            format,
            stack: Vec::new(),
            top: Vec::new(),
            moved: Vec::new(),
            depth: 0,
            unknown: None,
            checks: Checks::Shape,
            size: 0,
        }
    }

    /// A writer of `format` output that also holds every item to DynamoDB's limits (see the
    /// module docs): for items that did not come from DynamoDB's API.
    pub fn checking(format: ValueFormat) -> Self {
        WireWriter {
            checks: Checks::DynamoDb,
            ..WireWriter::new(format)
        }
    }

    /// The same writer, emptied, for input that lives for another lifetime (the next line of an
    /// export file): its buffers keep their capacity, so a writer per input document costs no
    /// allocation once they have grown.
    pub fn recycle<'next>(self) -> WireWriter<'next> {
        WireWriter {
            format: self.format,
            stack: relabel(self.stack),
            top: relabel(self.top),
            moved: self.moved,
            depth: 0,
            unknown: None,
            checks: self.checks,
            size: 0,
        }
    }

    /// The output format.
    pub fn format(&self) -> ValueFormat {
        self.format
    }

    /// A seed that reads one item (an object of attribute JSON) and appends it to `out` as
    /// one compact object with sorted keys, as [`ValueFormat::write_item`] writes it.
    pub fn item<'w>(&'w mut self, out: &'w mut Vec<u8>) -> ItemSeed<'w, 'de> {
        self.depth = 0;
        self.stack.clear();
        self.unknown = None;
        self.size = 0;
        ItemSeed::new(self, out)
    }

    /// Where the value of the last item's top-level attribute `name` sits in the output it was
    /// written to, as [`ValueFormat::write_value`] writes it.
    pub fn attribute(&self, name: &str) -> Option<Range<usize>> {
        let index = self
            .top
            .binary_search_by(|entry| entry.name.as_ref().cmp(name))
            .ok()?;
        let entry = &self.top[index];
        Some(entry.value..entry.end)
    }

    /// The type tag (`"S"`, `"N"`, …) of the last item's top-level attribute `name`.
    pub fn attribute_type(&self, name: &str) -> Option<&'static str> {
        let index = self
            .top
            .binary_search_by(|entry| entry.name.as_ref().cmp(name))
            .ok()?;
        Some(self.top[index].tag.name())
    }

    /// The type tag that failed the last item, when it failed on a tag this version does not
    /// know.
    pub fn unknown_type(&self) -> Option<&str> {
        self.unknown.as_deref()
    }

    /// Puts the entries of the map that started at `start` (its `{`) in name order.
    fn close_map(&mut self, base: usize, start: usize, out: &mut Vec<u8>) {
        let top_level = self.depth == 0;
        let WireWriter {
            stack, top, moved, ..
        } = self;
        let entries = &mut stack[base..];
        let sorted = entries.windows(2).all(|pair| pair[0].name < pair[1].name);
        if !sorted {
            // Stable: of entries with one name, the last written stays last.
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            moved.clear();
            moved.extend_from_slice(&out[start..]);
            out.truncate(start + 1);
            let mut kept = 0;
            for index in 0..entries.len() {
                let repeated = entries
                    .get(index + 1)
                    .is_some_and(|next| next.name == entries[index].name);
                if repeated {
                    continue;
                }
                if kept > 0 {
                    out.push(b',');
                }
                let entry = &entries[index];
                let from = out.len();
                out.extend_from_slice(&moved[entry.start - start..entry.end - start]);
                let moved_entry = Entry {
                    name: entry.name.clone(),
                    start: from,
                    value: from + (entry.value - entry.start),
                    end: out.len(),
                    tag: entry.tag,
                };
                entries[kept] = moved_entry;
                kept += 1;
            }
            out.push(b'}');
            stack.truncate(base + kept);
        }
        if top_level {
            top.clear();
            top.extend(stack.drain(base..));
        } else {
            stack.truncate(base);
        }
    }

    // A `Cow`, not a `&str`: whether the text was borrowed decides how it is written.
    #[allow(clippy::ptr_arg)]
    fn write_number<E: de::Error>(
        &mut self,
        text: &Cow<'_, str>,
        out: &mut Vec<u8>,
    ) -> Result<(), E> {
        if self.checks == Checks::DynamoDb {
            check_number(text).map_err(E::custom)?;
            self.size += number_bytes(text);
        }
        match self.format {
            ValueFormat::Plain => plain::write_number(text, out),
            ValueFormat::PlainExact => exact::write_number(text, out),
            ValueFormat::Typed => write_text(out, text),
        }
        Ok(())
    }

    /// Counts `bytes` towards the item's size (with `Checks::DynamoDb`).
    fn count(&mut self, bytes: usize) {
        if self.checks == Checks::DynamoDb {
            self.size += bytes;
        }
    }

    /// Checks a binary's base64 and counts its bytes; writes the text itself. Only the
    /// canonical spelling is taken ([`canonical_base64_len`]): it is exactly what encoding its
    /// bytes again writes, and holds nothing a JSON string must escape.
    fn write_binary<E: de::Error>(&mut self, text: &str, out: &mut Vec<u8>) -> Result<(), E> {
        let Some(len) = canonical_base64_len(text) else {
            // The decoder's own message says what is wrong with it.
            let problem = match STANDARD.decode(text) {
                Err(error) => error.to_string(),
                Ok(_) => "not in its canonical spelling".to_owned(),
            };
            return Err(E::custom(format_args!("invalid base64 binary: {problem}")));
        };
        self.count(len);
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        Ok(())
    }
}

/// The number of bytes `text` encodes when it is standard base64 (RFC 4648 §4) in its one
/// canonical spelling — padded with `=` to a multiple of four, the unused low bits of its last
/// character zero — which is what `STANDARD` encodes and exactly what it decodes; `None` for
/// any other text. Checked without decoding.
fn canonical_base64_len(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let padding = bytes.iter().rev().take_while(|&&byte| byte == b'=').count();
    let body = &bytes[..bytes.len() - padding];
    let sextet = |byte: u8| match byte {
        b'A'..=b'Z' => Some(byte - b'A'),
        b'a'..=b'z' => Some(byte - b'a' + 26),
        b'0'..=b'9' => Some(byte - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    // Every byte an alphabet's, checked by comparisons folded without an early exit per
    // byte, a chunk at a time (which the compiler turns into vector instructions: about 5×
    // the speed of asking `sextet` of each byte).
    let alphabet = |byte: u8| {
        (byte.wrapping_sub(b'A') < 26)
            | (byte.wrapping_sub(b'a') < 26)
            | (byte.wrapping_sub(b'0') < 10)
            | (byte == b'+')
            | (byte == b'/')
    };
    let all_alphabet = body
        .chunks(32)
        .all(|chunk| chunk.iter().fold(true, |ok, &byte| ok & alphabet(byte)));
    if padding > 2 || !all_alphabet {
        return None;
    }
    // One `=`: the last character carries 4 bits of the last byte, so its low 2 are unused;
    // two: it carries 2 bits, its low 4 unused.
    let unused = [0, 0b11, 0b1111][padding];
    if body
        .last()
        .and_then(|&byte| sextet(byte))
        .is_some_and(|bits| bits & unused != 0)
    {
        return None;
    }
    Some(bytes.len() / 4 * 3 - padding)
}

/// The DynamoDB attribute types, by their tags.
#[derive(Debug, Clone, Copy)]
enum Tag {
    S,
    N,
    B,
    Bool,
    Null,
    M,
    L,
    Ss,
    Ns,
    Bs,
}

impl Tag {
    fn parse(tag: &str) -> Option<Tag> {
        Some(match tag {
            "S" => Tag::S,
            "N" => Tag::N,
            "B" => Tag::B,
            "BOOL" => Tag::Bool,
            "NULL" => Tag::Null,
            "M" => Tag::M,
            "L" => Tag::L,
            "SS" => Tag::Ss,
            "NS" => Tag::Ns,
            "BS" => Tag::Bs,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Tag::S => "S",
            Tag::N => "N",
            Tag::B => "B",
            Tag::Bool => "BOOL",
            Tag::Null => "NULL",
            Tag::M => "M",
            Tag::L => "L",
            Tag::Ss => "SS",
            Tag::Ns => "NS",
            Tag::Bs => "BS",
        }
    }

    /// The typed form's prefix: `{"<tag>":`.
    fn typed_prefix(self) -> &'static [u8] {
        match self {
            Tag::S => br#"{"S":"#,
            Tag::N => br#"{"N":"#,
            Tag::B => br#"{"B":"#,
            Tag::Bool => br#"{"BOOL":"#,
            Tag::Null => br#"{"NULL":"#,
            Tag::M => br#"{"M":"#,
            Tag::L => br#"{"L":"#,
            Tag::Ss => br#"{"SS":"#,
            Tag::Ns => br#"{"NS":"#,
            Tag::Bs => br#"{"BS":"#,
        }
    }
}

/// Writes a string read by [`Text`] as a JSON string, escaped as [`write_str`] escapes it.
// A `Cow`, not a `&str`: whether the text was borrowed decides how it is written.
#[allow(clippy::ptr_arg)]
fn write_text(out: &mut Vec<u8>, text: &Cow<'_, str>) {
    match text {
        // Borrowed: no escape in the input, so none needed (see the module docs).
        Cow::Borrowed(text) => {
            out.reserve(text.len() + 2);
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(text) => write_str(out, text),
    }
}

/// Writes one item of attribute JSON from `json` in `format`; for tests and one-off callers.
/// The data plane uses [`WireWriter::item`] inside its own response decoder.
pub fn write_wire_item(
    json: &[u8],
    format: ValueFormat,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let mut writer = WireWriter::new(format);
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    writer.item(out).deserialize(&mut deserializer)?;
    deserializer.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(json: &str, format: ValueFormat) -> String {
        let mut out = Vec::new();
        write_wire_item(json.as_bytes(), format, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    proptest::proptest! {
        /// The check without decoding takes exactly the texts `STANDARD` decodes, and counts
        /// their bytes: over an alphabet of characters with and without low bits, padding and
        /// characters outside it.
        #[test]
        fn the_canonical_check_takes_exactly_what_standard_decodes(
            text in "[AQgw/+9zZ=\\-_ ]{0,10}",
        ) {
            proptest::prop_assert_eq!(
                canonical_base64_len(&text),
                STANDARD.decode(&text).ok().map(|bytes| bytes.len())
            );
        }

        /// Long texts too (the alphabet is checked a chunk at a time): one character of an
        /// encoding replaced by any ASCII character, anywhere, the neighbours of the
        /// alphabet's ranges among them.
        #[test]
        fn one_character_anywhere_in_a_long_text_is_checked(
            bytes in proptest::collection::vec(0u8.., 1..150),
            at in 0usize..200,
            character in 0u8..128,
        ) {
            let mut text = STANDARD.encode(&bytes).into_bytes();
            let at = at % text.len();
            text[at] = character;
            let text = String::from_utf8(text).unwrap();
            proptest::prop_assert_eq!(
                canonical_base64_len(&text),
                STANDARD.decode(&text).ok().map(|bytes| bytes.len())
            );
        }

        #[test]
        fn every_encoding_is_canonical(bytes in proptest::collection::vec(0u8.., 0..40)) {
            proptest::prop_assert_eq!(
                canonical_base64_len(&STANDARD.encode(&bytes)),
                Some(bytes.len())
            );
        }
    }

    #[test]
    fn a_binary_is_written_as_its_canonical_base64_and_any_other_spelling_is_refused() {
        for format in [ValueFormat::Plain, ValueFormat::Typed] {
            let json = r#"{"b":{"B":"AAEC/w=="},"e":{"B":""},"s":{"BS":["QQ==","QUI=","QUJD"]}}"#;
            let out = wire(json, format);
            for text in ["\"AAEC/w==\"", "\"\"", "[\"QQ==\",\"QUI=\",\"QUJD\"]"] {
                assert!(out.contains(text), "{out}");
            }
            // An escape in the wire text is undone before the check, as for any string.
            assert!(wire(r#"{"b":{"B":"\u0051Q=="}}"#, format).contains("\"QQ==\""));
            // Unpadded, stray trailing bits, a line break, the URL-safe alphabet.
            for bad in ["QQ", "QR==", "QQ==\\n", "-_8="] {
                let item = format!(r#"{{"b":{{"B":"{bad}"}}}}"#);
                let mut out = Vec::new();
                let error = write_wire_item(item.as_bytes(), format, &mut out).unwrap_err();
                assert!(
                    error.to_string().contains("invalid base64"),
                    "{bad}: {error}"
                );
            }
        }
    }

    #[test]
    fn keys_come_out_sorted_whatever_the_wire_order() {
        let json =
            r#"{"z":{"N":"1"},"a":{"M":{"y":{"S":"b"},"b":{"NULL":true}}},"m":{"BOOL":false}}"#;
        assert_eq!(
            wire(json, ValueFormat::Plain),
            r#"{"a":{"b":null,"y":"b"},"m":false,"z":1}"#
        );
        assert_eq!(
            wire(json, ValueFormat::Typed),
            r#"{"a":{"M":{"b":{"NULL":true},"y":{"S":"b"}}},"m":{"BOOL":false},"z":{"N":"1"}}"#
        );
    }

    #[test]
    fn a_recycled_writer_keeps_its_buffers_and_forgets_the_last_item() {
        let mut writer = WireWriter::new(ValueFormat::Plain);
        let mut out = Vec::new();
        {
            let line = br#"{"z":{"N":"1"},"a":{"M":{"y":{"S":"b"},"b":{"NULL":true}}}}"#.to_vec();
            let mut deserializer = serde_json::Deserializer::from_slice(&line);
            writer
                .item(&mut out)
                .deserialize(&mut deserializer)
                .unwrap();
            let capacity = (writer.stack.capacity(), writer.top.capacity());
            assert!(capacity.0 > 0 && capacity.1 > 0);
            let recycled: WireWriter<'static> = writer.recycle();
            assert_eq!(
                (recycled.stack.capacity(), recycled.top.capacity()),
                capacity
            );
            assert_eq!(recycled.attribute("z"), None);
            writer = recycled;
        }
        let next = br#"{"k":{"S":"v"}}"#.to_vec();
        let mut writer = writer.recycle();
        out.clear();
        let mut deserializer = serde_json::Deserializer::from_slice(&next);
        writer
            .item(&mut out)
            .deserialize(&mut deserializer)
            .unwrap();
        assert_eq!(out, br#"{"k":"v"}"#);
    }

    #[test]
    fn of_a_repeated_name_the_last_value_wins() {
        let json = r#"{"b":{"S":"1"},"a":{"S":"x"},"b":{"S":"2"}}"#;
        assert_eq!(wire(json, ValueFormat::Plain), r#"{"a":"x","b":"2"}"#);
    }

    #[test]
    fn the_attributes_of_the_last_item_are_found_by_name() {
        let json = br#"{"sk":{"N":"2.50"},"pk":{"S":"a"}}"#;
        let mut out = b"prefix".to_vec();
        let mut writer = WireWriter::new(ValueFormat::Plain);
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        writer
            .item(&mut out)
            .deserialize(&mut deserializer)
            .unwrap();
        let pk = writer.attribute("pk").unwrap();
        let sk = writer.attribute("sk").unwrap();
        assert_eq!(&out[pk], br#""a""#);
        assert_eq!(&out[sk], b"2.5");
        assert_eq!(writer.attribute("other"), None);
    }

    #[test]
    fn an_unknown_type_tag_is_named() {
        let json = br#"{"a":{"S":"x"},"b":{"XS":"y"}}"#;
        let mut writer = WireWriter::new(ValueFormat::Plain);
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        let mut out = Vec::new();
        let error = writer.item(&mut out).deserialize(&mut deserializer);
        assert!(error.is_err());
        assert_eq!(writer.unknown_type(), Some("XS"));
    }

    #[test]
    fn malformed_attribute_values_are_errors() {
        for json in [
            r#"{"a":{}}"#,
            r#"{"a":{"S":"x","N":"1"}}"#,
            r#"{"a":{"S":1}}"#,
            r#"{"a":{"B":"not base64!"}}"#,
            r#"{"a":{"SS":"x"}}"#,
            r#"{"a":{"S":"x"}"#,
        ] {
            let mut out = Vec::new();
            assert!(
                write_wire_item(json.as_bytes(), ValueFormat::Plain, &mut out).is_err(),
                "{json}"
            );
        }
    }
}
