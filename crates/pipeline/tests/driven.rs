//! A driven run (`driven`, docs/state.md §6.9) on the in-memory stream, with paused
//! time: its batches are handed out and acknowledged out of order, and a child shard commits
//! nothing while a batch of its parent is held.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::driven::HandOut;
use ddbpipe_pipeline::runner::NoProgress;
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::run_streams;
use ddbpipe_source::fake_streams::{Change, FakeStreams};
use ddbpipe_source::ids::{SequenceNumber, ShardId};
use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::position::{Position, ShardProgress, StreamsPosition};
use ddbpipe_source::retry::{Cancel, NoObserver};
use ddbpipe_source::streams::engine::EndReason;
use ddbpipe_testkit::MemorySink;
use serde_json::json;

fn stored(dir: &Path) -> StreamsPosition {
    let entry = StateFile::new(dir.join("state.json")).load("p").unwrap();
    match entry.and_then(|e| e.position) {
        Some(Position::Streams(position)) => position,
        other => panic!("no streams position stored: {other:?}"),
    }
}

/// The shard a handed-out change names.
fn shard_of(line: &[u8]) -> String {
    let json: serde_json::Value = serde_json::from_slice(line).unwrap();
    json["shard_id"].as_str().unwrap().to_string()
}

#[tokio::test(start_paused = true)]
async fn a_child_shard_commits_nothing_while_a_batch_of_its_parent_is_held() {
    let mut fake = FakeStreams::new(7).at(
        Duration::ZERO,
        Change::Root {
            shard: "p".into(),
            range: None,
        },
    );
    for key in ["a", "b", "c"] {
        fake = fake.at(
            Duration::ZERO,
            Change::WriteTo {
                shard: "p".into(),
                key: key.into(),
            },
        );
    }
    fake = fake.at(
        Duration::from_secs(1),
        Change::Reshard {
            parent: "p".into(),
            children: vec!["c1".into(), "c2".into()],
            listed_after: Duration::from_secs(1),
        },
    );
    for (shard, key) in [("c1", "a"), ("c2", "b"), ("c1", "c"), ("c2", "d")] {
        fake = fake.at(
            Duration::from_secs(1),
            Change::WriteTo {
                shard: shard.into(),
                key: key.into(),
            },
        );
    }
    let fake = Arc::new(fake);
    let dir = tempfile::tempdir().unwrap();
    let (out, mut batches) = HandOut::new(NonZeroUsize::new(16).unwrap(), Cancel::never(), "test");
    let checkpointer = Checkpointer::open_streams(
        StateFile::new(dir.path().join("state.json")),
        "p",
        Identity::from_json(json!({"table_name": "t", "mode": "streams"})),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .with_hand_out(Some(out));
    // A batch a record: the parent's three, then the children's four.
    let mut settings = ddbpipe_testkit::fake_stream_run();
    settings.batch = BatchLimits::records(1);
    let run = tokio::spawn({
        let fake = Arc::clone(&fake);
        async move {
            let mut sink = MemorySink::default();
            let mut checkpointer = checkpointer;
            run_streams(
                fake,
                &settings,
                &mut sink,
                &mut checkpointer,
                Cancel::never(),
                Arc::new(NoObserver),
                &NoProgress,
            )
            .await
        }
    });

    let first = batches.next().await.unwrap();
    assert_eq!(shard_of(first.records.get(0).unwrap()), "p");
    let mut children = 0;
    for _ in 0..6 {
        let batch = batches.next().await.unwrap();
        if shard_of(batch.records.get(0).unwrap()) != "p" {
            children += 1;
        }
        batch.ack.ack();
    }
    assert_eq!(children, 4, "the children's records were handed out");
    // The run takes every acknowledgement it can (paused time moves on once it idles).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = stored(dir.path());
    assert!(
        matches!(
            held.progress(&ShardId::new("p")),
            Some(ShardProgress::TrimHorizon { .. })
        ),
        "the parent stays before its first batch: {held:?}"
    );
    for child in ["c1", "c2"] {
        assert!(
            !held.knows(&ShardId::new(child)),
            "{child} committed before its parent's batches: {held:?}"
        );
    }

    first.ack.ack();
    let outcome = run.await.unwrap().unwrap();
    assert_eq!(outcome.end, EndReason::Idle);
    assert!(batches.next().await.is_none());
    let position = stored(dir.path());
    assert!(position.is_finished(&ShardId::new("p")), "{position:?}");
    for child in ["c1", "c2"] {
        let last = fake
            .written()
            .iter()
            .filter(|w| w.shard.as_str() == child)
            .map(|w| w.seq.clone())
            .next_back()
            .unwrap();
        assert_eq!(
            position.shards[&ShardId::new(child)],
            ShardProgress::After(SequenceNumber::parse(&last.to_string()).unwrap())
        );
    }
}
