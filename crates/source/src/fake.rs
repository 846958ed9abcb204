//! An in-memory [`TableApi`] with scripted faults, for deterministic tests of the engine.
//!
//! Items are split into segments by their position (item `i` belongs to segment
//! `i % total`), paged by `Limit` (default 100), and each page reports a fixed consumed
//! capacity. Faults are scripted as a queue of errors returned by the next calls.

use std::collections::VecDeque;
use std::sync::Mutex;

use ddbpipe_value::{Item, Number, Value};

use crate::api::{
    KeyAttribute, KeyType, Page, ReadKind, ReadRequest, TableApi, TableDescription, TableNames,
};
use crate::error::ApiError;

/// An in-memory table.
#[derive(Debug, Default)]
pub struct FakeTable {
    items: Vec<Item>,
    units_per_page: Option<f64>,
    faults: Mutex<VecDeque<ApiError>>,
    panic_segment: Option<u32>,
    requests: Mutex<Vec<ReadRequest>>,
    description: Option<TableDescription>,
    /// Each page's answer waits this long (`slow`).
    delay: Option<std::time::Duration>,
    /// Pages being answered now, and the most ever at once.
    answering: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

/// The description of the fake tables: table `t`, hash key `pk` (S), provisioned with 100 read
/// units.
pub(crate) fn pk_table(item_count: Option<i64>) -> TableDescription {
    TableDescription {
        name: "t".into(),
        arn: None,
        status: Some("ACTIVE".into()),
        item_count,
        size_bytes: None,
        billing_mode: Some("PROVISIONED".into()),
        key_schema: vec![KeyAttribute {
            name: "pk".into(),
            key_type: KeyType::S,
        }],
        read_capacity_units: Some(100),
        max_read_request_units: None,
        indexes: vec![],
        stream: None,
    }
}

impl FakeTable {
    /// A table of `n` items `{"pk": "k<i>", "n": i}` with a hash key `pk`.
    pub fn numbered(n: usize) -> Self {
        let items = (0..n)
            .map(|i| {
                Item::from([
                    ("pk".to_string(), Value::S(format!("k{i:06}"))),
                    ("n".to_string(), Value::N(Number::new(i.to_string()))),
                ])
            })
            .collect();
        FakeTable {
            items,
            units_per_page: Some(1.0),
            description: Some(pk_table(Some(n as i64))),
            ..FakeTable::default()
        }
    }

    /// Every page reports this consumed capacity (`None`: not reported).
    pub fn units_per_page(mut self, units: Option<f64>) -> Self {
        self.units_per_page = units;
        self
    }

    /// Each page is answered after `delay`: requests overlap, and [`FakeTable::peak`] tells
    /// how many did at most.
    pub fn slow(mut self, delay: std::time::Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The most pages answered at once.
    pub fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The next calls fail with these errors, in order.
    pub fn fail_next(self, errors: impl IntoIterator<Item = ApiError>) -> Self {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(errors);
        self
    }

    /// Reading this segment panics (a bug in the engine must fail the run).
    pub fn panic_on_segment(mut self, segment: u32) -> Self {
        self.panic_segment = Some(segment);
        self
    }

    /// Every page request received, in order.
    pub fn requests(&self) -> Vec<ReadRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn key_of(item: &Item) -> Item {
        item.iter()
            .filter(|(name, _)| name.as_str() == "pk")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl TableApi for FakeTable {
    async fn read_page(&self, request: &ReadRequest) -> Result<Page, ApiError> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request.clone());
        if let Some(error) = self
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
        {
            return Err(error);
        }
        let (segment, total) = match &request.kind {
            ReadKind::Scan {
                segment: Some((s, t)),
            } => (*s, *t),
            _ => (0, 1),
        };
        if self.panic_segment == Some(segment) {
            panic!("scripted panic in segment {segment}");
        }
        if let Some(delay) = self.delay {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.answering.fetch_add(1, SeqCst) + 1;
            self.peak.fetch_max(now, SeqCst);
            tokio::time::sleep(delay).await;
            self.answering.fetch_sub(1, SeqCst);
        }
        let mine = self
            .items
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i as u32) % total == segment)
            .map(|(_, item)| item);
        let start_after = request.exclusive_start_key.as_ref();
        let mut mine: Vec<&Item> = match start_after {
            None => mine.collect(),
            Some(key) => mine
                .skip_while(|item| Self::key_of(item) != *key)
                .skip(1)
                .collect(),
        };
        let limit = request.limit.unwrap_or(100) as usize;
        let more = mine.len() > limit;
        mine.truncate(limit);
        let last_evaluated_key = if more {
            mine.last().map(|item| Self::key_of(item))
        } else {
            None
        };
        Ok(Page {
            items: mine.into_iter().cloned().collect(),
            last_evaluated_key,
            consumed_capacity: self.units_per_page,
        })
    }

    async fn describe_table(
        &self,
        _table_name: &str,
    ) -> Result<Option<TableDescription>, ApiError> {
        Ok(self.description.clone())
    }

    async fn list_tables(&self, _exclusive_start: Option<&str>) -> Result<TableNames, ApiError> {
        Ok(TableNames {
            names: vec!["t".into()],
            last_evaluated: None,
        })
    }
}
