//! Several workers of one pipeline share its scan segments and stream shards through a lease
//! table in DynamoDB, the way KCL does: conditional writes on a lease counter, expiry by each
//! worker's own clock, parents before children (docs/coordination.md §11).
//!
//! # Tour
//! - `names`: who and what a row names: [`PipelineName`], [`WorkerId`], [`UnitId`].
//! - [`model`]: a lease row ([`Lease`]), its [`LeaseState`] and [`LeaseCounter`] (the
//!   fencing token), and what each write does to a row.
//! - [`LeaseTable`]: the small trait the coordinator writes through;
//!   [`crate::aws::AwsLeaseTable`] implements it on DynamoDB, `memory::MemoryLeaseTable`
//!   (feature `fake`) in memory with seeded faults.
//! - [`decide`]: the decisions as plain functions (expiry, fair share, takes, steals, the
//!   leader's creates and deletes).
//! - [`Worker`]: the thin async loop around them, driven by the caller's clock.
//! - [`LeaseKeeper`]: renews a worker's leases on a timer of its own, apart from the caller's
//!   data plane; the writes to one lease are ordered whoever sends them (`holdings.rs`).
//!
//! # Rules (docs/coordination.md)
//! 1. Every write but a create is conditional on the counter the writer last saw or wrote,
//!    and bumps it by one (§11.2). A holder whose write fails its condition has lost the
//!    lease: it stops the unit at once, without committing.
//! 2. A lease is expired for a worker when its counter has not changed for a lease duration
//!    of that worker's monotonic clock (§11.3); wall clocks are never compared. A holder that
//!    has not written a lease for a duration stops using it.
//! 3. Each round renews, lists, takes free leases up to the fair share, and steals at most
//!    one per round from the busiest worker (§11.4).
//! 4. The leader lease's holder creates rows for discovered units, parents first (§11.5).
//! 5. A unit is taken only once every parent that has a row is finished (§11.6).
//! 6. A checkpoint is a conditional write; a finished unit's lease is handed back with its
//!    last checkpoint; the counter is the fencing token of keyed sinks (§11.7).
//!
//! # Example
//! ```
//! # #[cfg(feature = "fake")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ddbpipe_source::lease::memory::MemoryLeaseTable;
//! use ddbpipe_source::lease::{LeaseSettings, LocalTime, PipelineName, UnitSpec, Worker, WorkerId};
//!
//! let table = MemoryLeaseTable::seeded(1);
//! let pipeline = PipelineName::new("orders")?;
//! let settings = LeaseSettings::new(10)?;
//! let mut worker = Worker::new(table, pipeline, WorkerId::new("host-1")?, settings);
//! worker.round(LocalTime::from_millis(0)).await?; // creates and takes the leader lease
//! worker.sync(&UnitSpec::segments(4)).await?; // the leader writes the units' rows
//! let report = worker.round(LocalTime::from_millis(3_333)).await?;
//! for taken in &report.taken {
//!     // start taken.unit after taken.checkpoint, fenced by taken.counter
//! }
//! # Ok(()) }
//! ```

pub mod decide;
mod holdings;
mod keeper;
#[cfg(any(test, feature = "fake"))]
pub mod memory;
pub mod model;
mod names;
mod table;
mod worker;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use decide::LocalTime;
pub use keeper::{KeeperEvent, KeeperHandle, KeeperPass, LeaseKeeper};
pub use model::{CounterExhausted, Held, Lease, LeaseCounter, LeaseState, UnitSpec};
pub use names::{BadName, BadUnit, PipelineName, UnitId, WorkerId};
pub use table::{LeaseError, LeaseTable};
pub use worker::{
    BadLeaseDuration, CheckpointError, LeaseSettings, Lost, LostReason, RoundReport, SyncReport,
    Taken, Worker,
};
