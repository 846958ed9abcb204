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
//! 2. A data file is read in two passes (`data`): the first hashes and counts its stored
//!    bytes as they arrive, gunzips them (every gzip member) and writes each line as its
//!    record into a spool (memory up to `SPOOL_MEMORY_BYTES`, then an unnamed temporary file);
//!    the second hands the spooled records over `batch` at a time. Memory is bounded by the
//!    spool's and the batch's size whatever the file's size.
//! 3. A file is complete only when its lines number its manifest's `itemCount` and its MD5
//!    matches `md5Checksum` (when given); otherwise the read fails naming the file and what
//!    differs, **before any of its records is handed on**. The caller commits a file as done
//!    only after that, so nothing of a file that does not verify is written or committed.
//! 4. A line that is not an export line fails the read naming the file and the line number.
//!    An empty line (the end of a file) is not an item. So does an item DynamoDB could not
//!    hold (`validate`): a key attribute missing or of another type than the key schema's, a
//!    number that is not one or outside DynamoDB's range, an item over 400 KB; the error
//!    names the file, the line and the item's key.
//!
//! # Reading an export as a snapshot (`ExportReader`)
//! 5. The export's ARN is committed by the caller before the first wait; `DescribeExport` is
//!    then asked from 2 s apart, doubling to 30 s, until `COMPLETED`. `FAILED` is a definite
//!    error naming the export and its failure code.
//! 6. The manifests name the files; their item counts must add up to the summary's. Data file
//!    `i` of `manifest-files.json` is segment `i` of the snapshot: its cursor is the number of
//!    its items handed on (`{"lines": {"N": …}}`), and it is done once it verified.
//! 7. At most `max_concurrency` files are read at once, each streamed from S3 through gzip on
//!    a blocking thread, `page_lines` records a page, each page's records carrying the
//!    export's `exportTime` as their read time (their version in a keyed sink).
//! 8. A transient failure of a file's request or body reads the file again from its start,
//!    skipping the items already handed on; a resumed file skips its cursor's items the same
//!    way. So a crash re-sends at most the unacknowledged part of the open files.
//! 9. S3 and export error codes say what to do (`api::remedy`).
//!
//! # Starting (`start`, `given`)
//! 10. An export is started with a `ClientToken` derived from the pipeline and the snapshot
//!     (`client_token`): repeated after a crash before its ARN was committed, the request
//!     returns the same export instead of paying for a second.
//! 11. A configured `export_arn` must be a full export of this table that did not fail.
//! 12. An export is read from the bucket it was written to: when `DescribeExport` names
//!     another bucket than `snapshot.s3_bucket` (the setting changed while an export or a
//!     repair was open, or `export_arn` names an export elsewhere), the read fails before any
//!     object is fetched, naming both buckets.
//!
//! # A damaged export (`SnapshotExports::abandon`)
//! 13. A data file that does not verify (rule 3), does not decode, holds a line or an item
//!     that cannot be (rule 4), or is gone (`NoSuchKey`) makes its export beyond use: every
//!     read of it fails the same way. The caller then abandons the export **once per run**,
//!     logged: a new one is started whose client token also names the damaged export, its
//!     ARN committed in place of the old one (which resets the file progress). A configured
//!     `export_arn` is not replaced: the error says to remove it. S3 is the trust boundary: a
//!     file altered together with its manifest's MD5 cannot be told from a real one.

pub mod api;
mod data;
mod engine;
mod incremental;
mod manifest;
mod reader;
mod start;
#[cfg(test)]
mod tests;
mod validate;

pub use data::{FileRead, FileReading, SPOOL_MEMORY_BYTES, read_data_file};
pub use engine::{BoxedPages, DynPages, ExportEngine, GivenExport, Pending, SnapshotExports};
pub use manifest::{ExportType, ManifestFile, ManifestSummary, manifest_files};
pub use reader::{ExportFiles, ExportPoll, ExportReader, ExportSegments, ExportSnapshot};
pub use start::{ExportTarget, client_token, given, start};

/// An export's errors are read errors: [`crate::error`] owns them.
pub use crate::error::{ExportError, ExportProblem};
/// A data file's cursor is a stored position: [`crate::position`] encodes and decodes it.
pub use crate::position::{cursor_lines, file_cursor};
