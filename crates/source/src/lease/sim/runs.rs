//! The simulation's runs and their checks: finite units to their end, open units to balance,
//! and the request rate of idle workers.

// A failed unwrap in the simulation is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use super::*;

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let count = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    (0..count).collect()
}

fn trace() -> bool {
    std::env::var_os("SIM_TRACE").is_some()
}

/// Finite units, faults throughout: every unit ends exactly at its last record.
async fn finite(seed: u64) -> Figures {
    let mut sim = Sim::new(seed, false);
    let mut now = 0;
    loop {
        sim.step(now, u64::MAX).await;
        if sim.units.keys().all(|unit| sim.ended_at.contains_key(unit)) {
            break;
        }
        now += STEP_MS;
        assert!(
            now < DEADLINE_MS,
            "seed {seed}: no end after 30 minutes: {:?}",
            sim.units
                .keys()
                .filter(|u| !sim.ended_at.contains_key(u))
                .map(|u| (u, sim.table.row(&pipeline(), u)))
                .collect::<Vec<_>>()
        );
    }
    sim.check_history();
    let units: Vec<(UnitId, u64)> = sim
        .units
        .values()
        .map(|u| (u.spec.unit.clone(), u.records))
        .collect();
    for (unit, records) in units {
        assert_eq!(
            sim.last_commit(&unit, now),
            records,
            "seed {seed}: {unit} ends early"
        );
    }
    sim.figures
}

/// Open units: faults for 90 s, then quiet: the work ends balanced and fully held.
async fn open(seed: u64) -> (Figures, f64) {
    let mut sim = Sim::new(seed, true);
    let quiet_from = 90_000;
    let end = 240_000;
    let mut now = 0;
    while now <= end {
        sim.step(now, quiet_from).await;
        now += STEP_MS;
    }
    sim.check_history();
    let live: Vec<&SimWorker> = sim
        .workers
        .iter()
        .filter(|w| w.life == Life::Running)
        .collect();
    let units = sim.units.len();
    let share = units.div_ceil(live.len());
    let held: Vec<usize> = live.iter().map(|w| w.worker.units().len()).collect();
    assert_eq!(
        held.iter().sum::<usize>(),
        units,
        "seed {seed}: not every unit held: {held:?}"
    );
    assert!(
        held.iter().all(|&h| h <= share + 1),
        "seed {seed}: unbalanced {held:?}, share {share}"
    );
    // Requests per worker-second over the quiet part, for the figures.
    let seconds: f64 = sim
        .workers
        .iter()
        .map(|w| (w.ended_at.unwrap_or(end) - w.started_at) as f64 / 1000.0)
        .sum();
    let requests: u64 = sim
        .workers
        .iter()
        .map(|w| w.worker.table().requests())
        .sum();
    (sim.figures, requests as f64 / seconds)
}

/// The documented take-over bound (docs/coordination.md §11.4 rule 5): a crash's leases are
/// all held by others within a duration and a round of its last write: the first listing of
/// its last counter comes within a round, the take a duration after it. The simulation adds
/// two steps (a round runs at the first step after it is due) and, under pressure, the
/// longest stall of a taker (its rounds wait on its data plane).
fn takeover_bound(stall_ms: u64) -> u64 {
    let round = LeaseSettings::new(DURATION_SECS).unwrap().renew_interval();
    DURATION_SECS * 1000 + round.as_millis() as u64 + 2 * STEP_MS + stall_ms
}

fn assert_takeovers_bounded(takeovers: &[u64], stall_ms: u64) {
    let bound = takeover_bound(stall_ms);
    assert!(
        takeovers.iter().all(|&t| t <= bound),
        "a take-over took longer than {bound} ms: {}",
        summary("take-over", takeovers.to_vec())
    );
}

fn summary(name: &str, mut values: Vec<u64>) -> String {
    values.sort_unstable();
    if values.is_empty() {
        return format!("{name}: none");
    }
    let at = |q: f64| values[((values.len() - 1) as f64 * q) as usize];
    format!(
        "{name}: n={} median={} ms p95={} ms max={} ms",
        values.len(),
        at(0.5),
        at(0.95),
        at(1.0)
    )
}

#[tokio::test]
async fn workers_commit_every_unit_exactly_to_its_end_through_crashes_pauses_and_steals() {
    // Take-overs in seeds whose lease table fails requests are measured apart: a failed
    // listing or take waits for the next round.
    let (mut takeovers, mut with_faults) = (Vec::new(), Vec::new());
    let (mut refusals, mut steals) = (0, 0);
    for seed in seeds() {
        let figures = finite(seed).await;
        if figures.faults {
            with_faults.extend(figures.takeovers);
        } else {
            takeovers.extend(figures.takeovers);
        }
        refusals += figures.zombie_refusals;
        steals += figures.steals;
    }
    assert_takeovers_bounded(&takeovers, 0);
    assert!(refusals > 0 && steals > 0, "the faults did not happen");
    if trace() {
        eprintln!(
            "finite: {}; with request faults: {}; {refusals} zombie commits refused, {steals} \
             steals",
            summary("take-over", takeovers),
            summary("take-over", with_faults)
        );
    }
}

#[tokio::test]
async fn open_work_ends_balanced_among_the_live_workers() {
    let mut takeovers = Vec::new();
    let mut rates = Vec::new();
    for seed in seeds().into_iter().take(100) {
        let (figures, rate) = open(seed).await;
        takeovers.extend(figures.takeovers);
        rates.push(rate);
    }
    assert_takeovers_bounded(&takeovers, 0);
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    if trace() {
        eprintln!(
            "open: {}; {mean:.2} requests per worker per second",
            summary("take-over", takeovers)
        );
    }
}

#[tokio::test]
async fn an_idle_worker_sends_one_list_and_one_renewal_per_lease_held_each_round() {
    // 3 workers, 12 open segments, no checkpoints: per worker and second,
    // (1 list + h renewals + its presence + its part of the leader lease) × 3 / duration
    // (docs/coordination.md §11.8).
    let table = MemoryLeaseTable::seeded(1);
    let settings = LeaseSettings::new(DURATION_SECS).unwrap();
    let mut workers: Vec<Worker<MemoryLeaseTable>> = (0..3)
        .map(|i| {
            let id = WorkerId::new(format!("w{i}")).unwrap();
            Worker::new(table.connect(), pipeline(), id, settings)
        })
        .collect();
    let interval = settings.renew_interval().as_millis() as u64;
    let (warm_up, end) = (60_000, 660_000);
    let mut at_warm_up = 0;
    let mut next_round = [0, 1_000, 2_000];
    let mut now = 0;
    while now <= end {
        if now == warm_up {
            at_warm_up = workers.iter().map(|w| w.table().requests()).sum();
        }
        for (i, worker) in workers.iter_mut().enumerate() {
            if now >= next_round[i] {
                next_round[i] = now + interval;
                let report = worker.round(LocalTime::from_millis(now)).await.unwrap();
                if report.leader {
                    worker.sync(&UnitSpec::segments(12)).await.unwrap();
                }
            }
        }
        now += STEP_MS / 5;
    }
    let held: Vec<usize> = workers.iter().map(|w| w.units().len()).collect();
    assert_eq!(held, [4, 4, 4]);
    let requests: u64 = workers.iter().map(|w| w.table().requests()).sum::<u64>() - at_warm_up;
    let measured = requests as f64 / 3.0 / ((end - warm_up) as f64 / 1000.0);
    let formula = (1.0 + 4.0 + 1.0 + 1.0 / 3.0) * 3.0 / DURATION_SECS as f64;
    assert!(
        (measured - formula).abs() / formula < 0.1,
        "measured {measured:.3} requests per worker per second, formula {formula:.3}"
    );
    if trace() {
        eprintln!("idle: {measured:.3} requests per worker per second (formula {formula:.3})");
    }
}

/// The pressure of the runs below: a data plane that stalls about every 25 s per worker for 1
/// to 8 s (a slow sink write, a reader starved of CPU), keeper wakes up to 1.5 s late.
const PRESSURE: Pressure = Pressure {
    stall_rate: 0.01,
    stall_ms: (1_000, 8_000),
    keeper_delay_ms: 1_500,
};

/// Open units under CPU pressure, nothing crashing or pausing but one worker killed at 120 s:
/// what the live workers lost, and the take-over.
async fn pressure(seed: u64, renewal: Renewal) -> Figures {
    let mut sim = Sim::new(seed, true);
    sim.renewal = renewal;
    sim.pressure = Some(PRESSURE);
    let mut now = 0;
    while now <= 240_000 {
        if now == 120_000
            && let Some(i) = (0..sim.workers.len()).find(|&i| !sim.workers[i].readers.is_empty())
        {
            sim.workers[i].life = Life::Crashed;
            sim.workers[i].ended_at = Some(now);
            sim.crashes.push(Crash {
                at: now,
                worker: sim.workers[i].worker.id().clone(),
            });
        }
        // No crash, pause or join but the one above.
        sim.step(now, 0).await;
        now += STEP_MS;
    }
    sim.check_history();
    assert!(
        sim.crashes.is_empty(),
        "seed {seed}: a crash not taken over"
    );
    sim.figures
}

#[tokio::test]
async fn under_cpu_pressure_the_keeper_loses_no_lease_and_a_crash_is_taken_over_in_time() {
    let (mut lost, mut lost_in_rounds) = (0, 0);
    let (mut takeovers, mut takeovers_in_rounds) = (Vec::new(), Vec::new());
    for seed in seeds().into_iter().take(40) {
        let figures = pressure(seed, Renewal::Keeper).await;
        lost += figures.lost_live;
        takeovers.extend(figures.takeovers);
        let figures = pressure(seed, Renewal::InRounds).await;
        lost_in_rounds += figures.lost_live;
        takeovers_in_rounds.extend(figures.takeovers);
    }
    if trace() {
        eprintln!(
            "pressure, keeper: {lost} leases lost by live workers, {}; renewing in rounds only: \
             {lost_in_rounds} lost, {}",
            summary("take-over", takeovers.clone()),
            summary("take-over", takeovers_in_rounds)
        );
    }
    assert!(
        lost_in_rounds > 0,
        "the pressure is too light to lose a lease renewed in rounds only"
    );
    assert_eq!(lost, 0, "live workers lost leases under pressure");
    assert!(!takeovers.is_empty());
    assert_takeovers_bounded(&takeovers, PRESSURE.stall_ms.1);
}

impl Sim {
    /// The checks that look at the whole history.
    fn check_history(&self) {
        let seed = self.seed;
        let log = self.table.log();
        let mut last_take: BTreeMap<&UnitId, &WorkerId> = BTreeMap::new();
        let mut committed: BTreeMap<&UnitId, u64> = BTreeMap::new();
        for write in &log {
            let owner_before = write.before.as_ref().and_then(|b| b.owner.as_ref());
            match write.kind {
                WriteKind::Take => {
                    let after = write.after.as_ref().and_then(|a| a.owner.as_ref()).unwrap();
                    last_take.insert(&write.unit, after);
                }
                WriteKind::Checkpoint => {
                    let committer = owner_before.unwrap();
                    assert_eq!(
                        last_take.get(&write.unit),
                        Some(&committer),
                        "seed {seed}: a checkpoint of {} by {committer} after another take",
                        write.unit
                    );
                    let records = self.units[&write.unit].records;
                    let value = read_at(write.after.as_ref().unwrap().checkpoint.as_ref(), records);
                    let before = committed.insert(&write.unit, value).unwrap_or(0);
                    assert!(
                        value >= before,
                        "seed {seed}: {} went back from {before} to {value}",
                        write.unit
                    );
                }
                _ => {}
            }
        }
        for (unit, value, counter, worker) in &self.commits {
            let found = log.iter().any(|w| {
                &w.unit == unit
                    && w.kind == WriteKind::Checkpoint
                    && w.before.as_ref().and_then(|b| b.owner.as_ref()) == Some(worker)
                    && w.after.as_ref().is_some_and(|a| {
                        a.counter == *counter
                            && a.checkpoint == Some(mark(unit, *value, self.units[unit].records))
                    })
            });
            assert!(
                found,
                "seed {seed}: {worker}'s commit {value} of {unit} is not in the table"
            );
        }
    }
}
