//! The fake stream itself: paging, children, trims, faults and reshards, as the engine sees them.

#![allow(clippy::unwrap_used)]

use super::*;

fn root(id: &str) -> Change {
    Change::Root {
        shard: id.into(),
        range: None,
    }
}

fn write_to(shard: &str, key: &str) -> Change {
    Change::WriteTo {
        shard: shard.into(),
        key: key.into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_closed_shard_is_read_to_its_end_and_then_has_no_next_iterator() {
    let fake = FakeStreams::new(1).at(Duration::ZERO, root("s1"));
    for key in ["a", "b", "a"] {
        fake.apply(write_to("s1", key));
    }
    fake.apply(Change::Close { shard: "s1".into() });
    let s1 = ShardId::new("s1");
    let it = fake
        .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::TrimHorizon)
        .await
        .unwrap()
        .unwrap();
    let page = fake.get_records(&it, 2).await.unwrap();
    assert_eq!(page.records.len(), 2);
    let page = fake
        .get_records(&page.next_iterator.unwrap(), 2)
        .await
        .unwrap();
    assert_eq!(page.records.len(), 1);
    assert_eq!(page.records[0].event_name.as_deref(), Some("MODIFY"));
    assert!(page.next_iterator.is_none());
    let versions: Vec<u64> = fake.written().iter().map(|w| w.version).collect();
    assert_eq!(versions, vec![1, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn children_are_listed_only_after_their_delay_and_take_the_parents_keys() {
    let fake = FakeStreams::new(2).at(Duration::ZERO, root("p")).at(
        Duration::from_secs(1),
        Change::Reshard {
            parent: "p".into(),
            children: vec!["c1".into(), "c2".into()],
            listed_after: Duration::from_secs(5),
        },
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    fake.apply(Change::Write {
        key: "k".into(),
        remove: false,
    });
    let page = fake
        .describe_stream(FAKE_STREAM_ARN, None, None)
        .await
        .unwrap();
    assert_eq!(page.shards.len(), 1);
    assert!(page.shards[0].closed);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let page = fake
        .describe_stream(FAKE_STREAM_ARN, None, Some(&ShardId::new("p")))
        .await
        .unwrap();
    assert_eq!(page.shards.len(), 2);
    let written = fake.written();
    assert_eq!(written.len(), 1);
    assert!(written[0].shard.as_str().starts_with('c'));
}

#[tokio::test(start_paused = true)]
async fn a_listing_of_more_than_a_hundred_shards_comes_in_pages() {
    let fake = FakeStreams::new(3);
    for i in 0..150 {
        fake.apply(root(&format!("s{i:03}")));
    }
    let first = fake
        .describe_stream(FAKE_STREAM_ARN, None, None)
        .await
        .unwrap();
    assert_eq!(first.shards.len(), 100);
    let last = first.last_evaluated_shard_id.unwrap();
    let second = fake
        .describe_stream(FAKE_STREAM_ARN, Some(&last), None)
        .await
        .unwrap();
    assert_eq!(second.shards.len(), 50);
    assert!(second.last_evaluated_shard_id.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_trimmed_position_is_refused_and_trim_horizon_skips_it() {
    let fake = FakeStreams::new(4).at(Duration::ZERO, root("s1"));
    for key in ["a", "b", "c"] {
        fake.apply(write_to("s1", key));
    }
    let s1 = ShardId::new("s1");
    let old = fake
        .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::TrimHorizon)
        .await
        .unwrap()
        .unwrap();
    let first = fake.written()[0].seq.clone();
    fake.apply(Change::Trim {
        shard: "s1".into(),
        through: 1,
    });
    let error = fake.get_records(&old, 10).await.unwrap_err();
    assert_eq!(error.code.as_deref(), Some("TrimmedDataAccessException"));
    let error = fake
        .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::After(first))
        .await
        .unwrap_err();
    assert_eq!(error.code.as_deref(), Some("TrimmedDataAccessException"));
    let it = fake
        .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::TrimHorizon)
        .await
        .unwrap()
        .unwrap();
    let page = fake.get_records(&it, 10).await.unwrap();
    assert_eq!(page.records.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_old_iterator_has_expired() {
    let fake = FakeStreams::new(5).at(Duration::ZERO, root("s1"));
    let s1 = ShardId::new("s1");
    let it = fake
        .shard_iterator(FAKE_STREAM_ARN, &s1, &StartAt::Latest)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(16 * 60)).await;
    let error = fake.get_records(&it, 10).await.unwrap_err();
    assert_eq!(error.code.as_deref(), Some("ExpiredIteratorException"));
}

#[tokio::test(start_paused = true)]
async fn an_incremental_export_of_the_table_holds_each_keys_last_change_in_the_window() {
    let write = |key: &str, remove: bool| Change::Write {
        key: key.into(),
        remove,
    };
    let us = Duration::from_micros;
    let fake = FakeStreams::new(6)
        .with_wall_origin_ms(1_000_000)
        .at(Duration::ZERO, root("s1"))
        // Before the window: a, b and d exist.
        .at(us(1_000), write("a", false))
        .at(us(2_000), write("b", false))
        .at(us(3_000), write("d", false))
        // In [1_010 000 ms, 1_020 000 ms): a updated twice, b deleted, c created and deleted,
        // e created, d deleted and created again.
        .at(us(10_000_250), write("a", false))
        .at(us(11_000_500), write("a", false))
        .at(us(12_000_000), write("b", true))
        .at(us(13_000_000), write("c", false))
        .at(us(14_000_000), write("c", true))
        .at(us(15_000_000), write("e", false))
        .at(us(16_000_000), write("d", true))
        .at(us(17_000_001), write("d", false))
        // After it.
        .at(us(20_000_000), write("a", false));
    tokio::time::sleep(Duration::from_secs(30)).await;
    let table = FakeStreamTable::of(std::sync::Arc::new(fake));
    let changes = table.changes(1_010_000, 1_020_000);
    let shown: Vec<(String, i64, Option<Item>, Option<Item>)> = changes
        .into_iter()
        .map(|c| match c.keys.get("pk") {
            Some(Value::S(key)) => (key.clone(), c.micros, c.old, c.new),
            other => panic!("a string key, not {other:?}"),
        })
        .collect();
    let image = |key: &str, v: u64| Some(State::image(key, v));
    assert_eq!(
        shown,
        vec![
            ("a".into(), 1_011_000_500, image("a", 1), image("a", 3)),
            ("b".into(), 1_012_000_000, image("b", 1), None),
            ("d".into(), 1_017_000_001, image("d", 1), image("d", 3)),
            ("e".into(), 1_015_000_000, None, image("e", 1)),
        ]
    );
    assert_eq!(
        table.items_before(1_020_000),
        BTreeMap::from([("a".into(), 3), ("d".into(), 3), ("e".into(), 1)])
    );
}
