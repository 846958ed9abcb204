//! The lake destinations of ddbpipe (docs/sinks.md §7.10, §7.11): Parquet files on S3 or in a
//! local directory, committed exactly once through a commit log that also keeps the position,
//! or as the snapshots of an Iceberg table.
//!
//! - `objects`: a local directory or an S3 prefix behind one set of operations.
//! - `rows`: records as Arrow rows of the lake's columns.
//! - `partition`: `partition_by` as an Iceberg partition spec; rows split by partition.
//! - `commits`: the commit log, the orphan rule, the fence between two runs.
//! - `failure`: a failed step and the class a run reports for it.
//! - `metrics`: a Parquet file's column counts and bounds, as an Iceberg data file keeps them.
//! - `parquet`: the sink and its position store.
//! - `iceberg`: the Iceberg table the sink commits to instead of a commit log: its SQL
//!   catalog, its storage (the lake's objects), its snapshots.

pub mod commits;
mod failure;
pub mod iceberg;
pub mod metrics;
pub mod objects;
pub mod parquet;
pub mod partition;
pub mod rows;
