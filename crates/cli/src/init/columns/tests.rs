//! The inference of `init --columns auto`, rule by rule.

use ddbpipe_value::{ColumnPath, Number};

use super::*;

fn n(text: &str) -> Value {
    Value::N(Number::new(text))
}

fn s(text: &str) -> Value {
    Value::S(text.to_string())
}

/// Items with these attributes each (and a key `pk`).
fn items(rows: Vec<Vec<(&str, Value)>>) -> Vec<Item> {
    rows.into_iter()
        .enumerate()
        .map(|(index, row)| {
            let mut item: Item = row
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect();
            item.insert("pk".into(), s(&format!("k{index}")));
            item
        })
        .collect()
}

/// The column inferred for `attribute` from one value per item.
fn inferred(values: Vec<Value>) -> (ColumnType, String) {
    let rows = values.into_iter().map(|value| vec![("a", value)]).collect();
    let inference = infer(&items(rows), &["pk".to_string()], Dialect::Postgres);
    match inference.attributes.as_slice() {
        [Inferred::Column { kind, note, .. }] => (*kind, note.clone()),
        other => panic!("one column, not {other:?}"),
    }
}

#[test]
fn numbers_are_bigint_only_when_every_sample_is_an_integer_within_i64() {
    assert_eq!(
        inferred(vec![n("1"), n("-42"), n("9223372036854775807"), n("1E+3")]),
        (ColumnType::Bigint, "4/4 N, all integers".to_string())
    );
    assert_eq!(
        inferred(vec![n("1"), n("2.5"), n("3")]),
        (
            ColumnType::Numeric,
            "3/3 N, 1 not integers within bigint: exact numeric".to_string()
        )
    );
    // One integer beyond i64 makes the column numeric, never a rounded bigint.
    assert_eq!(
        inferred(vec![n("1"), n("9223372036854775808")]).0,
        ColumnType::Numeric
    );
}

#[test]
fn strings_are_timestamptz_only_when_every_sample_is_a_time() {
    assert_eq!(
        inferred(vec![
            s("2024-05-01T12:30:00Z"),
            s("2024-05-01T12:30:00.123456+02:00"),
        ]),
        (
            ColumnType::Timestamptz,
            "2/2 S, all ISO 8601 times".to_string()
        )
    );
    // Mostly times is text: a timestamptz column would make the others mismatches.
    assert_eq!(
        inferred(vec![
            s("2024-05-01T12:30:00Z"),
            s("2024-05-02T08:00:00Z"),
            s("soon"),
        ]),
        (
            ColumnType::Text,
            "3/3 S, 2 of them ISO 8601 times (not all: text)".to_string()
        )
    );
    assert_eq!(
        inferred(vec![s("paid"), s("open")]),
        (ColumnType::Text, "2/2 S".to_string())
    );
}

#[test]
fn booleans_binaries_sets_lists_and_maps_get_their_columns() {
    assert_eq!(
        inferred(vec![Value::Bool(true), Value::Bool(false)]),
        (ColumnType::Boolean, "2/2 BOOL".to_string())
    );
    assert_eq!(
        inferred(vec![Value::B(vec![1, 2])]),
        (ColumnType::Text, "1/1 B, as base64 text".to_string())
    );
    for value in [
        Value::Ss(vec!["a".into()]),
        Value::Ns(vec![Number::new("1")]),
        Value::Bs(vec![vec![1]]),
        Value::L(vec![n("1")]),
        Value::M(Item::new()),
    ] {
        let tag = value.type_tag();
        assert_eq!(
            inferred(vec![value]),
            (ColumnType::Jsonb, format!("1/1 {tag}, as JSON"))
        );
    }
}

#[test]
fn mixed_types_are_jsonb_and_nulls_say_nothing_of_the_type() {
    assert_eq!(
        inferred(vec![s("x"), n("1"), n("2"), Value::Null]),
        (
            ColumnType::Jsonb,
            "3/4 mixed (2 N, 1 S), as JSON, 1 NULL".to_string()
        )
    );
    assert_eq!(
        inferred(vec![n("1"), Value::Null, n("2")]),
        (
            ColumnType::Bigint,
            "2/3 N, all integers, 1 NULL".to_string()
        )
    );
    assert_eq!(
        inferred(vec![Value::Null, Value::Null]),
        (
            ColumnType::Jsonb,
            "2/2 NULL only: no type seen, as JSON".to_string()
        )
    );
}

#[test]
fn the_share_counts_items_without_the_attribute() {
    let rows = vec![
        vec![("a", n("1")), ("b", s("x"))],
        vec![("a", n("2"))],
        vec![("a", n("3"))],
    ];
    let inference = infer(&items(rows), &["pk".to_string()], Dialect::Sqlite);
    let notes: Vec<&str> = inference
        .attributes
        .iter()
        .map(|inferred| match inferred {
            Inferred::Column { note, .. } => note.as_str(),
            Inferred::Skipped { why, .. } => why.as_str(),
        })
        .collect();
    assert_eq!(notes, ["3/3 N, all integers", "1/3 S"]);
    assert_eq!(inference.sampled, 3);
}

#[test]
fn key_attributes_are_left_out_and_columns_come_in_name_order() {
    let rows = vec![vec![("zeta", s("z")), ("alpha", s("a")), ("sk", n("1"))]];
    let keys = ["pk".to_string(), "sk".to_string()];
    let inference = infer(&items(rows), &keys, Dialect::Postgres);
    let names: Vec<&str> = inference
        .attributes
        .iter()
        .map(|inferred| match inferred {
            Inferred::Column { name, .. } => name.as_str(),
            Inferred::Skipped { attribute, .. } => attribute.as_str(),
        })
        .collect();
    assert_eq!(names, ["alpha", "zeta"]);
    assert_eq!(inference.keys, keys);
}

#[test]
fn unusable_names_are_skipped_with_the_reason() {
    let long = "x".repeat(64);
    let rows = vec![vec![
        ("_ddbpipe_x", s("a")),
        ("document", s("a")),
        (long.as_str(), s("a")),
        ("Status", s("a")),
        ("status", s("b")),
    ]];
    let skipped = |dialect| {
        infer(&items(rows.clone()), &["pk".to_string()], dialect)
            .attributes
            .into_iter()
            .filter_map(|inferred| match inferred {
                Inferred::Skipped { attribute, why } => Some((attribute, why)),
                Inferred::Column { .. } => None,
            })
            .collect::<Vec<_>>()
    };
    let postgres = skipped(Dialect::Postgres);
    let reasons: Vec<&str> = postgres.iter().map(|(_, why)| why.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "names starting with _ddbpipe_ are reserved",
            "the document column's name",
            "64 bytes, PostgreSQL names are at most 63",
        ]
    );
    // Parquet: no length limit, names as written.
    let lake = skipped(Dialect::Lake);
    assert_eq!(lake.len(), 2, "{lake:?}");
    // SQLite: no length limit, but `status` is `Status` there.
    let sqlite = skipped(Dialect::Sqlite);
    assert_eq!(sqlite.len(), 3, "{sqlite:?}");
    assert_eq!(
        sqlite[2],
        (
            "status".to_string(),
            "SQLite takes it for column 'Status' (case aside)".to_string()
        )
    );
}

#[test]
fn the_columns_the_parquet_sink_adds_are_not_suggested_for_it() {
    let rows = vec![vec![
        ("op", s("a")),
        ("event_time", s("b")),
        ("opal", s("c")),
    ]];
    let inference = infer(&items(rows), &["pk".to_string()], Dialect::Lake);
    let kept: Vec<&str> = inference
        .attributes
        .iter()
        .filter_map(|inferred| match inferred {
            Inferred::Column { name, .. } => Some(name.as_str()),
            Inferred::Skipped { .. } => None,
        })
        .collect();
    assert_eq!(kept, ["opal"]);
}

#[test]
fn a_name_a_path_cannot_hold_plainly_is_quoted_and_reads_back() {
    for name in ["a.b", "tags[0]", "say \"hi\"", "back\\slash"] {
        let text = path_text(name).unwrap_or_else(|| panic!("{name} has a path"));
        let path = ColumnPath::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!((path.root(), path.steps().len()), (name, 1), "{text}");
        assert_eq!(path.to_string(), text, "ColumnPath's own spelling");
    }
    assert_eq!(path_text("status").as_deref(), Some("status"));
}

#[test]
fn the_yaml_lines_are_valid_yaml_with_a_comment_per_column() {
    let rows = vec![
        vec![
            ("total", n("1.5")),
            ("a.b", s("x")),
            ("null", Value::Bool(true)),
        ],
        vec![("total", n("2")), ("_ddbpipe_z", s("x"))],
    ];
    let inference = infer(&items(rows), &["pk".to_string()], Dialect::Postgres);
    let lines = yaml_lines(&inference);
    assert_eq!(
        lines,
        "  # key attributes pk: key columns already\n\
         \x20 columns:                         # inferred from 2 sampled items by `ddbpipe init --columns auto`\n\
         \x20   # skipped attribute _ddbpipe_z: names starting with _ddbpipe_ are reserved\n\
         \x20   - {name: \"a.b\", path: \"\\\"a.b\\\"\", type: text}             # 1/2 S\n\
         \x20   - {name: \"null\", path: \"null\", type: boolean}            # 1/2 BOOL\n\
         \x20   - {name: total, path: total, type: numeric}              # 2/2 N, 1 not integers within bigint: exact numeric\n"
    );
    let document: serde_json::Value =
        yaml_serde::from_str(&format!("sink:\n{lines}")).expect("YAML");
    assert_eq!(document["sink"]["columns"][0]["name"], "a.b");
    assert_eq!(document["sink"]["columns"][0]["path"], "\"a.b\"");
    assert_eq!(document["sink"]["columns"][1]["name"], "null");
    let empty = infer(&[], &["pk".to_string()], Dialect::Sqlite);
    assert!(yaml_lines(&empty).contains("# columns: none inferred from 0 sampled items"));
}
