//! Seeded simulation of 2 to 5 workers sharing one pipeline's units on the in-memory lease
//! table, in simulated time, with crashes, pauses longer than a lease, steals, lost replies
//! and failed requests (docs/coordination.md §11, docs/testing.md).
//!
//! # One seed
//! 1. Units: scan segments, or shards with a lineage (roots, splits, rotations, an orphan
//!    whose parent was trimmed), children listed late; each unit a run of records `1..=n`.
//! 2. Every 250 ms of simulated time each running worker runs its round when due (a third
//!    of the lease duration), syncs the discovery when it leads, reads the next record of
//!    its units and checkpoints now and then, always after the last record. Each worker's
//!    clock has its own origin.
//! 3. Workers crash (they vanish holding leases) and pause for longer than a lease; a paused
//!    worker that wakes first tries to checkpoint its units, as a zombie would.
//!
//!    Under CPU pressure ([`Pressure`]) a worker's data plane stalls now and then (a slow sink
//!    write, a reader starved of CPU): while it stalls, that worker neither reads, checkpoints
//!    nor runs a round, as in the runners, whose rounds share the loop with the sink. Its
//!    keeper's passes ([`Renewal::Keeper`]) go on, each woken late by up to a delay (a task
//!    waiting for a CPU); with [`Renewal::InRounds`] (the old behaviour) only the rounds
//!    renew.
//! 4. Finished shards whose children are finished stop being listed (trimmed); the leader
//!    deletes their rows.
//!
//! # Invariants
//! - Every unit is committed exactly through its last record, with its end state.
//! - A taken lease resumes after the last committed checkpoint: nothing committed is lost,
//!   and committed checkpoints of a unit only grow.
//! - Each committed checkpoint was written while the committer held the current counter: no
//!   other take came between the committer's take and its commit, and a worker never
//!   commits a unit after it was told it lost it (until it takes it again).
//! - No record of a child is read before every parent with a row committed its end.
//! - With open units and the faults over, the work is balanced: nobody holds more than
//!   `ceil(units / live workers) + 1`, and every unit is held.
//! - Under pressure, with the keeper, no live worker loses a lease; a crashed worker's leases
//!   are all held by others within a duration and a round of its crash (plus the longest
//!   stall of a taker).
//!
//! # Replay
//! `SIM_SEED=12` runs one seed; `SIM_SEEDS=3000` runs more; `SIM_TRACE=1` prints the figures
//! (take-over times, zombie commits refused, steals, requests per worker per second);
//! `SIM_ROUNDS=1` prints every round.

// A failed unwrap in the simulation is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::memory::{Faults, MemoryLeaseTable, WriteKind};
use super::*;
use crate::ids::{SequenceNumber, ShardId};
use crate::position::LeaseCheckpoint;

const STEP_MS: u64 = 250;

/// Who renews the held leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// Only the rounds, which wait on the data plane (the behaviour before the keeper).
    InRounds,
    /// The keeper, on its own timer; the rounds renew what is due too.
    Keeper,
}

/// CPU pressure: data-plane stalls and late keeper wakes.
#[derive(Debug, Clone, Copy)]
struct Pressure {
    /// Chance, per worker and step, that its data plane stalls.
    stall_rate: f64,
    /// How long a stall lasts, in ms.
    stall_ms: (u64, u64),
    /// Most a keeper wake is late, in ms.
    keeper_delay_ms: u64,
}
const DURATION_SECS: u64 = 10;
const DEADLINE_MS: u64 = 30 * 60 * 1000;

/// One unit of the script.
#[derive(Debug, Clone)]
struct Unit {
    spec: UnitSpec,
    records: u64,
    listed_at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Running,
    Paused { until: u64 },
    Crashed,
}

struct SimWorker {
    worker: Worker<MemoryLeaseTable>,
    keeper: LeaseKeeper<MemoryLeaseTable>,
    /// Its clock's origin, in simulated ms: local = sim + offset.
    offset: u64,
    next_round: u64,
    /// The next regular round: every renewal interval, whatever ran between.
    grid: u64,
    /// The keeper's next wake.
    next_keep: u64,
    /// Its data plane stalls until then (pressure).
    busy_until: u64,
    life: Life,
    /// Held units, with the last record read and committed.
    readers: BTreeMap<UnitId, Reader>,
    /// Units it was told it lost and has not taken again.
    lost: BTreeSet<UnitId>,
    started_at: u64,
    ended_at: Option<u64>,
    /// It was paused once: its losses are expected.
    paused: bool,
}

impl SimWorker {
    fn local(&self, now: u64) -> LocalTime {
        LocalTime::from_millis(now + self.offset)
    }

    /// A reading of its clock in simulated ms.
    fn sim_time(&self, local: LocalTime) -> u64 {
        (local.since_origin().as_millis() as u64).saturating_sub(self.offset)
    }
}

/// Where the reader of one unit stands.
#[derive(Debug, Clone, Copy)]
struct Reader {
    read: u64,
    committed: u64,
}

/// A crash whose leases are not all taken over yet.
struct Crash {
    at: u64,
    worker: WorkerId,
}

/// What a seed measured.
#[derive(Debug, Default)]
struct Figures {
    /// Crash to the last of its units held by a live worker, in simulated ms.
    takeovers: Vec<u64>,
    zombie_refusals: u64,
    steals: u64,
    /// Leases lost by workers that neither crashed nor paused.
    lost_live: u64,
    /// Whether the lease table failed requests in this seed.
    faults: bool,
}

fn pipeline() -> PipelineName {
    PipelineName::new("sim").unwrap()
}

fn shard(i: usize) -> UnitId {
    UnitId::Shard(ShardId::new(format!("shard-{i:02}")))
}

/// Scan segments, or shards with a lineage whose children are listed late.
fn script(rng: &mut StdRng, open: bool) -> Vec<Unit> {
    let records = |rng: &mut StdRng| {
        if open {
            u64::MAX
        } else {
            rng.random_range(1..=10)
        }
    };
    if open || rng.random_bool(0.3) {
        let total = rng.random_range(3..=12);
        return UnitSpec::segments(total)
            .into_iter()
            .map(|spec| Unit {
                spec,
                records: records(rng),
                listed_at: 0,
            })
            .collect();
    }
    let mut units: Vec<Unit> = Vec::new();
    let roots = rng.random_range(1..=3);
    for i in 0..roots {
        // The first root's parent was trimmed before we came: an orphan.
        let parents = if i == 0 {
            vec![UnitId::Shard(ShardId::new("trimmed"))]
        } else {
            Vec::new()
        };
        units.push(Unit {
            spec: UnitSpec::new(shard(i), parents),
            records: records(rng),
            listed_at: 0,
        });
    }
    let mut next = 0;
    while next < units.len() && units.len() < 14 {
        let children = match rng.random_range(0..10) {
            0..5 => 2,
            5..7 => 1,
            _ => 0,
        };
        for _ in 0..children {
            let id = units.len();
            let listed_at = units[next].listed_at + rng.random_range(0..20_000);
            let parent = units[next].spec.unit.clone();
            units.push(Unit {
                spec: UnitSpec::new(shard(id), vec![parent]),
                records: records(rng),
                listed_at,
            });
        }
        next += 1;
    }
    units
}

struct Sim {
    seed: u64,
    rng: StdRng,
    renewal: Renewal,
    pressure: Option<Pressure>,
    table: MemoryLeaseTable,
    settings: LeaseSettings,
    units: BTreeMap<UnitId, Unit>,
    workers: Vec<SimWorker>,
    crashes: Vec<Crash>,
    figures: Figures,
    /// Units no longer listed (trimmed).
    unlisted: BTreeSet<UnitId>,
    /// When each unit's end was committed.
    ended_at: BTreeMap<UnitId, u64>,
    /// Every commit a worker was told succeeded: unit, value, counter left, committer.
    commits: Vec<(UnitId, u64, LeaseCounter, WorkerId)>,
    joined: usize,
    /// Log entries already looked at by `ends`.
    log_seen: usize,
    /// The last checkpoint committed per unit, from the log.
    committed: BTreeMap<UnitId, u64>,
}

impl Sim {
    fn new(seed: u64, open: bool) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let table = MemoryLeaseTable::seeded(seed);
        let faults = !open && rng.random_bool(0.5);
        if faults {
            table.set_faults(Faults {
                fail_rate: 0.03,
                lost_reply_rate: 0.03,
                ..Faults::default()
            });
        }
        let units = script(&mut rng, open)
            .into_iter()
            .map(|unit| (unit.spec.unit.clone(), unit))
            .collect();
        let mut sim = Sim {
            seed,
            rng,
            renewal: Renewal::Keeper,
            pressure: None,
            table,
            settings: LeaseSettings::new(DURATION_SECS).unwrap(),
            units,
            workers: Vec::new(),
            crashes: Vec::new(),
            figures: Figures {
                faults,
                ..Figures::default()
            },
            unlisted: BTreeSet::new(),
            ended_at: BTreeMap::new(),
            commits: Vec::new(),
            joined: 0,
            log_seen: 0,
            committed: BTreeMap::new(),
        };
        for _ in 0..sim.rng.random_range(2..=5) {
            sim.join(0);
        }
        sim
    }

    fn join(&mut self, now: u64) {
        let id = WorkerId::new(format!("w{}", self.joined)).unwrap();
        self.joined += 1;
        let offset = self.rng.random_range(0..1_000_000);
        let first = now + self.rng.random_range(0..3_000);
        let worker = Worker::new(self.table.connect(), pipeline(), id, self.settings);
        self.workers.push(SimWorker {
            keeper: worker.keeper(),
            worker,
            offset,
            next_round: first,
            grid: first,
            next_keep: first,
            busy_until: 0,
            life: Life::Running,
            readers: BTreeMap::new(),
            lost: BTreeSet::new(),
            started_at: now,
            ended_at: None,
            paused: false,
        });
    }

    fn running(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.life != Life::Crashed)
            .count()
    }

    fn listed(&self, now: u64) -> Vec<UnitSpec> {
        self.units
            .values()
            .filter(|u| u.listed_at <= now && !self.unlisted.contains(&u.spec.unit))
            .map(|u| u.spec.clone())
            .collect()
    }

    /// Crashes, pauses and joins, decided by the seed; none after `quiet_from`.
    fn events(&mut self, now: u64, quiet_from: u64) {
        if now >= quiet_from {
            return;
        }
        let pick = |rng: &mut StdRng, workers: &[SimWorker]| {
            let running: Vec<usize> = (0..workers.len())
                .filter(|&i| workers[i].life == Life::Running)
                .collect();
            (!running.is_empty()).then(|| running[rng.random_range(0..running.len())])
        };
        // Crashes and pauses do not overlap, so a take-over time measures the protocol, not a
        // survivor's pause.
        let paused = self
            .workers
            .iter()
            .any(|w| matches!(w.life, Life::Paused { .. }));
        if self.rng.random_bool(0.008)
            && !paused
            && self.crashes.is_empty()
            && self.running() > 1
            && let Some(i) = pick(&mut self.rng, &self.workers)
        {
            self.workers[i].life = Life::Crashed;
            self.workers[i].ended_at = Some(now);
            // Only a crash that leaves leases behind has a take-over to measure.
            if !self.workers[i].readers.is_empty() {
                self.crashes.push(Crash {
                    at: now,
                    worker: self.workers[i].worker.id().clone(),
                });
            }
            if self.rng.random_bool(0.5) {
                self.join(now);
            }
        }
        if self.rng.random_bool(0.004)
            && self.crashes.is_empty()
            && let Some(i) = pick(&mut self.rng, &self.workers)
        {
            let pause = DURATION_SECS * 1000 + self.rng.random_range(1_000..15_000);
            self.workers[i].life = Life::Paused { until: now + pause };
            self.workers[i].paused = true;
        }
    }

    /// Closes the crashes whose leases are all held by others or finished.
    fn takeovers(&mut self, now: u64) {
        let rows = self.table.rows(&pipeline());
        let figures = &mut self.figures;
        self.crashes.retain(|crash| {
            let pending = rows
                .iter()
                .any(|row| row.unit.is_work() && row.owner.as_ref() == Some(&crash.worker));
            if !pending {
                figures.takeovers.push(now - crash.at);
            }
            pending
        });
    }

    /// Notes the units whose end was committed since the last step, from the table's log:
    /// the table is the truth, whether or not the committer heard the answer.
    fn ends(&mut self, now: u64) {
        let writes = self.table.log_since(self.log_seen);
        self.log_seen += writes.len();
        for write in writes {
            let Some(row) = write.after.filter(|_| write.kind == WriteKind::Checkpoint) else {
                continue;
            };
            let value = read_at(row.checkpoint.as_ref(), self.units[&write.unit].records);
            self.committed.insert(write.unit.clone(), value);
            if row.state.is_finished() {
                self.ended_at.entry(write.unit).or_insert(now);
            }
        }
    }

    fn trim(&mut self, now: u64) {
        for (unit, ended) in &self.ended_at {
            let children_done = self
                .units
                .values()
                .filter(|u| u.spec.parents.contains(unit))
                .all(|child| self.ended_at.contains_key(&child.spec.unit));
            if now > ended + 30_000 && children_done && matches!(unit, UnitId::Shard(_)) {
                self.unlisted.insert(unit.clone());
            }
        }
    }

    async fn step(&mut self, now: u64, quiet_from: u64) {
        self.events(now, quiet_from);
        self.table.set_clock_ms(now as i64);
        let mut order: Vec<usize> = (0..self.workers.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, self.rng.random_range(0..=i));
        }
        for i in order {
            match self.workers[i].life {
                Life::Crashed => continue,
                Life::Paused { until } if now < until => continue,
                Life::Paused { .. } => self.wake(i, now).await,
                Life::Running => {}
            }
            // The keeper wakes on its own timer, whatever the data plane does.
            if self.renewal == Renewal::Keeper && now >= self.workers[i].next_keep {
                self.keep(i, now).await;
            }
            if now < self.workers[i].busy_until {
                continue;
            }
            // A due round runs before the data plane's next step (the runners' loops poll
            // the round first).
            if now >= self.workers[i].next_round {
                self.round(i, now).await;
            }
            if let Some(pressure) = self.pressure
                && self.rng.random_bool(pressure.stall_rate)
            {
                let (least, most) = pressure.stall_ms;
                self.workers[i].busy_until = now + self.rng.random_range(least..=most);
                continue;
            }
            self.read(i, now, now >= quiet_from).await;
        }
        self.takeovers(now);
        self.ends(now);
        self.trim(now);
    }

    /// One keeper pass; its next wake is late by up to the pressure's delay.
    async fn keep(&mut self, i: usize, now: u64) {
        let local = self.workers[i].local(now);
        let pass = self.workers[i].keeper.pass(local).await.unwrap();
        for lost in pass.lost {
            self.lost(i, lost.unit, &lost.reason);
        }
        let delay = self
            .pressure
            .map_or(0, |p| self.rng.random_range(0..=p.keeper_delay_ms));
        let next = self.workers[i].sim_time(pass.next);
        self.workers[i].next_keep = next + delay;
    }

    /// Worker `i` was told it lost `unit`.
    fn lost(&mut self, i: usize, unit: UnitId, reason: &LostReason) {
        let worker = &mut self.workers[i];
        worker.readers.remove(&unit);
        if *reason != LostReason::Ended {
            worker.lost.insert(unit);
        }
        // A lease taken from it is counted by the taker (a steal is no loss).
        if *reason == LostReason::Expired && !worker.paused {
            self.figures.lost_live += 1;
        }
    }

    /// A paused worker wakes and first commits its next records, as if nothing happened.
    async fn wake(&mut self, i: usize, now: u64) {
        self.workers[i].life = Life::Running;
        let units: Vec<(UnitId, Reader)> = self.workers[i]
            .readers
            .iter()
            .map(|(u, reader)| (u.clone(), *reader))
            .collect();
        for (unit, reader) in units {
            let records = self.units[&unit].records;
            let next = (reader.read + 1).min(records);
            let mark = mark(&unit, next, records);
            let local = self.workers[i].local(now);
            let result = self.workers[i].worker.checkpoint(&unit, &mark, local).await;
            if result.is_err() {
                self.figures.zombie_refusals += 1;
            }
            self.checkpointed(i, &unit, next, mark.is_finished(), result);
        }
        self.workers[i].next_round = now;
        self.workers[i].next_keep = now;
    }

    async fn round(&mut self, i: usize, now: u64) {
        let local = self.workers[i].local(now);
        let report = self.workers[i].worker.round(local).await.unwrap();
        // Rounds keep to their grid, and one more runs when a lease seen standing still
        // expires (§11.4 rule 5).
        let interval = self.settings.renew_interval().as_millis() as u64;
        let worker = &mut self.workers[i];
        while worker.grid <= now {
            worker.grid += interval;
        }
        let expiry = report.next_expiry.map(|at| worker.sim_time(at));
        worker.next_round = expiry.map_or(worker.grid, |at| at.min(worker.grid));
        if std::env::var_os("SIM_ROUNDS").is_some() {
            eprintln!(
                "{now} {}: held {} target {} taken {:?} lost {:?} transient {}",
                self.workers[i].worker.id(),
                self.workers[i].worker.units().len(),
                report.target,
                report
                    .taken
                    .iter()
                    .map(|t| t.unit.to_string())
                    .collect::<Vec<_>>(),
                report
                    .lost
                    .iter()
                    .map(|t| t.unit.to_string())
                    .collect::<Vec<_>>(),
                report.transient.len()
            );
        }
        for lost in report.lost {
            self.lost(i, lost.unit, &lost.reason);
        }
        let rows: BTreeMap<UnitId, Lease> = self
            .table
            .rows(&pipeline())
            .into_iter()
            .map(|row| (row.unit.clone(), row))
            .collect();
        for taken in report.taken {
            let seed = self.seed;
            let unit = &taken.unit;
            for parent in &rows[unit].parents {
                if let Some(parent) = rows.get(parent) {
                    assert!(
                        parent.state.is_finished(),
                        "seed {seed}: {unit} taken before its parent {} ended",
                        parent.unit
                    );
                }
            }
            let committed = self.last_commit(unit, now);
            let resumed = read_at(taken.checkpoint.as_ref(), self.units[unit].records);
            assert_eq!(
                resumed, committed,
                "seed {seed}: {unit} resumed after {resumed}, committed {committed}"
            );
            if taken.stolen_from.is_some() {
                self.figures.steals += 1;
            } else if self.pressure.is_some() && self.taken_from_live(i, &taken) {
                self.figures.lost_live += 1;
            }
            self.workers[i].lost.remove(unit);
            let reader = Reader {
                read: resumed,
                committed: resumed,
            };
            self.workers[i].readers.insert(unit.clone(), reader);
        }
        if report.leader {
            let listed = self.listed(now);
            self.workers[i].worker.sync(&listed).await.unwrap();
        }
    }

    /// Whether `taken`, not a steal, was held by another worker that neither crashed nor
    /// paused: a lease it lost by expiry while it lived.
    fn taken_from_live(&self, i: usize, taken: &Taken) -> bool {
        let before = self.table.log().into_iter().rev().find_map(|write| {
            (write.kind == WriteKind::Take
                && write.unit == taken.unit
                && write.after.as_ref().map(|a| a.counter) == Some(taken.counter))
            .then_some(write.before)
        });
        let Some(owner) = before.flatten().and_then(|row| row.owner) else {
            return false;
        };
        self.workers
            .iter()
            .enumerate()
            .any(|(j, w)| j != i && w.worker.id() == &owner && w.life != Life::Crashed && !w.paused)
    }

    /// The last checkpoint committed for `unit`, from the table's log.
    fn last_commit(&mut self, unit: &UnitId, now: u64) -> u64 {
        self.ends(now);
        self.committed.get(unit).copied().unwrap_or(0)
    }

    async fn read(&mut self, i: usize, now: u64, quiet: bool) {
        let units: Vec<(UnitId, Reader)> = self.workers[i]
            .readers
            .iter()
            .map(|(u, reader)| (u.clone(), *reader))
            .collect();
        for (unit, mut reader) in units {
            let records = self.units[&unit].records;
            let seed = self.seed;
            if reader.read < records && self.rng.random_bool(0.6) {
                for parent in &self.units[&unit].spec.parents {
                    let row = self.table.row(&pipeline(), parent);
                    assert!(
                        row.is_none_or(|row| row.state.is_finished()),
                        "seed {seed}: {unit} read before its parent {parent} ended"
                    );
                }
                reader.read += 1;
                self.workers[i].readers.insert(unit.clone(), reader);
            }
            // Open units checkpoint about once a second once the faults are over, so the
            // request rate is measured on a steady load. The last record is always committed
            // (again, after a failed request).
            let rate = if quiet { 0.25 } else { 0.5 };
            let due = reader.read == records || self.rng.random_bool(rate);
            if reader.read > reader.committed && due {
                let mark = mark(&unit, reader.read, records);
                let local = self.workers[i].local(now);
                let result = self.workers[i].worker.checkpoint(&unit, &mark, local).await;
                self.checkpointed(i, &unit, reader.read, mark.is_finished(), result);
            }
        }
    }

    fn checkpointed(
        &mut self,
        i: usize,
        unit: &UnitId,
        value: u64,
        finished: bool,
        result: Result<LeaseCounter, CheckpointError>,
    ) {
        let seed = self.seed;
        let worker = self.workers[i].worker.id().clone();
        match result {
            Ok(counter) => {
                assert!(
                    !self.workers[i].lost.contains(unit),
                    "seed {seed}: {worker} committed {unit} after it was told it lost it"
                );
                self.commits.push((unit.clone(), value, counter, worker));
                let reader = Reader {
                    read: value,
                    committed: value,
                };
                self.workers[i].readers.insert(unit.clone(), reader);
                if finished {
                    self.workers[i].readers.remove(unit);
                }
            }
            Err(CheckpointError::Lost(lost)) => {
                self.workers[i].readers.remove(unit);
                self.lost(i, lost.unit, &lost.reason);
            }
            // Retried with the next record read.
            Err(CheckpointError::Request(_)) => {}
            Err(error) => panic!("seed {seed}: {worker}: {error}"),
        }
    }
}

mod runs;

/// The checkpoint of a shard of `records` records of which `read` are read: its end once all
/// are; else a sequence number counting them.
fn mark(unit: &UnitId, read: u64, records: u64) -> LeaseCheckpoint {
    if read >= records {
        unit.end()
    } else {
        LeaseCheckpoint::after(SequenceNumber::parse(&read.to_string()).unwrap())
    }
}

/// How many of a shard's `records` records a checkpoint says are read.
fn read_at(checkpoint: Option<&LeaseCheckpoint>, records: u64) -> u64 {
    match checkpoint {
        None => 0,
        Some(LeaseCheckpoint::After { seq, .. }) => seq.as_str().parse().unwrap(),
        Some(end) if end.is_finished() => records,
        Some(other) => panic!("the simulation wrote no checkpoint {other:?}"),
    }
}
