//! The lake destinations of ddbpipe (docs/sinks.md §7.10): Parquet files on S3 or in a local
//! directory, committed exactly once through a commit log that also keeps the position.
//!
//! - `objects`: a local directory or an S3 prefix behind one set of operations.
//! - `rows`: records as Arrow rows of the lake's columns.
//! - `commits`: the commit log, the orphan rule, the fence between two runs.
//! - `parquet`: the sink and its position store.

pub mod commits;
pub mod objects;
pub mod parquet;
pub mod rows;
