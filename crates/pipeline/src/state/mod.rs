//! Stored positions: the versioned JSON state file, its lock, identity checks.
//!
//! # Format (docs/state.md §6.1)
//! `{"format":"ddbpipe-state","pipelines":{<name>:{fingerprint, identity, last_completed,
//! position, updated_at}},"version":1}`. One file may hold several pipelines; a run changes
//! only its own entry.
//!
//! # Writing
//! To `<file>.tmp` in the same directory, `fsync`, rename over the file, `fsync` the directory:
//! a reader sees the old file or the new one, never half of one.
//!
//! # Corruption
//! Unreadable JSON, unknown fields, wrong types, another `version` or an undecodable cursor
//! stop the run with the file, the pipeline and the JSON path. Corrupt state is never
//! overwritten; `state reset` removes the broken entry (or moves an unreadable file aside).

mod file;
pub mod identity;

pub use file::{Entry, StateError, StateFile, StateLock};
