//! Expression attribute values, plain and typed, with every digit.

use super::*;

#[test]
fn expression_values_are_converted_plain_and_typed() {
    let source = source_of(
        "mode: query
key_condition_expression: pk = :pk
expression_attribute_names: {'#s': status}
expression_attribute_values:
  ':pk': a
  ':n': 42
  ':f': 1.5
  ':t': true
  ':z': null
  ':l': [1, x]
  ':m': {k: -3}
expression_attribute_values_typed:
  ':b': {B: AQI=}
  ':ss': {SS: [x, y]}
",
    );
    let n = |text: &str| AttributeValue::N(Number::new(text));
    let plain = BTreeMap::from([
        (":pk".to_owned(), AttributeValue::S("a".into())),
        (":n".to_owned(), n("42")),
        (":f".to_owned(), n("1.5")),
        (":t".to_owned(), AttributeValue::Bool(true)),
        (":z".to_owned(), AttributeValue::Null),
        (
            ":l".to_owned(),
            AttributeValue::L(vec![n("1"), AttributeValue::S("x".into())]),
        ),
        (
            ":m".to_owned(),
            AttributeValue::M(BTreeMap::from([("k".to_owned(), n("-3"))])),
        ),
    ]);
    assert_eq!(source.expression_attribute_values, plain);
    let typed = BTreeMap::from([
        (":b".to_owned(), AttributeValue::B(vec![1, 2])),
        (
            ":ss".to_owned(),
            AttributeValue::Ss(vec!["x".into(), "y".into()]),
        ),
    ]);
    assert_eq!(source.expression_attribute_values_typed, typed);
    let merged = source.merged_expression_values();
    assert_eq!(merged.len(), 9);
    assert_eq!(merged[":b"], AttributeValue::B(vec![1, 2]));
    assert_eq!(merged[":n"], n("42"));
}

#[test]
fn a_typed_value_that_does_not_decode_names_the_key_and_the_problem() {
    let lines = source_errors("expression_attribute_values_typed: {':k': {N: 1}, ':b': {X: a}}");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with(
        "config error: source.expression_attribute_values_typed.:k: malformed typed attribute \
         value: "
    ));
    assert!(lines[1].starts_with(
        "config error: source.expression_attribute_values_typed.:b: malformed typed attribute \
         value: "
    ));
    assert_eq!(
        source_errors("expression_attribute_values: {':x': .nan}"),
        [
            "config error: source.expression_attribute_values.:x: expected a finite number, found \
          number .nan"
        ]
    );
}

#[test]
fn plain_expression_numbers_are_sent_with_every_digit_of_their_text() {
    let source = source_of(
        "expression_attribute_values:\n  ':a': 123456789.123456789\n  ':b': 1.00000000000000001\n  \
         ':c': [1e3, {d: -0.000000000000000000001}]\n  ':e': 7\n  ':f': +2.50",
    );
    let values = &source.expression_attribute_values;
    let n = |text: &str| AttributeValue::N(Number::new(text));
    assert_eq!(values[":a"], n("123456789.123456789"));
    assert_eq!(values[":b"], n("1.00000000000000001"));
    assert_eq!(
        values[":c"],
        AttributeValue::L(vec![
            n("1e3"),
            AttributeValue::M([("d".to_string(), n("-0.000000000000000000001"))].into()),
        ])
    );
    assert_eq!(values[":e"], n("7"));
    assert_eq!(values[":f"], n("2.50"));
    // From `${…}` the substituted text is used.
    let config = parse(
        &with_source("expression_attribute_values: {':v': '${V}'}"),
        Path::new(""),
        &|name| (name == "V").then(|| "1.00000000000000001".to_string()),
    )
    .unwrap();
    assert_eq!(
        config.source.expression_attribute_values[":v"],
        n("1.00000000000000001")
    );
}

#[test]
fn a_plain_number_that_cannot_be_sent_exactly_is_refused_pointing_at_the_typed_map() {
    let lines = source_errors(
        "expression_attribute_values: {':big': 123456789012345678901234567890123456789012}",
    );
    assert_eq!(
        lines,
        ["config error: source.expression_attribute_values.:big: \
             123456789012345678901234567890123456789012 has 42 significant digits and DynamoDB \
             numbers have at most 38; write it as text in expression_attribute_values_typed, \
             e.g. {\":v\": {N: \"12.5\"}}"]
    );
    let lines = source_errors("expression_attribute_values: {':wide': 99999999999999999999}");
    assert_eq!(
        lines,
        [
            "config error: source.expression_attribute_values.:wide: the integer \
             99999999999999999999 is wider than 64 bits, which plain YAML values cannot hold; \
             write it as text in expression_attribute_values_typed, e.g. {\":v\": {N: \
             \"99999999999999999999\"}}"
        ]
    );
}
