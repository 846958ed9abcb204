//! Random attribute values for the property tests: texts with escapes and non-ASCII, number
//! texts of every shape, binary, and nested lists and maps; and their DynamoDB wire form. Shared
//! by the value crate's tests and, by path, by the source crate's wire tests.

// Each test binary uses a different subset of these.
#![allow(dead_code)]

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ddbpipe_value::{Item, Number, Value};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]{0,3}",
        "[\\x00-\\x1f\"\\\\/a\\x7f]{0,4}",
        any::<String>(),
    ]
}

/// Number texts of every shape: structured decimals with signs, leading zeros, points,
/// exponents and whitespace; texts of doubles and of integers near the 64-bit limits; junk.
pub fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[ \t\n]{0,2}[+-]?0{0,3}[0-9]{0,22}(\\.[0-9]{0,22})?([eE][+-]?0{0,2}[0-9]{1,3})?[ \t\n]{0,2}",
        2 => "[+-]?[0-9]{1,17}(\\.[0-9]{1,17})?([eE][+-]?[0-9]{1,3})?",
        2 => any::<f64>().prop_flat_map(|double| {
            prop_oneof![
                Just(double.to_string()),
                Just(format!("{double:e}")),
                Just(format!("{double:E}")),
                Just(format!("{double:?}")),
            ]
        }),
        1 => (0u64..2048).prop_map(|below| (u64::MAX - below).to_string()),
        1 => (0i64..2048).prop_map(|above| (i64::MIN + above).to_string()),
        1 => (any::<u128>(), 0u32..4).prop_map(|(value, shift)| (value >> (shift * 32)).to_string()),
        1 => "[-+0-9eE. x]{0,12}",
        1 => "[0-9]{1,3}[eE][+-]?[0-9]{18,21}",
    ]
}

pub fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..8)
}

pub fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        text().prop_map(Value::S),
        number_text().prop_map(|text| Value::N(Number::new(text))),
        bytes().prop_map(Value::B),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
        vec(text(), 0..4).prop_map(Value::Ss),
        vec(number_text().prop_map(Number::new), 0..4).prop_map(Value::Ns),
        vec(bytes(), 0..4).prop_map(Value::Bs),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::L),
            btree_map(text(), inner, 0..4).prop_map(Value::M),
        ]
    })
}

pub fn item() -> impl Strategy<Value = Item> {
    btree_map(text(), value(), 0..6)
}

// ---- DynamoDB's wire form ----

/// Appends `value` as DynamoDB attribute JSON, map entries in reverse order when `reversed`.
pub fn wire_value(value: &Value, reversed: bool, out: &mut String) {
    let text = |text: &str| serde_json::to_string(text).expect("a string serializes");
    let texts = |texts: &mut dyn Iterator<Item = String>| texts.collect::<Vec<_>>().join(",");
    let base64 = |bytes: &[u8]| text(&STANDARD.encode(bytes));
    let (tag, payload) = match value {
        Value::S(s) => ("S", text(s)),
        Value::N(n) => ("N", text(n.as_str())),
        Value::B(b) => ("B", base64(b)),
        Value::Bool(flag) => ("BOOL", flag.to_string()),
        Value::Null => ("NULL", "true".to_owned()),
        Value::M(item) => ("M", wire_item(item, reversed)),
        Value::L(values) => {
            let mut list = Vec::new();
            for value in values {
                let mut element = String::new();
                wire_value(value, reversed, &mut element);
                list.push(element);
            }
            ("L", format!("[{}]", list.join(",")))
        }
        Value::Ss(ss) => (
            "SS",
            format!("[{}]", texts(&mut ss.iter().map(|s| text(s)))),
        ),
        Value::Ns(ns) => (
            "NS",
            format!("[{}]", texts(&mut ns.iter().map(|n| text(n.as_str())))),
        ),
        Value::Bs(bs) => (
            "BS",
            format!("[{}]", texts(&mut bs.iter().map(|b| base64(b)))),
        ),
    };
    out.push_str(&format!("{{\"{tag}\": {payload}}}"));
}

pub fn wire_item(item: &Item, reversed: bool) -> String {
    let mut entries: Vec<String> = item
        .iter()
        .map(|(name, value)| {
            let mut entry = serde_json::to_string(name).expect("a string serializes");
            entry.push(':');
            wire_value(value, reversed, &mut entry);
            entry
        })
        .collect();
    if reversed {
        entries.reverse();
    }
    format!("{{{}}}", entries.join(", "))
}
