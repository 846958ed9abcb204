//! Records to row changes (module docs of `sink`, "From records to rows"): an item's key
//! attributes, an envelope's operation, key values in `value_format`, an upsert's typed
//! columns from its document (`crate::columns`), converted on several threads for large
//! batches.

use std::borrow::Cow;

use base64::Engine as _;
use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::envelope::EnvelopeFields;
use ddbpipe_source::records::Lines;
use ddbpipe_value::ValueFormat;
use serde_json::value::RawValue;

use super::KeyedSink;
use crate::sql::describe_key;
use crate::{ColumnValue, KeyColumn, KeyType, KeyValue, RowChange, Version};

impl KeyedSink {
    /// The row changes of a batch, in order.
    pub fn rows(&self, batch: &Batch, snapshot_open: bool) -> Result<Vec<RowChange>, String> {
        self.rows_during(batch, snapshot_open, None)
    }

    /// The row changes of a batch written while repair `repair` is open: its changes (change
    /// envelopes without a sequence number, read from an incremental export) carry the repair
    /// id in their version.
    pub fn rows_during(
        &self,
        batch: &Batch,
        snapshot_open: bool,
        repair: Option<i64>,
    ) -> Result<Vec<RowChange>, String> {
        let records = &batch.records;
        let row = |i: usize| -> Result<RowChange, String> {
            let line = records.get(i).unwrap_or_default();
            let text = std::str::from_utf8(line)
                .map_err(|_| format!("record {i} of the batch is not UTF-8"))?;
            match self.records {
                Records::Items => self.item_row(records, i, text),
                Records::Envelopes => {
                    self.envelope_row(records, i, text, snapshot_open, batch.read_ms, repair)
                }
            }
        };
        let parts = conversion_threads(records.len());
        if parts <= 1 {
            return (0..records.len()).map(row).collect();
        }
        // Turning records into rows is most of a sink's own CPU: a large batch is split among
        // threads while the database waits (the first error in record order is the one told).
        let per = records.len().div_ceil(parts);
        let converted: Vec<Result<Vec<RowChange>, String>> = std::thread::scope(|scope| {
            let row = &row;
            let mut handles = Vec::with_capacity(parts - 1);
            for part in 1..parts {
                let range = part * per..((part + 1) * per).min(records.len());
                handles.push(scope.spawn(move || range.map(row).collect()));
            }
            let mut converted = vec![(0..per).map(row).collect()];
            for handle in handles {
                converted.push(
                    handle
                        .join()
                        .unwrap_or_else(|_| Err("converting the batch's records panicked".into())),
                );
            }
            converted
        });
        let mut rows = Vec::with_capacity(records.len());
        for part in converted {
            rows.extend(part?);
        }
        Ok(rows)
    }

    /// An item's upsert. A record that cannot become a row is named by its start; a typed
    /// column's mismatch names the item's key, never a value (`crate::columns` rule 4).
    fn item_row(&self, records: &Lines, i: usize, text: &str) -> Result<RowChange, String> {
        let unreadable = |problem: String| format!("item {}: {problem}", short(text));
        // One pass finds the key attributes and the typed columns' roots (none where the page
        // noted them).
        let found = records
            .attributes(i, text, &self.item_attributes, String::as_str)
            .map_err(|e| unreadable(format!("not a JSON object: {e}")))?;
        let (key_found, roots_found) = found.split_at(self.table.key.len());
        let key = self.key_of(key_found).map_err(unreadable)?;
        let stores = |value: &ColumnValue| self.db.stores(value);
        let columns = self
            .columns
            .values_found(roots_found, stores, || describe_key(&self.table.key, &key))?;
        Ok(RowChange::Upsert {
            columns,
            key,
            document: text.to_string(),
            snapshot: false,
            version: Version::default(),
        })
    }

    /// The typed columns of an upsert of `key` whose document is `document` (`crate::columns`
    /// rules 1–4).
    fn column_values(&self, document: &str, key: &[KeyValue]) -> Result<Vec<ColumnValue>, String> {
        if self.columns.is_empty() {
            return Ok(Vec::new());
        }
        let stores = |value: &ColumnValue| self.db.stores(value);
        self.columns
            .values(document, stores, || describe_key(&self.table.key, key))
    }

    /// The values of the key attributes of the JSON object `text`, in key-column order (this
    /// runs for every record: nothing else of the object is kept).
    fn key_attributes<'a>(&self, text: &'a str) -> serde_json::Result<Vec<Option<&'a RawValue>>> {
        ddbpipe_value::key_attributes(text, &self.table.key, |column| column.name.as_str())
    }

    /// A snapshot envelope (`op: "r"`) is versioned at `read_ms`, its page's request time; a
    /// change at its record's `ts_ms` and sequence number (docs/mirror.md §5.6); a change of
    /// an open repair's export (no sequence number) at its exact `ts_ms`, with the repair id.
    fn envelope_row(
        &self,
        records: &Lines,
        i: usize,
        text: &str,
        snapshot_open: bool,
        read_ms: Option<i64>,
        repair: Option<i64>,
    ) -> Result<RowChange, String> {
        // Its fields where its page noted them, else read from it (record `i` of `records`).
        let envelope = EnvelopeFields::of(records, i, text)
            .map_err(|e| format!("record is not an envelope: {e}"))?;
        let record = || envelope.record();
        let key = || -> Result<Vec<KeyValue>, String> {
            let raw = envelope
                .key
                .filter(|raw| *raw != "null")
                .ok_or_else(|| format!("{} has no key", record()))?;
            let found = self
                .key_attributes(raw)
                .map_err(|e| format!("{}: its key is not an object: {e}", record()))?;
            self.key_of(&found)
                .map_err(|problem| format!("{}: {problem}", record()))
        };
        let version = if envelope.op == "r" {
            Version {
                at_ms: read_ms,
                sequence: None,
                repair: None,
            }
        } else {
            let sequence = envelope.sequence_number.as_deref().map(str::to_string);
            Version {
                at_ms: envelope.ts_ms,
                repair: repair.filter(|_| sequence.is_none()),
                sequence,
            }
        };
        match envelope.op.as_ref() {
            "c" | "u" | "r" => {
                let after = envelope.after.filter(|raw| *raw != "null").ok_or_else(|| {
                    format!(
                        "{} has no new image: the {} sink needs a stream view of NEW_IMAGE or NEW_AND_OLD_IMAGES",
                        record(),
                        self.kind()
                    )
                })?;
                let key = key()?;
                let columns = self
                    .column_values(after, &key)
                    .map_err(|problem| format!("{}: {problem}", record()))?;
                Ok(RowChange::Upsert {
                    key,
                    document: after.to_string(),
                    columns,
                    snapshot: snapshot_open && envelope.op == "r",
                    version,
                })
            }
            "d" => Ok(RowChange::Delete {
                key: key()?,
                version,
            }),
            other => Err(format!(
                "{} has op '{other}', which the {} sink cannot apply (only c, u, d and r)",
                record(),
                self.kind()
            )),
        }
    }

    fn kind(&self) -> &'static str {
        self.db.kind()
    }

    /// The key values of a record from its key attributes `found` (of
    /// [`Self::key_attributes`], in key-column order).
    fn key_of(&self, found: &[Option<&RawValue>]) -> Result<Vec<KeyValue>, String> {
        key_of(&self.table.key, found, self.format)
    }
}

/// The key values of a record from the raw values `found` of the key attributes `columns`
/// (in their order), read per `format`; the problem names the attribute (the keyed sinks'
/// rows and the lake's).
pub fn key_of(
    columns: &[KeyColumn],
    found: &[Option<&RawValue>],
    format: ValueFormat,
) -> Result<Vec<KeyValue>, String> {
    columns
        .iter()
        .zip(found)
        .map(|(column, raw)| {
            let raw = raw.ok_or_else(|| format!("key attribute '{}' is missing", column.name))?;
            key_value(raw, column.kind, format).map_err(|problem| {
                format!(
                    "key attribute '{}' ({}): {problem}",
                    column.name,
                    column.kind.tag()
                )
            })
        })
        .collect()
}

/// Records below which a batch is converted on one thread: a thread costs tens of µs.
const PARALLEL_RECORDS: usize = 512;

/// Threads that turn a batch of `records` records into rows: up to the machine's cores, at
/// most 4, each with at least [`PARALLEL_RECORDS`] / 2 records.
pub(super) fn conversion_threads(records: usize) -> usize {
    if records < PARALLEL_RECORDS {
        return 1;
    }
    // Asked once: the answer reads the process's CPU affinity and cgroup quota.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    cores.min(4).min(records / (PARALLEL_RECORDS / 2)).max(1)
}

/// One key attribute's value as rendered per `format` (also the lake sinks' key columns).
pub fn key_value(raw: &RawValue, kind: KeyType, format: ValueFormat) -> Result<KeyValue, String> {
    let text = raw.get();
    let payload: Cow<'_, str> = match format {
        ValueFormat::Typed => {
            let typed: std::collections::BTreeMap<Cow<'_, str>, Cow<'_, str>> =
                serde_json::from_str(text).map_err(|_| {
                    format!("expected {{\"{}\": …}}, found {}", kind.tag(), short(text))
                })?;
            match typed.into_iter().next() {
                Some((tag, value)) if tag == kind.tag() => value,
                _ => {
                    return Err(format!(
                        "expected {{\"{}\": …}}, found {}",
                        kind.tag(),
                        short(text)
                    ));
                }
            }
        }
        // A plain number is its JSON text, taken as it is (no string parse tried first).
        ValueFormat::Plain | ValueFormat::PlainExact
            if kind == KeyType::N
                && text.starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']) =>
        {
            Cow::Borrowed(text)
        }
        ValueFormat::Plain | ValueFormat::PlainExact => serde_json::from_str::<Cow<'_, str>>(text)
            .map_err(|_| format!("expected a {} value, found {}", kind.tag(), short(text)))?,
    };
    Ok(match kind {
        KeyType::S => KeyValue::S(payload.into_owned()),
        KeyType::N => KeyValue::N(payload.into_owned()),
        KeyType::B => KeyValue::B(
            base64::engine::general_purpose::STANDARD
                .decode(payload.as_bytes())
                .map_err(|e| format!("not base64: {e}"))?,
        ),
    })
}

/// The start of a record for messages.
pub fn short(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
