//! The parquet and iceberg sinks (docs/sinks.md §7.10, §7.11): their sections, and how a run
//! builds them.

mod build;
mod config;

pub use build::{
    Placed, describe_catalog, location, open_parquet, positions_reader, reading_objects, shape,
    stored_name,
};
pub use config::{CatalogType, IcebergConfig, ParquetConfig};
pub(crate) use config::{
    FIELDS, ICEBERG_FIELDS, S3_ENDPOINT_URL, S3_REGION, anchor, read, read_iceberg, validate,
};
