//! Batches: records plus the positions they reach, assembled from pages.
//!
//! # Positions (docs/scan.md §2.5)
//! A page's cursor rides on the batch holding the page's **last** record; a page with no
//! records attaches its cursor to the next batch handed over. So when a batch is
//! acknowledged, every record before each of its cursors has been written. A page of an
//! export file (`lines_from`) also gives each batch that ends inside it the file's exact
//! count there, so a resumed read re-sends no acknowledged item.

use ddbpipe_source::api::ChangeOp;
use ddbpipe_source::export::file_cursor;
pub use ddbpipe_source::plan::BatchLimits;
use ddbpipe_source::records::{Lines, SegmentCursor};
use ddbpipe_source::scan::PageOut;
use ddbpipe_source::streams::handover::{Handed, StreamMark};

/// Records and the positions they reach.
#[derive(Debug, Default)]
pub struct Batch {
    /// The records, in order.
    pub records: Lines,
    /// Segment cursors reached once this batch is acknowledged, in page order.
    pub segments: Vec<(u32, SegmentCursor)>,
    /// Stream position marks reached once this batch is acknowledged, in hand-over order.
    pub shards: Vec<StreamMark>,
    /// Change records by kind, indexed by [`ChangeOp::index`] (all zero for scan items).
    pub ops: [u64; 4],
    /// The earliest request time (unix ms) of the scan pages whose records are in the batch:
    /// the version of its snapshot rows (docs/mirror.md §5.6). `None` for stream records.
    pub read_ms: Option<i64>,
}

impl Batch {
    fn count_ops(&mut self, ops: &[ChangeOp]) {
        for op in ops {
            self.ops[op.index()] += 1;
        }
    }
}

impl Batch {
    /// Whether the batch has neither records nor positions.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.segments.is_empty() && self.shards.is_empty()
    }
}

/// The most a batch reserves before it is filled: the default `batch_max_bytes`, whatever the
/// limits.
const ROOM_AT_MOST: usize = ddbpipe_source::config::defaults::BATCH_MAX_BYTES;

/// Cuts pages into batches within [`BatchLimits`]: at most so many records and so many bytes
/// (docs/scan.md §2.5), a record larger than the byte bound alone in its batch.
#[derive(Debug)]
pub struct Batcher {
    limits: BatchLimits,
    current: Batch,
}

impl Batcher {
    /// A batcher of batches within `limits`.
    pub fn new(limits: BatchLimits) -> Self {
        Batcher {
            limits: BatchLimits {
                records: limits.records.max(1),
                bytes: limits.bytes.max(1),
                whole_pages: limits.whole_pages,
            },
            current: Batch::default(),
        }
    }

    /// Where the part of `records` from `from` (of `total`) that joins the current batch ends:
    /// as many as its room holds, in records and in bytes; at least one into an empty batch.
    fn cut(&self, records: &Lines, from: usize, total: usize) -> usize {
        let batch = &self.current.records;
        let to = total.min(from.saturating_add(self.limits.records - batch.len()));
        let fits = records.fit(from, to, self.limits.bytes.saturating_sub(batch.bytes()));
        if fits == from && batch.is_empty() {
            from + 1
        } else {
            fits
        }
    }

    /// Before the first records of a batch join it from `incoming`: room for a whole batch
    /// of records the size of `incoming`'s (at most the byte limit, and at most
    /// [`ROOM_AT_MOST`] bytes; without a limit, `incoming`'s own size), so that filling it does
    /// not copy it again at each doubling.
    /// Reserved, not touched: memory only holds what is written.
    fn make_room(&mut self, incoming: &Lines) {
        let batch = &mut self.current.records;
        if !batch.is_empty() || incoming.is_empty() {
            return;
        }
        // An unbounded batcher's batch is what its caller hands over at once (a page).
        let records = match self.limits.records {
            usize::MAX => incoming.len(),
            records => records,
        };
        let mean = incoming.bytes().div_ceil(incoming.len()).max(1);
        let bytes = mean
            .saturating_mul(records)
            .min(self.limits.bytes)
            .min(ROOM_AT_MOST);
        batch.reserve(bytes / mean, bytes);
    }

    /// Whether the current batch has reached a limit.
    fn full(&self) -> bool {
        let batch = &self.current.records;
        batch.len() >= self.limits.records || batch.bytes() >= self.limits.bytes
    }

    /// Adds a page; returns the batches it filled, in order.
    pub fn push(&mut self, page: PageOut) -> Vec<Batch> {
        if self.limits.whole_pages && page.lines_from.is_none() {
            return self.push_whole(page);
        }
        let mut full = Vec::new();
        let total = page.records.len();
        let mut from = 0;
        while from < total {
            let to = self.cut(&page.records, from, total);
            if to > from {
                self.make_room(&page.records);
                self.current.records.extend_from(&page.records, from, to);
                self.current.read_ms = Some(
                    self.current
                        .read_ms
                        .map_or(page.requested_ms, |at| at.min(page.requested_ms)),
                );
                if to == total {
                    self.current
                        .segments
                        .push((page.segment, page.cursor.clone()));
                } else if let Some(before) = page.lines_from {
                    let reached = before + to as u64;
                    self.current
                        .segments
                        .push((page.segment, SegmentCursor::Next(file_cursor(reached))));
                }
            }
            from = to;
            if from < total || self.full() {
                full.push(std::mem::take(&mut self.current));
            }
        }
        if total == 0 {
            self.current.segments.push((page.segment, page.cursor));
        }
        full
    }

    /// Adds a scan page without splitting it ([`BatchLimits::whole_pages`]): after the current
    /// batch when both would cross a limit, else into it; the page's cursor rides on its last
    /// record as always.
    fn push_whole(&mut self, page: PageOut) -> Vec<Batch> {
        let mut full = Vec::new();
        let batch = &self.current.records;
        let room_records = batch.len().saturating_add(page.records.len()) > self.limits.records;
        let room_bytes = batch.bytes().saturating_add(page.records.bytes()) > self.limits.bytes;
        if !batch.is_empty() && (room_records || room_bytes) {
            full.push(std::mem::take(&mut self.current));
        }
        let total = page.records.len();
        if total > 0 {
            self.make_room(&page.records);
            self.current.records.extend_from(&page.records, 0, total);
            self.current.read_ms = Some(
                self.current
                    .read_ms
                    .map_or(page.requested_ms, |at| at.min(page.requested_ms)),
            );
        }
        self.current.segments.push((page.segment, page.cursor));
        if self.full() {
            full.push(std::mem::take(&mut self.current));
        }
        full
    }

    /// Adds records handed over by the stream reader; returns the batches they filled.
    ///
    /// Each part of the records that lands in a batch advances its shard to the part's last
    /// sequence number; the hand-over's other marks (finish, admissions) follow its last record.
    pub fn push_handed(&mut self, handed: Handed) -> Vec<Batch> {
        let mut full = Vec::new();
        let total = handed.records.len();
        let mut from = 0;
        while from < total {
            let to = self.cut(&handed.records, from, total);
            if to > from {
                self.make_room(&handed.records);
                self.current.records.extend_from(&handed.records, from, to);
                if let Some(ops) = handed.ops.get(from..to) {
                    self.current.count_ops(ops);
                }
                if let Some(shard) = &handed.shard {
                    self.current.shards.push(StreamMark::Advance(
                        shard.clone(),
                        handed.seqs[to - 1].clone(),
                    ));
                    if let Some(at) = handed.created_s {
                        self.current
                            .shards
                            .push(StreamMark::ReadAt(shard.clone(), at));
                    }
                }
                if to == total {
                    self.current.shards.extend(handed.marks.iter().cloned());
                }
            }
            from = to;
            if from < total || self.full() {
                full.push(std::mem::take(&mut self.current));
            }
        }
        if total == 0 {
            self.current.shards.extend(handed.marks);
        }
        full
    }

    /// Whether something waits to be handed over.
    pub fn has_pending(&self) -> bool {
        !self.current.is_empty()
    }

    /// Takes the batch being assembled (records and/or positions).
    pub fn take(&mut self) -> Option<Batch> {
        self.has_pending()
            .then(|| std::mem::take(&mut self.current))
    }
}

#[cfg(test)]
mod tests {
    use ddbpipe_value::{Item, Value};

    use super::*;

    fn page(segment: u32, n: usize, cursor: Option<&str>) -> PageOut {
        let mut records = Lines::default();
        for i in 0..n {
            records.push_with(|buf| buf.extend_from_slice(format!("{segment}-{i}").as_bytes()));
        }
        PageOut {
            segment,
            records,
            cursor: match cursor {
                Some(k) => SegmentCursor::Next(Item::from([("pk".into(), Value::S(k.into()))])),
                None => SegmentCursor::Done,
            },
            // Later pages were requested later.
            requested_ms: 1_000 * i64::from(segment),
            lines_from: None,
        }
    }

    #[test]
    fn a_batch_has_room_for_its_records_before_it_is_filled_within_its_bounds() {
        // 40 records of 4 or 5 bytes with their newlines (190 in all) join an empty batch of
        // 50: room for 50 such records, where extending it from empty gives exactly 190.
        let mut batcher = Batcher::new(BatchLimits::records(50));
        assert!(batcher.push(page(0, 40, Some("a"))).is_empty());
        assert!(batcher.current.records.capacity_bytes() >= 50 * 4);
        // The byte limit bounds the room; without limits it is the page's own.
        let mut batcher = Batcher::new(BatchLimits {
            records: 1_000_000,
            bytes: 1024,
            whole_pages: false,
        });
        assert!(batcher.push(page(0, 40, Some("a"))).is_empty());
        assert!(batcher.current.records.capacity_bytes() < 2 * 1024);
        let mut batcher = Batcher::new(BatchLimits::UNBOUNDED);
        assert!(batcher.push(page(0, 40, Some("a"))).is_empty());
        let room = batcher.current.records.capacity_bytes();
        assert!((190..1024).contains(&room), "{room}");
    }

    #[test]
    fn a_cursor_rides_on_the_batch_holding_the_last_record_of_its_page() {
        let mut batcher = Batcher::new(BatchLimits::records(50));
        assert!(batcher.push(page(0, 40, Some("a"))).is_empty());
        let full = batcher.push(page(1, 40, Some("b")));
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].records.len(), 50);
        // Segment 0's page ended inside the first batch; segment 1's did not.
        assert_eq!(full[0].segments.len(), 1);
        assert_eq!(full[0].segments[0].0, 0);
        let rest = batcher.take().unwrap();
        assert_eq!(rest.records.len(), 30);
        assert_eq!(rest.segments[0].0, 1);
    }

    #[test]
    fn a_batch_is_as_old_as_the_earliest_page_with_records_in_it() {
        let mut batcher = Batcher::new(BatchLimits::records(50));
        assert!(batcher.push(page(1, 40, Some("a"))).is_empty());
        let full = batcher.push(page(2, 40, Some("b")));
        assert_eq!(full[0].read_ms, Some(1_000), "pages of segments 1 and 2");
        assert_eq!(batcher.take().unwrap().read_ms, Some(2_000));
        assert!(batcher.push(page(3, 0, None)).is_empty());
        assert_eq!(
            batcher.take().unwrap().read_ms,
            None,
            "no records, no version"
        );
    }

    #[test]
    fn an_empty_page_attaches_its_cursor_to_the_next_batch() {
        let mut batcher = Batcher::new(BatchLimits::records(10));
        assert!(batcher.push(page(2, 0, Some("x"))).is_empty());
        assert!(batcher.has_pending());
        let full = batcher.push(page(3, 10, None));
        assert_eq!(full.len(), 1);
        let cursors: Vec<u32> = full[0].segments.iter().map(|(s, _)| *s).collect();
        assert_eq!(cursors, vec![2, 3]);
        assert!(batcher.take().is_none());
    }

    #[test]
    fn an_export_page_split_across_batches_records_the_count_at_each_cut() {
        let mut batcher = Batcher::new(BatchLimits::records(3));
        let mut export = page(0, 7, None);
        export.cursor = SegmentCursor::Next(file_cursor(17));
        export.lines_from = Some(10);
        let full = batcher.push(export);
        let cuts: Vec<&SegmentCursor> = full
            .iter()
            .flat_map(|b| b.segments.iter().map(|(_, c)| c))
            .collect();
        assert_eq!(
            cuts,
            [
                &SegmentCursor::Next(file_cursor(13)),
                &SegmentCursor::Next(file_cursor(16))
            ]
        );
        let last = batcher.take().unwrap();
        assert_eq!(
            last.segments,
            vec![(0, SegmentCursor::Next(file_cursor(17)))]
        );
    }

    /// A page of `n` records of `size` bytes each, newline included.
    fn page_of(segment: u32, n: usize, size: usize, cursor: Option<&str>) -> PageOut {
        let mut page = page(segment, 0, cursor);
        for _ in 0..n {
            page.records
                .push_with(|buf| buf.resize(buf.len() + size - 1, b'x'));
        }
        page
    }

    #[test]
    fn a_batch_is_handed_over_at_its_byte_bound_whatever_its_record_count() {
        let limits = BatchLimits {
            records: 5000,
            bytes: 1000,
            whole_pages: false,
        };
        let mut batcher = Batcher::new(limits);
        // Ten records of 300 bytes: three fit in 1000 bytes.
        let full = batcher.push(page_of(0, 10, 300, Some("a")));
        let sizes: Vec<(usize, usize)> = full
            .iter()
            .map(|b| (b.records.len(), b.records.bytes()))
            .collect();
        assert_eq!(sizes, [(3, 900), (3, 900), (3, 900)]);
        assert!(full.iter().all(|b| b.segments.is_empty()));
        let rest = batcher.take().unwrap();
        assert_eq!(rest.records.len(), 1);
        assert_eq!(
            rest.segments.len(),
            1,
            "the cursor rides on the page's last record"
        );
        // A batch at 900 bytes takes no record that would cross the bound...
        assert!(batcher.push(page_of(1, 3, 300, Some("b"))).is_empty());
        let full = batcher.push(page_of(2, 1, 300, Some("c")));
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].records.bytes(), 900);
        assert_eq!(batcher.take().unwrap().records.bytes(), 300);
        // ...and a record larger than the bound is a batch of its own.
        let full = batcher.push(page_of(3, 3, 2500, None));
        let sizes: Vec<usize> = full.iter().map(|b| b.records.len()).collect();
        assert_eq!(sizes, [1, 1, 1]);
        assert_eq!(full[2].segments.len(), 1);
        assert!(batcher.take().is_none());
    }

    /// `whole_pages`: a page is never split, so every batch ends at a page's end with its
    /// cursor; a page that does not fit beside the current batch starts the next one.
    #[test]
    fn with_whole_pages_every_batch_ends_at_a_page_end() {
        let mut batcher = Batcher::new(BatchLimits {
            records: 4,
            bytes: 1 << 20,
            whole_pages: true,
        });
        let full = batcher.push(page_of(0, 10, 10, Some("a")));
        assert_eq!(full.len(), 1, "one page over the limit is one batch");
        assert_eq!(full[0].records.len(), 10);
        assert_eq!(full[0].segments.len(), 1);
        assert!(batcher.push(page_of(1, 2, 10, Some("b"))).is_empty());
        let full = batcher.push(page_of(2, 3, 10, Some("c")));
        let sizes: Vec<(usize, usize)> = full
            .iter()
            .map(|b| (b.records.len(), b.segments.len()))
            .collect();
        assert_eq!(
            sizes,
            [(2, 1)],
            "the page of 3 does not join the batch of 2"
        );
        let rest = batcher.take().unwrap();
        assert_eq!((rest.records.len(), rest.segments.len()), (3, 1));
        // An export page (exact line counts) is still cut at the limits.
        let mut export = page_of(0, 6, 10, None);
        export.cursor = SegmentCursor::Next(file_cursor(6));
        export.lines_from = Some(0);
        let full = batcher.push(export);
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].records.len(), 4);
    }

    #[test]
    fn an_export_page_cut_by_bytes_records_the_count_at_each_cut() {
        let mut batcher = Batcher::new(BatchLimits {
            records: 100,
            bytes: 250,
            whole_pages: false,
        });
        let mut export = page_of(0, 5, 100, None);
        export.cursor = SegmentCursor::Next(file_cursor(15));
        export.lines_from = Some(10);
        let full = batcher.push(export);
        let cuts: Vec<&SegmentCursor> = full
            .iter()
            .flat_map(|b| b.segments.iter().map(|(_, c)| c))
            .collect();
        assert_eq!(
            cuts,
            [
                &SegmentCursor::Next(file_cursor(12)),
                &SegmentCursor::Next(file_cursor(14))
            ]
        );
        assert_eq!(
            batcher.take().unwrap().segments,
            vec![(0, SegmentCursor::Next(file_cursor(15)))]
        );
    }

    #[test]
    fn stream_records_are_cut_by_bytes_and_each_part_advances_its_shard() {
        use ddbpipe_source::ids::{SequenceNumber, ShardId};
        let shard = ShardId::new("s1");
        let mut records = Lines::default();
        let mut seqs = Vec::new();
        for i in 0..4 {
            records.push_with(|buf| buf.resize(buf.len() + 99, b'x'));
            seqs.push(SequenceNumber::parse(&format!("{}", 20 + i)).unwrap());
        }
        let handed = Handed {
            records,
            ops: vec![ChangeOp::Modify; 4],
            seqs,
            shard: Some(shard.clone()),
            marks: Vec::new(),
            created_s: None,
        };
        let mut batcher = Batcher::new(BatchLimits {
            records: 1000,
            bytes: 200,
            whole_pages: false,
        });
        let full = batcher.push_handed(handed);
        assert_eq!(full.len(), 2, "4 records of 100 bytes, 200 a batch");
        assert_eq!(
            full[1].shards,
            [StreamMark::Advance(
                shard,
                SequenceNumber::parse("23").unwrap()
            )]
        );
        assert_eq!(full[1].ops[ChangeOp::Modify.index()], 2);
    }

    #[test]
    fn a_page_larger_than_a_batch_spans_several() {
        let mut batcher = Batcher::new(BatchLimits::records(3));
        let full = batcher.push(page(0, 7, None));
        assert_eq!(full.len(), 2);
        assert!(full.iter().all(|b| b.segments.is_empty()));
        let last = batcher.take().unwrap();
        assert_eq!(last.records.len(), 1);
        assert_eq!(last.segments.len(), 1);
    }

    #[test]
    fn each_part_of_a_hand_over_advances_its_shard_and_says_when_its_records_were_created() {
        use ddbpipe_source::ids::{SequenceNumber, ShardId};
        let shard = ShardId::new("s1");
        let mut records = Lines::default();
        let mut seqs = Vec::new();
        for i in 0..5 {
            records.push_with(|buf| buf.extend_from_slice(format!("r{i}").as_bytes()));
            seqs.push(SequenceNumber::parse(&format!("{}", 10 + i)).unwrap());
        }
        let handed = Handed {
            records,
            ops: vec![ChangeOp::Insert; 5],
            seqs,
            shard: Some(shard.clone()),
            marks: Vec::new(),
            created_s: Some(1_767_225_600),
        };
        let mut batcher = Batcher::new(BatchLimits::records(3));
        let full = batcher.push_handed(handed);
        let rest = batcher.take().unwrap();
        let marks = |batch: &Batch| batch.shards.clone();
        assert_eq!(
            marks(&full[0]),
            [
                StreamMark::Advance(shard.clone(), SequenceNumber::parse("12").unwrap()),
                StreamMark::ReadAt(shard.clone(), 1_767_225_600),
            ]
        );
        assert_eq!(
            marks(&rest),
            [
                StreamMark::Advance(shard.clone(), SequenceNumber::parse("14").unwrap()),
                StreamMark::ReadAt(shard, 1_767_225_600),
            ]
        );
    }
}
