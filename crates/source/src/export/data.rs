//! Data files: a full export's items, or an incremental export's changes, written as records
//! (rules 2–4 of `export`).
//!
//! # Two passes
//! 1. **Verify.** The stored bytes are read once: hashed (MD5) and counted as they arrive,
//!    gunzipped (every gzip member), each line written as its record. The records after the
//!    first `skip` go to a spool: memory up to [`SPOOL_MEMORY_BYTES`], then an unnamed
//!    temporary file (the system's temporary directory, `$TMPDIR` or `/tmp`), which the
//!    system removes when it is closed, also when the process is killed.
//! 2. **Hand on.** Only once the file holds its manifest's `itemCount` lines, its MD5 equals
//!    `md5Checksum` and every line read as a record is the spool read back and handed over
//!    `batch` records at a time. So no record of a file that does not verify is ever handed
//!    on, and memory stays bounded whatever the file's size.
//!
//! # Error handling
//! A body that breaks off while it is read is "cannot be read" (the caller reads the file
//! again: transient). Everything else is definite — the same bytes fail the same way: bytes
//! that are not gzip, a line that is not an export line, a count or checksum that differs.

use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flate2::read::MultiGzDecoder;
use md5::{Digest, Md5};
use tempfile::SpooledTempFile;

use super::incremental::write_change_line;
use super::validate::key_of_line;
use super::{ExportError, ExportType, ManifestFile};
use crate::api::{KeyAttribute, Render};
use crate::records::Lines;
use crate::wire::ExportLineWriter;

/// Bytes of a file's records a spool keeps in memory before it moves to a temporary file.
pub const SPOOL_MEMORY_BYTES: usize = 4 << 20;

/// Lines between two calls of a read's `check` (so a stop is seen within a large file).
const CHECK_EVERY_LINES: u64 = 4096;

/// What reading one data file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    /// Lines written as records (the file's items).
    pub items: u64,
    /// Bytes of the stored (compressed) file.
    pub stored_bytes: u64,
}

/// How one data file is read.
#[derive(Debug, Clone)]
pub struct FileReading<'a> {
    /// The file and what its manifest says of it.
    pub file: &'a ManifestFile,
    /// Full (items) or incremental (changes).
    pub kind: ExportType,
    /// A full export's items are written by `render`; an incremental export's changes as
    /// change envelopes of `render`'s table and format.
    pub render: Render,
    /// The table's key schema: every item must hold these attributes with these types.
    pub key_schema: &'a [KeyAttribute],
    /// Records handed over at a time.
    pub batch: usize,
    /// Items handed on by an earlier read of the file: counted, not handed on again.
    pub skip: u64,
}

/// Reads the data file `reading.file` from its stored bytes `stored` in two passes (see the
/// module docs): nothing is handed to `each` unless the whole file verified. `check` is
/// called every few thousand lines of the first pass; its error stops the read (a stop).
/// Records handed over stay with the caller, who commits the file only when this returns
/// `Ok`.
pub fn read_data_file<E: From<ExportError>>(
    stored: impl Read,
    reading: &FileReading<'_>,
    mut check: impl FnMut() -> Result<(), E>,
    mut each: impl FnMut(Lines) -> Result<(), E>,
) -> Result<FileRead, E> {
    let key = reading.file.data_file_key.as_str();
    let mut spool = Spool::new(key);
    let read = verify(stored, reading, &mut spool, &mut check)?;
    spool.hand_on(reading.batch, &mut each)?;
    Ok(read)
}

/// The first pass: every line written as its record, the ones after `skip` spooled; the
/// count and the checksum compared with the manifest's.
fn verify<E: From<ExportError>>(
    stored: impl Read,
    reading: &FileReading<'_>,
    spool: &mut Spool,
    check: &mut impl FnMut() -> Result<(), E>,
) -> Result<FileRead, E> {
    let file = reading.file;
    let key = file.data_file_key.as_str();
    let mut hashing = BufReader::new(Hashing::new(stored));
    // An empty partition may be stored as an empty object instead of an empty gzip: no items.
    let empty = hashing
        .fill_buf()
        .map_err(|e| ExportError::new(key, format!("cannot be read: {e}")))?
        .is_empty();
    let mut writer = LineWriter::new(
        reading.kind,
        reading.render.clone(),
        reading.key_schema.to_vec(),
    )
    .map_err(|problem| ExportError::new(key, problem))?;
    let mut lines = BufReader::new(MultiGzDecoder::new(&mut hashing));
    let mut line = Vec::with_capacity(1024);
    let mut record = Vec::with_capacity(1024);
    let mut number = 0u64;
    let mut items = 0u64;
    loop {
        line.clear();
        if empty {
            break;
        }
        let read = match lines.read_until(b'\n', &mut line) {
            Ok(read) => read,
            Err(e) => {
                // The decoder's error, or the body's it passed on.
                let problem = lines.get_ref().get_ref().get_ref().problem(key, &e);
                drop(lines);
                return Err(checksum_first(&mut hashing, file, problem).into());
            }
        };
        if read == 0 {
            break;
        }
        number += 1;
        if number.is_multiple_of(CHECK_EVERY_LINES) {
            check()?;
        }
        let content = line.trim_ascii_end();
        if content.is_empty() {
            continue;
        }
        record.clear();
        if let Err(problem) = writer.write(content, &mut record) {
            let item = key_of_line(content, reading.kind, reading.key_schema);
            let problem = ExportError::damaged(
                key,
                format!(
                    "line {number} (key {item}): {problem}; DynamoDB could not have exported \
                     this item, the file is damaged: nothing of it was written"
                ),
            );
            drop(lines);
            return Err(checksum_first(&mut hashing, file, problem).into());
        }
        if items >= reading.skip {
            spool.push(&record)?;
        }
        items += 1;
    }
    drop(lines);
    // The rest of the stored bytes (a gzip trailer the decoder did not need) count too.
    std::io::copy(&mut hashing, &mut std::io::sink())
        .map_err(|e| ExportError::new(key, format!("cannot be read: {e}")))?;
    if let Some(mismatch) = md5_mismatch(&mut hashing, file) {
        return Err(mismatch.into());
    }
    if items != file.item_count {
        return Err(ExportError::damaged(
            key,
            format!(
                "holds {items} items but its manifest says {}; the export is incomplete or \
                 damaged, nothing of this file was written",
                file.item_count
            ),
        )
        .into());
    }
    Ok(FileRead {
        items,
        stored_bytes: hashing.get_ref().bytes,
    })
}

/// The MD5 of the whole stored object against the manifest's, once every byte went through
/// `hashing`: the damage, when they differ.
fn md5_mismatch<R: Read>(
    hashing: &mut BufReader<Hashing<R>>,
    file: &ManifestFile,
) -> Option<ExportError> {
    let expected = file.md5_checksum.as_ref()?;
    let found = STANDARD.encode(hashing.get_mut().digest.finalize_reset());
    (&found != expected).then(|| {
        ExportError::damaged(
            &file.data_file_key,
            format!(
                "its MD5 is {found} but its manifest says {expected}; the file is damaged, \
                 nothing of it was written"
            ),
        )
    })
}

/// A file that does not decode: when its stored bytes can be read to the end and their MD5
/// differs from the manifest's, that is the damage named (the file is not what the export
/// wrote); else `problem` (a body cut in transfer stays a read error, retried).
fn checksum_first<R: Read>(
    hashing: &mut BufReader<Hashing<R>>,
    file: &ManifestFile,
    problem: ExportError,
) -> ExportError {
    if !problem.is_damaged() || std::io::copy(hashing, &mut std::io::sink()).is_err() {
        return problem;
    }
    md5_mismatch(hashing, file).unwrap_or(problem)
}

/// The records of one file between the passes: in memory up to [`SPOOL_MEMORY_BYTES`], then
/// in an unnamed temporary file.
struct Spool<'k> {
    key: &'k str,
    records: BufWriter<SpooledTempFile>,
}

impl<'k> Spool<'k> {
    fn new(key: &'k str) -> Self {
        Spool {
            key,
            records: BufWriter::with_capacity(64 * 1024, SpooledTempFile::new(SPOOL_MEMORY_BYTES)),
        }
    }

    fn failed(&self, e: &std::io::Error) -> ExportError {
        ExportError::new(
            self.key,
            format!(
                "its records cannot be spooled to a temporary file in {}: {e}; make room there \
                 (or point TMPDIR at a directory with room) and run again",
                std::env::temp_dir().display()
            ),
        )
    }

    /// Appends one record (a compact JSON document: no newline in it).
    fn push(&mut self, record: &[u8]) -> Result<(), ExportError> {
        self.records
            .write_all(record)
            .and_then(|()| self.records.write_all(b"\n"))
            .map_err(|e| self.failed(&e))
    }

    /// The second pass: the spooled records handed to `each`, `batch` at a time and at most
    /// about [`PAGE_BYTES`] at a time (docs/scan.md §2.4: a page of 1000 items of 400 KB
    /// would otherwise be built whole).
    fn hand_on<E: From<ExportError>>(
        self,
        batch: usize,
        each: &mut impl FnMut(Lines) -> Result<(), E>,
    ) -> Result<(), E> {
        let key = self.key;
        let failed = |e: std::io::Error| {
            ExportError::new(key, format!("its spooled records cannot be read back: {e}"))
        };
        let mut spooled = self
            .records
            .into_inner()
            .map_err(|e| failed(e.into_error()))?;
        spooled.seek(SeekFrom::Start(0)).map_err(failed)?;
        let mut spooled = BufReader::with_capacity(64 * 1024, spooled);
        let mut records = Lines::with_capacity(batch, batch * 256);
        loop {
            let buffer = spooled.fill_buf().map_err(failed)?;
            if buffer.is_empty() {
                break;
            }
            // Whole records of the buffer at once; a record cut by its end is read by
            // read_until.
            let (taken, whole) = match buffer.iter().position(|&b| b == b'\n') {
                Some(end) => (end + 1, &buffer[..end]),
                None => (0, &[][..]),
            };
            if taken > 0 {
                records.push_with(|out| out.extend_from_slice(whole));
                spooled.consume(taken);
            } else {
                let mut record = Vec::new();
                spooled.read_until(b'\n', &mut record).map_err(failed)?;
                let record = record.strip_suffix(b"\n").unwrap_or(&record);
                records.push_with(|out| out.extend_from_slice(record));
            }
            if records.len() >= batch || records.bytes() >= PAGE_BYTES {
                each(std::mem::replace(
                    &mut records,
                    Lines::with_capacity(batch, batch * 256),
                ))?;
            }
        }
        if !records.is_empty() {
            each(records)?;
        }
        Ok(())
    }
}

/// The records of an export page at most, in bytes (the record that crosses it included): a
/// Scan page's 1 MB, so that an export's pages weigh what the scan's do whatever the items'
/// size.
pub const PAGE_BYTES: usize = 1024 * 1024;

/// How the lines of one export become records.
enum LineWriter {
    /// A full export's `{"Item": …}` lines, by the Scan page's writer.
    Full(ExportLineWriter),
    /// An incremental export's changes, as change envelopes of this table and format, of
    /// items with this key schema.
    Incremental(std::sync::Arc<crate::api::SnapshotShape>, Vec<KeyAttribute>),
}

impl LineWriter {
    fn new(
        kind: ExportType,
        render: Render,
        key_schema: Vec<KeyAttribute>,
    ) -> Result<Self, String> {
        match (kind, render) {
            (ExportType::Full, render) => {
                Ok(LineWriter::Full(ExportLineWriter::new(render, key_schema)))
            }
            (ExportType::Incremental, Render::Snapshots(shape)) => {
                Ok(LineWriter::Incremental(shape, key_schema))
            }
            (ExportType::Incremental, Render::Items(..)) => {
                Err("an incremental export is read only as change envelopes".into())
            }
        }
    }

    fn write(&mut self, line: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            LineWriter::Full(writer) => writer.write(line, out),
            LineWriter::Incremental(shape, key_schema) => {
                write_change_line(line, shape, key_schema, out)
            }
        }
    }
}

/// Hashes and counts the bytes read through it, and remembers whether reading them failed
/// (the body broke off) as opposed to the decoder refusing what was read.
struct Hashing<R> {
    inner: R,
    digest: Md5,
    bytes: u64,
    broke: bool,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            digest: Md5::new(),
            bytes: 0,
            broke: false,
        }
    }

    /// What a read error of the decoder on top means: a broken body is read again
    /// ("cannot be read", transient); bytes that are not gzip stay so (definite).
    fn problem(&self, key: &str, error: &std::io::Error) -> ExportError {
        if self.broke {
            ExportError::new(key, format!("cannot be read: {error}"))
        } else {
            ExportError::damaged(
                key,
                format!("is not a valid gzip file ({error}); the file is damaged"),
            )
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf).inspect_err(|_| self.broke = true)?;
        self.digest.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
#[path = "data/tests.rs"]
mod tests;
