//! `mode: streams` under faults, through the real binary: a scripted DynamoDB Streams endpoint
//! pages its shard listing, hides children from the full listing, expires iterators, trims
//! shards, throttles, fails and sends malformed records, and `ddbpipe run` must read, resume,
//! stop and report exactly as docs/streams.md §4.3 (discovery), §4.5–§4.6 (gaps), §4.9 (one slice),
//! §4.10 (`max_messages`), §9 (errors and retries) and §10 scenarios 8 and 9 say. Nothing here
//! measures elapsed time: backoffs are configured short and outcomes are counted in requests.

mod fake_streams;

use std::collections::BTreeSet;

use serde_json::{Value, json};
use wiremock::{Request, ResponseTemplate};

use fake_streams::{
    ARN, FakeStreams, Op, Pipeline, after, any, at_trim_horizon, aws_error, children_of, iterator,
    record, records, shard, stream_page, streamed_table, streams_error, throttle, with_iterator,
};

/// The iterator of an open shard's tail: it answers nothing, and itself, forever.
const TAIL: &str = "it-tail";

/// A fake listing one open shard `s1` of [`ARN`], whose `TRIM_HORIZON` iterator is `it-1` and
/// whose tail ([`TAIL`]) is empty. Tests script what `it-1` and the iterators after it answer.
async fn one_open_shard() -> FakeStreams {
    let fake = FakeStreams::start().await;
    fake.always(
        Op::DescribeStream,
        any(),
        stream_page(ARN, &[shard("s1", None, false)], None),
    )
    .await;
    fake.always(
        Op::GetShardIterator,
        at_trim_horizon("s1"),
        iterator("it-1"),
    )
    .await;
    fake.always(
        Op::GetRecords,
        with_iterator(TAIL),
        records(&[], Some(TAIL)),
    )
    .await;
    fake
}

/// The records with these sequence numbers.
fn batch(seqs: &[&str]) -> Vec<Value> {
    seqs.iter().map(|seq| record(seq)).collect()
}

/// The stored sequence number of `shard`.
fn stored_seq(pipeline: &Pipeline, shard: &str) -> Value {
    pipeline.position()["shards"][shard].clone()
}

// --- docs/streams.md §4.3: discovery ------------------------------------------------------------------

#[tokio::test]
async fn every_shard_of_a_two_page_listing_is_read_and_page_two_starts_after_page_one() {
    const SHARDS: usize = 130;
    let ids: Vec<String> = (0..SHARDS).map(|i| format!("s{i:03}")).collect();
    let listed: Vec<Value> = ids.iter().map(|id| shard(id, None, true)).collect();
    let fake = FakeStreams::start().await;
    // Among standing answers the first mounted wins: the specific ones come first.
    fake.always(
        Op::DescribeStream,
        json!({"ShardFilter": {"Type": "CHILD_SHARDS"}}),
        stream_page(ARN, &[], None),
    )
    .await;
    fake.always(
        Op::DescribeStream,
        json!({"ExclusiveStartShardId": "s099"}),
        stream_page(ARN, &listed[100..], None),
    )
    .await;
    fake.always(
        Op::DescribeStream,
        any(),
        stream_page(ARN, &listed[..100], Some("s099")),
    )
    .await;
    // Shard `sNNN` holds one record, sequence number 1NNN, and is closed.
    fake.always(Op::GetShardIterator, any(), |request: &Request| {
        let body: Value = request.body_json().expect("a JSON body");
        let id = body["ShardId"].as_str().unwrap_or_default();
        iterator(&format!("it-{id}"))
    })
    .await;
    fake.always(
        Op::GetRecords,
        any(),
        |request: &Request| -> ResponseTemplate {
            let body: Value = request.body_json().expect("a JSON body");
            let it = body["ShardIterator"].as_str().unwrap_or_default();
            let n = it.trim_start_matches("it-s");
            records(&[record(&format!("1{n}"))], None)
        },
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let written = pipeline.written_seqs();
    assert_eq!(written.len(), SHARDS, "each record once: {written:?}");
    let expected: BTreeSet<String> = (0..SHARDS).map(|i| format!("1{i:03}")).collect();
    assert_eq!(written.into_iter().collect::<BTreeSet<_>>(), expected);
    let listings: Vec<Value> = fake
        .bodies(Op::DescribeStream)
        .await
        .into_iter()
        .filter(|body| body.get("ShardFilter").is_none())
        .collect();
    assert!(listings.len() >= 2, "{listings:?}");
    assert!(
        listings[0].get("ExclusiveStartShardId").is_none(),
        "{}",
        listings[0]
    );
    assert_eq!(listings[1]["ExclusiveStartShardId"], "s099");
    for body in &listings {
        assert_eq!(body["StreamArn"], ARN, "{body}");
        assert_eq!(body["Limit"], 100, "{body}");
    }
    let finished = pipeline.position()["finished"].clone();
    assert_eq!(
        finished.as_array().map(Vec::len),
        Some(SHARDS),
        "every shard stored finished: {finished}"
    );
}

#[tokio::test]
async fn a_child_listed_only_by_the_child_filter_is_read_right_after_its_parent_drains() {
    let fake = FakeStreams::start().await;
    fake.always(
        Op::DescribeStream,
        children_of("p"),
        stream_page(ARN, &[shard("c", Some("p"), false)], None),
    )
    .await;
    fake.always(
        Op::DescribeStream,
        any(),
        stream_page(ARN, &[shard("p", None, true)], None),
    )
    .await;
    fake.always(Op::GetShardIterator, at_trim_horizon("p"), iterator("it-p"))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-p"),
        records(&batch(&["101"]), None),
    )
    .await;
    fake.always(Op::GetShardIterator, at_trim_horizon("c"), iterator("it-c"))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-c"),
        records(&batch(&["201"]), Some(TAIL)),
    )
    .await;
    fake.always(
        Op::GetRecords,
        with_iterator(TAIL),
        records(&[], Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let read: Vec<(Value, Value)> = pipeline
        .envelopes()
        .into_iter()
        .map(|e| (e["shard_id"].clone(), e["sequence_number"].clone()))
        .collect();
    assert_eq!(
        read,
        [(json!("p"), json!("101")), (json!("c"), json!("201"))],
        "the parent's record first, then the child's"
    );
    // The request right after the parent's last read asks for its children.
    let requests = fake.requests().await;
    let drained = requests
        .iter()
        .position(|(op, body)| *op == Op::GetRecords && body["ShardIterator"] == "it-p")
        .expect("the parent was read");
    let (op, body) = &requests[drained + 1];
    assert_eq!(*op, Op::DescribeStream, "{body}");
    assert_eq!(
        body["ShardFilter"],
        json!({"Type": "CHILD_SHARDS", "ShardId": "p"})
    );
    let position = pipeline.position();
    assert_eq!(position["finished"], json!(["p"]), "{position}");
    assert_eq!(position["shards"]["c"], "201", "{position}");
}

#[tokio::test]
async fn closed_shards_in_two_generations_behind_an_endpoint_ignoring_the_filter_are_read_in_one_run()
 {
    // 110 lanes of two closed shards, the second without children. The endpoint answers a
    // filtered DescribeStream with the first page of the full listing (like the emulators)
    // and takes 1.2 s per page, longer than the 1 s idle end: children lookups must neither
    // hold read slots nor let the run end idle with shards unread.
    const LANES: usize = 110;
    let ids: Vec<String> = (0..LANES)
        .map(|i| format!("a{i:03}"))
        .chain((0..LANES).map(|i| format!("b{i:03}")))
        .collect();
    let listed: Vec<Value> = ids
        .iter()
        .map(|id| {
            let parent = id.strip_prefix('b').map(|n| format!("a{n}"));
            shard(id, parent.as_deref(), true)
        })
        .collect();
    let slow = std::time::Duration::from_millis(1200);
    let fake = FakeStreams::start().await;
    // Among standing answers the first mounted wins: the continuation pages come first, and
    // every other request, filtered or not, gets the first page.
    let pages: Vec<&[Value]> = listed.chunks(100).collect();
    for (i, page) in pages.iter().enumerate() {
        let last = (i + 1 < pages.len()).then(|| ids[i * 100 + 99].as_str());
        let answer = stream_page(ARN, page, last).set_delay(slow);
        if i == 0 {
            continue;
        }
        fake.always(
            Op::DescribeStream,
            json!({"ExclusiveStartShardId": ids[i * 100 - 1]}),
            answer,
        )
        .await;
    }
    fake.always(
        Op::DescribeStream,
        any(),
        stream_page(ARN, pages[0], Some(ids[99].as_str())).set_delay(slow),
    )
    .await;
    // Shard `aNNN` holds record 1NNN, shard `bNNN` record 2NNN; both are closed.
    fake.always(Op::GetShardIterator, any(), |request: &Request| {
        let body: Value = request.body_json().expect("a JSON body");
        let id = body["ShardId"].as_str().unwrap_or_default();
        iterator(&format!("it-{id}"))
    })
    .await;
    fake.always(
        Op::GetRecords,
        any(),
        |request: &Request| -> ResponseTemplate {
            let body: Value = request.body_json().expect("a JSON body");
            let it = body["ShardIterator"].as_str().unwrap_or_default();
            let id = it.trim_start_matches("it-");
            let seq = id.replacen('a', "1", 1).replacen('b', "2", 1);
            records(&[record(&seq)], None)
        },
    )
    .await;
    let pipeline = Pipeline::new(&fake).source("shard_concurrency: 2");

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let written = pipeline.written_seqs();
    assert_eq!(written.len(), 2 * LANES, "one run reads every record once");
    let expected: BTreeSet<String> = ids
        .iter()
        .map(|id| id.replacen('a', "1", 1).replacen('b', "2", 1))
        .collect();
    assert_eq!(written.into_iter().collect::<BTreeSet<_>>(), expected);
    let finished = pipeline.position()["finished"].clone();
    assert_eq!(
        finished.as_array().map(Vec::len),
        Some(2 * LANES),
        "{finished}"
    );
    let filtered = fake
        .bodies(Op::DescribeStream)
        .await
        .into_iter()
        .filter(|body| body.get("ShardFilter").is_some())
        .count();
    assert_eq!(
        filtered, 1,
        "the ignored filter is noticed once; full listings serve the later lookups"
    );
}

// --- docs/testing.md §10 scenario 8: expired iterators -------------------------------------------------

#[tokio::test]
async fn an_expired_iterator_resumes_after_the_last_record_read_without_loss_or_repeat() {
    let fake = one_open_shard().await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["101", "102"]), Some("it-2")),
    )
    .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-2"),
        streams_error("ExpiredIteratorException"),
    )
    .await;
    fake.always(Op::GetShardIterator, after("s1", "102"), iterator("it-3"))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-3"),
        records(&batch(&["103"]), Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(pipeline.written_seqs(), ["101", "102", "103"]);
    let acquired = fake.bodies(Op::GetShardIterator).await;
    assert_eq!(acquired.len(), 2, "{acquired:?}");
    assert_eq!(acquired[0]["ShardIteratorType"], "TRIM_HORIZON");
    assert_eq!(acquired[1]["ShardIteratorType"], "AFTER_SEQUENCE_NUMBER");
    assert_eq!(acquired[1]["SequenceNumber"], "102");
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-2"))
            .await,
        1
    );
    assert_eq!(stored_seq(&pipeline, "s1"), "103");
}

#[tokio::test]
async fn an_iterator_that_expires_three_times_in_a_row_fails_the_run() {
    let fake = one_open_shard().await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["101"]), Some("it-2")),
    )
    .await;
    fake.always(Op::GetShardIterator, after("s1", "101"), iterator("it-2"))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-2"),
        streams_error("ExpiredIteratorException"),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("iterator for shard s1 keeps expiring"),
        "{}",
        outcome.stderr
    );
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-2"))
            .await,
        3
    );
    // One first acquisition, then a renewal after each of the first two expiries, each from
    // the last record read.
    assert_eq!(fake.calls(Op::GetShardIterator).await, 3);
    assert_eq!(
        fake.calls_with(Op::GetShardIterator, &after("s1", "101"))
            .await,
        2
    );
    let written = pipeline.written_seqs();
    assert!(written.is_empty() || written == ["101"], "{written:?}");
}

// --- docs/testing.md §10 scenario 9, docs/streams.md §4.5–§4.6: gaps --------------------------------------------------

#[tokio::test]
async fn a_trimmed_resume_point_at_start_up_with_on_gap_fail_stops_and_leaves_the_state_unchanged()
{
    let fake = one_open_shard().await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["5"]), Some(TAIL)),
    )
    .await;
    fake.always(
        Op::GetShardIterator,
        after("s1", "5"),
        streams_error("TrimmedDataAccessException"),
    )
    .await;
    let pipeline = Pipeline::new(&fake).source("on_gap: fail");
    let first = pipeline.run().await;
    assert_eq!(first.code, Some(0), "{first:?}");
    assert_eq!(stored_seq(&pipeline, "s1"), "5");
    let state_before = pipeline.state_bytes();
    let reads_before = fake.calls(Op::GetRecords).await;

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    for wanted in [
        "cannot resume table 't' without losing changes",
        "shard s1 was trimmed past sequence 5",
        "on_gap: resnapshot",
    ] {
        assert!(
            outcome.stderr.contains(wanted),
            "{wanted}: {}",
            outcome.stderr
        );
    }
    assert_eq!(
        pipeline.state_bytes(),
        state_before,
        "the state file is unchanged"
    );
    assert_eq!(
        fake.calls_with(Op::GetShardIterator, &after("s1", "5"))
            .await,
        1
    );
    assert_eq!(
        fake.calls(Op::GetRecords).await,
        reads_before,
        "nothing read"
    );
    assert_eq!(pipeline.written_seqs(), ["5"]);
}

/// A read of `s1` that meets `code` on its second `GetRecords`, with `on_gap: resnapshot`.
async fn a_run_that_meets_on_its_second_read(code: &str) -> (FakeStreams, fake_streams::Outcome) {
    let fake = one_open_shard().await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["101"]), Some("it-2")),
    )
    .await;
    fake.always(Op::GetRecords, with_iterator("it-2"), streams_error(code))
        .await;
    let pipeline = Pipeline::new(&fake)
        .source("on_gap: resnapshot")
        .source("resnapshot_deletes: false");
    let outcome = pipeline.run().await;
    (fake, outcome)
}

#[tokio::test]
async fn a_trim_while_reading_fails_the_run_even_with_on_gap_resnapshot() {
    let (fake, outcome) = a_run_that_meets_on_its_second_read("TrimmedDataAccessException").await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("shard s1 was trimmed past the position being read"),
        "{}",
        outcome.stderr
    );
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-2"))
            .await,
        1,
        "a trim is not retried"
    );
}

#[tokio::test]
async fn a_shard_not_found_while_reading_fails_the_run_as_a_trim() {
    let (fake, outcome) = a_run_that_meets_on_its_second_read("ResourceNotFoundException").await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome.stderr.contains("shard s1 was trimmed past"),
        "{}",
        outcome.stderr
    );
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-2"))
            .await,
        1
    );
}

#[tokio::test]
async fn a_stored_stream_other_than_the_tables_is_exactly_one_reason_naming_both() {
    const NEW_ARN: &str =
        "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2026-02-01T00:00:00.000";
    let fake = one_open_shard().await;
    fake.always(Op::DescribeTable, any(), streamed_table(ARN))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["5"]), Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake).table_stream();
    let first = pipeline.run().await;
    assert_eq!(first.code, Some(0), "{first:?}");
    assert_eq!(pipeline.position()["stream_arn"], ARN);
    let state_before = pipeline.state_bytes();
    // The stream was re-created: a new ARN whose shards have nothing to do with `s1`, which
    // would be a second reason ("expired") were the ARN not checked first and alone.
    fake.reset().await;
    fake.always(Op::DescribeTable, any(), streamed_table(NEW_ARN))
        .await;
    fake.always(
        Op::DescribeStream,
        any(),
        stream_page(NEW_ARN, &[shard("x1", None, false)], None),
    )
    .await;

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    let reason =
        format!("the position belongs to stream {ARN} but table 't' now has stream {NEW_ARN}");
    let alone = format!("without losing changes: {reason}\n");
    assert!(outcome.stderr.contains(&alone), "{}", outcome.stderr);
    assert!(
        outcome.stderr.contains(
            "hint: set on_gap: resnapshot to read the table again, or run `ddbpipe state reset"
        ),
        "{}",
        outcome.stderr
    );
    assert!(!outcome.stderr.contains("expired"), "{}", outcome.stderr);
    assert_eq!(
        pipeline.state_bytes(),
        state_before,
        "the state file is unchanged"
    );
    assert_eq!(fake.calls(Op::GetShardIterator).await, 0);
    assert_eq!(fake.calls(Op::GetRecords).await, 0);
}

/// Gap layer 3 needs no shard listing, so `check` applies it as the run does: a shard last read
/// empty longer ago than the stream keeps records fails both with `on_gap: fail`.
#[tokio::test]
async fn check_fails_like_run_on_a_shard_last_read_empty_more_than_23_hours_ago() {
    let fake = one_open_shard().await;
    fake.always(Op::DescribeTable, any(), streamed_table(ARN))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&[], Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake).table_stream();
    let first = pipeline.run().await;
    assert_eq!(first.code, Some(0), "{first:?}");
    assert_eq!(pipeline.position()["shards"]["s1"], "");
    let day_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 24 * 3600;
    pipeline.edit_position(|position| position["verified_at"]["s1"] = json!(day_ago));

    let checked = pipeline.check().await;
    let report: Value = serde_json::from_str(&checked.stdout).expect("check --json");
    let state = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|probe| probe["name"] == "state")
        .expect("a state probe");
    assert_eq!(state["status"], "FAIL", "{report}");
    let detail = state["detail"].as_str().expect("a detail");
    assert!(
        detail.contains("shard s1 was last read 24h ago"),
        "{detail}"
    );
    assert_eq!(checked.code, Some(1), "{checked:?}");

    let outcome = pipeline.run().await;
    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome.stderr.contains("shard s1 was last read 24h ago"),
        "{}",
        outcome.stderr
    );
}

/// The `state` probe of `check --json`.
fn state_probe(checked: &fake_streams::Outcome) -> Value {
    let report: Value = serde_json::from_str(&checked.stdout).expect("check --json");
    report["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .find(|probe| probe["name"] == "state")
        .cloned()
        .unwrap_or_else(|| panic!("a state probe: {report}"))
}

/// `lag --json`: the exit code and the report.
async fn lag_of(pipeline: &Pipeline) -> (Option<i32>, Value) {
    let outcome = pipeline.lag().await;
    let report = serde_json::from_str(&outcome.stdout)
        .unwrap_or_else(|e| panic!("lag --json prints JSON ({e}): {outcome:?}"));
    (outcome.code, report)
}

/// A pipeline that stored `s1` at sequence 5 (one run reading `5` from `s1`), its table
/// described for `check`.
async fn stored_at_five(on_gap: &str) -> (FakeStreams, Pipeline) {
    let fake = one_open_shard().await;
    fake.always(Op::DescribeTable, any(), streamed_table(ARN))
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["5"]), Some(TAIL)),
    )
    .await;
    let mut pipeline = Pipeline::new(&fake).table_stream().source(on_gap);
    if on_gap != "on_gap: fail" {
        pipeline = pipeline.source("resnapshot_deletes: false");
    }
    let first = pipeline.run().await;
    assert_eq!(first.code, Some(0), "{first:?}");
    assert_eq!(stored_seq(&pipeline, "s1"), "5");
    (fake, pipeline)
}

/// Issue 24 item 15: a stored position the stream trimmed (gap layer 4) fails `check` and
/// makes the lag unknown, naming the shard and the `on_gap` the run applies, as the next run
/// stops on it. `check` probes the shard's iterator and reads nothing.
#[tokio::test]
async fn check_and_lag_report_a_stored_position_the_stream_trimmed() {
    let (fake, pipeline) = stored_at_five("on_gap: fail").await;
    fake.always(
        Op::GetShardIterator,
        after("s1", "5"),
        streams_error("TrimmedDataAccessException"),
    )
    .await;
    let reads = fake.calls(Op::GetRecords).await;

    let checked = pipeline.check().await;
    let state = state_probe(&checked);
    assert_eq!(state["status"], "FAIL", "{state}");
    let detail = state["detail"].as_str().expect("a detail");
    for wanted in [
        "shard s1 was trimmed past sequence 5",
        "the next run applies on_gap: fail",
    ] {
        assert!(detail.contains(wanted), "{wanted}: {detail}");
    }
    assert_eq!(checked.code, Some(1), "{checked:?}");

    let (code, report) = lag_of(&pipeline).await;
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["lag_seconds"], Value::Null, "{report}");
    let error = report["error"].as_str().expect("an error");
    for wanted in [
        "shard s1 was trimmed past sequence 5",
        "the next run applies on_gap: fail",
    ] {
        assert!(error.contains(wanted), "{wanted}: {error}");
    }
    assert_eq!(fake.calls(Op::GetRecords).await, reads, "nothing was read");

    let outcome = pipeline.run().await;
    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("shard s1 was trimmed past sequence 5"),
        "{}",
        outcome.stderr
    );
}

/// Issue 24 item 15: a stored shard the stream no longer lists (gap layer 2) is a gap for
/// `check` and `lag` too; with `on_gap: resnapshot` `check` warns (the run rescans) naming it.
#[tokio::test]
async fn check_and_lag_report_a_stored_shard_the_stream_no_longer_lists() {
    let (fake, pipeline) = stored_at_five("on_gap: resnapshot").await;
    // `s1` expired; `s2` is new and holds a record: without the gap layers its age would be
    // the lag.
    fake.reset().await;
    fake.always(Op::DescribeTable, any(), streamed_table(ARN))
        .await;
    fake.always(
        Op::DescribeStream,
        any(),
        stream_page(ARN, &[shard("s2", None, false)], None),
    )
    .await;
    fake.always(
        Op::GetShardIterator,
        at_trim_horizon("s2"),
        iterator("it-2"),
    )
    .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-2"),
        records(&batch(&["7"]), Some(TAIL)),
    )
    .await;

    let checked = pipeline.check().await;
    let state = state_probe(&checked);
    assert_eq!(state["status"], "WARN", "{state}");
    let detail = state["detail"].as_str().expect("a detail");
    for wanted in [
        "shard s1 expired before it was fully read",
        "the next run applies on_gap: resnapshot",
    ] {
        assert!(detail.contains(wanted), "{wanted}: {detail}");
    }

    let (code, report) = lag_of(&pipeline).await;
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(report["lag_seconds"], Value::Null, "{report}");
    let error = report["error"].as_str().expect("an error");
    for wanted in [
        "shard s1 expired before it was fully read",
        "the next run applies on_gap: resnapshot",
    ] {
        assert!(error.contains(wanted), "{wanted}: {error}");
    }
}

// --- docs/streams.md §4.9, docs/errors.md §9: throttles and transient errors on GetRecords ---------------------------

#[tokio::test]
async fn a_get_records_throttled_three_times_is_retried_and_the_run_succeeds() {
    let fake = one_open_shard().await;
    fake.next(
        Op::GetRecords,
        with_iterator("it-1"),
        3,
        streams_error("LimitExceededException"),
    )
    .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["101"]), Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(pipeline.written_seqs(), ["101"]);
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-1"))
            .await,
        4
    );
    assert_eq!(stored_seq(&pipeline, "s1"), "101");
}

#[tokio::test]
async fn throttles_on_get_records_never_spend_the_retry_budget() {
    let fake = one_open_shard().await;
    fake.next(
        Op::GetRecords,
        with_iterator("it-1"),
        2,
        streams_error("LimitExceededException"),
    )
    .await;
    fake.next(Op::GetRecords, with_iterator("it-1"), 4, throttle())
        .await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["101"]), Some(TAIL)),
    )
    .await;
    // Six throttles in a row, twice `max_retries`.
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(pipeline.written_seqs(), ["101"]);
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-1"))
            .await,
        7
    );
}

#[tokio::test]
async fn a_get_records_failing_transiently_past_max_retries_fails_the_run() {
    let fake = one_open_shard().await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        aws_error(500, "InternalServerError", "Internal server error (ref 41)"),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("GetRecords on s1 failed after 4 attempt(s)"),
        "{}",
        outcome.stderr
    );
    assert!(
        outcome.stderr.contains("Internal server error (ref 41)"),
        "the AWS message verbatim: {}",
        outcome.stderr
    );
    // max_retries: 3 → the first attempt and 3 retries, on the same iterator.
    assert_eq!(
        fake.calls_with(Op::GetRecords, &with_iterator("it-1"))
            .await,
        4
    );
    assert!(pipeline.written_seqs().is_empty());
}

// --- docs/streams.md §4.1: malformed records ----------------------------------------------------------

#[tokio::test]
async fn a_record_without_its_stream_part_fails_the_run() {
    let fake = one_open_shard().await;
    let bare = json!({"eventID": "e7", "eventName": "INSERT", "eventSource": "aws:dynamodb"});
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&[bare], Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("record e7 in s1 has no stream record"),
        "{}",
        outcome.stderr
    );
    assert!(pipeline.written_seqs().is_empty());
}

#[tokio::test]
async fn a_record_without_a_sequence_number_fails_the_run() {
    let fake = one_open_shard().await;
    let mut unnumbered = record("7");
    unnumbered["dynamodb"]
        .as_object_mut()
        .expect("a record has its stream part")
        .remove("SequenceNumber");
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&[unnumbered], Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("record e7 in s1 has no sequence number"),
        "{}",
        outcome.stderr
    );
    assert!(pipeline.written_seqs().is_empty());
}

// --- docs/streams.md §4.10: max_messages --------------------------------------------------------------

#[tokio::test]
async fn max_messages_writes_exactly_n_records_and_stores_the_nth_sequence_number() {
    let fake = one_open_shard().await;
    fake.always(
        Op::GetRecords,
        with_iterator("it-1"),
        records(&batch(&["101", "102", "103", "104", "105"]), Some(TAIL)),
    )
    .await;
    let pipeline = Pipeline::new(&fake).max_messages(2);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(pipeline.written_seqs(), ["101", "102"]);
    assert_eq!(stored_seq(&pipeline, "s1"), "102");
}

#[tokio::test]
async fn a_disabled_stream_is_drained_without_looking_for_children_and_ends_the_run() {
    let ids: Vec<String> = (0..10).map(|i| format!("s{i:03}")).collect();
    let listed: Vec<Value> = ids.iter().map(|id| shard(id, None, true)).collect();
    let fake = FakeStreams::start().await;
    let disabled = json!({"StreamDescription": {
        "StreamArn": ARN, "StreamStatus": "DISABLED", "StreamViewType": "NEW_AND_OLD_IMAGES",
        "TableName": "t", "Shards": listed,
    }});
    fake.always(
        Op::DescribeStream,
        any(),
        ResponseTemplate::new(200)
            .insert_header("content-type", "application/x-amz-json-1.0")
            .set_body_json(disabled),
    )
    .await;
    fake.always(Op::GetShardIterator, any(), |request: &Request| {
        let body: Value = request.body_json().expect("a JSON body");
        iterator(&format!(
            "it-{}",
            body["ShardId"].as_str().unwrap_or_default()
        ))
    })
    .await;
    fake.always(Op::GetRecords, any(), |request: &Request| {
        let body: Value = request.body_json().expect("a JSON body");
        let it = body["ShardIterator"].as_str().unwrap_or_default();
        records(
            &[record(&format!("1{}", it.trim_start_matches("it-s")))],
            None,
        )
    })
    .await;
    // Following: only the disabled, drained stream can end this run.
    let pipeline = Pipeline::new(&fake).follow();

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert!(
        outcome.stderr.contains("stream disabled and fully drained"),
        "{}",
        outcome.stderr
    );
    assert_eq!(pipeline.written_seqs().len(), 10);
    let child_lookups = fake
        .bodies(Op::DescribeStream)
        .await
        .iter()
        .filter(|body| body.get("ShardFilter").is_some())
        .count();
    assert_eq!(child_lookups, 0, "a disabled stream gets no children");
}
