//! [`ValueFormat`]: the choice between the plain and the typed JSON form of items.

use std::fmt;

use crate::plain::Numbers;
use crate::{Item, Value, plain, typed};

/// How attribute values are written (`value_format` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueFormat {
    /// Ordinary JSON (§3.1): numbers as numbers when exact, binary as base64, sets as arrays.
    #[default]
    Plain,
    /// DynamoDB attribute JSON (§3.3): every value tagged with its type, numbers as their text.
    Typed,
    /// Plain JSON (§3.1) with every number a JSON number of its own digits (§3.7), for a
    /// destination that keeps decimals exactly: a PostgreSQL `json` or `jsonb` document column
    /// chooses it for `value_format: plain`. It is not a config spelling of its own: it is
    /// spelled `plain`, the choice the user made.
    PlainExact,
}

impl ValueFormat {
    /// Appends the item as one compact JSON object, keys sorted (§3): plain (§3.1/§3.2) or
    /// typed (§3.3). Nothing else is written: no newline.
    pub fn write_item(self, item: &Item, out: &mut Vec<u8>) {
        match self {
            ValueFormat::Plain => plain::write_item(item, Numbers::Doubles, out),
            ValueFormat::PlainExact => plain::write_item(item, Numbers::Exact, out),
            ValueFormat::Typed => typed::write_item(item, out),
        }
    }

    /// Appends one value in this format (plain form of a value, or its attribute JSON).
    pub fn write_value(self, value: &Value, out: &mut Vec<u8>) {
        match self {
            ValueFormat::Plain => plain::write_value(value, Numbers::Doubles, out),
            ValueFormat::PlainExact => plain::write_value(value, Numbers::Exact, out),
            ValueFormat::Typed => typed::write_value(value, out),
        }
    }

    /// The config spelling: `"plain"` (for [`ValueFormat::PlainExact`] too) or `"typed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ValueFormat::Plain | ValueFormat::PlainExact => "plain",
            ValueFormat::Typed => "typed",
        }
    }
}

impl fmt::Display for ValueFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_is_the_default_format() {
        assert_eq!(ValueFormat::default(), ValueFormat::Plain);
    }

    #[test]
    fn formats_are_spelled_as_in_the_config() {
        assert_eq!(ValueFormat::Plain.as_str(), "plain");
        assert_eq!(ValueFormat::PlainExact.as_str(), "plain");
        assert_eq!(ValueFormat::Typed.to_string(), "typed");
    }
}
