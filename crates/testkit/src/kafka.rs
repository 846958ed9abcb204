//! The Kafka broker of the test run, and a topic's committed view read back from it.
//!
//! The broker comes from `DDBPIPE_TEST_KAFKA_BROKERS`, which `scripts/kafka.sh` sets (sourced
//! by `scripts/test.sh`; it starts a throwaway broker). Without it every Kafka test fails,
//! naming the variable, as the PostgreSQL tests do. Each test works in topics of its own
//! ([`topic_name`]), so the tests run in parallel.
//! Topics are judged by their committed view ([`committed_view`]): the records a correct
//! `read_committed` consumer receives, built from the raw log and its transaction markers
//! (`ddbpipe_kafka::log`), whatever the broker's own `read_committed` serves.

use std::time::Duration;

use ddbpipe_kafka::log::{LogReader, LogRecord};

/// The bound on each request the helpers send.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `DDBPIPE_TEST_KAFKA_BROKERS`.
///
/// # Panics
/// When it is unset: a Kafka test without a broker fails, naming the variable (a test that
/// skipped would pass without proving anything).
pub fn brokers() -> String {
    match std::env::var("DDBPIPE_TEST_KAFKA_BROKERS") {
        Ok(brokers) if !brokers.trim().is_empty() => brokers,
        _ => panic!(
            "DDBPIPE_TEST_KAFKA_BROKERS is not set: run the tests with scripts/test.sh, or \
             `source scripts/kafka.sh` first, which starts a throwaway Kafka broker (or point \
             the variable at a broker of yours)"
        ),
    }
}

/// A topic name no other test uses: `<prefix>-<random>`.
pub fn topic_name(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// The committed view of every partition of `topic`, partition by partition, each in offset
/// order: `(partition, record)`; empty while the topic does not exist (nothing was written).
///
/// # Panics
/// When the topic cannot be read (a failed test).
pub async fn committed_view(brokers: &str, topic: &str) -> Vec<(i32, LogRecord)> {
    let reader = LogReader::new(brokers, REQUEST_TIMEOUT);
    let partitions = reader
        .partitions(topic)
        .await
        .unwrap_or_else(|e| panic!("cannot list the partitions of topic {topic}: {e}"))
        .unwrap_or_default();
    let mut view = Vec::new();
    for partition in partitions {
        let committed = reader
            .committed(topic, partition)
            .await
            .unwrap_or_else(|e| panic!("cannot read topic {topic} partition {partition}: {e}"));
        view.extend(
            committed
                .records
                .into_iter()
                .map(|record| (partition, record)),
        );
    }
    view
}
