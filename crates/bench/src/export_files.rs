//! The bench export: the bench table's items written as a completed full export, in AWS's
//! layout, before the export phase runs (writing is not measured).
//!
//! # Layout (docs of `ddbpipe_source::export`)
//! Under `<dir>/bench/AWSDynamoDB/<EXPORT_ID>/`, as S3 keys relative to `<dir>` (the bucket):
//! - `data/<EXPORT_ID>-<k, 4 digits>.json.gz`, one per file `k` of `F` (AWS writes one per
//!   partition): gzip (default level) of `{"Item":<attribute JSON>}` lines, one per item of
//!   `[k·N/F, (k+1)·N/F)`, each item exactly the JSON the scan server serves
//!   ([`items::item_json`]);
//! - `manifest-files.json`: one line per data file, in order: `dataFileS3Key`, `itemCount`,
//!   `md5Checksum` (base64 of the MD5 of the stored bytes) and `etag` (their hex MD5, as S3
//!   gives a single-part object);
//! - `manifest-summary.json`: `exportArn`, `exportTime`, `itemCount`, `outputFormat`
//!   `DYNAMODB_JSON`, `exportType` `FULL_EXPORT`, `manifestFilesS3Key` and the rest of AWS's
//!   fields.
//!
//! Each data file is streamed to disk as it is compressed and hashed: memory stays small
//! whatever `N`. Files are written on up to as many threads as the machine has cores.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flate2::Compression;
use flate2::write::GzEncoder;
use md5::{Digest as _, Md5};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::items::{self, TABLE};

/// The bucket the export's keys are relative to (a directory here).
pub const BUCKET: &str = "bench-exports";
/// `S3Prefix` of the export.
pub const PREFIX: &str = "bench";
/// The export's id: the last part of its ARN and the folder of its files.
pub const EXPORT_ID: &str = "01735689600000-0bench00";
/// `ExportTime` of the export: 2025-01-01T00:00:00Z.
pub const EXPORT_TIME: &str = "2025-01-01T00:00:00.000Z";
/// [`EXPORT_TIME`] in unix ms.
pub const EXPORT_TIME_MS: i64 = 1_735_689_600_000;

/// The bench table's ARN.
pub fn table_arn() -> String {
    format!("arn:aws:dynamodb:us-east-1:000000000000:table/{TABLE}")
}

/// The export's ARN.
pub fn export_arn() -> String {
    format!("{}/export/{EXPORT_ID}", table_arn())
}

/// The S3 key of `manifest-summary.json` (`ExportManifest` of `DescribeExport`).
pub fn summary_key() -> String {
    format!("{}/manifest-summary.json", base())
}

fn base() -> String {
    format!("{PREFIX}/AWSDynamoDB/{EXPORT_ID}")
}

/// What was written.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Written {
    /// Items in the export.
    pub items: u64,
    /// Data files.
    pub files: u32,
    /// Bytes of the data files as stored (gzip).
    pub stored_bytes: u64,
    /// Bytes of the data files' lines, uncompressed (newlines included).
    pub line_bytes: u64,
    /// DynamoDB size of the items (the export's `billedSizeBytes`).
    pub table_bytes: u64,
}

/// One data file written: its manifest line's fields and its sizes.
struct DataFile {
    key: String,
    items: u64,
    md5: [u8; 16],
    stored_bytes: u64,
    line_bytes: u64,
    table_bytes: u64,
}

/// Writes the export of the bench table's `items` items in `files` data files under `dir`.
pub fn write(dir: &Path, items: u64, files: u32) -> anyhow::Result<Written> {
    ensure!(files >= 1, "an export has at least one data file");
    let data_dir = dir.join(base()).join("data");
    fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(files as usize);
    let next = AtomicU32::new(0);
    let written: Mutex<Vec<Option<DataFile>>> = Mutex::new((0..files).map(|_| None).collect());
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= files {
                            return Ok(());
                        }
                        let low = u64::from(k) * items / u64::from(files);
                        let high = u64::from(k + 1) * items / u64::from(files);
                        let file = write_data_file(dir, k, low..high)?;
                        let mut slots = written
                            .lock()
                            .map_err(|_| anyhow::anyhow!("a writer panicked"))?;
                        slots[k as usize] = Some(file);
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("an export writer panicked"))?
        })
    })?;
    let written = written
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a writer panicked"))?;

    let mut manifest = String::new();
    let mut total = Written {
        items: 0,
        files,
        stored_bytes: 0,
        line_bytes: 0,
        table_bytes: 0,
    };
    for file in written {
        let file = file.context("a data file was not written")?;
        let hex: String = file.md5.iter().map(|b| format!("{b:02x}")).collect();
        manifest.push_str(
            &json!({
                "itemCount": file.items,
                "md5Checksum": STANDARD.encode(file.md5),
                "etag": hex,
                "dataFileS3Key": file.key,
            })
            .to_string(),
        );
        manifest.push('\n');
        total.items += file.items;
        total.stored_bytes += file.stored_bytes;
        total.line_bytes += file.line_bytes;
        total.table_bytes += file.table_bytes;
    }
    ensure!(
        total.items == items,
        "wrote {} items, not {items}",
        total.items
    );
    let files_key = format!("{}/manifest-files.json", base());
    put(dir, &files_key, manifest.as_bytes())?;
    let summary = json!({
        "version": "2020-06-30",
        "exportArn": export_arn(),
        "startTime": EXPORT_TIME,
        "endTime": EXPORT_TIME,
        "tableArn": table_arn(),
        "tableId": "0bench00-0000-0000-0000-000000000000",
        "exportTime": EXPORT_TIME,
        "s3Bucket": BUCKET,
        "s3Prefix": PREFIX,
        "s3SseAlgorithm": "AES256",
        "s3SseKmsKeyId": null,
        "manifestFilesS3Key": files_key,
        "billedSizeBytes": total.table_bytes,
        "itemCount": total.items,
        "outputFormat": "DYNAMODB_JSON",
        "exportType": "FULL_EXPORT",
    });
    put(dir, &summary_key(), summary.to_string().as_bytes())?;
    Ok(total)
}

/// Writes the object `key` under `dir`.
fn put(dir: &Path, key: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(key);
    fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes data file `k` holding the items `range`, streaming: each item is serialized, then
/// compressed, hashed and written.
fn write_data_file(dir: &Path, k: u32, range: std::ops::Range<u64>) -> anyhow::Result<DataFile> {
    let key = format!("{}/data/{EXPORT_ID}-{k:04}.json.gz", base());
    let path = dir.join(&key);
    let out = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let hashing = Hashing {
        inner: BufWriter::with_capacity(1 << 20, out),
        digest: Md5::new(),
        bytes: 0,
    };
    let mut gzip = GzEncoder::new(hashing, Compression::default());
    let mut line = Vec::with_capacity(2048);
    let (mut line_bytes, mut table_bytes) = (0u64, 0u64);
    for index in range.clone() {
        let item = items::item_json(index);
        table_bytes += item.as_object().map_or(0, items::item_size);
        line.clear();
        line.extend_from_slice(b"{\"Item\":");
        serde_json::to_writer(&mut line, &item)?;
        line.extend_from_slice(b"}\n");
        line_bytes += line.len() as u64;
        gzip.write_all(&line)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut hashing = gzip
        .finish()
        .with_context(|| format!("cannot write {}", path.display()))?;
    hashing
        .inner
        .flush()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(DataFile {
        key,
        items: range.end - range.start,
        md5: hashing.digest.finalize().into(),
        stored_bytes: hashing.bytes,
        line_bytes,
        table_bytes,
    })
}

/// Hashes and counts the bytes written through it.
struct Hashing<W> {
    inner: W,
    digest: Md5,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader};

    use flate2::read::GzDecoder;

    use super::*;

    #[test]
    fn the_export_holds_every_item_once_in_aws_layout() {
        let dir = tempfile::tempdir().expect("temp dir");
        let written = write(dir.path(), 50, 4).expect("written");
        assert_eq!((written.items, written.files), (50, 4));
        let summary: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(summary_key())).expect("summary"))
                .expect("JSON");
        assert_eq!(summary["itemCount"], 50);
        assert_eq!(summary["outputFormat"], "DYNAMODB_JSON");
        assert_eq!(summary["exportArn"], export_arn());
        let files_key = summary["manifestFilesS3Key"].as_str().expect("files key");
        let manifest = fs::read_to_string(dir.path().join(files_key)).expect("manifest");
        let mut seen = Vec::new();
        for entry in manifest.lines() {
            let entry: serde_json::Value = serde_json::from_str(entry).expect("entry");
            let key = entry["dataFileS3Key"].as_str().expect("key");
            let stored = fs::read(dir.path().join(key)).expect("data file");
            assert_eq!(entry["md5Checksum"], STANDARD.encode(Md5::digest(&stored)));
            let mut lines = 0;
            for line in BufReader::new(GzDecoder::new(&stored[..])).lines() {
                let line: serde_json::Value =
                    serde_json::from_str(&line.expect("line")).expect("JSON line");
                let pk = line["Item"]["pk"]["S"].as_str().expect("pk");
                let index = items::key_index(pk).expect("bench key");
                assert_eq!(line["Item"], items::item_json(index));
                seen.push(index);
                lines += 1;
            }
            assert_eq!(entry["itemCount"], lines);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
    }
}
