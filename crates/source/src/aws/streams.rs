//! [`StreamsApi`] over `aws-sdk-dynamodbstreams`.
//!
//! # Conversion
//! Responses become our types here, at the edge: shard ids become [`ShardId`], sequence numbers
//! are parsed into [`SequenceNumber`], images and keys become [`Item`]s, timestamps unix ms.
//! A response that cannot be converted (an attribute type this version does not know, a
//! sequence number that is not digits) is a fatal [`ApiError`] naming the record's `eventID`.
//!
//! # Error handling
//! Failed calls are classified by their AWS error code (docs/errors.md §9.1), as for tables. The code is
//! kept verbatim: the shard reader matches `ExpiredIteratorException`,
//! `TrimmedDataAccessException` and `ResourceNotFoundException` before the retry policy sees
//! them.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{
    AttributeValue, Identity, Record, ShardFilter, ShardFilterType, ShardIteratorType,
    StreamDescription, StreamRecord as SdkStreamRecord,
};

use super::api_error;
use super::convert::{UnknownType, item_from_streams};
use super::raw_body::{BodyBuffers, TakeBody};
use crate::api::{
    ChangeData, ChangePage, ChangeShape, RecordsPage, ShardDescription, StartAt, StreamPage,
    StreamRecord, StreamsApi, UserIdentity,
};
use crate::error::ApiError;
use crate::ids::{SequenceNumber, ShardId};
use crate::wire;

/// `Limit` of every `DescribeStream` page (docs/streams.md §4.3); also the service's maximum.
const DESCRIBE_STREAM_LIMIT: i32 = 100;

/// Reads a table's stream through the AWS SDK client.
#[derive(Debug, Clone)]
pub struct AwsStreamsApi {
    client: Client,
    /// Reused buffers for the bodies of data-plane answers.
    buffers: Arc<BodyBuffers>,
}

impl AwsStreamsApi {
    /// Wraps a client built by [`super::streams_api`].
    pub fn new(client: Client) -> Self {
        AwsStreamsApi {
            client,
            buffers: Arc::default(),
        }
    }
}

/// The `ShardIteratorType` and `SequenceNumber` of a `GetShardIterator` request.
fn iterator_start(start: &StartAt) -> (ShardIteratorType, Option<String>) {
    match start {
        StartAt::TrimHorizon => (ShardIteratorType::TrimHorizon, None),
        StartAt::Latest => (ShardIteratorType::Latest, None),
        StartAt::After(seq) => (
            ShardIteratorType::AfterSequenceNumber,
            Some(seq.as_str().to_string()),
        ),
    }
}

/// One `DescribeStream` answer as a page; no description is an empty page.
fn stream_page(description: Option<StreamDescription>) -> StreamPage {
    let Some(description) = description else {
        return StreamPage::default();
    };
    let shards = description
        .shards
        .unwrap_or_default()
        .into_iter()
        .filter_map(|shard| {
            // An id is what every later step keys on: entries without one are skipped.
            let id = shard.shard_id.filter(|id| !id.is_empty())?;
            Some(ShardDescription {
                id: ShardId::new(id),
                // Some emulators send `""` for "no parent".
                parent: shard
                    .parent_shard_id
                    .filter(|parent| !parent.is_empty())
                    .map(ShardId::new),
                closed: shard
                    .sequence_number_range
                    .is_some_and(|range| range.ending_sequence_number.is_some()),
            })
        })
        .collect();
    StreamPage {
        status: description.stream_status.map(|s| s.as_str().to_string()),
        view_type: description.stream_view_type.map(|v| v.as_str().to_string()),
        shards,
        last_evaluated_shard_id: description.last_evaluated_shard_id.map(ShardId::new),
    }
}

/// One `GetRecords` record as ours.
fn stream_record(record: Record) -> Result<StreamRecord, ApiError> {
    let event_id = record.event_id;
    let change = match record.dynamodb {
        Some(data) => Some(change_data(data, event_id.as_deref())?),
        None => None,
    };
    Ok(StreamRecord {
        event_name: record.event_name.map(|name| name.as_str().to_string()),
        change,
        user_identity: record.user_identity.map(user_identity),
        event_id,
    })
}

fn change_data(data: SdkStreamRecord, event_id: Option<&str>) -> Result<ChangeData, ApiError> {
    let event = event_id.unwrap_or("?");
    let image = |image: Option<HashMap<String, AttributeValue>>| {
        image
            .map(item_from_streams)
            .transpose()
            .map_err(|unknown| unsupported_type(unknown, event))
    };
    let sequence_number = data
        .sequence_number
        .map(|text| SequenceNumber::parse(&text))
        .transpose()
        .map_err(|error| ApiError::fatal(format!("stream record {event}: {error}")))?;
    Ok(ChangeData {
        // `to_millis` fails only past the year 292 million; such a time is no time at all.
        created_ms: data
            .approximate_creation_date_time
            .and_then(|time| time.to_millis().ok()),
        keys: image(data.keys)?,
        new_image: image(data.new_image)?,
        old_image: image(data.old_image)?,
        sequence_number,
        size_bytes: data.size_bytes,
        view_type: data.stream_view_type.map(|v| v.as_str().to_string()),
    })
}

fn unsupported_type(UnknownType(tag): UnknownType, event_id: &str) -> ApiError {
    ApiError::fatal(format!(
        "unsupported attribute value type {tag} in stream record {event_id}"
    ))
}

fn user_identity(identity: Identity) -> UserIdentity {
    UserIdentity {
        principal_id: identity.principal_id,
        kind: identity.r#type,
    }
}

fn records_page(
    records: Option<Vec<Record>>,
    next_iterator: Option<String>,
) -> Result<RecordsPage, ApiError> {
    Ok(RecordsPage {
        records: records
            .unwrap_or_default()
            .into_iter()
            .map(stream_record)
            .collect::<Result<_, _>>()?,
        next_iterator,
    })
}

impl StreamsApi for AwsStreamsApi {
    async fn describe_stream(
        &self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
    ) -> Result<StreamPage, ApiError> {
        let filter = child_of.map(|parent| {
            ShardFilter::builder()
                .r#type(ShardFilterType::ChildShards)
                .shard_id(parent.as_str())
                .build()
        });
        let output = self
            .client
            .describe_stream()
            .stream_arn(stream_arn)
            .limit(DESCRIBE_STREAM_LIMIT)
            .set_exclusive_start_shard_id(exclusive_start.map(|id| id.as_str().to_string()))
            .set_shard_filter(filter)
            .send()
            .await
            .map_err(api_error)?;
        Ok(stream_page(output.stream_description))
    }

    async fn shard_iterator(
        &self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
    ) -> Result<Option<String>, ApiError> {
        let (kind, sequence_number) = iterator_start(start);
        let output = self
            .client
            .get_shard_iterator()
            .stream_arn(stream_arn)
            .shard_id(shard.as_str())
            .shard_iterator_type(kind)
            .set_sequence_number(sequence_number)
            .send()
            .await
            .map_err(api_error)?;
        Ok(output.shard_iterator)
    }

    async fn get_records(&self, iterator: &str, limit: u32) -> Result<RecordsPage, ApiError> {
        let output = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(api_error)?;
        records_page(output.records, output.next_shard_iterator)
    }

    /// The SDK sends the request and reads errors; a successful body is decoded here, straight
    /// into envelopes (`wire`).
    async fn get_changes(
        &self,
        iterator: &str,
        limit: u32,
        shape: &ChangeShape<'_>,
    ) -> Result<ChangePage, ApiError> {
        let body = TakeBody::default();
        self.client
            .get_records()
            .shard_iterator(iterator)
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .customize()
            .interceptor(body.clone())
            .send()
            .await
            .map_err(api_error)?;
        wire::change_page(&body.collect(&self.buffers).await?, shape)
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodbstreams::error::ErrorMetadata;
    use aws_sdk_dynamodbstreams::error::SdkError;
    use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError;
    use aws_sdk_dynamodbstreams::primitives::{Blob, DateTime};
    use aws_sdk_dynamodbstreams::types::error::ExpiredIteratorException;
    use aws_sdk_dynamodbstreams::types::{
        OperationType, SequenceNumberRange, Shard, StreamStatus, StreamViewType,
    };
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;
    use ddbpipe_value::{Item, Number, Value};

    use super::*;
    use crate::error::ErrorClass;

    fn shard(id: Option<&str>, parent: Option<&str>, ending: Option<&str>) -> Shard {
        let range = SequenceNumberRange::builder()
            .starting_sequence_number("100")
            .set_ending_sequence_number(ending.map(str::to_string))
            .build();
        Shard::builder()
            .set_shard_id(id.map(str::to_string))
            .set_parent_shard_id(parent.map(str::to_string))
            .sequence_number_range(range)
            .build()
    }

    fn sdk_record(data: SdkStreamRecord) -> Record {
        Record::builder()
            .event_id("ev-1")
            .event_name(OperationType::Modify)
            .event_source("aws:dynamodb")
            .aws_region("eu-west-1")
            .dynamodb(data)
            .build()
    }

    #[test]
    fn a_described_stream_becomes_a_page_of_shards() {
        let description = StreamDescription::builder()
            .stream_status(StreamStatus::Enabled)
            .stream_view_type(StreamViewType::NewAndOldImages)
            .shards(shard(Some("s1"), None, Some("200")))
            .shards(shard(Some("s2"), Some("s1"), None))
            .shards(shard(None, Some("s1"), None))
            .shards(shard(Some(""), None, None))
            .shards(shard(Some("s3"), Some(""), None))
            .shards(Shard::builder().shard_id("s4").build())
            .last_evaluated_shard_id("s4")
            .build();
        let page = stream_page(Some(description));
        assert_eq!(page.status.as_deref(), Some("ENABLED"));
        assert_eq!(page.view_type.as_deref(), Some("NEW_AND_OLD_IMAGES"));
        assert_eq!(page.last_evaluated_shard_id, Some(ShardId::new("s4")));
        let expected = [
            ("s1", None, true),
            ("s2", Some("s1"), false),
            ("s3", None, false),
            ("s4", None, false),
        ]
        .map(|(id, parent, closed)| ShardDescription {
            id: ShardId::new(id),
            parent: parent.map(ShardId::new),
            closed,
        });
        assert_eq!(page.shards, expected);
    }

    #[test]
    fn a_stream_answer_without_a_description_is_an_empty_page() {
        assert_eq!(stream_page(None), StreamPage::default());
    }

    #[test]
    fn start_positions_become_iterator_types() {
        assert_eq!(
            iterator_start(&StartAt::TrimHorizon),
            (ShardIteratorType::TrimHorizon, None)
        );
        assert_eq!(
            iterator_start(&StartAt::Latest),
            (ShardIteratorType::Latest, None)
        );
        let seq = SequenceNumber::parse("4960000000000000000000001").unwrap();
        assert_eq!(
            iterator_start(&StartAt::After(seq)),
            (
                ShardIteratorType::AfterSequenceNumber,
                Some("4960000000000000000000001".to_string())
            )
        );
    }

    #[test]
    fn a_stream_record_keeps_every_field_the_envelope_needs() {
        let data = SdkStreamRecord::builder()
            .approximate_creation_date_time(DateTime::from_secs(1_700_000_000))
            .keys("pk", AttributeValue::S("a".to_string()))
            .old_image("pk", AttributeValue::S("a".to_string()))
            .old_image("n", AttributeValue::N("1.50".to_string()))
            .new_image("pk", AttributeValue::S("a".to_string()))
            .new_image("n", AttributeValue::N("2".to_string()))
            .sequence_number("4960000000000000000000001")
            .size_bytes(42)
            .stream_view_type(StreamViewType::NewAndOldImages)
            .build();
        let ttl = Identity::builder()
            .principal_id("dynamodb.amazonaws.com")
            .r#type("Service")
            .build();
        let mut record = sdk_record(data);
        record.user_identity = Some(ttl);
        let page = records_page(Some(vec![record]), Some("next".to_string())).unwrap();
        assert_eq!(page.next_iterator.as_deref(), Some("next"));
        let s = |text: &str| Value::S(text.to_string());
        let n = |text: &str| Value::N(Number::new(text));
        let expected = StreamRecord {
            event_id: Some("ev-1".to_string()),
            event_name: Some("MODIFY".to_string()),
            change: Some(ChangeData {
                created_ms: Some(1_700_000_000_000),
                keys: Some(Item::from([("pk".to_string(), s("a"))])),
                new_image: Some(Item::from([
                    ("n".to_string(), n("2")),
                    ("pk".to_string(), s("a")),
                ])),
                old_image: Some(Item::from([
                    ("n".to_string(), n("1.50")),
                    ("pk".to_string(), s("a")),
                ])),
                sequence_number: Some(SequenceNumber::parse("4960000000000000000000001").unwrap()),
                size_bytes: Some(42),
                view_type: Some("NEW_AND_OLD_IMAGES".to_string()),
            }),
            user_identity: Some(UserIdentity {
                principal_id: Some("dynamodb.amazonaws.com".to_string()),
                kind: Some("Service".to_string()),
            }),
        };
        assert_eq!(page.records, [expected]);
    }

    #[test]
    fn creation_times_keep_their_milliseconds() {
        let data = SdkStreamRecord::builder()
            .approximate_creation_date_time(DateTime::from_millis(1_700_000_000_123))
            .sequence_number("1")
            .build();
        let record = stream_record(sdk_record(data)).unwrap();
        assert_eq!(record.change.unwrap().created_ms, Some(1_700_000_000_123));
    }

    #[test]
    fn a_record_with_nothing_but_its_sequence_number_has_empty_fields() {
        let data = SdkStreamRecord::builder().sequence_number("7").build();
        let record = stream_record(Record::builder().dynamodb(data).build()).unwrap();
        assert_eq!(
            record,
            StreamRecord {
                event_id: None,
                event_name: None,
                change: Some(ChangeData {
                    created_ms: None,
                    keys: None,
                    new_image: None,
                    old_image: None,
                    sequence_number: Some(SequenceNumber::parse("7").unwrap()),
                    size_bytes: None,
                    view_type: None,
                }),
                user_identity: None,
            }
        );
    }

    #[test]
    fn a_record_without_its_stream_part_converts_without_change_data() {
        let record = Record::builder()
            .event_id("ev-9")
            .event_name(OperationType::Insert)
            .build();
        let record = stream_record(record).unwrap();
        assert_eq!(record.change, None);
        assert_eq!(record.event_name.as_deref(), Some("INSERT"));
    }

    #[test]
    fn an_event_name_this_sdk_does_not_know_is_kept_as_sent() {
        let record = Record::builder()
            .event_name(OperationType::from("FOO"))
            .build();
        let record = stream_record(record).unwrap();
        assert_eq!(record.event_name.as_deref(), Some("FOO"));
    }

    #[test]
    fn every_attribute_type_of_a_stream_image_converts() {
        let nested = HashMap::from([("inner".to_string(), AttributeValue::Null(true))]);
        let data = SdkStreamRecord::builder()
            .new_image("s", AttributeValue::S("x".to_string()))
            .new_image(
                "n",
                AttributeValue::N("12345678901234567890123".to_string()),
            )
            .new_image("b", AttributeValue::B(Blob::new(vec![1, 2])))
            .new_image("bool", AttributeValue::Bool(false))
            .new_image("null", AttributeValue::Null(true))
            .new_image("m", AttributeValue::M(nested))
            .new_image(
                "l",
                AttributeValue::L(vec![
                    AttributeValue::S("y".to_string()),
                    AttributeValue::N("1".to_string()),
                ]),
            )
            .new_image(
                "ss",
                AttributeValue::Ss(vec!["b".to_string(), "a".to_string()]),
            )
            .new_image(
                "ns",
                AttributeValue::Ns(vec!["1".to_string(), "1.5".to_string()]),
            )
            .new_image(
                "bs",
                AttributeValue::Bs(vec![Blob::new(vec![0xff]), Blob::new(vec![])]),
            )
            .sequence_number("1")
            .build();
        let record = stream_record(sdk_record(data)).unwrap();
        let image = record.change.unwrap().new_image.unwrap();
        let expected = Item::from([
            ("s".to_string(), Value::S("x".to_string())),
            (
                "n".to_string(),
                Value::N(Number::new("12345678901234567890123")),
            ),
            ("b".to_string(), Value::B(vec![1, 2])),
            ("bool".to_string(), Value::Bool(false)),
            ("null".to_string(), Value::Null),
            (
                "m".to_string(),
                Value::M(Item::from([("inner".to_string(), Value::Null)])),
            ),
            (
                "l".to_string(),
                Value::L(vec![Value::S("y".to_string()), Value::N(Number::new("1"))]),
            ),
            (
                "ss".to_string(),
                Value::Ss(vec!["b".to_string(), "a".to_string()]),
            ),
            (
                "ns".to_string(),
                Value::Ns(vec![Number::new("1"), Number::new("1.5")]),
            ),
            ("bs".to_string(), Value::Bs(vec![vec![0xff], vec![]])),
        ]);
        assert_eq!(image, expected);
    }

    #[test]
    fn a_sequence_number_that_is_not_digits_is_fatal_and_names_the_record() {
        let data = SdkStreamRecord::builder().sequence_number("49x").build();
        let error = stream_record(sdk_record(data)).unwrap_err();
        assert_eq!(error.class, ErrorClass::Fatal);
        assert_eq!(error.code, None);
        assert_eq!(
            error.message,
            "stream record ev-1: '49x' is not a sequence number (decimal digits)"
        );
        let data = SdkStreamRecord::builder().sequence_number("").build();
        let error = stream_record(Record::builder().dynamodb(data).build()).unwrap_err();
        assert!(error.message.starts_with("stream record ?: "), "{error}");
    }

    #[test]
    fn one_bad_record_fails_the_whole_page() {
        let good = sdk_record(SdkStreamRecord::builder().sequence_number("1").build());
        let bad = sdk_record(SdkStreamRecord::builder().sequence_number("x").build());
        let error = records_page(Some(vec![good, bad]), None).unwrap_err();
        assert_eq!(error.class, ErrorClass::Fatal);
    }

    #[test]
    fn an_answer_without_records_is_an_empty_page() {
        assert_eq!(records_page(None, None).unwrap(), RecordsPage::default());
    }

    // `AttributeValue::Unknown` cannot be built outside the SDK (`#[non_exhaustive]`), so the
    // message is checked from the conversion's error on.
    #[test]
    fn an_unknown_attribute_type_is_fatal_and_names_the_record() {
        let error = unsupported_type(UnknownType("Unknown".to_string()), "ev-7");
        assert_eq!(error.class, ErrorClass::Fatal);
        assert_eq!(
            error.message,
            "unsupported attribute value type Unknown in stream record ev-7"
        );
    }

    fn service_error(code: &str, message: &str) -> SdkError<GetRecordsError, Response> {
        let meta = ErrorMetadata::builder().code(code).message(message).build();
        let error = GetRecordsError::ExpiredIteratorException(
            ExpiredIteratorException::builder()
                .message(message)
                .meta(meta)
                .build(),
        );
        let response = Response::new(StatusCode::try_from(400).unwrap(), SdkBody::empty());
        SdkError::service_error(error, response)
    }

    #[test]
    fn a_service_error_keeps_its_code_for_the_shard_reader() {
        let error = api_error(service_error(
            "ExpiredIteratorException",
            "Iterator expired",
        ));
        assert_eq!(error.code.as_deref(), Some("ExpiredIteratorException"));
        assert_eq!(error.message, "Iterator expired");
        assert_eq!(error.class, ErrorClass::Fatal);
    }

    #[test]
    fn errors_are_classified_by_their_code() {
        let throttled = api_error(service_error("LimitExceededException", "slow down"));
        assert_eq!(throttled.class, ErrorClass::Throttle);
        let internal = api_error(service_error("InternalServerError", "oops"));
        assert_eq!(internal.class, ErrorClass::Transient);
        let timeout: SdkError<GetRecordsError, Response> =
            SdkError::timeout_error("attempt timed out");
        let timeout = api_error(timeout);
        assert_eq!(timeout.code, None);
        assert_eq!(timeout.class, ErrorClass::Transient);
        assert!(timeout.message.contains("attempt timed out"), "{timeout}");
    }

    /// Issue 24 item 10: S3's endpoint rules quote the endpoint in their error, user-info and
    /// all; every retry log line and the final error carry this message.
    #[test]
    fn an_endpoint_quoted_by_an_sdk_error_is_masked() {
        let unparsable: SdkError<GetRecordsError, Response> = SdkError::construction_failure(
            "Custom endpoint `http://u:s3cr3t@h:99999/?X-Amz-Signature=abc` was not a valid URI",
        );
        let error = api_error(unparsable);
        assert!(
            error.message.contains(
                "Custom endpoint `http://***@h:99999/?X-Amz-Signature=***` was not a valid URI"
            ),
            "{error}"
        );
        let answered = api_error(service_error(
            "InternalServerError",
            "see https://k:s3cr3t@example.com",
        ));
        assert_eq!(answered.message, "see https://***@example.com");
    }
}
