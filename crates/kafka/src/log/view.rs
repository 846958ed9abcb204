//! The transaction markers applied to a partition's records, in log order: which records a
//! correct `read_committed` consumer receives (rules 4 to 8 of the [module docs](super)).
//!
//! A plain fold with no I/O: [`View::push`] takes each record of the log once, in offset
//! order, and [`View::finish`] says what is committed, what was aborted and what is still
//! undecided at the end of the read.

use std::collections::HashMap;

use kafka_protocol::records::Record;

use super::{Committed, LogRecord};

/// The control record type of an ABORT marker (the second `int16` of a control record's key).
const ABORT: i16 = 0;
/// The control record type of a COMMIT marker.
const COMMIT: i16 = 1;

/// The committed view of a partition while its records are read, in offset order.
#[derive(Debug, Default)]
pub(super) struct View {
    /// The records that joined the view (rules 4 and 6), in the order they joined.
    committed: Vec<LogRecord>,
    /// The records of each producer's open transaction (rule 5), by producer id.
    open: HashMap<i64, Vec<LogRecord>>,
    /// How many records ABORT markers dropped (rule 7).
    aborted: usize,
    /// The offset the read began at.
    start_offset: i64,
    /// The read began at the partition's first offset.
    from_start: bool,
    /// Records taken, control records included (what a read cost).
    taken: u64,
}

/// A control record whose key does not say which marker it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UnreadableMarker {
    /// The control record's offset.
    pub(super) offset: i64,
}

/// What a control record's key says (rules 6 and 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    /// The producer's transaction committed: its records join the view.
    Commit,
    /// The producer's transaction aborted: its records are dropped.
    Abort,
    /// A control record that ends no transaction (a type newer than COMMIT): ignored.
    Other,
}

impl View {
    /// The view of a read beginning at `start_offset`, the partition's first offset when
    /// `from_start`.
    pub(super) fn new(start_offset: i64, from_start: bool) -> View {
        View {
            start_offset,
            from_start,
            ..View::default()
        }
    }

    /// Takes the log's next record. Records must come in offset order, each once (the reader
    /// skips what a fetch returns twice).
    pub(super) fn push(&mut self, record: Record) -> Result<(), UnreadableMarker> {
        self.taken += 1;
        if record.control {
            let producer = record.producer_id;
            match marker(&record)? {
                Marker::Commit => {
                    if let Some(records) = self.open.remove(&producer) {
                        self.committed.extend(records);
                    }
                }
                Marker::Abort => {
                    if let Some(records) = self.open.remove(&producer) {
                        self.aborted += records.len();
                    }
                }
                Marker::Other => {}
            }
        } else if record.transactional {
            let producer = record.producer_id;
            self.open
                .entry(producer)
                .or_default()
                .push(log_record(record));
        } else {
            self.committed.push(log_record(record));
        }
        Ok(())
    }

    /// The records that joined the view since the last call, in offset order; the
    /// transactions still open stay held, so the view goes on with the next records of the
    /// log (a [`Follower`](super::Follower)'s reads).
    pub(super) fn take_committed(&mut self) -> Vec<LogRecord> {
        let mut records = std::mem::take(&mut self.committed);
        records.sort_by_key(|record| record.offset);
        records
    }

    /// Records taken so far, control records included.
    pub(super) fn taken(&self) -> u64 {
        self.taken
    }

    /// The view at the end of the read, `end_offset` being where the read stopped (rule 8:
    /// records of transactions still open are counted, not shown).
    pub(super) fn finish(self, end_offset: i64) -> Committed {
        let mut records = self.committed;
        // Rule 6: a committed transaction's records joined when its marker came, after records
        // that follow them in the log; their own offsets put them back in place.
        records.sort_by_key(|record| record.offset);
        Committed {
            records,
            undecided: self.open.values().map(Vec::len).sum(),
            aborted: self.aborted,
            start_offset: self.start_offset,
            from_start: self.from_start,
            end_offset,
        }
    }
}

/// Reads a control record's key: `int16` version, `int16` type (0 ABORT, 1 COMMIT).
fn marker(record: &Record) -> Result<Marker, UnreadableMarker> {
    let key = record.key.as_deref().unwrap_or_default();
    let &[_, _, high, low, ..] = key else {
        return Err(UnreadableMarker {
            offset: record.offset,
        });
    };
    Ok(match i16::from_be_bytes([high, low]) {
        ABORT => Marker::Abort,
        COMMIT => Marker::Commit,
        _ => Marker::Other,
    })
}

/// The public form of a data record.
fn log_record(record: Record) -> LogRecord {
    LogRecord {
        offset: record.offset,
        key: record.key,
        value: record.value,
        headers: record
            .headers
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
        timestamp_ms: record.timestamp,
    }
}
