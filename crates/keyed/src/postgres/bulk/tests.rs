//! Tests of the bulk paths' choices and statements (no server).

use super::*;
use crate::sql::key_text;
use crate::{KeyColumn, Version};

fn upsert(key: &str, snapshot: bool) -> RowChange {
    RowChange::Upsert {
        key: vec![KeyValue::S(key.into())],
        document: "{}".into(),
        columns: Vec::new(),
        snapshot,
        version: Version::default(),
    }
}

#[test]
fn upserts_of_one_kind_with_distinct_keys_and_stream_changes_go_through_copy() {
    let rows = [upsert("a", false), upsert("b", false)];
    let plain = || Write::Upsert {
        version_ms: None,
        version_seq: None,
    };
    assert_eq!(
        Bulk::of(&rows, &[plain(), plain()], None),
        Some(Bulk::Change)
    );
    let twice = [upsert("a", false), upsert("a", false)];
    assert_eq!(
        Bulk::of(&twice, &[plain(), plain()], None),
        Some(Bulk::Changes { marked: None }),
        "a key changed twice: the last change decides"
    );
    let marked = |id| Write::UpsertMarked {
        id,
        version_ms: None,
        version_seq: None,
    };
    assert_eq!(
        Bulk::of(&rows, &[marked(7), marked(7)], Some(7)),
        Some(Bulk::Marked { id: 7 })
    );
    assert_eq!(Bulk::of(&[], &[], None), None);
    // Stream changes, keys repeated and deletes among them.
    assert_eq!(
        Bulk::of(&twice, &[plain(), Write::Delete], None),
        Some(Bulk::Changes { marked: None })
    );
    let delete_marked = || Write::DeleteMarked {
        version_ms: Some(1),
    };
    assert_eq!(
        Bulk::of(&twice, &[marked(7), delete_marked()], Some(7)),
        Some(Bulk::Changes { marked: Some(7) })
    );
    assert_eq!(
        Bulk::of(&twice, &[delete_marked(), delete_marked()], Some(7)),
        Some(Bulk::Changes { marked: Some(7) }),
        "deletes alone, the markers from the open snapshot"
    );
    let guarded = |cutoff_ms| Write::UpsertUnlessNewer {
        id: 7,
        read_ms: 0,
        cutoff_ms,
    };
    assert_eq!(
        Bulk::of(&rows, &[guarded(1), guarded(2)], Some(7)),
        None,
        "snapshot rows of two read times"
    );
    let repair = Write::RepairDelete {
        id: 1,
        version_ms: 1,
    };
    assert_eq!(Bulk::of(&twice, &[plain(), repair], None), None);
}

#[test]
fn stream_changes_stage_each_keys_last_change_and_one_marker_per_deleted_key() {
    let delete = |key: &str| RowChange::Delete {
        key: vec![KeyValue::S(key.into())],
        version: Version::default(),
    };
    let rows = [
        upsert("a", false),
        delete("a"),
        upsert("a", false),
        delete("b"),
        delete("b"),
        upsert("c", false),
        delete("d"),
        upsert("c", false),
    ];
    let marked = || Write::UpsertMarked {
        id: 7,
        version_ms: Some(9),
        version_seq: Some("s"),
    };
    let gone = |at| Write::DeleteMarked { version_ms: at };
    let writes = [
        marked(),
        gone(Some(5)),
        marked(),
        gone(None),
        gone(Some(3)),
        marked(),
        gone(Some(8)),
        marked(),
    ];
    let texts: Vec<String> = rows.iter().map(|row| key_text(row_key(row))).collect();
    let staged = stage_rows(&rows, &writes, &texts, Bulk::Changes { marked: Some(7) });
    let seen: Vec<_> = staged
        .iter()
        .map(|s| (s.index, s.op, s.version_ms, s.guard.is_some()))
        .collect();
    assert_eq!(
        seen,
        [
            (2, 0, Some(9), false), // a: its last change, an upsert
            (4, 1, None, true),     // b: deleted, the null time the newest
            (6, 1, Some(8), true),  // d
            (7, 0, Some(9), false), // c
            (1, 2, Some(5), true),  // a's marker from its delete
        ]
    );
    let plain = [Write::Delete, Write::Delete];
    let unmarked = stage_rows(
        &rows[3..5],
        &plain,
        &texts[3..5],
        Bulk::Changes { marked: None },
    );
    assert_eq!(unmarked.len(), 1, "no snapshot open: no markers");
    assert_eq!((unmarked[0].index, unmarked[0].op), (1, 1));
    assert!(unmarked[0].guard.is_none());
}

#[test]
fn the_merge_casts_as_the_row_statement_does_and_guards_snapshot_rows() {
    let spec = TableSpec {
        table: "orders".into(),
        schema: "public".into(),
        key: vec![
            KeyColumn {
                name: "pk".into(),
                kind: KeyType::S,
            },
            KeyColumn {
                name: "n".into(),
                kind: KeyType::N,
            },
        ],
        document_column: Some("doc".into()),
        columns: Vec::new(),
        document_type: crate::DocumentType::Jsonb,
        create_table: true,
    };
    let merge = merge_sql(&spec, Bulk::Change);
    assert!(merge.contains("s.k1::text::numeric"), "{merge}");
    assert!(merge.contains("s.doc::text::jsonb"), "{merge}");
    assert!(!merge.contains("_ddbpipe_deleted"), "{merge}");
    let guarded = merge_sql(
        &spec,
        Bulk::UnlessNewer {
            id: 1,
            cutoff_ms: 2,
        },
    );
    let changes = merge_sql(&spec, Bulk::Changes { marked: Some(3) });
    assert!(
        !changes.contains("DISTINCT"),
        "ddbpipe stages each key's last change"
    );
    assert!(
        changes.contains("t.\"n\" = s.k1::text::numeric"),
        "{changes}"
    );
    assert!(changes.contains("marks AS (INSERT INTO"), "{changes}");
    assert!(
        !merge_sql(&spec, Bulk::Changes { marked: None }).contains("_ddbpipe_deleted"),
        "no snapshot open: no markers"
    );
    assert!(guarded.contains("\"_ddbpipe_deleted\" d"), "{guarded}");
    assert!(guarded.contains("d.key_text = s.key_text"), "{guarded}");
    assert_eq!(stage_name(&spec), stage_name(&spec.clone()));
    let other = TableSpec {
        table: "other".into(),
        ..spec.clone()
    };
    assert_ne!(stage_name(&spec), stage_name(&other));
}
