//! Builders shared by the backend tests (`sqlite.rs`, `postgres.rs`); each uses a part of them.
#![allow(dead_code)]

pub mod observe;
pub mod typed;
pub mod versions;

use ddbpipe_keyed::{KeyColumn, KeyType, KeyValue, RowChange, StateWrite, TableSpec, Version};

/// A table keyed by `key` (name, type) in `schema`, with the document in `doc`, created when
/// missing.
pub fn spec_in(schema: &str, table: &str, key: &[(&str, KeyType)]) -> TableSpec {
    TableSpec {
        table: table.to_string(),
        schema: schema.to_string(),
        key: key
            .iter()
            .map(|(name, kind)| KeyColumn {
                name: name.to_string(),
                kind: *kind,
            })
            .collect(),
        document_column: Some("doc".to_string()),
        columns: Vec::new(),
        document_type: ddbpipe_keyed::DocumentType::Jsonb,
        create_table: true,
    }
}

pub fn s(text: &str) -> KeyValue {
    KeyValue::S(text.to_string())
}

/// An upsert of any key.
pub fn upsert_key(key: Vec<KeyValue>, document: &str, snapshot: bool) -> RowChange {
    RowChange::Upsert {
        key,
        document: document.to_string(),
        columns: Vec::new(),
        snapshot,
        version: Version::default(),
    }
}

/// A delete of a one-string key.
pub fn delete(key: &str) -> RowChange {
    RowChange::Delete {
        key: vec![s(key)],
        version: Version::default(),
    }
}

/// A state write of `pipeline` stamped `updated_at`.
pub fn state_at(
    updated_at: &str,
    pipeline: &str,
    upserts: &[(&str, &str)],
    deletes: &[&str],
) -> StateWrite {
    StateWrite {
        pipeline: pipeline.to_string(),
        upserts: upserts
            .iter()
            .map(|(part, value)| (part.to_string(), value.to_string()))
            .collect(),
        deletes: deletes.iter().map(|part| part.to_string()).collect(),
        fences: Vec::new(),
        snapshot: None,
        record_of: None,
        updated_at: updated_at.to_string(),
    }
}

/// Asserts that `message` holds every one of `texts`, naming `case` and the message if not.
pub fn assert_contains_all(case: &str, message: &str, texts: &[&str]) {
    for text in texts {
        assert!(message.contains(text), "{case}: no {text:?} in: {message}");
    }
}

/// A state write of nothing but the lease fence `(unit, counter)` of pipeline `p`.
pub fn fence(unit: &str, counter: u64) -> StateWrite {
    StateWrite {
        pipeline: "p".into(),
        fences: vec![ddbpipe_keyed::FenceWrite::new(unit, counter)],
        ..StateWrite::default()
    }
}

/// docs/coordination.md §11.7 rule 4 on `db`, whose table `spec` (hash key `pk`-like, one S
/// column) is prepared and empty: a batch under an older counter than the stored one is
/// refused with nothing written, whatever path the batch takes (several new keys, keys that
/// exist, one row); a claim raises the stored counter; units are independent; a position is
/// stored with the rows of its transaction and kept by a claim or a refused batch; a state
/// reset clears the fences and their positions.
pub async fn fences_refuse_older_owners(db: &ddbpipe_keyed::Database, spec: &TableSpec) {
    let rows = |keys: &[&str]| -> Vec<RowChange> {
        keys.iter()
            .map(|k| upsert_key(vec![s(k)], r#"{"v":1}"#, false))
            .collect()
    };
    let count = || async { db.count_rows(spec).await.expect("count rows") };
    db.apply(
        spec,
        &rows(&["a", "b", "c"]),
        None,
        &fence("segment:0/2", 3),
    )
    .await
    .expect("the first owner writes");
    // Over rows that exist (PostgreSQL: the staging table's path from now on).
    db.apply(spec, &rows(&["a", "b"]), None, &fence("segment:0/2", 3))
        .await
        .expect("the first owner writes again");
    assert_eq!(count().await, 3);
    for (what, batch) in [
        ("new keys", rows(&["d", "e"])),
        ("keys that exist", rows(&["a", "b"])),
        ("one row", rows(&["f"])),
    ] {
        let refused = db
            .apply(spec, &batch, None, &fence("segment:0/2", 2))
            .await
            .expect_err(what);
        assert!(
            refused.is_fenced() && !refused.is_retryable(),
            "{what}: {refused:?}"
        );
        assert!(
            refused.message.contains("segment:0/2") && refused.message.contains("counter 3"),
            "{what}: {}",
            refused.message
        );
        assert_eq!(
            count().await,
            3,
            "{what}: nothing of the refused batch was written"
        );
    }
    // A new owner claims before its first batch: the previous owner is refused from then on.
    db.store_state(&fence("segment:0/2", 5))
        .await
        .expect("claim");
    let late = db
        .apply(spec, &rows(&["g"]), None, &fence("segment:0/2", 3))
        .await
        .expect_err("the previous owner after the claim");
    assert!(late.is_fenced());
    db.apply(spec, &rows(&["g"]), None, &fence("segment:0/2", 5))
        .await
        .expect("the new owner");
    db.apply(spec, &rows(&["h"]), None, &fence("segment:1/2", 1))
        .await
        .expect("another unit has its own fence");
    assert_eq!(count().await, 5);

    // A position goes with the rows of its transaction; a claim or a refused batch keeps it.
    let at = |position: &str, counter| {
        let mut write = fence("shard:s1", counter);
        write.fences[0].position = Some(position.to_string());
        write
    };
    let stored = || async {
        db.fence_position("p", "shard:s1")
            .await
            .expect("fence position")
    };
    assert_eq!(stored().await, None, "no fence yet");
    db.apply(spec, &rows(&["j"]), None, &at("after:100", 2))
        .await
        .expect("a batch with its position");
    assert_eq!(stored().await.as_deref(), Some("after:100"));
    db.store_state(&fence("shard:s1", 4))
        .await
        .expect("a new owner's claim");
    assert_eq!(
        stored().await.as_deref(),
        Some("after:100"),
        "the claim keeps the position the new owner resumes after"
    );
    db.apply(spec, &rows(&["k"]), None, &at("after:200", 2))
        .await
        .expect_err("the previous owner after the claim");
    assert_eq!(
        stored().await.as_deref(),
        Some("after:100"),
        "refused: unchanged"
    );
    db.apply(spec, &rows(&["k"]), None, &at("after:300", 4))
        .await
        .expect("the new owner");
    assert_eq!(stored().await.as_deref(), Some("after:300"));
    assert_eq!(count().await, 7);

    assert!(
        db.reset_state("p").await.expect("reset"),
        "the fences were reset"
    );
    assert_eq!(stored().await, None, "a reset clears the positions too");
    db.apply(spec, &rows(&["i"]), None, &fence("segment:0/2", 1))
        .await
        .expect("after a reset the counters start again");
}

/// docs/coordination.md §11.12 on `db`, whose table `spec` (one S key column) is prepared and
/// empty: the shared snapshot record is opened once (the first proposal wins, with the rows the
/// table then held), snapshot batches pass only while it is open and under its id, the
/// cleanup closes it once (a second close is refused and deletes nothing, also rows streamed
/// after the first), and a reset forgets it.
pub async fn a_shared_snapshot_opens_once_and_closes_once(
    db: &ddbpipe_keyed::Database,
    spec: &TableSpec,
) {
    use ddbpipe_keyed::{CloseSnapshot, SnapshotGuard};
    use ddbpipe_pipeline::sink::{SharedSnapshot, SnapshotClosed};
    let count = || async { db.count_rows(spec).await.expect("count rows") };
    let rows = |keys: &[&str], snapshot: bool| -> Vec<RowChange> {
        keys.iter()
            .map(|k| upsert_key(vec![s(k)], r#"{"v":1}"#, snapshot))
            .collect()
    };
    let plain = StateWrite {
        pipeline: "p".into(),
        ..StateWrite::default()
    };
    db.apply(spec, &rows(&["old1", "old2", "keep"], false), None, &plain)
        .await
        .expect("rows from before the mirror");
    assert_eq!(
        db.shared_snapshot("p").await.expect("read"),
        None,
        "no record before the first open"
    );
    let opened = db.open_shared_snapshot(spec, "p", 100).await.expect("open");
    assert_eq!(
        (opened.id, opened.rows_at_start, opened.closed.clone()),
        (100, 3, None)
    );
    let again = db
        .open_shared_snapshot(spec, "p", 200)
        .await
        .expect("open again");
    assert_eq!(again, opened, "the first worker's record is kept");
    let batch = |guard: SnapshotGuard, counter: u64| StateWrite {
        snapshot: Some(guard),
        ..fence("segment:0/1", counter)
    };
    db.apply(
        spec,
        &rows(&["keep", "n1"], true),
        Some(100),
        &batch(SnapshotGuard::Open(100), 1),
    )
    .await
    .expect("a batch of the open snapshot");
    let other = db
        .apply(
            spec,
            &rows(&["n2"], true),
            Some(999),
            &batch(SnapshotGuard::Open(999), 1),
        )
        .await
        .expect_err("a batch of another snapshot");
    assert!(other.is_fenced(), "{other:?}");
    assert_contains_all("another snapshot", &other.message, &["999", "100"]);
    assert_eq!(count().await, 4, "nothing of the refused batch was written");

    let closed_record = serde_json::to_string(&SharedSnapshot {
        closed: Some(SnapshotClosed {
            by: "w1".into(),
            at_ms: 300,
        }),
        ..opened.clone()
    })
    .expect("the closed record as JSON");
    let close = CloseSnapshot {
        id: 100,
        delete_unseen: true,
        max_keys: 100,
    };
    let closing = StateWrite {
        pipeline: "p".into(),
        snapshot: Some(SnapshotGuard::Close {
            id: 100,
            record: closed_record,
        }),
        ..StateWrite::default()
    };
    let closed = db
        .close_snapshot(spec, close, &closing)
        .await
        .expect("the first close");
    assert_eq!((closed.keys_written, closed.deleted), (2, 2));
    assert_eq!(count().await, 2, "old1 and old2 were deleted");
    // The stream after the close writes rows the snapshot did not mark.
    db.apply(spec, &rows(&["s1"], false), None, &fence("shard:a", 1))
        .await
        .expect("a streamed change");
    let second = db
        .close_snapshot(spec, close, &closing)
        .await
        .expect_err("a second close");
    assert!(second.is_fenced(), "{second:?}");
    assert_contains_all("a second close", &second.message, &["closed", "cleanup"]);
    assert_eq!(count().await, 3, "the second close deleted nothing");
    let late = db
        .apply(
            spec,
            &rows(&["late"], true),
            Some(100),
            &batch(SnapshotGuard::Open(100), 2),
        )
        .await
        .expect_err("a snapshot batch after the close");
    assert!(late.is_fenced(), "{late:?}");
    assert_eq!(count().await, 3, "the late snapshot row was not written");
    let stored = db
        .open_shared_snapshot(spec, "p", 400)
        .await
        .expect("open after the close");
    assert_eq!(stored.id, 100);
    assert_eq!(stored.closed.map(|c| c.by).as_deref(), Some("w1"));

    assert_eq!(
        db.shared_snapshot("p").await.expect("read").map(|r| r.id),
        Some(100),
        "read as stored"
    );
    db.reset_state("p").await.expect("reset");
    assert_eq!(
        db.shared_snapshot("p").await.expect("read after a reset"),
        None,
        "a read opens nothing"
    );
    let fresh = db
        .open_shared_snapshot(spec, "p", 500)
        .await
        .expect("open after a reset");
    assert_eq!(
        (fresh.id, fresh.rows_at_start, fresh.closed),
        (500, 3, None)
    );
}

/// docs/coordination.md §11.12 rule 8 on `db`, whose table `spec` (one S key column) is
/// prepared and empty: a snapshot is opened in place of another once (of two workers
/// replacing the same one, the first one's is kept, of the next generation, with the row
/// count and the reason); a batch of changes read by the replaced generation is refused with
/// nothing written, whether its snapshot was open or closed, and one of the new generation
/// passes, also once its snapshot is closed; the guard reads the record under the pipeline's
/// name while the fences are kept under the generation's; a reopen after a reset is refused.
pub async fn a_shared_snapshot_is_replaced_once_and_refuses_the_older_generation(
    db: &ddbpipe_keyed::Database,
    spec: &TableSpec,
) {
    use ddbpipe_keyed::{CloseSnapshot, SnapshotGuard};
    use ddbpipe_pipeline::sink::{SharedSnapshot, SnapshotClosed};

    let count = || async { db.count_rows(spec).await.expect("count rows") };
    let change = |key: &str| vec![upsert_key(vec![s(key)], r#"{"v":1}"#, false)];
    let first = db.open_shared_snapshot(spec, "p", 100).await.expect("open");
    assert_eq!((first.generation, first.replaced.clone()), (0, None));
    let of = |id: i64, pipeline: &str, counter: u64| StateWrite {
        pipeline: pipeline.to_string(),
        fences: vec![ddbpipe_keyed::FenceWrite::new("shard:a", counter)],
        snapshot: Some(SnapshotGuard::Of(id)),
        record_of: Some("p".to_string()),
        ..StateWrite::default()
    };
    db.apply(spec, &change("k1"), None, &of(100, "p", 1))
        .await
        .expect("a change of the first generation while its snapshot is open");
    let second = db
        .reopen_shared_snapshot(spec, "p", 100, 200, "shard a was trimmed", None)
        .await
        .expect("the first replacement");
    assert_eq!(
        (
            second.id,
            second.rows_at_start,
            second.generation,
            second.closed.clone()
        ),
        (200, 1, 1, None)
    );
    assert_eq!(second.replaced.as_deref(), Some("shard a was trimmed"));
    assert_eq!(second.lease_pipeline("p"), "p/snapshot-200");
    db.apply(spec, &[], None, &fence("shard:a", 0))
        .await
        .expect("the replaced generation's fences were deleted with the replacement");
    let late = db
        .reopen_shared_snapshot(
            spec,
            "p",
            100,
            300,
            "the same gap, found by another worker",
            None,
        )
        .await
        .expect("a second replacement of the same snapshot");
    assert_eq!(late, second, "the first replacement is kept");
    let stale = db
        .apply(spec, &change("k2"), None, &of(100, "p", 2))
        .await
        .expect_err("a change of the replaced generation");
    assert!(stale.is_fenced(), "{stale:?}");
    assert_contains_all("another snapshot", &stale.message, &["100", "200"]);
    assert_eq!(count().await, 1, "nothing of the refused batch was written");
    // The new generation's fences are kept under its own name, from counter 1 again.
    db.apply(spec, &change("k3"), None, &of(200, "p/snapshot-200", 1))
        .await
        .expect("a change of the new generation");
    let closed_record = serde_json::to_string(&SharedSnapshot {
        closed: Some(SnapshotClosed {
            by: "w1".into(),
            at_ms: 400,
        }),
        ..second.clone()
    })
    .expect("the closed record as JSON");
    let closing = StateWrite {
        pipeline: "p".into(),
        snapshot: Some(SnapshotGuard::Close {
            id: 200,
            record: closed_record,
        }),
        ..StateWrite::default()
    };
    let close = CloseSnapshot {
        id: 200,
        delete_unseen: false,
        max_keys: 100,
    };
    db.close_snapshot(spec, close, &closing)
        .await
        .expect("the new generation's close");
    db.apply(spec, &change("k4"), None, &of(200, "p/snapshot-200", 2))
        .await
        .expect("a change of the new generation after its snapshot closed");
    let stale = db
        .apply(spec, &change("k5"), None, &of(100, "p", 3))
        .await
        .expect_err("a change of the replaced generation after the close");
    assert!(stale.is_fenced(), "{stale:?}");
    assert_eq!(count().await, 3, "k1, k3 and k4");
    let third = db
        .reopen_shared_snapshot(spec, "p", 200, 500, "a damaged export", None)
        .await
        .expect("a closed snapshot replaced");
    assert_eq!(
        (third.id, third.generation, third.rows_at_start),
        (500, 2, 3)
    );
    assert_eq!(
        third.earlier,
        [200],
        "the replaced generation's lease name is kept for `state reset`"
    );
    db.reset_state("p").await.expect("reset");
    let gone = db
        .reopen_shared_snapshot(spec, "p", 500, 600, "after a reset", None)
        .await
        .expect_err("a replacement after a reset");
    assert_contains_all("after a reset", &gone.message, &["500", "state reset"]);
}

/// docs/coordination.md §11.7 rules 2 and 4 on `db`, whose table `spec` (one S key column) is
/// prepared: a state write passes the fences of its transaction as a batch does. A claim
/// under an older counter than the stored one is refused, fenced, and writes nothing of its
/// transaction (neither its state parts nor its position); a newer claim passes and its parts
/// are written; after a reset the counters start again.
pub async fn a_state_write_under_an_older_fence_is_refused_and_writes_nothing(
    db: &ddbpipe_keyed::Database,
    spec: &TableSpec,
) {
    let claim = |counter: u64, position: &str, part: &str| {
        let mut write = fence("shard:s1", counter);
        write.fences[0].position = Some(position.to_string());
        write.upserts = vec![(part.to_string(), "1".to_string())];
        write
    };
    let stored = || async { db.fence_position("p", "shard:s1").await.expect("position") };
    let parts = || async {
        let state = db.load_state("p").await.expect("load state");
        state.into_keys().collect::<Vec<_>>()
    };
    db.store_state(&claim(4, "after:100", "first"))
        .await
        .expect("the first claim");
    let refused = db
        .store_state(&claim(3, "after:50", "older"))
        .await
        .expect_err("a claim under an older counter");
    assert!(
        refused.is_fenced() && !refused.is_retryable(),
        "{refused:?}"
    );
    assert_contains_all(
        "an older claim",
        &refused.message,
        &["shard:s1", "counter 4", "lease 3"],
    );
    assert_eq!(
        stored().await.as_deref(),
        Some("after:100"),
        "refused: unchanged"
    );
    assert_eq!(parts().await, ["first"], "nothing of the refused write");
    db.store_state(&claim(4, "after:200", "same"))
        .await
        .expect("the same owner again");
    assert_eq!(stored().await.as_deref(), Some("after:200"));
    assert_eq!(parts().await, ["first", "same"]);
    assert_eq!(db.count_rows(spec).await.expect("count rows"), 0);
    assert!(db.reset_state("p").await.expect("reset"));
    assert_eq!(parts().await, Vec::<String>::new(), "the parts are gone");
    db.store_state(&claim(1, "after:1", "again"))
        .await
        .expect("after a reset the counters start again");
    assert_eq!(stored().await.as_deref(), Some("after:1"));
}
