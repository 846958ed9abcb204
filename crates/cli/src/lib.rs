//! ddbpipe: get data out of Amazon DynamoDB — whole tables, key ranges and every change as it
//! happens — into JSON Lines, SQLite or PostgreSQL, resumable at any instant.
//!
//! This crate is both the `ddbpipe` command and the library it is built on. The library runs
//! the pipelines the command runs, from the same YAML, with the same behaviour.
//!
//! # Run a pipeline
//! ```no_run
//! # async fn example() -> Result<(), ddbpipe::Error> {
//! let pipeline = ddbpipe::Pipeline::from_path("orders.yaml")?;
//! let (_handle, stop) = ddbpipe::Cancel::new();
//! let summary = pipeline.run(stop).await?;
//! println!("{summary}");
//! # Ok(())
//! # }
//! ```
//!
//! # Stability
//! Public and kept stable within a minor version: the items re-exported at the crate root.
//! `cli` is the command's own entry point, hidden from these docs and not part of the library.

mod args;
mod check;
#[doc(hidden)]
pub mod cli;
mod config;
#[cfg(feature = "demo")]
mod demo;
mod destination;
mod discover;
mod export;
mod failure;
mod generate;
mod given;
mod init;
mod lag;
mod library;
mod run;
mod run_command;
mod schema;
pub mod sink;
mod state_cmd;
pub mod store;
mod stream_gaps;
mod summary;
mod telemetry;
mod wiring;

pub use ddbpipe_source::config::ConfigError;
pub use ddbpipe_source::retry::{Cancel, CancelHandle};
pub use library::{Ended, Error, ErrorKind, Pipeline, ProgressMode, Summary};
