//! The bench table: `N` deterministic items of about 450 bytes (DynamoDB's item size), with
//! every attribute type a real table holds.
//!
//! Item `i` has the key `pk = "user#<i, 8 digits>"`, `sk = i`; the rest is drawn from a
//! generator seeded by `i`, so every run serves the same bytes. Each item has strings, whole
//! numbers, decimals, a 25-digit number (more digits than an `f64` holds), a boolean, a null,
//! a string set, a list, a map nested two deep and 48 bytes of binary.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value as Json, json};

/// The table name the bench scans.
pub const TABLE: &str = "bench";

/// The partition key attribute and the prefix of its values.
pub const KEY_PREFIX: &str = "user#";

/// The partition key value of item `index`.
pub fn partition_key(index: u64) -> String {
    format!("{KEY_PREFIX}{index:08}")
}

/// The item index of a partition key value written by [`partition_key`].
pub fn key_index(pk: &str) -> Option<u64> {
    pk.strip_prefix(KEY_PREFIX)?.parse().ok()
}

/// The `LastEvaluatedKey` / `ExclusiveStartKey` of item `index`, as attribute JSON.
pub fn key_json(index: u64) -> Json {
    json!({"pk": {"S": partition_key(index)}, "sk": {"N": index.to_string()}})
}

/// SplitMix64: small, fast, and the same everywhere.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        choices[self.below(choices.len() as u64) as usize]
    }

    fn letters(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| char::from(b'a' + self.below(26) as u8))
            .collect()
    }

    pub(crate) fn digits(&mut self, len: usize) -> String {
        let mut text = String::with_capacity(len);
        text.push(char::from(b'1' + self.below(9) as u8));
        for _ in 1..len {
            text.push(char::from(b'0' + self.below(10) as u8));
        }
        text
    }
}

const WORDS: &[&str] = &[
    "alpha", "bravo", "cargo", "delta", "engine", "falcon", "granite", "harbor", "island",
    "jasmine", "kernel", "lumen", "meadow", "nectar", "orbit", "prairie", "quartz", "river",
    "summit", "timber", "umbra", "valley", "willow", "xenon", "yonder", "zephyr", "the", "and",
    "of", "with",
];
const CITIES: &[&str] = &[
    "Lisbon", "Osaka", "Denver", "Nairobi", "Tallinn", "Recife", "Perth",
];
pub(crate) const STATUSES: &[&str] = &["active", "pending", "suspended", "closed"];
const TAGS: &[&str] = &[
    "red", "green", "blue", "sale", "new", "vip", "eu", "us", "beta",
];

/// Item `index` as DynamoDB attribute JSON (the `Items` element of a `Scan` response).
pub fn item_json(index: u64) -> Json {
    let mut rng = Rng::new(index);
    let name_len = 8 + rng.below(10) as usize;
    let name = rng.letters(name_len);
    let bio_words = 8 + rng.below(9) as usize;
    let bio: Vec<&str> = (0..bio_words).map(|_| rng.pick(WORDS)).collect();
    let mut tags: Vec<&str> = Vec::new();
    while tags.len() < 3 {
        let tag = rng.pick(TAGS);
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    let avatar: Vec<u8> = (0..48).map(|_| rng.next() as u8).collect();
    json!({
        "pk": {"S": partition_key(index)},
        "sk": {"N": index.to_string()},
        "name": {"S": name},
        "email": {"S": format!("{name}.{}@example.com", rng.below(1000))},
        "status": {"S": rng.pick(STATUSES)},
        "created_at": {"S": format!(
            "2024-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            1 + rng.below(12), 1 + rng.below(28), rng.below(24), rng.below(60), rng.below(60),
            rng.below(1000)
        )},
        "price": {"N": format!("{}.{:02}", rng.below(10_000), rng.below(100))},
        "quantity": {"N": rng.below(1000).to_string()},
        "balance": {"N": rng.digits(25)},
        "ratio": {"N": format!("-0.000{}", 1 + rng.below(999))},
        "active": {"BOOL": rng.below(2) == 0},
        "deleted_at": {"NULL": true},
        "tags": {"SS": tags},
        "scores": {"L": [
            {"N": rng.below(100).to_string()},
            {"N": format!("{}.{}", rng.below(100), rng.below(10))},
            {"N": rng.below(1_000_000).to_string()},
            {"S": rng.pick(WORDS)},
            {"BOOL": rng.below(2) == 1},
        ]},
        "address": {"M": {
            "street": {"S": format!("{} {} Street", 1 + rng.below(999), rng.pick(WORDS))},
            "city": {"S": rng.pick(CITIES)},
            "zip": {"S": format!("{:05}", rng.below(100_000))},
            "country": {"S": rng.pick(&["PT", "JP", "US", "KE", "EE", "BR", "AU"])},
            "geo": {"M": {
                "lat": {"N": format!("{}.{:06}", rng.below(90), rng.below(1_000_000))},
                "lon": {"N": format!("-{}.{:06}", rng.below(180), rng.below(1_000_000))},
            }},
        }},
        "avatar": {"B": STANDARD.encode(avatar)},
        "bio": {"S": bio.join(" ")},
    })
}

/// DynamoDB's largest item, the bound of [`padded_to`].
pub const MAX_ITEM_BYTES: u64 = 400 * 1024;

/// Item `index` ([`item_json`]) with a `padding` string of random letters that brings it to
/// about `bytes` (DynamoDB's size, [`item_size`]); at most [`MAX_ITEM_BYTES`]. An item already
/// that large is returned as it is. The letters are random so that the export case's gzip
/// cannot shrink them away.
pub fn padded_to(index: u64, bytes: u64) -> Json {
    let mut item = item_json(index);
    let size = item.as_object().map_or(0, item_size);
    let name = "padding";
    let wanted = bytes.min(MAX_ITEM_BYTES);
    if let Some(object) = item.as_object_mut()
        && wanted > size + name.len() as u64
    {
        let mut rng = Rng::new(index ^ 0x5EED_BA55);
        let letters = rng.letters((wanted - size - name.len() as u64) as usize);
        object.insert(name.to_string(), json!({"S": letters}));
    }
    item
}

/// The DynamoDB size of an item in attribute JSON: names plus values, the way DynamoDB bills
/// it (numbers about one byte per two digits, three bytes of overhead per map or list).
pub fn item_size(item: &Map<String, Json>) -> u64 {
    item.iter()
        .map(|(name, value)| name.len() as u64 + value_size(value))
        .sum()
}

fn value_size(value: &Json) -> u64 {
    let Some((tag, inner)) = value.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    let text = || inner.as_str().unwrap_or_default();
    let number = |n: &str| (n.trim_start_matches('-').len() as u64).div_ceil(2) + 1;
    let binary = |b: &str| (b.len() as u64) / 4 * 3;
    let elements = || inner.as_array().map(Vec::as_slice).unwrap_or_default();
    match tag.as_str() {
        "S" => text().len() as u64,
        "N" => number(text()),
        "B" => binary(text()),
        "BOOL" | "NULL" => 1,
        "SS" => elements()
            .iter()
            .map(|e| e.as_str().map_or(0, str::len) as u64)
            .sum(),
        "NS" => elements()
            .iter()
            .map(|e| number(e.as_str().unwrap_or_default()))
            .sum(),
        "BS" => elements()
            .iter()
            .map(|e| binary(e.as_str().unwrap_or_default()))
            .sum(),
        "L" => 3 + elements().iter().map(|e| 1 + value_size(e)).sum::<u64>(),
        "M" => {
            3 + inner
                .as_object()
                .map_or(0, |m| item_size(m) + m.len() as u64)
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_deterministic_and_keyed_by_index() {
        assert_eq!(item_json(7), item_json(7));
        assert_ne!(item_json(7), item_json(8));
        assert_eq!(item_json(42)["pk"]["S"], "user#00000042");
        assert_eq!(key_index("user#00000042"), Some(42));
        assert_eq!(key_index("order#1"), None);
    }

    #[test]
    fn padded_items_are_the_size_asked_for_up_to_dynamodbs_limit() {
        let size = |item: &Json| item_size(item.as_object().expect("object"));
        assert_eq!(size(&padded_to(5, 400_000)), 400_000);
        assert_eq!(size(&padded_to(5, 10_000_000)), MAX_ITEM_BYTES);
        assert_eq!(padded_to(5, 0), item_json(5));
        assert_eq!(padded_to(5, 400_000), padded_to(5, 400_000));
        assert_eq!(padded_to(5, 400_000)["pk"], item_json(5)["pk"]);
    }

    #[test]
    fn items_are_about_450_bytes_with_every_kind_of_value() {
        let sizes: Vec<u64> = (0..1000)
            .map(|i| item_size(item_json(i).as_object().expect("object")))
            .collect();
        let mean = sizes.iter().sum::<u64>() / sizes.len() as u64;
        assert!((400..=520).contains(&mean), "mean item size {mean}");
        let item = item_json(3);
        for tag in ["S", "N", "B", "BOOL", "NULL", "SS", "L", "M"] {
            let found = item
                .as_object()
                .expect("object")
                .values()
                .any(|v| v.get(tag).is_some());
            assert!(found, "no {tag} attribute");
        }
        assert_eq!(item["balance"]["N"].as_str().map(str::len), Some(25));
    }
}
