//! Differential property test of the data plane's decoder: random items as DynamoDB sends them
//! (attribute JSON, keys in any order, strings escaped or not) give byte for byte the output of
//! the value-tree path, in both formats.

use ddbpipe_value::{ValueFormat, item_from_typed_json, write_wire_item};
use proptest::prelude::*;

use strategies::{item, wire_item};

mod strategies;

/// The value-tree path: the wire JSON decoded into an item, then written.
fn through_values(wire: &str, format: ValueFormat) -> Vec<u8> {
    let json: serde_json::Value = serde_json::from_str(wire).expect("the wire JSON parses");
    let item = item_from_typed_json(&json, "item").expect("the wire JSON is attribute JSON");
    let mut out = Vec::new();
    format.write_item(&item, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_wire_decoder_writes_the_bytes_of_the_value_tree_path(
        item in item(),
        reversed in any::<bool>(),
    ) {
        let wire = wire_item(&item, reversed);
        for format in [ValueFormat::Plain, ValueFormat::PlainExact, ValueFormat::Typed] {
            let mut out = Vec::new();
            write_wire_item(wire.as_bytes(), format, &mut out).unwrap();
            prop_assert_eq!(
                String::from_utf8(out).unwrap(),
                String::from_utf8(through_values(&wire, format)).unwrap(),
                "{} {}", format, wire
            );
        }
    }
}
