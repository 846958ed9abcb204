//! What a lease row holds, and how each write changes it (docs/coordination.md §11.1, §11.2).
//!
//! Pure data: the in-memory table applies these transitions as they are, the DynamoDB table
//! sends each one as an update expression with the same effect.

use std::fmt;

use crate::position::LeaseCheckpoint;

use super::names::{UnitId, WorkerId};

/// The lease counter: bumped by every write, and every write is conditional on it
/// (§11.2). It is also the fencing token a keyed sink stores beside its position (§11.7):
/// every counter a new owner holds is greater than every counter an earlier owner held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseCounter(pub u64);

impl LeaseCounter {
    /// The largest counter a write may leave: the largest a keyed sink's fence stores (a
    /// signed 64-bit column). A row is never written past it; one edited beyond it is read,
    /// but cannot be written again.
    pub const MAX: LeaseCounter = LeaseCounter(i64::MAX.unsigned_abs());

    /// The counter a write conditional on this one leaves; `None` from [`Self::MAX`] on: a
    /// counter that stood still would be a fencing token two owners share, and a lease whose
    /// counter does not move looks expired to every other worker (§11.3).
    pub fn next(self) -> Option<Self> {
        if self < Self::MAX {
            Some(LeaseCounter(self.0 + 1))
        } else {
            None
        }
    }

    /// [`Self::next`], or the error naming `unit`'s row when the counter cannot move on.
    pub fn after(self, unit: &UnitId) -> Result<Self, CounterExhausted> {
        self.next().ok_or_else(|| CounterExhausted {
            unit: unit.clone(),
            counter: self,
        })
    }
}

/// Definite: a lease row whose counter cannot be advanced (it stands at [`LeaseCounter::MAX`]
/// or beyond, which only an edit by hand can do). Nobody can take, renew or checkpoint it, so
/// the run stops instead of waiting for the unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "lease row '{unit}' holds counter {counter}, and a lease counter cannot go past {}: the row \
     cannot be taken, renewed or checkpointed again. Stop the workers and run `ddbpipe state \
     reset` (it deletes the pipeline's lease rows and fences: the next run starts its units \
     afresh)",
    LeaseCounter::MAX
)]
pub struct CounterExhausted {
    /// The row's unit.
    pub unit: UnitId,
    /// Its counter.
    pub counter: LeaseCounter,
}

impl fmt::Display for LeaseCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a unit's lease stands (§11.1). `Pending → Processing → ShardEnd | Done`.
///
/// ```text
///   create ──► Pending ──checkpoint──► Processing ──final checkpoint──► ShardEnd (shard)
///                 └────────────────────────┴─────────────────────────► Done (segment)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseState {
    /// Created; no checkpoint written yet.
    Pending,
    /// At least one checkpoint written; the unit is not read to its end.
    Processing,
    /// A shard read to its end, its last record acknowledged and checkpointed: its children
    /// may be taken (§11.6).
    ShardEnd,
    /// A scan segment read to its last page.
    Done,
}

impl LeaseState {
    /// Whether the unit is read to its end: nobody takes it again, and it holds no child back.
    pub fn is_finished(self) -> bool {
        matches!(self, LeaseState::ShardEnd | LeaseState::Done)
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Pending => "Pending",
            LeaseState::Processing => "Processing",
            LeaseState::ShardEnd => "ShardEnd",
            LeaseState::Done => "Done",
        }
    }

    /// The state of a row at `checkpoint`: finished at an end, `Pending` at a first run's
    /// start (`Latest`) or a shard with nothing read that keeps its verification (`Verified`),
    /// else `Processing`.
    pub fn of(checkpoint: &LeaseCheckpoint) -> LeaseState {
        match checkpoint {
            LeaseCheckpoint::Done => LeaseState::Done,
            LeaseCheckpoint::ShardEnd => LeaseState::ShardEnd,
            LeaseCheckpoint::Latest { .. } | LeaseCheckpoint::Verified { .. } => {
                LeaseState::Pending
            }
            LeaseCheckpoint::Cursor(_)
            | LeaseCheckpoint::After { .. }
            | LeaseCheckpoint::Settings(_)
            | LeaseCheckpoint::Unknown(_) => LeaseState::Processing,
        }
    }

    /// The state a stored name stands for.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "Pending" => Some(LeaseState::Pending),
            "Processing" => Some(LeaseState::Processing),
            "ShardEnd" => Some(LeaseState::ShardEnd),
            "Done" => Some(LeaseState::Done),
            _ => None,
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One lease row (docs/coordination.md §11.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The unit the lease is for.
    pub unit: UnitId,
    /// Its holder; `None` when nobody holds it (new, handed back, or finished).
    pub owner: Option<WorkerId>,
    /// Bumped by every write (§11.2); also the fencing token (§11.7).
    pub counter: LeaseCounter,
    /// Where the unit stands; `None` before the first checkpoint.
    pub checkpoint: Option<LeaseCheckpoint>,
    /// The units that must be finished before this one is taken (§11.6): a shard's parent.
    pub parents: Vec<UnitId>,
    /// Where the unit stands.
    pub state: LeaseState,
    /// How often the owner changed since the last checkpoint (KCL's
    /// `ownerSwitchesSinceCheckpoint`): a unit that keeps changing hands without progress.
    pub owner_switches: u64,
    /// The writer's wall clock at the last write, unix ms. For people reading the table;
    /// expiry never looks at it (§11.3).
    pub written_ms: i64,
}

impl Lease {
    /// A new row for `unit`: nobody holds it, counter 0, no checkpoint.
    pub fn new(unit: UnitId, parents: Vec<UnitId>, now_ms: i64) -> Self {
        Lease {
            unit,
            owner: None,
            counter: LeaseCounter(0),
            checkpoint: None,
            parents,
            state: LeaseState::Pending,
            owner_switches: 0,
            written_ms: now_ms,
        }
    }

    /// The settings the leader row keeps (docs/coordination.md §11.10); `None` on other rows.
    pub fn settings(&self) -> Option<&str> {
        match &self.checkpoint {
            Some(LeaseCheckpoint::Settings(text)) => Some(text),
            _ => None,
        }
    }

    /// Why the worker that takes this row will stop, when it will: an unfinished unit whose
    /// checkpoint no form of its kind reads (`check` says so as the run does).
    pub fn unreadable(&self) -> Option<String> {
        match &self.checkpoint {
            Some(at @ LeaseCheckpoint::Unknown(_))
                if self.unit.is_work() && !self.state.is_finished() =>
            {
                Some(self.unit.unreadable(at))
            }
            _ => None,
        }
    }

    /// Whether `worker` holds it.
    pub fn is_owned_by(&self, worker: &WorkerId) -> bool {
        self.owner.as_ref() == Some(worker)
    }

    /// After a take by `owner` (conditional on the counter seen). Every take counts as an
    /// owner switch, a re-take under the same id (a restarted worker) too.
    pub fn taken(&self, owner: &WorkerId, now_ms: i64) -> Result<Lease, CounterExhausted> {
        Ok(Lease {
            owner: Some(owner.clone()),
            counter: self.counter.after(&self.unit)?,
            owner_switches: self.owner_switches.saturating_add(1),
            written_ms: now_ms,
            ..self.clone()
        })
    }

    /// After a renewal: only the counter moves.
    pub fn renewed(&self, now_ms: i64) -> Result<Lease, CounterExhausted> {
        Ok(Lease {
            counter: self.counter.after(&self.unit)?,
            written_ms: now_ms,
            ..self.clone()
        })
    }

    /// After a checkpoint: position and its state written, owner switches reset; a finished
    /// state also clears the owner (§11.7 rule 2).
    pub fn checkpointed(
        &self,
        checkpoint: &LeaseCheckpoint,
        now_ms: i64,
    ) -> Result<Lease, CounterExhausted> {
        let state = LeaseState::of(checkpoint);
        Ok(Lease {
            owner: if state.is_finished() {
                None
            } else {
                self.owner.clone()
            },
            counter: self.counter.after(&self.unit)?,
            checkpoint: Some(checkpoint.clone()),
            state,
            owner_switches: 0,
            written_ms: now_ms,
            ..self.clone()
        })
    }

    /// After a hand-back: nobody holds it, anyone may take it at once (§11.7 rule 3).
    pub fn released(&self, now_ms: i64) -> Result<Lease, CounterExhausted> {
        Ok(Lease {
            owner: None,
            counter: self.counter.after(&self.unit)?,
            written_ms: now_ms,
            ..self.clone()
        })
    }
}

/// What the holder of a lease conditions its writes on: its id and the counter it last wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The holder.
    pub owner: WorkerId,
    /// The counter its last successful write left.
    pub counter: LeaseCounter,
}

/// A unit the leader found: its id and the units that must finish before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// The unit.
    pub unit: UnitId,
    /// Its parents (a shard's `ParentShardId`); empty for segments and root shards.
    pub parents: Vec<UnitId>,
    /// The checkpoint its row is created with: `None` to start the unit at its beginning, or
    /// where a first run starts it (a shard read from `latest`, docs/coordination.md §11.11).
    pub checkpoint: Option<LeaseCheckpoint>,
    /// The state its row is created with: `Pending`, or finished for a shard a first run
    /// skips (closed before a `latest` run began).
    pub state: LeaseState,
}

impl UnitSpec {
    /// `unit` after `parents`, its row created unowned, `Pending`, without a checkpoint.
    pub fn new(unit: UnitId, parents: Vec<UnitId>) -> UnitSpec {
        UnitSpec {
            unit,
            parents,
            checkpoint: None,
            state: LeaseState::Pending,
        }
    }

    /// The `total` segments of a parallel scan, none with a parent.
    pub fn segments(total: u32) -> Vec<UnitSpec> {
        (0..total)
            .map(|index| UnitSpec {
                unit: UnitId::Segment { index, total },
                parents: Vec::new(),
                checkpoint: None,
                state: LeaseState::Pending,
            })
            .collect()
    }

    /// A shard and its parent, as `DescribeStream` lists them.
    pub fn shard(shard: &crate::api::ShardDescription) -> UnitSpec {
        UnitSpec {
            unit: UnitId::Shard(shard.id.clone()),
            parents: shard
                .parent
                .iter()
                .map(|parent| UnitId::Shard(parent.clone()))
                .collect(),
            checkpoint: None,
            state: LeaseState::Pending,
        }
    }

    /// The same unit, its row created at `checkpoint`, in that checkpoint's state.
    pub fn starting(self, checkpoint: LeaseCheckpoint) -> UnitSpec {
        UnitSpec {
            state: LeaseState::of(&checkpoint),
            checkpoint: Some(checkpoint),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ShardId;

    fn worker(id: &str) -> WorkerId {
        WorkerId::new(id).unwrap()
    }

    #[test]
    fn every_transition_bumps_the_counter_by_one() {
        let lease = Lease::new(UnitId::Leader, Vec::new(), 0);
        let a = worker("a");
        let taken = lease.taken(&a, 1).unwrap();
        assert_eq!((taken.counter, taken.owner_switches), (LeaseCounter(1), 1));
        assert_eq!(taken.renewed(2).unwrap().counter, LeaseCounter(2));
        assert_eq!(taken.released(2).unwrap().counter, LeaseCounter(2));
        assert_eq!(taken.released(2).unwrap().owner, None);
        let at = LeaseCheckpoint::after(crate::ids::SequenceNumber::parse("7").unwrap());
        let checkpointed = taken.checkpointed(&at, 3).unwrap();
        assert_eq!(checkpointed.state, LeaseState::Processing);
        assert_eq!(checkpointed.counter, LeaseCounter(2));
        assert_eq!(checkpointed.owner_switches, 0);
        assert_eq!(checkpointed.owner, Some(a.clone()));
        assert_eq!(
            taken.taken(&a, 4).unwrap().owner_switches,
            2,
            "a re-take is a switch too"
        );
    }

    #[test]
    fn a_counter_at_its_largest_is_not_written_again() {
        let unit = UnitId::Segment { index: 3, total: 8 };
        let a = worker("a");
        let mut lease = Lease::new(unit.clone(), Vec::new(), 0);
        lease.counter = LeaseCounter(LeaseCounter::MAX.0 - 1);
        let last = lease.taken(&a, 1).unwrap();
        assert_eq!(
            last.counter,
            LeaseCounter::MAX,
            "the last counter is still written"
        );
        for edited in [LeaseCounter::MAX, LeaseCounter(u64::MAX)] {
            let row = Lease {
                counter: edited,
                ..last.clone()
            };
            let exhausted = CounterExhausted {
                unit: unit.clone(),
                counter: edited,
            };
            assert_eq!(row.taken(&a, 2), Err(exhausted.clone()));
            assert_eq!(row.renewed(2), Err(exhausted.clone()));
            assert_eq!(row.released(2), Err(exhausted.clone()));
            assert_eq!(
                row.checkpointed(&LeaseCheckpoint::Done, 2),
                Err(exhausted.clone())
            );
            let said = exhausted.to_string();
            assert!(
                said.contains("'segment:3/8'")
                    && said.contains(&edited.to_string())
                    && said.contains("state reset"),
                "{said}"
            );
        }
    }

    /// `check` refuses what a taking worker stops on: an unfinished unit's checkpoint that no
    /// form of its kind reads; a finished row is never taken, the leader's settings are not a
    /// position.
    #[test]
    fn an_unfinished_units_unreadable_checkpoint_is_named() {
        let row = |unit: &str, text: &str, state: LeaseState| {
            let unit: UnitId = unit.parse().unwrap();
            let mut lease = Lease::new(unit.clone(), Vec::new(), 0);
            lease.checkpoint = Some(unit.checkpoint(text));
            lease.state = state;
            lease
        };
        let said = row("segment:2/8", "after:1", LeaseState::Processing)
            .unreadable()
            .unwrap();
        assert!(
            said.contains("lease segment:2/8")
                && said.contains("'after:1'")
                && said.contains("segment's cursor"),
            "{said}"
        );
        let said = row("shard:s1", "done", LeaseState::Processing)
            .unreadable()
            .unwrap();
        assert!(said.contains("shard's position"), "{said}");
        assert_eq!(
            row("shard:s1", "after:1", LeaseState::Processing).unreadable(),
            None
        );
        assert_eq!(
            row("segment:2/8", "after:1", LeaseState::Done).unreadable(),
            None
        );
        assert_eq!(
            row("leader", "{}", LeaseState::Processing).unreadable(),
            None
        );
    }

    #[test]
    fn a_finished_checkpoint_clears_the_owner() {
        let unit = UnitId::Shard(ShardId::new("s"));
        let lease = Lease::new(unit.clone(), Vec::new(), 0)
            .taken(&worker("a"), 1)
            .unwrap();
        let ended = lease.checkpointed(&unit.end(), 2).unwrap();
        assert_eq!((ended.owner, ended.state), (None, LeaseState::ShardEnd));
        assert!(ended.state.is_finished() && !LeaseState::Processing.is_finished());
        for state in [
            LeaseState::Pending,
            LeaseState::Processing,
            LeaseState::ShardEnd,
            LeaseState::Done,
        ] {
            assert_eq!(LeaseState::parse(state.as_str()), Some(state));
        }
    }
}
