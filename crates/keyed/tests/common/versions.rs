//! Scenarios of docs/mirror.md §5.6 (versions: snapshot rows beside stream changes), run by
//! both backend tests against a table keyed by one `S` attribute. Each backend supplies a
//! [`Look`] to read the table and the deleted-key markers behind ddbpipe's back.
//!
//! Times: a stream change stamped `T`, a page read at `p`; `p` holds a row back while the
//! stream wrote the key at more than `p − 61 000 ms` (1 s of rounding and the 60 s margin).

use std::collections::BTreeMap;

use ddbpipe_keyed::{CloseSnapshot, Closed, Database, RowChange, StateWrite, TableSpec, Version};

use super::{s, state_at};

/// Calls `$each!(<scenario>)` for every scenario below: each backend's test file defines
/// `$each` to run one scenario on its database, so both run the same list.
#[macro_export]
macro_rules! each_versions_scenario {
    ($each:ident) => {
        $each!(a_stream_upsert_during_an_open_snapshot_marks_the_row_and_records_its_version);
        $each!(
            a_snapshot_row_within_the_margin_of_a_stream_change_is_skipped_and_a_later_one_is_written
        );
        $each!(
            a_stream_delete_leaves_a_marker_and_only_a_page_read_after_the_cutoff_resurrects_the_item
        );
        $each!(rows_from_before_the_snapshot_never_hold_a_snapshot_row_back);
        $each!(replaying_a_batch_of_changes_and_pages_changes_nothing);
        $each!(close_snapshot_drops_the_markers_and_the_cleanup_keeps_stream_written_keys);
        $each!(a_snapshot_row_without_a_version_is_written_as_before_versions);
        $each!(a_repair_change_applies_only_over_an_older_row_and_marks_the_row_either_way);
        $each!(closing_a_repair_window_deletes_the_rows_streamed_inside_it_that_it_did_not_mark);
        $each!(a_shared_repair_window_is_applied_under_its_record_and_closed_once);
        $each!(a_batch_of_stream_changes_ends_as_its_changes_applied_one_by_one);
    };
}

/// 2026-01-01T00:00:00Z: when the stream changes of the scenarios happen.
pub const T: i64 = 1_767_225_600_000;
/// A second of rounding and the 60 s margin: a page read this long after a change is newer.
pub const MARGIN_MS: i64 = 61_000;

/// One destination row as the scenarios look at it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The document, parsed (PostgreSQL's `jsonb` reformats it).
    pub doc: serde_json::Value,
    /// `_ddbpipe_snapshot`.
    pub marker: Option<i64>,
    /// `_ddbpipe_version_ms`.
    pub version_ms: Option<i64>,
    /// `_ddbpipe_version_seq`.
    pub version_seq: Option<String>,
}

/// A deleted-key marker: (table name, key text, version_ms).
pub type Marker = (String, String, Option<i64>);

/// Reads a backend's tables directly.
// Only this test crate implements and calls it, so `Send` bounds on the futures do not matter.
#[allow(async_fn_in_trait)]
pub trait Look {
    /// The rows of `spec`'s table by key (its one `S` key column).
    async fn rows(&self, spec: &TableSpec) -> BTreeMap<String, Seen>;
    /// Every row of `_ddbpipe_deleted`, sorted.
    async fn markers(&self) -> Vec<Marker>;
}

pub fn seen(doc: &str, marker: Option<i64>, version_ms: Option<i64>, seq: Option<&str>) -> Seen {
    Seen {
        doc: serde_json::from_str(doc).expect("a JSON document"),
        marker,
        version_ms,
        version_seq: seq.map(str::to_string),
    }
}

/// A stream upsert (`c`/`u`) stamped `at_ms` with sequence number `seq`.
pub fn change(key: &str, doc: &str, at_ms: i64, seq: &str) -> RowChange {
    RowChange::Upsert {
        key: vec![s(key)],
        document: doc.to_string(),
        columns: Vec::new(),
        snapshot: false,
        version: Version {
            at_ms: Some(at_ms),
            sequence: Some(seq.to_string()),
            repair: None,
        },
    }
}

/// A stream delete stamped `at_ms`.
pub fn deleted(key: &str, at_ms: i64, seq: &str) -> RowChange {
    RowChange::Delete {
        key: vec![s(key)],
        version: Version {
            at_ms: Some(at_ms),
            sequence: Some(seq.to_string()),
            repair: None,
        },
    }
}

/// A snapshot row (`op: "r"`) of a page read at `read_ms`, when known.
pub fn snapshot_row(key: &str, doc: &str, read_ms: Option<i64>) -> RowChange {
    RowChange::Upsert {
        key: vec![s(key)],
        document: doc.to_string(),
        columns: Vec::new(),
        snapshot: true,
        version: Version {
            at_ms: read_ms,
            sequence: None,
            repair: None,
        },
    }
}

/// A change of repair `id`'s incremental export written at `at_ms`: an upsert of `doc`, or a
/// delete when `doc` is `None`.
pub fn repaired(key: &str, doc: Option<&str>, at_ms: i64, id: i64) -> RowChange {
    let version = Version {
        at_ms: Some(at_ms),
        sequence: None,
        repair: Some(id),
    };
    match doc {
        Some(doc) => RowChange::Upsert {
            key: vec![s(key)],
            document: doc.to_string(),
            columns: Vec::new(),
            snapshot: false,
            version,
        },
        None => RowChange::Delete {
            key: vec![s(key)],
            version,
        },
    }
}

/// The marker of a one-string key `key` in `spec`'s table.
pub fn marker(spec: &TableSpec, key: &str, version_ms: i64) -> Marker {
    (
        spec.table.clone(),
        format!(r#"[{{"S":"{key}"}}]"#),
        Some(version_ms),
    )
}

async fn apply(db: &Database, spec: &TableSpec, rows: &[RowChange], snapshot: Option<i64>) {
    db.apply(spec, rows, snapshot, &StateWrite::default())
        .await
        .expect("apply");
}

fn rows_of(rows: &[(&str, Seen)]) -> BTreeMap<String, Seen> {
    rows.iter()
        .map(|(key, row)| (key.to_string(), row.clone()))
        .collect()
}

pub async fn a_stream_upsert_during_an_open_snapshot_marks_the_row_and_records_its_version(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    // `a` from an earlier snapshot.
    let page = snapshot_row("a", r#"{"v":0}"#, Some(T - 100_000));
    apply(db, spec, &[page], Some(3)).await;

    let rows = [
        change("a", r#"{"v":1}"#, T, "100"),
        change("b", r#"{"v":1}"#, T + 1000, "200"),
    ];
    apply(db, spec, &rows, Some(7)).await;
    assert_eq!(
        look.rows(spec).await,
        rows_of(&[
            ("a", seen(r#"{"v":1}"#, Some(7), Some(T), Some("100"))),
            (
                "b",
                seen(r#"{"v":1}"#, Some(7), Some(T + 1000), Some("200"))
            ),
        ])
    );

    // With no snapshot open the marker stays as it is; the version is recorded all the same.
    let rows = [
        change("a", r#"{"v":2}"#, T + 2000, "300"),
        change("c", r#"{"v":1}"#, T + 2000, "301"),
    ];
    apply(db, spec, &rows, None).await;
    let after = look.rows(spec).await;
    assert_eq!(
        after["a"],
        seen(r#"{"v":2}"#, Some(7), Some(T + 2000), Some("300"))
    );
    assert_eq!(
        after["c"],
        seen(r#"{"v":1}"#, None, Some(T + 2000), Some("301"))
    );
}

pub async fn a_snapshot_row_within_the_margin_of_a_stream_change_is_skipped_and_a_later_one_is_written(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    let stream = seen(r#"{"v":"stream"}"#, Some(7), Some(T), Some("100"));
    apply(
        db,
        spec,
        &[change("a", r#"{"v":"stream"}"#, T, "100")],
        Some(7),
    )
    .await;

    // Read 1 ms too early to be sure it saw the change: skipped.
    let early = snapshot_row("a", r#"{"v":"page"}"#, Some(T + MARGIN_MS - 1));
    apply(db, spec, &[early], Some(7)).await;
    assert_eq!(look.rows(spec).await["a"], stream);

    // In one batch with the change as well.
    let batch = [
        change("b", r#"{"v":"stream"}"#, T, "101"),
        snapshot_row("b", r#"{"v":"page"}"#, Some(T + 1000)),
    ];
    apply(db, spec, &batch, Some(7)).await;
    assert_eq!(look.rows(spec).await["b"].doc, stream.doc);

    // Read at the cutoff: the page is newer, written without a sequence.
    let later = snapshot_row("a", r#"{"v":"page"}"#, Some(T + MARGIN_MS));
    apply(db, spec, &[later], Some(7)).await;
    assert_eq!(
        look.rows(spec).await["a"],
        seen(r#"{"v":"page"}"#, Some(7), Some(T + MARGIN_MS), None)
    );

    // A page of this snapshot (no sequence) never holds a later page back.
    let again = snapshot_row("a", r#"{"v":"again"}"#, Some(T + MARGIN_MS + 500));
    apply(db, spec, &[again], Some(7)).await;
    assert_eq!(
        look.rows(spec).await["a"],
        seen(r#"{"v":"again"}"#, Some(7), Some(T + MARGIN_MS + 500), None)
    );
}

pub async fn a_stream_delete_leaves_a_marker_and_only_a_page_read_after_the_cutoff_resurrects_the_item(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    // `a` and `b` from before the snapshot.
    let before = [
        change("a", r#"{"v":0}"#, T - 100_000, "50"),
        change("b", r#"{"v":0}"#, T - 100_000, "51"),
    ];
    apply(db, spec, &before, None).await;

    apply(db, spec, &[deleted("a", T, "100")], Some(7)).await;
    assert!(!look.rows(spec).await.contains_key("a"));
    assert_eq!(look.markers().await, [marker(spec, "a", T)]);

    let early = snapshot_row("a", r#"{"v":"page"}"#, Some(T + MARGIN_MS - 1));
    apply(db, spec, &[early], Some(7)).await;
    assert!(!look.rows(spec).await.contains_key("a"), "resurrected");

    let later = snapshot_row("a", r#"{"v":"page"}"#, Some(T + MARGIN_MS));
    apply(db, spec, &[later], Some(7)).await;
    assert_eq!(
        look.rows(spec).await["a"],
        seen(r#"{"v":"page"}"#, Some(7), Some(T + MARGIN_MS), None)
    );

    // With no snapshot open, a delete leaves no marker.
    apply(db, spec, &[deleted("b", T, "101")], None).await;
    assert!(!look.rows(spec).await.contains_key("b"));
    assert_eq!(look.markers().await, [marker(spec, "a", T)]);
}

pub async fn rows_from_before_the_snapshot_never_hold_a_snapshot_row_back(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    // Written at T: `a` by a change outside any snapshot, `b` by a change during snapshot 6,
    // `c` by a page of snapshot 6.
    apply(db, spec, &[change("a", r#"{"v":0}"#, T, "100")], None).await;
    let six = [
        change("b", r#"{"v":0}"#, T, "101"),
        snapshot_row("c", r#"{"v":0}"#, Some(T)),
    ];
    apply(db, spec, &six, Some(6)).await;

    // Snapshot 7 reads them at T, well within the margin of their versions.
    let pages: Vec<RowChange> = ["a", "b", "c"]
        .iter()
        .map(|key| snapshot_row(key, r#"{"v":"page"}"#, Some(T)))
        .collect();
    apply(db, spec, &pages, Some(7)).await;
    let page = seen(r#"{"v":"page"}"#, Some(7), Some(T), None);
    assert_eq!(
        look.rows(spec).await,
        rows_of(&[("a", page.clone()), ("b", page.clone()), ("c", page)])
    );
}

pub async fn replaying_a_batch_of_changes_and_pages_changes_nothing(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    apply(
        db,
        spec,
        &[change("x", r#"{"v":0}"#, T - 200_000, "1")],
        None,
    )
    .await;
    let batch = [
        snapshot_row("a", r#"{"v":"page"}"#, Some(T)),
        change("a", r#"{"v":1}"#, T + 500, "110"),
        snapshot_row("b", r#"{"v":"page"}"#, Some(T)),
        deleted("b", T + 500, "111"),
        snapshot_row("b", r#"{"v":"page"}"#, Some(T + 1000)),
        deleted("x", T, "112"),
        change("c", r#"{"v":1}"#, T, "113"),
        snapshot_row("c", r#"{"v":"page"}"#, Some(T + 2000)),
        snapshot_row("d", r#"{"v":"page"}"#, Some(T + 2000)),
    ];
    let write = state_at("2026-01-01T00:00:05.000Z", "p", &[("position", "1")], &[]);
    db.apply(spec, &batch, Some(7), &write).await.expect("once");
    let (rows, markers) = (look.rows(spec).await, look.markers().await);
    let state = db.load_state("p").await.expect("load");
    db.apply(spec, &batch, Some(7), &write)
        .await
        .expect("twice");
    assert_eq!(look.rows(spec).await, rows);
    assert_eq!(look.markers().await, markers);
    assert_eq!(db.load_state("p").await.expect("load"), state);

    assert_eq!(rows.keys().collect::<Vec<_>>(), ["a", "c", "d"]);
    assert_eq!(rows["a"].version_seq.as_deref(), Some("110"));
    assert_eq!(rows["c"].version_seq.as_deref(), Some("113"));
    assert_eq!(markers, [marker(spec, "b", T + 500), marker(spec, "x", T)]);
}

pub async fn close_snapshot_drops_the_markers_and_the_cleanup_keeps_stream_written_keys(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    let other = TableSpec {
        table: format!("{}_other", spec.table),
        ..spec.clone()
    };
    db.prepare(&other).await.expect("prepare other");
    let before = ["kept", "unseen", "gone"].map(|key| change(key, "{}", T - 100_000, "1"));
    apply(db, spec, &before, None).await;

    let during = [
        change("kept", r#"{"v":1}"#, T, "100"),
        change("new", r#"{"v":1}"#, T, "101"),
        deleted("gone", T, "102"),
        snapshot_row("paged", r#"{"v":1}"#, Some(T + 1000)),
        // Held back by the change to `kept`, which stays seen.
        snapshot_row("kept", r#"{"v":0}"#, Some(T + 1000)),
    ];
    apply(db, spec, &during, Some(7)).await;
    apply(db, &other, &[deleted("z", T, "1")], Some(7)).await;
    assert_eq!(
        look.markers().await,
        [marker(spec, "gone", T), marker(&other, "z", T)]
    );

    let close = CloseSnapshot {
        id: 7,
        delete_unseen: true,
        max_keys: 10,
    };
    let write = state_at(
        "2026-01-01T00:00:05.000Z",
        "p",
        &[("snapshot", "null")],
        &[],
    );
    let closed = db.close_snapshot(spec, close, &write).await.expect("close");
    assert_eq!(
        closed,
        Closed {
            keys_written: 3,
            deleted: 1,
            ceiling_hit: false,
        }
    );
    assert_eq!(
        look.rows(spec).await.keys().collect::<Vec<_>>(),
        ["kept", "new", "paged"]
    );
    // Only this table's markers go.
    assert_eq!(look.markers().await, [marker(&other, "z", T)]);

    // Closing without deletes drops them too.
    let close = CloseSnapshot {
        delete_unseen: false,
        ..close
    };
    db.close_snapshot(&other, close, &StateWrite::default())
        .await
        .expect("close other");
    assert_eq!(look.markers().await, []);
}

pub async fn a_snapshot_row_without_a_version_is_written_as_before_versions(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    let stream = [change("a", r#"{"v":1}"#, T, "100"), deleted("b", T, "101")];
    apply(db, spec, &stream, Some(7)).await;
    let pages = [
        snapshot_row("a", r#"{"v":"page"}"#, None),
        snapshot_row("b", r#"{"v":"page"}"#, None),
    ];
    apply(db, spec, &pages, Some(7)).await;
    let page = seen(r#"{"v":"page"}"#, Some(7), None, None);
    assert_eq!(
        look.rows(spec).await,
        rows_of(&[("a", page.clone()), ("b", page)])
    );
}

/// docs/streams.md §4.12: a repair's change replaces a row only when the row is older (a stream
/// change's time below the write time; a snapshot's read time below it plus the 60 s margin; no
/// version), and marks the row with the repair id either way. Replaying the batch changes
/// nothing.
pub async fn a_repair_change_applies_only_over_an_older_row_and_marks_the_row_either_way(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    let before = [
        change("older", r#"{"v":"stream"}"#, T, "100"),
        change("newer", r#"{"v":"stream"}"#, T + 2000, "101"),
        change("gone", r#"{"v":"stream"}"#, T, "102"),
        change("kept", r#"{"v":"stream"}"#, T + 2000, "103"),
    ];
    apply(db, spec, &before, None).await;
    apply(
        db,
        spec,
        &[snapshot_row("paged", r#"{"v":"page"}"#, Some(T + 30_000))],
        Some(3),
    )
    .await;
    let repair = [
        repaired("older", Some(r#"{"v":"export"}"#), T + 500, 9),
        repaired("newer", Some(r#"{"v":"export"}"#), T + 1000, 9),
        repaired("paged", Some(r#"{"v":"export"}"#), T + 1000, 9),
        repaired("missing", Some(r#"{"v":"export"}"#), T + 1000, 9),
        repaired("gone", None, T + 500, 9),
        repaired("kept", None, T + 1000, 9),
    ];
    let expected = rows_of(&[
        (
            "older",
            seen(r#"{"v":"export"}"#, Some(9), Some(T + 500), None),
        ),
        (
            "newer",
            seen(r#"{"v":"stream"}"#, Some(9), Some(T + 2000), Some("101")),
        ),
        (
            "paged",
            seen(r#"{"v":"export"}"#, Some(9), Some(T + 1000), None),
        ),
        (
            "missing",
            seen(r#"{"v":"export"}"#, Some(9), Some(T + 1000), None),
        ),
        (
            "kept",
            seen(r#"{"v":"stream"}"#, Some(9), Some(T + 2000), Some("103")),
        ),
    ]);
    apply(db, spec, &repair, None).await;
    assert_eq!(look.rows(spec).await, expected);
    apply(db, spec, &repair, None).await;
    assert_eq!(look.rows(spec).await, expected, "a replay changes nothing");
}

/// docs/streams.md §4.12: closing a repair window deletes the rows a stream change wrote at a
/// time inside the window that the window's export did not mark (items created and deleted
/// inside it), in one transaction with the state; rows outside the window, snapshot rows and
/// marked rows stay.
pub async fn closing_a_repair_window_deletes_the_rows_streamed_inside_it_that_it_did_not_mark(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    let rows = [
        change("vanished", r#"{"v":1}"#, T + 1000, "100"),
        change("before", r#"{"v":1}"#, T - 1000, "101"),
        change("after", r#"{"v":1}"#, T + 10_000, "102"),
        change("marked", r#"{"v":1}"#, T + 2000, "103"),
    ];
    apply(db, spec, &rows, None).await;
    apply(
        db,
        spec,
        &[snapshot_row("paged", r#"{"v":1}"#, Some(T + 1000))],
        Some(3),
    )
    .await;
    apply(
        db,
        spec,
        &[repaired("marked", Some(r#"{"v":0}"#), T + 1500, 9)],
        None,
    )
    .await;
    let sweep = ddbpipe_pipeline::checkpoint::store::RepairSweep {
        id: 9,
        from_ms: T,
        to_ms: T + 10_000,
    };
    let write = state_at("2026-01-01T00:00:05.000Z", "p", &[("meta", "{}")], &[]);
    let deleted = db
        .close_repair_window(spec, sweep, &write)
        .await
        .expect("close the window");
    assert_eq!(deleted, 1);
    assert_eq!(
        look.rows(spec).await.keys().collect::<Vec<_>>(),
        ["after", "before", "marked", "paged"]
    );
    assert_eq!(
        db.load_state("p").await.expect("state")["meta"],
        "{}",
        "the state is written in the same transaction"
    );
}

/// docs/coordination.md §11.12 rule 9: a shared repair's window is a generation of the
/// snapshot record. Its batches apply by version under the record's guard (refused once the
/// window is closed), and its close sweeps the rows streamed inside the window that it did
/// not mark and closes the record, in one transaction, once.
pub async fn a_shared_repair_window_is_applied_under_its_record_and_closed_once(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    use ddbpipe_keyed::{FenceWrite, SnapshotGuard};
    use ddbpipe_pipeline::checkpoint::store::RepairSweep;
    use ddbpipe_pipeline::sink::{SharedSnapshot, SnapshotClosed};
    use ddbpipe_source::position::SharedRepair;

    db.open_shared_snapshot(spec, "p", 100).await.expect("open");
    // What generation 0 streamed: before the window, inside it (an item created and deleted
    // inside the gap, which the export leaves out), after it.
    let streamed = [
        change("older", r#"{"v":1}"#, T - 1000, "100"),
        change("vanished", r#"{"v":1}"#, T + 1000, "101"),
        change("newer", r#"{"v":1}"#, T + 20_000, "102"),
    ];
    apply(db, spec, &streamed, None).await;
    let window = SharedRepair::open(T, T + 10_000);
    let record = db
        .reopen_shared_snapshot(spec, "p", 100, 200, "a gap in the stream", Some(&window))
        .await
        .expect("the repair's generation");
    assert_eq!((record.generation, record.repair), (1, Some(window)));
    let under = |counter: u64| StateWrite {
        pipeline: "p/snapshot-200".into(),
        fences: vec![FenceWrite::new("segment:0/1", counter)],
        snapshot: Some(SnapshotGuard::Open(200)),
        record_of: Some("p".into()),
        ..StateWrite::default()
    };
    let changes = [
        repaired("older", Some(r#"{"v":2}"#), T + 5000, 200),
        repaired("newer", Some(r#"{"v":0}"#), T + 5000, 200),
        repaired("created", Some(r#"{"v":2}"#), T + 6000, 200),
    ];
    db.apply(spec, &changes, None, &under(1))
        .await
        .expect("the window's changes");
    // The rows a later repair's sweep could not judge: written without a stream sequence
    // number (this repair's two applied changes), at or after a time.
    let unsure = |since_ms| db.rows_without_sequence_since(spec, since_ms);
    assert_eq!(unsure(T).await.expect("count"), 2);
    assert_eq!(unsure(T + 5001).await.expect("count"), 1);
    assert_eq!(unsure(T + 6001).await.expect("count"), 0);
    let closed = serde_json::to_string(&SharedSnapshot {
        closed: Some(SnapshotClosed {
            by: "w1".into(),
            at_ms: T + 30_000,
        }),
        ..record.clone()
    })
    .expect("the closed record as JSON");
    let closing = StateWrite {
        pipeline: "p".into(),
        snapshot: Some(SnapshotGuard::Close {
            id: 200,
            record: closed,
        }),
        ..StateWrite::default()
    };
    let sweep = RepairSweep {
        id: 200,
        from_ms: T,
        to_ms: T + 10_000,
    };
    let deleted = db
        .close_repair_window(spec, sweep, &closing)
        .await
        .expect("the window's close");
    assert_eq!(
        deleted, 1,
        "the row streamed inside the window and left out"
    );
    let rows = look.rows(spec).await;
    let docs: Vec<(&str, &serde_json::Value)> =
        rows.iter().map(|(k, row)| (k.as_str(), &row.doc)).collect();
    assert_eq!(
        docs,
        [
            ("created", &serde_json::json!({"v": 2})),
            ("newer", &serde_json::json!({"v": 1})),
            ("older", &serde_json::json!({"v": 2})),
        ],
        "the window's changes applied over older rows only"
    );
    let late = db
        .apply(
            spec,
            &[repaired("late", Some(r#"{"v":2}"#), T + 7000, 200)],
            None,
            &under(2),
        )
        .await
        .expect_err("a batch of the window after its close");
    assert!(late.is_fenced(), "{late:?}");
    let again = db
        .close_repair_window(spec, sweep, &closing)
        .await
        .expect_err("a second close");
    assert!(again.is_fenced(), "{again:?}");
    assert_eq!(
        look.rows(spec).await.len(),
        3,
        "nothing more written or swept"
    );
    let stored = db
        .shared_snapshot("p")
        .await
        .expect("read")
        .expect("a record");
    assert!(
        stored.closed.is_some() && stored.repair == Some(window),
        "{stored:?}"
    );
}

/// The backends may write a batch as a whole (PostgreSQL copies stream changes into a staging
/// table and applies each key's last change): the rows, versions and deleted-key markers must
/// be those the same changes leave applied one batch each, for 40 seeded batches of upserts and
/// deletes of five keys, with and without a snapshot open. Without a snapshot the marker of a
/// key deleted and written again in one batch may differ (an old id or null), which no cleanup
/// tells apart; it is compared everywhere else.
pub async fn a_batch_of_stream_changes_ends_as_its_changes_applied_one_by_one(
    db: &Database,
    spec: &TableSpec,
    look: &impl Look,
) {
    let one_by_one = TableSpec {
        table: format!("{}_seq", spec.table),
        ..spec.clone()
    };
    db.prepare(&one_by_one).await.expect("prepare");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    for seed in 0..40_i64 {
        let snapshot = (seed % 2 == 1).then_some(100 + seed);
        let base = T + seed * 1_000_000;
        let mut changes = Vec::new();
        for i in 0..12_i64 {
            let key = format!("s{seed}k{}", next(5));
            let at = base + i * 1000;
            let seq = format!("{}", seed * 100 + i);
            changes.push(if next(3) == 0 {
                deleted(&key, at, &seq)
            } else {
                change(&key, &format!(r#"{{"v":{i}}}"#), at, &seq)
            });
        }
        // Some keys exist before, written by an earlier snapshot.
        let before: Vec<RowChange> = (0..3)
            .map(|k| {
                snapshot_row(
                    &format!("s{seed}k{k}"),
                    r#"{"v":"old"}"#,
                    Some(base - 90_000),
                )
            })
            .collect();
        for table in [spec, &one_by_one] {
            apply(db, table, &before, Some(3)).await;
        }
        apply(db, spec, &changes, snapshot).await;
        for change in &changes {
            apply(db, &one_by_one, std::slice::from_ref(change), snapshot).await;
        }
        let deleted_keys: Vec<String> = changes
            .iter()
            .filter_map(|c| match c {
                RowChange::Delete { key, .. } => Some(key_of(key)),
                RowChange::Upsert { .. } => None,
            })
            .collect();
        let mut whole = look.rows(spec).await;
        let mut single = look.rows(&one_by_one).await;
        whole.retain(|k, _| k.starts_with(&format!("s{seed}k")));
        single.retain(|k, _| k.starts_with(&format!("s{seed}k")));
        if snapshot.is_none() {
            for key in &deleted_keys {
                if let (Some(a), Some(b)) = (whole.get_mut(key), single.get_mut(key)) {
                    a.marker = None;
                    b.marker = None;
                }
            }
        }
        assert_eq!(whole, single, "seed {seed}: {changes:?}");
        let markers_of = |table: &str, markers: &[Marker]| -> Vec<(String, Option<i64>)> {
            markers
                .iter()
                .filter(|(t, k, _)| t == table && k.contains(&format!("s{seed}k")))
                .map(|(_, k, v)| (k.clone(), *v))
                .collect()
        };
        let markers = look.markers().await;
        assert_eq!(
            markers_of(&spec.table, &markers),
            markers_of(&one_by_one.table, &markers),
            "seed {seed}: deleted-key markers"
        );
    }
}

fn key_of(key: &[ddbpipe_keyed::KeyValue]) -> String {
    match key.first() {
        Some(ddbpipe_keyed::KeyValue::S(text)) => text.clone(),
        other => panic!("a one-string key, not {other:?}"),
    }
}
