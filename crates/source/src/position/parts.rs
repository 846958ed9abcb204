//! A stored position in parts (docs/state.md §6.5): the segment cursors (a scan's, or an open
//! snapshot's) and the shard entries taken out of its JSON, so that a database keeps each in a
//! row of its own and a batch rewrites only the parts it moved. The position's field names are
//! known here, beside the forms that define them, and nowhere else.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

/// Fields of a streams position kept per shard, besides its progress in `shards`.
const PER_SHARD: [&str; 3] = ["verified_at", "latest_floor_ms", "read_at"];

/// What [`take_parts`] takes out of a stored position.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PositionParts {
    /// Per segment (its index as text), its cursor.
    pub segments: BTreeMap<String, Json>,
    /// Per shard (its id), its entry: `{"position", "verified_at"?, "latest_floor_ms"?,
    /// "read_at"?}`.
    pub shards: BTreeMap<String, Json>,
}

impl PositionParts {
    /// Whether nothing was taken.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.shards.is_empty()
    }
}

/// Takes the segment cursors and the shard entries out of a stored position's JSON, leaving
/// the rest in it.
pub fn take_parts(position: &mut Map<String, Json>) -> PositionParts {
    let mut parts = PositionParts::default();
    take_cursors(position, &mut parts.segments);
    if let Some(snapshot) = position.get_mut("snapshot").and_then(Json::as_object_mut) {
        take_cursors(snapshot, &mut parts.segments);
    }
    if let Some(Json::Object(shards)) = position.remove("shards") {
        for (id, at) in shards {
            let mut shard = Map::new();
            shard.insert("position".into(), at);
            for field in PER_SHARD {
                if let Some(value) = position
                    .get_mut(field)
                    .and_then(Json::as_object_mut)
                    .and_then(|map| map.remove(&id))
                {
                    shard.insert(field.into(), value);
                }
            }
            parts.shards.insert(id, Json::Object(shard));
        }
    }
    parts
}

fn take_cursors(holder: &mut Map<String, Json>, segments: &mut BTreeMap<String, Json>) {
    if let Some(Json::Object(cursors)) = holder.remove("cursors") {
        segments.extend(cursors);
    }
}

/// Puts parts back into a stored position's JSON: the inverse of [`take_parts`]. A part the
/// position cannot hold (a shard in a scan position, a segment cursor without a scan or an
/// open snapshot, a shard entry with an unknown field) is an error saying which.
pub fn put_parts(position: &mut Map<String, Json>, parts: PositionParts) -> Result<(), String> {
    let mut shards = Map::new();
    let mut per_shard: [Map<String, Json>; 3] = Default::default();
    for (id, value) in parts.shards {
        let Json::Object(shard) = value else {
            return Err(format!("the entry of shard '{id}' is not an object"));
        };
        for key in shard.keys() {
            if key != "position" && !PER_SHARD.contains(&key.as_str()) {
                return Err(format!(
                    "the entry of shard '{id}' has an unknown field '{key}'"
                ));
            }
        }
        let at = shard
            .get("position")
            .ok_or_else(|| format!("the entry of shard '{id}' has no position"))?;
        shards.insert(id.clone(), at.clone());
        for (field, map) in PER_SHARD.iter().zip(per_shard.iter_mut()) {
            if let Some(value) = shard.get(*field) {
                map.insert(id.clone(), value.clone());
            }
        }
    }
    let cursors: Map<String, Json> = parts.segments.into_iter().collect();
    let streams = !matches!(
        position.get("kind").and_then(Json::as_str),
        Some("scan" | "query" | "export")
    );
    if !streams {
        if !shards.is_empty() {
            return Err("shard parts in a scan position".into());
        }
        merge_into(position, "cursors", cursors);
        return Ok(());
    }
    merge_into(position, "shards", shards);
    let [verified, floors, read_at] = per_shard;
    merge_into(position, "verified_at", verified);
    merge_into(position, "latest_floor_ms", floors);
    if !read_at.is_empty() {
        merge_into(position, "read_at", read_at);
    }
    match position.get_mut("snapshot").and_then(Json::as_object_mut) {
        Some(snapshot) => merge_into(snapshot, "cursors", cursors),
        None if !cursors.is_empty() => return Err("segment parts without an open snapshot".into()),
        None => {}
    }
    Ok(())
}

/// Adds `extra` to the object at `holder[key]` (created when missing).
fn merge_into(holder: &mut Map<String, Json>, key: &str, extra: Map<String, Json>) {
    let slot = holder
        .entry(key.to_string())
        .or_insert_with(|| Json::Object(Map::new()));
    if let Json::Object(map) = slot {
        map.extend(extra);
    } else if !extra.is_empty() {
        *slot = Json::Object(extra);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(json: Json) -> Map<String, Json> {
        match json {
            Json::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn a_mirror_position_gives_its_snapshot_cursors_and_shard_entries_and_takes_them_back() {
        let stored = object(json!({"kind": "mirror", "stream_arn": "arn:s",
            "shards": {"s1": "00000000000000000012", "s2": ""},
            "verified_at": {"s2": 1767225600}, "latest_floor_ms": {}, "read_at": {"s1": 1767225601},
            "finished": [], "snapshot": {"id": 7, "cursors": {"0": {"pk": {"S": "k"}}}, "done": []}}));
        let mut position = stored.clone();
        let parts = take_parts(&mut position);
        assert_eq!(parts.segments["0"], json!({"pk": {"S": "k"}}));
        assert_eq!(
            parts.shards["s1"],
            json!({"position": "00000000000000000012", "read_at": 1767225601})
        );
        assert_eq!(
            parts.shards["s2"],
            json!({"position": "", "verified_at": 1767225600})
        );
        assert!(position.get("shards").is_none());
        put_parts(&mut position, parts).unwrap();
        assert_eq!(position, stored);
    }

    #[test]
    fn parts_a_position_cannot_hold_are_named() {
        let shard = |entry: Json| PositionParts {
            shards: BTreeMap::from([("s1".to_string(), entry)]),
            ..PositionParts::default()
        };
        let mut scan = object(json!({"kind": "scan", "done": [], "total_segments": 2}));
        let error = put_parts(&mut scan, shard(json!({"position": ""}))).unwrap_err();
        assert!(error.contains("shard parts in a scan position"), "{error}");
        let mut streams = object(json!({"kind": "streams", "snapshot": null}));
        let error =
            put_parts(&mut streams.clone(), shard(json!({"position": "", "x": 1}))).unwrap_err();
        assert!(
            error.contains("shard 's1'") && error.contains("'x'"),
            "{error}"
        );
        let cursor = PositionParts {
            segments: BTreeMap::from([("0".to_string(), json!({"pk": {"S": "k"}}))]),
            ..PositionParts::default()
        };
        let error = put_parts(&mut streams, cursor).unwrap_err();
        assert!(error.contains("without an open snapshot"), "{error}");
    }
}
