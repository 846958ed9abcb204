//! The bench end to end on a small table and stream: both clients receive every item and every
//! change record. Correctness only; nothing here looks at the times.

use std::process::Command;

#[test]
fn both_clients_receive_every_item_and_every_record() {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--case", "both", "--concurrency", "2", "--json"])
        .args(["--items", "2500", "--segments", "3", "--page-items", "400"])
        .args(["--records", "2500", "--shards", "3"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reports: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON line per case"))
        .collect();
    assert_eq!(reports.len(), 2, "{stdout}");
    let cases = [
        ("scan", "items", "items_per_sec"),
        ("streams", "records", "records_per_sec"),
    ];
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

/// Stops the server when the test ends, passing or not.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
