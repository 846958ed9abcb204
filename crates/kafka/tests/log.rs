//! `ddbpipe_kafka::log` against the real broker of the test run (`scripts/kafka.sh`): topics
//! written by rdkafka's producers, transactional and not, read back as their committed view.
//! Every test fails, naming the variable, when `DDBPIPE_TEST_KAFKA_BROKERS` is unset.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ddbpipe_kafka::log::{Follower, LogError, LogReader, LogRecord, ReadFrom};
use ddbpipe_testkit::kafka::{brokers, committed_view, topic_name};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// The bound on each transactional call and each request of the reader.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Creates `topic` with `partitions` partitions and the given topic configs, and waits until
/// the broker lists it.
async fn create_topic(brokers: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (name, value) in configs {
        new = new.set(name, value);
    }
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for result in admin.create_topics([&new], &options).await.unwrap() {
        result.unwrap_or_else(|(topic, code)| panic!("cannot create topic {topic}: {code}"));
    }
    let reader = LogReader::new(brokers, TIMEOUT);
    for _ in 0..100 {
        if reader.partitions(topic).await.unwrap().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("topic {topic} was created but the broker does not list it");
}

/// A producer with `properties` on top of the test broker's address.
fn producer(brokers: &str, properties: &[(&str, &str)]) -> FutureProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "30000");
    for (name, value) in properties {
        config.set(*name, *value);
    }
    config.create().unwrap()
}

/// A transactional producer of `transactional_id`, its transactions initialised.
fn transactional(
    brokers: &str,
    transactional_id: &str,
    properties: &[(&str, &str)],
) -> FutureProducer {
    let mut properties = properties.to_vec();
    properties.push(("transactional.id", transactional_id));
    let producer = producer(brokers, &properties);
    producer.init_transactions(TIMEOUT).unwrap();
    producer
}

/// Sends `value` (keyed by itself) to partition `partition` and waits until the broker took it;
/// returns its offset.
async fn send(producer: &FutureProducer, topic: &str, partition: i32, value: &str) -> i64 {
    let record = FutureRecord::to(topic)
        .partition(partition)
        .key(value)
        .payload(value);
    producer
        .send(record, Duration::from_secs(0))
        .await
        .unwrap_or_else(|(e, _)| panic!("cannot send {value} to {topic}: {e}"))
        .offset
}

/// A plain (idempotent, not transactional) producer.
fn producer_of(brokers: &str) -> FutureProducer {
    producer(brokers, &[("enable.idempotence", "true")])
}

/// The values of a view, in its order.
fn values(view: &[(i32, LogRecord)]) -> Vec<String> {
    view.iter()
        .map(|(_, record)| {
            String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_transaction_is_in_the_view_on_every_partition() {
    let brokers = brokers();
    let topic = topic_name("log-committed");
    create_topic(&brokers, &topic, 3, &[]).await;
    let producer = transactional(&brokers, &topic_name("tx"), &[]);
    producer.begin_transaction().unwrap();
    for partition in 0..3 {
        for n in 0..2 {
            send(&producer, &topic, partition, &format!("p{partition}-{n}")).await;
        }
    }
    producer.commit_transaction(TIMEOUT).unwrap();

    let view = committed_view(&brokers, &topic).await;
    let got: Vec<(i32, String)> = view
        .iter()
        .map(|(partition, record)| {
            (
                *partition,
                String::from_utf8_lossy(record.value.as_deref().unwrap()).into_owned(),
            )
        })
        .collect();
    let expected: Vec<(i32, String)> = (0..3)
        .flat_map(|p| (0..2).map(move |n| (p, format!("p{p}-{n}"))))
        .collect();
    assert_eq!(got, expected);
    let record = &view[0].1;
    assert_eq!(record.key.as_deref(), Some(&b"p0-0"[..]));
    let committed = LogReader::new(&brokers, TIMEOUT)
        .committed(&topic, 0)
        .await
        .unwrap();
    assert_eq!((committed.aborted, committed.undecided), (0, 0));
    // Two records and the COMMIT marker.
    assert_eq!(committed.end_offset, 3);
}

/// Rule 10: a key's last committed record is found reading back from the end — the last
/// 1,024 offsets first, then further back — past a later aborted record of the key and past
/// thousands of other keys' records; a read of the last offsets begins where it says.
#[tokio::test(flavor = "multi_thread")]
async fn a_keys_last_committed_record_is_read_back_from_the_end() {
    let brokers = brokers();
    let topic = topic_name("log-last");
    create_topic(&brokers, &topic, 1, &[]).await;
    let producer = transactional(&brokers, &topic_name("tx"), &[]);
    producer.begin_transaction().unwrap();
    let record = FutureRecord::to(&topic)
        .partition(0)
        .key("old")
        .payload("old-1");
    producer.send(record, Duration::ZERO).await.unwrap();
    producer.commit_transaction(TIMEOUT).unwrap();
    let plain = producer_of(&brokers);
    let sends = (0..3000).map(|n| {
        let value = format!("busy-{n}");
        let plain = &plain;
        let topic = &topic;
        async move {
            let record = FutureRecord::to(topic)
                .partition(0)
                .key("busy")
                .payload(&value);
            plain.send(record, Duration::ZERO).await.unwrap();
        }
    });
    futures_util::future::join_all(sends).await;
    producer.begin_transaction().unwrap();
    let record = FutureRecord::to(&topic)
        .partition(0)
        .key("old")
        .payload("old-aborted");
    producer.send(record, Duration::ZERO).await.unwrap();
    producer.abort_transaction(TIMEOUT).unwrap();

    let reader = LogReader::new(&brokers, TIMEOUT);
    let value_of = |record: Option<LogRecord>| {
        record.map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned())
    };
    let old = reader.last_committed(&topic, 0, b"old").await.unwrap();
    assert_eq!(value_of(old).as_deref(), Some("old-1"));
    let busy = reader.last_committed(&topic, 0, b"busy").await.unwrap();
    assert_eq!(value_of(busy).as_deref(), Some("busy-2999"));
    assert_eq!(
        reader.last_committed(&topic, 0, b"none").await.unwrap(),
        None
    );
    let last = reader
        .committed_from(&topic, 0, ReadFrom::Last(1024))
        .await
        .unwrap();
    assert!(
        !last.from_start,
        "{} {}",
        last.start_offset, last.end_offset
    );
    assert_eq!(last.start_offset, last.end_offset - 1024);
    assert!(last.records.len() <= 1024 && !last.records.is_empty());
    let all = reader
        .committed_from(&topic, 0, ReadFrom::Last(u64::MAX))
        .await
        .unwrap();
    assert!(
        all.from_start && all.records.len() == 3001,
        "{}",
        all.records.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aborted_transaction_is_not_in_the_view() {
    let brokers = brokers();
    let topic = topic_name("log-aborted");
    create_topic(&brokers, &topic, 1, &[]).await;
    let producer = transactional(&brokers, &topic_name("tx"), &[]);
    producer.begin_transaction().unwrap();
    send(&producer, &topic, 0, "kept").await;
    producer.commit_transaction(TIMEOUT).unwrap();
    producer.begin_transaction().unwrap();
    send(&producer, &topic, 0, "aborted-1").await;
    send(&producer, &topic, 0, "aborted-2").await;
    producer.abort_transaction(TIMEOUT).unwrap();

    assert_eq!(values(&committed_view(&brokers, &topic).await), ["kept"]);
    let committed = LogReader::new(&brokers, TIMEOUT)
        .committed(&topic, 0)
        .await
        .unwrap();
    assert_eq!((committed.aborted, committed.undecided), (2, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_producers_transaction_is_aborted_by_its_successor() {
    let brokers = brokers();
    let topic = topic_name("log-zombie");
    create_topic(&brokers, &topic, 1, &[]).await;
    let transactional_id = topic_name("tx");
    let first = transactional(&brokers, &transactional_id, &[]);
    first.begin_transaction().unwrap();
    send(&first, &topic, 0, "lost-1").await;
    send(&first, &topic, 0, "lost-2").await;
    drop(first);

    let reader = LogReader::new(&brokers, TIMEOUT);
    let before = reader.committed(&topic, 0).await.unwrap();
    assert!(before.records.is_empty());
    assert_eq!(
        before.undecided, 2,
        "the open transaction's records are held out"
    );

    // A successor with the same transactional.id: the broker aborts the open transaction.
    let second = transactional(&brokers, &transactional_id, &[]);
    second.begin_transaction().unwrap();
    send(&second, &topic, 0, "after").await;
    second.commit_transaction(TIMEOUT).unwrap();

    assert_eq!(values(&committed_view(&brokers, &topic).await), ["after"]);
    let after = reader.committed(&topic, 0).await.unwrap();
    assert_eq!((after.aborted, after.undecided), (2, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_and_transactional_records_keep_offset_order() {
    let brokers = brokers();
    let topic = topic_name("log-interleaved");
    create_topic(&brokers, &topic, 1, &[]).await;
    let plain = producer(&brokers, &[]);
    let tx = transactional(&brokers, &topic_name("tx"), &[]);
    tx.begin_transaction().unwrap();
    let mut offsets = Vec::new();
    offsets.push(send(&tx, &topic, 0, "t1").await);
    offsets.push(send(&plain, &topic, 0, "p1").await);
    offsets.push(send(&tx, &topic, 0, "t2").await);
    offsets.push(send(&plain, &topic, 0, "p2").await);
    tx.commit_transaction(TIMEOUT).unwrap();
    send(&plain, &topic, 0, "p3").await;
    assert!(
        offsets.is_sorted(),
        "the sends landed in order: {offsets:?}"
    );

    let view = committed_view(&brokers, &topic).await;
    assert_eq!(values(&view), ["t1", "p1", "t2", "p2", "p3"]);
    let view_offsets: Vec<i64> = view.iter().map(|(_, record)| record.offset).collect();
    assert_eq!(&view_offsets[..4], &offsets[..]);
}

#[tokio::test(flavor = "multi_thread")]
async fn zstd_and_gzip_batches_decode() {
    let brokers = brokers();
    for compression in ["zstd", "gzip"] {
        let topic = topic_name(&format!("log-{compression}"));
        create_topic(&brokers, &topic, 1, &[]).await;
        // A linger long enough that the 50 sends leave in few, compressed, batches.
        let properties = [("compression.type", compression), ("linger.ms", "50")];
        let producer = transactional(&brokers, &topic_name("tx"), &properties);
        producer.begin_transaction().unwrap();
        let sends = (0..50).map(|n| {
            let value = format!("{compression}-{n:02}-{}", "x".repeat(200));
            let producer = &producer;
            let topic = &topic;
            async move { send(producer, topic, 0, &value).await }
        });
        futures_util::future::join_all(sends).await;
        producer.commit_transaction(TIMEOUT).unwrap();

        let got = values(&committed_view(&brokers, &topic).await);
        let expected: Vec<String> = (0..50)
            .map(|n| format!("{compression}-{n:02}-{}", "x".repeat(200)))
            .collect();
        assert_eq!(got, expected, "{compression}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_has_no_partitions_and_is_not_created_by_asking() {
    let brokers = brokers();
    let topic = topic_name("log-missing");
    let reader = LogReader::new(&brokers, TIMEOUT);
    assert_eq!(reader.partitions(&topic).await.unwrap(), None);
    assert_eq!(
        reader.partitions(&topic).await.unwrap(),
        None,
        "asking created it"
    );
    match reader.committed(&topic, 0).await {
        Err(LogError::UnknownTopic { topic: named }) => assert_eq!(named, topic),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_the_topic_lacks_is_named_with_those_it_has() {
    let brokers = brokers();
    let topic = topic_name("log-partitions");
    create_topic(&brokers, &topic, 2, &[]).await;
    let error = LogReader::new(&brokers, TIMEOUT)
        .committed(&topic, 5)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LogError::UnknownPartition { partition: 5, partitions, .. } if partitions == &[0, 1]),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_broker_nobody_listens_on_is_named_in_the_error() {
    // A port that was free a moment ago: nothing listens on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let error = LogReader::new(&address, TIMEOUT)
        .partitions("any")
        .await
        .unwrap_err();
    assert!(matches!(error, LogError::Connect { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains(&address), "{message}");
    assert!(message.contains("check `brokers`"), "{message}");
    assert_eq!(
        error.class(),
        ddbpipe_pipeline::sink::SinkErrorClass::Transient
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_brokers_own_read_committed_is_recorded() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};

    let brokers = brokers();
    let topic = topic_name("log-read-committed");
    create_topic(&brokers, &topic, 1, &[]).await;
    let transactional_id = topic_name("tx");
    let producer = transactional(&brokers, &transactional_id, &[]);
    producer.begin_transaction().unwrap();
    send(&producer, &topic, 0, "committed-1").await;
    producer.commit_transaction(TIMEOUT).unwrap();
    producer.begin_transaction().unwrap();
    send(&producer, &topic, 0, "aborted").await;
    producer.abort_transaction(TIMEOUT).unwrap();
    producer.begin_transaction().unwrap();
    send(&producer, &topic, 0, "killed").await;
    drop(producer);
    let successor = transactional(&brokers, &transactional_id, &[]);
    successor.begin_transaction().unwrap();
    send(&successor, &topic, 0, "committed-2").await;
    successor.commit_transaction(TIMEOUT).unwrap();

    let view = values(&committed_view(&brokers, &topic).await);
    assert_eq!(view, ["committed-1", "committed-2"]);

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", topic_name("group"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut delivered = Vec::new();
    while let Ok(message) = tokio::time::timeout(Duration::from_secs(10), consumer.recv()).await {
        let message = message.unwrap();
        let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
        delivered.push(value.clone());
        if value == "committed-2" {
            break;
        }
    }
    let verdict = if delivered == view {
        "the same as the committed view"
    } else {
        "NOT the committed view"
    };
    println!(
        "broker finding: a read_committed consumer received {delivered:?}; the committed view \
         is {view:?}: {verdict}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compacted_topic_is_created_and_described_as_compacted() {
    use rdkafka::admin::ResourceSpecifier;

    let brokers = brokers();
    let topic = topic_name("log-compacted");
    create_topic(&brokers, &topic, 1, &[("cleanup.policy", "compact")]).await;
    // What `check` will ask of a positions topic: its cleanup policy, by DescribeConfigs.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let resource = ResourceSpecifier::Topic(&topic);
    let described = admin
        .describe_configs([&resource], &AdminOptions::new())
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    let policy = described
        .get("cleanup.policy")
        .and_then(|entry| entry.value.clone());
    assert_eq!(policy.as_deref(), Some("compact"));

    // Compaction itself, recorded: later values of one key do not (yet) replace earlier ones.
    let plain = producer(&brokers, &[]);
    for n in 0..10 {
        let value = n.to_string();
        let record = FutureRecord::to(&topic)
            .partition(0)
            .key("position")
            .payload(&value);
        plain.send(record, Duration::from_secs(0)).await.unwrap();
    }
    let view = committed_view(&brokers, &topic).await;
    assert_eq!(
        values(&view).last().map(String::as_str),
        Some("9"),
        "the last value is kept"
    );
    println!(
        "broker finding: a compacted topic holds {} records of one key right after 10 writes \
         (a broker that compacts keeps fewer, but only once a segment is cleaned)",
        view.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn whether_producing_creates_a_missing_topic_is_recorded() {
    let brokers = brokers();
    let topic = topic_name("log-auto-created");
    let plain = producer(&brokers, &[("message.timeout.ms", "10000")]);
    let record = FutureRecord::to(&topic).key("k").payload("v");
    let sent = plain.send(record, Duration::from_secs(0)).await;
    let partitions = LogReader::new(&brokers, TIMEOUT)
        .partitions(&topic)
        .await
        .unwrap();
    match (&sent, &partitions) {
        (Ok(delivery), Some(partitions)) => {
            assert!(partitions.contains(&delivery.partition), "{partitions:?}");
            let view = committed_view(&brokers, &topic).await;
            assert_eq!(values(&view), ["v"]);
            println!(
                "broker finding: producing to a missing topic created it, with partitions \
                 {partitions:?}"
            );
        }
        (Err((error, _)), None) => {
            println!("broker finding: producing to a missing topic fails ({error}): not created");
        }
        (sent, partitions) => panic!(
            "the send ({:?}) and the topic's partitions ({partitions:?}) disagree",
            sent.as_ref()
                .map(|delivery| delivery.offset)
                .map_err(|(error, _)| error)
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_agrees_with_a_whole_read_and_reads_only_what_was_appended() {
    let brokers = brokers();
    let topic = topic_name("log-follow");
    create_topic(&brokers, &topic, 1, &[("cleanup.policy", "compact")]).await;
    let producer = transactional(&brokers, &topic_name("tx"), &[]);
    let write = |keys: Vec<String>, commit: bool| {
        let (producer, topic) = (&producer, &topic);
        async move {
            producer.begin_transaction().unwrap();
            for key in &keys {
                let value = format!("{key}@{commit}");
                let record = FutureRecord::to(topic)
                    .partition(0)
                    .key(key)
                    .payload(&value);
                producer.send(record, Duration::ZERO).await.unwrap();
            }
            if commit {
                producer.commit_transaction(TIMEOUT).unwrap();
            } else {
                producer.abort_transaction(TIMEOUT).unwrap();
            }
        }
    };
    let units = |range: std::ops::Range<u32>| range.map(|n| format!("p/u{n}")).collect();
    for _ in 0..3 {
        write(units(0..30), true).await;
    }
    write(vec!["other/u1".into()], true).await;
    write(units(5..8), false).await;

    let reader = LogReader::new(&brokers, TIMEOUT);
    let mut follower = Follower::new(b"p/");
    reader.follow(&topic, 0, &mut follower).await.unwrap();
    // A whole read of the partition, each key's last committed record taken from it.
    let agree = |follower: &Follower| {
        let kept: Vec<(String, Option<LogRecord>)> = units(0..40)
            .into_iter()
            .map(|key: String| {
                let record = follower.last(key.as_bytes()).cloned();
                (key, record)
            })
            .collect();
        let (reader, topic) = (reader.clone(), topic.clone());
        async move {
            let whole = reader.committed(&topic, 0).await.unwrap();
            for (key, kept) in kept {
                let last = whole
                    .records
                    .iter()
                    .rev()
                    .find(|record| record.key.as_deref() == Some(key.as_bytes()));
                assert_eq!(kept.as_ref(), last, "{key}");
            }
        }
    };
    agree(&follower).await;
    assert_eq!(follower.records().count(), 30, "only the keys of p/");
    let first = follower.records_read();
    assert_eq!(
        first, 99,
        "the first read covers the partition: 5 transactions' 94 records and their markers"
    );

    write(units(28..38), true).await;
    reader.follow(&topic, 0, &mut follower).await.unwrap();
    agree(&follower).await;
    let appended = follower.records_read() - first;
    assert_eq!(
        appended, 11,
        "the second read takes the 10 records and the marker appended, not the partition"
    );
    assert_eq!(follower.full_reads(), 1);
    assert_eq!(follower.last(b"p/u39"), None, "never written");
}

/// librdkafka's mock cluster answers an ApiVersions version it does not serve (v3) in neither
/// v3's form nor v0's; the reader asks again in v0 and reads the mock's log like a broker's.
/// (The mock writes no transaction markers into a partition, so only plain records are in
/// its committed view: it cannot stand in for the tests' broker.)
#[tokio::test(flavor = "multi_thread")]
async fn the_reader_reads_librdkafkas_mock_cluster() {
    let cluster = rdkafka::mocking::MockCluster::new(3).unwrap();
    let brokers = cluster.bootstrap_servers();
    cluster.create_topic("mocked", 3, 1).unwrap();
    let reader = LogReader::new(&brokers, TIMEOUT);
    assert_eq!(
        reader.partitions("mocked").await.unwrap(),
        Some(vec![0, 1, 2])
    );
    let plain = producer_of(&brokers);
    for value in ["a", "b", "c"] {
        send(&plain, "mocked", 1, value).await;
    }
    let view = reader.committed("mocked", 1).await.unwrap();
    let read: Vec<(i32, LogRecord)> = view.records.into_iter().map(|r| (1, r)).collect();
    assert_eq!(values(&read), ["a", "b", "c"]);
}
