//! Who and what a lease row names (docs/coordination.md §11.1): the pipeline its leases are
//! kept under, the worker holding it, and the unit of work it is for (its sort key).

use std::fmt;
use std::str::FromStr;

use crate::ids::ShardId;
use crate::position::{CheckpointKind, LeaseCheckpoint};

use super::model::LeaseState;

/// The name a pipeline's leases are kept under: the lease table's partition key, so several
/// pipelines can share one table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PipelineName(String);

/// A worker id or pipeline name that is empty, or longer than a DynamoDB key may be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} must be 1 to 1024 bytes, not {len}")]
pub struct BadName {
    /// What was named: "pipeline name" or "worker id".
    pub what: &'static str,
    /// Its length in bytes.
    pub len: usize,
}

fn checked(what: &'static str, name: String) -> Result<String, BadName> {
    if name.is_empty() || name.len() > 1024 {
        Err(BadName {
            what,
            len: name.len(),
        })
    } else {
        Ok(name)
    }
}

impl PipelineName {
    /// A pipeline name: 1 to 1024 bytes.
    pub fn new(name: impl Into<String>) -> Result<Self, BadName> {
        checked("pipeline name", name.into()).map(PipelineName)
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PipelineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds a lease: unique among the live workers of a pipeline (default
/// `<hostname>-<pid>`). A lease owner written by the CLI is one process's: the configured id,
/// `#`, and a token of that process ([`WorkerId::of_process`]), so two processes started with
/// one configured id never take each other's leases for their own, and each write is fenced
/// per process (docs/coordination.md §11.2 rule 6). A row written by an earlier version names
/// the configured id alone; it is read as another process's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(String);

/// What separates the configured id from the process token in a lease owner.
const PROCESS_SEPARATOR: char = '#';

impl WorkerId {
    /// A worker id: 1 to 1024 bytes.
    pub fn new(id: impl Into<String>) -> Result<Self, BadName> {
        checked("worker id", id.into()).map(WorkerId)
    }

    /// The lease owner of one process running as this worker: `<id>#<process>`. `process`
    /// tells this process apart from every other started with the same id (the CLI's is
    /// `<host>/<pid>/<random hex>`: nothing secret).
    pub fn of_process(&self, process: &str) -> Result<Self, BadName> {
        WorkerId::new(format!("{}{PROCESS_SEPARATOR}{process}", self.name()))
    }

    /// The whole owner, process token included.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The configured id: the owner without its process token (metrics label workers by it).
    pub fn name(&self) -> &str {
        self.0
            .split_once(PROCESS_SEPARATOR)
            .map_or(self.0.as_str(), |(name, _)| name)
    }

    /// The process token, when the owner has one.
    pub fn process(&self) -> Option<&str> {
        self.0
            .split_once(PROCESS_SEPARATOR)
            .map(|(_, process)| process)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One unit of work, the sort key of its lease row (docs/coordination.md §11.1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnitId {
    /// The leader lease: its holder discovers units and creates their rows (§11.5). Not work:
    /// it counts for no worker's share. Written `leader`.
    Leader,
    /// Scan segment `index` of `total`. Written `segment:<index>/<total>`.
    Segment {
        /// The segment, from 0.
        index: u32,
        /// `TotalSegments`.
        total: u32,
    },
    /// A stream shard. Written `shard:<shard id>`.
    Shard(ShardId),
    /// The presence of the live process running as a worker id (its configured name, without
    /// the process token): held and renewed by that process like a lease, so a second process
    /// started with the id sees it live even when it holds no unit (§11.2 rule 7). Not work.
    /// Written `worker:<id>`.
    Worker(String),
}

impl UnitId {
    /// Whether this is a unit of work (a segment or a shard), not the leader lease nor a
    /// worker's presence.
    pub fn is_work(&self) -> bool {
        matches!(self, UnitId::Segment { .. } | UnitId::Shard(_))
    }

    /// The presence row of the processes running as `worker` (§11.2 rule 7).
    pub fn presence(worker: &WorkerId) -> UnitId {
        UnitId::Worker(worker.name().to_string())
    }

    /// Which checkpoints its row holds (`crate::position::LeaseCheckpoint`).
    pub fn checkpoint_kind(&self) -> CheckpointKind {
        match self {
            UnitId::Leader => CheckpointKind::Leader,
            UnitId::Segment { .. } => CheckpointKind::Segment,
            UnitId::Shard(_) => CheckpointKind::Shard,
            UnitId::Worker(_) => CheckpointKind::Presence,
        }
    }

    /// The checkpoint its row stores as `text`.
    pub fn checkpoint(&self, text: &str) -> LeaseCheckpoint {
        LeaseCheckpoint::decode(self.checkpoint_kind(), text)
    }

    /// Why a worker cannot read this unit from `at`: the row, its text, the forms it takes and
    /// what to do.
    pub fn unreadable(&self, at: &LeaseCheckpoint) -> String {
        at.unreadable(self, self.checkpoint_kind().forms())
    }

    /// The checkpoint of this unit read to its end: `ShardEnd` for a shard, `Done` for a
    /// segment.
    pub fn end(&self) -> LeaseCheckpoint {
        match self {
            UnitId::Shard(_) => LeaseCheckpoint::ShardEnd,
            UnitId::Leader | UnitId::Segment { .. } | UnitId::Worker(_) => LeaseCheckpoint::Done,
        }
    }

    /// The state a unit's lease reaches when the unit is read to its end: `ShardEnd` for a
    /// shard, `Done` for a segment (§11.1).
    pub fn end_state(&self) -> LeaseState {
        match self {
            UnitId::Shard(_) => LeaseState::ShardEnd,
            UnitId::Leader | UnitId::Segment { .. } | UnitId::Worker(_) => LeaseState::Done,
        }
    }
}

impl fmt::Display for UnitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitId::Leader => f.write_str("leader"),
            UnitId::Segment { index, total } => write!(f, "segment:{index}/{total}"),
            UnitId::Shard(shard) => write!(f, "shard:{shard}"),
            UnitId::Worker(id) => write!(f, "worker:{id}"),
        }
    }
}

/// A sort key that names no unit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a lease unit (leader, segment:<i>/<n>, shard:<id> or worker:<id>)")]
pub struct BadUnit(pub String);

impl FromStr for UnitId {
    type Err = BadUnit;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadUnit(text.to_string());
        if text == "leader" {
            return Ok(UnitId::Leader);
        }
        if let Some(shard) = text.strip_prefix("shard:") {
            return if shard.is_empty() {
                Err(bad())
            } else {
                Ok(UnitId::Shard(ShardId::new(shard)))
            };
        }
        if let Some(worker) = text.strip_prefix("worker:") {
            return if worker.is_empty() {
                Err(bad())
            } else {
                Ok(UnitId::Worker(worker.to_string()))
            };
        }
        let segment = text.strip_prefix("segment:").ok_or_else(bad)?;
        let (index, total) = segment.split_once('/').ok_or_else(bad)?;
        let index: u32 = index.parse().map_err(|_| bad())?;
        let total: u32 = total.parse().map_err(|_| bad())?;
        if index >= total {
            return Err(bad());
        }
        Ok(UnitId::Segment { index, total })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: &str) -> WorkerId {
        WorkerId::new(id).unwrap()
    }

    #[test]
    fn unit_ids_round_trip_through_their_sort_key() {
        for unit in [
            UnitId::Leader,
            UnitId::Segment { index: 3, total: 8 },
            UnitId::Shard(ShardId::new("shardId-0001-ab")),
            UnitId::Worker("host-1".into()),
        ] {
            assert_eq!(unit.to_string().parse::<UnitId>(), Ok(unit));
        }
        for bad in [
            "",
            "segment:8/8",
            "segment:1",
            "segment:a/2",
            "shard:",
            "shards:x",
            "worker:",
        ] {
            assert!(bad.parse::<UnitId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_process_owner_is_its_worker_id_and_a_token() {
        let id = worker("host-1");
        let one = id.of_process("host-a/4242/9f3c1a2b").unwrap();
        let other = id.of_process("host-b/4242/0b1c2d3e").unwrap();
        assert_eq!(one.as_str(), "host-1#host-a/4242/9f3c1a2b");
        assert_ne!(one, other, "one id, two processes, two owners");
        assert_eq!((one.name(), other.name()), ("host-1", "host-1"));
        assert_eq!(one.process(), Some("host-a/4242/9f3c1a2b"));
        assert_eq!(one.of_process("p").unwrap().as_str(), "host-1#p");
        // A row of an earlier version names the id alone.
        assert_eq!((id.name(), id.process()), ("host-1", None));
    }

    #[test]
    fn names_are_one_to_1024_bytes() {
        assert!(WorkerId::new("").is_err());
        assert!(PipelineName::new("x".repeat(1025)).is_err());
        assert_eq!(PipelineName::new("orders").unwrap().as_str(), "orders");
    }
}
