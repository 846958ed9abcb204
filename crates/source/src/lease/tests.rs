//! The lease decisions and the worker on the in-memory table (docs/coordination.md §11).

use std::collections::BTreeSet;
use std::time::Duration;

use super::decide::{self, Observations, View};
use super::memory::{Faults, MemoryLeaseTable};
use super::*;
use crate::ids::ShardId;
use crate::position::LeaseCheckpoint;

const SECOND: u64 = 1000;

fn at(ms: u64) -> LocalTime {
    LocalTime::from_millis(ms)
}

fn worker_id(id: &str) -> WorkerId {
    WorkerId::new(id).unwrap()
}

fn shard(id: &str) -> UnitId {
    UnitId::Shard(ShardId::new(id))
}

fn lease(unit: UnitId, owner: Option<&str>, counter: u64) -> Lease {
    Lease {
        owner: owner.map(worker_id),
        counter: LeaseCounter(counter),
        ..Lease::new(unit, Vec::new(), 0)
    }
}

fn segment(index: u32) -> UnitId {
    UnitId::Segment { index, total: 8 }
}

/// The units `me` claims from `leases`, observed at 0 and decided at `now`.
fn claims(me: &str, leases: &[Lease], held: &[UnitId], now: u64) -> Vec<(UnitId, Option<String>)> {
    let mut observations = Observations::default();
    observations.observe(leases, at(0));
    let me = worker_id(me);
    let held: BTreeSet<UnitId> = held.iter().cloned().collect();
    let plan = decide::plan(&View {
        me: &me,
        leases,
        held: &held,
        observations: &observations,
        now: at(now),
        duration: Duration::from_secs(10),
        max_steals: 1,
    });
    plan.claims
        .into_iter()
        .map(|c| (c.unit, c.victim.map(|v| v.to_string())))
        .collect()
}

#[test]
fn a_lease_expires_when_its_counter_stood_still_for_a_duration_of_the_observers_clock() {
    let duration = Duration::from_secs(10);
    let mut observations = Observations::default();
    let mut row = lease(segment(0), Some("a"), 4);
    // The wall clock of the row says it is ancient: expiry never looks at it (§11.3).
    row.written_ms = 1;
    observations.observe(std::slice::from_ref(&row), at(100 * SECOND));
    assert!(!observations.is_expired(&row, at(109 * SECOND), duration));
    assert!(observations.is_expired(&row, at(110 * SECOND), duration));
    row.counter = LeaseCounter(5);
    observations.observe(std::slice::from_ref(&row), at(105 * SECOND));
    assert!(
        !observations.is_expired(&row, at(114 * SECOND), duration),
        "a new counter starts the clock again"
    );
    observations.observe(std::slice::from_ref(&row), at(114 * SECOND));
    assert!(observations.is_expired(&row, at(115 * SECOND), duration));
    row.owner = None;
    assert!(
        !observations.is_expired(&row, at(999 * SECOND), duration),
        "nobody to expire"
    );
}

#[test]
fn a_child_is_taken_only_after_every_parent_with_a_row_is_finished() {
    let mut parent = lease(shard("p"), Some("b"), 3);
    let child = Lease {
        parents: vec![shard("p"), shard("trimmed")],
        ..lease(shard("c"), None, 0)
    };
    let leases = [parent.clone(), child.clone()];
    assert!(
        claims("a", &leases, &[], SECOND).is_empty(),
        "parent p is processing"
    );
    parent.state = LeaseState::ShardEnd;
    parent.owner = None;
    let leases = [parent, child.clone()];
    assert_eq!(claims("a", &leases, &[], SECOND), [(shard("c"), None)]);
    assert_eq!(
        claims("a", &[child], &[], SECOND),
        [(shard("c"), None)],
        "parents without a row do not hold a child back"
    );
}

#[test]
fn free_leases_are_taken_up_to_the_fair_share() {
    // Seven units, two live workers: a share of four; b holds three.
    let mut leases: Vec<Lease> = (0..3).map(|i| lease(segment(i), Some("b"), 1)).collect();
    leases.extend((3..7).map(|i| lease(segment(i), None, 0)));
    leases.push(lease(segment(7), None, 9));
    leases[7].state = LeaseState::Done;
    let claimed = claims("a", &leases, &[], SECOND);
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    assert!(
        claimed
            .iter()
            .all(|(unit, victim)| victim.is_none() && *unit >= segment(3))
    );
}

#[test]
fn expired_leases_are_free_and_their_owner_is_not_counted_live() {
    let leases: Vec<Lease> = (0..4).map(|i| lease(segment(i), Some("dead"), 1)).collect();
    let before = claims("a", &leases, &[], 9 * SECOND);
    assert_eq!(before.len(), 1, "live until expired: one steal, {before:?}");
    assert_eq!(before[0].1.as_deref(), Some("dead"));
    let after = claims("a", &leases, &[], 10 * SECOND);
    assert_eq!(
        after.len(),
        4,
        "expired: all free, the share is all, {after:?}"
    );
    assert!(after.iter().all(|(_, victim)| victim.is_none()));
}

#[test]
fn leases_left_under_this_workers_id_are_taken_back_at_once() {
    let leases = [
        lease(segment(0), Some("a"), 7),
        lease(segment(1), Some("b"), 1),
    ];
    assert_eq!(claims("a", &leases, &[], 0), [(segment(0), None)]);
}

#[test]
fn a_worker_below_its_share_steals_one_lease_per_round_from_the_busiest() {
    let mut leases: Vec<Lease> = (0..4).map(|i| lease(segment(i), Some("b"), 1)).collect();
    leases.push(lease(segment(4), Some("c"), 1));
    // Five units, three live workers: a share of two; b holds four, a none.
    let claimed = claims("a", &leases, &[], SECOND);
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].1.as_deref(), Some("b"));
}

#[test]
fn nobody_steals_from_a_worker_that_holds_just_its_share() {
    // Five units, two workers: b holds three (the share), a two.
    let leases: Vec<Lease> = (0..5)
        .map(|i| lease(segment(i), Some(if i < 3 { "b" } else { "a" }), 1))
        .collect();
    let held = [segment(3), segment(4)];
    assert!(claims("a", &leases, &held, SECOND).is_empty());
    // Four units, three workers: b and c hold two each, a none: a takes one.
    let leases: Vec<Lease> = (0..4)
        .map(|i| lease(segment(i), Some(if i < 2 { "b" } else { "c" }), 1))
        .collect();
    assert_eq!(claims("a", &leases, &[], SECOND).len(), 1);
}

#[test]
fn the_leader_lease_is_claimed_when_free_and_counts_for_no_share() {
    let leases = [
        lease(UnitId::Leader, None, 0),
        lease(segment(0), Some("b"), 1),
    ];
    assert_eq!(claims("a", &leases, &[], SECOND), [(UnitId::Leader, None)]);
}

#[test]
fn the_leader_creates_parents_before_children_and_deletes_trimmed_finished_rows() {
    let discovered = [
        UnitSpec::new(shard("grandchild"), vec![shard("child")]),
        UnitSpec::new(shard("child"), vec![shard("root"), shard("trimmed")]),
        UnitSpec::new(shard("root"), vec![shard("ended")]),
    ];
    let mut ended = lease(shard("ended"), None, 4);
    ended.state = LeaseState::ShardEnd;
    let mut gone = lease(shard("gone"), None, 6);
    gone.state = LeaseState::ShardEnd;
    let unfinished = lease(shard("vanished"), Some("a"), 2);
    let plan = decide::sync(&[ended, gone, unfinished], &discovered, 0);
    let created: Vec<&UnitId> = plan.create.iter().map(|l| &l.unit).collect();
    assert_eq!(
        created,
        [&shard("root"), &shard("child"), &shard("grandchild")]
    );
    assert_eq!(
        plan.create[1].parents,
        vec![shard("root"), shard("trimmed")]
    );
    assert_eq!(
        plan.delete,
        [(shard("gone"), LeaseCounter(6))],
        "a finished row still named as a parent stays, an unfinished one is never deleted"
    );
}

#[test]
fn a_spec_gives_its_row_a_first_checkpoint_and_state_and_a_finished_parent_frees_its_child() {
    let discovered = [
        UnitSpec::new(shard("closed"), Vec::new()).starting(LeaseCheckpoint::ShardEnd),
        UnitSpec::new(shard("open"), vec![shard("closed")])
            .starting(LeaseCheckpoint::Latest { since_ms: 7 }),
    ];
    let plan = decide::sync(&[], &discovered, 0);
    let rows: Vec<(&UnitId, Option<String>, LeaseState)> = plan
        .create
        .iter()
        .map(|l| {
            (
                &l.unit,
                l.checkpoint.as_ref().map(LeaseCheckpoint::encode),
                l.state,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (&shard("closed"), Some("end".into()), LeaseState::ShardEnd),
            (&shard("open"), Some("latest:7".into()), LeaseState::Pending)
        ]
    );
    // The finished parent holds nothing back: the child is claimed at once.
    let claimed = claims("a", &plan.create, &[], SECOND);
    assert_eq!(claimed, [(shard("open"), None)]);
}

fn pipeline() -> PipelineName {
    PipelineName::new("p").unwrap()
}

fn worker(table: &MemoryLeaseTable, id: &str) -> Worker<MemoryLeaseTable> {
    let settings = LeaseSettings::new(10).unwrap();
    Worker::new(table.connect(), pipeline(), worker_id(id), settings)
}

/// A table with `n` segment rows, and worker `a` holding all of them and the leader lease.
async fn one_worker_holding(n: u32) -> (MemoryLeaseTable, Worker<MemoryLeaseTable>) {
    let table = MemoryLeaseTable::seeded(7);
    let mut a = worker(&table, "a");
    assert!(a.round(at(0)).await.unwrap().leader);
    a.sync(&UnitSpec::segments(n)).await.unwrap();
    let report = a.round(at(SECOND)).await.unwrap();
    assert_eq!(report.taken.len(), n as usize);
    (table, a)
}

#[test]
fn a_lease_duration_is_3_to_300_seconds() {
    assert!(LeaseSettings::new(2).is_err() && LeaseSettings::new(301).is_err());
    let settings = LeaseSettings::new(9).unwrap();
    assert_eq!(settings.renew_interval(), Duration::from_secs(3));
}

#[tokio::test]
async fn a_paused_worker_cannot_checkpoint_after_its_lease_expired() {
    let (table, mut a) = one_worker_holding(2).await;
    let unit = UnitId::Segment { index: 0, total: 2 };
    a.checkpoint(&unit, &cursor("1"), at(2 * SECOND))
        .await
        .unwrap();
    // a pauses; b sees the counters stand still for a duration and takes everything.
    let mut b = worker(&table, "b");
    b.round(at(0)).await.unwrap();
    let report = b.round(at(10 * SECOND)).await.unwrap();
    assert_eq!(report.taken.len(), 2);
    assert_eq!(report.taken[0].checkpoint, Some(cursor("1")));
    let writes = table.log().len();
    let refused = a.checkpoint(&unit, &cursor("2"), at(12 * SECOND)).await;
    assert!(
        matches!(&refused, Err(CheckpointError::Lost(lost)) if lost.reason == LostReason::Expired),
        "{refused:?}"
    );
    assert_eq!(table.log().len(), writes, "refused without a write");
    // Its other lease: written recently enough by its own clock, but stolen: the condition.
    let other = UnitId::Segment { index: 1, total: 2 };
    let refused = a.checkpoint(&other, &cursor("5"), at(2 * SECOND)).await;
    assert!(
        matches!(&refused, Err(CheckpointError::Lost(lost)) if lost.reason == LostReason::Taken),
        "{refused:?}"
    );
    assert!(a.units().is_empty());
    let row = table.row(&pipeline(), &unit).unwrap();
    assert_eq!(
        (row.owner, row.checkpoint),
        (Some(worker_id("b")), Some(cursor("1")))
    );
}

#[tokio::test]
async fn a_round_reports_the_leases_another_worker_took() {
    let (table, mut a) = one_worker_holding(2).await;
    let unit = UnitId::Segment { index: 1, total: 2 };
    let row = table.row(&pipeline(), &unit).unwrap();
    table
        .connect()
        .take(&pipeline(), &unit, row.counter, &worker_id("b"))
        .await
        .unwrap();
    let report = a.round(at(2 * SECOND)).await.unwrap();
    assert_eq!(
        report.lost,
        [Lost {
            unit: unit.clone(),
            reason: LostReason::Taken
        }]
    );
    assert_eq!(a.units(), [UnitId::Segment { index: 0, total: 2 }]);
    assert_eq!(a.counter(&unit), None);
}

#[tokio::test]
async fn a_checkpoint_whose_answer_was_lost_is_settled_not_lost() {
    let (table, mut a) = one_worker_holding(1).await;
    let unit = UnitId::Segment { index: 0, total: 1 };
    let before = a.counter(&unit).unwrap();
    table.set_faults(Faults {
        lost_reply_rate: 1.0,
        ..Faults::default()
    });
    let first = a.checkpoint(&unit, &cursor("3"), at(2 * SECOND)).await;
    assert!(
        matches!(first, Err(CheckpointError::Request(_))),
        "{first:?}"
    );
    table.set_faults(Faults::default());
    let writes = table.log().len();
    let retried = a
        .checkpoint(&unit, &cursor("3"), at(2 * SECOND))
        .await
        .unwrap();
    assert_eq!(Some(retried), before.next());
    assert_eq!(
        table.log().len(),
        writes,
        "the applied checkpoint is not written twice"
    );
    assert_eq!(a.counter(&unit), before.next());
    // The next round renews on the settled counter.
    let report = a.round(at(5 * SECOND)).await.unwrap();
    assert!(
        report.lost.is_empty() && report.transient.is_empty(),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_finished_unit_is_handed_back_and_never_taken_again() {
    let (table, mut a) = one_worker_holding(1).await;
    let unit = UnitId::Segment { index: 0, total: 1 };
    a.checkpoint(&unit, &LeaseCheckpoint::Done, at(2 * SECOND))
        .await
        .unwrap();
    assert!(a.units().is_empty());
    let mut b = worker(&table, "b");
    b.round(at(0)).await.unwrap();
    assert!(b.round(at(60 * SECOND)).await.unwrap().taken.is_empty());
    let row = table.row(&pipeline(), &unit).unwrap();
    assert_eq!((row.owner, row.state), (None, LeaseState::Done));
}

#[tokio::test]
async fn released_leases_are_taken_at_once_without_waiting_for_expiry() {
    let (table, mut a) = one_worker_holding(3).await;
    let mut b = worker(&table, "b");
    assert_eq!(b.round(at(0)).await.unwrap().taken.len(), 1, "one steal");
    let failed = a.release_all().await;
    assert_eq!(failed.len(), 1, "the stolen lease is not a's to hand back");
    let report = b.round(at(SECOND)).await.unwrap();
    assert_eq!(report.taken.len(), 2);
    assert!(report.leader && b.units().len() == 3);
}

#[tokio::test]
async fn a_worker_with_nothing_steals_one_lease_per_round_until_balanced() {
    let (table, mut a) = one_worker_holding(4).await;
    let mut b = worker(&table, "b");
    let mut counts = Vec::new();
    for round in 0..4u64 {
        let now = at(round * 3_400);
        a.round(now).await.unwrap();
        let report = b.round(now).await.unwrap();
        assert!(report.taken.len() <= 1);
        assert!(
            report
                .taken
                .iter()
                .all(|t| t.stolen_from == Some(worker_id("a")))
        );
        counts.push((a.units().len(), b.units().len()));
    }
    assert_eq!(counts, [(4, 1), (3, 2), (2, 2), (2, 2)]);
}

#[tokio::test]
async fn a_row_whose_counter_cannot_move_on_stops_the_workers_naming_it() {
    let (table, mut a) = one_worker_holding(2).await;
    let unit = UnitId::Segment { index: 1, total: 2 };
    // Edited by hand mid-run to the largest counter DynamoDB's number can be read into.
    table.edit(&pipeline(), &unit, |row| {
        row.counter = LeaseCounter(u64::MAX)
    });
    let writes = table.log().len();
    let stopped = a.round(at(5 * SECOND)).await;
    let said = stopped.expect_err("the holder stops").to_string();
    assert!(
        said.contains("'segment:1/2'")
            && said.contains(&u64::MAX.to_string())
            && said.contains("state reset"),
        "{said}"
    );
    // Another worker sees the row stand still and tries to take it over: it stops too, instead
    // of holding a lease whose counter never moves.
    let mut b = worker(&table, "b");
    let mut failed = None;
    for second in [0, 10, 20] {
        if let Err(error) = b.round(at(second * SECOND)).await {
            failed = Some(error.to_string());
            break;
        }
    }
    let said = failed.expect("the other worker stops within a lease duration");
    assert!(said.contains("'segment:1/2'"), "{said}");
    let row = table.row(&pipeline(), &unit).unwrap();
    assert_eq!(
        (row.counter, row.owner),
        (LeaseCounter(u64::MAX), Some(worker_id("a"))),
        "the row is not written"
    );
    assert!(
        table
            .log_since(writes)
            .iter()
            .all(|write| write.unit != unit),
        "no write reached the row"
    );
}

/// A keeper reading the tokio clock, set so that it reads `now` at once.
fn keeper_at(worker: &Worker<MemoryLeaseTable>, now: LocalTime) -> KeeperHandle {
    let origin = tokio::time::Instant::now() - now.since_origin();
    worker
        .keeper()
        .spawn(move || LocalTime::new(origin.elapsed()))
}

#[tokio::test(start_paused = true)]
async fn a_keeper_keeps_the_leases_of_a_worker_whose_rounds_stall() {
    // One unit: b's share is one, and it steals nothing from a live a.
    let (table, a) = one_worker_holding(1).await;
    let mut keeper = keeper_at(&a, at(SECOND));
    // a runs no round for a minute (its loop waits on a slow write); b runs its rounds.
    let mut b = worker(&table, "b");
    for round in 0..18 {
        let report = b.round(at(round * 3_340)).await.unwrap();
        assert!(report.taken.is_empty(), "round {round}: {report:?}");
        tokio::time::sleep(Duration::from_millis(3_340)).await;
    }
    assert_eq!(a.units().len(), 1, "a still holds its unit");
    let event = tokio::time::timeout(Duration::ZERO, keeper.next()).await;
    assert!(event.is_err(), "nothing lost: {event:?}");
    // Without the keeper, b takes them a duration after it saw them stand still.
    drop(keeper);
    let first = b.round(at(18 * 3_340)).await.unwrap();
    assert!(first.taken.is_empty());
    let later = b.round(at(18 * 3_340 + 10 * SECOND)).await.unwrap();
    assert_eq!(later.taken.len(), 1, "{later:?}");
}

#[tokio::test]
async fn a_renewal_refused_is_a_lost_lease_the_keeper_reports() {
    let (table, a) = one_worker_holding(2).await;
    let unit = UnitId::Segment { index: 1, total: 2 };
    let row = table.row(&pipeline(), &unit).unwrap();
    table
        .connect()
        .take(&pipeline(), &unit, row.counter, &worker_id("b"))
        .await
        .unwrap();
    let keeper = a.keeper();
    let renewal = a.settings().renew_interval();
    let early = keeper.pass(at(2 * SECOND)).await.unwrap();
    assert!(early.lost.is_empty(), "nothing due yet");
    // The leader and presence leases were written at 0.
    assert_eq!(early.next, at(0).plus(renewal));
    let pass = keeper.pass(at(5 * SECOND)).await.unwrap();
    assert_eq!(
        pass.lost,
        [Lost {
            unit: unit.clone(),
            reason: LostReason::Taken
        }]
    );
    assert_eq!(a.units(), [UnitId::Segment { index: 0, total: 2 }]);
    assert_eq!(pass.next, at(5 * SECOND).plus(renewal), "renewed at 5 s");
    // Not renewed for a duration (the table failed every request): lost, and said so.
    table.set_faults(Faults {
        fail_rate: 1.0,
        ..Faults::default()
    });
    let failing = keeper.pass(at(9 * SECOND)).await.unwrap();
    assert!(failing.lost.is_empty() && !failing.transient.is_empty());
    assert!(
        failing.next < at(10 * SECOND),
        "retried soon: {:?}",
        failing.next
    );
    let expired = keeper.pass(at(15 * SECOND)).await.unwrap();
    assert_eq!(
        expired.lost,
        [Lost {
            unit: UnitId::Segment { index: 0, total: 2 },
            reason: LostReason::Expired
        }]
    );
    assert!(a.units().is_empty());
}

#[tokio::test]
async fn a_round_says_when_a_lease_it_saw_standing_still_expires() {
    let (table, _a) = one_worker_holding(2).await;
    let mut b = worker(&table, "b");
    let first = b.round(at(4 * SECOND)).await.unwrap();
    assert_eq!(first.next_expiry, Some(at(14 * SECOND)));
    let at_expiry = b.round(at(14 * SECOND)).await.unwrap();
    assert_eq!(at_expiry.taken.len(), 2, "{at_expiry:?}");
}

#[tokio::test]
async fn each_process_holds_its_presence_row_which_nobody_else_takes() {
    let (table, a) = one_worker_holding(1).await;
    let presence = UnitId::Worker("a".into());
    let row = table.row(&pipeline(), &presence).unwrap();
    assert_eq!(row.owner, Some(worker_id("a")), "{row:?}");
    assert!(a.units().len() == 1 && !presence.is_work());
    // b sees a's presence stand still past a duration: it takes its own, not a's.
    let mut b = worker(&table, "b");
    b.round(at(0)).await.unwrap();
    b.round(at(20 * SECOND)).await.unwrap();
    let rows = table.rows(&pipeline());
    let owner = |unit: &UnitId| rows.iter().find(|r| &r.unit == unit).unwrap().owner.clone();
    assert_eq!(owner(&presence), Some(worker_id("a")));
    assert_eq!(owner(&UnitId::Worker("b".into())), Some(worker_id("b")));
    // b leads now (a's leader lease expired for it): it deletes a's dead presence row.
    assert!(b.is_leader());
    b.sync(&UnitSpec::segments(1)).await.unwrap();
    assert!(table.row(&pipeline(), &presence).is_none());
    // A graceful stop deletes the process's own presence row.
    assert!(b.release_all().await.is_empty());
    assert!(
        table
            .row(&pipeline(), &UnitId::Worker("b".into()))
            .is_none()
    );
}

/// A segment's cursor at key `pk`.
fn cursor(pk: &str) -> LeaseCheckpoint {
    LeaseCheckpoint::Cursor(ddbpipe_value::Item::from([(
        "pk".to_string(),
        ddbpipe_value::Value::S(pk.to_string()),
    )]))
}
