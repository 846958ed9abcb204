//! Identifiers with their own types: a shard id cannot go where a sequence number goes, and
//! ordering is defined once.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A stream shard id, e.g. `shardId-00000001700000000000-0123abcd`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShardId(String);

impl ShardId {
    /// A shard id as DynamoDB Streams reported it.
    pub fn new(id: impl Into<String>) -> Self {
        ShardId(id.into())
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stream record's sequence number: 21 to 40 decimal digits, too long for `u128`.
/// `Ord` compares length, then digits (numeric order for numbers without leading zeros).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SequenceNumber(String);

/// A sequence number that is not a non-empty string of ASCII digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a sequence number (decimal digits)")]
pub struct BadSequenceNumber(pub String);

impl SequenceNumber {
    /// Parses a sequence number: one or more ASCII digits.
    pub fn parse(text: &str) -> Result<Self, BadSequenceNumber> {
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            Ok(SequenceNumber(text.to_string()))
        } else {
            Err(BadSequenceNumber(text.to_string()))
        }
    }

    /// The digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SequenceNumber {
    type Error = BadSequenceNumber;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        SequenceNumber::parse(&text)
    }
}

impl From<SequenceNumber> for String {
    fn from(seq: SequenceNumber) -> String {
        seq.0
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        let a = self.0.trim_start_matches('0');
        let b = other.0.trim_start_matches('0');
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_order_by_length_then_digits() {
        let a = SequenceNumber::parse("9").unwrap();
        let b = SequenceNumber::parse("10").unwrap();
        let c = SequenceNumber::parse("49600000000000000000000000000000000000001").unwrap();
        assert!(a < b && b < c);
        assert!(SequenceNumber::parse("").is_err());
        assert!(SequenceNumber::parse("12a").is_err());
    }
}
