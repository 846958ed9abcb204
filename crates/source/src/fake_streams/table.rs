//! The table a fake stream belongs to: a [`TableApi`] whose `Scan` reads the items as the
//! stream's writes have left them at the moment of each request, so a snapshot scan and the
//! stream it runs beside see one and the same table (docs/mirror.md §5.6).
//!
//! Items are `{"pk": <key>, "v": <version>}`, the stream's new images. A segment holds the keys
//! whose hash is the segment number modulo `TotalSegments`; pages go in key order, `Limit`
//! items at most (default 100), and resume after `ExclusiveStartKey`. Each page consumes one
//! read unit. Its clock is the stream's wall clock (on tokio's time), shifted by the local offset
//! the test gives, so page times and record times drift as the test says and no further.

use std::sync::Arc;

use ddbpipe_value::Value;
use tokio::time::Instant;

use super::{FakeStreams, State, hash};
use crate::api::{Page, ReadKind, ReadRequest, TableApi, TableDescription, TableNames};
use crate::error::ApiError;

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
