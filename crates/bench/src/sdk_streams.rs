//! The streams baseline: what a program using the AWS SDK directly would do to export a
//! stream's change records as JSON lines.
//!
//! A default `aws_sdk_dynamodbstreams::Client` (static keys, us-east-1, the bench endpoint;
//! SDK defaults otherwise). `DescribeStream` (paged) lists the shards; one tokio task per shard,
//! at most `concurrency` running, asks `GetShardIterator(TRIM_HORIZON)` and then `GetRecords`
//! (`Limit` 1000) until no `NextShardIterator` comes back. Every record becomes a
//! `serde_json::Value` envelope with the fields of ddbpipe's (op, key, before, after, sequence
//! number, shard, event id and name, time, size, view type, table, user identity), images and
//! keys converted by a plain recursive function, and is written with `serde_json::to_writer`
//! and a newline into `std::io::sink()`.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use anyhow::{Context as _, ensure};
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{AttributeValue, Record, ShardIteratorType};
use serde_json::{Value as Json, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::items::TABLE;
use crate::phase::PhaseSettings;
use crate::records::{PAGE_RECORDS, STREAM_ARN};

/// Everything built before the meter starts.
pub struct Prepared {
    client: Client,
    expected_shards: usize,
    concurrency: usize,
}

/// Builds the client (no network I/O).
pub async fn prepare(settings: &PhaseSettings) -> Prepared {
    let config = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(settings.endpoint.clone())
        .credentials_provider(Credentials::new(
            "AKIDBENCH",
            "bench-secret",
            None,
            None,
            "ddbpipe-bench",
        ))
        .load()
        .await;
    Prepared {
        client: Client::new(&config),
        expected_shards: settings.segments as usize,
        concurrency: settings.concurrency,
    }
}

impl Prepared {
    /// Reads every shard to its end; returns the change records written.
    pub async fn read(self) -> anyhow::Result<u64> {
        let mut shards = Vec::new();
        let mut start: Option<String> = None;
        loop {
            let page = self
                .client
                .describe_stream()
                .stream_arn(STREAM_ARN)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await?;
            let description = page
                .stream_description
                .context("DescribeStream answered no description")?;
            shards.extend(
                description
                    .shards
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|shard| shard.shard_id),
            );
            match description.last_evaluated_shard_id {
                Some(last) => start = Some(last),
                None => break,
            }
        }
        ensure!(
            shards.len() == self.expected_shards,
            "DescribeStream listed {} shards, not {}",
            shards.len(),
            self.expected_shards
        );
        let slots = Arc::new(Semaphore::new(self.concurrency.max(1)));
        let mut tasks = JoinSet::new();
        for shard in shards {
            let client = self.client.clone();
            let slots = Arc::clone(&slots);
            tasks.spawn(async move {
                let _slot = slots.acquire_owned().await?;
                read_shard(&client, &shard)
                    .await
                    .with_context(|| format!("shard {shard}"))
            });
        }
        let mut records = 0;
        while let Some(joined) = tasks.join_next().await {
            records += joined.context("a shard task failed")??;
        }
        Ok(records)
    }
}

async fn read_shard(client: &Client, shard: &str) -> anyhow::Result<u64> {
    let mut out = std::io::sink();
    let mut iterator = client
        .get_shard_iterator()
        .stream_arn(STREAM_ARN)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await?
        .shard_iterator;
    let mut records = 0;
    while let Some(current) = iterator.take() {
        let page = client
            .get_records()
            .shard_iterator(current)
            .limit(PAGE_RECORDS as i32)
            .send()
            .await?;
        for record in page.records.unwrap_or_default() {
            let json = envelope(record, shard)?;
            serde_json::to_writer(&mut out, &json)?;
            out.write_all(b"\n")?;
            records += 1;
        }
        iterator = page.next_shard_iterator;
    }
    Ok(records)
}

/// A change record as a JSON envelope.
pub fn envelope(record: Record, shard: &str) -> anyhow::Result<Json> {
    let data = record
        .dynamodb
        .context("a record without its stream record")?;
    let image = |image: Option<HashMap<String, AttributeValue>>| match image {
        Some(image) => item_to_json(image),
        None => Ok(Json::Null),
    };
    let key = image(data.keys)?;
    let event_name = record.event_name.map(|name| name.as_str().to_string());
    let op = match event_name.as_deref() {
        Some("INSERT") => "c",
        Some("MODIFY") => "u",
        Some("REMOVE") => "d",
        _ => "unknown",
    };
    let ts_ms = data
        .approximate_creation_date_time
        .and_then(|time| time.to_millis().ok());
    let user_identity = record
        .user_identity
        .map(|identity| json!({"principal_id": identity.principal_id, "type": identity.r#type}));
    Ok(json!({
        "after": image(data.new_image)?,
        "before": image(data.old_image)?,
        "document_key": key.clone(),
        "event_id": record.event_id,
        "event_name": event_name,
        "key": key,
        "op": op,
        "sequence_number": data.sequence_number,
        "shard_id": shard,
        "size_bytes": data.size_bytes,
        "stream_view_type": data.stream_view_type.map(|v| v.as_str().to_string()),
        "table": TABLE,
        "ts_ms": ts_ms,
        "user_identity": user_identity,
    }))
}

crate::attribute_json::attribute_json!(AttributeValue);

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodbstreams::primitives::DateTime;
    use aws_sdk_dynamodbstreams::types::{OperationType, StreamRecord, StreamViewType};

    use super::*;

    #[test]
    fn a_record_becomes_an_envelope() {
        let keys = HashMap::from([("pk".to_string(), AttributeValue::S("a".into()))]);
        let mut new = keys.clone();
        new.insert("n".to_string(), AttributeValue::N("2".into()));
        let record = Record::builder()
            .event_id("ev")
            .event_name(OperationType::Modify)
            .dynamodb(
                StreamRecord::builder()
                    .set_keys(Some(keys))
                    .set_new_image(Some(new))
                    .sequence_number("100")
                    .size_bytes(12)
                    .stream_view_type(StreamViewType::NewAndOldImages)
                    .approximate_creation_date_time(DateTime::from_secs(1_700_000_000))
                    .build(),
            )
            .build();
        let json = envelope(record, "shard-1").expect("converts");
        assert_eq!(
            json,
            json!({"after": {"pk": "a", "n": 2.0}, "before": null, "document_key": {"pk": "a"},
                   "event_id": "ev", "event_name": "MODIFY", "key": {"pk": "a"}, "op": "u",
                   "sequence_number": "100", "shard_id": "shard-1", "size_bytes": 12,
                   "stream_view_type": "NEW_AND_OLD_IMAGES", "table": "bench",
                   "ts_ms": 1_700_000_000_000_i64, "user_identity": null})
        );
    }
}
