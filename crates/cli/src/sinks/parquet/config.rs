//! The parquet sink's section: `{type: parquet, path, s3_region, s3_endpoint_url,
//! target_file_mb, commit_interval_secs, compression, columns, on_type_mismatch}`
//! (docs/sinks.md §7.10; the typed columns as the keyed sinks', §7.9).

use std::path::Path;

use ddbpipe_keyed::OnMismatch;
use ddbpipe_lake::objects::Location;
use ddbpipe_lake::parquet::FileCompression;
use ddbpipe_source::config::ConfigError;
use ddbpipe_source::endpoint::EndpointUrl;
use serde_json::json;

use crate::sinks::keyed::columns::{
    self, COLUMNS, ColumnConfig, DEFAULT_DOCUMENT_COLUMN, Dialect, ON_TYPE_MISMATCH,
};
use crate::yaml::fields::Fields;
use crate::yaml::schema::{Field, defaulted, of, optional, required};
use crate::yaml::types::Choice;

/// `sink.target_file_mb` when unset.
pub const DEFAULT_TARGET_FILE_MB: u32 = 128;
/// `sink.commit_interval_secs` when unset.
pub const DEFAULT_COMMIT_INTERVAL_SECS: u32 = 60;

/// `s3_region` of an S3 location (`source.snapshot`, the parquet sink).
pub(crate) const S3_REGION: Field = optional(
    "s3_region",
    of::<String>(),
    "The bucket's region; unset: the source's region.",
);

/// `s3_endpoint_url` of an S3 location (`source.snapshot`, the parquet sink); a secret's
/// place (`crate::yaml::fields`).
pub(crate) const S3_ENDPOINT_URL: Field = optional(
    "s3_endpoint_url",
    of::<EndpointUrl>(),
    "An S3 endpoint, addressed path-style; unset: source.endpoint_url when set.",
);

/// The keys of the parquet sink.
pub(crate) static FIELDS: &[Field] = &[
    required(
        "path",
        of::<String>(),
        "Where the files go: s3://bucket/prefix/ or a local directory; {table} and {pipeline} \
         are filled in.",
    ),
    S3_REGION,
    S3_ENDPOINT_URL,
    defaulted(
        "target_file_mb",
        of::<u32>(),
        || json!(DEFAULT_TARGET_FILE_MB),
        "Roll a data file at this size (MiB); every commit also closes the open files.",
    ),
    defaulted(
        "commit_interval_secs",
        of::<u32>(),
        || json!(DEFAULT_COMMIT_INTERVAL_SECS),
        "Commit what was written at least this often (a commit also happens when a file rolls \
         and when the run stops); 0: after every batch.",
    ),
    defaulted(
        "compression",
        of::<FileCompression>(),
        || json!(FileCompression::Snappy.name()),
        "How the files' pages are compressed: snappy (what every reader reads), zstd (smaller \
         files, more CPU) or none (the least CPU).",
    ),
    COLUMNS,
    ON_TYPE_MISMATCH,
];

impl Choice for FileCompression {
    fn all() -> &'static [Self] {
        &[
            FileCompression::Snappy,
            FileCompression::Zstd,
            FileCompression::None,
        ]
    }
    fn name(self) -> &'static str {
        match self {
            FileCompression::Snappy => "snappy",
            FileCompression::Zstd => "zstd",
            FileCompression::None => "none",
        }
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "gzip" | "lz4" | "brotli" | "uncompressed")
            .then_some("the parquet sink writes snappy, zstd or none")
    }
}

/// The `parquet` sink (docs/sinks.md §7.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetConfig {
    /// `s3://bucket/prefix` or a directory; `{table}`, `{pipeline}` filled in at the run.
    pub path: String,
    /// The bucket's region.
    pub s3_region: Option<String>,
    /// An S3 endpoint (path-style).
    pub s3_endpoint_url: Option<EndpointUrl>,
    /// Roll files at this size, MiB.
    pub target_file_mb: u32,
    /// Commit at least this often, seconds.
    pub commit_interval_secs: u32,
    /// The typed columns beside the key and the document (docs/sinks.md §7.9).
    pub columns: Vec<ColumnConfig>,
    /// What a value that does not fit its column does.
    pub on_type_mismatch: OnMismatch,
    /// How the files' pages are compressed.
    pub compression: FileCompression,
}

/// Reads the parquet sink's keys.
pub(crate) fn read(f: &mut Fields<'_>) -> ParquetConfig {
    let (columns, on_type_mismatch) = columns::read_typed(f);
    ParquetConfig {
        columns,
        on_type_mismatch,
        compression: f.or("compression", FileCompression::Snappy),
        path: f.required::<String>("path").unwrap_or_default(),
        s3_region: f.get("s3_region"),
        s3_endpoint_url: f.get("s3_endpoint_url"),
        target_file_mb: f.or("target_file_mb", DEFAULT_TARGET_FILE_MB),
        commit_interval_secs: f.or("commit_interval_secs", DEFAULT_COMMIT_INTERVAL_SECS),
    }
}

/// The parquet rules: a location ddbpipe can write (an s3:// URL or a directory), files of at
/// least 1 MiB.
pub(crate) fn validate(parquet: &ParquetConfig, errors: &mut Vec<ConfigError>) {
    if let Err(problem) = Location::parse(&parquet.path) {
        errors.push(ConfigError::new("sink.path", problem));
    }
    if parquet.target_file_mb == 0 {
        errors.push(ConfigError::new(
            "sink.target_file_mb",
            "a data file must be allowed at least 1 MiB",
        ));
    }
    columns::validate(
        Dialect::Lake,
        Some(DEFAULT_DOCUMENT_COLUMN),
        &parquet.columns,
        errors,
    );
}

/// A relative directory is relative to the pipeline file's directory.
pub(crate) fn anchor(config_dir: &Path, parquet: &mut ParquetConfig) {
    if let Ok(Location::Local(mut path)) = Location::parse(&parquet.path) {
        crate::yaml::anchor(config_dir, &mut path);
        parquet.path = path.display().to_string();
    }
}
