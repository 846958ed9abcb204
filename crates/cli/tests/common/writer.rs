//! A seeded writer of a `pk` table under a pipeline: random puts (sets, binary, 38-digit
//! numbers, nested values), updates and deletes, from a thread until told to stop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Running, item, rt, s};

/// A seeded writer of puts (sets, binary, big numbers, nested values), updates and deletes.
pub struct Writer {
    rng: StdRng,
    keys: usize,
}

impl Writer {
    pub fn new(seed: u64, keys: usize) -> Writer {
        Writer {
            rng: StdRng::seed_from_u64(seed),
            keys,
        }
    }

    pub fn random_item(&mut self, pk: &str) -> HashMap<String, AttributeValue> {
        let rng = &mut self.rng;
        let big = format!(
            "{}{:018}.{:04}",
            rng.random_range(1..9),
            rng.random::<u64>() % 1_000_000_000_000_000_000,
            rng.random_range(0..10_000)
        );
        let mut pairs = vec![
            ("pk", s(pk)),
            (
                "v",
                AttributeValue::N(rng.random_range(-1000..1000).to_string()),
            ),
            ("big", AttributeValue::N(big)),
            (
                "blob",
                AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
                    (0..rng.random_range(1..8))
                        .map(|_| rng.random::<u8>())
                        .collect::<Vec<u8>>(),
                )),
            ),
            (
                "nested",
                AttributeValue::M(HashMap::from([
                    (
                        "l".to_string(),
                        AttributeValue::L(vec![
                            s("x"),
                            AttributeValue::Bool(true),
                            AttributeValue::Null(true),
                        ]),
                    ),
                    ("n".to_string(), AttributeValue::N("0.5".into())),
                ])),
            ),
        ];
        if rng.random_bool(0.7) {
            let tags: Vec<String> = (0..rng.random_range(1..4))
                .map(|i| format!("t{i}-{}", rng.random_range(0..5)))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            pairs.push(("tags", AttributeValue::Ss(tags)));
            pairs.push((
                "nums",
                AttributeValue::Ns(vec!["1".into(), "12345678901234567890123".into()]),
            ));
        }
        item(pairs)
    }

    /// One random write.
    pub fn step(&mut self, running: &Running) {
        let pk = format!("k{:03}", self.rng.random_range(0..self.keys));
        let roll = self.rng.random_range(0..10);
        let request = if roll < 5 {
            let item = self.random_item(&pk);
            rt().block_on(
                running
                    .client
                    .put_item()
                    .table_name("orders")
                    .set_item(Some(item))
                    .send(),
            )
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
        } else if roll < 8 {
            let v = self.rng.random_range(-1000..1000).to_string();
            rt().block_on(
                running
                    .client
                    .update_item()
                    .table_name("orders")
                    .key("pk", s(&pk))
                    .update_expression("SET v = :v, note = :n")
                    .expression_attribute_values(":v", AttributeValue::N(v))
                    .expression_attribute_values(":n", s("updated"))
                    .send(),
            )
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
        } else {
            rt().block_on(
                running
                    .client
                    .delete_item()
                    .table_name("orders")
                    .key("pk", s(&pk))
                    .send(),
            )
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
        };
        request.unwrap_or_else(|e| panic!("the writer's request failed: {e}"));
    }
}

/// Writes in the background until `stop` is set.
pub fn start_writer(
    running: Arc<Running>,
    seed: u64,
    keys: usize,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut writer = Writer::new(seed, keys);
        let mut writes = 0;
        while !stop.load(Ordering::Relaxed) {
            writer.step(&running);
            writes += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        writes
    })
}

/// Runs `pipeline` under a writer of `running`'s `orders` (seeded `seed`, 200 keys), SIGKILLs
/// it `kills` times, each after a random pause in `pause_ms`, then lets a last run finish
/// (exit 0): what an exactly-once destination holds afterwards is judged by the caller.
pub fn killed_under_writes(
    running: &Arc<Running>,
    pipeline: &super::Pipeline,
    kills: usize,
    seed: u64,
    pause_ms: std::ops::Range<u64>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(Arc::clone(running), seed, 200, Arc::clone(&stop));
    let mut rng = StdRng::seed_from_u64(seed);
    for attempt in 0..kills {
        let mut child = super::spawn_logged(pipeline, attempt);
        std::thread::sleep(Duration::from_millis(rng.random_range(pause_ms.clone())));
        child.kill().expect("SIGKILL the run");
        child.wait().expect("the killed run is reaped");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer ends");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", super::stderr(&output));
}

/// The records of `running`'s `orders` stream, `(shard, sequence number)`, read by a jsonl
/// pipeline of their own from the trim horizon: what an exactly-once destination must hold
/// once each.
pub fn stream_records(running: &Running) -> std::collections::BTreeSet<(String, String)> {
    let reader = super::Pipeline::new(
        "independent",
        &running.endpoint,
        "table_name: orders\nmode: streams\nstart_position: trim_horizon\nidle_termination_secs: 2",
    );
    let output = reader.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", super::stderr(&output));
    reader
        .records()
        .into_iter()
        .map(|line| {
            let field = |name: &str| line[name].as_str().expect("a string field").to_string();
            (field("shard_id"), field("sequence_number"))
        })
        .collect()
}
