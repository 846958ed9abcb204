//! The coordinator's decisions as plain functions: what this worker has observed, which leases
//! are expired for it, which it takes and steals this round, and which rows the leader creates
//! and deletes (docs/coordination.md §11.3 to §11.6). No I/O, no clock: `now` comes in.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use super::{Lease, LeaseCounter, UnitId, UnitSpec, WorkerId};

/// A reading of this worker's own monotonic clock, from any fixed origin. Never compared with
/// another worker's clock, nor with the wall clock (§11.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LocalTime(Duration);

impl LocalTime {
    /// The reading `since_origin` after the origin.
    pub fn new(since_origin: Duration) -> Self {
        LocalTime(since_origin)
    }

    /// The reading `ms` milliseconds after the origin.
    pub fn from_millis(ms: u64) -> Self {
        LocalTime(Duration::from_millis(ms))
    }

    /// Time since the origin.
    pub fn since_origin(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to this reading; zero when `earlier` is later.
    pub fn since(self, earlier: LocalTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// The reading `later` after this one.
    pub fn plus(self, later: Duration) -> LocalTime {
        LocalTime(self.0.saturating_add(later))
    }
}

/// A counter as this worker first saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    counter: LeaseCounter,
    since: LocalTime,
}

/// The counter of every lease this worker has listed, with the local time it first saw that
/// value (§11.3 rule 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    seen: BTreeMap<UnitId, Seen>,
}

impl Observations {
    /// Records a listing made at `now`: a counter not seen before starts its clock at `now`;
    /// a lease no longer listed is forgotten.
    pub fn observe(&mut self, leases: &[Lease], now: LocalTime) {
        let mut seen = BTreeMap::new();
        for lease in leases {
            let entry = match self.seen.get(&lease.unit) {
                Some(known) if known.counter == lease.counter => *known,
                _ => Seen {
                    counter: lease.counter,
                    since: now,
                },
            };
            seen.insert(lease.unit.clone(), entry);
        }
        self.seen = seen;
    }

    /// Whether `lease` is expired for this worker at `now` (§11.3 rule 2): it has an owner,
    /// and its counter has not changed for `duration` of this worker's clock.
    pub fn is_expired(&self, lease: &Lease, now: LocalTime, duration: Duration) -> bool {
        lease.owner.is_some()
            && self.seen.get(&lease.unit).is_some_and(|seen| {
                seen.counter == lease.counter && now.since(seen.since) >= duration
            })
    }

    /// When `lease` expires for this worker if its counter stands still from now on: a
    /// duration after this worker first saw that counter; `None` without an owner or before
    /// it was seen.
    pub fn expires_at(&self, lease: &Lease, duration: Duration) -> Option<LocalTime> {
        let seen = self.seen.get(&lease.unit)?;
        (lease.owner.is_some() && seen.counter == lease.counter).then(|| seen.since.plus(duration))
    }
}

/// A lease to take this round, conditional on the counter listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The unit.
    pub unit: UnitId,
    /// The counter listed: the take's condition.
    pub seen: LeaseCounter,
    /// The live owner it is stolen from; `None` for a free lease (§11.4 rule 4).
    pub victim: Option<WorkerId>,
}

/// The leases one worker claims in one round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Leases to take, the leader lease first, then free ones, then steals.
    pub claims: Vec<Claim>,
    /// The other free leases, in the same order: one replaces a free claim another worker
    /// took first (rule 3).
    pub spare: Vec<Claim>,
    /// This worker's fair share (§11.4 rule 2).
    pub target: usize,
    /// Live workers counted, this one included.
    pub live_workers: usize,
}

/// What [`plan`] decides from.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// Who decides.
    pub me: &'a WorkerId,
    /// The pipeline's rows, as just listed.
    pub leases: &'a [Lease],
    /// The units this worker holds (and has renewed in time).
    pub held: &'a BTreeSet<UnitId>,
    /// What it has observed.
    pub observations: &'a Observations,
    /// Now, on its clock.
    pub now: LocalTime,
    /// The lease duration.
    pub duration: Duration,
    /// Most leases stolen in one round.
    pub max_steals: usize,
}

/// Whether `lease` waits on a parent (§11.6 rule 1): some parent has a row that is not
/// finished. A parent without a row does not hold it back (rule 2).
pub fn waits_on_parents(lease: &Lease, rows: &BTreeMap<&UnitId, &Lease>) -> bool {
    lease.parents.iter().any(|parent| {
        rows.get(parent)
            .is_some_and(|parent| !parent.state.is_finished())
    })
}

/// Why a lease can or cannot be claimed by the deciding worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Finished, or waiting on a parent: nobody takes it.
    Closed,
    /// Held by this worker.
    Mine,
    /// Free for this worker: no owner, an expired owner, or this worker's owner on a lease it
    /// does not hold (a take whose reply was lost; a previous process of the same worker id
    /// is another owner, docs/coordination.md §11.2 rule 6).
    Free,
    /// Held by a live worker.
    Live,
}

fn standing(view: &View<'_>, lease: &Lease, rows: &BTreeMap<&UnitId, &Lease>) -> Standing {
    if lease.state.is_finished() || waits_on_parents(lease, rows) {
        return Standing::Closed;
    }
    match &lease.owner {
        _ if view.held.contains(&lease.unit) => Standing::Mine,
        None => Standing::Free,
        Some(owner) if owner == view.me => Standing::Free,
        Some(_) if view.observations.is_expired(lease, view.now, view.duration) => Standing::Free,
        Some(_) => Standing::Live,
    }
}

/// The order in which one worker tries free leases: spread by worker, so workers starting
/// together do not all race for the same row.
fn spread(me: &WorkerId, unit: &UnitId) -> u64 {
    let mut hasher = DefaultHasher::new();
    me.hash(&mut hasher);
    unit.hash(&mut hasher);
    hasher.finish()
}

/// The leases to claim this round (§11.4):
/// 1. The leader lease when it is free, and this worker's presence row (§11.2 rule 7).
/// 2. The fair share is `ceil(work / live workers)`, where work counts the units that are
///    neither finished nor waiting on a parent, and live workers are this one and every
///    owner of such a unit that is not expired.
/// 3. Free leases, up to the share: this worker's own owner first, then unowned, then
///    expired, each in spread order; the rest are spares, taken in that order in place of a
///    free claim another worker wins.
/// 4. Below its share with nothing free, it steals at most `max_steals` from the live worker
///    holding the most, when that one holds more than the share or at least two more than
///    this worker.
pub fn plan(view: &View<'_>) -> Plan {
    let rows: BTreeMap<&UnitId, &Lease> = view.leases.iter().map(|l| (&l.unit, l)).collect();
    let mut claims = Vec::new();
    let mut free: Vec<(u8, u64, &Lease)> = Vec::new();
    let mut mine = 0usize;
    let mut work = 0usize;
    let mut by_owner: BTreeMap<&WorkerId, Vec<&Lease>> = BTreeMap::new();
    for lease in view.leases {
        let standing = standing(view, lease, &rows);
        if !lease.unit.is_work() {
            // The leader lease, and this worker's own presence: never another's (§11.2 rule 7).
            let mine = lease.unit == UnitId::Leader || lease.unit == UnitId::presence(view.me);
            if mine && standing == Standing::Free {
                claims.push(Claim {
                    unit: lease.unit.clone(),
                    seen: lease.counter,
                    victim: None,
                });
            }
            continue;
        }
        match standing {
            Standing::Closed => continue,
            Standing::Mine => mine += 1,
            Standing::Free => {
                let rank = match &lease.owner {
                    Some(owner) if owner == view.me => 0,
                    None => 1,
                    Some(_) => 2,
                };
                free.push((rank, spread(view.me, &lease.unit), lease));
            }
            Standing::Live => {
                if let Some(owner) = &lease.owner {
                    by_owner.entry(owner).or_default().push(lease);
                }
            }
        }
        work += 1;
    }
    let live_workers = 1 + by_owner.keys().filter(|owner| **owner != view.me).count();
    let target = work.div_ceil(live_workers);
    free.sort_by_key(|(rank, spread, _)| (*rank, *spread));
    let wanted = target.saturating_sub(mine);
    let claim = |(_, _, lease): &(u8, u64, &Lease)| Claim {
        unit: lease.unit.clone(),
        seen: lease.counter,
        victim: None,
    };
    claims.extend(free.iter().take(wanted).map(claim));
    let spare = free.iter().skip(wanted).map(claim).collect();
    let holding = mine + wanted.min(free.len());
    if holding < target && free.len() <= wanted {
        let busiest = by_owner
            .iter()
            .max_by(|(a, la), (b, lb)| la.len().cmp(&lb.len()).then_with(|| b.cmp(a)));
        if let Some((victim, leases)) = busiest
            && (leases.len() > target || leases.len() >= holding + 2)
        {
            let mut leases = leases.clone();
            leases.sort_by_key(|lease| spread(view.me, &lease.unit));
            let steals = view.max_steals.min(target - holding);
            claims.extend(leases.into_iter().take(steals).map(|lease| Claim {
                unit: lease.unit.clone(),
                seen: lease.counter,
                victim: Some((*victim).clone()),
            }));
        }
    }
    Plan {
        claims,
        spare,
        target,
        live_workers,
    }
}

/// The rows the leader writes for a discovery (§11.5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// Rows to create, parents before children.
    pub create: Vec<Lease>,
    /// Finished rows to delete, with the counter listed.
    pub delete: Vec<(UnitId, LeaseCounter)>,
}

/// What the leader writes for `discovered` (§11.5):
/// 1. A discovered unit without a row gets one, with its parents, unowned, with the checkpoint
///    and state its spec gives (`Pending` without a checkpoint unless a first run says).
/// 2. Rows come parents first: a unit whose discovered parent has no row yet is created after
///    that parent, in the same list, so a child row never exists without its parent's row.
/// 3. A finished row whose unit is no longer discovered, and which no discovered unit names
///    as a parent, is deleted: its shard was trimmed and cannot be listed again.
pub fn sync(leases: &[Lease], discovered: &[UnitSpec], now_ms: i64) -> SyncPlan {
    let rows: BTreeSet<&UnitId> = leases.iter().map(|lease| &lease.unit).collect();
    let specs: BTreeMap<&UnitId, &UnitSpec> = discovered.iter().map(|s| (&s.unit, s)).collect();
    let mut create: Vec<Lease> = Vec::new();
    let mut placed: BTreeSet<&UnitId> = BTreeSet::new();
    // Each pass places the units whose discovered parents are placed; a cycle in malformed
    // input stops the passes instead of looping.
    loop {
        let before = placed.len();
        for spec in discovered {
            let ready = spec.parents.iter().all(|parent| {
                !specs.contains_key(parent) || rows.contains(parent) || placed.contains(parent)
            });
            if !rows.contains(&spec.unit) && !placed.contains(&spec.unit) && ready {
                placed.insert(&spec.unit);
                let mut lease = Lease::new(spec.unit.clone(), spec.parents.clone(), now_ms);
                lease.checkpoint.clone_from(&spec.checkpoint);
                lease.state = spec.state;
                create.push(lease);
            }
        }
        if placed.len() == before {
            break;
        }
    }
    let parents: BTreeSet<&UnitId> = discovered.iter().flat_map(|s| &s.parents).collect();
    let delete = leases
        .iter()
        .filter(|lease| lease.unit.is_work() && lease.state.is_finished())
        .filter(|lease| !specs.contains_key(&lease.unit) && !parents.contains(&lease.unit))
        .map(|lease| (lease.unit.clone(), lease.counter))
        .collect();
    SyncPlan { create, delete }
}
