use bytes::Bytes;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_source::position::{Position, ScanKind, ScanPosition};
use ddbpipe_source::records::Lines;
use ddbpipe_value::Value;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::*;
use crate::commits::LOG;
use crate::partition::Term;

fn shape() -> Shape {
    Shape::new(
        vec![("pk".into(), ddbpipe_keyed::KeyType::S)],
        ddbpipe_value::ValueFormat::Plain,
        Records::Items,
        false,
    )
    .unwrap()
}

fn settings(dir: &Path, interval: Duration) -> ParquetSettings {
    ParquetSettings {
        objects: Objects::Local(dir.to_path_buf()),
        pipeline: "orders".into(),
        shape: shape(),
        target_file_bytes: 64 * 1024 * 1024,
        commit_interval: interval,
        compression: FileCompression::default(),
        iceberg: None,
    }
}

/// A batch of items `from..to` whose entry has reached segment 0's `to`.
fn batch(from: usize, to: usize) -> (Batch, Staged) {
    let mut records = Lines::with_capacity(to - from, 0);
    for i in from..to {
        records.push_with(|buf| buf.extend_from_slice(format!(r#"{{"pk":"k{i}"}}"#).as_bytes()));
    }
    let mut position = ScanPosition::new(ScanKind::Scan, 1);
    position
        .cursors
        .insert(0, [("pk".to_string(), Value::S(format!("k{to}")))].into());
    let entry = Entry {
        identity: Identity::from_json(serde_json::json!({"table_name": "orders"})),
        last_completed: None,
        position: Some(Position::Scan(position)),
        updated_at: "2026-12-05T00:00:00.000Z".into(),
    };
    let staged = Staged {
        pipeline: "orders".into(),
        entry,
    };
    (
        Batch {
            records,
            ..Batch::default()
        },
        staged,
    )
}

/// Rows in every data file under `dir`.
fn rows_in(dir: &Path) -> usize {
    let mut rows = 0;
    let mut names = Vec::new();
    crate::objects::walk(dir, dir, &mut names).unwrap();
    for name in names {
        if commits::file_seq(&name).is_some() {
            let bytes = Bytes::from(std::fs::read(dir.join(&name)).unwrap());
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .unwrap()
                .build()
                .unwrap();
            rows += reader.map(|b| b.unwrap().num_rows()).sum::<usize>();
        }
    }
    rows
}

fn cursor(entry: &Entry) -> String {
    match &entry.position {
        Some(Position::Scan(scan)) => match &scan.cursors[&0]["pk"] {
            Value::S(pk) => pk.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Rules 1–3: batches held past the last commit are not part of the output, nor is their
/// position; a run that stops without committing them leaves orphans the next start deletes.
#[tokio::test]
async fn what_no_commit_names_is_neither_output_nor_position() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut store) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    assert_eq!(store.load("orders").await.unwrap(), None);
    sink.start(RunStart::Fresh).await.unwrap();
    let (first, staged) = batch(0, 10);
    sink.write(&first, Some(&staged)).await.unwrap();
    assert_eq!(rows_in(dir.path()), 0, "held, not committed");
    store.commit_held().await.unwrap();
    assert_eq!(rows_in(dir.path()), 10);
    let (second, staged) = batch(10, 25);
    sink.write(&second, Some(&staged)).await.unwrap();
    // The files of a commit that never happens: written out, then the run dies.
    sink.writer.lock().await.roll("").await.unwrap();
    assert_eq!(rows_in(dir.path()), 25);
    drop(sink);

    let (_, mut store) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    let entry = store.load("orders").await.unwrap().unwrap();
    assert_eq!(cursor(&entry), "k10", "the position of the last commit");
    assert_eq!(rows_in(dir.path()), 10, "the orphan was deleted");
}

/// Rule 2: a commit interval of 0 commits every batch; the position read back is the last
/// batch's; another pipeline's log is refused.
#[tokio::test]
async fn every_batch_commits_at_interval_zero_and_the_log_belongs_to_one_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut store) = ParquetSink::open(settings(dir.path(), Duration::ZERO));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    for i in 0..3 {
        let (batch, staged) = batch(i * 5, i * 5 + 5);
        sink.write(&batch, Some(&staged)).await.unwrap();
    }
    assert_eq!(rows_in(dir.path()), 15);
    let commits = Objects::Local(dir.path().to_path_buf())
        .list(LOG)
        .await
        .unwrap();
    assert_eq!(commits.len(), 4, "the run's claim and a commit a batch");
    let entry = store.load("orders").await.unwrap().unwrap();
    assert_eq!(cursor(&entry), "k15");
    let problem = store.load("other").await.unwrap_err().to_string();
    assert!(
        problem.contains("holds the output of pipeline 'orders'"),
        "{problem}"
    );
}

/// `commits` rule 3: of two writers of one location, the one that commits a taken sequence
/// number is fenced, and nothing of its batches is named by a commit.
#[tokio::test]
async fn a_second_writer_fences_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, mut first_store) =
        ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    first_store.load("orders").await.unwrap();
    first.start(RunStart::Fresh).await.unwrap();
    let (mut second, mut second_store) =
        ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    second_store.load("orders").await.unwrap();
    second.start(RunStart::Fresh).await.unwrap();
    let (batch, staged) = batch(0, 4);
    second.write(&batch, Some(&staged)).await.unwrap();
    second_store.commit_held().await.unwrap();
    first.write(&batch, Some(&staged)).await.unwrap();
    let refused = first_store.commit_held().await.unwrap_err().to_string();
    assert!(refused.contains("committed to"), "{refused}");
    assert_eq!(rows_in(dir.path()), 4, "the fenced run deleted its file");
    let (_, mut third) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    let entry = third.load("orders").await.unwrap().unwrap();
    assert_eq!(cursor(&entry), "k4");
    assert_eq!(rows_in(dir.path()), 4);
}

/// Rule 5: once a commit failed, nothing more is committed — not the batches held, not at the
/// run's end — and the next run resumes from the last commit.
#[tokio::test]
async fn a_failed_commit_breaks_the_writer_and_nothing_more_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut store) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    let (first, staged) = batch(0, 5);
    sink.write(&first, Some(&staged)).await.unwrap();
    store.commit_held().await.unwrap();
    // Commit 3 is taken by another writer: this one's next commit fails.
    let taken = Commit {
        seq: 3,
        pipeline: "orders".into(),
        at: "2026-12-05T00:00:00Z".into(),
        entry: Some(staged.entry.to_json()),
        files: Vec::new(),
        run: None,
        partitioning: None,
    };
    assert_eq!(
        commits::write(&Objects::Local(dir.path().to_path_buf()), &taken).await,
        Ok(true)
    );
    let (second, staged) = batch(5, 9);
    sink.write(&second, Some(&staged)).await.unwrap();
    assert!(store.commit_held().await.is_err());
    let (third, staged) = batch(9, 12);
    let refused = sink.write(&third, Some(&staged)).await.unwrap_err();
    assert!(
        refused.message.contains("an earlier write or commit"),
        "{refused}"
    );
    store.commit_held().await.unwrap();
    assert!(store.store("orders", Some(&staged.entry)).await.is_err());
    assert_eq!(rows_in(dir.path()), 5, "only the first commit's rows");
    let (_, mut next) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    let entry = next.load("orders").await.unwrap().unwrap();
    assert_eq!(cursor(&entry), "k5", "the last commit's position");
}

/// Rule 6: a store outside a run deletes nothing (a run's files not committed yet stay); a
/// second run claims the log at its start, so the first one is fenced at its next commit and
/// its files are never named.
#[tokio::test]
async fn a_run_claims_the_log_and_a_reading_store_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, mut first_store) =
        ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    first_store.load("orders").await.unwrap();
    first.start(RunStart::Fresh).await.unwrap();
    let (batch_a, staged) = batch(0, 6);
    first.write(&batch_a, Some(&staged)).await.unwrap();
    first.writer.lock().await.roll("").await.unwrap();
    assert_eq!(rows_in(dir.path()), 6, "written out, not committed");
    let mut reading = ParquetPositions::reading(settings(dir.path(), Duration::from_secs(3600)));
    reading.load("orders").await.unwrap();
    assert_eq!(rows_in(dir.path()), 6, "state show deletes nothing");
    let (_, mut second_store) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    second_store.load("orders").await.unwrap();
    assert_eq!(
        rows_in(dir.path()),
        0,
        "the second run deleted what no commit names"
    );
    let refused = first_store.commit_held().await.unwrap_err().to_string();
    assert!(refused.contains("committed to"), "{refused}");
    let last = commits::last(&Objects::Local(dir.path().to_path_buf()))
        .await
        .unwrap()
        .unwrap();
    assert!(
        last.files.is_empty(),
        "no commit names the first run's file"
    );
}

/// `check` and `state show` refuse what a run refuses: a log that was changed or lost (a file
/// of a commit past the next one), naming it — and delete nothing.
#[tokio::test]
async fn a_changed_log_stops_a_reading_store_as_it_stops_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let stray = commits::file_name("x", 5, "w", 0);
    Objects::Local(dir.path().to_path_buf())
        .put(&stray, vec![1])
        .await
        .unwrap();
    let mut reading = ParquetPositions::reading(settings(dir.path(), Duration::from_secs(3600)));
    let refused = reading.load("orders").await.unwrap_err().to_string();
    assert!(refused.contains("belongs to commit 5"), "{refused}");
    let (_, mut run) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    let refused = run.load("orders").await.unwrap_err().to_string();
    assert!(refused.contains("belongs to commit 5"), "{refused}");
    assert!(dir.path().join(&stray).exists(), "nothing deleted");
}

/// Rule 1 with rule 2: a file that reaches `target_file_bytes` rolls, and the roll commits
/// (the hour-long interval never came).
#[tokio::test]
async fn a_file_at_its_target_size_rolls_and_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut small = settings(dir.path(), Duration::from_secs(3600));
    small.target_file_bytes = 1;
    let (mut sink, mut store) = ParquetSink::open(small);
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    for i in 0..3 {
        let (batch, staged) = batch(i * 4, i * 4 + 4);
        sink.write(&batch, Some(&staged)).await.unwrap();
    }
    assert_eq!(
        rows_in(dir.path()),
        12,
        "every batch's file rolled and was committed"
    );
    let last = commits::last(&Objects::Local(dir.path().to_path_buf()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(last.run.map(|run| run.files.len()), Some(3));
    assert_eq!(cursor(&store.load("orders").await.unwrap().unwrap()), "k12");
}

/// `state reset` (a store outside a run) commits an empty position: a run still writing is
/// stopped at its next commit, and the next run starts from nothing.
#[tokio::test]
async fn a_reset_outside_the_run_stops_it_at_its_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sink, mut store) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    let (first, staged) = batch(0, 3);
    sink.write(&first, Some(&staged)).await.unwrap();
    let mut reset = ParquetPositions::reading(settings(dir.path(), Duration::from_secs(3600)));
    reset.store("orders", None).await.unwrap();
    let refused = store.commit_held().await.unwrap_err().to_string();
    assert!(refused.contains("committed to"), "{refused}");
    let (_, mut next) = ParquetSink::open(settings(dir.path(), Duration::from_secs(3600)));
    assert_eq!(next.load("orders").await.unwrap(), None);
    assert_eq!(rows_in(dir.path()), 0);
}

// The writer committing to an Iceberg table.
mod iceberg;
mod rest;

/// Rule 8: a changelog's last commit says its partitioning; a run of another one is refused
/// naming both, a run of the same one or a snapshot run is not, nor a log from before.
#[tokio::test]
async fn a_changelog_keeps_the_partitioning_its_commits_record() {
    let dir = tempfile::tempdir().unwrap();
    let objects = Objects::Local(dir.path().to_path_buf());
    let changes = |terms: Option<&[&str]>| {
        let shape = Shape::new(
            vec![("pk".into(), ddbpipe_keyed::KeyType::S)],
            ddbpipe_value::ValueFormat::Plain,
            Records::Envelopes,
            false,
        )
        .unwrap();
        match terms {
            None => shape,
            Some(terms) => {
                let terms: Vec<_> = terms.iter().map(|t| Term::parse(t).unwrap()).collect();
                shape.partitioned(&terms).unwrap()
            }
        }
    };
    let mut commit = Commit {
        seq: 1,
        pipeline: "orders".into(),
        at: "2026-12-05T00:00:00Z".into(),
        entry: None,
        files: Vec::new(),
        run: None,
        partitioning: None,
    };
    assert_eq!(commits::write(&objects, &commit).await, Ok(true));
    assert_eq!(
        probe(&objects, &changes(Some(&[]))).await,
        Ok(()),
        "a log from before"
    );
    commit.seq = 2;
    commit.partitioning = Some(changes(None).partitioning().to_string());
    assert_eq!(commits::write(&objects, &commit).await, Ok(true));
    assert_eq!(probe(&objects, &changes(None)).await, Ok(()));
    let refused = probe(&objects, &changes(Some(&["bucket(4, pk)"])))
        .await
        .unwrap_err();
    assert!(
        refused
            .contains("partitioned by [day(event_time)], the sink partitions by [bucket(4, pk)]"),
        "{refused}"
    );
    assert_eq!(
        probe(&objects, &shape().partitioned(&[]).unwrap()).await,
        Ok(()),
        "a snapshot"
    );
}
