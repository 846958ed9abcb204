//! Several workers' `exactly_once` kafka sinks (docs/coordination.md §11.13; `sink/units.rs`)
//! against the real broker of the test run (`scripts/kafka.sh`): one unit taken over from
//! worker to worker, the earlier owner's late batch fenced by the producer of the unit's
//! `transactional.id`, its position read back from the committed view. Fails, naming the
//! variable, when `DDBPIPE_TEST_KAFKA_BROKERS` is unset.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ddbpipe_kafka::client::{Connection, Delivery, TopicShape};
use ddbpipe_kafka::envelope::{EnvelopeKind, Shaper, ShaperSettings};
use ddbpipe_kafka::sink::{KafkaSettings, KafkaSink};
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Fence, Fencing, Records, SinkErrorClass};
use ddbpipe_source::lease::UnitId;
use ddbpipe_source::records::Lines;
use ddbpipe_source::retry::RetryPolicy;
use ddbpipe_testkit::kafka::{brokers, committed_view, topic_name};

const PIPELINE: &str = "units";

/// One worker's sink: shared, `exactly_once`, into `topic` with the positions in `positions`.
async fn worker(brokers: &str, topic: &str, positions: &str) -> KafkaSink {
    let settings = KafkaSettings {
        connection: Connection {
            brokers: brokers.to_string(),
            properties: Vec::new(),
            timeout: Duration::from_secs(30),
            msk_iam: None,
        },
        topic: topic.to_string(),
        topic_shape: TopicShape::default(),
        delivery: Delivery::ExactlyOnce,
        positions_topic: positions.to_string(),
        // Its own id per test run: tests at once must not fence each other.
        transactional_id: format!("ddbpipe-{topic}"),
        retry: RetryPolicy {
            max_retries: 2,
            ..RetryPolicy::default()
        },
        shared: true,
    };
    let shaper = Shaper::new(ShaperSettings {
        envelope: EnvelopeKind::Ddbpipe,
        records: Records::Items,
        key_attributes: vec!["pk".to_string()],
        pipeline: PIPELINE.to_string(),
        table: "items".to_string(),
        region: None,
        tombstones: false,
    })
    .unwrap();
    KafkaSink::open(settings, shaper).await.unwrap()
}

/// A batch of items with these keys.
fn items(keys: &[&str]) -> Batch {
    let mut records = Lines::with_capacity(keys.len(), 64);
    for key in keys {
        records.push_with(|line| {
            line.extend_from_slice(format!(r#"{{"pk":{{"S":"{key}"}}}}"#).as_bytes());
        });
    }
    Batch {
        records,
        ..Batch::default()
    }
}

fn fence(unit: &UnitId, counter: u64, position: Option<&str>) -> Fence {
    Fence {
        pipeline: PIPELINE.to_string(),
        unit: unit.clone(),
        counter,
        position: position.map(|text| unit.checkpoint(text)),
        snapshot: None,
        beside: None,
        of: None,
        repair: None,
    }
}

/// The keys of the topic's committed view, sorted (the topic has the broker's partitions).
async fn committed_keys(brokers: &str, topic: &str) -> Vec<String> {
    let mut keys: Vec<String> = committed_view(brokers, topic)
        .await
        .into_iter()
        .map(|(_, record)| {
            let key: serde_json::Value = serde_json::from_slice(&record.key.unwrap()).unwrap();
            key["pk"]["S"]
                .as_str()
                .unwrap_or_else(|| panic!("{key}"))
                .to_string()
        })
        .collect();
    keys.sort();
    keys
}

/// Rules 1–4 of `sink/units.rs`: a unit taken over resumes after its last committed position,
/// and the earlier owner's late batch is refused with nothing visible; a claim under an older
/// counter than the stored position's is refused.
#[tokio::test]
async fn a_unit_taken_over_fences_its_earlier_owner_and_resumes_after_its_last_commit() {
    let brokers = brokers();
    let topic = topic_name("units");
    let positions = topic_name("unit-positions");
    let unit: UnitId = "shard:shardId-00000001".parse().unwrap();

    let mut first = worker(&brokers, &topic, &positions).await;
    assert_eq!(first.claim(&fence(&unit, 1, None)).await.unwrap(), None);
    first
        .write_fenced(&items(&["k1", "k2"]), &fence(&unit, 1, Some("after:2")))
        .await
        .unwrap();

    // The lease expires (a stall): another worker takes the unit under counter 2.
    let mut second = worker(&brokers, &topic, &positions).await;
    let resumed = second.claim(&fence(&unit, 2, None)).await.unwrap();
    assert_eq!(resumed, Some(unit.checkpoint("after:2")));

    // The stalled worker goes on: its transaction is refused, nothing of it visible.
    let late = first
        .write_fenced(&items(&["k3"]), &fence(&unit, 1, Some("after:3")))
        .await
        .unwrap_err();
    assert_eq!(late.class, SinkErrorClass::Fenced, "{late}");
    second
        .write_fenced(&items(&["k3", "k4"]), &fence(&unit, 2, Some("after:4")))
        .await
        .unwrap();

    // A claim under a counter older than the stored position's is refused.
    let mut stale = worker(&brokers, &topic, &positions).await;
    let refused = stale.claim(&fence(&unit, 1, None)).await.unwrap_err();
    assert_eq!(refused.class, SinkErrorClass::Fenced, "{refused}");
    assert!(refused.message.contains("lease counter 2"), "{refused}");

    // The next owner resumes after the last commit.
    let mut third = worker(&brokers, &topic, &positions).await;
    let resumed = third.claim(&fence(&unit, 3, None)).await.unwrap();
    assert_eq!(resumed, Some(unit.checkpoint("after:4")));
    third
        .write_fenced(&items(&[]), &fence(&unit, 3, Some("end")))
        .await
        .unwrap();

    assert_eq!(
        committed_keys(&brokers, &topic).await,
        ["k1", "k2", "k3", "k4"],
        "every item once: the fenced batch is not in the committed view"
    );
    let mut fourth = worker(&brokers, &topic, &positions).await;
    let resumed = fourth.claim(&fence(&unit, 4, None)).await.unwrap();
    assert_eq!(resumed, Some(unit.checkpoint("end")));
}
