//! The key attributes of one JSON object (an item line, an envelope's `key`), read without
//! parsing the rest: what the keyed sinks and the Kafka sink take a record's key from.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The values of the attributes `names` of the JSON object `text`, in the order of `names`,
/// each as the raw JSON the text holds (nothing re-formatted: a 38-digit number keeps its
/// digits); `None` where the object lacks one. The other attributes are skipped as they are
/// read, with nothing allocated for them: this runs for every record. `name` gives the
/// attribute name of each entry of `names`.
pub fn key_attributes<'a, K>(
    text: &'a str,
    names: &[K],
    name: impl Fn(&K) -> &str,
) -> serde_json::Result<Vec<Option<&'a RawValue>>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let found = KeyAttributes { names, name }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(found)
}

/// The visitor of [`key_attributes`].
struct KeyAttributes<'k, K, F> {
    names: &'k [K],
    name: F,
}

impl<'de, K, F: Fn(&K) -> &str> DeserializeSeed<'de> for KeyAttributes<'_, K, F> {
    type Value = Vec<Option<&'de RawValue>>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, K, F: Fn(&K) -> &str> Visitor<'de> for KeyAttributes<'_, K, F> {
    type Value = Vec<Option<&'de RawValue>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.names.len()];
        while let Some(key) = map.next_key_seed(Name)? {
            match self
                .names
                .iter()
                .position(|entry| (self.name)(entry) == key)
            {
                Some(at) => found[at] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// An attribute name as the text holds it: borrowed, unless it has escapes (serde's own
/// `Cow<str>` would copy every name of every record into a `String`).
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an attribute name")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, name: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(name))
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(name.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, name: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(name))
    }
}

#[cfg(test)]
mod tests {
    use super::key_attributes;

    #[test]
    fn the_key_attributes_come_as_written_in_the_order_asked() {
        let text =
            r#"{"b":{"N":"12345678901234567890123456789012345678"},"x":[1,{"y":2}],"a":"k\"1"}"#;
        let found = key_attributes(text, &["a", "b", "c"], |n| n).unwrap_or_default();
        let raw: Vec<Option<&str>> = found.iter().map(|v| v.map(|v| v.get())).collect();
        assert_eq!(
            raw,
            [
                Some(r#""k\"1""#),
                Some(r#"{"N":"12345678901234567890123456789012345678"}"#),
                None
            ]
        );
        assert!(key_attributes("[1]", &["a"], |n| n).is_err());
        // A name with an escape is read as the text it stands for.
        let found =
            key_attributes(r#"{"\u0061":1,"b\"":2}"#, &["a", "b\""], |n| n).unwrap_or_default();
        let raw: Vec<Option<&str>> = found.iter().map(|v| v.map(|v| v.get())).collect();
        assert_eq!(raw, [Some("1"), Some("2")]);
        assert!(key_attributes(r#"{"a":1} x"#, &["a"], |n| n).is_err());
    }
}
