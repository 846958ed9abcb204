//! The DynamoDB Streams side of `ddbpipe-bench serve`: `DescribeStream`, `GetShardIterator`
//! and `GetRecords` of the bench stream (see [`crate::records`]), answered from memory.
//!
//! # Layout
//! Every record is serialized before the port is announced, into one [`Rows`] buffer. Shard
//! `k` of `K` holds records `[k·R/K, (k+1)·R/K)`, so a page of any shard, offset and `Limit`
//! is `head + slice + tail`; the heads and tails of the pages a reader with `Limit` 1000 asks
//! for (offsets 0, 1000, 2000, … of every shard) are built beforehand, so answering them is
//! one `writev` of pre-built bytes, as for `Scan`.
//!
//! # Protocol
//! - `DescribeStream`: every shard (pages of `Limit`, at most 100, after
//!   `ExclusiveStartShardId`), each closed (its `SequenceNumberRange` has an end) and without
//!   parent; `StreamStatus` is `DISABLED`, so a reader that drained every shard knows nothing
//!   more will come. A `CHILD_SHARDS` filter lists nothing: no shard has children.
//! - `GetShardIterator`: `TRIM_HORIZON`, `LATEST`, `AT_SEQUENCE_NUMBER` and
//!   `AFTER_SEQUENCE_NUMBER`. The iterator is opaque to clients; it encodes shard and offset.
//! - `GetRecords`: up to `min(Limit, 1000)` records from the iterator's offset, with a
//!   `NextShardIterator` unless the page ends the shard: the shard is closed, so its last page
//!   has none, and a reader knows it drained the shard.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write as _;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::items::TABLE;
use crate::records::{self, PAGE_RECORDS, STREAM_ARN, STREAM_LABEL};
use crate::server::{Answer, Rows, error, http_head};

/// The opaque-to-clients prefix of every shard iterator.
const ITERATOR_PREFIX: &str = "AAAAAAAAAAbench-iterator/";

const RECORDS_OPEN: &[u8] = b"{\"Records\":[";

const NOT_FOUND: &str = "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException";
const VALIDATION: &str = "com.amazon.coral.validation#ValidationException";
const SERIALIZATION: &str = "com.amazon.coral.validation#SerializationException";

/// Settings of the served stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamSettings {
    /// Records in the stream, over every shard.
    pub records: u64,
    /// Shards (closed, without parents).
    pub shards: u32,
}

/// The pre-built head and tail of one page.
struct Framing {
    count: u64,
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// The served stream.
pub struct Stream {
    rows: Rows,
    shards: u32,
    /// Sum of every record's `SizeBytes`.
    size_bytes: u64,
    /// Pre-built framing by (shard, offset within the shard).
    framing: HashMap<(u32, u64), Framing>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DescribeRequest {
    stream_arn: String,
    limit: Option<u32>,
    exclusive_start_shard_id: Option<String>,
    shard_filter: Option<Json>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct IteratorRequest {
    stream_arn: String,
    shard_id: String,
    shard_iterator_type: String,
    sequence_number: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RecordsRequest {
    shard_iterator: String,
    limit: Option<u32>,
}

/// The iterator of `offset` within `shard`.
fn iterator(shard: u32, offset: u64) -> String {
    format!("{ITERATOR_PREFIX}{shard}/{offset}")
}

fn parse_iterator(text: &str) -> Option<(u32, u64)> {
    let (shard, offset) = text.strip_prefix(ITERATOR_PREFIX)?.split_once('/')?;
    Some((shard.parse().ok()?, offset.parse().ok()?))
}

fn json_answer(body: &Json) -> Answer<'static> {
    let body = body.to_string();
    let mut bytes = http_head("200 OK", body.len());
    bytes.extend_from_slice(body.as_bytes());
    Answer::Whole(bytes)
}

impl Stream {
    /// Builds and serializes every record.
    pub fn build(settings: StreamSettings) -> anyhow::Result<Self> {
        let count = usize::try_from(settings.records).context("too many records")?;
        let mut stream = Stream {
            rows: Rows::with_capacity(count, 1800),
            shards: settings.shards.max(1),
            size_bytes: 0,
            framing: HashMap::new(),
        };
        for index in 0..settings.records {
            let (record, size) = records::record_json(index);
            stream.rows.push(&record)?;
            stream.size_bytes += size;
        }
        for shard in 0..stream.shards {
            let (low, high) = stream.range(shard);
            let mut offset = 0;
            loop {
                let count = PAGE_RECORDS.min(high - low - offset);
                let (head, tail) = stream.framing(shard, offset, count);
                stream
                    .framing
                    .insert((shard, offset), Framing { count, head, tail });
                offset += count;
                if low + offset >= high {
                    break;
                }
            }
        }
        Ok(stream)
    }

    /// Records in the stream.
    pub fn len(&self) -> u64 {
        self.rows.len()
    }

    /// Shards of the stream.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Mean `SizeBytes` of a record.
    pub fn mean_record_bytes(&self) -> f64 {
        self.size_bytes as f64 / self.len().max(1) as f64
    }

    /// Mean size of a record's JSON on the wire.
    pub fn mean_wire_bytes(&self) -> f64 {
        self.rows.byte_len() as f64 / self.len().max(1) as f64
    }

    fn range(&self, shard: u32) -> (u64, u64) {
        records::shard_range(shard, self.shards, self.rows.len())
    }

    /// The HTTP head + `{"Records":[`, and the rest of the body, of `count` records from
    /// `offset` of `shard`.
    fn framing(&self, shard: u32, offset: u64, count: u64) -> (Vec<u8>, Vec<u8>) {
        let (low, high) = self.range(shard);
        let mut tail = Vec::with_capacity(96);
        tail.push(b']');
        if low + offset + count < high {
            let next = iterator(shard, offset + count);
            let _ = write!(tail, ",\"NextShardIterator\":\"{next}\"");
        }
        tail.push(b'}');
        let records_len = self.rows.slice(low + offset, count).len();
        let mut head = http_head("200 OK", RECORDS_OPEN.len() + records_len + tail.len());
        head.extend_from_slice(RECORDS_OPEN);
        (head, tail)
    }

    /// Answers one Streams operation (`DescribeStream`, `GetShardIterator`, `GetRecords`).
    pub fn answer(&self, operation: &str, body: &[u8]) -> Answer<'_> {
        let answer = match operation {
            "DescribeStream" => parse(body).and_then(|r| self.describe(&r)),
            "GetShardIterator" => parse(body).and_then(|r| self.shard_iterator(&r)),
            "GetRecords" => parse(body).and_then(|r| self.records(&r)),
            other => Err(error(
                "com.amazonaws.dynamodb.v20120810#UnknownOperationException",
                &format!("the bench server does not answer DynamoDBStreams {other}"),
            )),
        };
        answer.unwrap_or_else(|error| error)
    }

    fn check_arn(&self, arn: &str) -> Result<(), Answer<'static>> {
        if arn == STREAM_ARN {
            Ok(())
        } else {
            Err(error(
                NOT_FOUND,
                &format!("no stream {arn:?}; the bench stream is {STREAM_ARN:?}"),
            ))
        }
    }

    fn shard_json(&self, shard: u32) -> Json {
        let (low, high) = self.range(shard);
        let mut range = json!({"StartingSequenceNumber": records::sequence_number(low)});
        // An empty shard still closes: its range ends before it starts.
        range["EndingSequenceNumber"] = json!(records::sequence_number(high.max(1) - 1));
        json!({"ShardId": records::shard_id(shard), "SequenceNumberRange": range})
    }

    fn describe(&self, request: &DescribeRequest) -> Result<Answer<'_>, Answer<'static>> {
        self.check_arn(&request.stream_arn)?;
        let limit = request.limit.unwrap_or(100).clamp(1, 100);
        let first = match &request.exclusive_start_shard_id {
            None => 0,
            Some(id) => records::shard_index(id)
                .filter(|k| *k < self.shards)
                .map(|k| k + 1)
                .ok_or_else(|| error(VALIDATION, &format!("no shard {id:?}")))?,
        };
        // No shard has children.
        let last = if request.shard_filter.is_some() {
            first
        } else {
            self.shards.min(first.saturating_add(limit))
        };
        let shards: Vec<Json> = (first..last).map(|k| self.shard_json(k)).collect();
        let mut description = json!({
            "StreamArn": STREAM_ARN,
            "StreamLabel": STREAM_LABEL,
            "StreamStatus": "DISABLED",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
            "CreationRequestDateTime": 1_717_200_000,
            "TableName": TABLE,
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "Shards": shards,
        });
        if request.shard_filter.is_none() && last < self.shards {
            description["LastEvaluatedShardId"] = json!(records::shard_id(last - 1));
        }
        Ok(json_answer(&json!({"StreamDescription": description})))
    }

    fn shard_iterator(&self, request: &IteratorRequest) -> Result<Answer<'_>, Answer<'static>> {
        self.check_arn(&request.stream_arn)?;
        let shard = records::shard_index(&request.shard_id)
            .filter(|k| *k < self.shards)
            .ok_or_else(|| {
                error(
                    NOT_FOUND,
                    &format!("no shard {:?} in the bench stream", request.shard_id),
                )
            })?;
        let (low, high) = self.range(shard);
        let at_sequence = |after: u64| {
            let text = request.sequence_number.as_deref().unwrap_or_default();
            records::sequence_index(text)
                .filter(|i| (low..high).contains(i))
                .map(|i| i - low + after)
                .ok_or_else(|| {
                    error(
                        VALIDATION,
                        &format!("sequence number {text:?} is not in shard {shard}"),
                    )
                })
        };
        let offset = match request.shard_iterator_type.as_str() {
            "TRIM_HORIZON" => 0,
            "LATEST" => high - low,
            "AT_SEQUENCE_NUMBER" => at_sequence(0)?,
            "AFTER_SEQUENCE_NUMBER" => at_sequence(1)?,
            other => {
                return Err(error(
                    VALIDATION,
                    &format!("bad ShardIteratorType {other:?}"),
                ));
            }
        };
        Ok(json_answer(
            &json!({"ShardIterator": iterator(shard, offset)}),
        ))
    }

    fn records(&self, request: &RecordsRequest) -> Result<Answer<'_>, Answer<'static>> {
        let (shard, offset) = parse_iterator(&request.shard_iterator)
            .filter(|(shard, _)| *shard < self.shards)
            .ok_or_else(|| {
                error(
                    VALIDATION,
                    &format!("bad ShardIterator {:?}", request.shard_iterator),
                )
            })?;
        let (low, high) = self.range(shard);
        let available = (high - low).saturating_sub(offset);
        let limit = request.limit.map_or(PAGE_RECORDS, u64::from).max(1);
        let count = limit.min(PAGE_RECORDS).min(available);
        let first = low + offset.min(high - low);
        let records = self.rows.slice(first, count);
        if let Some(framing) = self.framing.get(&(shard, offset))
            && framing.count == count
        {
            return Ok(Answer::Page {
                head: Cow::Borrowed(&framing.head),
                items: records,
                tail: Cow::Borrowed(&framing.tail),
            });
        }
        let (head, tail) = self.framing(shard, offset.min(high - low), count);
        Ok(Answer::Page {
            head: Cow::Owned(head),
            items: records,
            tail: Cow::Owned(tail),
        })
    }
}

fn parse<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, Answer<'static>> {
    serde_json::from_slice(body).map_err(|e| error(SERIALIZATION, &e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests::body;

    fn stream(records: u64, shards: u32) -> Stream {
        Stream::build(StreamSettings { records, shards }).expect("builds")
    }

    fn call(stream: &Stream, operation: &str, request: Json) -> Json {
        body(stream.answer(operation, request.to_string().as_bytes()))
    }

    /// Every record of every shard, read like a client: describe, iterator, pages.
    fn read_all(stream: &Stream, limit: u32) -> Vec<String> {
        let described = call(stream, "DescribeStream", json!({"StreamArn": STREAM_ARN}));
        let description = &described["StreamDescription"];
        assert_eq!(description["StreamStatus"], "DISABLED");
        let mut seqs = Vec::new();
        for shard in description["Shards"].as_array().expect("shards") {
            assert!(shard["SequenceNumberRange"]["EndingSequenceNumber"].is_string());
            let answer = call(
                stream,
                "GetShardIterator",
                json!({"StreamArn": STREAM_ARN, "ShardId": shard["ShardId"],
                       "ShardIteratorType": "TRIM_HORIZON"}),
            );
            let mut iterator = answer["ShardIterator"].clone();
            while iterator.is_string() {
                let page = call(
                    stream,
                    "GetRecords",
                    json!({"ShardIterator": iterator, "Limit": limit}),
                );
                let records = page["Records"].as_array().expect("records");
                assert!(records.len() <= limit as usize);
                seqs.extend(records.iter().map(|r| {
                    r["dynamodb"]["SequenceNumber"]
                        .as_str()
                        .expect("seq")
                        .to_string()
                }));
                iterator = page.get("NextShardIterator").cloned().unwrap_or(Json::Null);
            }
        }
        seqs
    }

    #[test]
    fn shards_and_pages_cover_every_record_once() {
        let stream = stream(2503, 3);
        let expected: Vec<String> = (0..2503).map(records::sequence_number).collect();
        assert_eq!(read_all(&stream, 1000), expected, "pre-built pages");
        assert_eq!(read_all(&stream, 77), expected, "pages built on the fly");
    }

    #[test]
    fn iterators_start_where_asked() {
        let stream = stream(100, 2);
        let shard = records::shard_id(1);
        let iterator_at = |kind: &str, seq: Option<u64>| {
            let mut request =
                json!({"StreamArn": STREAM_ARN, "ShardId": shard, "ShardIteratorType": kind});
            if let Some(seq) = seq {
                request["SequenceNumber"] = json!(records::sequence_number(seq));
            }
            let answer = call(&stream, "GetShardIterator", request);
            let page = call(
                &stream,
                "GetRecords",
                json!({"ShardIterator": answer["ShardIterator"], "Limit": 1}),
            );
            (
                page["Records"][0]["dynamodb"]["SequenceNumber"].clone(),
                page.get("NextShardIterator").is_some(),
            )
        };
        assert_eq!(
            iterator_at("AFTER_SEQUENCE_NUMBER", Some(60)),
            (json!(records::sequence_number(61)), true)
        );
        assert_eq!(
            iterator_at("AT_SEQUENCE_NUMBER", Some(60)),
            (json!(records::sequence_number(60)), true)
        );
        assert_eq!(iterator_at("LATEST", None), (Json::Null, false));
        assert_eq!(
            iterator_at("AFTER_SEQUENCE_NUMBER", Some(99)),
            (Json::Null, false)
        );
    }

    #[test]
    fn describe_pages_and_filters() {
        let stream = stream(10, 3);
        let page = call(
            &stream,
            "DescribeStream",
            json!({"StreamArn": STREAM_ARN, "Limit": 2}),
        );
        let description = &page["StreamDescription"];
        assert_eq!(description["Shards"].as_array().map(Vec::len), Some(2));
        let last = description["LastEvaluatedShardId"].clone();
        assert_eq!(last, json!(records::shard_id(1)));
        let rest = call(
            &stream,
            "DescribeStream",
            json!({"StreamArn": STREAM_ARN, "ExclusiveStartShardId": last}),
        );
        assert_eq!(
            rest["StreamDescription"]["Shards"][0]["ShardId"],
            json!(records::shard_id(2))
        );
        assert!(
            rest["StreamDescription"]
                .get("LastEvaluatedShardId")
                .is_none()
        );
        let children = call(
            &stream,
            "DescribeStream",
            json!({"StreamArn": STREAM_ARN,
                   "ShardFilter": {"Type": "CHILD_SHARDS", "ShardId": records::shard_id(0)}}),
        );
        assert_eq!(children["StreamDescription"]["Shards"], json!([]));
    }

    #[test]
    fn bad_requests_are_errors() {
        let stream = stream(10, 2);
        let kind = |answer: Json| answer["__type"].as_str().unwrap_or_default().to_string();
        assert!(
            kind(call(
                &stream,
                "DescribeStream",
                json!({"StreamArn": "arn:other"})
            ))
            .ends_with("ResourceNotFoundException")
        );
        assert!(
            kind(call(
                &stream,
                "GetRecords",
                json!({"ShardIterator": "garbage"})
            ))
            .ends_with("ValidationException")
        );
        assert!(
            kind(call(&stream, "ListStreams", json!({}))).ends_with("UnknownOperationException")
        );
    }
}
