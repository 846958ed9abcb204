//! Driving the reading yourself (`ddbpipe::Pipeline::batches`, docs/state.md §6.9) against the
//! embedded emulator: acknowledgements in any order commit each segment's acknowledged prefix,
//! a held batch keeps only its own segments back, the window bounds what is held, a batch
//! dropped unacknowledged fails the run, and a stop saves what was acknowledged.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use common::drive::{CUSTOM, drive_shuffled, keys, next_batch, started};
use common::{Emulator, Pipeline, rt};
use ddbpipe::{Cancel, Ended, ErrorKind};

/// A table of `items` items (`k00`, `k01`, …) and a pipeline scanning it in `segments`
/// segments, five items a page and a batch, into the caller's loop.
fn scan_of(items: usize, segments: u32) -> (common::Running, Pipeline) {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    for i in 0..items {
        emulator.put_pk("orders", &format!("k{i:02}"), "1");
    }
    let files = Pipeline::new("orders", &emulator.endpoint, "");
    files.write_with_sink(
        "orders",
        &emulator.endpoint,
        &format!("table_name: orders\nsegments: {segments}\nbatch_size: 5\npage_limit: 5"),
        CUSTOM,
    );
    (emulator, files)
}

/// The stored scan position: how many segments are done or have a cursor.
fn segments_with_progress(files: &Pipeline) -> usize {
    let text = std::fs::read_to_string(files.dir.path().join("state.json")).unwrap_or_default();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let position = &doc["pipelines"]["orders"]["position"];
    let count = |field: &str| {
        position[field]
            .as_object()
            .map(|o| o.len())
            .or_else(|| position[field].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    count("cursors") + count("done")
}

/// Reads the rest of the table with acknowledgements in order; returns the keys delivered.
fn rest(files: &Pipeline) -> Vec<String> {
    let (summary, got) = drive_shuffled(files, 1, 0);
    assert_eq!(summary.ended(), Ended::Complete, "{summary}");
    got
}

fn all_keys(items: usize) -> BTreeSet<String> {
    (0..items).map(|i| format!("k{i:02}")).collect()
}

#[test]
fn acknowledgements_in_reverse_order_commit_every_segment_but_the_one_of_a_held_batch() {
    let (_emulator, files) = scan_of(60, 3);
    let (handle, stop) = Cancel::new();
    let (held_keys, acked) = rt().block_on(async {
        let mut batches = started(&files, 16, stop).await;
        // The first batch is held unacknowledged; the next eight are acknowledged four at a
        // time, each four in reverse order.
        let held = next_batch(&mut batches).await;
        let mut acked = Vec::new();
        for _ in 0..2 {
            let mut four = Vec::new();
            for _ in 0..4 {
                four.push(next_batch(&mut batches).await);
            }
            while let Some(batch) = four.pop() {
                acked.extend(keys(&batch));
                batch.ack();
            }
        }
        handle.cancel();
        // What was handed out before the stop is not acknowledged: dropped, it is delivered
        // again by the next run.
        while let Some(batch) = batches.next().await {
            drop(batch.expect("no failure"));
        }
        let summary = batches.finish().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(summary.ended(), Ended::Stopped, "{summary}");
        (keys(&held), acked)
    });
    assert_eq!(acked.len(), 40);
    assert!(
        segments_with_progress(&files) >= 1,
        "the segments the held batch does not hold advanced"
    );

    let second = rest(&files);
    let second_keys: BTreeSet<String> = second.iter().cloned().collect();
    for key in &held_keys {
        assert!(
            second_keys.contains(key),
            "the held batch's segment did not move past it: {key} is read again"
        );
    }
    assert!(
        second.len() < 60,
        "the acknowledged batches of the other segments were committed: {} read again",
        second.len()
    );
    let mut every: BTreeSet<String> = acked.into_iter().collect();
    every.extend(second_keys);
    assert_eq!(every, all_keys(60), "nothing is lost");
}

#[test]
fn acknowledgements_in_random_order_complete_a_scan_and_clear_its_position() {
    let seed = 25;
    let (_emulator, files) = scan_of(60, 4);
    let (summary, got) = drive_shuffled(&files, 4, seed);
    assert_eq!(summary.ended(), Ended::Complete, "seed {seed}: {summary}");
    assert_eq!(summary.written(), Some(60));
    let got: BTreeSet<String> = got.into_iter().collect();
    assert_eq!(got, all_keys(60), "seed {seed}");
    assert_eq!(segments_with_progress(&files), 0, "the position is cleared");
}

#[test]
fn a_full_window_holds_the_reading_back_and_a_stop_saves_only_the_acknowledged_prefix() {
    let (_emulator, files) = scan_of(60, 1);
    let (handle, stop) = Cancel::new();
    let (summary, acked, after_stop) = rt().block_on(async {
        let mut batches = started(&files, 3, stop).await;
        let mut window = Vec::new();
        for _ in 0..3 {
            window.push(next_batch(&mut batches).await);
        }
        // Time for a reader that ignored the window to run ahead (nothing depends on it).
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Batches 2 and 3 are acknowledged, batch 1 is still held when the run stops.
        let third = window.pop().expect("batch 3");
        let second = window.pop().expect("batch 2");
        let first = window.pop().expect("batch 1");
        assert_eq!([first.number(), second.number(), third.number()], [1, 2, 3]);
        let acked: Vec<String> = keys(&second).into_iter().chain(keys(&third)).collect();
        third.ack();
        second.ack();
        handle.cancel();
        let mut after_stop = 0;
        while let Some(batch) = batches.next().await {
            after_stop += batch.expect("no failure").len();
        }
        // The held batch is still alive while the run ends: it is not waited for.
        let summary = batches.finish().await;
        drop(first);
        (summary, acked, after_stop)
    });
    let summary = summary.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Stopped, "{summary}");
    assert_eq!(
        after_stop, 0,
        "with three batches held, a fourth was never handed out"
    );
    assert_eq!(
        segments_with_progress(&files),
        0,
        "one segment, its first batch unacknowledged: nothing committed"
    );
    let second = rest(&files);
    assert_eq!(second.len(), 60, "every item is read again");
    assert!(acked.iter().all(|key| second.contains(key)));
}

#[test]
fn a_stop_while_the_scans_end_waits_for_a_held_batch_leaves_the_scan_unfinished() {
    let (_emulator, files) = scan_of(10, 1);
    let (handle, stop) = Cancel::new();
    let (summary, held_keys) = rt().block_on(async {
        let mut batches = started(&files, 16, stop).await;
        let first = next_batch(&mut batches).await;
        let second = next_batch(&mut batches).await;
        second.ack();
        // The whole table was read: the scan's end waits for the first batch.
        assert!(batches.next().await.is_none());
        handle.cancel();
        let summary = batches.finish().await;
        (summary, keys(&first))
    });
    let held_keys: Vec<String> = held_keys;
    let summary = summary.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Stopped, "{summary}");
    let entry = files.entry("orders").unwrap_or_default();
    assert!(
        entry["last_completed"].is_null(),
        "the scan's end was not committed: {entry}"
    );
    let second = rest(&files);
    assert!(
        held_keys.iter().all(|key| second.contains(key)),
        "the position stays before the held batch"
    );
    assert_eq!(second.len(), 10, "one segment, held at its first batch");
}

#[test]
fn a_batch_dropped_without_its_acknowledgement_fails_the_run_and_is_delivered_again() {
    let (_emulator, files) = scan_of(30, 1);
    let (error, acked) = rt().block_on(async {
        // One batch a window: the drop is seen while the run still reads.
        let mut batches = started(&files, 1, Cancel::never()).await;
        let first = next_batch(&mut batches).await;
        let acked = keys(&first);
        first.ack();
        let second = next_batch(&mut batches).await;
        drop(second);
        let mut error = None;
        while let Some(batch) = batches.next().await {
            match batch {
                Ok(batch) => batch.ack(),
                Err(failed) => error = Some(failed),
            }
        }
        let finished = batches.finish().await.expect_err("the run failed");
        assert_eq!(finished.to_string(), error.as_ref().expect("").to_string());
        (error.expect("the batches end with the run's error"), acked)
    });
    assert_eq!(error.kind(), ErrorKind::Runtime);
    assert!(
        error
            .to_string()
            .contains("batch 2 was dropped without ack()"),
        "{error}"
    );
    let second = rest(&files);
    assert_eq!(
        second.len(),
        25,
        "the position is after the first batch, before the dropped one"
    );
    assert!(acked.iter().all(|key| !second.contains(key)));
}

#[test]
fn a_batch_failed_by_the_program_ends_the_run_with_its_error() {
    let (_emulator, files) = scan_of(10, 1);
    let error = rt().block_on(async {
        let mut batches = started(&files, 16, Cancel::never()).await;
        let batch = next_batch(&mut batches).await;
        batch.fail(ddbpipe::sink::SinkError::definite(
            "the order service refused k00",
        ));
        while let Some(batch) = batches.next().await {
            if let Ok(batch) = batch {
                batch.ack();
            }
        }
        batches.finish().await.expect_err("the run failed")
    });
    assert!(
        error.to_string().contains("the order service refused k00"),
        "{error}"
    );
    assert_eq!(segments_with_progress(&files), 0);
}

#[test]
fn changes_are_driven_to_the_streams_end_and_a_rerun_resumes_after_them() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let files = Pipeline::new("changes", &emulator.endpoint, "");
    files.write_with_sink(
        "changes",
        &emulator.endpoint,
        "table_name: orders\nmode: streams\nstart_position: trim_horizon\nidle_termination_secs: 2\nbatch_size: 2",
        CUSTOM,
    );
    for i in 0..7 {
        emulator.put_pk("orders", &format!("k{i}"), "1");
    }
    let drive = |files: &Pipeline| {
        rt().block_on(async {
            let mut batches = ddbpipe::Pipeline::from_path(&files.config)
                .expect("a valid pipeline")
                .batches(Cancel::never())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut held = Vec::new();
            let mut ops = Vec::new();
            while let Some(batch) = batches.next().await {
                let batch = batch.unwrap_or_else(|e| panic!("{e}"));
                ops.extend(batch.records().iter().map(|r| r.op()));
                held.push(batch);
                if held.len() == 2 {
                    // The later batch first.
                    while let Some(batch) = held.pop() {
                        batch.ack();
                    }
                }
            }
            for batch in held {
                batch.ack();
            }
            (
                batches.finish().await.unwrap_or_else(|e| panic!("{e}")),
                ops,
            )
        })
    };
    let (summary, ops) = drive(&files);
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    assert_eq!(ops, vec![ddbpipe::sink::Op::Insert; 7]);
    emulator.put_pk("orders", "k9", "2");
    let (summary, ops) = drive(&files);
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    assert_eq!(
        ops,
        [ddbpipe::sink::Op::Insert],
        "only the change made since"
    );
}

#[test]
fn a_pipeline_into_a_sink_of_its_own_or_given_a_sink_is_refused_naming_the_field() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    let files = Pipeline::new("orders", &emulator.endpoint, "table_name: orders");
    let error = rt()
        .block_on(async {
            ddbpipe::Pipeline::from_path(&files.config)
                .expect("a valid pipeline")
                .batches(Cancel::never())
                .await
        })
        .expect_err("a jsonl sink");
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(
        error.to_string().contains("sink.type")
            && error
                .to_string()
                .contains("set sink.type to custom, not jsonl"),
        "{error}"
    );
    assert!(!files.state.exists(), "nothing was read or written");

    // A position another sink left is refused when the batches start, before any is read.
    emulator.create_pk_table("events", Some(StreamViewType::NewAndOldImages));
    files.write_with_sink(
        "orders",
        &emulator.endpoint,
        "table_name: events\nmode: streams\nidle_termination_secs: 1",
        CUSTOM,
    );
    let summary = rt()
        .block_on(
            ddbpipe::Pipeline::from_path(&files.config)
                .expect("a valid pipeline")
                .with_sink(Ignored)
                .run(Cancel::never()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Idle);
    let error = rt()
        .block_on(async {
            ddbpipe::Pipeline::from_path(&files.config)
                .expect("a valid pipeline")
                .batches(Cancel::never())
                .await
        })
        .expect_err("a position of another sink");
    assert_eq!(error.kind(), ErrorKind::Config, "{error}");
    assert!(error.to_string().contains("sink_path changed"), "{error}");
}

/// A sink that takes every batch and keeps nothing.
struct Ignored;

impl ddbpipe::sink::Sink for Ignored {
    fn describe(&self) -> String {
        "ignored".to_string()
    }

    async fn write(
        &mut self,
        _batch: &ddbpipe::sink::Batch,
    ) -> Result<(), ddbpipe::sink::SinkError> {
        Ok(())
    }
}

#[test]
fn a_mirror_is_driven_through_its_snapshot_into_its_stream_and_resumes_after_it() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    for i in 0..12 {
        emulator.put_pk("orders", &format!("k{i:02}"), "1");
    }
    let files = Pipeline::new("mirror", &emulator.endpoint, "");
    files.write_with_sink(
        "mirror",
        &emulator.endpoint,
        "table_name: orders\nmode: mirror\nidle_termination_secs: 2\nsegments: 2\nbatch_size: 3\n\
         page_limit: 3\nresnapshot_deletes: false",
        CUSTOM,
    );
    // Each batch is acknowledged by a task of its own: the acknowledgements come back in the
    // order the tasks finish.
    let drive = |files: &Pipeline| {
        rt().block_on(async {
            let mut batches = ddbpipe::Pipeline::from_path(&files.config)
                .expect("a valid pipeline")
                .batches(Cancel::never())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let mut ops = Vec::new();
            let mut tasks = tokio::task::JoinSet::new();
            while let Some(batch) = batches.next().await {
                let batch = batch.unwrap_or_else(|e| panic!("{e}"));
                ops.extend(batch.records().iter().map(|r| r.op()));
                let wait = 3 - batch.number() % 3;
                tasks.spawn(async move {
                    for _ in 0..wait {
                        tokio::task::yield_now().await;
                    }
                    batch.ack();
                });
            }
            while tasks.join_next().await.is_some() {}
            (
                batches.finish().await.unwrap_or_else(|e| panic!("{e}")),
                ops,
            )
        })
    };
    let (summary, ops) = drive(&files);
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    use ddbpipe::sink::Op;
    assert_eq!(ops[..12], [Op::Snapshot; 12], "the snapshot first");
    // The stream from the capture on: the emulator's stream holds the writes made before it.
    assert!(ops[12..].iter().all(|op| *op == Op::Insert), "{ops:?}");
    emulator.put_pk("orders", "k03", "2");
    let (summary, ops) = drive(&files);
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    assert_eq!(
        ops,
        [Op::Modify],
        "the rerun resumes after what was acknowledged"
    );
}
