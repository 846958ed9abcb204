//! The keyed sinks end to end through the CLI, issue 9: connection-string secrets in every
//! command's output, U+0000 in documents (`document_type`), and the process named by a held
//! PostgreSQL lock.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;

use common::keyed::{Destination, Target, postgres_url};
use common::{
    COMMANDS, Emulator, Pipeline, Running, assert_hidden, item, n, s, stderr, stdout, traced,
};

const MIRROR: &str = "table_name: orders\nmode: mirror\nidle_termination_secs: 1";

fn orders(running: &Running) {
    running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    running.put_pk("orders", "a", "1");
}

fn pipeline_with_sink(running: &Running, source: &str, sink: &str) -> Pipeline {
    let pipeline = Pipeline::new("orders-mirror", &running.endpoint, source);
    pipeline.write_with_sink("orders-mirror", &running.endpoint, source, sink);
    pipeline
}

/// docs/sinks.md §7.2: a table another pipeline writes — its position in the database's
/// `_ddbpipe_state` names the table (in SQLite in any case) — is refused by `check` and `run`
/// of a second pipeline file, naming the first pipeline and how to go on, before a row is
/// written; once the first pipeline's position is cleared (`state reset`), the second runs.
/// Another table of the same database (in PostgreSQL, one named in another case) is no one's.
fn a_table_another_pipeline_writes_is_refused_until_its_position_is_cleared(target: Target) {
    let running = Emulator::Dynoxide.start();
    orders(&running);
    running.put_pk("orders", "b", "2");
    let scan = "table_name: orders\nmode: scan";
    let first = Pipeline::new("first", &running.endpoint, scan);
    let db = Destination::new(target, first.dir.path());
    let sink = |table: &str| format!("{}  table: {table}\n", db.sink_yaml());
    // SQLite takes `Orders` for `orders`; PostgreSQL's quoted names are two tables.
    let named = match target {
        Target::Sqlite => "Orders",
        Target::Postgres => "orders",
    };
    first.write_with_sink("first", &running.endpoint, scan, &sink(named));
    let output = first.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    let second = Pipeline::new("second", &running.endpoint, scan);
    second.write_with_sink("second", &running.endpoint, scan, &sink("orders"));
    running.put_pk("orders", "c", "3");
    let check = second.ddbpipe(&["check"]);
    let said = stdout(&check);
    assert_ne!(check.status.code(), Some(0), "{said}");
    assert!(
        said.contains("FAIL state") && said.contains("holds the rows of pipeline 'first'"),
        "{said}"
    );
    let output = second.ddbpipe(&["run"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("table 'orders' holds the rows of pipeline 'first'")
            && err.contains("sink.table")
            && err.contains("ddbpipe state reset"),
        "{err}"
    );
    assert_eq!(
        db.rows("orders").len(),
        2,
        "nothing written by the refused run"
    );

    // Another table of the database: in PostgreSQL, `Orders` is one (quoted names compare
    // exactly).
    let another = match target {
        Target::Sqlite => "orders_copy",
        Target::Postgres => "Orders",
    };
    let other = Pipeline::new("other", &running.endpoint, scan);
    other.write_with_sink("other", &running.endpoint, scan, &sink(another));
    let output = other.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    let reset = first.ddbpipe(&["state", "reset", "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let output = second.ddbpipe(&["run"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(db.rows("orders").len(), 3);
}

#[test]
fn a_sqlite_table_another_pipeline_writes_is_refused() {
    a_table_another_pipeline_writes_is_refused_until_its_position_is_cleared(Target::Sqlite);
}

#[test]
fn a_postgres_table_another_pipeline_writes_is_refused() {
    a_table_another_pipeline_writes_is_refused_until_its_position_is_cleared(Target::Postgres);
}

mod postgres {
    use super::*;

    /// Issue 9 item 4(a): the driver split the userinfo at the first `@` and the masking at the
    /// last, so the host shown in messages was the password's tail. No command prints any
    /// piece of it, and the host is the real one.
    #[test]
    fn a_password_with_an_at_sign_reaches_no_output_of_any_command() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let password = "Pa@Wq7xK9zT";
        let port = ddbpipe_testkit::free_port();
        let url = format!(
            "postgres://ddbpipe:{password}@127.0.0.1:{port}/app?sslmode=disable&connect_timeout=2"
        );
        let pipeline = pipeline_with_sink(
            &running,
            MIRROR,
            &format!("sink:\n  type: postgres\n  url: '{url}'\n"),
        );
        for args in COMMANDS {
            let (output, text) = traced(&pipeline, args);
            assert_hidden(&text, password, 4, &format!("{args:?}"));
            if args[0] != "check" {
                assert_eq!(output.status.code(), Some(1), "{args:?}: {text}");
            }
            assert!(
                text.contains(&format!("127.0.0.1:{port}/app")),
                "{args:?} does not name the server: {text}"
            );
        }
    }

    /// Issue 9 item 4(b): a misspelled key used to be echoed with the whole string. Now it is a
    /// config error naming the key, in every command.
    #[test]
    fn a_misspelled_connection_string_key_is_named_without_the_password() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let password = "Wq7 xK9:zT@q";
        let url = format!(
            "host=127.0.0.1 port={} user=ddbpipe pasword='{password}' dbname=app",
            ddbpipe_testkit::free_port()
        );
        let pipeline = pipeline_with_sink(
            &running,
            MIRROR,
            &format!("sink:\n  type: postgres\n  url: \"{url}\"\n"),
        );
        for args in COMMANDS {
            let (output, text) = traced(&pipeline, args);
            assert_hidden(&text, password, 4, &format!("{args:?}"));
            assert_eq!(output.status.code(), Some(2), "{args:?}: {text}");
            assert!(
                text.contains("sink.url: unknown parameter 'pasword'"),
                "{args:?}: {text}"
            );
        }
    }

    /// The real password, in a quoted key=value string, through a whole mirror and every
    /// command after it. (It is random hex, which short pieces of shard ids and timestamps may
    /// match by chance, so pieces of 10 characters are looked for.)
    #[test]
    fn the_real_password_reaches_no_output_of_any_command() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let config: tokio_postgres::Config = postgres_url().parse().unwrap();
        let password = String::from_utf8(config.get_password().unwrap().to_vec()).unwrap();
        let tokio_postgres::config::Host::Tcp(host) = &config.get_hosts()[0] else {
            panic!("the tests need a TCP host")
        };
        let kv = format!(
            "host={host} port={} user='{}' password='{password}' dbname={} sslmode=disable",
            config.get_ports()[0],
            config.get_user().unwrap(),
            config.get_dbname().unwrap()
        );
        let pipeline = Pipeline::new("orders-mirror", &running.endpoint, MIRROR);
        let destination = Destination::new(Target::Postgres, pipeline.dir.path());
        pipeline.write_with_sink(
            "orders-mirror",
            &running.endpoint,
            MIRROR,
            &format!(
                "sink:\n  type: postgres\n  url: \"{kv}\"\n  schema: {}\n",
                destination.schema
            ),
        );
        let (output, text) = traced(&pipeline, &["run", "--progress", "never"]);
        assert_eq!(output.status.code(), Some(0), "{text}");
        assert_eq!(destination.documents("orders").len(), 1);
        for args in COMMANDS {
            let (output, text) = traced(&pipeline, args);
            assert_hidden(&text, &password, 10, &format!("{args:?}"));
            assert_eq!(output.status.code(), Some(0), "{args:?}: {text}");
        }
    }

    /// Issue 11: the libpq environment variables users expect are defaults for what the
    /// connection string does not name (`PGPASSWORD`, `PGUSER`, `PGDATABASE`, `PGHOST`,
    /// `PGPORT`, `PGSSLMODE`); a server that is down is named with the reason.
    #[test]
    fn libpq_environment_variables_complete_the_connection_string() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let config: tokio_postgres::Config = postgres_url().parse().unwrap();
        let password = String::from_utf8(config.get_password().unwrap().to_vec()).unwrap();
        let tokio_postgres::config::Host::Tcp(host) = &config.get_hosts()[0] else {
            panic!("the tests need a TCP host")
        };
        let pipeline = Pipeline::new("orders-mirror", &running.endpoint, MIRROR);
        let destination = Destination::new(Target::Postgres, pipeline.dir.path());
        pipeline.write_with_sink(
            "orders-mirror",
            &running.endpoint,
            MIRROR,
            &format!(
                "sink:\n  type: postgres\n  url: \"host={host}\"\n  schema: {}\n",
                destination.schema
            ),
        );
        let run = |port: u16| {
            std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
                .args(["run", "--progress", "never"])
                .arg(&pipeline.config)
                .env("PGPASSWORD", &password)
                .env("PGUSER", config.get_user().unwrap())
                .env("PGDATABASE", config.get_dbname().unwrap())
                .env("PGPORT", port.to_string())
                .env("PGSSLMODE", "disable")
                .output()
                .unwrap()
        };
        let output = run(config.get_ports()[0]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(destination.documents("orders").len(), 1);
        assert_hidden(&stderr(&output), &password, 10, "run");

        let down = ddbpipe_testkit::free_port();
        let output = run(down);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "{host}:{down}/{}: cannot connect as user {}",
                config.get_dbname().unwrap(),
                config.get_user().unwrap()
            )),
            "{err}"
        );
        assert!(err.contains("Connection refused"), "{err}");
        assert_hidden(&err, &password, 10, "a failed run");
    }

    /// Issue 9 item 12: the lock message named the PostgreSQL backend serving the other run;
    /// it names the other ddbpipe process.
    #[test]
    fn a_held_lock_names_the_ddbpipe_process_holding_it() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let source = "table_name: orders\nmode: mirror\nidle_termination_secs: 120";
        let pipeline = Pipeline::new("orders-mirror", &running.endpoint, source);
        let destination = Destination::new(Target::Postgres, pipeline.dir.path());
        pipeline.write_with_sink(
            "orders-mirror",
            &running.endpoint,
            source,
            &destination.sink_yaml(),
        );
        let mut first = common::spawn_run(&pipeline.config);
        let streaming = common::wait_for(Duration::from_secs(60), || {
            destination.state("orders-mirror").contains_key("meta")
        });
        assert!(streaming, "the first run committed no position");
        let pid = format!("pid {})", first.id());
        for args in [
            &["run", "--progress", "never"][..],
            &["state", "reset", "--yes"],
        ] {
            let output = pipeline.ddbpipe(args);
            assert_eq!(output.status.code(), Some(1), "{args:?}");
            let err = stderr(&output);
            assert!(
                err.contains("pipeline 'orders-mirror' is already running"),
                "{args:?}: {err}"
            );
            assert!(err.contains(&pid), "{args:?} does not name {pid}: {err}");
        }
        let check = stdout(&pipeline.ddbpipe(&["check"]));
        assert!(
            check.contains("WARN state") && check.contains(&pid),
            "{check}"
        );
        first.kill().unwrap();
        first.wait().unwrap();
    }

    fn pipeline_into(
        running: &Running,
        destination: &Destination,
        source: &str,
        extra: &str,
    ) -> Pipeline {
        let name = if source.contains("mirror") {
            "orders-mirror"
        } else {
            "orders-scan"
        };
        let pipeline = Pipeline::new(name, &running.endpoint, source);
        pipeline.write_with_sink(
            name,
            &running.endpoint,
            source,
            &format!("{}{extra}", destination.sink_yaml()),
        );
        pipeline
    }

    /// Issue 9 item 3: with `jsonb` an item holding U+0000 fails the run naming its key, the
    /// attribute and the option, and the hint does not promise that a rerun resumes; `json`
    /// keeps the document exactly; a table of another document type is refused.
    #[test]
    fn u0000_fails_a_jsonb_sink_naming_the_item_and_json_keeps_it() {
        let running = Emulator::Dynoxide.start();
        running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
        running.put_items(
            "orders",
            vec![
                item(vec![("pk", s("a")), ("v", s("plain"))]),
                item(vec![("pk", s("b")), ("v", s("x\u{0}y"))]),
            ],
        );
        let dir = tempfile::tempdir().unwrap();
        let destination = Destination::new(Target::Postgres, dir.path());

        // A scan (wiring's hint) and a mirror (the streams runner's hint), each run twice.
        for source in ["table_name: orders", MIRROR] {
            let jsonb = pipeline_into(&running, &destination, source, "");
            for attempt in ["first", "rerun"] {
                let output = jsonb.ddbpipe(&["run", "--progress", "never"]);
                assert_eq!(output.status.code(), Some(1), "{source}, {attempt}");
                let err = stderr(&output);
                for want in [
                    "the item with key pk \"b\" holds U+0000 in attribute 'v'",
                    "sink.document_type: json",
                    "hint: retrying cannot help",
                ] {
                    assert!(
                        err.contains(want),
                        "{source}, {attempt}: no {want:?} in {err}"
                    );
                }
                assert!(!err.contains("resumes"), "{source}, {attempt}: {err}");
            }
        }

        let json = pipeline_into(
            &running,
            &destination,
            "table_name: orders",
            "  table: orders_json\n  document_type: json\n",
        );
        let output = json.ddbpipe(&["run", "--progress", "never"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let documents = destination.documents("orders_json");
        assert_eq!(documents["b"]["v"], "x\u{0}y");
        assert_eq!(documents["a"]["v"], "plain");

        let text = pipeline_into(
            &running,
            &destination,
            "table_name: orders",
            "  table: orders_json\n  document_type: text\n",
        );
        let output = text.ddbpipe(&["run", "--progress", "never"]);
        assert_eq!(output.status.code(), Some(1));
        assert!(
            stderr(&output).contains(
                "exists with document column \"document\" of type json but sink.document_type is text"
            ),
            "{}",
            stderr(&output)
        );
    }

    /// Issue #24 item 16: a number no double holds was a string in the jsonb document and its
    /// neighbours numbers, so `(document->'ratio')::numeric` failed. Now a scan into `jsonb`
    /// and a mirror into `json` write every number as a JSON number of its exact digits
    /// (docs/values.md §3.7), and the cast is exact in every row.
    #[test]
    fn numbers_are_exact_json_numbers_in_jsonb_and_json_documents() {
        let running = Emulator::Dynoxide.start();
        running.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
        let numbers = [
            "12345678901234567890123456789012345678",
            "1E-130",
            "1E+125",
            "123456789.123456789",
            "0.5",
            "7",
        ];
        running.put_items(
            "orders",
            numbers
                .iter()
                .enumerate()
                .map(|(i, number)| item(vec![("pk", s(&i.to_string())), ("ratio", n(number))]))
                .collect(),
        );
        let dir = tempfile::tempdir().unwrap();
        let destination = Destination::new(Target::Postgres, dir.path());
        let values: Vec<String> = numbers
            .iter()
            .enumerate()
            .map(|(i, number)| format!("('{i}', '{number}')"))
            .collect();
        for (source, table, kind) in [
            ("table_name: orders", "orders_jsonb", "jsonb"),
            (MIRROR, "orders_json", "json"),
        ] {
            let pipeline = pipeline_into(
                &running,
                &destination,
                source,
                &format!("  table: {table}\n  document_type: {kind}\n"),
            );
            let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
            assert_eq!(output.status.code(), Some(0), "{kind}: {}", stderr(&output));
            let rows = destination.query_texts(&format!(
                "SELECT d.pk, {kind}_typeof(d.document->'ratio'), \
                 ((d.document->>'ratio')::numeric = v.x::numeric)::text \
                 FROM {table} d JOIN (VALUES {}) v(pk, x) ON v.pk = d.pk ORDER BY d.pk",
                values.join(", ")
            ));
            let want: Vec<Vec<String>> = (0..numbers.len())
                .map(|i| vec![i.to_string(), "number".into(), "true".into()])
                .collect();
            assert_eq!(rows, want, "{kind}");
        }
    }

    /// Issue #24 item 8: a session that cannot write — read-only from the URL's `options`, or a
    /// `statement_timeout` under 1 s from `PGOPTIONS` — passed `check` and failed `run` at
    /// once. `check` fails now with `run`'s message, naming the setting, and neither leaves a
    /// table behind (check's DDL is rolled back, run's is never reached).
    #[test]
    fn check_fails_like_run_on_a_session_that_cannot_write() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let source = "table_name: orders";
        let pipeline = Pipeline::new("orders-scan", &running.endpoint, source);
        let destination = Destination::new(Target::Postgres, pipeline.dir.path());
        let tables = || {
            common::rt().block_on(async {
                let count: i64 = ddbpipe_testkit::postgres::connect()
                    .await
                    .query_one(
                        "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1",
                        &[&destination.schema],
                    )
                    .await
                    .unwrap()
                    .get(0);
                count
            })
        };
        for (url, pgoptions, wanted) in [
            (
                format!(
                    "{}&options=-c%20default_transaction_read_only%3Don",
                    destination.url
                ),
                "",
                "the session is read-only (transaction_read_only = on)",
            ),
            (
                destination.url.clone(),
                "-c statement_timeout=200",
                "statement_timeout is 200ms, below the 1s",
            ),
        ] {
            pipeline.write_with_sink(
                "orders-scan",
                &running.endpoint,
                source,
                &format!(
                    "sink:\n  type: postgres\n  url: '{url}'\n  schema: {}\n",
                    destination.schema
                ),
            );
            let ddbpipe = |args: &[&str]| {
                std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
                    .args(args)
                    .arg(&pipeline.config)
                    .env("PGOPTIONS", pgoptions)
                    .output()
                    .unwrap()
            };
            let check = ddbpipe(&["check"]);
            let text = stdout(&check);
            assert_eq!(check.status.code(), Some(1), "{wanted}: {text}");
            let failed = text
                .lines()
                .find(|line| line.contains("FAIL") && line.contains("sink"))
                .unwrap_or_else(|| panic!("{wanted}: no failed sink probe in {text}"));
            assert!(failed.contains(wanted), "{wanted}: {text}");
            assert_eq!(tables(), 0, "{wanted}: check left a table behind");

            let run = ddbpipe(&["run", "--progress", "never"]);
            let err = stderr(&run);
            assert_eq!(run.status.code(), Some(1), "{wanted}: {err}");
            assert!(err.contains(wanted), "{wanted}: {err}");
            assert_eq!(tables(), 0, "{wanted}: run created a table");
        }
    }

    /// Issue 24 item 18: `/health` answers 200 `progressing` while batches commit, 503
    /// `stalled` once a sink write outlasts `metrics.health_stall_secs` (the destination table
    /// locked by another session), and 200 again once the lock is gone.
    #[test]
    fn health_is_stalled_while_a_locked_table_holds_a_write_and_recovers() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let dir = tempfile::tempdir().unwrap();
        let destination = Destination::new(Target::Postgres, dir.path());
        let pipeline = pipeline_with_sink(
            &running,
            "table_name: orders\nmode: streams\nfollow: true\nstart_position: trim_horizon",
            &format!(
                "{}metrics:\n  health_stall_secs: 2\n",
                destination.sink_yaml()
            ),
        );
        let port = ddbpipe_testkit::free_port();
        let address = format!("127.0.0.1:{port}");
        let child = common::spawn_run_with(&pipeline.config, &["--metrics-addr", &address]);
        let limit = Duration::from_secs(60);
        let progressing = common::wait_for_health(port, "progressing", limit);

        // Another session locks the destination table; the next change's write waits on it.
        let locker = common::rt().block_on(async {
            let client = ddbpipe_testkit::postgres::connect().await;
            client
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE \"{}\".orders IN ACCESS EXCLUSIVE MODE",
                    destination.schema
                ))
                .await
                .unwrap();
            client
        });
        running.put_pk("orders", "b", "1");
        let stalled = common::wait_for_health(port, "stalled", limit);
        common::rt().block_on(async { locker.batch_execute("ROLLBACK").await.unwrap() });
        let recovered = common::wait_for_health(port, "progressing", limit);
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let output = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr);

        let (status, body) = progressing.unwrap_or_else(|| panic!("no answer: {err}"));
        assert_eq!(
            (status, &body["state"]),
            (200, &"progressing".into()),
            "{body} {err}"
        );
        let (status, body) = stalled.unwrap_or_else(|| panic!("no answer: {err}"));
        assert_eq!(
            (status, &body["state"]),
            (503, &"stalled".into()),
            "{body} {err}"
        );
        assert!(body["sink_write_secs"].as_f64().unwrap() >= 2.0, "{body}");
        let (status, body) = recovered.unwrap_or_else(|| panic!("no answer: {err}"));
        assert_eq!(
            (status, &body["state"]),
            (200, &"progressing".into()),
            "{body} {err}"
        );
        assert_eq!(output.status.code(), Some(0), "{err}");
        assert!(destination.rows("orders").contains_key("b"), "{err}");
    }
}

mod sqlite {
    use super::*;

    /// Issue 9 item 3, SQLite: a TEXT document keeps `\u0000`, and SQLite's JSON functions read
    /// the U+0000 back.
    #[test]
    fn sqlite_keeps_u0000_exactly() {
        let running = Emulator::Dynoxide.start();
        running.create_pk_table("orders", None);
        running.put_items(
            "orders",
            vec![item(vec![("pk", s("b")), ("v", s("x\u{0}y"))])],
        );
        let pipeline = Pipeline::new("orders-scan", &running.endpoint, "table_name: orders");
        let destination = Destination::new(Target::Sqlite, pipeline.dir.path());
        pipeline.write_with_sink(
            "orders-scan",
            &running.endpoint,
            "table_name: orders",
            &destination.sink_yaml(),
        );
        let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(destination.documents("orders")["b"]["v"], "x\u{0}y");
        let db = rusqlite::Connection::open(&destination.path).unwrap();
        let (document, extracted): (String, String) = db
            .query_row(
                "SELECT document, json_extract(document, '$.v') FROM orders",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert!(document.contains(r#""v":"x\u0000y""#), "{document}");
        assert_eq!(extracted, "x\u{0}y");
    }

    /// `check` fails where `run` will: without `create_table`, a database that does not exist
    /// yet cannot hold the table the run needs.
    #[test]
    fn check_fails_like_run_on_a_missing_database_without_create_table() {
        let running = Emulator::Dynoxide.start();
        orders(&running);
        let pipeline = Pipeline::new("orders-scan", &running.endpoint, "table_name: orders");
        let path = pipeline.dir.path().join("missing.db");
        let sink = format!(
            "sink:\n  type: sqlite\n  path: {}\n  create_table: false\n",
            path.display()
        );
        pipeline.write_with_sink(
            "orders-scan",
            &running.endpoint,
            "table_name: orders",
            &sink,
        );
        let check = pipeline.ddbpipe(&["check"]);
        assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
        assert!(
            stdout(&check).contains("create_table is false"),
            "{}",
            stdout(&check)
        );
        let run = pipeline.ddbpipe(&["run", "--progress", "never"]);
        assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    }
}
