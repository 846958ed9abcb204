//! The table a fake stream belongs to: a [`TableApi`] whose `Scan` reads the items as the
//! stream's writes have left them at the moment of each request, so a snapshot scan and the
//! stream it runs beside see one and the same table (docs/mirror.md §5.6).
//!
//! Items are `{"pk": <key>, "v": <version>}`, the stream's new images. A segment holds the keys
//! whose hash is the segment number modulo `TotalSegments`; pages go in key order, `Limit`
//! items at most (default 100), and resume after `ExclusiveStartKey`. Each page consumes one
//! read unit. Its clock is the stream's wall clock (on tokio's time), shifted by the local offset
//! the test gives, so page times and record times drift as the test says and no further.
//!
//! It is also the [`ExportSource`] of the in-memory export service: a full export holds the
//! items as they are when it starts, its `ExportTime` the stream's clock (DynamoDB's, without
//! the local offset); an incremental export of `[from_ms, to_ms)` holds, from the write
//! history, one change per key written in the window ([`FakeStreamTable::changes`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use ddbpipe_value::{Item, Value};
use tokio::time::Instant;

use super::{FakeStreams, State, TableWrite, hash};
use crate::api::{Page, ReadKind, ReadRequest, TableApi, TableDescription, TableNames};
use crate::error::ApiError;
use crate::fake_export::{ExportSource, FakeChange};

/// The table behind a [`FakeStreams`] (see the module docs).
#[derive(Debug, Clone)]
pub struct FakeStreamTable {
    stream: Arc<FakeStreams>,
    /// This machine's clock minus the stream's (ms).
    local_offset_ms: i64,
}

impl FakeStreamTable {
    /// The table whose writes `stream` records; this machine's clock is the stream's.
    pub fn of(stream: Arc<FakeStreams>) -> Self {
        FakeStreamTable {
            stream,
            local_offset_ms: 0,
        }
    }

    /// The same table on a machine whose clock is `offset_ms` ahead of the stream's (negative:
    /// behind): page times follow it, record times the stream's.
    pub fn with_local_offset_ms(mut self, offset_ms: i64) -> Self {
        self.local_offset_ms = offset_ms;
        self
    }

    /// Every item the table holds now, by key: its version.
    pub fn items(&self) -> std::collections::BTreeMap<String, u64> {
        let mut state = self.stream.lock();
        state.advance(Instant::now());
        state
            .versions
            .iter()
            .filter(|(_, (_, exists))| *exists)
            .map(|(key, (version, _))| (key.clone(), *version))
            .collect()
    }

    /// Every item the table held just before `at_ms` (the stream's clock, unix ms), by key:
    /// its version.
    pub fn items_before(&self, at_ms: i64) -> BTreeMap<String, u64> {
        let mut items = BTreeMap::new();
        for write in self.stream.history() {
            if write.micros >= at_ms.saturating_mul(1000) {
                break;
            }
            if write.removed {
                items.remove(&write.key);
            } else {
                items.insert(write.key, write.version);
            }
        }
        items
    }

    /// What an incremental export of `[from_ms, to_ms)` (the stream's clock, unix ms) holds:
    /// for each key written in the window, one change at the exact time of its last write
    /// there (`WriteTimestampMicros`), with the item before its first write there (`old`,
    /// absent if it did not exist) and after its last (`new`, absent if deleted). A key that
    /// did not exist at either end (created and deleted inside the window) has none. In key
    /// order.
    pub fn changes(&self, from_ms: i64, to_ms: i64) -> Vec<FakeChange> {
        let (from, to) = (from_ms.saturating_mul(1000), to_ms.saturating_mul(1000));
        let history = self.stream.history();
        // Per key: the item before the window (`None`: absent), and its last write in it.
        let mut before: BTreeMap<&str, Option<u64>> = BTreeMap::new();
        let mut last: BTreeMap<&str, &TableWrite> = BTreeMap::new();
        for write in history.iter().take_while(|write| write.micros < to) {
            if write.micros < from {
                before.insert(&write.key, (!write.removed).then_some(write.version));
            } else {
                last.insert(&write.key, write);
            }
        }
        last.into_iter()
            .filter_map(|(key, write)| {
                let old = before.get(key).copied().flatten();
                let new = (!write.removed).then_some(write.version);
                if old.is_none() && new.is_none() {
                    return None;
                }
                Some(FakeChange {
                    micros: write.micros,
                    keys: Item::from([("pk".to_string(), Value::S(key.to_string()))]),
                    new: new.map(|version| State::image(key, version)),
                    old: old.map(|version| State::image(key, version)),
                })
            })
            .collect()
    }
}

impl ExportSource for FakeStreamTable {
    fn items(&self) -> Vec<Item> {
        FakeStreamTable::items(self)
            .iter()
            .map(|(key, version)| State::image(key, *version))
            .collect()
    }

    /// The stream's clock: DynamoDB's, not this machine's.
    fn now_ms(&self) -> i64 {
        self.stream.wall_now_ms()
    }

    fn changes(&self, from_ms: i64, to_ms: i64) -> Vec<FakeChange> {
        FakeStreamTable::changes(self, from_ms, to_ms)
    }
}

impl TableApi for FakeStreamTable {
    async fn read_page(&self, request: &ReadRequest) -> Result<Page, ApiError> {
        let (segment, total) = match &request.kind {
            ReadKind::Scan {
                segment: Some((s, t)),
            } => (*s, *t),
            _ => (0, 1),
        };
        let after = request
            .exclusive_start_key
            .as_ref()
            .and_then(|key| match key.get("pk") {
                Some(Value::S(text)) => Some(text.clone()),
                _ => None,
            });
        let limit = request.limit.unwrap_or(100).max(1) as usize;
        let mut state = self.stream.lock();
        state.advance(Instant::now());
        let mut mine: Vec<(String, u64)> = state
            .versions
            .iter()
            .filter(|(_, (_, exists))| *exists)
            .filter(|(key, _)| hash(key) % total == segment)
            .filter(|(key, _)| {
                after
                    .as_ref()
                    .is_none_or(|after| key.as_str() > after.as_str())
            })
            .map(|(key, (version, _))| (key.clone(), *version))
            .take(limit + 1)
            .collect();
        let more = mine.len() > limit;
        mine.truncate(limit);
        let last_evaluated_key = more.then(|| {
            let (key, _) = mine.last().expect("a full page");
            ddbpipe_value::Item::from([("pk".to_string(), Value::S(key.clone()))])
        });
        Ok(Page {
            items: mine
                .iter()
                .map(|(key, version)| State::image(key, *version))
                .collect(),
            last_evaluated_key,
            consumed_capacity: Some(1.0),
        })
    }

    async fn describe_table(
        &self,
        _table_name: &str,
    ) -> Result<Option<TableDescription>, ApiError> {
        Ok(Some(crate::fake::pk_table(None)))
    }

    fn clock_ms(&self) -> i64 {
        self.stream.wall_now_ms() + self.local_offset_ms
    }

    async fn list_tables(&self, _exclusive_start: Option<&str>) -> Result<TableNames, ApiError> {
        Ok(TableNames {
            names: vec!["t".into()],
            last_evaluated: None,
        })
    }
}
