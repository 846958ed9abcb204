#![warn(missing_docs)]
//! The DynamoDB source of ddbpipe: parallel scans and queries, resumable per segment, with
//! one retry layer and a read-capacity governor.
//!
//! # Tour
//! - [`config::SourceConfig`]: the `source:` section of a pipeline file, validated.
//! - [`api::TableApi`]: the small trait the engine reads through; [`aws::AwsTableApi`]
//!   implements it with the AWS SDK, `fake::FakeTable` (feature `fake`) in memory.
//! - [`scan::SegmentReader`]: reads segments in parallel and hands on rendered pages with
//!   the cursor each page reaches.
//! - [`retry::RetryPolicy`]: classification by error code, backoff with jitter, budgets.
//! - [`capacity::ReadLimiter`]: the token bucket debited by consumed capacity.
//! - [`lease`]: several workers of one pipeline sharing its segments and shards through a
//!   DynamoDB lease table ([`lease::Worker`], [`lease::LeaseTable`]).
//! - [`plan`]: a validated config and the table's description built into the plan a run
//!   executes ([`plan::ScanPlan`], [`plan::StreamPlan`]), with the read-rate rule.
//!
//! # Layers
//! The top-level modules depend on each other in one direction, in this order: a module names
//! only modules listed before it, never one after it (a `pub use` counts too, so re-export only
//! from before). `crates/testkit/tests/module_circles.rs` fails on a circle.
//! 1. Leaves: `ids`, `key_schema`, `records`, `segments`, `clock`, `endpoint`, `health`, and
//!    `error` (every read error, an export's included).
//! 2. Forms: `position` (every stored position), `envelope` (stream records and the change
//!    envelope), `retry` (the one retry layer).
//! 3. Seams: `api` (the traits the engine reads through; it re-exports the record and key
//!    types it carries), `events` (typed telemetry).
//! 4. `capacity` (the read limiter), `lease` (the lease model, the lease table's trait),
//!    `wire` (DynamoDB's JSON decoded into records).
//! 5. The readers: `config`, `scan`, `export` (its files read as a scan's segments), `streams`
//!    (which repairs a gap by incremental exports).
//! 6. `aws` (the SDK behind `api`, `export::api` and `lease`), then the fakes: `fake`,
//!    `fake_export`, `fake_streams`.
//! 7. `plan`: a config and the table's description built into what a run executes.
//!
//! # Feature flags
//! - `fake`: the in-memory [`api::TableApi`], streams and exports used by tests of this and
//!   later crates.

pub mod api;
pub mod aws;
pub mod capacity;
pub mod clock;
pub mod config;
pub mod endpoint;
pub mod envelope;
pub mod error;
pub mod events;
pub mod export;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
#[cfg(any(test, feature = "fake"))]
pub mod fake_export;
#[cfg(any(test, feature = "fake"))]
pub mod fake_streams;
pub mod health;
pub mod ids;
pub mod key_schema;
pub mod lease;
pub mod plan;
pub mod position;
pub mod records;
pub mod retry;
pub mod scan;
pub mod segments;
pub mod streams;
mod wire;
