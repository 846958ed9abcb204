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
