//! The bench stream: `R` deterministic change records of the bench table, as DynamoDB Streams
//! sends them with `NEW_AND_OLD_IMAGES`.
//!
//! Record `i` changes item `i` of the bench table (see [`crate::items`]): about a quarter are
//! `INSERT` (new image), three fifths `MODIFY` (new and old image, the old one differing in a
//! few attributes) and the rest `REMOVE` (old image; a third of them by TTL, with the
//! `dynamodb.amazonaws.com` service as their `userIdentity`). Every record carries its keys,
//! an event id, a creation time, its size and a sequence number; the draw is seeded by `i`, so
//! every run serves the same bytes.
//!
//! Sequence numbers are `SEQUENCE_PREFIX` followed by `i` in 12 digits: increasing within a
//! shard (which holds consecutive records) and readable back into `i`.

use serde_json::{Value as Json, json};

use crate::items::{self, Rng, STATUSES};

/// The ARN of the bench stream.
pub const STREAM_ARN: &str =
    "arn:aws:dynamodb:us-east-1:000000000000:table/bench/stream/2024-06-01T00:00:00.000";

/// The label of the bench stream (the end of its ARN).
pub const STREAM_LABEL: &str = "2024-06-01T00:00:00.000";

/// `GetRecords` answers hold at most this many records (the service's maximum `Limit`).
pub const PAGE_RECORDS: u64 = 1000;

/// The first digits of every sequence number.
const SEQUENCE_PREFIX: &str = "49650000000000";

/// Creation time of record 0, unix seconds; 50 changes a second follow.
const FIRST_CHANGE_S: u64 = 1_717_200_000;

/// Where the seed of a record's draw differs from its item's.
const RECORD_SEED: u64 = 0x5EED_0000_0000_0000;

/// The id of shard `k`.
pub fn shard_id(shard: u32) -> String {
    format!(
        "shardId-00000001717200000000-{:08x}",
        0x5eed_0000_u32 + shard
    )
}

/// The shard number of an id written by [`shard_id`].
pub fn shard_index(id: &str) -> Option<u32> {
    let hex = id.strip_prefix("shardId-00000001717200000000-")?;
    u32::from_str_radix(hex, 16).ok()?.checked_sub(0x5eed_0000)
}

/// The sequence number of record `index`.
pub fn sequence_number(index: u64) -> String {
    format!("{SEQUENCE_PREFIX}{index:012}")
}

/// The record index of a sequence number written by [`sequence_number`].
pub fn sequence_index(text: &str) -> Option<u64> {
    let digits = text.strip_prefix(SEQUENCE_PREFIX)?;
    if digits.len() != 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The records `[low, high)` of shard `k` of `shards` in a stream of `records`.
pub fn shard_range(shard: u32, shards: u32, records: u64) -> (u64, u64) {
    let n = u128::from(records);
    let bound = |s: u32| (n * u128::from(s) / u128::from(shards.max(1))) as u64;
    (bound(shard), bound(shard + 1))
}

/// The `eventName` of record `index`, from the first draw of its generator.
fn event_name(rng: &mut Rng) -> &'static str {
    match rng.below(100) {
        0..25 => "INSERT",
        25..85 => "MODIFY",
        _ => "REMOVE",
    }
}

/// The rows a keyed table holds after applying records `[0, records)` to an empty table:
/// record `i` changes item `i` alone, so every `INSERT` and `MODIFY` leaves its row and every
/// `REMOVE` deletes a row that was never there.
pub fn rows_after(records: u64) -> u64 {
    (0..records)
        .filter(|&index| event_name(&mut Rng::new(index ^ RECORD_SEED)) != "REMOVE")
        .count() as u64
}

/// Record `index` as DynamoDB Streams JSON (an element of `GetRecords`' `Records`), and its
/// `SizeBytes`.
pub fn record_json(index: u64) -> (Json, u64) {
    let mut rng = Rng::new(index ^ RECORD_SEED);
    let event_name = event_name(&mut rng);
    let keys = items::key_json(index);
    let current = items::item_json(index);
    let (new_image, old_image) = match event_name {
        "INSERT" => (Some(current), None),
        "MODIFY" => {
            let mut old = current.clone();
            old["status"] = json!({"S": rng.pick(STATUSES)});
            old["quantity"] = json!({"N": rng.below(1000).to_string()});
            old["price"] = json!({"N": format!("{}.{:02}", rng.below(10_000), rng.below(100))});
            old["balance"] = json!({"N": rng.digits(25)});
            old["active"] = json!({"BOOL": rng.below(2) == 0});
            (Some(current), Some(old))
        }
        _ => (None, Some(current)),
    };
    let size = |image: &Option<Json>| {
        image
            .as_ref()
            .and_then(Json::as_object)
            .map_or(0, items::item_size)
    };
    let size_bytes =
        keys.as_object().map_or(0, items::item_size) + size(&new_image) + size(&old_image);
    let mut change = json!({
        "ApproximateCreationDateTime": FIRST_CHANGE_S + index / 50,
        "Keys": keys,
        "SequenceNumber": sequence_number(index),
        "SizeBytes": size_bytes,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    });
    if let Some(image) = new_image {
        change["NewImage"] = image;
    }
    if let Some(image) = old_image {
        change["OldImage"] = image;
    }
    let event_id = format!("{:016x}{:016x}", rng.next(), rng.next());
    let mut record = json!({
        "awsRegion": "us-east-1",
        "dynamodb": change,
        "eventID": event_id,
        "eventName": event_name,
        "eventSource": "aws:dynamodb",
        "eventVersion": "1.1",
    });
    if event_name == "REMOVE" && rng.below(3) == 0 {
        record["userIdentity"] =
            json!({"PrincipalId": "dynamodb.amazonaws.com", "Type": "Service"});
    }
    (record, size_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_sequence_numbers_read_back() {
        assert_eq!(shard_index(&shard_id(3)), Some(3));
        assert_eq!(shard_index("shardId-other"), None);
        assert_eq!(sequence_index(&sequence_number(123_456)), Some(123_456));
        assert_eq!(sequence_index("4965000000000012"), None);
        assert!(
            sequence_number(9) < sequence_number(10),
            "same width, ordered"
        );
    }

    #[test]
    fn shards_split_the_records_without_overlap() {
        let ranges: Vec<(u64, u64)> = (0..3).map(|k| shard_range(k, 3, 10)).collect();
        assert_eq!(ranges, [(0, 3), (3, 6), (6, 10)]);
    }

    #[test]
    fn records_mix_operations_and_carry_their_images() {
        let mut counts = std::collections::HashMap::new();
        for index in 0..1000 {
            let (record, size) = record_json(index);
            let name = record["eventName"].as_str().expect("name").to_string();
            let change = &record["dynamodb"];
            assert_eq!(change["Keys"], items::key_json(index));
            assert_eq!(change["SizeBytes"], json!(size));
            match name.as_str() {
                "INSERT" => {
                    assert!(change.get("NewImage").is_some() && change.get("OldImage").is_none())
                }
                "MODIFY" => {
                    assert!(change.get("NewImage").is_some());
                    assert_ne!(change["NewImage"], change["OldImage"]);
                }
                "REMOVE" => {
                    assert!(change.get("NewImage").is_none() && change.get("OldImage").is_some())
                }
                other => panic!("unexpected {other}"),
            }
            *counts.entry(name).or_insert(0) += 1;
        }
        for (name, low, high) in [
            ("INSERT", 200, 300),
            ("MODIFY", 540, 660),
            ("REMOVE", 100, 200),
        ] {
            let n = counts.get(name).copied().unwrap_or(0);
            assert!((low..=high).contains(&n), "{name}: {n}");
        }
        assert_eq!(record_json(7), record_json(7));
        let removes = counts.get("REMOVE").copied().unwrap_or(0);
        assert_eq!(rows_after(1000), 1000 - removes as u64);
    }
}
