//! Golden state files (`tests/golden/README.md`): every state file ddbpipe has written is read
//! and written back; the current format comes back byte-identical, an earlier one in today's
//! format.

// A failed unwrap in a test is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use serde_json::Value;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// Loads every pipeline of the golden file into a copy and stores it back; returns the copy's
/// bytes.
fn rewritten(name: &str) -> (Vec<u8>, Vec<u8>) {
    let original = std::fs::read(golden(name)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(name);
    std::fs::write(&copy, &original).unwrap();
    let doc: Value = serde_json::from_slice(&original).unwrap();
    let file = StateFile::new(&copy);
    for pipeline in doc["pipelines"].as_object().unwrap().keys() {
        let entry = file.load(pipeline).unwrap().unwrap();
        file.store(pipeline, Some(&entry)).unwrap();
    }
    (original, std::fs::read(&copy).unwrap())
}

#[test]
fn every_current_state_file_is_written_back_byte_identically() {
    for name in [
        "demo-scan-completed.state.json",
        "demo-streams.state.json",
        "v1-shared.state.json",
        "v1-resnapshot-open.state.json",
        "v1-mirror-open.state.json",
    ] {
        let (original, written) = rewritten(name);
        assert_eq!(
            String::from_utf8(written).unwrap(),
            String::from_utf8(original).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn an_earlier_state_file_is_read_and_written_in_todays_format() {
    let (_, written) = rewritten("v0-streams-without-floors.state.json");
    let expected = std::fs::read(golden("v0-streams-without-floors.expected.json")).unwrap();
    assert_eq!(
        String::from_utf8(written).unwrap(),
        String::from_utf8(expected).unwrap()
    );
}

/// The open snapshot's record is read: its id, its reason, its scan progress.
#[tokio::test]
async fn an_open_snapshot_resumes_with_its_progress() {
    for (name, mirror) in [
        ("v1-resnapshot-open.state.json", false),
        ("v1-mirror-open.state.json", true),
    ] {
        let file = StateFile::new(golden(name));
        let identity = file.load("orders-mirror").unwrap().unwrap().identity;
        let checkpointer = Checkpointer::open_streams(
            file,
            "orders-mirror",
            Identity::from_json(identity.as_json().clone()),
            Duration::ZERO,
        )
        .await
        .unwrap();
        assert!(checkpointer.snapshot_open(), "{name}");
        assert!(!checkpointer.snapshot_complete(), "{name}");
        assert_eq!(
            checkpointer.snapshot_id(),
            Some(1_767_225_600_123),
            "{name}"
        );
        let progress = checkpointer.position();
        assert_eq!(progress.total_segments, 4);
        assert_eq!(progress.done.ranges(), [[0, 0]]);
        assert_eq!(progress.cursors.keys().copied().collect::<Vec<_>>(), [2, 3]);
        let kind = checkpointer.streams_position().unwrap().kind;
        assert_eq!(
            kind == ddbpipe_source::position::StreamKind::Mirror,
            mirror,
            "{name}"
        );
    }
}
