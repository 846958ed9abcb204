//! Tests of `convert` (rule 4): every DynamoDB type in every column type, then each column
//! type's edges.

use proptest::prelude::*;

use super::*;
use crate::{Item, Number};

fn n(text: &str) -> Value {
    Value::N(Number::new(text))
}

fn s(text: &str) -> Value {
    Value::S(text.to_owned())
}

/// `convert` with the default time format.
fn to(value: &Value, kind: ColumnType) -> Result<ColumnValue, Mismatch> {
    convert(value, kind, TimeFormat::Iso8601)
}

/// The reason of a mismatch, checking that it names the value's own type.
fn why(value: &Value, kind: ColumnType, time_format: TimeFormat) -> String {
    let mismatch = convert(value, kind, time_format).unwrap_err();
    assert_eq!(mismatch.found, value.type_tag(), "{value:?} as {kind}");
    mismatch.why
}

/// What a row of the table expects of one column type: a value or a mismatch's reason.
enum Want {
    Is(ColumnValue),
    Not(&'static str),
}

use Want::{Is, Not};

fn text(value: &str) -> Want {
    Is(ColumnValue::Text(value.to_owned()))
}

fn json(value: &str) -> Want {
    Is(ColumnValue::Json(value.to_owned()))
}

#[test]
fn every_dynamodb_type_in_every_column_type() {
    const NOT_A_NUMBER: [&str; 10] = [
        "an S is not a number",
        "",
        "a B is not a number",
        "a BOOL is not a number",
        "",
        "an M is not a number",
        "an L is not a number",
        "an SS is not a number",
        "an NS is not a number",
        "a BS is not a number",
    ];
    let map = Value::M(Item::from([
        ("b".to_owned(), s("x")),
        ("a".to_owned(), n("12345678901234567890123456789012345678")),
    ]));
    // Columns: text, numeric, bigint, double, boolean, timestamptz (iso8601), jsonb.
    let rows: Vec<(Value, [Want; 7])> = vec![
        (
            s("hello"),
            [
                text("hello"),
                Not(NOT_A_NUMBER[0]),
                Not(NOT_A_NUMBER[0]),
                Not(NOT_A_NUMBER[0]),
                Not("an S is not a boolean"),
                Not("an S that is not an ISO 8601 time"),
                json(r#""hello""#),
            ],
        ),
        (
            n("12.50"),
            [
                text("12.50"),
                Is(ColumnValue::Numeric("12.50".to_owned())),
                Not("an N with a fraction is not an integer"),
                Is(ColumnValue::Double(12.5)),
                Not("an N is not a boolean"),
                Not(
                    "an N is not an ISO 8601 time (format epoch_seconds or epoch_millis reads numbers)",
                ),
                json("12.50"),
            ],
        ),
        (
            Value::B(vec![1, 2]),
            [
                text("AQI="),
                Not(NOT_A_NUMBER[2]),
                Not(NOT_A_NUMBER[2]),
                Not(NOT_A_NUMBER[2]),
                Not("a B is not a boolean"),
                Not("a B is not an ISO 8601 time"),
                json(r#""AQI=""#),
            ],
        ),
        (
            Value::Bool(true),
            [
                text("true"),
                Not(NOT_A_NUMBER[3]),
                Not(NOT_A_NUMBER[3]),
                Not(NOT_A_NUMBER[3]),
                Is(ColumnValue::Boolean(true)),
                Not("a BOOL is not an ISO 8601 time"),
                json("true"),
            ],
        ),
        (
            Value::Null,
            [
                Is(ColumnValue::Null),
                Is(ColumnValue::Null),
                Is(ColumnValue::Null),
                Is(ColumnValue::Null),
                Is(ColumnValue::Null),
                Is(ColumnValue::Null),
                Is(ColumnValue::Null),
            ],
        ),
        (
            map,
            [
                Not("an M has no text form (a jsonb column takes it)"),
                Not(NOT_A_NUMBER[5]),
                Not(NOT_A_NUMBER[5]),
                Not(NOT_A_NUMBER[5]),
                Not("an M is not a boolean"),
                Not("an M is not an ISO 8601 time"),
                json(r#"{"a":12345678901234567890123456789012345678,"b":"x"}"#),
            ],
        ),
        (
            Value::L(vec![s("x"), n("1E-130"), Value::Null, Value::Bool(false)]),
            [
                Not("an L has no text form (a jsonb column takes it)"),
                Not(NOT_A_NUMBER[6]),
                Not(NOT_A_NUMBER[6]),
                Not(NOT_A_NUMBER[6]),
                Not("an L is not a boolean"),
                Not("an L is not an ISO 8601 time"),
                json(r#"["x",1E-130,null,false]"#),
            ],
        ),
        (
            Value::Ss(vec!["b".to_owned(), "a".to_owned()]),
            [
                Not("an SS has no text form (a jsonb column takes it)"),
                Not(NOT_A_NUMBER[7]),
                Not(NOT_A_NUMBER[7]),
                Not(NOT_A_NUMBER[7]),
                Not("an SS is not a boolean"),
                Not("an SS is not an ISO 8601 time"),
                json(r#"["b","a"]"#),
            ],
        ),
        (
            Value::Ns(vec![Number::new("1"), Number::new("2.50")]),
            [
                Not("an NS has no text form (a jsonb column takes it)"),
                Not(NOT_A_NUMBER[8]),
                Not(NOT_A_NUMBER[8]),
                Not(NOT_A_NUMBER[8]),
                Not("an NS is not a boolean"),
                Not("an NS is not an ISO 8601 time"),
                json("[1,2.50]"),
            ],
        ),
        (
            Value::Bs(vec![vec![0xff], vec![]]),
            [
                Not("a BS has no text form (a jsonb column takes it)"),
                Not(NOT_A_NUMBER[9]),
                Not(NOT_A_NUMBER[9]),
                Not(NOT_A_NUMBER[9]),
                Not("a BS is not a boolean"),
                Not("a BS is not an ISO 8601 time"),
                json(r#"["/w==",""]"#),
            ],
        ),
    ];
    assert_eq!(rows.len(), 10, "one row per DynamoDB type");
    for (value, wants) in rows {
        for (kind, want) in ColumnType::ALL.into_iter().zip(wants) {
            match want {
                Is(expected) => assert_eq!(to(&value, kind), Ok(expected), "{value:?} {kind}"),
                Not(reason) => assert_eq!(
                    why(&value, kind, TimeFormat::Iso8601),
                    reason,
                    "{value:?} {kind}"
                ),
            }
        }
    }
}

#[test]
fn booleans_are_text_in_both_spellings() {
    assert_eq!(
        to(&Value::Bool(false), ColumnType::Text),
        Ok(text_of("false"))
    );
    assert_eq!(
        to(&Value::Bool(false), ColumnType::Boolean),
        Ok(ColumnValue::Boolean(false))
    );
}

fn text_of(value: &str) -> ColumnValue {
    ColumnValue::Text(value.to_owned())
}

#[test]
fn text_keeps_a_number_as_written() {
    for written in [
        "1.50",
        "1E+3",
        "-0",
        "12345678901234567890123456789012345678",
    ] {
        assert_eq!(to(&n(written), ColumnType::Text), Ok(text_of(written)));
    }
}

#[test]
fn numeric_keeps_every_digit_of_a_dynamodb_number() {
    for written in [
        "12345678901234567890123456789012345678",
        "-9.9999999999999999999999999999999999999E+125",
        "9.9999999999999999999999999999999999999E+125",
        "1E-130",
        "0.000000000000000000000000000000000000012345678901234567890123456789012345678",
        "1.50",
        "0",
    ] {
        assert_eq!(
            to(&n(written), ColumnType::Numeric),
            Ok(ColumnValue::Numeric(written.to_owned()))
        );
    }
    assert_eq!(
        to(&n(" 7 "), ColumnType::Numeric),
        Ok(ColumnValue::Numeric("7".to_owned()))
    );
}

#[test]
fn numeric_refuses_what_dynamodb_cannot_hold() {
    let numeric = |text| why(&n(text), ColumnType::Numeric, TimeFormat::Iso8601);
    assert_eq!(
        numeric("123456789012345678901234567890123456789"),
        "an N with 39 significant digits is more than DynamoDB holds (38)"
    );
    for out_of_range in ["1E+126", "1E-131", "1e999999"] {
        assert!(numeric(out_of_range).starts_with("an N beyond DynamoDB's range"));
    }
    for not_a_number in ["", "abc", "1.2.3", "NaN", "Infinity", "0x10"] {
        assert_eq!(numeric(not_a_number), "an N that is not a number");
    }
}

#[test]
fn bigint_takes_every_integer_within_i64_by_value() {
    let cases = [
        ("0", 0),
        ("-0", 0),
        ("0.000", 0),
        ("1.0", 1),
        ("1E+3", 1000),
        ("1.5E+1", 15),
        ("+42", 42),
        ("100E-2", 1),
        ("9223372036854775807", i64::MAX),
        ("-9223372036854775808", i64::MIN),
        ("9.223372036854775807E+18", i64::MAX),
    ];
    for (text, value) in cases {
        assert_eq!(
            to(&n(text), ColumnType::Bigint),
            Ok(ColumnValue::Bigint(value)),
            "{text}"
        );
    }
}

#[test]
fn bigint_refuses_fractions_and_integers_beyond_i64() {
    let bigint = |text| why(&n(text), ColumnType::Bigint, TimeFormat::Iso8601);
    let range = "(-9223372036854775808 to 9223372036854775807)";
    let cases = [
        ("1.5", "an N with a fraction is not an integer".to_owned()),
        (
            "1E-130",
            "an N with a fraction is not an integer".to_owned(),
        ),
        ("-0.5", "an N with a fraction is not an integer".to_owned()),
        (
            "9223372036854775808",
            format!("an N with 19 integer digits is beyond bigint {range}"),
        ),
        (
            "-9223372036854775809",
            format!("an N with 19 integer digits is beyond bigint {range}"),
        ),
        (
            "1E+20",
            format!("an N with 21 integer digits is beyond bigint {range}"),
        ),
        (
            "12345678901234567890123456789012345678",
            format!("an N with 38 integer digits is beyond bigint {range}"),
        ),
        (
            "1E+125",
            format!("an N with 126 integer digits is beyond bigint {range}"),
        ),
        ("twelve", "an N that is not a number".to_owned()),
    ];
    for (text, reason) in cases {
        assert_eq!(bigint(text), reason, "{text}");
    }
}

#[test]
fn double_takes_a_number_whose_double_prints_back_to_it() {
    let cases = [
        ("0.1", 0.1),
        ("1.5e300", 1.5e300),
        ("0.30000000000000004", 0.300_000_000_000_000_04),
        ("1.0", 1.0),
        ("1E+3", 1000.0),
        ("-2.50", -2.5),
        ("9007199254740992", 9_007_199_254_740_992.0),
        ("5e-324", 5e-324),
        ("1.7976931348623157e308", f64::MAX),
        ("1E+125", 1e125),
        ("1E-130", 1e-130),
        // Two 17-digit decimals are equally near this double; its printed form is this one.
        ("1000000000000000.2", 1_000_000_000_000_000.2),
    ];
    for (text, value) in cases {
        assert_eq!(
            to(&n(text), ColumnType::Double),
            Ok(ColumnValue::Double(value)),
            "{text}"
        );
    }
}

#[test]
fn double_refuses_a_number_with_more_than_a_double_holds() {
    let double = |text| why(&n(text), ColumnType::Double, TimeFormat::Iso8601);
    let cases = [
        (
            "12345678901234567891",
            "an N with 20 significant digits is more than a double holds (17 at most)",
        ),
        (
            "1.00000000000000001",
            "an N with 18 significant digits is more than a double holds (17 at most)",
        ),
        (
            "12345678901234567890123456789012345678",
            "an N with 38 significant digits is more than a double holds (17 at most)",
        ),
        ("1e-400", "an N beyond the range of a double"),
        ("1e400", "an N beyond the range of a double"),
        (
            "9007199254740993",
            "an N that no double holds exactly (its nearest double prints otherwise)",
        ),
        (
            "0.10000000000000001",
            "an N that no double holds exactly (its nearest double prints otherwise)",
        ),
        ("not", "an N that is not a number"),
        (
            "1000000000000000.3",
            "an N that no double holds exactly (its nearest double prints otherwise)",
        ),
    ];
    for (text, reason) in cases {
        assert_eq!(double(text), reason, "{text}");
    }
}

#[test]
fn negative_zero_is_a_positive_zero_double() {
    for zero in ["-0", "-0.0", "-0E+5", "0"] {
        let Ok(ColumnValue::Double(value)) = to(&n(zero), ColumnType::Double) else {
            panic!("{zero} is not a double");
        };
        assert!(value == 0.0 && value.is_sign_positive(), "{zero}");
        let converted = ColumnValue::Double(value);
        assert_eq!(converted.sql_text().as_deref(), Some("0.0"));
    }
}

#[test]
fn a_double_is_sent_as_postgresql_reads_it_back() {
    let cases = [
        ("0.1", "0.1"),
        ("1.5e300", "1.5e+300"),
        ("1E+3", "1000.0"),
        ("1E+20", "1e+20"),
        ("-2.5", "-2.5"),
        ("1e-7", "1e-7"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("5e-324", "5e-324"),
        ("1000000000000000.2", "1000000000000000.2"),
    ];
    for (text, sent) in cases {
        let value = to(&n(text), ColumnType::Double).unwrap();
        assert_eq!(value.sql_text().as_deref(), Some(sent), "{text}");
    }
}

#[test]
fn every_column_value_has_its_sql_text() {
    let cases = [
        (ColumnValue::Null, None),
        (ColumnValue::Text("a".to_owned()), Some("a")),
        (ColumnValue::Numeric("1.50".to_owned()), Some("1.50")),
        (ColumnValue::Bigint(i64::MIN), Some("-9223372036854775808")),
        (ColumnValue::Boolean(true), Some("true")),
        (ColumnValue::Boolean(false), Some("false")),
        (
            ColumnValue::Timestamp(-1),
            Some("1969-12-31T23:59:59.999999Z"),
        ),
        (ColumnValue::Json("{}".to_owned()), Some("{}")),
        (ColumnValue::Double(f64::NAN), Some("NaN")),
        (ColumnValue::Double(f64::NEG_INFINITY), Some("-inf")),
    ];
    for (value, sent) in cases {
        assert_eq!(value.sql_text().as_deref(), sent, "{value:?}");
    }
}

#[test]
fn timestamptz_reads_text_or_numbers_by_its_format() {
    let seconds = TimeFormat::EpochSeconds;
    let millis = TimeFormat::EpochMillis;
    let time = ColumnType::Timestamptz;
    let cases = [
        (
            s("2024-05-01T12:30:00Z"),
            TimeFormat::Iso8601,
            1_714_566_600_000_000,
        ),
        (n("1714566600"), seconds, 1_714_566_600_000_000),
        (n("-1.000001"), seconds, -1_000_001),
        (n("1714566600123.456"), millis, 1_714_566_600_123_456),
        (n("-1"), millis, -1000),
    ];
    for (value, format, micros) in cases {
        assert_eq!(
            convert(&value, time, format),
            Ok(ColumnValue::Timestamp(micros)),
            "{value:?}"
        );
    }
    let refusals = [
        (
            s("1714566600"),
            seconds,
            "an S is not a number of seconds (format iso8601 reads text)",
        ),
        (
            s("1714566600"),
            millis,
            "an S is not a number of milliseconds (format iso8601 reads text)",
        ),
        (Value::Bool(true), seconds, "a BOOL is not a number"),
        (
            n("1714566600.0000001"),
            seconds,
            "an N with digits below the microsecond cannot be stored exactly",
        ),
        (n("1E+20"), millis, "an N outside years 1-9999 (UTC)"),
        (n("later"), seconds, "an N that is not a number"),
        (
            s("2024-05-01T12:30:00.123456789Z"),
            TimeFormat::Iso8601,
            "an S with digits below the microsecond cannot be stored exactly",
        ),
        (
            s("2023-02-29"),
            TimeFormat::Iso8601,
            "an S with a day its month does not have",
        ),
        (
            s("0000-01-01"),
            TimeFormat::Iso8601,
            "an S outside years 1-9999 (UTC)",
        ),
    ];
    for (value, format, reason) in refusals {
        assert_eq!(why(&value, time, format), reason, "{value:?}");
    }
}

#[test]
fn the_time_format_is_ignored_by_other_column_types() {
    for format in TimeFormat::ALL {
        assert_eq!(
            convert(&n("7"), ColumnType::Bigint, format),
            Ok(ColumnValue::Bigint(7))
        );
    }
}

#[test]
fn in_plain_documents_a_number_s_text_counts_as_the_number_for_number_columns() {
    let big = s("12345678901234567890123456789012345678");
    let read = |value: &Value, kind, format, strings| convert_read(value, kind, format, strings);
    let iso = TimeFormat::Iso8601;
    let plain = Strings::MayBeNumbers;
    let cases = [
        (
            &big,
            ColumnType::Numeric,
            iso,
            ColumnValue::Numeric("12345678901234567890123456789012345678".to_owned()),
        ),
        (&s("12"), ColumnType::Bigint, iso, ColumnValue::Bigint(12)),
        (&s("0.1"), ColumnType::Double, iso, ColumnValue::Double(0.1)),
        (
            &s("1714566600.5"),
            ColumnType::Timestamptz,
            TimeFormat::EpochSeconds,
            ColumnValue::Timestamp(1_714_566_600_500_000),
        ),
        (&s("12"), ColumnType::Text, iso, text_of("12")),
        (
            &s("12"),
            ColumnType::Jsonb,
            iso,
            ColumnValue::Json(r#""12""#.to_owned()),
        ),
    ];
    for (value, kind, format, expected) in cases {
        assert_eq!(read(value, kind, format, plain), Ok(expected), "{value:?}");
    }
    // A string that is not a number's text is still an S; so is every string of a typed
    // document.
    let mismatch = read(&s("twelve"), ColumnType::Bigint, iso, plain).unwrap_err();
    assert_eq!(mismatch.why, "an S is not a number");
    let typed = read(&s("12"), ColumnType::Bigint, iso, Strings::AreStrings).unwrap_err();
    assert_eq!(
        (typed.found, typed.why.as_str()),
        ("S", "an S is not a number")
    );
    // Counted as a number, it is judged as one.
    let fraction = read(&s("1.5"), ColumnType::Bigint, iso, plain).unwrap_err();
    assert_eq!(
        (fraction.found, fraction.why.as_str()),
        ("N", "an N with a fraction is not an integer")
    );
}

#[test]
fn an_epoch_time_plain_output_writes_as_a_string_is_still_read() {
    // 3000-01-01 and some microseconds: 17 significant digits whose nearest double prints
    // otherwise, so §3.2 writes the number as a string; rule 3 still reads the number.
    let seconds = "32503680000.123457";
    assert_eq!(crate::plain_number(seconds), crate::PlainNumber::Text);
    assert_eq!(
        convert_read(
            &s(seconds),
            ColumnType::Timestamptz,
            TimeFormat::EpochSeconds,
            Strings::MayBeNumbers
        ),
        Ok(ColumnValue::Timestamp(32_503_680_000_123_457))
    );
}

#[test]
fn a_mismatch_never_holds_the_value() {
    let secret = "4111111111111111";
    let values = [
        s(secret),
        s(&format!("2024-05-01T{secret}")),
        n(&format!("{secret}.{secret}{secret}")),
        n(&format!("{secret}{secret}{secret}")),
        n(&format!("{secret}xyz")),
        Value::Ss(vec![secret.to_owned()]),
        Value::M(Item::from([(secret.to_owned(), s(secret))])),
    ];
    for value in &values {
        for kind in ColumnType::ALL {
            for format in TimeFormat::ALL {
                if let Err(mismatch) = convert(value, kind, format) {
                    assert!(!mismatch.why.contains("4111"), "{}", mismatch.why);
                    assert!(!mismatch.to_string().contains("4111"));
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn every_i64_spelled_any_way_is_its_bigint(
        value: i64,
        zeros in 0usize..4,
        shift in 0u32..3,
    ) {
        let plain = value.to_string();
        prop_assert_eq!(to(&n(&plain), ColumnType::Bigint), Ok(ColumnValue::Bigint(value)));
        let fraction = format!("{plain}.{}", "0".repeat(zeros));
        prop_assert_eq!(to(&n(&fraction), ColumnType::Bigint), Ok(ColumnValue::Bigint(value)));
        if value % 10i64.pow(shift) == 0 {
            let scaled = format!("{}E+{shift}", value / 10i64.pow(shift));
            prop_assert_eq!(to(&n(&scaled), ColumnType::Bigint), Ok(ColumnValue::Bigint(value)));
        }
    }

    #[test]
    fn every_finite_double_printed_shortest_is_that_double(value in any::<f64>()) {
        prop_assume!(value.is_finite());
        // Printed as the rule prints it (serde_json): where two 17-digit decimals are equally
        // near a double, printers pick differently (Rust's `{:?}` wrote 21272604583224.063 for
        // the double ...224.0625, serde_json ...224.062), and only the rule's pick is the
        // double's form (the test below).
        let written = serde_json::to_string(&value).unwrap();
        let converted = to(&n(&written), ColumnType::Double);
        let expected = if value == 0.0 { 0.0 } else { value };
        prop_assert_eq!(&converted, &Ok(ColumnValue::Double(expected)));
        let sent = converted.unwrap().sql_text().unwrap_or_default().into_owned();
        prop_assert_eq!(sent.parse::<f64>().ok(), Some(expected));
    }

    #[test]
    fn a_17_digit_decimal_is_a_double_only_if_it_is_its_double_s_shortest_form(
        digits in "[1-9][0-9]{16}",
        exponent in -30i32..30,
    ) {
        let written = format!("{digits}e{exponent}");
        let nearest: f64 = written.parse().unwrap();
        // The shortest form as serde_json prints it (`1.2e+20`, `0.0025`): where two 17-digit
        // decimals are equally near, it picks one, and only that one is the double's form.
        let shortest = serde_json::to_string(&nearest).unwrap();
        let mantissa = shortest.split('e').next().unwrap_or_default().replace('.', "");
        let same = mantissa.trim_start_matches('0').trim_end_matches('0')
            == digits.trim_end_matches('0');
        let converted = to(&n(&written), ColumnType::Double);
        prop_assert_eq!(converted.is_ok(), same, "{} prints as {}", written, shortest);
    }
}

/// `ColumnSpec::definition`: everything that decides a value, nothing else (the name is not).
#[test]
fn a_definition_names_the_type_the_path_and_a_timestamps_format() {
    use super::super::ColumnSpec;
    let spec = |kind, path: &str, time_format| ColumnSpec {
        name: "c".into(),
        path: super::super::ColumnPath::parse(path).expect("a path"),
        kind,
        time_format,
    };
    let numeric = spec(ColumnType::Numeric, "a.b[2]", TimeFormat::EpochMillis);
    assert_eq!(numeric.definition(), "numeric from a.b[2]");
    let at = spec(ColumnType::Timestamptz, "at", TimeFormat::EpochMillis);
    assert_eq!(at.definition(), "timestamptz from at as epoch_millis");
    let iso = spec(ColumnType::Timestamptz, "at", TimeFormat::Iso8601);
    assert_ne!(iso.definition(), at.definition());
    let renamed = ColumnSpec {
        name: "d".into(),
        ..numeric.clone()
    };
    assert_eq!(renamed.definition(), numeric.definition());
}
