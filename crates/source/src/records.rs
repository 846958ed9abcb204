//! Records rendered as JSON lines, and the positions a page of them reaches.

use ddbpipe_value::Item;

/// JSON records, each one compact line, stored back to back in one buffer.
///
/// One allocation per page instead of one per record; the sink writes the buffer as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lines {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Lines {
    /// Empty, with room for about `records` records of `bytes` bytes in all.
    pub fn with_capacity(records: usize, bytes: usize) -> Self {
        Lines {
            buf: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(records),
        }
    }

    /// Appends one record: `write` appends its JSON (without newline) to the buffer.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.buf);
        self.buf.push(b'\n');
        self.ends.push(self.buf.len());
    }

    /// Appends one record if `write` writes one: on `Ok(true)` what it appended becomes a
    /// record; on `Ok(false)` or an error it is dropped.
    pub fn try_push_with<E>(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let start = self.buf.len();
        let written = write(&mut self.buf);
        if matches!(written, Ok(true)) {
            self.buf.push(b'\n');
            self.ends.push(self.buf.len());
        } else {
            self.buf.truncate(start);
        }
        written
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The bytes of all records, each ending with `\n`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The bytes of records `from..to`, each ending with `\n`.
    pub fn range_bytes(&self, from: usize, to: usize) -> &[u8] {
        let start = if from == 0 { 0 } else { self.ends[from - 1] };
        let end = if to == 0 { 0 } else { self.ends[to - 1] };
        &self.buf[start..end]
    }

    /// Bytes of all records, newlines included.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// The largest `end` in `from..=to` whose records `from..end` hold at most `room` bytes.
    pub fn fit(&self, from: usize, to: usize, room: usize) -> usize {
        let start = if from == 0 { 0 } else { self.ends[from - 1] };
        let limit = start.saturating_add(room);
        from + self.ends[from..to].partition_point(|&end| end <= limit)
    }

    /// Appends records `from..to` of `other`.
    pub fn extend_from(&mut self, other: &Lines, from: usize, to: usize) {
        let base = self.buf.len();
        let start = if from == 0 { 0 } else { other.ends[from - 1] };
        self.buf.extend_from_slice(other.range_bytes(from, to));
        self.ends
            .extend(other.ends[from..to].iter().map(|end| end - start + base));
    }

    /// Record `i` without its newline.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.buf[start..end - 1])
    }

    /// Iterates over the records, without their newlines.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

/// Where a segment stands after a page.
#[derive(Debug, Clone, PartialEq)]
pub enum SegmentCursor {
    /// More pages follow, starting after this key (`ExclusiveStartKey`).
    Next(Item),
    /// The segment has no more pages.
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_fit_in_a_room_of_bytes_whole_or_not_at_all() {
        let mut lines = Lines::default();
        for word in ["a", "bb", "ccc"] {
            lines.push_with(|buf| buf.extend_from_slice(word.as_bytes()));
        }
        // "a\n" 2, "bb\n" 3, "ccc\n" 4 bytes.
        assert_eq!(lines.bytes(), 9);
        assert_eq!(lines.fit(0, 3, 1), 0);
        assert_eq!(lines.fit(0, 3, 2), 1);
        assert_eq!(lines.fit(0, 3, 4), 1);
        assert_eq!(lines.fit(0, 3, 5), 2);
        assert_eq!(lines.fit(1, 3, 7), 3);
        assert_eq!(lines.fit(1, 2, 100), 2, "never past `to`");
        assert_eq!(lines.fit(2, 3, usize::MAX), 3);
    }

    #[test]
    fn ranges_of_records_keep_their_boundaries() {
        let mut lines = Lines::default();
        for word in ["a", "bb", "ccc"] {
            lines.push_with(|buf| buf.extend_from_slice(word.as_bytes()));
        }
        assert_eq!(lines.len(), 3);
        assert_eq!(lines.range_bytes(1, 3), b"bb\nccc\n");
        let mut other = Lines::default();
        other.push_with(|buf| buf.push(b'x'));
        other.extend_from(&lines, 1, 3);
        assert_eq!(other.as_bytes(), b"x\nbb\nccc\n");
        assert_eq!(other.get(2), Some(&b"ccc"[..]));
        assert_eq!(other.iter().count(), 3);
    }

    #[test]
    fn a_record_that_is_not_written_leaves_nothing_behind() {
        let mut lines = Lines::default();
        let kept: Result<bool, ()> = lines.try_push_with(|buf| {
            buf.push(b'a');
            Ok(true)
        });
        assert_eq!(kept, Ok(true));
        assert_eq!(
            lines.try_push_with(|buf| {
                buf.push(b'b');
                Ok::<_, ()>(false)
            }),
            Ok(false)
        );
        assert_eq!(
            lines.try_push_with(|buf| {
                buf.push(b'c');
                Err(())
            }),
            Err(())
        );
        assert_eq!(lines.as_bytes(), b"a\n");
        assert_eq!(lines.len(), 1);
    }
}
