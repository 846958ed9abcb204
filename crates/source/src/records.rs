//! Records rendered as JSON lines, and the positions a page of them reaches.

use std::ops::Range;
use std::sync::Arc;

use ddbpipe_value::Item;
use serde_json::value::RawValue;

/// JSON records, each one compact line, stored back to back in one buffer.
///
/// One allocation per page instead of one per record; the sink writes the buffer as it is.
/// Items rendered from a Scan or Query page also note where their key attributes' values sit
/// in them ([`Lines::noted`]), so that a sink takes a record's key without parsing the record
/// a second time.
#[derive(Debug, Clone, Default)]
pub struct Lines {
    buf: Vec<u8>,
    ends: Vec<usize>,
    noted: Option<Noted>,
}

/// Lines are equal when their records are: the notes only say where parts of them are.
impl PartialEq for Lines {
    fn eq(&self, other: &Lines) -> bool {
        self.buf == other.buf && self.ends == other.ends
    }
}

impl Eq for Lines {}

/// Where the values of the attributes `names` sit in each record: `names.len()` spans per
/// record, in record order, each from the record's start ([`ABSENT`] where the record lacks
/// the attribute). Kept only while every record has its spans: a record pushed or appended
/// without them drops the notes of all (the sinks then read each record, as without notes).
#[derive(Debug, Clone)]
struct Noted {
    names: Arc<[String]>,
    spans: Vec<(u32, u32)>,
}

impl Noted {
    /// Whether each of `records` records has its spans.
    fn complete(&self, records: usize) -> bool {
        self.spans.len() == self.names.len() * records
    }
}

/// The span of an attribute the record does not have.
const ABSENT: (u32, u32) = (u32::MAX, u32::MAX);

/// Pushes `span` (`None`: absent) of the record at `record` (its range in the buffer, the
/// newline past its end) to `spans`, relative to the record's start; `false` for a span
/// outside the record or too far into it to be kept.
fn push_span(
    spans: &mut Vec<(u32, u32)>,
    record: &Range<usize>,
    span: Option<Range<usize>>,
) -> bool {
    let Some(span) = span else {
        spans.push(ABSENT);
        return true;
    };
    if !(record.start <= span.start && span.start <= span.end && span.end < record.end) {
        return false;
    }
    match (
        u32::try_from(span.start - record.start),
        u32::try_from(span.end - record.start),
    ) {
        (Ok(from), Ok(to)) => {
            spans.push((from, to));
            true
        }
        _ => false,
    }
}

impl Lines {
    /// Empty, with room for about `records` records of `bytes` bytes in all.
    pub fn with_capacity(records: usize, bytes: usize) -> Self {
        Lines {
            buf: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(records),
            noted: None,
        }
    }

    /// Makes room for about `records` more records of `bytes` more bytes in all, so that
    /// filling them copies nothing already held (a batch grown by doubling copies itself).
    pub fn reserve(&mut self, records: usize, bytes: usize) {
        self.buf.reserve(bytes);
        self.ends.reserve(records);
    }

    /// Notes, for each record pushed from now on, where the values of the attributes `names`
    /// sit in it (each push followed by [`Lines::note_last`]). Only on empty lines.
    pub fn note_attributes(&mut self, names: Arc<[String]>) {
        if self.is_empty() && !names.is_empty() {
            self.noted = Some(Noted {
                names,
                spans: Vec::with_capacity(self.ends.capacity() * 2),
            });
        }
    }

    /// Notes where the noted attributes' values sit in the record just pushed: `span_of(name)`
    /// is the value's byte range in the buffer the record was written to, `None` where the
    /// record lacks the attribute. Without a record just pushed (or outside
    /// [`Lines::note_attributes`]) the notes are dropped.
    pub fn note_last(&mut self, span_of: impl Fn(&str) -> Option<Range<usize>>) {
        self.note_last_with(|names, spans, record| {
            names
                .iter()
                .all(|name| push_span(spans, &record, span_of(name)))
        });
    }

    /// [`Lines::note_last`] for a writer that knows the noted names' order: `spans` are the
    /// values' ranges in that order, when the lines note exactly the list `names` (the same
    /// list, by address; else the notes are dropped). No name is looked up.
    pub fn note_last_in_order(&mut self, names: &Arc<[String]>, spans: &[Range<usize>]) {
        match &self.noted {
            Some(noted) if Arc::ptr_eq(&noted.names, names) && spans.len() == names.len() => {}
            Some(_) => self.noted = None,
            None => return,
        }
        self.note_last_with(|_, noted, record| {
            spans
                .iter()
                .all(|span| push_span(noted, &record, Some(span.clone())))
        });
    }

    /// Notes the record just pushed by `fill`, given the noted names, the spans to push to
    /// and the record's range in the buffer; `fill` says whether every span was right, else
    /// the notes are dropped (as they are without a record just pushed).
    fn note_last_with(
        &mut self,
        fill: impl FnOnce(&[String], &mut Vec<(u32, u32)>, Range<usize>) -> bool,
    ) {
        let Some(noted) = &mut self.noted else {
            return;
        };
        let start = self.ends.len().checked_sub(2).map_or(0, |i| self.ends[i]);
        let end = self.ends.last().copied().unwrap_or(0);
        if self.ends.is_empty()
            || !noted.complete(self.ends.len() - 1)
            || !fill(&noted.names, &mut noted.spans, start..end)
        {
            self.noted = None;
        }
    }

    /// The raw values of the attributes `names` of record `i` (`None` where it lacks one), in
    /// the order of `names`, from where the record noted them when it was written, without
    /// reading the record: what [`ddbpipe_value::key_attributes`] reads from it. `None` when the
    /// record did not note every one of `names`: the caller reads the record.
    pub fn noted<K>(
        &self,
        i: usize,
        names: &[K],
        name: impl Fn(&K) -> &str,
    ) -> Option<Vec<Option<&RawValue>>> {
        let noted = self.noted.as_ref()?;
        if !noted.complete(self.ends.len()) {
            return None;
        }
        let width = noted.names.len();
        let record = self.get(i)?;
        let spans = noted.spans.get(i * width..(i + 1) * width)?;
        names
            .iter()
            .map(|wanted| {
                let at = noted.names.iter().position(|noted| noted == name(wanted))?;
                match spans[at] {
                    ABSENT => Some(None),
                    (from, to) => {
                        let text = std::str::from_utf8(record.get(from as usize..to as usize)?);
                        serde_json::from_str::<&RawValue>(text.ok()?).ok().map(Some)
                    }
                }
            })
            .collect()
    }

    /// Record `i`'s noted values in the order they were noted, sliced from `text`, the record's
    /// text (`None` where it lacks the attribute): for a reader that knows that order, when the
    /// lines note exactly the list `names` (the same list, by address) — else `None`.
    pub fn noted_values<'t, const N: usize>(
        &self,
        i: usize,
        text: &'t str,
        names: &Arc<[String]>,
    ) -> Option<[Option<&'t str>; N]> {
        let noted = self.noted.as_ref()?;
        if !Arc::ptr_eq(&noted.names, names)
            || names.len() != N
            || !noted.complete(self.ends.len())
            || self.get(i)?.len() != text.len()
        {
            return None;
        }
        let spans = noted.spans.get(i * N..(i + 1) * N)?;
        let mut values = [None; N];
        for (value, span) in values.iter_mut().zip(spans) {
            *value = match *span {
                ABSENT => None,
                (from, to) => Some(text.get(from as usize..to as usize)?),
            };
        }
        Some(values)
    }

    /// Appends one record: `write` appends its JSON (without newline) to the buffer.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        self.forget_unnoted();
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
        self.forget_unnoted();
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

    /// Bytes the records' buffer holds room for without growing.
    pub fn capacity_bytes(&self) -> usize {
        self.buf.capacity()
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

    /// The raw values of the attributes `names` of record `i`, whose text is `text`, as
    /// [`ddbpipe_value::key_attributes`] reads them from it: taken from the record's notes when
    /// it has them for every one of `names` (nothing read), else read from `text`. What the
    /// keyed, lake and Kafka sinks take an item's key from.
    pub fn attributes<'a, K>(
        &'a self,
        i: usize,
        text: &'a str,
        names: &[K],
        name: impl Fn(&K) -> &str,
    ) -> serde_json::Result<Vec<Option<&'a RawValue>>> {
        match self.noted(i, names, &name) {
            Some(found) => Ok(found),
            None => ddbpipe_value::key_attributes(text, names, name),
        }
    }

    /// Drops the notes when the last record has none: a record is about to follow it.
    fn forget_unnoted(&mut self) {
        if let Some(noted) = &self.noted
            && !noted.complete(self.ends.len())
        {
            self.noted = None;
        }
    }

    /// Appends records `from..to` of `other`, with their notes when both lines note the same
    /// attributes (or these lines are empty).
    pub fn extend_from(&mut self, other: &Lines, from: usize, to: usize) {
        self.forget_unnoted();
        let theirs = other
            .noted
            .as_ref()
            .filter(|theirs| theirs.complete(other.ends.len()));
        self.noted = match (self.noted.take(), theirs) {
            (None, Some(theirs)) if self.ends.is_empty() => Some(Noted {
                names: theirs.names.clone(),
                spans: Vec::new(),
            }),
            (Some(ours), Some(theirs))
                if Arc::ptr_eq(&ours.names, &theirs.names) || ours.names == theirs.names =>
            {
                Some(ours)
            }
            _ => None,
        };
        if let (Some(ours), Some(theirs)) = (&mut self.noted, theirs) {
            let width = ours.names.len();
            ours.spans
                .extend_from_slice(&theirs.spans[from * width..to * width]);
        }
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

    /// Lines of `records` items `{"k":"<i>","v":…}` noting `k` (or `names`).
    fn noted_lines(records: usize, names: &[&str]) -> Lines {
        let mut lines = Lines::default();
        lines.note_attributes(names.iter().map(|name| name.to_string()).collect());
        for i in 0..records {
            let start = lines.bytes();
            lines.push_with(|buf| {
                buf.extend_from_slice(format!(r#"{{"k":"{i}","v":1}}"#).as_bytes())
            });
            lines.note_last(|name| (name == "k").then(|| start + 5..start + 8));
        }
        lines
    }

    fn noted_keys(lines: &Lines) -> Option<Vec<String>> {
        (0..lines.len())
            .map(|i| {
                let found = lines.noted(i, &["k"], |name| name)?;
                Some(found[0].map_or("absent".to_string(), |v| v.get().to_string()))
            })
            .collect()
    }

    #[test]
    fn notes_follow_their_records_and_are_dropped_when_any_record_lacks_them() {
        let page = noted_lines(3, &["k", "x"]);
        assert_eq!(
            noted_keys(&page),
            Some(vec![r#""0""#.into(), r#""1""#.into(), r#""2""#.into()])
        );
        assert_eq!(
            page.noted(0, &["x"], |n| n).map(|f| f[0].is_none()),
            Some(true)
        );
        // Into empty lines, in parts: the notes come along.
        let mut batch = Lines::default();
        batch.extend_from(&page, 2, 3);
        batch.extend_from(&page, 0, 2);
        assert_eq!(
            noted_keys(&batch),
            Some(vec![r#""2""#.into(), r#""0""#.into(), r#""1""#.into()])
        );
        // Records noting other attributes, records without notes, a record pushed without
        // its note: no notes at all (the sinks read every record).
        let mut mixed = batch.clone();
        mixed.extend_from(&noted_lines(1, &["k"]), 0, 1);
        assert_eq!(noted_keys(&mixed), None);
        let mut unnoted = batch.clone();
        unnoted.push_with(|buf| buf.extend_from_slice(b"{}"));
        assert_eq!(noted_keys(&unnoted), None);
        unnoted.push_with(|buf| buf.extend_from_slice(b"{}"));
        unnoted.note_last(|_| None);
        assert_eq!(
            noted_keys(&unnoted),
            None,
            "a note of the next record does not bring them back"
        );
        let mut plain = Lines::default();
        plain.push_with(|buf| buf.extend_from_slice(b"{}"));
        plain.extend_from(&page, 0, 1);
        assert_eq!(noted_keys(&plain), None);
        // A span outside the record just pushed drops the notes.
        let mut wrong = noted_lines(1, &["k"]);
        wrong.push_with(|buf| buf.extend_from_slice(b"{}"));
        wrong.note_last(|_| Some(0..3));
        assert_eq!(noted_keys(&wrong), None);
        // Equal records are equal lines, noted or not.
        let mut same = Lines::default();
        for line in page.iter() {
            same.push_with(|buf| buf.extend_from_slice(line));
        }
        assert_eq!(same, page);
    }

    /// Spans given in the noted names' order are noted as `note_last` notes them, only for the
    /// list the lines note (by address: an equal list elsewhere drops the notes, as does a
    /// span outside the record or a count of spans other than the names').
    #[test]
    fn spans_in_order_are_noted_for_the_list_the_lines_note_only() {
        let names: Arc<[String]> = ["k", "x"].map(String::from).into();
        let ordered = |names_given: &Arc<[String]>, spans: &[Range<usize>]| {
            let mut lines = Lines::default();
            lines.note_attributes(names.clone());
            lines.push_with(|buf| buf.extend_from_slice(br#"{"k":"0","v":1}"#));
            lines.note_last_in_order(names_given, spans);
            lines
        };
        let noted = ordered(&names, &[5..8, 13..14]);
        assert_eq!(noted_keys(&noted), Some(vec![r#""0""#.into()]));
        assert_eq!(
            noted
                .noted(0, &["x"], |n| n)
                .map(|f| f[0].map(|v| v.get().to_string())),
            Some(Some("1".into()))
        );
        assert_eq!(
            noted.noted_values::<2>(0, r#"{"k":"0","v":1}"#, &names),
            Some([Some(r#""0""#), Some("1")])
        );
        let equal: Arc<[String]> = ["k", "x"].map(String::from).into();
        assert_eq!(noted_keys(&ordered(&equal, &[5..8, 13..14])), None);
        assert_eq!(noted_keys(&ordered(&names, &[5..8, 12..40])), None);
        let one_span = vec![Range { start: 5, end: 8 }];
        assert_eq!(noted_keys(&ordered(&names, &one_span)), None);
    }
}
