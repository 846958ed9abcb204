//! The attribute values of a DynamoDB item, as the rest of ddbpipe sees them.
//!
//! These types say what an attribute *is*; how it is written out lives in `plain` and `typed`.
//! Numbers stay decimal text ([`Number`]) so that nothing between DynamoDB and the output can
//! round them.

use std::collections::BTreeMap;

use crate::Number;

/// An item: attribute names to values.
///
/// A `BTreeMap` keyed by `String` iterates in UTF-8 byte order, which is the key order of every
/// JSON object ddbpipe writes (docs/values.md §3), so writers need no sorting step.
pub type Item = BTreeMap<String, Value>;

/// One DynamoDB attribute value, one variant per attribute type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `S`: a string.
    S(String),
    /// `N`: a number, kept as its decimal text.
    N(Number),
    /// `B`: binary data.
    B(Vec<u8>),
    /// `BOOL`: a boolean.
    Bool(bool),
    /// `NULL`: the null value.
    Null,
    /// `M`: a map of named values.
    M(Item),
    /// `L`: a list of values of any type.
    L(Vec<Value>),
    /// `SS`: a string set, in the order DynamoDB returned it.
    Ss(Vec<String>),
    /// `NS`: a number set, in the order DynamoDB returned it.
    Ns(Vec<Number>),
    /// `BS`: a binary set, in the order DynamoDB returned it.
    Bs(Vec<Vec<u8>>),
}

impl Value {
    /// The DynamoDB type tag of this value: `"S"`, `"N"`, `"B"`, `"BOOL"`, `"NULL"`, `"M"`, `"L"`,
    /// `"SS"`, `"NS"` or `"BS"`. It is also the key of the value's attribute JSON (§3.3).
    pub fn type_tag(&self) -> &'static str {
        match self {
            Value::S(_) => "S",
            Value::N(_) => "N",
            Value::B(_) => "B",
            Value::Bool(_) => "BOOL",
            Value::Null => "NULL",
            Value::M(_) => "M",
            Value::L(_) => "L",
            Value::Ss(_) => "SS",
            Value::Ns(_) => "NS",
            Value::Bs(_) => "BS",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_names_its_dynamodb_type_tag() {
        let cases = [
            (Value::S("a".into()), "S"),
            (Value::N(Number::new("1")), "N"),
            (Value::B(vec![1]), "B"),
            (Value::Bool(true), "BOOL"),
            (Value::Null, "NULL"),
            (Value::M(Item::new()), "M"),
            (Value::L(vec![]), "L"),
            (Value::Ss(vec![]), "SS"),
            (Value::Ns(vec![]), "NS"),
            (Value::Bs(vec![]), "BS"),
        ];
        for (value, tag) in cases {
            assert_eq!(value.type_tag(), tag, "{value:?}");
        }
    }

    #[test]
    fn item_keys_iterate_in_utf8_byte_order() {
        let item: Item = ["b", "a", "é", "Z", "aa"]
            .into_iter()
            .map(|key| (key.to_owned(), Value::Null))
            .collect();
        let keys: Vec<&str> = item.keys().map(String::as_str).collect();
        assert_eq!(keys, ["Z", "a", "aa", "b", "é"]);
    }
}
