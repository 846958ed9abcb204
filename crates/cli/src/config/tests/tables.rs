//! `source.tables` (docs/config.md §1.5): each table a pipeline of its own, `{table}` filled in,
//! and what a list may not hold.

use super::*;

fn listed(source: &str, sink: &str) -> String {
    format!("name: sync\nsource:\n  tables: [orders, customers]\n{source}sink:\n{sink}")
}

#[test]
fn each_table_is_a_pipeline_of_its_own_with_its_table_filled_in() {
    let config = parse_ok(&listed("", "  type: jsonl\n  path: out/{table}.jsonl\n"));
    assert!(config.is_multi_table());
    assert_eq!(config.source.table_name, "", "no table of its own");
    let tables = config.per_table();
    let names: Vec<_> = tables.iter().map(|one| one.name.as_str()).collect();
    assert_eq!(names, ["sync:orders", "sync:customers"]);
    for (one, table) in tables.iter().zip(["orders", "customers"]) {
        assert_eq!(one.source.table_name, table);
        assert!(!one.is_multi_table());
        assert_eq!(
            one.sink,
            SinkConfig::Jsonl(JsonlConfig {
                path: JsonlTarget::File(PathBuf::from(format!("conf/out/{table}.jsonl"))),
                ..match &config.sink {
                    SinkConfig::Jsonl(jsonl) => jsonl.clone(),
                    other => panic!("{other:?}"),
                }
            })
        );
        // Each table's position has a file of its own: two runs in one process cannot share
        // one state file's lock.
        assert_eq!(
            one.state.path,
            PathBuf::from(format!("conf/sync.{table}.state.json"))
        );
    }
}

#[test]
fn a_keyed_destination_table_is_each_tables_own_name_or_its_template() {
    let config = parse_ok(&listed("", "  type: sqlite\n  path: out.db\n"));
    for one in config.per_table() {
        assert_eq!(
            one.sink.keyed().unwrap().table,
            None,
            "each table's own name"
        );
    }
    let config = parse_ok(&listed(
        "",
        "  type: sqlite\n  path: out.db\n  table: ddb_{table}\n",
    ));
    let tables: Vec<_> = config
        .per_table()
        .iter()
        .map(|one| one.sink.keyed().unwrap().table.clone().unwrap())
        .collect();
    assert_eq!(tables, ["ddb_orders", "ddb_customers"]);
}

#[test]
fn table_arns_are_named_by_their_table() {
    let config = parse_ok(
        "name: sync\nsource:\n  tables: ['arn:aws:dynamodb:eu-west-1:123456789012:table/orders', \
         customers]\nsink:\n  type: jsonl\n  path: out/{table}.jsonl\n",
    );
    let first = &config.per_table()[0];
    assert_eq!(first.name, "sync:orders");
    assert_eq!(
        first.source.table_name,
        "arn:aws:dynamodb:eu-west-1:123456789012:table/orders"
    );
    assert_eq!(
        first.sink,
        parse_ok(&listed("", "  type: jsonl\n  path: out/{table}.jsonl\n")).per_table()[0].sink
    );
}

#[test]
fn one_table_fills_in_its_own_name_at_once() {
    let config = parse_ok(
        "name: t\nsource:\n  table_name: orders\nsink:\n  type: jsonl\n  path: out/{table}.jsonl\n\
         state:\n  path: state/{table}.json\n",
    );
    assert!(!config.is_multi_table());
    assert_eq!(config.name, "t", "one table keeps the pipeline's name");
    assert_eq!(
        config.sink,
        SinkConfig::Jsonl(JsonlConfig {
            path: JsonlTarget::File(PathBuf::from("conf/out/orders.jsonl")),
            rotate_bytes: None,
            fsync: true,
            write: WriteMode::Append,
            gzip: false,
        })
    );
    assert_eq!(config.state.path, PathBuf::from("conf/state/orders.json"));
    assert_eq!(config.per_table(), vec![config.clone()]);
}

#[test]
fn a_list_names_every_place_by_its_table() {
    let cases = [
        (
            "  type: jsonl\n",
            "config error: sink.path: standard output cannot take several tables",
        ),
        (
            "  type: jsonl\n  path: out/all.jsonl\n",
            "config error: sink.path: path must hold {table} when the pipeline reads several \
             tables: otherwise every table would write the one file",
        ),
        (
            "  type: sqlite\n  path: out.db\n  table: everything\n",
            "config error: sink.table: table must hold {table}",
        ),
        (
            "  type: kafka\n  brokers: 'k:9092'\n  topic: all-tables\n",
            "config error: sink.topic: topic must hold {table}",
        ),
        (
            "  type: custom\n",
            "config error: sink.type: a custom sink takes one table",
        ),
        (
            "  type: parquet\n  path: s3://b/all/\n",
            "config error: sink.path: path must hold {table}",
        ),
        (
            "  type: iceberg\n  catalog: {type: sql, uri: 'sqlite:///c.db'}\n  warehouse: wh\n  \
             table: everything\n",
            "config error: sink.table: table must hold {table}",
        ),
    ];
    for (sink, expected) in cases {
        let errors = errors(&listed("", sink));
        assert!(
            errors.iter().any(|line| line.starts_with(expected)),
            "{sink}: {errors:?}"
        );
    }
    // The iceberg sink's default table is `{table}`: each table's own.
    let iceberg = parse_ok(&listed(
        "",
        "  type: iceberg\n  catalog: {type: sql, uri: 'sqlite:///c.db'}\n  warehouse: wh\n",
    ));
    let tables: Vec<String> = iceberg
        .per_table()
        .into_iter()
        .map(|one| match one.sink {
            SinkConfig::Parquet(parquet) => parquet.iceberg.unwrap().table,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(tables, ["orders", "customers"]);
    let state = errors(
        "name: sync\nsource:\n  tables: [orders, customers]\nsink:\n  type: jsonl\n  path: \
         out/{table}.jsonl\nstate:\n  path: all.state.json\n",
    );
    assert!(
        state
            .iter()
            .any(|line| line.starts_with("config error: state.path: path must hold {table}")),
        "{state:?}"
    );
}

#[test]
fn a_list_refuses_what_names_one_table() {
    let jsonl = "  type: jsonl\n  path: out/{table}.jsonl\n";
    let cases = [
        ("  index_name: by_status\n", "source.index_name"),
        (
            "  mode: query\n  key_condition_expression: 'pk = :p'\n  \
             expression_attribute_values: {':p': x}\n",
            "source.mode",
        ),
        (
            "  mode: streams\n  stream_arn: 'arn:aws:dynamodb:r:1:table/orders/stream/x'\n",
            "source.stream_arn",
        ),
    ];
    for (source, field) in cases {
        let errors = errors(&listed(source, jsonl));
        assert!(
            errors
                .iter()
                .any(|line| line.starts_with(&format!("config error: {field}: "))
                    && line.contains("use table_name, one pipeline file per table")),
            "{source}: {errors:?}"
        );
    }
}

#[test]
fn several_tables_share_one_lease_table_each_under_its_own_pipeline() {
    let shared = parse_ok(&format!(
        "{}coordination:\n  lease_table: leases\n  worker_id: w1\n",
        listed(
            "  mode: streams\n  idle_termination_secs: 1\n",
            "  type: jsonl\n  path: out/{table}-{worker}.jsonl\n"
        )
    ));
    let tables = shared.per_table();
    for (one, table) in tables.iter().zip(["orders", "customers"]) {
        // The lease rows' partition is the pipeline's name: each table's units apart.
        assert_eq!(one.name, format!("sync:{table}"));
        let coordination = one.coordination.as_ref().expect("each table is shared");
        assert_eq!(coordination.lease_table, "leases");
        assert_eq!(coordination.worker_id(), "w1");
        assert!(matches!(
            &one.sink,
            SinkConfig::Jsonl(JsonlConfig { path: JsonlTarget::File(path), .. })
                if path.ends_with(format!("out/{table}-{{worker}}.jsonl"))
        ));
    }
    // Each worker's file must still be its own: the rules of a shared jsonl sink hold.
    let unworked = errors(&format!(
        "{}coordination:\n  lease_table: leases\n",
        listed("", "  type: jsonl\n  path: out/{table}.jsonl\n")
    ));
    assert!(
        unworked
            .iter()
            .any(|line| line.starts_with("config error: sink.path: ") && line.contains("{worker}")),
        "{unworked:?}"
    );
}

#[test]
fn the_list_itself_holds_distinct_table_names() {
    let with = |tables: &str| {
        errors(&format!(
            "name: sync\nsource:\n  tables: {tables}\nsink:\n  type: jsonl\n  path: \
             out/{{table}}.jsonl\n"
        ))
    };
    assert!(
        with("[]")
            .iter()
            .any(|line| line.starts_with("config error: source.tables: tables must list")),
    );
    let twice = with("[orders, orders]");
    assert!(
        twice
            .iter()
            .any(|line| line == "config error: source.tables[1]: table 'orders' is listed twice"),
        "{twice:?}"
    );
    let bad = with("[orders, 'a b']");
    assert!(
        bad.iter().any(|line| line
            .starts_with("config error: source.tables[1]: 'a b' is not a DynamoDB table name")),
        "{bad:?}"
    );
    let not_strings = with("[orders, 7]");
    assert!(
        not_strings
            .iter()
            .any(|line| line.contains("source.tables") && line.contains("element 1")),
        "{not_strings:?}"
    );
    let both = errors(
        "name: sync\nsource:\n  table_name: orders\n  tables: [orders]\nsink:\n  type: jsonl\n  \
         path: out/{table}.jsonl\n",
    );
    assert!(
        both.iter()
            .any(|line| line.contains("set one of table_name (one table), tables (a list)")),
        "{both:?}"
    );
    let neither = errors("name: sync\nsource:\n  mode: scan\nsink:\n  type: jsonl\n");
    assert!(
        neither
            .iter()
            .any(|line| line.starts_with("config error: source.table_name: missing required field")),
        "{neither:?}"
    );
}

/// Tables whose names differ only in case are distinct in DynamoDB and in most destinations,
/// but one table in a SQLite file (names compare ignoring ASCII case) and in the Glue Data
/// Catalog (names kept in lowercase): refused there, naming both, before anything is written.
#[test]
fn tables_differing_only_in_case_are_refused_where_one_destination_would_take_both() {
    let with = |sink: &str| {
        errors(&format!(
            "name: sync\nsource:\n  tables: [Orders, customers, orders]\nsink:\n{sink}"
        ))
    };
    let glue = "  type: iceberg\n  catalog: {type: glue}\n  warehouse: s3://b/w\n";
    for (sink, what) in [
        ("  type: sqlite\n  path: out.db\n", "one SQLite table"),
        (
            "  type: sqlite\n  path: out.db\n  table: t_{table}\n",
            "one SQLite table",
        ),
        (glue, "one Glue table"),
    ] {
        let errors = with(sink);
        let expected =
            format!("config error: source.tables: tables 'Orders' and 'orders' would write {what}");
        assert!(
            errors.iter().any(|line| line.starts_with(&expected)),
            "{sink}: {errors:?}"
        );
    }
    for sink in [
        "  type: postgres\n  url: postgres://h/db\n",
        "  type: jsonl\n  path: out/{table}.jsonl\n",
        "  type: kafka\n  brokers: 'k:9092'\n",
        "  type: iceberg\n  catalog: {type: sql, uri: 'sqlite:///c.db'}\n  warehouse: wh\n",
    ] {
        let yaml = format!("name: sync\nsource:\n  tables: [Orders, orders]\nsink:\n{sink}");
        assert_eq!(parse_ok(&yaml).per_table().len(), 2, "{sink}");
    }
    // What discovery finds goes through the same rule (crate::discover::each_table).
    let found = ["Orders".to_string(), "orders".to_string()];
    let config = parse_ok(&discovering("    names: ['*']\n", glue));
    assert_eq!(
        crate::config::one_destination(&config.sink, &found).map(|(a, b, _)| (a, b)),
        Some(("Orders", "orders"))
    );
    let glue_one = parse_ok(&format!(
        "name: sync\nsource:\n  table_name: Orders\nsink:\n{glue}  namespace: DynamoDB\n"
    ));
    assert_eq!(
        crate::destination::sink_identity(&glue_one)
            .split(',')
            .next(),
        Some("iceberg dynamodb.orders"),
        "the Glue names are the ones Glue keeps"
    );
}

/// The library reads the same file: one `Pipeline` per table, and the file's own pipeline is
/// not run as one (each table's outcome is its own).
#[test]
fn the_library_gives_a_pipeline_per_table_and_refuses_to_run_the_list_as_one() {
    use crate::library::{ErrorKind, Pipeline};
    let pipeline = Pipeline::from_yaml(
        &listed("", "  type: jsonl\n  path: out/{table}.jsonl\n"),
        "conf",
    )
    .unwrap();
    assert_eq!(pipeline.table(), "");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tables: Vec<_> = runtime
        .block_on(pipeline.tables())
        .unwrap()
        .iter()
        .map(|one| (one.name().to_string(), one.table().to_string()))
        .collect();
    assert_eq!(
        tables,
        [
            ("sync:orders".to_string(), "orders".to_string()),
            ("sync:customers".to_string(), "customers".to_string())
        ]
    );
    let error = runtime
        .block_on(pipeline.run(ddbpipe_source::retry::Cancel::never()))
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(
        error.to_string().contains("run each of Pipeline::tables()"),
        "{error}"
    );
}

fn discovering(discover: &str, sink: &str) -> String {
    format!("name: sync\nsource:\n  discover:\n{discover}sink:\n{sink}")
}

#[test]
fn discovery_reads_its_patterns_tags_and_interval() {
    let config = parse_ok(&discovering(
        "    names: ['orders-*', 'billing_?']\n    tags: {env: prod, cdc: 'on'}\n    exclude: \
         ['*-tmp']\n    interval_secs: 60\n",
        "  type: sqlite\n  path: out.db\n",
    ));
    let discovery = config.discover.clone().unwrap();
    assert_eq!(discovery.names, ["orders-*", "billing_?"]);
    assert_eq!(discovery.exclude, ["*-tmp"]);
    assert_eq!(discovery.tags.get("cdc").map(String::as_str), Some("on"));
    assert_eq!(discovery.interval_secs, 60);
    assert!(config.is_multi_table());
    assert!(config.per_table().is_empty(), "nothing found yet");
    let found = config.with_tables(vec!["orders-eu".into(), "billing_1".into()]);
    let tables = found.per_table();
    let names: Vec<_> = tables.iter().map(|one| one.name.as_str()).collect();
    assert_eq!(names, ["sync:orders-eu", "sync:billing_1"]);
    assert!(
        tables.iter().all(|one| !one.is_multi_table()),
        "each found table is a pipeline of one table"
    );
    let default = parse_ok(&discovering(
        "    names: ['*']\n",
        "  type: sqlite\n  path: out.db\n",
    ));
    assert_eq!(default.discover.unwrap().interval_secs, 300);
}

#[test]
fn discovery_refuses_what_can_match_nothing_and_what_names_one_table() {
    let sqlite = "  type: sqlite\n  path: out.db\n";
    let cases = [
        (
            "    interval_secs: 10\n",
            sqlite,
            "config error: source.discover: discover needs names or tags",
        ),
        (
            "    names: ['orders/*']\n",
            sqlite,
            "config error: source.discover.names[0]: 'orders/*' holds a character",
        ),
        (
            "    names: ['*']\n    exclude: ['']\n",
            sqlite,
            "config error: source.discover.exclude[0]: '' is empty",
        ),
        (
            "    names: ['*']\n    interval_secs: 0\n",
            sqlite,
            "config error: source.discover.interval_secs: interval_secs must be 1..=86400",
        ),
        (
            "    names: ['*']\n",
            "  type: jsonl\n",
            "config error: sink.path: standard output cannot take several tables",
        ),
        (
            "    names: ['*']\n",
            "  type: sqlite\n  path: out.db\n  table: all\n",
            "config error: sink.table: table must hold {table}",
        ),
    ];
    for (discover, sink, expected) in cases {
        let errors = errors(&discovering(discover, sink));
        assert!(
            errors.iter().any(|line| line.starts_with(expected)),
            "{discover}: {errors:?}"
        );
    }
    let both = errors(
        "name: sync\nsource:\n  tables: [orders]\n  discover: {names: ['*']}\nsink:\n  type: \
         sqlite\n  path: out.db\n",
    );
    assert!(
        both.iter()
            .any(|line| line.starts_with("config error: source.discover: set one of")),
        "{both:?}"
    );
}

/// docs/config.md §1.5 rule 4: the tables of a file share one set of read slots — those the
/// list's tables and those `discover` finds later (`with_tables`) alike; another file has
/// its own.
#[tokio::test]
async fn the_tables_of_a_file_share_its_read_slots() {
    let config = parse_ok(&listed(
        "  read_concurrency: 2\n",
        "  type: jsonl\n  path: out/{table}.jsonl\n",
    ));
    let tables = config.per_table();
    let found = config.with_tables(vec!["invoices".into()]).per_table();
    let slots = |one: &PipelineConfig| one.source.read_concurrency.clone();
    let (orders, customers, invoices) = (slots(&tables[0]), slots(&tables[1]), slots(&found[0]));
    assert_eq!(orders.size(), 2);
    let _held = (orders.take().await, customers.take().await);
    assert_eq!(
        invoices.free(),
        0,
        "every table's request holds a slot of the one set"
    );
    let other = parse_ok(&listed("", "  type: jsonl\n  path: out/{table}.jsonl\n"));
    assert_eq!(other.per_table()[0].source.read_concurrency.free(), 64);
}
