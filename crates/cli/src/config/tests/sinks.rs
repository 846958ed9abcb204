//! The sink and state sections: jsonl modes, keyed sinks, connection strings.

use ddbpipe_keyed::OnMismatch;

use super::*;

#[test]
fn the_jsonl_write_mode_and_gzip_are_read() {
    let source = "source: {table_name: orders}\n";
    let config = parse_ok(&format!(
        "name: t\n{source}sink: {{type: jsonl, path: o.jsonl.gz, write: overwrite, gzip: true}}"
    ));
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!((jsonl.write, jsonl.gzip), (WriteMode::Overwrite, true));
    let config = parse_ok(&format!(
        "name: t\n{source}sink: {{type: jsonl, path: o.jsonl, write: new_file_per_run}}"
    ));
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!((jsonl.write, jsonl.gzip), (WriteMode::NewFilePerRun, false));
    assert_eq!(
        errors(&format!(
            "name: t\n{source}sink: {{type: jsonl, path: o.jsonl, write: truncate}}"
        )),
        [
            "config error: sink.write: unknown value \"truncate\", expected one of append, \
             overwrite, new_file_per_run (a run that replaces the file is `write: overwrite`)"
        ]
    );
}

#[test]
fn keyed_sinks_are_read_with_their_defaults() {
    let config = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: x.db}\n");
    assert_eq!(
        config.sink,
        SinkConfig::Sqlite(SqliteConfig {
            path: PathBuf::from("conf/x.db"),
            keyed: KeyedConfig {
                table: None,
                document_column: Some("document".into()),
                columns: Vec::new(),
                on_type_mismatch: OnMismatch::Null,
                create_table: true,
            },
        })
    );
    let config = parse_ok(
        "name: t\nsource: {table_name: o}\nsink: {type: postgres, url: 'postgres://u:hunter22@h/db', schema: s, table: m, document_column: doc, create_table: false}\n",
    );
    let SinkConfig::Postgres(pg) = &config.sink else {
        panic!("a postgres sink");
    };
    assert_eq!(pg.url.expose(), "postgres://u:hunter22@h/db");
    assert_eq!(pg.schema, "s");
    assert_eq!(
        pg.keyed,
        KeyedConfig {
            table: Some("m".into()),
            document_column: Some("doc".into()),
            columns: Vec::new(),
            on_type_mismatch: OnMismatch::Null,
            create_table: false,
        }
    );
    assert!(!format!("{config:?}").contains("hunter22"));
    assert_eq!(
        errors("name: t\nsource: {table_name: o}\nsink: {type: mongodb}\n"),
        [
            "config error: sink.type: unknown value \"mongodb\", expected one of jsonl, sqlite, \
             postgres, kafka, parquet, iceberg, custom"
        ]
    );
}

/// Issue 9 item 3: `document_type` on postgres sinks, `jsonb` unless set.
#[test]
fn a_postgres_sink_takes_a_document_type() {
    let sink = |extra: &str| {
        format!(
            "name: t\nsource: {{table_name: o}}\nsink: {{type: postgres, url: 'host=h'{extra}}}\n"
        )
    };
    for (extra, want) in [
        ("", DocumentType::Jsonb),
        (", document_type: json", DocumentType::Json),
        (", document_type: text", DocumentType::Text),
        (", document_type: jsonb", DocumentType::Jsonb),
    ] {
        let config = parse_ok(&sink(extra));
        let SinkConfig::Postgres(pg) = &config.sink else {
            panic!("a postgres sink");
        };
        assert_eq!(pg.document_type, want, "{extra}");
    }
    assert_eq!(
        errors(&sink(", document_type: bson")),
        [
            "config error: sink.document_type: unknown value \"bson\", expected one of jsonb, json, \
             text (did you mean json?)"
        ]
    );
}

/// Issue 9 item 4(b): a misspelled libpq key is a config error naming the key, never the
/// value or the string.
#[test]
fn a_misspelled_connection_string_key_is_named_without_its_value() {
    for url in [
        "host=db user=app pasword=Wq7xK9zT dbname=app",
        "postgres://app@db/app?pasword=Wq7xK9zT",
    ] {
        let lines = errors(&format!(
            "name: t\nsource: {{table_name: o}}\nsink: {{type: postgres, url: '{url}'}}\n"
        ));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("config error: sink.url: unknown parameter 'pasword'"),
            "{lines:?}"
        );
        assert!(!lines[0].contains("Wq7"), "{lines:?}");
    }
}

#[test]
fn keyed_sinks_keep_the_position_in_their_database() {
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: x.db}\nstate: {path: s.json}\n"
        ),
        [
            "config error: state.path: the sqlite sink keeps the position in its database; remove state.path"
        ]
    );
    assert_eq!(
        errors(
            "name: t\nsource: {table_name: o}\nsink: {type: postgres, url: '', document_column: _ddbpipe_x}\n"
        ),
        [
            "config error: sink.url: url must not be empty",
            "config error: sink.document_column: names starting with _ddbpipe_ are reserved for ddbpipe's own columns",
        ]
    );
    // Deletes need a keyed sink; with one, a resnapshot may delete.
    let ok = parse_ok(
        "name: t\nsource: {table_name: o, mode: mirror, idle_termination_secs: 1, on_gap: resnapshot}\nsink: {type: sqlite, path: x.db}\n",
    );
    assert!(ok.source.resnapshot_deletes);
}

#[test]
fn sink_and_state_fields_are_read() {
    let config = parse_ok(
        "name: t
source: {table_name: o}
sink: {type: jsonl, path: '-', fsync: false}
state: {flush_interval_ms: 0}
",
    );
    let SinkConfig::Jsonl(jsonl) = &config.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!((&jsonl.path, jsonl.fsync), (&JsonlTarget::Stdout, false));
    assert_eq!(config.state.path, Path::new("conf/t.state.json"));
    assert_eq!(config.state.flush_interval_ms, 0);
    let rotated = parse_ok(
        "name: t\nsource: {table_name: o}\nsink: {type: jsonl, path: /o/x.jsonl, rotate_bytes: 1048576}\n",
    );
    let SinkConfig::Jsonl(jsonl) = &rotated.sink else {
        panic!("a jsonl sink");
    };
    assert_eq!(jsonl.path, JsonlTarget::File(PathBuf::from("/o/x.jsonl")));
    assert_eq!(jsonl.rotate_bytes, Some(1_048_576));
}

#[test]
fn a_scan_into_a_keyed_sink_warns_that_deleted_items_stay() {
    let config = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: sqlite, path: x.db}\n");
    assert_eq!(
        config.warnings,
        [
            "mode: scan into the sqlite sink upserts the items it reads and deletes no row: rows of \
          items deleted from the table stay; use mode: mirror to keep an equal copy"
        ]
    );
    let mirror = parse_ok(
        "name: t\nsource: {table_name: o, mode: mirror, follow: true}\nsink: {type: sqlite, path: x.db}\n",
    );
    assert!(mirror.warnings.is_empty(), "{:?}", mirror.warnings);
    let jsonl = parse_ok("name: t\nsource: {table_name: o}\nsink: {type: jsonl}\n");
    assert!(jsonl.warnings.is_empty());
}

/// A keyed sink commits per batch: without `batch_size` its batches are 5000 records; a given
/// `batch_size` is kept, and jsonl keeps the general default.
#[test]
fn keyed_sinks_default_to_larger_batches_unless_the_file_says() {
    let batch = |source: &str, sink: &str| {
        parse_ok(&format!("name: t\nsource: {source}\nsink: {sink}\n"))
            .source
            .batch_size
    };
    let sqlite = "{type: sqlite, path: x.db}";
    let postgres = "{type: postgres, url: 'postgres://u@h/db'}";
    let jsonl = "{type: jsonl, path: o.jsonl}";
    assert_eq!(batch("{table_name: o}", sqlite), 5000);
    assert_eq!(batch("{table_name: o}", postgres), 5000);
    assert_eq!(batch("{table_name: o}", jsonl), 1000);
    assert_eq!(batch("{table_name: o, batch_size: 1000}", sqlite), 1000);
    assert_eq!(batch("{table_name: o, batch_size: 7}", postgres), 7);
    assert_eq!(batch("{table_name: o, batch_size: 9000}", jsonl), 9000);
}

/// Issue #24 item 16 (docs/values.md §3.7): plain records into a PostgreSQL `jsonb` or `json`
/// document are rendered with every number a JSON number of its own digits; `text`, the other
/// sinks and `typed` keep their format. The spelling, which the stored identity holds, stays
/// `plain`.
#[test]
fn a_postgres_json_document_renders_plain_numbers_exactly() {
    let format = |source: &str, sink: &str| {
        parse_ok(&format!("name: t\nsource: {source}\nsink: {sink}\n"))
            .source
            .value_format
    };
    let postgres = |extra: &str| format!("{{type: postgres, url: 'postgres://u@h/db'{extra}}}");
    let plain = "{table_name: o}";
    let typed = "{table_name: o, value_format: typed}";
    assert_eq!(format(plain, &postgres("")), ValueFormat::PlainExact);
    assert_eq!(
        format(plain, &postgres(", document_type: json")),
        ValueFormat::PlainExact
    );
    assert_eq!(
        format(plain, &postgres(", document_type: text")),
        ValueFormat::Plain
    );
    assert_eq!(format(typed, &postgres("")), ValueFormat::Typed);
    assert_eq!(
        format(plain, "{type: sqlite, path: x.db}"),
        ValueFormat::Plain
    );
    assert_eq!(
        format(plain, "{type: jsonl, path: o.jsonl}"),
        ValueFormat::Plain
    );
    assert_eq!(format(plain, &postgres("")).as_str(), "plain");
}

#[test]
fn a_sink_that_keeps_no_position_needs_a_state_file() {
    for sink in ["{type: jsonl, path: o.jsonl}", "{type: custom}"] {
        assert_eq!(
            errors(&format!(
                "name: t\nsource: {{table_name: o}}\nsink: {sink}\nstate: {{path: ''}}\n"
            )),
            ["config error: state.path: path must not be empty"],
            "{sink}"
        );
    }
}

/// The parquet sink's S3 endpoint may hold a password or a signature: a message about it names
/// the key and the value's kind, never the value; the config's debug form hides it too.
#[test]
fn the_parquet_sinks_endpoint_is_a_secret() {
    let said = errors(
        "name: t\nsource: {table_name: o}\n\
         sink: {type: parquet, path: 's3://b/p', s3_endpoint_url: [http://u:hunter22@minio:9000]}\n",
    );
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("config error: sink.s3_endpoint_url:"),
        "{said:?}"
    );
    assert!(!said[0].contains("hunter22"), "{said:?}");
    let config = crate::config::parse(
        "name: t\nsource: {table_name: o}\n\
         sink: {type: parquet, path: 's3://b/p', s3_endpoint_url: 'http://u:hunter22@minio:9000'}\n",
        std::path::Path::new("/conf"),
        &|_: &str| None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!format!("{config:?}").contains("hunter22"));
}

/// docs/config.md: batches of 5000 into the parquet sink when the file gives no batch_size.
#[test]
fn the_parquet_sink_takes_larger_batches_by_default() {
    let load = |extra: &str| {
        crate::config::parse(
            &format!(
                "name: t\nsource: {{table_name: o{extra}}}\nsink: {{type: parquet, path: out}}\n"
            ),
            std::path::Path::new("/conf"),
            &|_: &str| None,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .source
        .batch_size
    };
    assert_eq!(load(""), 5000);
    assert_eq!(load(", batch_size: 700"), 700);
}

/// docs/sinks.md §7.10 rule 1: a relative directory is relative to the pipeline file's
/// directory; an s3:// path stays as written.
#[test]
fn a_relative_parquet_directory_is_the_pipeline_files() {
    let path = |sink_path: &str| {
        let config = crate::config::parse(
            &format!(
                "name: t\nsource: {{table_name: o}}\nsink: {{type: parquet, path: '{sink_path}'}}\n"
            ),
            std::path::Path::new("/conf"),
            &|_: &str| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        match config.sink {
            crate::config::SinkConfig::Parquet(parquet) => parquet.path,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(path("lake/{table}"), "/conf/lake/o");
    assert_eq!(path("/data/lake"), "/data/lake");
    assert_eq!(path("s3://b/p/{table}/"), "s3://b/p/o/");
}

/// docs/sinks.md §7.11: an iceberg sink's local warehouse and catalog file are absolute, from
/// the pipeline file's directory even when that is given relative (the table's location is
/// written into its metadata for readers anywhere); `{table}` fills the table's name.
#[test]
fn an_iceberg_sinks_paths_are_absolute_and_its_table_named() {
    let config = crate::config::parse(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: sql, uri: \
         'sqlite:///cat.db'}, warehouse: wh}\n",
        std::path::Path::new("conf"),
        &|_: &str| None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let crate::config::SinkConfig::Parquet(parquet) = config.sink else {
        panic!("{:?}", config.sink);
    };
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(parquet.path, cwd.join("conf/wh").display().to_string());
    let iceberg = parquet.iceberg.unwrap();
    assert_eq!(
        iceberg.catalog_uri.expose(),
        format!("sqlite:///{}", cwd.join("conf/cat.db").display())
    );
    assert_eq!(
        (iceberg.namespace.as_str(), iceberg.table.as_str()),
        ("dynamodb", "o")
    );
    assert_eq!(iceberg.catalog_name, "ddbpipe");
}

/// docs/sinks.md §7.11: a Glue catalog's keys are read (`catalog_id`, `region`,
/// `endpoint_url`); each type refuses the other's keys, naming them, and a SQL catalog without
/// its uri is reported missing; `rest` names what is supported.
#[test]
fn a_glue_catalog_reads_its_keys_and_each_type_refuses_the_others() {
    let config = parse_ok(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: glue, \
         catalog_id: '123456789012', region: eu-west-1, endpoint_url: 'http://127.0.0.1:5000'}, \
         warehouse: 's3://b/wh'}\n",
    );
    let crate::config::SinkConfig::Parquet(parquet) = config.sink else {
        panic!("{:?}", config.sink);
    };
    let iceberg = parquet.iceberg.unwrap();
    assert_eq!(
        iceberg.catalog_type,
        crate::sinks::parquet::CatalogType::Glue
    );
    assert_eq!(iceberg.catalog_id.as_deref(), Some("123456789012"));
    assert_eq!(iceberg.catalog_region.as_deref(), Some("eu-west-1"));
    assert_eq!(
        iceberg
            .catalog_endpoint_url
            .map(|url| url.expose().to_string()),
        Some("http://127.0.0.1:5000".to_string())
    );
    let refused = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: glue, \
         uri: 'sqlite:///c.db', name: n}, warehouse: wh}\n",
    );
    let said = refused.join("\n");
    assert!(
        said.contains("sink.catalog.uri") && said.contains("a glue catalog has no uri"),
        "{said}"
    );
    assert!(
        said.contains("sink.catalog.name") && said.contains("a glue catalog has no name"),
        "{said}"
    );
    let refused = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: sql, \
         region: eu-west-1}, warehouse: wh}\n",
    );
    let said = refused.join("\n");
    assert!(
        said.contains("sink.catalog.region") && said.contains("a key of the AWS catalogs"),
        "{said}"
    );
    assert!(
        said.contains("sink.catalog.uri") && said.contains("missing required field"),
        "{said}"
    );
    let said = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: polaris}, \
         warehouse: wh}\n",
    )
    .join("\n");
    assert!(said.contains("type: rest"), "{said}");
}

/// docs/sinks.md §7.11 rule 1: a REST catalog's keys are read (`uri`, `warehouse`, `token` or
/// `credential`, `oauth2_server_uri`, `scope`), its secrets never shown; it needs a uri of
/// http(s) and the sink's warehouse, takes no other type's keys (nor they its own), and not
/// both a token and a credential.
#[test]
fn a_rest_catalog_reads_its_keys_and_shows_no_secret() {
    let config = parse_ok(
        "name: t\nsource: {table_name: Orders}\nsink: {type: iceberg, warehouse: 's3://b/wh', \
         catalog: {type: rest, uri: 'https://polaris.example/api/catalog', warehouse: lake, \
         credential: 'ddb:t0p-s3cret', scope: 'PRINCIPAL_ROLE:ALL', oauth2_server_uri: \
         'https://idp.example/token'}}\n",
    );
    let crate::config::SinkConfig::Parquet(parquet) = &config.sink else {
        panic!("{:?}", config.sink);
    };
    let iceberg = parquet.iceberg.as_ref().unwrap();
    assert_eq!(
        iceberg.catalog_type,
        crate::sinks::parquet::CatalogType::Rest
    );
    assert_eq!(iceberg.rest.warehouse.as_deref(), Some("lake"));
    assert_eq!(iceberg.rest.scope.as_deref(), Some("PRINCIPAL_ROLE:ALL"));
    assert_eq!(
        iceberg.rest.credential.as_ref().map(|c| c.expose()),
        Some("ddb:t0p-s3cret")
    );
    let label = crate::destination::position_label(&config);
    assert_eq!(
        label,
        "iceberg dynamodb.Orders, REST catalog https://polaris.example/api/catalog (warehouse \
         'lake'), warehouse s3://b/wh"
    );
    assert!(!format!("{config:?}").contains("t0p-s3cret"));

    let said = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: rest, \
         uri: 'ftp://host', token: a, credential: 'b:c', name: x, region: eu-west-1}}\n",
    )
    .join("\n");
    for (key, why) in [
        ("sink.warehouse", "missing"),
        ("sink.catalog.uri", "http://"),
        ("sink.catalog.credential", "not both"),
        ("sink.catalog.name", "a REST catalog has no name"),
        ("sink.catalog.region", "a REST catalog is reached at uri"),
    ] {
        assert!(
            said.lines().any(|l| l.contains(key) && l.contains(why)),
            "{key}: {said}"
        );
    }
    let said = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, warehouse: wh, catalog: \
         {type: sql, uri: 'sqlite:///c.db', token: a, warehouse: w}}\n",
    )
    .join("\n");
    assert!(said.contains("sink.catalog.token"), "{said}");
    assert!(
        said.contains("a key of the sink, not of its catalog"),
        "{said}"
    );
}

/// docs/sinks.md §7.11: an S3 table bucket's keys are read (`table_bucket_arn`, `region`,
/// `endpoint_url`); it takes no warehouse (the service places the table's files), no other
/// type's keys, an ARN only of a table bucket; the names as S3 Tables keeps them (lowercase,
/// a hyphen an underscore), one it refuses refused for one table and for each listed one,
/// naming the table.
#[test]
fn an_s3tables_catalog_reads_its_keys_and_refuses_a_warehouse_and_names_it_cannot_keep() {
    let sink = "sink: {type: iceberg, namespace: Live-Data, catalog: {type: s3tables, \
                table_bucket_arn: 'arn:aws:s3tables:eu-west-1:123456789012:bucket/lake', \
                endpoint_url: 'http://127.0.0.1:5000'}}\n";
    let config = parse_ok(&format!(
        "name: t\nsource: {{table_name: Orders-2026}}\n{sink}"
    ));
    let crate::config::SinkConfig::Parquet(parquet) = &config.sink else {
        panic!("{:?}", config.sink);
    };
    let iceberg = parquet.iceberg.as_ref().unwrap();
    assert_eq!(
        iceberg.catalog_type,
        crate::sinks::parquet::CatalogType::S3Tables
    );
    assert_eq!(
        iceberg.table_bucket_arn.as_deref(),
        Some("arn:aws:s3tables:eu-west-1:123456789012:bucket/lake")
    );
    let stored = |name: &str| crate::sinks::parquet::stored_name(iceberg, name);
    assert_eq!(
        (stored(&iceberg.namespace), stored(&iceberg.table)),
        ("live_data".to_string(), "orders_2026".to_string())
    );
    let label = crate::destination::position_label(&config);
    assert!(
        label.starts_with("iceberg live_data.orders_2026, S3 table bucket arn:aws:s3tables:")
            && !label.contains("warehouse"),
        "{label}"
    );

    let said = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, warehouse: 's3://b/wh', \
         catalog: {type: s3tables, uri: 'sqlite:///c.db', catalog_id: '1', table_bucket_arn: \
         'arn:aws:s3:::lake'}}\n",
    )
    .join("\n");
    for (key, why) in [
        ("sink.warehouse", "where S3 Tables places them"),
        ("sink.catalog.uri", "it is table_bucket_arn"),
        ("sink.catalog.catalog_id", "its table bucket's"),
        (
            "sink.catalog.table_bucket_arn",
            "is not a table bucket's ARN",
        ),
    ] {
        assert!(said.contains(key) && said.contains(why), "{key}: {said}");
    }
    let said = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: iceberg, catalog: {type: s3tables}}\n",
    )
    .join("\n");
    assert!(
        said.contains("sink.catalog.table_bucket_arn") && said.contains("missing required field"),
        "{said}"
    );
    assert!(!said.contains("sink.warehouse"), "{said}");

    // Names S3 Tables does not take: the namespace, one table's, each listed table's.
    let said = errors(&format!(
        "name: t\nsource: {{table_name: _orders}}\n{}",
        sink.replace("Live-Data", "aws_data")
    ))
    .join("\n");
    assert!(
        said.contains("sink.namespace") && said.contains("'aws' are AWS's"),
        "{said}"
    );
    assert!(
        said.contains("sink.table") && said.contains("the name of table '_orders'"),
        "{said}"
    );
    let said = errors(&format!(
        "name: t\nsource: {{tables: [orders, orders.v2_]}}\n{sink}"
    ))
    .join("\n");
    assert!(
        said.contains("sink.table") && said.contains("table 'orders.v2_'"),
        "{said}"
    );
    assert!(!said.contains("table 'orders'"), "{said}");
    let said = errors(&format!(
        "name: t\nsource: {{tables: [Orders-1, orders_1]}}\n{sink}"
    ))
    .join("\n");
    assert!(
        said.contains("'Orders-1' and 'orders_1' would write one S3 table"),
        "{said}"
    );
}

/// docs/sinks.md §7.10 rule 3: `partition_by` as a YAML flow list, whose commas would cut
/// `bucket(16, pk)` in two, reads whole terms; a term that does not read is named by its index
/// when the file is loaded.
#[test]
fn partition_by_terms_are_read_whole_and_a_bad_one_named() {
    let terms = |list: &str| {
        let config = parse_ok(&format!(
            "name: t\nsource: {{table_name: o}}\nsink: {{type: parquet, path: out, \
             partition_by: {list}}}\n"
        ));
        let crate::config::SinkConfig::Parquet(parquet) = config.sink else {
            panic!("{:?}", config.sink);
        };
        parquet.partition_by
    };
    let read = terms("[bucket(16, pk), day(event_time), 'truncate(4, sk)', pk]").unwrap();
    assert_eq!(
        read,
        ["bucket(16, pk)", "day(event_time)", "truncate(4, sk)", "pk"]
    );
    assert_eq!(terms("[]"), Some(Vec::new()));
    let errors = errors(
        "name: t\nsource: {table_name: o}\nsink: {type: parquet, path: out, partition_by: \
         [pk, week(t), 'bucket(x, y)']}\n",
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("sink.partition_by[1]") && e.contains("no transform 'week'")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("sink.partition_by[2]") && e.contains("a count and a column")),
        "{errors:?}"
    );
}

/// docs/sinks.md §7.11 rule 2: `table_properties` are read as strings; a `ddbpipe.*` name is
/// ddbpipe's own and refused, naming it.
#[test]
fn iceberg_table_properties_are_read_and_ddbpipes_own_refused() {
    let sink = "sink: {type: iceberg, catalog: {type: sql, uri: 'sqlite:///c.db'}, warehouse: wh, \
                table_properties: {history.expire.min-snapshots-to-keep: '3', ";
    let config = parse_ok(&format!(
        "name: t\nsource: {{table_name: o}}\n{sink}write.format.default: parquet}}}}\n"
    ));
    let crate::config::SinkConfig::Parquet(parquet) = config.sink else {
        panic!("{:?}", config.sink);
    };
    let properties = parquet.iceberg.unwrap().table_properties;
    assert_eq!(properties["history.expire.min-snapshots-to-keep"], "3");
    assert_eq!(properties["write.format.default"], "parquet");
    let refused = errors(&format!(
        "name: t\nsource: {{table_name: o}}\n{sink}ddbpipe.writer: me}}}}\n"
    ));
    assert!(
        refused
            .iter()
            .any(|e| e.contains("sink.table_properties.ddbpipe.writer")
                && e.contains("ddbpipe's own")),
        "{refused:?}"
    );
    // A property every commit reads must read: refused when the file is loaded, not at the
    // first commit.
    for (key, value) in [
        ("history.expire.max-snapshot-age-ms", "5d"),
        ("commit.manifest.min-count-to-merge", "many"),
    ] {
        let refused = errors(&format!(
            "name: t\nsource: {{table_name: o}}\n{sink}{key}: '{value}'}}}}\n"
        ));
        assert!(
            refused
                .iter()
                .any(|e| e.contains("sink.table_properties") && e.contains(key)),
            "{refused:?}"
        );
    }
}
