//! The parquet sink (docs/sinks.md §7.10): its section, and how a run builds it.

mod build;
mod config;

pub use build::{location, open_parquet, positions_reader, reading_objects, shape};
pub use config::ParquetConfig;
pub(crate) use config::{FIELDS, S3_ENDPOINT_URL, S3_REGION, anchor, read, validate};
