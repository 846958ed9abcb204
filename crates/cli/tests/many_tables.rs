//! Several tables in one pipeline file (`source.tables`, issue 30, docs/config.md §1.5) end to
//! end: one `ddbpipe run` mirrors each table into its own destination table with a position of
//! its own, a table that fails stops alone and the run names it, a run killed mid-snapshot
//! resumes every table from its own position, and `check`, `state` and `lag` report each
//! table. The destination is compared with each table as a `mode: scan` dump reads it.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use serde_json::Value;

use common::keyed::{self, Destination, Target};
use common::{Emulator, Pipeline, Running, item, n, s, signal, spawn_logged, stderr, stdout};

const TABLES: [&str; 3] = ["orders", "customers", "invoices"];

/// Creates `table` (hash key `pk`, a stream of both images) with `count` items.
fn seed(running: &Running, table: &str, count: usize) {
    running.create_pk_table(table, Some(StreamViewType::NewAndOldImages));
    let items = (0..count)
        .map(|i| {
            item(vec![
                ("pk", s(&format!("{table}-{i:04}"))),
                ("v", n(&i.to_string())),
                ("pad", s(&"x".repeat(200))),
            ])
        })
        .collect();
    running.put_items(table, items);
}

/// A pipeline `sync` mirroring `tables` into `target`, with more `source:` lines.
fn mirror(
    running: &Running,
    target: Target,
    tables: &[&str],
    more: &str,
) -> (Pipeline, Destination) {
    let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
    let destination = Destination::new(target, pipeline.dir.path());
    let source = format!(
        "tables: [{}]\nmode: mirror\nidle_termination_secs: 1\nvalue_format: typed\n{more}",
        tables.join(", ")
    );
    pipeline.write_with_sink("sync", &running.endpoint, &source, &destination.sink_yaml());
    (pipeline, destination)
}

fn run(pipeline: &Pipeline) -> std::process::Output {
    pipeline.ddbpipe(&["run", "--progress", "never"])
}

/// Each table's destination rows equal its items.
fn assert_mirrored(running: &Running, destination: &Destination, tables: &[&str]) {
    for table in tables {
        let items = keyed::table_items(&running.endpoint, table);
        assert!(!items.is_empty(), "{table} has items");
        assert_eq!(destination.items(table), items, "table {table}");
    }
}

fn mirrors_three_tables_each_from_its_own_position(target: Target) {
    let running = Emulator::Dynoxide.start();
    for (index, table) in TABLES.iter().enumerate() {
        seed(&running, table, 20 + 10 * index);
    }
    let (pipeline, destination) = mirror(&running, target, &TABLES, "");
    let output = run(&pipeline);
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    for table in TABLES {
        assert!(
            said.contains(&format!("table '{table}': ")),
            "no summary of {table}: {said}"
        );
        assert!(
            !destination.state(&format!("sync:{table}")).is_empty(),
            "table {table} keeps its position under its own name"
        );
    }
    assert!(
        destination.state("sync").is_empty(),
        "no position of the file's name"
    );
    assert_mirrored(&running, &destination, &TABLES);

    // Changes in two of the tables: the next run applies them from each table's position
    // (the third has none, and its rows stay as they are).
    running.put_pk("customers", "customers-new", "7");
    running.delete_pk("customers", "customers-0003");
    running.put_pk("orders", "orders-0001", "99");
    let output = run(&pipeline);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_mirrored(&running, &destination, &TABLES);
    let customers = destination.items("customers");
    assert!(customers.contains_key("customers-new"));
    assert!(!customers.contains_key("customers-0003"));
}

/// Three `ddbpipe run` workers of one file mirroring three tables through one lease table
/// (docs/config.md §1.5 rule 8): each table's units are leases under its own pipeline
/// (`sync:<table>`), every worker takes part in every table, and while writers change all
/// three tables one worker is SIGKILLed during the snapshots and another SIGSTOPped past its
/// lease. Each table's snapshot is closed once and each destination table ends equal to its
/// table.
fn three_workers_share_three_tables(target: Target) {
    let running = Emulator::Dynoxide.start();
    for table in TABLES {
        seed(&running, table, 60);
    }
    let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
    let destination = Destination::new(target, pipeline.dir.path());
    let source = format!(
        "tables: [{}]\nmode: mirror\nfollow: true\npoll_interval_ms: 200\nvalue_format: typed\n\
         segments: 4\nmax_concurrency: 2\npage_limit: 5\nbatch_size: 5\nmax_read_units_per_second: 2\n",
        TABLES.join(", ")
    );
    let rest = format!(
        "{}state:\n  flush_interval_ms: 0\ncoordination:\n  lease_table: ddbpipe-leases\n  \
         lease_duration_secs: 3\n",
        destination.sink_yaml()
    );
    pipeline.write_with_sink("sync", &running.endpoint, &source, &rest);
    let checked = pipeline.ddbpipe(&["check"]);
    assert_eq!(checked.status.code(), Some(0), "{}", stderr(&checked));
    let mut workers: Vec<_> = (0..3).map(|i| spawn_logged(&pipeline, i)).collect();
    let endpoint = running.endpoint.clone();
    let writer = std::thread::spawn(move || {
        let client = common::client(&endpoint);
        for step in 0..90usize {
            let table = TABLES[step % 3];
            let key = s(&format!("{table}-{:04}", (step * 7) % 70));
            let written = match step % 5 {
                4 => common::rt()
                    .block_on(client.delete_item().table_name(table).key("pk", key).send())
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}")),
                _ => common::rt()
                    .block_on(
                        client
                            .put_item()
                            .table_name(table)
                            .set_item(Some(item(vec![("pk", key), ("v", n(&step.to_string()))])))
                            .send(),
                    )
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}")),
            };
            written.expect("a write");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let marked = |table: &str| {
        destination
            .rows(table)
            .values()
            .filter(|row| row.snapshot.is_some())
            .count()
    };
    let snapshotting = common::wait_for(Duration::from_secs(90), || {
        TABLES.iter().all(|table| marked(table) >= 5)
    });
    assert!(snapshotting, "the workers write every table's snapshot");
    common::kill_one_and_stall_another(&mut workers);
    writer.join().unwrap();

    let record = |table: &str| -> Value {
        let stored = destination.query_texts(&format!(
            "SELECT position FROM _ddbpipe_fences WHERE pipeline = 'sync:{table}' AND unit = 'snapshot'"
        ));
        stored
            .first()
            .map_or(Value::Null, |row| serde_json::from_str(&row[0]).unwrap())
    };
    let closed = common::wait_for(Duration::from_secs(240), || {
        TABLES
            .iter()
            .all(|table| !record(table)["closed"].is_null())
    });
    let converged = common::wait_for(Duration::from_secs(120), || {
        TABLES
            .iter()
            .all(|table| destination.items(table) == keyed::table_items(&running.endpoint, table))
    });
    let mut logs = Vec::new();
    for (worker, attempt) in workers.into_iter().zip([2, 1]) {
        signal(&worker, "TERM");
        let status = worker.wait_with_output().unwrap().status;
        let log = std::fs::read_to_string(pipeline.dir.path().join(format!("run-{attempt}.log")))
            .unwrap();
        assert_eq!(status.code(), Some(0), "{log}");
        logs.push(log);
    }
    assert!(closed, "every table's snapshot was closed; {logs:#?}");
    assert!(converged, "{logs:#?}");
    assert_mirrored(&running, &destination, &TABLES);
    for table in TABLES {
        for log in &logs {
            assert!(
                log.contains(&format!("table '{table}': ")),
                "each worker runs every table: {log}"
            );
        }
    }
    // The lease rows of each table are its own pipeline's; none under the file's name.
    let shown = pipeline.ddbpipe(&["state", "show", "--json"]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let shown: Vec<Value> = stdout(&shown)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(shown.len(), TABLES.len(), "{shown:?}");
    for (table, one) in TABLES.iter().zip(&shown) {
        assert_eq!(one["pipeline"], format!("sync:{table}"), "{one}");
        assert_eq!(one["phase"], "streaming", "{one}");
    }
    // `lag` of each table from its lease rows, and the worst.
    let lag = pipeline.ddbpipe(&["lag", "--json"]);
    assert_eq!(lag.status.code(), Some(0), "{}", stderr(&lag));
    let lag: Value = serde_json::from_str(&stdout(&lag)).unwrap();
    let tables: Vec<&str> = lag["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|one| one["table"].as_str().unwrap())
        .collect();
    assert_eq!(tables, TABLES, "{lag}");
    assert!(lag["worst"]["lag_seconds"].is_number(), "{lag}");
    assert!(
        destination.state("sync").is_empty(),
        "no position of the file's name"
    );
}

/// What `run` and `check` say of a table with a kept position that the file no longer reads
/// (docs/config.md §1.5 rule 1).
const CUSTOMERS_KEPT: &str = "table 'customers' has a stored position (pipeline \
                              'sync:customers') but it is not in source.tables: the position \
                              is kept, and reading the table again resumes it";

/// A stream into jsonl whose table is taken off the list keeps its state file, `run` and
/// `check` name it, and listed again it resumes from that file's position (only the change
/// made meanwhile is written).
fn a_table_taken_off_the_list_keeps_its_state_file() {
    let running = Emulator::Dynoxide.start();
    for table in ["orders", "customers"] {
        seed(&running, table, 12);
    }
    let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
    let sink = format!(
        "sink:\n  type: jsonl\n  path: '{}/{{table}}.jsonl'\n",
        pipeline.dir.path().display()
    );
    let write = |tables: &str| {
        let source = format!("tables: [{tables}]\nmode: streams\nidle_termination_secs: 1\n");
        pipeline.write_with_sink("sync", &running.endpoint, &source, &sink);
    };
    write("orders, customers");
    let first = run(&pipeline);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(
        pipeline
            .dir
            .path()
            .join("sync.customers.state.json")
            .exists()
    );

    write("orders");
    let second = run(&pipeline);
    let said = stderr(&second);
    assert_eq!(second.status.code(), Some(0), "{said}");
    assert!(said.contains(CUSTOMERS_KEPT), "{said}");
    assert!(!said.contains("table 'orders' has"), "{said}");
    let checked = pipeline.ddbpipe(&["check"]);
    assert!(
        stdout(&checked).contains(&format!("WARN {CUSTOMERS_KEPT}")),
        "{}",
        stdout(&checked)
    );

    running.put_pk("customers", "customers-new", "1");
    write("orders, customers");
    let third = run(&pipeline);
    let said = stderr(&third);
    assert_eq!(third.status.code(), Some(0), "{said}");
    assert!(!said.contains("has a stored position"), "{said}");
    let lines = std::fs::read_to_string(pipeline.dir.path().join("customers.jsonl")).unwrap();
    let keys: Vec<String> = lines
        .lines()
        .map(|line| {
            let change: Value = serde_json::from_str(line).unwrap();
            change["key"]["pk"].as_str().unwrap().to_string()
        })
        .collect();
    // The first run wrote the 12 puts; the third only the new one.
    assert_eq!(keys.len(), 13, "{keys:?}");
    assert_eq!(keys.last().map(String::as_str), Some("customers-new"));
}

/// The value of the series of `metric` whose labels hold every one of `labels`, in the
/// Prometheus text `text`; `None` when there is none.
fn series(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

/// docs/config.md §1.5 rule 4: every metric of a run of several tables carries its table, so
/// their series stay apart (each table's snapshot rows counted for it alone), whatever the log
/// level.
/// (A mirror snapshot's rows are read as `item`s, its stream's records as `change`s.)
fn each_tables_metrics_carry_its_table(target: Target) {
    let running = Emulator::Dynoxide.start();
    for (index, table) in TABLES.iter().enumerate() {
        seed(&running, table, 20 + 10 * index);
    }
    let (pipeline, _destination) = mirror(&running, target, &TABLES, "");
    let file = pipeline.dir.path().join("sync.prom");
    let output = pipeline.ddbpipe(&[
        "run",
        "--progress",
        "never",
        "--log-level",
        "error",
        "--metrics-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&file).unwrap();
    for (index, table) in TABLES.iter().enumerate() {
        let label = format!("table=\"{table}\"");
        let read = series(
            &text,
            "ddbpipe_records_read_total",
            &[&label, "kind=\"item\""],
        );
        assert_eq!(read, Some((20 + 10 * index) as f64), "{table} in:\n{text}");
        let requests = series(
            &text,
            "ddbpipe_requests_total",
            &[&label, "operation=\"scan\""],
        );
        assert!(requests.is_some_and(|n| n >= 1.0), "{table} in:\n{text}");
        assert!(text.contains("pipeline=\"sync\""), "{text}");
    }
    let unlabelled = text
        .lines()
        .filter(|line| line.starts_with("ddbpipe_records_") && !line.contains("table=\""))
        .collect::<Vec<_>>();
    assert!(unlabelled.is_empty(), "{unlabelled:?}");
}

mod sqlite {
    use super::*;

    #[test]
    fn each_tables_metrics_carry_its_table() {
        super::each_tables_metrics_carry_its_table(Target::Sqlite);
    }

    #[test]
    fn three_workers_share_three_tables_through_a_kill_and_a_stop() {
        super::three_workers_share_three_tables(Target::Sqlite);
    }

    #[test]
    fn a_table_taken_off_the_list_keeps_its_state_file() {
        super::a_table_taken_off_the_list_keeps_its_state_file();
    }

    /// docs/config.md §1.5 rule 4: with one read slot for the whole process, the three
    /// tables' snapshots and streams take turns and every table is mirrored (a slot is
    /// always given back).
    #[test]
    fn three_tables_share_one_read_slot_and_each_is_mirrored() {
        let running = Emulator::Dynoxide.start();
        for (index, table) in TABLES.iter().enumerate() {
            seed(&running, table, 20 + 10 * index);
        }
        let more = "segments: 3\nmax_concurrency: 3\npage_limit: 4\nread_concurrency: 1\n";
        let (pipeline, destination) = mirror(&running, Target::Sqlite, &TABLES, more);
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_mirrored(&running, &destination, &TABLES);
    }

    #[test]
    fn three_tables_mirror_into_one_database_each_from_its_own_position() {
        mirrors_three_tables_each_from_its_own_position(Target::Sqlite);
    }

    /// A table that cannot be read (here: it does not exist) fails alone: the others are
    /// mirrored, the run's error names it, and the exit code says a table failed.
    #[test]
    fn a_table_that_fails_stops_alone_and_the_run_names_it() {
        let running = Emulator::Dynoxide.start();
        seed(&running, "orders", 15);
        seed(&running, "customers", 12);
        let tables = ["orders", "missing_table", "customers"];
        let (pipeline, destination) = mirror(&running, Target::Sqlite, &tables, "");
        let output = run(&pipeline);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{said}");
        assert!(
            said.contains("error: table 'missing_table': "),
            "the table's own error: {said}"
        );
        assert!(
            said.contains("error: 1 of 3 tables failed: missing_table"),
            "the run's error: {said}"
        );
        for table in ["orders", "customers"] {
            assert!(said.contains(&format!("table '{table}': ")), "{said}");
        }
        assert_mirrored(&running, &destination, &["orders", "customers"]);
    }

    /// docs/config.md §1.5 rule 4: when every table fails with a config error (here: streams
    /// without new images, which a mirror needs), the run exits 2 as a bad file does; a
    /// runtime failure among them makes it 1.
    #[test]
    fn every_table_failing_on_its_config_exits_2_and_a_runtime_failure_makes_it_1() {
        let running = Emulator::Dynoxide.start();
        for table in ["keys_a", "keys_b"] {
            running.create_pk_table(table, Some(StreamViewType::KeysOnly));
        }
        let (pipeline, _) = mirror(&running, Target::Sqlite, &["keys_a", "keys_b"], "");
        let output = run(&pipeline);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(said.contains("2 of 2 tables failed"), "{said}");
        let (pipeline, _) = mirror(&running, Target::Sqlite, &["keys_a", "missing_table"], "");
        let output = run(&pipeline);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{said}");
        assert!(said.contains("2 of 2 tables failed"), "{said}");
    }

    /// docs/config.md §1.5 rule 1: a table taken off the list keeps its position: the runs
    /// without it leave its state as it was and name it, and put back it goes on from there.
    #[test]
    fn a_table_taken_off_the_list_keeps_its_position() {
        let running = Emulator::Dynoxide.start();
        seed(&running, "orders", 10);
        seed(&running, "customers", 10);
        let (pipeline, destination) =
            mirror(&running, Target::Sqlite, &["orders", "customers"], "");
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let kept = destination.state("sync:customers");
        assert!(!kept.is_empty());
        let sink = destination.sink_yaml();
        let only_orders = "tables: [orders]
mode: mirror
idle_termination_secs: 1
                           value_format: typed
";
        pipeline.write_with_sink("sync", &running.endpoint, only_orders, &sink);
        running.put_pk("orders", "orders-new", "1");
        running.put_pk("customers", "customers-new", "1");
        let output = run(&pipeline);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{said}");
        assert!(said.contains(CUSTOMERS_KEPT), "run names the table: {said}");
        let checked = pipeline.ddbpipe(&["check", "--json"]);
        let report: Value = serde_json::from_str(&stdout(&checked)).unwrap();
        assert_eq!(checked.status.code(), Some(0), "a warning: {report}");
        let unlisted = report["unlisted"].as_array().unwrap();
        assert_eq!(unlisted.len(), 1, "{report}");
        assert_eq!(unlisted[0]["table"], "customers");
        assert_eq!(unlisted[0]["pipeline"], "sync:customers");
        assert_eq!(destination.state("sync:customers"), kept, "untouched");
        assert!(!destination.items("customers").contains_key("customers-new"));
        let both = only_orders.replace("[orders]", "[orders, customers]");
        pipeline.write_with_sink("sync", &running.endpoint, &both, &sink);
        let output = run(&pipeline);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{said}");
        assert!(!said.contains("has a stored position"), "{said}");
        assert_mirrored(&running, &destination, &["orders", "customers"]);
        assert_ne!(destination.state("sync:customers"), kept, "it went on");
    }

    /// SIGKILL in the middle of the snapshots: the next run resumes each table from its own
    /// committed position and every destination table ends equal to its table.
    #[test]
    fn a_run_killed_mid_snapshot_resumes_each_table_from_its_own_position() {
        let running = Emulator::Dynoxide.start();
        for table in TABLES {
            seed(&running, table, 300);
        }
        // Slow reads, so that the kill comes while every snapshot is under way.
        let (pipeline, destination) = mirror(
            &running,
            Target::Sqlite,
            &TABLES,
            "segments: 2\npage_limit: 10\nbatch_size: 10\nmax_read_units_per_second: 2\n",
        );
        let mut child = spawn_logged(&pipeline, 1);
        let started = common::wait_for(Duration::from_secs(60), || {
            TABLES
                .iter()
                .all(|table| !destination.rows(table).is_empty())
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(started, "every table wrote rows before the kill");
        let partial: usize = TABLES.iter().map(|t| destination.rows(t).len()).sum();
        assert!(partial < 900, "the kill came mid-snapshot ({partial} rows)");
        running.put_pk("invoices", "invoices-0002", "42");
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_mirrored(&running, &destination, &TABLES);
    }

    /// `check`, `state show`, `lag` and `state reset` take each table's pipeline in turn.
    #[test]
    fn check_state_and_lag_report_each_table() {
        let running = Emulator::Dynoxide.start();
        for table in TABLES {
            seed(&running, table, 5);
        }
        let (pipeline, destination) = mirror(&running, Target::Sqlite, &TABLES, "");
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

        let check = pipeline.ddbpipe(&["check"]);
        let text = stdout(&check);
        assert_eq!(check.status.code(), Some(0), "{text}{}", stderr(&check));
        for table in TABLES {
            assert!(
                text.contains(&format!("table '{table}' (pipeline 'sync:{table}'):")),
                "{text}"
            );
        }
        let check = pipeline.ddbpipe(&["check", "--json"]);
        let report: Value = serde_json::from_str(&stdout(&check)).unwrap();
        assert_eq!(report["ok"], true, "{report}");
        let listed: Vec<&str> = report["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|one| one["table"].as_str().unwrap())
            .collect();
        assert_eq!(listed, TABLES);

        let show = pipeline.ddbpipe(&["state", "show", "--json"]);
        assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
        let pipelines: Vec<String> = stdout(&show)
            .lines()
            .map(|line| {
                let entry: Value = serde_json::from_str(line).unwrap();
                assert_eq!(entry["fingerprint_status"], "match", "{entry}");
                entry["pipeline"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(
            pipelines,
            ["sync:orders", "sync:customers", "sync:invoices"]
        );

        let lag = pipeline.ddbpipe(&["lag", "--json"]);
        let report: Value = serde_json::from_str(&stdout(&lag)).unwrap();
        assert_eq!(lag.status.code(), Some(0), "{report}");
        assert_eq!(report["tables"].as_array().unwrap().len(), 3, "{report}");
        assert!(report["worst"]["table"].is_string(), "{report}");

        let reset = pipeline.ddbpipe(&["state", "reset", "--yes"]);
        assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
        for table in TABLES {
            assert!(destination.state(&format!("sync:{table}")).is_empty());
        }
    }

    /// Into jsonl each table writes its own file and keeps its own state file.
    #[test]
    fn each_table_writes_its_own_jsonl_file_and_state_file() {
        let running = Emulator::Dynoxide.start();
        for (index, table) in TABLES.iter().enumerate() {
            seed(&running, table, 10 + index);
        }
        let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
        let dir = pipeline.dir.path();
        pipeline.write_with_sink(
            "sync",
            &running.endpoint,
            &format!("tables: [{}]", TABLES.join(", ")),
            &format!(
                "sink:\n  type: jsonl\n  path: {}/out/{{table}}.jsonl\nstate:\n  path: \
                 {}/state/{{table}}.json\n",
                dir.display(),
                dir.display()
            ),
        );
        let output = run(&pipeline);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        for (index, table) in TABLES.iter().enumerate() {
            let lines = std::fs::read_to_string(dir.join(format!("out/{table}.jsonl"))).unwrap();
            assert_eq!(lines.lines().count(), 10 + index, "{table}");
            assert!(
                lines
                    .lines()
                    .all(|line| line.contains(&format!("\"{table}-")))
            );
            let state: Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(format!("state/{table}.json"))).unwrap(),
            )
            .unwrap();
            assert!(
                state["pipelines"][format!("sync:{table}")].is_object(),
                "{state}"
            );
        }
    }
}

/// Tags `table` with `env`.
fn tag(running: &Running, table: &str, env: &str) {
    let described = common::rt()
        .block_on(running.client.describe_table().table_name(table).send())
        .unwrap();
    let arn = described.table.unwrap().table_arn.unwrap();
    let tag = aws_sdk_dynamodb::types::Tag::builder()
        .key("env")
        .value(env)
        .build()
        .unwrap();
    common::rt()
        .block_on(
            running
                .client
                .tag_resource()
                .resource_arn(arn)
                .tags(tag)
                .send(),
        )
        .unwrap();
}

/// `source.discover` by name pattern and tag: of five tables the two that match (an
/// excluded one, one of another tag and one of another name left out) are mirrored; a
/// matching table created while the run follows the streams is found at the next look and
/// mirrored; a matching table dropped mid-run stops with a warning, not a failure.
fn discovery_mirrors_the_matching_tables_and_picks_up_a_new_one(emulator: Emulator) {
    let running = emulator.start();
    for (table, env) in [
        ("orders-eu", "prod"),
        ("orders-us", "prod"),
        ("orders-tmp", "prod"),
        ("orders-dev", "dev"),
        ("customers", "prod"),
    ] {
        seed(&running, table, 8);
        tag(&running, table, env);
    }
    let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
    let destination = Destination::new(Target::Sqlite, pipeline.dir.path());
    pipeline.write_with_sink(
        "sync",
        &running.endpoint,
        "discover: {names: ['orders-*'], tags: {env: prod}, exclude: ['*-tmp'], \
         interval_secs: 1}\nmode: mirror\nfollow: true\nvalue_format: typed\npoll_interval_ms: 200",
        &destination.sink_yaml(),
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert!(
        stdout(&check).starts_with("discovered 2 table(s): orders-eu, orders-us"),
        "{}{}",
        stdout(&check),
        stderr(&check)
    );
    let mut child = spawn_logged(&pipeline, 1);
    let mirrored = |table: &str| {
        let items = keyed::table_items(&running.endpoint, table);
        destination.items(table) == items
    };
    let log = || std::fs::read_to_string(pipeline.dir.path().join("run-1.log")).unwrap();
    assert!(
        common::wait_for(Duration::from_secs(60), || mirrored("orders-eu")
            && mirrored("orders-us")),
        "the matching tables are mirrored: {}",
        log()
    );
    seed(&running, "orders-ap", 6);
    tag(&running, "orders-ap", "prod");
    common::rt()
        .block_on(running.client.delete_table().table_name("orders-us").send())
        .unwrap();
    running.put_pk("orders-eu", "orders-eu-new", "5");
    assert!(
        common::wait_for(Duration::from_secs(60), || mirrored("orders-ap")
            && mirrored("orders-eu")),
        "the new table is found and mirrored, and the others go on"
    );
    common::sigterm(&child);
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(pipeline.dir.path().join("run-1.log")).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    // A dropped table's stream may still be read to its end (moto serves it on; DynamoDB
    // disables it, and its records stay readable for a day) or fail its reads (dynoxide): the
    // run stops it with a warning or at the signal with the others, never as a failure.
    let warned = log.lines().any(|line| {
        line.contains("The table is no longer found by source.discover")
            && line.contains("orders-us")
    });
    assert!(
        warned || log.contains("table 'orders-us': ddbpipe: mirror of 'orders-us' ended"),
        "the dropped table is neither warned about nor ended: {log}"
    );
    assert!(
        !log.contains("tables failed"),
        "a dropped table is no failure: {log}"
    );
    assert!(!log.contains("error:"), "{log}");
    assert!(
        log.contains("A table source.discover matches now: its run starts."),
        "{log}"
    );
    for left_out in ["orders-tmp", "orders-dev", "customers"] {
        assert!(
            destination.rows(left_out).is_empty(),
            "{left_out} is not read"
        );
        assert!(!log.contains(&format!("table '{left_out}'")), "{log}");
    }
}

/// Two tables whose names differ only in case would be one table of a SQLite file: `check`
/// and `run` refuse them as discovery finds them, naming both and the remedy, and nothing is
/// written (docs/config.md §1.5). On moto: dynoxide, on SQLite itself, holds one of them.
#[test]
fn tables_found_differing_only_in_case_are_refused_before_a_row_is_written() {
    let running = Emulator::Moto.start();
    seed(&running, "Orders", 3);
    seed(&running, "orders", 3);
    let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
    let destination = Destination::new(Target::Sqlite, pipeline.dir.path());
    pipeline.write_with_sink(
        "sync",
        &running.endpoint,
        "discover: {names: ['*']}\nmode: scan",
        &destination.sink_yaml(),
    );
    let why = "finds tables 'Orders' and 'orders', which would write one SQLite table";
    for output in [pipeline.ddbpipe(&["check"]), run(&pipeline)] {
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(
            said.contains(why) && said.contains("source.discover.exclude: ['orders']"),
            "{said}"
        );
    }
    assert!(destination.rows("orders").is_empty(), "nothing is written");
}

/// A table `discover` finds whose name an S3 table cannot take (`_staging`: S3 Tables' names
/// begin with a letter or digit) is refused by `check` and `run` before any table is made,
/// naming it, the key and the `exclude` to add (docs/sinks.md §7.11 rule 1).
#[test]
fn a_table_found_whose_s3_table_name_is_refused_stops_check_and_run() {
    let running = Emulator::Moto.start();
    seed(&running, "orders", 2);
    seed(&running, "_staging", 2);
    let pipeline = Pipeline::new("sync", &running.endpoint, "table_name: unused");
    pipeline.write_with_sink(
        "sync",
        &running.endpoint,
        "discover: {names: ['*']}\nmode: scan",
        "sink:\n  type: iceberg\n  catalog: {type: s3tables, table_bucket_arn: \
         'arn:aws:s3tables:us-east-1:123456789012:bucket/lake'}\n",
    );
    for output in [pipeline.ddbpipe(&["check"]), run(&pipeline)] {
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(
            said.contains("finds table '_staging': sink.table: '_staging' is not an S3 Tables")
                && said.contains("source.discover.exclude: ['_staging']"),
            "{said}"
        );
    }
}

mod discovery {
    use super::*;

    #[test]
    fn on_dynoxide() {
        discovery_mirrors_the_matching_tables_and_picks_up_a_new_one(Emulator::Dynoxide);
    }

    #[test]
    fn on_moto() {
        discovery_mirrors_the_matching_tables_and_picks_up_a_new_one(Emulator::Moto);
    }
}

mod postgres {
    use super::*;

    #[test]
    fn three_tables_mirror_into_one_schema_each_from_its_own_position() {
        mirrors_three_tables_each_from_its_own_position(Target::Postgres);
    }

    #[test]
    fn three_workers_share_three_tables_through_a_kill_and_a_stop() {
        three_workers_share_three_tables(Target::Postgres);
    }
}
