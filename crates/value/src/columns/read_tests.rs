//! Tests of `ColumnReader` (rules 1–3): paths through typed, plain and plain-exact documents.

use super::*;
use crate::columns::{ColumnPath, ColumnType, TimeFormat};

fn column(path: &str, kind: ColumnType) -> ColumnSpec {
    ColumnSpec {
        name: path.to_owned(),
        path: ColumnPath::parse(path).unwrap(),
        kind,
        time_format: TimeFormat::Iso8601,
    }
}

/// Reads `paths` as `kind` out of `document`.
fn read(
    format: ValueFormat,
    document: &str,
    paths: &[(&str, ColumnType)],
) -> Vec<Result<ColumnValue, Mismatch>> {
    let columns = paths
        .iter()
        .map(|(path, kind)| column(path, *kind))
        .collect();
    ColumnReader::new(columns, format).read(document).unwrap()
}

fn text(value: &str) -> Result<ColumnValue, Mismatch> {
    Ok(ColumnValue::Text(value.to_owned()))
}

fn mismatch(found: &'static str, why: &str) -> Result<ColumnValue, Mismatch> {
    Err(Mismatch::new(found, why.to_owned()))
}

const TYPED: &str = r#"{
    "pk": {"S": "order-1"},
    "address": {"M": {"city": {"S": "Lyon"}, "zip": {"NULL": true}, "a.b": {"S": "dotted"}}},
    "lines": {"L": [{"M": {"sku": {"S": "x1"}, "qty": {"N": "2"}}}, {"NULL": true}]},
    "tags": {"SS": ["red", "blue"]},
    "total": {"N": "12345678901234567890123456789012345678"},
    "name": {"S": "12"},
    "gone": {"NULL": true},
    "junk": {"Q": 1}
}"#;

#[test]
fn paths_reach_into_maps_and_lists_of_a_typed_document() {
    use ColumnType::{Bigint, Numeric, Text};
    let values = read(
        ValueFormat::Typed,
        TYPED,
        &[
            ("pk", Text),
            ("address.city", Text),
            ("\"address\".\"a.b\"", Text),
            ("lines[0].sku", Text),
            ("lines[0].qty", Bigint),
            ("total", Numeric),
            ("address.country", Text),
            ("address.zip", Text),
            ("lines[5].sku", Text),
            ("lines[1].sku", Text),
            ("gone.deeper[3]", Text),
            ("absent", Text),
            ("absent.deeper", Text),
        ],
    );
    assert_eq!(
        values,
        [
            text("order-1"),
            text("Lyon"),
            text("dotted"),
            text("x1"),
            Ok(ColumnValue::Bigint(2)),
            Ok(ColumnValue::Numeric(
                "12345678901234567890123456789012345678".to_owned()
            )),
            Ok(ColumnValue::Null),
            Ok(ColumnValue::Null),
            Ok(ColumnValue::Null),
            Ok(ColumnValue::Null),
            Ok(ColumnValue::Null),
            Ok(ColumnValue::Null),
            Ok(ColumnValue::Null),
        ]
    );
}

#[test]
fn a_step_into_the_wrong_type_is_a_mismatch() {
    use ColumnType::Text;
    let values = read(
        ValueFormat::Typed,
        TYPED,
        &[
            ("pk.part", Text),
            ("pk[0]", Text),
            ("tags[0]", Text),
            ("tags.red", Text),
            ("address[0]", Text),
            ("lines.sku", Text),
            ("lines[0].sku.\"a b\"", Text),
        ],
    );
    assert_eq!(
        values,
        [
            mismatch("S", "an S is not a map: .part cannot read it"),
            mismatch("S", "an S is not a list: [0] cannot index it"),
            mismatch("SS", "an SS has no order: [0] cannot index it"),
            mismatch("SS", "an SS is not a map: .red cannot read it"),
            mismatch("M", "an M is not a list: [0] cannot index it"),
            mismatch("L", "an L is not a map: .sku cannot read it"),
            mismatch("S", "an S is not a map: .a b cannot read it"),
        ]
    );
}

#[test]
fn a_typed_document_s_strings_are_never_numbers() {
    let values = read(
        ValueFormat::Typed,
        TYPED,
        &[("name", ColumnType::Bigint), ("name", ColumnType::Text)],
    );
    assert_eq!(values, [mismatch("S", "an S is not a number"), text("12")]);
}

#[test]
fn a_typed_attribute_that_is_not_attribute_json_is_an_error_only_where_a_path_goes() {
    let reader = |path| ColumnReader::new(vec![column(path, ColumnType::Text)], ValueFormat::Typed);
    assert!(reader("pk").read(TYPED).is_ok(), "junk is not read");
    assert_eq!(
        reader("junk").read(TYPED),
        Err("malformed typed attribute value at junk: unknown type tag \"Q\"".to_owned())
    );
    let plain_in_typed = reader("pk").read(r#"{"pk":"order-1"}"#).unwrap_err();
    assert!(plain_in_typed.contains("at pk: expected an object with one type tag"));
    let bad_base64 = reader("b").read(r#"{"b":{"B":"c2VjcmV0"}}"#);
    assert_eq!(bad_base64, Ok(vec![text("c2VjcmV0")]));
    let bad_base64 = reader("b").read(r#"{"b":{"B":"c2VjcmV0!"}}"#).unwrap_err();
    assert!(!bad_base64.contains("c2VjcmV0"), "{bad_base64}");
}

const PLAIN: &str = r#"{
    "pk": "order-1",
    "address": {"city": "Lyon", "zip": null},
    "lines": [{"sku": "x1", "qty": 2}, null],
    "tags": ["red", "blue"],
    "total": "12345678901234567890123456789012345678",
    "price": 12.5,
    "exact": 12.50,
    "flag": true,
    "when": "2024-05-01T12:30:00Z",
    "epoch": "1714566600123.457",
    "deep": {"a": [1, {"b": [true, "x", 1E-130]}]},
    "skipped": [1e999999, {"x": [1, 2, 3]}]
}"#;

#[test]
fn a_plain_document_is_read_as_json_with_every_number_s_digits() {
    use ColumnType::{Bigint, Boolean, Double, Jsonb, Numeric, Text, Timestamptz};
    let mut epoch = column("epoch", Timestamptz);
    epoch.time_format = TimeFormat::EpochMillis;
    let mut columns: Vec<ColumnSpec> = [
        ("pk", Text),
        ("address.city", Text),
        ("address.zip", Text),
        ("lines[0].qty", Bigint),
        ("lines[1].qty", Bigint),
        ("tags[1]", Text),
        ("total", Numeric),
        ("total", Double),
        ("price", Double),
        ("exact", Numeric),
        ("exact", Text),
        ("flag", Boolean),
        ("when", Timestamptz),
        ("deep", Jsonb),
        ("deep.a[1].b[2]", Numeric),
        ("address", Text),
    ]
    .into_iter()
    .map(|(path, kind)| column(path, kind))
    .collect();
    columns.push(epoch);
    for format in [ValueFormat::Plain, ValueFormat::PlainExact] {
        let values = ColumnReader::new(columns.clone(), format)
            .read(PLAIN)
            .unwrap();
        assert_eq!(
            values,
            [
                text("order-1"),
                text("Lyon"),
                Ok(ColumnValue::Null),
                Ok(ColumnValue::Bigint(2)),
                Ok(ColumnValue::Null),
                text("blue"),
                Ok(ColumnValue::Numeric(
                    "12345678901234567890123456789012345678".to_owned()
                )),
                mismatch(
                    "N",
                    "an N with 38 significant digits is more than a double holds (17 at most)"
                ),
                Ok(ColumnValue::Double(12.5)),
                Ok(ColumnValue::Numeric("12.50".to_owned())),
                text("12.50"),
                Ok(ColumnValue::Boolean(true)),
                Ok(ColumnValue::Timestamp(1_714_566_600_000_000)),
                Ok(ColumnValue::Json(
                    r#"{"a":[1,{"b":[true,"x",1E-130]}]}"#.to_owned()
                )),
                Ok(ColumnValue::Numeric("1E-130".to_owned())),
                mismatch("M", "an M has no text form (a jsonb column takes it)"),
                Ok(ColumnValue::Timestamp(1_714_566_600_123_457)),
            ],
            "{format:?}"
        );
    }
}

#[test]
fn a_38_digit_number_in_a_plain_exact_document_keeps_its_digits() {
    let document = r#"{"n": -9.9999999999999999999999999999999999999E+125, "m": {"k": 12345678901234567890123456789012345678}}"#;
    let values = read(
        ValueFormat::PlainExact,
        document,
        &[
            ("n", ColumnType::Numeric),
            ("m.k", ColumnType::Numeric),
            ("m", ColumnType::Jsonb),
            ("m.k", ColumnType::Text),
        ],
    );
    assert_eq!(
        values,
        [
            Ok(ColumnValue::Numeric(
                "-9.9999999999999999999999999999999999999E+125".to_owned()
            )),
            Ok(ColumnValue::Numeric(
                "12345678901234567890123456789012345678".to_owned()
            )),
            Ok(ColumnValue::Json(
                r#"{"k":12345678901234567890123456789012345678}"#.to_owned()
            )),
            text("12345678901234567890123456789012345678"),
        ]
    );
}

#[test]
fn strings_with_escapes_and_repeated_names_read_as_json_reads_them() {
    let document = r#"{"s": "a\"b\u00e9\n", "m": {"k": 1, "k": 2}, "s2": "x", "s2": "y"}"#;
    let values = read(
        ValueFormat::Plain,
        document,
        &[
            ("s", ColumnType::Text),
            ("m.k", ColumnType::Bigint),
            ("s2", ColumnType::Text),
        ],
    );
    assert_eq!(
        values,
        [text("a\"bé\n"), Ok(ColumnValue::Bigint(2)), text("y")]
    );
}

#[test]
fn a_document_that_is_not_a_json_object_is_an_error_that_does_not_quote_it() {
    let reader = ColumnReader::new(vec![column("pk", ColumnType::Text)], ValueFormat::Plain);
    let cases = [
        (
            r#""secret""#,
            "the document is not a JSON object (line 1, column 8)",
        ),
        (
            "[1, 2]",
            "the document is not a JSON object (line 1, column 0)",
        ),
        (
            r#"{"pk": "secret""#,
            "the document ends before its JSON does (line 1, column 15)",
        ),
        (
            r#"{"pk": secret}"#,
            "the document is not valid JSON (line 1, column 8)",
        ),
        (
            r#"{"pk": "a"} "secret""#,
            "the document is not valid JSON (line 1, column 13)",
        ),
    ];
    for (document, error) in cases {
        assert_eq!(reader.read(document), Err(error.to_owned()), "{document}");
    }
    let typed = ColumnReader::new(vec![column("pk", ColumnType::Text)], ValueFormat::Typed);
    assert_eq!(
        typed.read("7"),
        Err("the document is not a JSON object (line 1, column 1)".to_owned())
    );
}

#[test]
fn columns_sharing_an_attribute_answer_in_column_order() {
    let columns = vec![
        column("b", ColumnType::Text),
        column("a.x", ColumnType::Text),
        column("b", ColumnType::Jsonb),
        column("a", ColumnType::Jsonb),
    ];
    let reader = ColumnReader::new(columns.clone(), ValueFormat::Typed);
    assert_eq!(reader.columns(), columns);
    assert_eq!(reader.roots, ["b", "a"]);
    assert_eq!(reader.root_of, [0, 1, 0, 1]);
    let values = reader
        .read(r#"{"a":{"M":{"x":{"S":"1"}}},"b":{"S":"2"}}"#)
        .unwrap();
    assert_eq!(
        values,
        [
            text("2"),
            text("1"),
            Ok(ColumnValue::Json(r#""2""#.to_owned())),
            Ok(ColumnValue::Json(r#"{"x":"1"}"#.to_owned())),
        ]
    );
}

#[test]
fn a_reader_without_columns_still_checks_the_document() {
    let reader = ColumnReader::new(Vec::new(), ValueFormat::Plain);
    assert_eq!(reader.read(r#"{"a":1}"#), Ok(Vec::new()));
    assert!(reader.read("[]").is_err());
}
