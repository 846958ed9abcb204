//! The module's rules on hand-built record batches (kafka-protocol's encoder), no broker.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::view::View;
use super::wire::choose_version;
use super::{Committed, Fold, Follower, LogError, batches, parse_brokers, take_answer};

/// The producer id of a plain (non-transactional, non-idempotent) record.
const NO_PRODUCER: i64 = -1;

/// A data record at `offset` whose key and value are `text`.
fn data(offset: i64, producer: i64, text: &str) -> Record {
    Record {
        transactional: producer != NO_PRODUCER,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: producer,
        producer_epoch: if producer == NO_PRODUCER { -1 } else { 0 },
        timestamp_type: TimestampType::Creation,
        offset,
        // The encoder puts records whose `offset - sequence` agree in one batch.
        sequence: offset as i32,
        timestamp: 1_700_000_000_000 + offset,
        key: Some(Bytes::from(format!("k-{text}"))),
        value: Some(Bytes::from(text.to_string())),
        headers: IndexMap::new(),
    }
}

/// A control record at `offset` of `producer` whose type is `kind` (0 ABORT, 1 COMMIT).
fn marker(offset: i64, producer: i64, kind: i16) -> Record {
    let mut key = BytesMut::new();
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&kind.to_be_bytes());
    let mut value = BytesMut::new();
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&0i32.to_be_bytes());
    Record {
        control: true,
        key: Some(key.freeze()),
        value: Some(value.freeze()),
        sequence: -1,
        ..data(offset, producer, "marker")
    }
}

/// A COMMIT marker.
fn commit(offset: i64, producer: i64) -> Record {
    marker(offset, producer, 1)
}

/// An ABORT marker.
fn abort(offset: i64, producer: i64) -> Record {
    marker(offset, producer, 0)
}

/// A log of one batch per slice, encoded with `compression`.
fn log_of(batches: &[&[Record]], compression: Compression) -> Bytes {
    let mut log = BytesMut::new();
    for batch in batches {
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut log, batch.iter(), &options).unwrap();
    }
    log.freeze()
}

/// The committed view of a whole log taken in one answer, read up to `end`.
fn view_of(log: &Bytes, end: i64) -> Committed {
    let mut view = View::default();
    let next = take_answer(&mut view, log, 0, end).unwrap();
    assert!(next >= end, "the answer stopped at {next}, short of {end}");
    view.finish(end)
}

/// The values of a view's records, with their offsets.
fn values(committed: &Committed) -> Vec<(i64, String)> {
    committed
        .records
        .iter()
        .map(|record| {
            let value = record.value.as_deref().unwrap_or_default();
            (record.offset, String::from_utf8_lossy(value).into_owned())
        })
        .collect()
}

#[test]
fn a_committed_transaction_joins_the_view_at_its_offsets() {
    let log = log_of(
        &[&[data(0, 7, "a"), data(1, 7, "b")], &[commit(2, 7)]],
        Compression::None,
    );
    let committed = view_of(&log, 3);
    assert_eq!(values(&committed), [(0, "a".into()), (1, "b".into())]);
    assert_eq!((committed.aborted, committed.undecided), (0, 0));
    assert_eq!(committed.end_offset, 3);
    let first = &committed.records[0];
    assert_eq!(first.key.as_deref(), Some(&b"k-a"[..]));
    assert_eq!(first.timestamp_ms, 1_700_000_000_000);
}

#[test]
fn an_aborted_transaction_is_dropped_and_counted() {
    let log = log_of(
        &[&[data(0, 7, "a"), data(1, 7, "b")], &[abort(2, 7)]],
        Compression::None,
    );
    let committed = view_of(&log, 3);
    assert!(committed.records.is_empty(), "{:?}", values(&committed));
    assert_eq!((committed.aborted, committed.undecided), (2, 0));
}

#[test]
fn a_transaction_still_open_at_the_end_is_left_out_and_counted() {
    let log = log_of(
        &[&[data(0, NO_PRODUCER, "plain")], &[data(1, 7, "open")]],
        Compression::None,
    );
    let committed = view_of(&log, 2);
    assert_eq!(values(&committed), [(0, "plain".into())]);
    assert_eq!((committed.aborted, committed.undecided), (0, 1));
}

#[test]
fn plain_records_join_at_once_and_the_view_keeps_offset_order() {
    let log = log_of(
        &[
            &[data(0, 7, "t0")],
            &[data(1, NO_PRODUCER, "p1")],
            &[data(2, 7, "t2")],
            &[data(3, NO_PRODUCER, "p3")],
            &[commit(4, 7)],
            &[data(5, NO_PRODUCER, "p5")],
        ],
        Compression::None,
    );
    let committed = view_of(&log, 6);
    let expected = [(0, "t0"), (1, "p1"), (2, "t2"), (3, "p3"), (5, "p5")];
    let expected: Vec<(i64, String)> = expected.iter().map(|(o, v)| (*o, v.to_string())).collect();
    assert_eq!(values(&committed), expected);
}

#[test]
fn a_marker_decides_only_its_own_producers_transaction() {
    let log = log_of(
        &[
            &[data(0, 7, "seven")],
            &[data(1, 8, "eight")],
            &[abort(2, 8)],
            &[data(3, 9, "nine")],
            &[commit(4, 7)],
        ],
        Compression::None,
    );
    let committed = view_of(&log, 5);
    assert_eq!(values(&committed), [(0, "seven".into())]);
    assert_eq!((committed.aborted, committed.undecided), (1, 1));
}

#[test]
fn compressed_batches_decode_to_the_same_view() {
    let batches: [&[Record]; 3] = [
        &[data(0, 7, "a"), data(1, 7, "b"), data(2, 7, "c")],
        &[commit(3, 7)],
        &[data(4, NO_PRODUCER, "d"), data(5, NO_PRODUCER, "e")],
    ];
    let plain = view_of(&log_of(&batches, Compression::None), 6);
    assert_eq!(plain.records.len(), 5);
    for compression in [
        Compression::Gzip,
        Compression::Zstd,
        Compression::Snappy,
        Compression::Lz4,
    ] {
        let log = log_of(&batches, compression);
        assert_eq!(view_of(&log, 6), plain, "{compression:?}");
    }
}

#[test]
fn control_records_never_join_the_view_and_other_types_end_no_transaction() {
    // Type 2 is a control record but no transaction marker (as KRaft's LEADER_CHANGE).
    let log = log_of(
        &[&[data(0, 7, "a")], &[marker(1, 7, 2)], &[commit(2, 7)]],
        Compression::None,
    );
    let committed = view_of(&log, 3);
    assert_eq!(values(&committed), [(0, "a".into())]);
    let log = log_of(&[&[data(0, 7, "a")], &[marker(1, 7, 2)]], Compression::None);
    assert_eq!(view_of(&log, 2).undecided, 1);
}

#[test]
fn a_control_record_whose_key_does_not_read_is_an_error() {
    let broken = Record {
        key: Some(Bytes::from_static(&[0, 0, 1])),
        ..commit(1, 7)
    };
    let log = log_of(&[&[data(0, 7, "a")], &[broken]], Compression::None);
    let error = take_answer(&mut View::default(), &log, 0, 2).unwrap_err();
    assert_eq!(error.offset, 1);
    assert!(error.what.contains("transaction marker"), "{}", error.what);
}

#[test]
fn headers_null_keys_and_tombstones_are_kept() {
    let mut headers = IndexMap::new();
    headers.insert(
        StrBytes::from_static_str("source"),
        Some(Bytes::from_static(b"ddb")),
    );
    headers.insert(StrBytes::from_static_str("none"), None);
    let record = Record {
        key: None,
        value: None,
        headers,
        ..data(0, NO_PRODUCER, "x")
    };
    let committed = view_of(&log_of(&[&[record]], Compression::None), 1);
    let got = &committed.records[0];
    assert_eq!((got.key.clone(), got.value.clone()), (None, None));
    assert_eq!(
        got.headers,
        [
            ("source".to_string(), Some(Bytes::from_static(b"ddb"))),
            ("none".to_string(), None)
        ]
    );
}

#[test]
fn a_batch_cut_short_at_the_end_of_an_answer_is_fetched_again() {
    let log = log_of(
        &[&[data(0, NO_PRODUCER, "a")], &[data(1, NO_PRODUCER, "b")]],
        Compression::None,
    );
    let cut = log.slice(..log.len() - 3);
    assert_eq!(batches::split(&cut).unwrap().len(), 1);
    let mut view = View::default();
    let next = take_answer(&mut view, &cut, 0, 2).unwrap();
    assert_eq!(next, 1, "the next fetch starts at the batch cut short");
    // The next answer starts with the first batch again: it is not taken twice.
    let next = take_answer(&mut view, &log, next, 2).unwrap();
    assert_eq!(next, 2);
    assert_eq!(values(&view.finish(2)), [(0, "a".into()), (1, "b".into())]);
}

#[test]
fn batches_returned_again_are_not_taken_twice() {
    let first: [&[Record]; 2] = [
        &[data(0, NO_PRODUCER, "a"), data(1, NO_PRODUCER, "b")],
        &[data(2, NO_PRODUCER, "c"), data(3, NO_PRODUCER, "d")],
    ];
    let mut view = View::default();
    let next = take_answer(&mut view, &log_of(&first, Compression::None), 0, 5).unwrap();
    assert_eq!(next, 4);
    // A broker that answers from an earlier batch than asked: the batches already taken lead.
    let again = log_of(
        &[first[0], first[1], &[data(4, NO_PRODUCER, "e")]],
        Compression::None,
    );
    assert_eq!(take_answer(&mut view, &again, next, 5).unwrap(), 5);
    let offsets: Vec<i64> = view.finish(5).records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [0, 1, 2, 3, 4]);
}

#[test]
fn records_before_the_fetch_offset_are_not_taken_twice() {
    // One compressed batch of three: a fetch from offset 1 gets it whole, offset 0 included.
    let log = log_of(
        &[&[
            data(0, NO_PRODUCER, "a"),
            data(1, NO_PRODUCER, "b"),
            data(2, NO_PRODUCER, "c"),
        ]],
        Compression::Zstd,
    );
    let mut view = View::default();
    assert_eq!(take_answer(&mut view, &log, 1, 3).unwrap(), 3);
    assert_eq!(values(&view.finish(3)), [(1, "b".into()), (2, "c".into())]);
}

#[test]
fn records_and_markers_past_the_end_are_not_read() {
    let log = log_of(
        &[
            &[data(0, NO_PRODUCER, "a")],
            &[data(1, 7, "b")],
            &[commit(2, 7)],
            &[data(3, NO_PRODUCER, "c")],
        ],
        Compression::None,
    );
    let mut view = View::default();
    let next = take_answer(&mut view, &log, 0, 2).unwrap();
    assert_eq!(next, 2);
    let committed = view.finish(2);
    assert_eq!(values(&committed), [(0, "a".into())]);
    assert_eq!(committed.undecided, 1, "the COMMIT at 2 lies past the end");
}

/// Rule 9: a batch that reaches past the end is taken up to it, and the next read from there
/// takes the rest (tansu's watermark can stop inside its last batch).
#[test]
fn a_batch_reaching_past_the_end_is_read_on_from_the_end() {
    let idempotent = 9;
    let batch = [
        Record {
            transactional: false,
            ..data(0, idempotent, "a")
        },
        Record {
            transactional: false,
            ..data(1, idempotent, "b")
        },
        Record {
            transactional: false,
            ..data(2, idempotent, "c")
        },
    ];
    let log = log_of(&[&batch], Compression::None);
    let mut view = View::default();
    let next = take_answer(&mut view, &log, 0, 1).unwrap();
    assert_eq!(next, 1, "the read stops at the end, not after the batch");
    let next = take_answer(&mut view, &log, next, i64::MAX).unwrap();
    assert_eq!(next, 3);
    assert_eq!(
        values(&view.finish(next)),
        [(0, "a".into()), (1, "b".into()), (2, "c".into())]
    );
}

/// CRC-32C (Castagnoli), the checksum of a v2 record batch.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_batch_emptied_by_compaction_is_stepped_over() {
    // Compaction may keep a batch's header, last offset included, and drop all its records.
    let full = log_of(
        &[&[
            data(0, NO_PRODUCER, "a"),
            data(1, NO_PRODUCER, "b"),
            data(2, NO_PRODUCER, "c"),
        ]],
        Compression::None,
    );
    let mut emptied = BytesMut::from(&full[..61]);
    emptied[8..12].copy_from_slice(&49i32.to_be_bytes());
    emptied[57..61].copy_from_slice(&0i32.to_be_bytes());
    let crc = crc32c(&emptied[21..]);
    emptied[17..21].copy_from_slice(&crc.to_be_bytes());
    let mut view = View::default();
    let next = take_answer(&mut view, &emptied.freeze(), 0, 4).unwrap();
    assert_eq!(
        next, 3,
        "the next fetch starts after the emptied batch's last offset"
    );
    let later = log_of(&[&[data(3, NO_PRODUCER, "d")]], Compression::None);
    assert_eq!(take_answer(&mut view, &later, next, 4).unwrap(), 4);
    assert_eq!(values(&view.finish(4)), [(3, "d".into())]);
}

#[test]
fn an_older_message_format_is_refused_naming_the_offset() {
    let mut log = BytesMut::from(&log_of(&[&[data(5, NO_PRODUCER, "a")]], Compression::None)[..]);
    log[16] = 1;
    let error = batches::split(&log.freeze()).unwrap_err();
    assert_eq!(error.offset, 5);
    assert!(error.what.contains("message format v1"), "{}", error.what);
}

#[test]
fn a_corrupted_batch_is_refused_naming_the_offset() {
    let mut log = BytesMut::from(&log_of(&[&[data(4, NO_PRODUCER, "abc")]], Compression::None)[..]);
    let last = log.len() - 2;
    log[last] ^= 0xff;
    let log = log.freeze();
    let error = take_answer(&mut View::default(), &log, 0, 5).unwrap_err();
    assert_eq!(error.offset, 4);
    assert!(
        error.what.contains("Cyclic redundancy check"),
        "{}",
        error.what
    );
}

#[test]
fn the_highest_version_both_sides_speak_is_chosen() {
    assert_eq!(choose_version(Some((0, 16)), (4, 12)), Some(12));
    assert_eq!(choose_version(Some((0, 9)), (4, 12)), Some(9));
    assert_eq!(choose_version(Some((0, 3)), (4, 12)), None);
    assert_eq!(choose_version(Some((13, 16)), (4, 12)), None);
    assert_eq!(choose_version(None, (4, 12)), None);
}

#[test]
fn brokers_are_host_port_entries_separated_by_commas() {
    assert_eq!(
        parse_brokers(" a:9092 ,b.example:19092,").unwrap(),
        ["a:9092", "b.example:19092"]
    );
    assert!(matches!(parse_brokers(" , "), Err(LogError::NoBrokers)));
    for bad in ["localhost", "host:port", ":9092", "host:99999"] {
        match parse_brokers(bad) {
            Err(LogError::BadAddress { address }) => assert_eq!(address, bad),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

/// One read of `follower` (rule 11): `log` answered whole, from where the follower begins
/// (`earliest`: the partition's first offset, of topic `topic_id`) up to `end`.
fn follow(follower: &mut Follower, topic_id: u128, earliest: i64, log: &Bytes, end: i64) {
    let start = follower.begin(topic_id, earliest);
    let next = take_answer(Fold::view(follower), log, start, end).unwrap();
    assert!(next >= end, "the answer stopped at {next}, short of {end}");
    follower.end::<()>(Ok(next)).unwrap();
}

/// A log of plain records, one batch each, from offset 0: keys `k-<text>`.
fn plain(texts: &[&str]) -> Bytes {
    let records: Vec<Record> = (0..)
        .zip(texts)
        .map(|(offset, text)| data(offset, NO_PRODUCER, text))
        .collect();
    let batches: Vec<&[Record]> = records.iter().map(std::slice::from_ref).collect();
    log_of(&batches, Compression::None)
}

/// The offset of `key`'s last committed record in `follower`.
fn last_offset(follower: &Follower, key: &str) -> Option<i64> {
    follower.last(key.as_bytes()).map(|record| record.offset)
}

#[test]
fn a_follower_decides_a_transaction_read_before_its_marker_at_a_later_read() {
    let mut follower = Follower::new(b"k-");
    let first = log_of(
        &[&[data(0, 7, "a")], &[data(1, NO_PRODUCER, "b")]],
        Compression::None,
    );
    follow(&mut follower, 1, 0, &first, 2);
    assert_eq!(last_offset(&follower, "k-a"), None, "still undecided");
    assert_eq!(last_offset(&follower, "k-b"), Some(1));
    let second = log_of(&[&[commit(2, 7)]], Compression::None);
    follow(&mut follower, 1, 0, &second, 3);
    assert_eq!(last_offset(&follower, "k-a"), Some(0));
    assert_eq!(follower.records_read(), 3, "each record once");
    assert_eq!(follower.full_reads(), 1);
}

#[test]
fn a_follower_keeps_a_keys_newest_record_and_drops_what_an_abort_ends() {
    let mut follower = Follower::new(b"k-");
    let log = log_of(
        &[
            &[data(0, 7, "x")],
            &[data(1, NO_PRODUCER, "x")],
            &[data(2, NO_PRODUCER, "y")],
        ],
        Compression::None,
    );
    follow(&mut follower, 1, 0, &log, 3);
    let log = log_of(&[&[commit(3, 7)], &[data(4, 8, "y")]], Compression::None);
    follow(&mut follower, 1, 0, &log, 5);
    assert_eq!(
        last_offset(&follower, "k-x"),
        Some(1),
        "the transaction committed later holds an older record of k-x"
    );
    let log = log_of(&[&[abort(5, 8)]], Compression::None);
    follow(&mut follower, 1, 0, &log, 6);
    assert_eq!(last_offset(&follower, "k-y"), Some(2));
}

#[test]
fn a_follower_keeps_only_the_keys_of_its_prefix() {
    let mut follower = Follower::new(b"k-a");
    follow(&mut follower, 1, 0, &plain(&["a1", "b1"]), 2);
    assert_eq!(last_offset(&follower, "k-a1"), Some(0));
    assert_eq!(last_offset(&follower, "k-b1"), None);
    assert_eq!(follower.records().count(), 1);
}

#[test]
fn a_follower_reads_from_the_start_again_after_a_deletion_or_a_new_topic() {
    let mut follower = Follower::new(b"k-");
    let log = plain(&["a", "b"]);
    follow(&mut follower, 1, 0, &log, 2);
    assert_eq!(
        follower.begin(1, 2),
        2,
        "nothing after the last read was deleted"
    );
    assert_eq!(follower.full_reads(), 1);
    assert_eq!(
        follower.begin(1, 5),
        5,
        "records after the last read were deleted"
    );
    assert_eq!(follower.full_reads(), 2);
    assert_eq!(last_offset(&follower, "k-a"), None, "everything forgotten");
    follow(&mut follower, 1, 0, &log, 2);
    assert_eq!(follower.full_reads(), 3, "a new first read after the reset");
    assert_eq!(last_offset(&follower, "k-b"), Some(1));
    assert_eq!(follower.begin(2, 0), 0, "the topic was created again");
    assert_eq!(follower.full_reads(), 4);
    assert_eq!(last_offset(&follower, "k-b"), None);
}

#[test]
fn a_follower_reads_from_the_start_again_after_a_failed_read() {
    let mut follower = Follower::new(b"k-");
    follow(&mut follower, 1, 0, &plain(&["a"]), 1);
    // The second read takes a transaction's record, then fails before the marker comes.
    let start = follower.begin(1, 0);
    assert_eq!(start, 1, "after the first read");
    let partial = log_of(&[&[data(1, 7, "b")]], Compression::None);
    let next = take_answer(Fold::view(&mut follower), &partial, start, 3).unwrap();
    assert_eq!(next, 2, "the answer stopped short of the end");
    assert_eq!(
        follower.end(Err("the leader went away")),
        Err("the leader went away")
    );
    // The next read begins at the first offset: read from 1 again, the transaction's record
    // would be folded twice.
    let whole = log_of(
        &[
            &[data(0, NO_PRODUCER, "a")],
            &[data(1, 7, "b")],
            &[commit(2, 7)],
        ],
        Compression::None,
    );
    follow(&mut follower, 1, 0, &whole, 3);
    assert_eq!(
        follower.full_reads(),
        2,
        "a failed read is followed by a whole one"
    );
    assert_eq!(last_offset(&follower, "k-a"), Some(0));
    assert_eq!(last_offset(&follower, "k-b"), Some(1));
    assert_eq!(follower.records().count(), 2);
}
