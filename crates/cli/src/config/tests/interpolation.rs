//! `${…}` interpolation: variables, defaults, types, keys.

use super::*;

#[test]
fn interpolation_substitutes_variables_and_defaults() {
    let config = parse_ok(
        "name: ${TABLE}-export
source:
  table_name: ${TABLE}
  region: ${REGION:-eu-west-1}
  filter_expression: price > $${cheap}
  segments: ${SEGMENTS}
  consistent_read: ${FLAG}
  index_name: ${UNSET_INDEX:-}
sink: {type: jsonl}
",
    );
    assert_eq!(config.name, "orders-export");
    assert_eq!(config.source.table_name, "orders");
    assert_eq!(config.source.region.as_deref(), Some("eu-west-1"));
    assert_eq!(
        config.source.filter_expression.as_deref(),
        Some("price > ${cheap}")
    );
    assert_eq!(config.source.segments, 8);
    assert!(config.source.consistent_read);
    assert_eq!(config.source.index_name, None);
}

#[test]
fn a_number_from_a_variable_is_still_text_where_a_string_is_expected() {
    let config = parse_ok(
        "name: t
source:
  table_name: ${NUMERIC_TABLE}
  credentials: {type: access_key, config: {access_key_id: '${SEGMENTS}', secret_access_key: '${SEGMENTS}'}}
  expression_attribute_values: {':n': '${SEGMENTS}'}
  expression_attribute_values_typed: {':big': {N: '${BIG}'}}
sink: {type: jsonl}
",
    );
    let source = config.source;
    assert_eq!(source.table_name, "2024");
    let Credentials::AccessKey {
        access_key_id,
        secret_access_key,
        ..
    } = &source.credentials
    else {
        panic!("{:?}", source.credentials);
    };
    assert_eq!(
        (access_key_id.as_str(), secret_access_key.expose()),
        ("8", "8")
    );
    assert_eq!(
        source.expression_attribute_values[":n"],
        AttributeValue::N(Number::new("8"))
    );
    assert_eq!(
        source.expression_attribute_values_typed[":big"],
        AttributeValue::N(Number::new("123456789012345678901234567"))
    );
}

#[test]
fn an_unset_variable_is_an_error_naming_the_variable_and_the_path() {
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: '${NO_TABLE}', segments: '${NO_SEGMENTS}'}\nsink: {type: jsonl}\n"
        ),
        [
            "config error: source.table_name: environment variable NO_TABLE is not set (write \
             ${NO_TABLE:-default} to give a default)",
            "config error: source.segments: environment variable NO_SEGMENTS is not set (write \
             ${NO_SEGMENTS:-default} to give a default)",
        ]
    );
}

#[test]
fn keys_are_never_interpolated() {
    assert_eq!(
        errors("name: t\nsource: {table_name: o, '${TABLE}': 1}\nsink: {type: jsonl}\n"),
        ["config error: source.${TABLE}: unknown field"]
    );
    let source = source_of("expression_attribute_names: {'#${TABLE}': '${TABLE}'}");
    assert_eq!(
        source.expression_attribute_names,
        BTreeMap::from([("#${TABLE}".to_owned(), "orders".to_owned())])
    );
}

#[test]
fn interpolation_happens_before_type_checking() {
    assert_eq!(
        source_errors("segments: ${FLAG}"),
        ["config error: source.segments: expected a whole number, found boolean true"]
    );
    assert_eq!(
        source_errors("segments: x${SEGMENTS}"),
        ["config error: source.segments: expected a whole number, found string \"x8\""]
    );
}
