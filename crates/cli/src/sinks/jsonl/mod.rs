//! The jsonl sink (docs/sinks.md §7.1): its config section ([`config`]) and how a run builds
//! it ([`build`]); the writing is `ddbpipe_pipeline::sinks::jsonl`.

mod build;
mod config;

pub use build::{jsonl_settings, open_worker_file, worker_path};
pub(crate) use config::{FIELDS, read, validate};
pub use config::{JsonlConfig, JsonlTarget, WORKER_PLACEHOLDER, WriteMode};
