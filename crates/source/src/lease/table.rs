//! The lease table as the coordinator sees it: one small trait, one request per method.
//!
//! [`crate::aws::AwsLeaseTable`] implements it on DynamoDB with condition expressions,
//! `memory::MemoryLeaseTable` (feature `fake`) in memory with scripted faults.
//!
//! # Error handling
//! 1. A condition that failed is [`LeaseError::Conflict`]: someone else wrote the row since
//!    the counter the caller gave, or it exists already (create), or it is gone. A holder
//!    that gets it has lost the lease and stops that unit at once, without committing.
//! 2. A throttle or passing fault is [`LeaseError::Transient`]: the write may or may not have
//!    been applied (a timeout after the service applied it looks the same), so the holder
//!    settles it by reading the row before it writes again (docs/coordination.md §11.2 rule 4).
//! 3. Anything else is [`LeaseError::Fatal`]: a missing table, no permission, a row this
//!    version cannot read, a row whose counter cannot be advanced ([`CounterExhausted`]: no
//!    request is sent). Retrying cannot help: the run stops.

use std::future::Future;

use crate::error::{ApiError, ErrorClass};
use crate::position::LeaseCheckpoint;

use super::{CounterExhausted, Held, Lease, LeaseCounter, PipelineName, UnitId, WorkerId};

/// A lease request that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The condition failed (rule 1): the lease is lost, or someone else won the race.
    #[error("lease {unit} was written by someone else")]
    Conflict {
        /// The unit whose row did not match.
        unit: UnitId,
    },
    /// Transient (rule 2): throttled or a passing fault; the write may have been applied.
    #[error("lease request failed, may be retried: {0}")]
    Transient(ApiError),
    /// Definite (rule 3): retrying cannot change it.
    #[error("lease request failed: {0}")]
    Fatal(String),
}

impl From<CounterExhausted> for LeaseError {
    /// Definite (rule 3): the row cannot be written again until `state reset`.
    fn from(error: CounterExhausted) -> Self {
        LeaseError::Fatal(error.to_string())
    }
}

impl LeaseError {
    /// Whether the caller lost the lease or the race (rule 1).
    pub fn is_conflict(&self) -> bool {
        matches!(self, LeaseError::Conflict { .. })
    }

    /// How the retry layer treats it: a conflict is never retried.
    pub fn class(&self) -> ErrorClass {
        match self {
            LeaseError::Conflict { .. } | LeaseError::Fatal(_) => ErrorClass::Fatal,
            LeaseError::Transient(error) => error.class,
        }
    }

    /// A request's error classified by its code (rules 2 and 3); the caller has already
    /// turned a failed condition into [`LeaseError::Conflict`].
    pub fn of_api(error: ApiError) -> Self {
        match error.class {
            ErrorClass::Throttle | ErrorClass::Transient => LeaseError::Transient(error),
            ErrorClass::Fatal => LeaseError::Fatal(error.to_string()),
        }
    }
}

/// The lease rows of a table, one request attempt per method. Every write but
/// [`create`](Self::create) bumps the counter by one and is conditional on the counter the
/// caller gives (docs/coordination.md §11.2); each returns the row as written.
pub trait LeaseTable: Send + Sync + 'static {
    /// Every lease of `pipeline`, read consistently, in unit order.
    fn list(
        &self,
        pipeline: &PipelineName,
    ) -> impl Future<Output = Result<Vec<Lease>, LeaseError>> + Send;

    /// One lease, read consistently; `None` when it has no row.
    fn get(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
    ) -> impl Future<Output = Result<Option<Lease>, LeaseError>> + Send;

    /// Writes `lease` if its unit has no row yet; a row already there is a conflict.
    fn create(
        &self,
        pipeline: &PipelineName,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Makes `owner` the holder, if the counter is still `seen`.
    fn take(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        seen: LeaseCounter,
        owner: &WorkerId,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send;

    /// Bumps the counter, if `held` still holds it.
    fn renew(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send;

    /// Writes the unit's checkpoint and its state ([`LeaseState::of`]), if `held` still
    /// holds it; a finished state also clears the owner.
    fn checkpoint(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
        checkpoint: &LeaseCheckpoint,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send;

    /// Clears the owner, if `held` still holds it: the hand-back of a graceful stop.
    fn release(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
    ) -> impl Future<Output = Result<Lease, LeaseError>> + Send;

    /// Deletes the row, if the counter is still `seen`.
    fn delete(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        seen: LeaseCounter,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Now in unix ms, the `written_ms` of rows written (information only, §11.3). An
    /// in-memory table answers its own.
    fn clock_ms(&self) -> i64 {
        crate::clock::unix_now_ms()
    }
}
