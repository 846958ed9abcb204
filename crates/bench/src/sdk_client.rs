//! The baseline: what a program using the AWS SDK directly would do to export a table as JSON
//! lines.
//!
//! A default `aws_sdk_dynamodb::Client` (static keys, us-east-1, the bench endpoint; SDK
//! defaults otherwise), one tokio task per segment with at most `concurrency` running, paging
//! with `ExclusiveStartKey`. Every item is converted to a `serde_json::Value` by a plain
//! recursive function and written with `serde_json::to_writer` and a newline into
//! `std::io::sink()`.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::items::TABLE;
use crate::phase::PhaseSettings;

/// Everything built before the meter starts.
pub struct Prepared {
    client: Client,
    segments: u32,
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
        segments: settings.segments,
        concurrency: settings.concurrency,
    }
}

impl Prepared {
    /// Scans every segment; returns the items written.
    pub async fn scan(self) -> anyhow::Result<u64> {
        let slots = Arc::new(Semaphore::new(self.concurrency.max(1)));
        let mut tasks = JoinSet::new();
        for segment in 0..self.segments {
            let client = self.client.clone();
            let slots = Arc::clone(&slots);
            let total = self.segments;
            tasks.spawn(async move {
                let _slot = slots.acquire_owned().await?;
                scan_segment(&client, segment, total)
                    .await
                    .with_context(|| format!("segment {segment} of {total}"))
            });
        }
        let mut items = 0;
        while let Some(joined) = tasks.join_next().await {
            items += joined.context("a segment task failed")??;
        }
        Ok(items)
    }
}

async fn scan_segment(client: &Client, segment: u32, total: u32) -> anyhow::Result<u64> {
    let mut out = std::io::sink();
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    let mut items = 0;
    loop {
        let mut request = client
            .scan()
            .table_name(TABLE)
            .set_exclusive_start_key(start.take());
        if total > 1 {
            request = request.segment(segment as i32).total_segments(total as i32);
        }
        let page = request.send().await?;
        for item in page.items.unwrap_or_default() {
            let json = item_to_json(item)?;
            serde_json::to_writer(&mut out, &json)?;
            out.write_all(b"\n")?;
            items += 1;
        }
        match page.last_evaluated_key {
            Some(key) if !key.is_empty() => start = Some(key),
            _ => return Ok(items),
        }
    }
}

crate::attribute_json::attribute_json!(AttributeValue);

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::primitives::Blob;
    use serde_json::json;

    use super::*;

    #[test]
    fn every_attribute_type_converts() {
        let item = HashMap::from([
            ("s".to_string(), AttributeValue::S("x".into())),
            ("n".to_string(), AttributeValue::N("1.5".into())),
            (
                "b".to_string(),
                AttributeValue::B(Blob::new(b"hi".to_vec())),
            ),
            ("t".to_string(), AttributeValue::Bool(true)),
            ("z".to_string(), AttributeValue::Null(true)),
            ("ss".to_string(), AttributeValue::Ss(vec!["a".into()])),
            ("ns".to_string(), AttributeValue::Ns(vec!["2".into()])),
            (
                "bs".to_string(),
                AttributeValue::Bs(vec![Blob::new(b"hi".to_vec())]),
            ),
            (
                "m".to_string(),
                AttributeValue::M(HashMap::from([(
                    "l".to_string(),
                    AttributeValue::L(vec![AttributeValue::N("3".into())]),
                )])),
            ),
        ]);
        let json = item_to_json(item).expect("converts");
        assert_eq!(
            json,
            json!({"s": "x", "n": 1.5, "b": "aGk=", "t": true, "z": null, "ss": ["a"],
                   "ns": [2.0], "bs": ["aGk="], "m": {"l": [3.0]}})
        );
    }
}
