//! ddbpipe: get data out of Amazon DynamoDB — whole tables, key ranges and every change as it
//! happens — into JSON Lines, SQLite, PostgreSQL or a sink of your own, resumable at any
//! instant.
//!
//! This crate is both the `ddbpipe` command and the library it is built on. The library runs
//! the pipelines the command runs, from the same YAML, with the same behaviour in every mode:
//! scan, query, streams and mirror, export snapshots and repairs, one process or one worker of
//! several.
//!
//! # 1. Run a pipeline file
//! ```no_run
//! # async fn example() -> Result<(), ddbpipe::Error> {
//! let pipeline = ddbpipe::Pipeline::from_path("orders.yaml")?;
//! let (handle, stop) = ddbpipe::Cancel::new(); // handle.cancel() stops the run cleanly
//! let summary = pipeline.run(stop).await?;
//! println!("{summary}"); // the sentence `ddbpipe run` prints
//! # drop(handle);
//! # Ok(())
//! # }
//! ```
//! A config with problems comes back as one [`Error`] listing all of them
//! ([`Error::config_errors`]); a failed run as an [`Error`] of [`ErrorKind::Runtime`] whose
//! [`Error::hint`] says whether a rerun resumes. A run stopped through its [`Cancel`] saved
//! what was acknowledged and ends with [`Ended::Stopped`].
//!
//! # 2. Bring your own sink and checkpoint store
//! With `sink: {type: custom}` in the config, [`Pipeline::with_sink`] sends the records to a
//! [`sink::Sink`] of yours: each batch comes as parsed [`sink::Record`]s, and returning `Ok`
//! acknowledges it. [`Pipeline::with_checkpoint_store`] keeps the position in a
//! [`store::CheckpointStore`] of yours instead of the state file.
//! ```no_run
//! use ddbpipe::sink::{Batch, Sink, SinkError};
//!
//! struct Print;
//!
//! impl Sink for Print {
//!     fn describe(&self) -> String {
//!         "stdout".into()
//!     }
//!
//!     async fn write(&mut self, batch: &Batch) -> Result<(), SinkError> {
//!         for record in batch.records() {
//!             println!("{:?} {}", record.op(), String::from_utf8_lossy(record.json()));
//!         }
//!         Ok(()) // durable: the position may advance past this batch
//!     }
//! }
//!
//! # async fn example() -> Result<(), ddbpipe::Error> {
//! let yaml = "name: orders\nsource: {table_name: orders, mode: streams}\nsink: {type: custom}\n";
//! let summary = ddbpipe::Pipeline::from_yaml(yaml, ".")?
//!     .with_sink(Print)
//!     .run(ddbpipe::Cancel::never())
//!     .await?;
//! # Ok(())
//! # }
//! ```
//! [`Pipeline::with_sdk_config`] builds every AWS client from your own `SdkConfig`.
//!
//! # 3. Drive the reading yourself
//! [`Pipeline::batches`] hands the batches to your own loop instead of a sink: each
//! [`drive::Batch`] is done when you call [`drive::Batch::ack`] — in any order, from any task.
//! The position saved is the acknowledged prefix of each scan segment and stream shard (a
//! child shard after its parent); at most [`Pipeline::with_ack_window`] batches are held, and
//! reading waits while they are. A batch dropped unacknowledged fails the run; a stop saves
//! what was acknowledged ([`drive`] says it all).
//! ```no_run
//! # async fn example() -> Result<(), ddbpipe::Error> {
//! let yaml = "name: orders\nsource: {table_name: orders, segments: 4}\nsink: {type: custom}\n";
//! let (handle, stop) = ddbpipe::Cancel::new(); // handle.cancel() ends the batches
//! let mut batches = ddbpipe::Pipeline::from_yaml(yaml, ".")?.batches(stop).await?;
//! while let Some(batch) = batches.next().await {
//!     let batch = batch?; // a failed run ends the batches with its error
//!     for record in batch.records() {
//!         println!("{:?} {:?}", record.op(), record.item());
//!     }
//!     batch.ack(); // or later, from another task
//! }
//! let summary = batches.finish().await?; // how the run ended
//! # drop(handle);
//! # Ok(())
//! # }
//! ```
//!
//! # What a resume checks
//! A stored position carries the identity of what made it (docs/state.md §6.2): the table, its
//! region, endpoint and account, the mode, the read (index, key condition, filter, segments,
//! projection, value format) and where the records went. A run whose config differs in any of
//! these refuses to resume ([`ErrorKind::Config`]), naming each field that changed, instead of
//! reading from a position that means something else; the remedy is to put the field back or
//! to reset the pipeline's position.
//!
//! # Stability
//! Public and kept stable within a minor version: the items re-exported at the crate root and
//! the `sink`, `store` and `drive` modules. The internal crates (`ddbpipe-source`, `ddbpipe-pipeline`,
//! `ddbpipe-keyed`, `ddbpipe-value`) and `cli`, the command's own entry point hidden from these
//! docs, may change in any release before 1.0. Examples: `crates/cli/examples/`, each run by
//! the test suite.

mod args;
mod check;
#[doc(hidden)]
pub mod cli;
mod config;
#[cfg(feature = "demo")]
mod demo;
mod destination;
mod discover;
pub mod drive;
mod error;
mod export;
mod failure;
mod generate;
mod given;
mod init;
mod lag;
mod lease_names;
mod library;
mod origin;
mod run;
mod run_command;
mod schema;
pub mod sink;
mod sinks;
mod state_cmd;
pub mod store;
mod stream_gaps;
mod summary;
mod telemetry;
mod unlisted;
mod wiring;
mod yaml;

pub use ddbpipe_source::config::ConfigError;
pub use ddbpipe_source::retry::{Cancel, CancelHandle};
pub use drive::Batches;
pub use library::{Ended, Error, ErrorKind, Opened, Pipeline, ProgressMode, Summary};
