//! Scale of the shared stream (issue 26): two and three workers on a stream of 2,000 shards
//! (1,000 closed parents, 1,000 open children, two records each) read every record, in no
//! more than twice the time one process takes, on the in-memory stream and lease table with
//! paused time (the times are the simulated clock's: deterministic, not a wall-clock bound).
//! Prints both times and the lease-table requests per shard.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::leased::LeasedStreams;
use ddbpipe_pipeline::runner::NoProgress;
use ddbpipe_pipeline::sink::{Sink, SinkError, Staged};
use ddbpipe_pipeline::state::StateFile;
use ddbpipe_pipeline::state::identity::Identity;
use ddbpipe_pipeline::streams::{StreamRun, run_streams};
use ddbpipe_source::fake_streams::{Change, FakeStreams, Faults};
use ddbpipe_source::lease::memory::{Faults as LeaseFaults, MemoryLeaseTable};
use ddbpipe_source::lease::{LeaseSettings, PipelineName, Worker, WorkerId};
use ddbpipe_source::retry::{Cancel, NoObserver};
use tokio::time::Instant;

const PARENTS: usize = 1000;

/// Every record a sink accepted, by sequence number.
#[derive(Default)]
struct Seqs(Vec<String>);

impl Sink for Seqs {
    async fn write(&mut self, batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        for line in batch.records.iter() {
            let json: serde_json::Value = serde_json::from_slice(line).unwrap();
            self.0
                .push(json["sequence_number"].as_str().unwrap().to_string());
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "seqs".into()
    }
}

/// 1,000 roots over the key space, two records each, each rotated into one child with two
/// records of its own: 2,000 shards, 4,000 records.
fn stream() -> Arc<FakeStreams> {
    let mut fake = FakeStreams::new(26).with_faults(Faults::none());
    let width = 65536 / PARENTS as u32;
    for i in 0..PARENTS {
        let parent = format!("shardId-p{i:05}");
        let child = format!("shardId-c{i:05}");
        let from = i as u32 * width;
        let to = if i + 1 == PARENTS {
            65536
        } else {
            from + width
        };
        fake = fake.at(
            Duration::ZERO,
            Change::Root {
                shard: parent.clone(),
                range: Some((from, to)),
            },
        );
        for n in 0..2 {
            fake = fake.at(
                Duration::from_millis(1),
                Change::WriteTo {
                    shard: parent.clone(),
                    key: format!("p{i}-{n}"),
                },
            );
        }
        fake = fake.at(
            Duration::from_millis(2),
            Change::Reshard {
                parent,
                children: vec![child.clone()],
                listed_after: Duration::ZERO,
            },
        );
        for n in 0..2 {
            fake = fake.at(
                Duration::from_millis(3),
                Change::WriteTo {
                    shard: child.clone(),
                    key: format!("c{i}-{n}"),
                },
            );
        }
    }
    Arc::new(fake)
}

fn settings() -> StreamRun {
    let mut run = ddbpipe_testkit::fake_stream_run();
    run.bounds.shard_concurrency = 16;
    run.bounds.idle_termination = Some(Duration::from_secs(20));
    run.batch.records = 500;
    run
}

/// One process: the records it read and how long it took.
async fn one_process(fake: &Arc<FakeStreams>) -> (Vec<String>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut checkpointer = Checkpointer::open_streams(
        StateFile::new(dir.path().join("state.json")),
        "p",
        Identity::from_json(serde_json::json!({"table_name": "t", "mode": "streams"})),
        Duration::ZERO,
    )
    .await
    .unwrap();
    let mut sink = Seqs::default();
    let started = Instant::now();
    run_streams(
        Arc::clone(fake),
        &settings(),
        &mut sink,
        &mut checkpointer,
        Cancel::never(),
        Arc::new(NoObserver),
        &NoProgress,
    )
    .await
    .unwrap();
    (sink.0, started.elapsed())
}

/// `workers` workers on one lease table: the records they read, how long the last one took,
/// and the lease-table requests they sent.
async fn workers(fake: &Arc<FakeStreams>, workers: usize) -> (Vec<String>, Duration, u64) {
    let leases = MemoryLeaseTable::seeded(26);
    // DynamoDB answers a single-item request in a few milliseconds.
    leases.set_faults(LeaseFaults {
        delay: Duration::from_millis(5),
        ..LeaseFaults::default()
    });
    let started = Instant::now();
    let mut handles = Vec::new();
    let mut tables = Vec::new();
    for w in 0..workers {
        let table = leases.connect();
        tables.push(table.clone());
        let run = LeasedStreams {
            api: Arc::clone(fake),
            run: settings(),
            worker: Worker::new(
                table,
                PipelineName::new("p").unwrap(),
                WorkerId::new(format!("w{w}")).unwrap(),
                LeaseSettings::new(10).unwrap(),
            ),
            checkpoint_interval: Duration::from_secs(1),
            observer: Arc::new(NoObserver),
            identity: Identity::from_json(serde_json::json!({"stream_arn": "s"})),
            kept: Vec::new(),
        };
        handles.push(tokio::spawn(async move {
            let mut sink = Seqs::default();
            run.run(&mut sink, Cancel::never(), &NoProgress)
                .await
                .unwrap();
            sink.0
        }));
    }
    let mut seqs = Vec::new();
    for handle in handles {
        seqs.extend(handle.await.unwrap());
    }
    let requests = tables.iter().map(MemoryLeaseTable::requests).sum();
    (seqs, started.elapsed(), requests)
}

/// Every record was read; returns how many were read again (a shard handed over or stolen
/// is read again after its last checkpoint by its new owner: at least once into per-worker
/// sinks, docs/coordination.md §11.11).
fn every_record(fake: &FakeStreams, seqs: &[String], who: &str) -> usize {
    let mut counted: BTreeMap<&str, usize> = BTreeMap::new();
    for seq in seqs {
        *counted.entry(seq.as_str()).or_default() += 1;
    }
    let written = fake.written();
    assert_eq!(written.len(), 4 * PARENTS);
    for record in &written {
        assert!(
            counted.contains_key(record.seq.as_str()),
            "{who}: {} of {} was never read",
            record.seq.as_str(),
            record.shard
        );
    }
    seqs.len() - written.len()
}

#[tokio::test(start_paused = true)]
async fn two_and_three_workers_read_2000_shards_within_twice_one_process_time() {
    let fake = stream();
    let (seqs, alone) = one_process(&fake).await;
    assert_eq!(every_record(&fake, &seqs, "one process"), 0);
    for n in [2, 3] {
        let fake = stream();
        let (seqs, took, requests) = workers(&fake, n).await;
        let again = every_record(&fake, &seqs, &format!("{n} workers"));
        let per_shard = requests as f64 / (2 * PARENTS) as f64;
        println!(
            "2,000 shards: one process {:.1} s, {n} workers {:.1} s, {requests} lease-table \
             requests ({per_shard:.1} per shard), {again} record(s) read again",
            alone.as_secs_f64(),
            took.as_secs_f64()
        );
        assert!(
            took <= alone * 2,
            "{n} workers took {took:?}, one process {alone:?}"
        );
    }
}
