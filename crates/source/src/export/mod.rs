//! Reading a DynamoDB export from its files (docs/scan.md §2.10): the manifests AWS documents
//! and the gzip data files, verified and written as records. The export's requests
//! (`ExportTableToPointInTime`, `DescribeExport`) and S3 come later; this is the part that
//! turns the bytes of an export into the records a Scan of the same data gives.
//!
//! # Layout (AWS's, not an emulator's)
//! Under `<prefix>/AWSDynamoDB/<export id>/`:
//! - `manifest-summary.json`: one JSON object — `exportArn`, `exportTime`, `itemCount`,
//!   `outputFormat` (`DYNAMODB_JSON`), `exportType` (`FULL_EXPORT` or `INCREMENTAL_EXPORT`;
//!   absent in full exports of older accounts), `manifestFilesS3Key`;
//! - `manifest-files.json`: one JSON object per line — `dataFileS3Key`, `itemCount`,
//!   `md5Checksum` (base64 of the MD5 of the data file as stored), `etag`;
//! - `data/<name>.json.gz`: gzip of one JSON object per line: `{"Item": {…}}` in a full export;
//!   `{"Metadata": {"WriteTimestampMicros": {"N": …}}, "Keys": {…}, "NewImage": {…},
//!   "OldImage": {…}}` in an incremental one.
//!
//! # Rules
//! 1. Only `DYNAMODB_JSON` exports are read; another `outputFormat` (ION) is an error naming it.
//! 2. A data file is read as a stream: its compressed bytes are hashed as they are read, the
//!    decompressed lines are written as records and handed over `batch` lines at a time, so
//!    memory is bounded by `batch` whatever the file's size.
//! 3. A file is complete only when its lines number its manifest's `itemCount` and its MD5
//!    matches `md5Checksum` (when given); otherwise the read fails naming the file and what
//!    differs. The caller commits a file as done only after that, so nothing is committed past
//!    a file that does not verify.
//! 4. A line that is not an export line fails the read naming the file and the line number.
//!    An empty line (the end of a file) is not an item.

mod data;
mod manifest;

pub use data::{FileRead, read_data_file};
pub use manifest::{ExportType, ManifestFile, ManifestSummary, manifest_files};

/// Why an export cannot be read; definite: the same files give the same error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {problem}")]
pub struct ExportError {
    /// The S3 key of the object (or the manifest) that does not read.
    pub object: String,
    /// What is wrong, and where in it.
    pub problem: String,
}

impl ExportError {
    fn new(object: &str, problem: impl Into<String>) -> Self {
        ExportError {
            object: object.to_string(),
            problem: problem.into(),
        }
    }
}
