//! Data files: a full export's items written as records (rules 2–4 of `export`).

use std::io::{BufRead, BufReader, Read};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flate2::read::GzDecoder;
use md5::{Digest, Md5};

use super::incremental::write_change_line;
use super::{ExportError, ExportType, ManifestFile};
use crate::api::Render;
use crate::aws::ExportLineWriter;
use crate::records::Lines;

/// What reading one data file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    /// Lines written as records (the file's items).
    pub items: u64,
    /// Bytes of the stored (compressed) file.
    pub stored_bytes: u64,
}

/// Reads the data file `file` of an export of `kind` from its stored bytes `stored`, writing
/// each line after the first `skip` as its record — a full export's item by `render`, an
/// incremental export's change as its change envelope (`render` gives the table and the
/// format) — and handing the records to `each`
/// `batch` at a time (rule 2). Skipped items are counted, not written: they were handed on by
/// an earlier read of the file.
/// Fails when the file does not verify (rule 3) or a line does not read (rule 4); records
/// already handed over stay with the caller, who commits the file only when this returns `Ok`.
pub fn read_data_file<E: From<ExportError>>(
    stored: impl Read,
    file: &ManifestFile,
    kind: ExportType,
    render: Render,
    batch: usize,
    skip: u64,
    mut each: impl FnMut(Lines) -> Result<(), E>,
) -> Result<FileRead, E> {
    let key = file.data_file_key.as_str();
    let mut hashing = BufReader::new(Hashing::new(stored));
    // An empty partition may be stored as an empty object instead of an empty gzip: no items.
    let empty = hashing
        .fill_buf()
        .map_err(|e| ExportError::new(key, format!("cannot be read: {e}")))?
        .is_empty();
    let mut writer =
        LineWriter::new(kind, render).map_err(|problem| ExportError::new(key, problem))?;
    let mut lines = BufReader::new(GzDecoder::new(&mut hashing));
    let mut records = Lines::with_capacity(batch, batch * 256);
    let mut line = Vec::with_capacity(1024);
    let mut number = 0u64;
    let mut items = 0u64;
    loop {
        line.clear();
        if empty {
            break;
        }
        let read = lines
            .read_until(b'\n', &mut line)
            .map_err(|e| ExportError::new(key, format!("cannot be read as gzip: {e}")))?;
        if read == 0 {
            break;
        }
        number += 1;
        let content = line.trim_ascii_end();
        if content.is_empty() {
            continue;
        }
        if items < skip {
            items += 1;
            continue;
        }
        records
            .try_push_with(|out| writer.write(content, out).map(|()| true))
            .map_err(|problem| ExportError::new(key, format!("line {number}: {problem}")))?;
        items += 1;
        if records.len() >= batch {
            each(std::mem::replace(
                &mut records,
                Lines::with_capacity(batch, batch * 256),
            ))?;
        }
    }
    drop(lines);
    // The rest of the stored bytes (a gzip trailer the decoder did not need) count too.
    std::io::copy(&mut hashing, &mut std::io::sink())
        .map_err(|e| ExportError::new(key, format!("cannot be read: {e}")))?;
    if items != file.item_count {
        return Err(ExportError::new(
            key,
            format!(
                "holds {items} items but its manifest says {}; the export is incomplete or damaged, run it again",
                file.item_count
            ),
        )
        .into());
    }
    if let Some(expected) = &file.md5_checksum {
        let found = STANDARD.encode(hashing.get_mut().digest.finalize_reset());
        if &found != expected {
            return Err(ExportError::new(
                key,
                format!("its MD5 is {found} but its manifest says {expected}; the file is damaged, run the export again"),
            )
            .into());
        }
    }
    if !records.is_empty() {
        each(records)?;
    }
    Ok(FileRead {
        items,
        stored_bytes: hashing.get_ref().bytes,
    })
}

/// How the lines of one export become records.
enum LineWriter {
    /// A full export's `{"Item": …}` lines, by the Scan page's writer.
    Full(ExportLineWriter),
    /// An incremental export's changes, as change envelopes of this table and format.
    Incremental(std::sync::Arc<crate::api::SnapshotShape>),
}

impl LineWriter {
    fn new(kind: ExportType, render: Render) -> Result<Self, String> {
        match (kind, render) {
            (ExportType::Full, render) => Ok(LineWriter::Full(ExportLineWriter::new(render))),
            (ExportType::Incremental, Render::Snapshots(shape)) => {
                Ok(LineWriter::Incremental(shape))
            }
            (ExportType::Incremental, Render::Items(_)) => {
                Err("an incremental export is read only as change envelopes".into())
            }
        }
    }

    fn write(&mut self, line: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            LineWriter::Full(writer) => writer.write(line, out),
            LineWriter::Incremental(shape) => write_change_line(line, shape, out),
        }
    }
}

/// Hashes and counts the bytes read through it.
struct Hashing<R> {
    inner: R,
    digest: Md5,
    bytes: u64,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            digest: Md5::new(),
            bytes: 0,
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.digest.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use ddbpipe_value::ValueFormat;
    use flate2::Compression;
    use flate2::write::GzEncoder;

    use ddbpipe_value::item_from_typed_json;

    use super::*;

    const LINES: [&str; 3] = [
        r#"{"Item":{"pk":{"S":"a"},"n":{"N":"12345678901234567890.5"},"b":{"B":"AQI="},"m":{"M":{"z":{"SS":["y","x"]},"a":{"NULL":true}}}}}"#,
        r#"{"Item":{"pk":{"S":"b\u00e9"},"l":{"L":[{"N":"1"},{"BOOL":false}]}}}"#,
        r#"{"Item":{"pk":{"S":"c"}}}"#,
    ];

    fn gzip(lines: &[&str]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        for line in lines {
            encoder.write_all(line.as_bytes()).unwrap();
            encoder.write_all(b"\n").unwrap();
        }
        encoder.finish().unwrap()
    }

    fn file(stored: &[u8], items: u64) -> ManifestFile {
        ManifestFile {
            data_file_key: "p/AWSDynamoDB/x/data/a.json.gz".into(),
            item_count: items,
            md5_checksum: Some(STANDARD.encode(Md5::digest(stored))),
        }
    }

    fn read(
        stored: &[u8],
        file: &ManifestFile,
        format: ValueFormat,
    ) -> Result<Vec<String>, ExportError> {
        let mut out = Vec::new();
        read_data_file::<ExportError>(
            stored,
            file,
            ExportType::Full,
            Render::Items(format),
            2,
            0,
            |lines| {
                out.extend(lines.iter().map(|l| String::from_utf8(l.to_vec()).unwrap()));
                Ok(())
            },
        )?;
        Ok(out)
    }

    #[test]
    fn exported_items_give_the_bytes_their_scan_gives_in_both_formats() {
        let stored = gzip(&LINES);
        for format in [ValueFormat::Plain, ValueFormat::Typed] {
            let got = read(&stored, &file(&stored, 3), format).unwrap();
            let want: Vec<String> = LINES
                .iter()
                .map(|line| {
                    let json: serde_json::Value = serde_json::from_str(line).unwrap();
                    let item = item_from_typed_json(&json["Item"], "Item").unwrap();
                    let mut out = Vec::new();
                    Render::Items(format).write_item(&item, &mut out);
                    String::from_utf8(out).unwrap()
                })
                .collect();
            assert_eq!(got, want, "{format:?}");
        }
    }

    #[test]
    fn records_are_handed_over_in_batches_and_the_file_counts_its_stored_bytes() {
        let stored = gzip(&LINES);
        let mut batches = Vec::new();
        let read = read_data_file::<ExportError>(
            &stored[..],
            &file(&stored, 3),
            ExportType::Full,
            Render::Items(ValueFormat::Plain),
            2,
            0,
            |lines| {
                batches.push(lines.len());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(batches, [2, 1]);
        assert_eq!(read.items, 3);
        assert_eq!(read.stored_bytes, stored.len() as u64);
    }

    #[test]
    fn a_file_whose_count_or_checksum_differs_from_its_manifest_fails_naming_it() {
        let stored = gzip(&LINES);
        let error = read(&stored, &file(&stored, 4), ValueFormat::Plain).unwrap_err();
        assert_eq!(error.object, "p/AWSDynamoDB/x/data/a.json.gz");
        assert!(
            error
                .problem
                .contains("holds 3 items but its manifest says 4"),
            "{error}"
        );
        let mut damaged = file(&stored, 3);
        damaged.md5_checksum = Some(STANDARD.encode(Md5::digest(b"other")));
        let error = read(&stored, &damaged, ValueFormat::Plain).unwrap_err();
        assert!(error.problem.contains("its MD5 is"), "{error}");
        let mut unchecked = file(&stored, 3);
        unchecked.md5_checksum = None;
        assert_eq!(
            read(&stored, &unchecked, ValueFormat::Plain).unwrap().len(),
            3
        );
    }

    #[test]
    fn a_line_that_is_not_an_item_or_not_gzip_fails_naming_the_line() {
        let stored = gzip(&[LINES[0], r#"{"Keys":{"pk":{"S":"a"}}}"#]);
        let error = read(&stored, &file(&stored, 2), ValueFormat::Plain).unwrap_err();
        assert!(
            error
                .problem
                .starts_with("line 2: the line has no \"Item\""),
            "{error}"
        );
        let stored = gzip(&[r#"{"Item":{"pk":{"Q":"a"}}}"#]);
        let error = read(&stored, &file(&stored, 1), ValueFormat::Plain).unwrap_err();
        assert!(
            error.problem.contains("unsupported attribute value type Q"),
            "{error}"
        );
        let error = read(b"not gzip", &file(b"not gzip", 0), ValueFormat::Plain).unwrap_err();
        assert!(error.problem.contains("gzip"), "{error}");
    }

    #[test]
    fn an_empty_file_of_an_empty_partition_reads_as_no_items() {
        let stored = gzip(&[]);
        assert!(
            read(&stored, &file(&stored, 0), ValueFormat::Plain)
                .unwrap()
                .is_empty()
        );
        // Stored as an empty object, not an empty gzip.
        assert!(
            read(b"", &file(b"", 0), ValueFormat::Plain)
                .unwrap()
                .is_empty()
        );
        let error = read(b"", &file(b"", 1), ValueFormat::Plain).unwrap_err();
        assert!(error.problem.contains("holds 0 items"), "{error}");
    }

    #[test]
    fn a_resumed_file_skips_the_items_handed_on_before() {
        let stored = gzip(&LINES);
        let mut out = Vec::new();
        read_data_file::<ExportError>(
            &stored[..],
            &file(&stored, 3),
            ExportType::Full,
            Render::Items(ValueFormat::Plain),
            10,
            2,
            |lines| {
                out.extend(lines.iter().map(|l| String::from_utf8(l.to_vec()).unwrap()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(out, [r#"{"pk":"c"}"#]);
    }
}
