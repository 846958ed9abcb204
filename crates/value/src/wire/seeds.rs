//! The walk of one item's attribute JSON (docs/values.md §3): serde seeds that read each
//! level as the deserializer hands it over and write it through the [`WireWriter`] that owns
//! the output state (module docs of `wire`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};

use super::{Checks, Entry, Tag, WireWriter, write_text};
use crate::ValueFormat;
use crate::limits::ItemSize;

/// Reads one item and writes it; see [`WireWriter::item`].
pub struct ItemSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    out: &'w mut Vec<u8>,
}

impl<'w, 'de> ItemSeed<'w, 'de> {
    pub(super) fn new(writer: &'w mut WireWriter<'de>, out: &'w mut Vec<u8>) -> Self {
        ItemSeed { writer, out }
    }
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        let ItemSeed { writer, out } = self;
        deserializer.deserialize_map(MapSeed {
            writer: &mut *writer,
            out,
        })?;
        if writer.checks == Checks::DynamoDb {
            ItemSize(writer.size).check().map_err(D::Error::custom)?;
        }
        Ok(())
    }
}

/// An object of attribute JSON: an item, or the payload of an `M`.
struct MapSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    out: &'w mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for MapSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MapSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of attribute values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let MapSeed { writer, out } = self;
        let base = writer.stack.len();
        let start = out.len();
        out.push(b'{');
        writer.depth += 1;
        while let Some(name) = map.next_key_seed(Text)? {
            if writer.stack.len() > base {
                out.push(b',');
            }
            let entry_start = out.len();
            write_text(out, &name);
            out.push(b':');
            // A map's entry costs a byte besides its name; an item's attribute does not.
            writer.count(name.len() + usize::from(writer.depth > 1));
            let value = out.len();
            let tag = map.next_value_seed(AttributeSeed {
                writer: &mut *writer,
                out: &mut *out,
            })?;
            writer.stack.push(Entry {
                name,
                start: entry_start,
                value,
                end: out.len(),
                tag,
            });
        }
        out.push(b'}');
        writer.depth -= 1;
        writer.close_map(base, start, out);
        Ok(())
    }
}

/// One attribute value: an object with one type tag.
struct AttributeSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    out: &'w mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for AttributeSeed<'_, 'de> {
    type Value = Tag;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tag, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AttributeSeed<'_, 'de> {
    type Value = Tag;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an attribute value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tag, A::Error> {
        let AttributeSeed { writer, out } = self;
        let Some(name) = map.next_key_seed(Text)? else {
            return Err(de::Error::custom("an attribute value without a type"));
        };
        let Some(tag) = Tag::parse(&name) else {
            let error = A::Error::custom(format_args!("unsupported attribute value type {name}"));
            writer.unknown = Some(name.into_owned());
            return Err(error);
        };
        let typed = writer.format == ValueFormat::Typed;
        if typed {
            out.extend_from_slice(tag.typed_prefix());
        }
        match tag {
            Tag::S => {
                let text = map.next_value_seed(Text)?;
                writer.count(text.len());
                write_text(out, &text);
            }
            Tag::N => writer.write_number(&map.next_value_seed(Text)?, out)?,
            Tag::B => writer.write_binary(&map.next_value_seed(Text)?, out)?,
            Tag::Bool => {
                let flag: bool = map.next_value()?;
                writer.count(1);
                out.extend_from_slice(if flag { b"true" } else { b"false" });
            }
            Tag::Null => {
                // The payload is `true`; the value is null whatever it says, as in the SDK.
                let _: bool = map.next_value()?;
                writer.count(1);
                out.extend_from_slice(if typed { b"true" } else { b"null" });
            }
            Tag::M => {
                writer.count(3);
                map.next_value_seed(MapSeed {
                    writer: &mut *writer,
                    out: &mut *out,
                })?;
            }
            Tag::L | Tag::Ss | Tag::Ns | Tag::Bs => {
                writer.count(if matches!(tag, Tag::L) { 3 } else { 0 });
                map.next_value_seed(ListSeed {
                    writer: &mut *writer,
                    out: &mut *out,
                    tag,
                })?;
            }
        }
        // A second type tag is left unread: serde_json then fails the object at its `,`, as
        // every deserializer fails a map that was not read to its end.
        if typed {
            out.push(b'}');
        }
        Ok(tag)
    }
}

/// The payload of `L`, `SS`, `NS` or `BS`.
struct ListSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    out: &'w mut Vec<u8>,
    tag: Tag,
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let ListSeed { writer, out, tag } = self;
        out.push(b'[');
        let mut first = true;
        loop {
            // The separator goes in first and comes out again after the last element.
            let mark = out.len();
            if !first {
                out.push(b',');
            }
            let element = ElementSeed {
                writer: &mut *writer,
                out: &mut *out,
                tag,
            };
            if seq.next_element_seed(element)?.is_none() {
                out.truncate(mark);
                break;
            }
            first = false;
        }
        out.push(b']');
        Ok(())
    }
}

/// One element of a list or set payload.
struct ElementSeed<'w, 'de> {
    writer: &'w mut WireWriter<'de>,
    out: &'w mut Vec<u8>,
    tag: Tag,
}

impl<'de> DeserializeSeed<'de> for ElementSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        let ElementSeed { writer, out, tag } = self;
        match tag {
            Tag::Ss => {
                let text = Text.deserialize(deserializer)?;
                writer.count(text.len());
                write_text(out, &text);
            }
            Tag::Ns => writer.write_number(&Text.deserialize(deserializer)?, out)?,
            Tag::Bs => writer.write_binary(&Text.deserialize(deserializer)?, out)?,
            _ => {
                writer.count(1);
                AttributeSeed { writer, out }.deserialize(deserializer)?;
            }
        }
        Ok(())
    }
}

/// A string, borrowed from the input when it holds no escape.
struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Text {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(text))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(text))
    }
}
