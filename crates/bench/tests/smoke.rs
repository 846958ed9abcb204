//! The bench end to end on a small table: both clients receive every item. Correctness only;
//! nothing here looks at the times.

use std::process::Command;

#[test]
fn both_clients_receive_every_item() {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
        .args(["--items", "2500", "--segments", "3", "--concurrency", "2"])
        .args(["--page-items", "400", "--json"])
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(report["setup"]["items"], 2500);
    for client in ["ddbpipe", "sdk"] {
        let summary = &report["clients"][client];
        assert!(
            summary["peak_rss_mib"].as_f64().expect("rss") > 0.0,
            "{client}: {report}"
        );
        assert!(
            summary["items_per_sec"].as_f64().expect("rate") > 0.0,
            "{client}: {report}"
        );
    }
}

#[test]
fn a_client_that_receives_the_wrong_count_fails() {
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
    let endpoint = format!("http://127.0.0.1:{}", ready["port"]);
    for client in ["ddbpipe", "sdk"] {
        let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe-bench"))
            .args(["phase", "--client", client, "--endpoint", &endpoint])
            .args([
                "--items",
                "31",
                "--segments",
                "2",
                "--concurrency",
                "2",
                "--clk-tck",
                "100",
            ])
            .output()
            .expect("the phase starts");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{client} accepted a short table");
        assert!(stderr.contains("received 30 items"), "{client}: {stderr}");
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
