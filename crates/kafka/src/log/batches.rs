//! The record batches of a fetch response: split into whole batches (rule 3 of the
//! [module docs](super)), then decoded, compressed ones included.
//!
//! A batch (message format v2) opens with a 61-byte header; the fields read here are
//! `baseOffset` (bytes 0..8), `batchLength` (8..12, the bytes after it), `magic` (16) and
//! `lastOffsetDelta` (23..27). The last offset is what the next fetch starts after, also when
//! compaction left the batch with fewer records, or none.

use bytes::Bytes;
use kafka_protocol::records::{Record, RecordBatchDecoder};

/// The bytes before `batchLength`'s count starts: `baseOffset` and `batchLength` themselves.
const LOG_OVERHEAD: usize = 12;
/// A v2 batch header's length: nothing shorter is a batch.
const HEADER_LEN: usize = 61;
/// Where the `magic` byte (the message format version) sits.
const MAGIC_AT: usize = 16;
/// Where `lastOffsetDelta` sits.
const LAST_OFFSET_DELTA_AT: usize = 23;

/// One whole record batch of a fetch response.
#[derive(Debug, Clone)]
pub(super) struct RawBatch {
    /// The offset of the batch's first record (`baseOffset`).
    pub(super) base_offset: i64,
    /// The offset of the batch's last record as written (`baseOffset + lastOffsetDelta`).
    pub(super) last_offset: i64,
    /// The batch, header included.
    bytes: Bytes,
}

/// Why a fetch response's records cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BatchError {
    /// The offset of the batch that does not read.
    pub(super) offset: i64,
    /// What is wrong with it.
    pub(super) what: String,
}

impl BatchError {
    /// The error of reading `topic`'s `partition`.
    pub(super) fn in_partition(self, topic: &str, partition: i32) -> super::LogError {
        super::LogError::Batch {
            topic: topic.to_string(),
            partition,
            offset: self.offset,
            what: self.what,
        }
    }
}

/// Splits a partition's `records` into whole batches, in log order. A batch cut short at the
/// end (a broker may fill a fetch up to its byte limit mid-batch) is left out: the next fetch
/// starts at it again.
pub(super) fn split(records: &Bytes) -> Result<Vec<RawBatch>, BatchError> {
    let mut batches = Vec::new();
    let mut at = 0;
    while records.len() - at >= HEADER_LEN {
        let header = &records[at..at + HEADER_LEN];
        let base_offset = i64::from_be_bytes(array(header, 0));
        let length = i32::from_be_bytes(array(header, 8));
        let magic = header[MAGIC_AT] as i8;
        if magic != 2 {
            return Err(BatchError {
                offset: base_offset,
                what: format!(
                    "message format v{magic} is not read here (only v2, written since Kafka \
                     0.11); the topic holds messages of an older client"
                ),
            });
        }
        let Some(total) = usize::try_from(length)
            .ok()
            .and_then(|length| length.checked_add(LOG_OVERHEAD))
            .filter(|total| *total >= HEADER_LEN)
        else {
            return Err(BatchError {
                offset: base_offset,
                what: format!("the batch says it is {length} bytes long"),
            });
        };
        if records.len() - at < total {
            break;
        }
        let last_offset_delta = i32::from_be_bytes(array(header, LAST_OFFSET_DELTA_AT));
        batches.push(RawBatch {
            base_offset,
            last_offset: base_offset + i64::from(last_offset_delta),
            bytes: records.slice(at..at + total),
        });
        at += total;
    }
    Ok(batches)
}

/// The records of one batch (decompressed, checksum checked), in offset order.
pub(super) fn decode(batch: &RawBatch) -> Result<Vec<Record>, BatchError> {
    let mut bytes = batch.bytes.clone();
    RecordBatchDecoder::decode(&mut bytes)
        .map(|set| set.records)
        .map_err(|error| BatchError {
            offset: batch.base_offset,
            what: format!("{error:#}"),
        })
}

/// `N` bytes of `header` from `at` (the callers' header is `HEADER_LEN` long).
fn array<const N: usize>(header: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}
