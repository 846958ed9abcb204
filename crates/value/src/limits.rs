//! DynamoDB's own limits on what an item may hold, for data that did not come straight from
//! DynamoDB's API (an export's files): a number's digits and range, and an item's size.
//!
//! # Rules
//! 1. A number is the text of rule 1 of docs/values.md §3.2 with at most 38 significant
//!    digits and, unless it is zero, a magnitude from 1E-130 to
//!    9.9999999999999999999999999999999999999E+125.
//! 2. An item is at most 400 KB (409 600 bytes) as DynamoDB counts it: the UTF-8 bytes of
//!    every attribute name and string, the bytes of every binary, one byte per two significant
//!    digits of a number (plus one), one byte for a BOOL or NULL, three bytes for a list or
//!    map plus one per element. [`ItemSize`] counts that (a number's byte is left out, so the
//!    count never exceeds DynamoDB's and a real item is never refused).

use crate::number::significant;
use crate::{Item, Value};

/// DynamoDB's largest item, in bytes.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Most significant digits of a DynamoDB number.
const MAX_DIGITS: usize = 38;
/// Exponent of the largest magnitude (9.99…E+125) and of the smallest (1E-130).
const MAX_EXPONENT: i128 = 125;
const MIN_EXPONENT: i128 = -130;

/// Why a number's text is not a DynamoDB number (rule 1), for the error line.
pub fn check_number(text: &str) -> Result<(), String> {
    match number_problem(text) {
        None => Ok(()),
        Some(NumberProblem::NotANumber) => Err(format!("N value {text:?} is not a number")),
        Some(NumberProblem::TooManyDigits(digits)) => Err(format!(
            "N value {text:?} has {digits} significant digits; DynamoDB keeps at most 38"
        )),
        Some(NumberProblem::OutOfRange) => Err(format!(
            "N value {text:?} is outside DynamoDB's range (magnitude 1E-130 to \
             9.9999999999999999999999999999999999999E+125)"
        )),
    }
}

/// What keeps a text from being a DynamoDB number (rule 1), without the text itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumberProblem {
    /// The text is not a number at all.
    NotANumber,
    /// More significant digits than DynamoDB's 38 (how many).
    TooManyDigits(usize),
    /// A magnitude below 1E-130 or from 1E+126 on.
    OutOfRange,
}

/// The problem of rule 1 with `text`, `None` for a DynamoDB number.
pub(crate) fn number_problem(text: &str) -> Option<NumberProblem> {
    let Some((digits, exponent)) = significant(text) else {
        return Some(NumberProblem::NotANumber);
    };
    if digits == 0 {
        return None;
    }
    // The leading digit's power of ten.
    let magnitude = exponent + digits as i128 - 1;
    if digits > MAX_DIGITS {
        return Some(NumberProblem::TooManyDigits(digits));
    }
    if !(MIN_EXPONENT..=MAX_EXPONENT).contains(&magnitude) {
        return Some(NumberProblem::OutOfRange);
    }
    None
}

/// The bytes DynamoDB counts of a number of `digits` significant digits, at least (rule 2).
pub(crate) fn number_bytes(text: &str) -> usize {
    significant(text).map_or(0, |(digits, _)| digits / 2)
}

/// An item's size as DynamoDB counts it, never more (rule 2), added up value by value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemSize(pub usize);

impl ItemSize {
    /// The size of `item`.
    pub fn of(item: &Item) -> Self {
        let mut size = ItemSize(0);
        for (name, value) in item {
            size.0 += name.len();
            size.add(value);
        }
        size
    }

    fn add(&mut self, value: &Value) {
        self.0 += match value {
            Value::S(text) => text.len(),
            Value::N(number) => number_bytes(number.as_str()),
            Value::B(bytes) => bytes.len(),
            Value::Bool(_) | Value::Null => 1,
            Value::M(map) => {
                for (name, value) in map {
                    self.0 += name.len() + 1;
                    self.add(value);
                }
                3
            }
            Value::L(values) => {
                for value in values {
                    self.0 += 1;
                    self.add(value);
                }
                3
            }
            Value::Ss(texts) => texts.iter().map(String::len).sum(),
            Value::Ns(numbers) => numbers.iter().map(|n| number_bytes(n.as_str())).sum(),
            Value::Bs(blobs) => blobs.iter().map(Vec::len).sum(),
        };
    }

    /// The problem when the size is over DynamoDB's limit.
    pub fn check(self) -> Result<(), String> {
        if self.0 > MAX_ITEM_BYTES {
            return Err(format!(
                "the item is at least {} bytes, over DynamoDB's limit of 400 KB",
                self.0
            ));
        }
        Ok(())
    }
}

/// Every number of `item` (rule 1) and its size (rule 2).
pub fn check_item(item: &Item) -> Result<(), String> {
    fn numbers(value: &Value) -> Result<(), String> {
        match value {
            Value::N(number) => check_number(number.as_str()),
            Value::Ns(set) => set.iter().try_for_each(|n| check_number(n.as_str())),
            Value::M(map) => map.values().try_for_each(numbers),
            Value::L(values) => values.iter().try_for_each(numbers),
            _ => Ok(()),
        }
    }
    item.values().try_for_each(numbers)?;
    ItemSize::of(item).check()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Number;

    #[test]
    fn dynamodb_numbers_pass_and_others_are_named() {
        for ok in [
            "0",
            "-0.000",
            "12.50",
            "1E-130",
            "9.9999999999999999999999999999999999999E+125",
            "-9.9999999999999999999999999999999999999E+125",
            "12345678901234567890123456789012345678",
            "1000000000000000000000000000000000000000000",
        ] {
            assert_eq!(check_number(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("abc", "is not a number"),
            ("", "is not a number"),
            ("1e999", "outside DynamoDB's range"),
            ("1E+126", "outside DynamoDB's range"),
            ("1E-131", "outside DynamoDB's range"),
            (
                "123456789012345678901234567890123456789",
                "39 significant digits",
            ),
        ] {
            let problem = check_number(bad).unwrap_err();
            assert!(problem.contains(says), "{bad}: {problem}");
        }
    }

    #[test]
    fn an_item_over_400_kb_is_refused_and_one_at_the_limit_is_not() {
        let name = "pk".to_string();
        let at_limit = Item::from([(name.clone(), Value::S("x".repeat(MAX_ITEM_BYTES - 2)))]);
        assert_eq!(check_item(&at_limit), Ok(()));
        let over = Item::from([(name, Value::S("x".repeat(MAX_ITEM_BYTES - 1)))]);
        assert!(check_item(&over).unwrap_err().contains("400 KB"));
        let bad = Item::from([(
            "m".to_string(),
            Value::M(Item::from([(
                "n".to_string(),
                Value::N(Number::new("1e999")),
            )])),
        )]);
        assert!(check_item(&bad).unwrap_err().contains("1e999"));
    }
}
