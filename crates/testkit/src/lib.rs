//! What ddbpipe's tests share (docs/testing.md, "Which fake to use for what"): the in-memory sink of the pipeline tests,
//! the PostgreSQL test server with a throwaway schema per test, and the Kafka test broker. Pipeline files for the CLI
//! tests are built by the CLI's own harness (`crates/cli/tests/common`), which also runs the
//! emulators and the binary.
//!
//! # Which fake for what
//! - **In-process fakes** behind the engine's traits (`ddbpipe_source::fake::FakeTable`,
//!   `ddbpipe_source::fake_streams::FakeStreams`, [`MemorySink`]): the engine's rules under
//!   paused time, faults by seed, the seeded simulation. Fast and exact; no HTTP.
//! - **Scripted HTTP fakes** (`wiremock`, the CLI's `fake_dynamodb` and `fake_streams`): what
//!   no emulator does (throttling, 5xx, timeouts, shard splits, trims, iterator expiry), through
//!   the real AWS client and the binary.
//! - **Emulators** (dynoxide in process, moto as a server, [`moto`]): the real wire protocol end
//!   to end, from the CLI.
//! - **Databases**: SQLite in a temporary directory; PostgreSQL from [`postgres`], a fresh schema
//!   per test in the server `scripts/test.sh` starts.
//! - **Kafka**: the broker `scripts/test.sh` starts, from [`kafka`], a topic of its own per
//!   test, judged by its committed view (the raw log with its transaction markers applied).

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

pub mod iceberg_rest;
pub mod kafka;
pub mod kafka_front;
mod memory;
pub mod moto;
pub mod postgres;
mod stream_run;

pub use memory::{Acked, MemorySink};
pub use stream_run::fake_stream_run;

/// A free loopback port (for a server a test starts, or `--metrics-addr`): free when chosen;
/// a server that finds it taken since is the caller's to retry.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Whether `child`, a server a test started on `port`, answers `GET <path>` with 200 (its
/// own route: not another test's server that took the port first), waiting up to 60 s;
/// `false` once it exited.
pub(crate) fn answers(child: &mut std::process::Child, port: u16, path: &str) -> bool {
    use std::io::{Read as _, Write as _};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let request = format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n");
    while std::time::Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let mut answer = String::new();
            let asked = stream
                .write_all(request.as_bytes())
                .and_then(|()| stream.read_to_string(&mut answer));
            if asked.is_ok() && answer.split_whitespace().nth(1) == Some("200") {
                return child.try_wait().ok().flatten().is_none();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// The directory of the package whose test is running, as cargo gives it when it *runs* the
/// test (the test's working directory when it is run by hand).
///
/// Not `env!("CARGO_MANIFEST_DIR")`, the directory it was *built* from: cargo takes a test
/// binary built from another checkout of the same sources as fresh when the two share a target
/// directory (the gate's cache; a copy of the repository at another path), and the path
/// compiled into it may be gone. `tests/doc_references.rs` keeps every test on this one.
///
/// # Panics
/// When neither is known (a failed test).
pub fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap())
}

/// The repository's root: two levels above the package's directory (`crates/<name>`).
pub fn repository() -> std::path::PathBuf {
    package_dir().join("../..")
}

/// The `pk` string of each JSON line, in order: the key of the test tables' items.
///
/// # Panics
/// On a line that is not a JSON object with a string `pk` (a failed test).
#[allow(clippy::unwrap_used)]
pub fn pks<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    lines
        .into_iter()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["pk"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}
