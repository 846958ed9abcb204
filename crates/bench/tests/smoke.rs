//! The bench end to end on a small table, stream and export: both clients receive every item
//! and every change record, the export read every item, and the sink case loads every row
//! beside its floor (SQLite always; PostgreSQL when `DDBPIPE_TEST_POSTGRES_URL` names a
//! server). Correctness only; nothing here looks at the times.

use std::path::Path;
use std::process::Command;

#[test]
fn both_clients_receive_every_item_and_every_record() {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--case", "both", "--concurrency", "2", "--json"])
        .args(["--items", "2500", "--segments", "3", "--page-items", "400"])
        .args(["--records", "2500", "--shards", "3", "--export-files", "5"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reports: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON line per case"))
        .collect();
    assert_eq!(reports.len(), 3, "{stdout}");
    let cases = [
        ("scan", "items", "items_per_sec"),
        ("streams", "records", "records_per_sec"),
    ];
    assert_export_report(&reports[2], 2500, 5);
    for (report, (case, count, rate)) in reports.iter().zip(cases) {
        assert_eq!(report["case"], case);
        assert_eq!(report["setup"][count], 2500, "{report}");
        for client in ["ddbpipe", "sdk"] {
            let summary = &report["clients"][client];
            assert!(
                summary["peak_rss_mib"].as_f64().expect("rss") > 0.0,
                "{case} {client}: {report}"
            );
            assert!(
                summary[rate].as_f64().expect("rate") > 0.0,
                "{case} {client}: {report}"
            );
        }
    }
    assert_eq!(reports[1]["setup"]["shards"], 3);
}

/// The export case's JSON line: both paths ran on every item, and their ratios are there.
fn assert_export_report(report: &serde_json::Value, items: u64, files: u64) {
    assert_eq!(report["case"], "export", "{report}");
    assert_eq!(report["setup"]["items"], items, "{report}");
    assert_eq!(report["setup"]["files"], files, "{report}");
    assert!(
        report["setup"]["stored_bytes"].as_u64().expect("stored") > 0,
        "{report}"
    );
    for path in ["export", "scan"] {
        let summary = &report["paths"][path];
        assert!(
            summary["peak_rss_mib"].as_f64().expect("rss") > 0.0,
            "{path}: {report}"
        );
        assert!(
            summary["items_per_sec"].as_f64().expect("rate") > 0.0,
            "{path}: {report}"
        );
    }
    assert!(
        report["export_over_scan"]["items_per_sec"]
            .as_f64()
            .expect("ratio")
            > 0.0,
        "{report}"
    );
}

#[test]
fn the_export_case_reads_every_item_and_reports_against_the_scan() {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--case", "export", "--concurrency", "1,3", "--json"])
        .args(["--items", "1200", "--segments", "2", "--export-files", "4"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reports: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON line per concurrency"))
        .collect();
    assert_eq!(reports.len(), 2, "{stdout}");
    for (report, concurrency) in reports.iter().zip([1, 3]) {
        assert_export_report(report, 1200, 4);
        assert_eq!(report["setup"]["concurrency"], concurrency, "{report}");
    }

    // The table says the same.
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--case", "export", "--items", "300", "--export-files", "2"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("full export of 300 items in 2 gzip files"),
        "{stdout}"
    );
    assert!(stdout.contains("\nexport "), "{stdout}");
    assert!(stdout.contains("\nscan "), "{stdout}");
    assert!(stdout.contains("export/scan: CPU µs/item"), "{stdout}");
}

/// Writes the bench export of `items` items in `files` files under `dir`.
fn write_export(dir: &Path, items: u64, files: u32) {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .arg("write-export")
        .arg("--dir")
        .arg(dir)
        .args(["--items", &items.to_string(), "--files", &files.to_string()])
        .output()
        .expect("write-export starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "write-export failed: {stderr}");
    let written: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    assert_eq!(written["items"], items);
}

/// Runs the export phase over `dir`, expecting `expect` items in `files` files.
fn export_phase(dir: &Path, expect: u64, files: u32) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["phase", "--case", "export", "--client", "ddbpipe"])
        .args(["--endpoint", "", "--expect", &expect.to_string()])
        .args(["--segments", &files.to_string(), "--concurrency", "2"])
        .args(["--clk-tck", "100", "--export-dir"])
        .arg(dir)
        .output()
        .expect("the phase starts")
}

#[test]
fn an_export_read_that_is_short_or_damaged_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_export(dir.path(), 30, 3);
    let output = export_phase(dir.path(), 30, 3);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the export phase failed: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["received"], 30, "{report}");

    // A damaged data file (bytes after its gzip stream): its MD5 differs from its manifest's,
    // and the read fails naming it.
    let data = dir.path().join(
        "bench/AWSDynamoDB/01735689600000-0bench00/data/01735689600000-0bench00-0001.json.gz",
    );
    let mut bytes = std::fs::read(&data).expect("data file");
    bytes.push(0);
    std::fs::write(&data, bytes).expect("damaged");
    let output = export_phase(dir.path(), 30, 3);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a damaged export was read");
    assert!(
        stderr.contains("0001.json.gz") && stderr.contains("MD5"),
        "{stderr}"
    );
}

#[test]
fn a_list_of_concurrencies_measures_each_of_them() {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--case", "scan", "--client", "ddbpipe", "--json"])
        .args(["--concurrency", "1,3", "--items", "600", "--segments", "3"])
        .args(["--page-items", "100", "--latency-ms", "1"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let concurrencies: Vec<u64> = stdout
        .lines()
        .map(|line| {
            let report: serde_json::Value = serde_json::from_str(line).expect("JSON");
            assert_eq!(report["setup"]["items"], 600, "{report}");
            assert_eq!(report["setup"]["latency_ms"], 1, "{report}");
            report["setup"]["concurrency"]
                .as_u64()
                .expect("concurrency")
        })
        .collect();
    assert_eq!(concurrencies, [1, 3], "{stdout}");
}

#[test]
fn a_client_that_receives_the_wrong_count_fails() {
    let server = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["serve", "--items", "30", "--segments", "2"])
        .args(["--page-items", "7", "--records", "30", "--shards", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the server starts");
    let mut server = Server(server);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.0.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("ready line");
    let ready: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    let endpoint = format!("http://127.0.0.1:{}", ready["port"]);
    for (case, noun) in [("scan", "items"), ("streams", "records")] {
        for client in ["ddbpipe", "sdk"] {
            let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
                .args(["phase", "--case", case, "--client", client])
                .args(["--endpoint", &endpoint, "--expect", "31", "--segments", "2"])
                .args(["--concurrency", "2", "--clk-tck", "100"])
                .output()
                .expect("the phase starts");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success(),
                "{case} {client} accepted a short {case}"
            );
            assert!(
                stderr.contains(&format!("received 30 {noun}")),
                "{case} {client}: {stderr}"
            );
        }
    }
}

#[test]
fn a_sink_phase_that_leaves_the_wrong_rows_fails() {
    let server = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args([
            "serve",
            "--items",
            "30",
            "--segments",
            "2",
            "--page-items",
            "7",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the server starts");
    let mut server = Server(server);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.0.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("ready line");
    let ready: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = |work: &str| {
        let path = dir.path().join(format!("{work}.db"));
        serde_json::json!({"kind": "sqlite", "path": path})
    };
    let parquet = serde_json::json!({"kind": "parquet", "path": dir.path().join("parquet")});
    for (work, destination, received, rows) in [
        ("load", sqlite("load"), 30, 31),
        ("floor", sqlite("floor"), 31, 31),
        // The files read back hold the table's 30 rows, not 31.
        ("load", parquet, 30, 31),
    ] {
        let settings = serde_json::json!({
            "work": work,
            "destination": destination,
            "endpoint": format!("http://127.0.0.1:{}", ready["port"]),
            "received": received,
            "rows": rows,
            "segments": 2,
            "concurrency": 2,
            "postmaster": null,
        });
        let mut phase = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
            .args(["sink-phase", "--clk-tck", "100"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the phase starts");
        std::io::Write::write_all(
            &mut phase.stdin.take().expect("stdin"),
            format!("{settings}\n").as_bytes(),
        )
        .expect("settings written");
        let output = phase.wait_with_output().expect("the phase ends");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{work} accepted the wrong rows");
        assert!(
            stderr.contains(&format!(
                "wrote 30 of {received} and left 30 rows, not {rows}"
            )),
            "{work}: {stderr}"
        );
    }
}

#[test]
fn an_export_read_that_receives_the_wrong_count_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_export(dir.path(), 30, 2);
    let output = export_phase(dir.path(), 31, 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "export accepted a short export");
    assert!(stderr.contains("received 30 items"), "{stderr}");
}

/// Runs `--case sink` on a small table and stream with `args`; returns its JSON line. Kafka
/// only when `args` name a broker: two bench runs into one broker at once would share the
/// bench pipeline's `transactional.id` and fence each other.
fn sink_case(args: &[&str], postgres_url: Option<&str>) -> (serde_json::Value, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"));
    command
        .args([
            "--case",
            "sink",
            "--json",
            "--items",
            "1500",
            "--segments",
            "3",
        ])
        .args(["--page-items", "400", "--records", "1200", "--shards", "3"])
        .args(args)
        .env_remove("DDBPIPE_TEST_POSTGRES_URL")
        .env_remove("DDBPIPE_TEST_KAFKA_BROKERS");
    if let Some(url) = postgres_url {
        command.env("DDBPIPE_TEST_POSTGRES_URL", url);
    }
    let output = command.output().expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "the bench failed: {stderr}");
    let report = serde_json::from_slice(&output.stdout).expect("one JSON line");
    (report, stderr)
}

/// A load beside its floor, and the stream into the same destination and into jsonl.
fn assert_sink_figures(report: &serde_json::Value, kind: &str) {
    for path in ["ddbpipe", "floor"] {
        let summary = &report["load"][kind][path];
        assert!(
            summary["rows_per_sec"].as_f64().expect("rate") > 0.0,
            "{kind} {path}: {report}"
        );
        assert!(
            summary["peak_rss_mib"].as_f64().expect("rss") > 0.0,
            "{kind} {path}: {report}"
        );
    }
    assert!(
        report["load"][kind]["ddbpipe_over_floor"]["rows_per_sec"]
            .as_f64()
            .expect("ratio")
            > 0.0,
        "{report}"
    );
    for target in [kind, "jsonl"] {
        let summary = &report["stream"][target];
        assert!(
            summary["changes_per_sec"].as_f64().expect("rate") > 0.0,
            "{target}: {report}"
        );
    }
    assert!(
        report["stream"]["over_jsonl"][kind]["cpu_us_per_change"].is_number(),
        "{report}"
    );
}

/// The load and the stream into parquet, each beside the same into jsonl (issue 29).
fn assert_parquet_figures(report: &serde_json::Value) {
    for kind in ["jsonl", "parquet"] {
        let summary = &report["load"][kind]["ddbpipe"];
        assert!(
            summary["rows_per_sec"].as_f64().expect("rate") > 0.0,
            "{kind}: {report}"
        );
        assert!(summary["cpu_us_per_row"].is_number(), "{kind}: {report}");
        assert!(summary["peak_rss_mib"].is_number(), "{kind}: {report}");
    }
    assert!(
        report["load"]["parquet"]["over_jsonl"]["cpu_us_per_row"].is_number(),
        "{report}"
    );
    assert!(
        report["stream"]["parquet"]["changes_per_sec"]
            .as_f64()
            .expect("rate")
            > 0.0,
        "{report}"
    );
    assert!(
        report["stream"]["over_jsonl"]["parquet"]["peak_rss"].is_number(),
        "{report}"
    );
    assert!(
        report["setup"]["parquet"]["fs_type"].is_string(),
        "{report}"
    );
}

#[test]
fn the_sink_case_loads_sqlite_beside_its_floor_and_skips_postgres_without_a_server() {
    let (report, stderr) = sink_case(&["--sink", "both"], None);
    assert_eq!(report["case"], "sink", "{report}");
    assert_eq!(report["setup"]["items"], 1500, "{report}");
    assert_eq!(report["setup"]["shards"], 3, "{report}");
    // Every INSERT and MODIFY of the 1200 records leaves its row.
    let rows = report["setup"]["stream_rows"].as_u64().expect("rows");
    assert!((900..1200).contains(&rows), "{report}");
    assert!(
        report["setup"]["sqlite"]["filesystem"]["fs_type"].is_string(),
        "{report}"
    );
    assert_sink_figures(&report, "sqlite");
    assert_parquet_figures(&report);
    assert!(report["load"].get("postgres").is_none(), "{report}");
    assert!(
        report["setup"]["postgres_skipped"]
            .as_str()
            .is_some_and(|why| why.contains("DDBPIPE_TEST_POSTGRES_URL")),
        "{report}"
    );
    assert!(stderr.contains("PostgreSQL skipped"), "{stderr}");

    // Asking for PostgreSQL alone without a server is an error that says what to do.
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--case", "sink", "--sink", "postgres", "--items", "10"])
        .env_remove("DDBPIPE_TEST_POSTGRES_URL")
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a postgres sink case ran without a server"
    );
    assert!(stderr.contains("scripts/postgres.sh"), "{stderr}");
}

#[test]
fn the_sink_case_loads_postgres_beside_its_floor_when_a_server_is_given() {
    let Ok(url) = std::env::var("DDBPIPE_TEST_POSTGRES_URL") else {
        eprintln!(
            "DDBPIPE_TEST_POSTGRES_URL is not set: the sink case's PostgreSQL phases are not              tested (scripts/test.sh starts a server and sets it)"
        );
        return;
    };
    let (report, _) = sink_case(&["--sink", "postgres"], Some(&url));
    assert_sink_figures(&report, "postgres");
    assert!(report["load"].get("sqlite").is_none(), "{report}");
    assert!(
        report["setup"]["postgres"]["version"].is_string(),
        "{report}"
    );
}

/// The stream into Kafka, exactly once and at least once, beside jsonl (the broker of the test
/// run, `scripts/kafka.sh`).
#[test]
fn the_sink_case_streams_into_kafka_when_a_broker_is_given() {
    let brokers = ddbpipe_testkit::kafka::brokers();
    let (report, _) = sink_case(&["--sink", "sqlite", "--kafka-brokers", &brokers], None);
    for kind in ["kafka_exactly_once", "kafka_at_least_once"] {
        assert!(
            report["stream"][kind]["changes_per_sec"]
                .as_f64()
                .expect("rate")
                > 0.0,
            "{kind}: {report}"
        );
        assert!(
            report["stream"]["over_jsonl"][kind]["changes_per_sec"].is_number(),
            "{kind}: {report}"
        );
    }
}

/// Stops the server when the test ends, passing or not.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tables case: three tables of 200 items mirrored by one process beside one table of
/// 600, into SQLite and (when the test run's server is there) PostgreSQL; every phase checks
/// each destination table's rows, so the report's row counts are the items.
#[test]
fn the_tables_case_mirrors_many_tables_beside_one_into_each_database() {
    let url = std::env::var("DDBPIPE_TEST_POSTGRES_URL").ok();
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args([
            "--case", "tables", "--json", "--items", "600", "--tables", "3",
        ])
        .args(["--segments", "2", "--page-items", "100"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let reports: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let into: Vec<&str> = reports
        .iter()
        .map(|r| r["into"].as_str().unwrap())
        .collect();
    match url {
        Some(_) => assert_eq!(into, ["sqlite", "postgres"], "{stderr}"),
        None => assert_eq!(into, ["sqlite"], "{stderr}"),
    }
    for report in &reports {
        assert_eq!(report["many"]["tables"], 3, "{report}");
        assert_eq!(report["one"]["tables"], 1, "{report}");
        for side in ["one", "many"] {
            assert_eq!(report[side]["rows"], 600.0, "{report}");
            assert!(
                report[side]["peak_rss_mib"].as_f64().unwrap() > 0.0,
                "{report}"
            );
        }
        assert!(report["wall_ratio"].as_f64().unwrap() > 0.0, "{report}");
    }
}
