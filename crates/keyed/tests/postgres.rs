//! The PostgreSQL backend against a real server.
//!
//! The server comes from `DDBPIPE_TEST_POSTGRES_URL`, which `scripts/test.sh` sets (it starts a
//! throwaway server); without it every test here fails. Each test works in its own schema
//! (random name, dropped at the end, even after a failure), so the tests run in parallel.
// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{delete, s, upsert_key, versions};
use ddbpipe_keyed::{
    CloseSnapshot, Closed, Database, DbError, DocumentType, KeyType, KeyValue, LockAttempt,
    LockHolder, PostgresDatabase, RowChange, StateWrite, TableSpec, Version,
};
use ddbpipe_testkit::postgres::{TestSchema, connect as admin, url};

/// A fresh schema, a handle whose state schema it is, and a separate admin connection to look.
struct Fixture {
    schema: String,
    /// Drops the schema with the fixture.
    _owned: TestSchema,
    db: Database,
    admin: tokio_postgres::Client,
}

impl Fixture {
    async fn new() -> Self {
        let admin = admin().await;
        let owned = TestSchema::create(&admin, "t").await;
        let schema = owned.name().to_string();
        let db = Self::handle_in(&schema).await;
        Fixture {
            schema,
            _owned: owned,
            db,
            admin,
        }
    }

    async fn handle_in(schema: &str) -> Database {
        Database::from(
            PostgresDatabase::connect(&url())
                .await
                .unwrap()
                .with_schema(schema),
        )
    }

    async fn handle(&self) -> Database {
        Self::handle_in(&self.schema).await
    }

    fn spec(&self, table: &str, key: &[(&str, KeyType)]) -> TableSpec {
        common::spec_in(&self.schema, table, key)
    }

    /// The table `t` keyed by `id` (S), prepared.
    async fn table_t(&self) -> TableSpec {
        let spec = self.spec("t", &[("id", KeyType::S)]);
        self.db.prepare(&spec).await.unwrap();
        spec
    }

    /// Applies `rows` with no state write.
    async fn apply(&self, spec: &TableSpec, rows: &[RowChange], snapshot: Option<i64>) {
        self.db
            .apply(spec, rows, snapshot, &StateWrite::default())
            .await
            .unwrap();
    }

    /// `id → (doc, marker)` for a table keyed by `id` (S).
    async fn by_id(&self, table: &str) -> BTreeMap<String, (serde_json::Value, Option<i64>)> {
        self.admin
            .query(
                &format!(
                    "SELECT id, doc::text, _ddbpipe_snapshot FROM \"{}\".\"{table}\"",
                    self.schema
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let doc: String = row.get(1);
                (
                    row.get(0),
                    (serde_json::from_str(&doc).unwrap(), row.get(2)),
                )
            })
            .collect()
    }
}

fn upsert(id: &str, value: i64, snapshot: bool) -> RowChange {
    let document = format!(r#"{{"id": "{id}", "v": {value}}}"#);
    upsert_key(vec![s(id)], &document, snapshot)
}

fn state(pipeline: &str, parts: &[(&str, &str)], deletes: &[&str]) -> StateWrite {
    common::state_at("2024-05-01T12:00:00.000Z", pipeline, parts, deletes)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

async fn load(db: &Database, pipeline: &str) -> BTreeMap<String, serde_json::Value> {
    db.load_state(pipeline)
        .await
        .unwrap()
        .into_iter()
        .map(|(part, value)| (part, json(&value)))
        .collect()
}

#[tokio::test]
async fn creates_the_table_and_reopens_a_compatible_one() {
    let fx = Fixture::new().await;
    let spec = fx.spec(
        "orders",
        &[("customer", KeyType::S), ("order_id", KeyType::N)],
    );

    let detail = fx.db.probe(&spec).await.unwrap();
    assert!(
        detail.ends_with(&format!("table '{}.orders' will be created", fx.schema)),
        "{detail}"
    );
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 0);
    assert!(
        fx.admin.tables(&fx.schema).await.is_empty(),
        "probe created something"
    );

    fx.db.prepare(&spec).await.unwrap();
    assert_eq!(
        fx.admin.tables(&fx.schema).await,
        [
            "_ddbpipe_deleted",
            "_ddbpipe_fences",
            "_ddbpipe_state",
            "orders"
        ]
    );
    let columns: Vec<(String, String, String)> = fx
        .admin
        .query(
            "SELECT column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'orders' \
             ORDER BY ordinal_position",
            &[&fx.schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let want = [
        ("customer", "text", "NO"),
        ("order_id", "numeric", "NO"),
        ("doc", "jsonb", "NO"),
        ("_ddbpipe_snapshot", "bigint", "YES"),
        ("_ddbpipe_updated_at", "timestamp with time zone", "NO"),
        ("_ddbpipe_version_ms", "bigint", "YES"),
        ("_ddbpipe_version_seq", "text", "YES"),
    ];
    assert_eq!(
        columns,
        want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    );

    // Reopen: another handle, the same spec; and `create_table: false` now that it exists.
    let other = fx.handle().await;
    other.prepare(&spec).await.unwrap();
    other
        .prepare(&TableSpec {
            create_table: false,
            ..spec.clone()
        })
        .await
        .unwrap();
    fx.apply(
        &spec,
        &[upsert_key(
            vec![s("c1"), KeyValue::N("1".into())],
            "{}",
            false,
        )],
        None,
    )
    .await;
    let detail = other.probe(&spec).await.unwrap();
    assert!(
        detail.ends_with(&format!("table '{}.orders' exists, 1 row(s)", fx.schema)),
        "{detail}"
    );
    assert!(
        detail.starts_with("127.0.0.1:") || detail.contains(':'),
        "{detail}"
    );
    assert!(fx.db.describe().starts_with("postgres "));
    assert!(
        !fx.db.describe().contains("ddbpipe:"),
        "{}",
        fx.db.describe()
    );
}

/// Lists a schema's tables.
trait Tables {
    async fn tables(&self, schema: &str) -> Vec<String>;
}

impl Tables for tokio_postgres::Client {
    async fn tables(&self, schema: &str) -> Vec<String> {
        self.query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 \
             ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
    }
}

#[tokio::test]
async fn an_incompatible_table_is_an_error_listing_both_keys() {
    let fx = Fixture::new().await;
    fx.db
        .prepare(&fx.spec("orders", &[("id", KeyType::S)]))
        .await
        .unwrap();

    let err = fx
        .db
        .prepare(&fx.spec("orders", &[("id", KeyType::N)]))
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    let table = format!("postgres table '{}.orders'", fx.schema);
    let texts = [&table[..], r#"("id" text)"#, r#"("id" numeric)"#];
    common::assert_contains_all("other key type", &err.message, &texts);

    let err = fx
        .db
        .prepare(&fx.spec("orders", &[("id", KeyType::S), ("sk", KeyType::B)]))
        .await
        .unwrap_err();
    common::assert_contains_all("other key", &err.message, &[r#"("id" text, "sk" bytea)"#]);

    // A table of someone else's: right key, but not the columns ddbpipe writes.
    fx.admin
        .batch_execute(&format!(
            "CREATE TABLE \"{}\".foreign_made (id text PRIMARY KEY, doc jsonb)",
            fx.schema
        ))
        .await
        .unwrap();
    let foreign_made = fx.spec("foreign_made", &[("id", KeyType::S)]);
    let err = fx.db.prepare(&foreign_made).await.unwrap_err();
    let missing = ["\"_ddbpipe_snapshot\"", "\"_ddbpipe_updated_at\""];
    common::assert_contains_all("foreign table", &err.message, &missing);
    assert!(!err.message.contains("\"doc\""), "{}", err.message);
    let err = fx.db.probe(&foreign_made).await.unwrap_err();
    common::assert_contains_all("probe foreign table", &err.message, &missing[..1]);

    // Missing and not to be created.
    let spec = TableSpec {
        create_table: false,
        ..fx.spec("absent", &[("id", KeyType::S)])
    };
    let err = fx.db.prepare(&spec).await.unwrap_err();
    assert!(err.message.contains("does not exist"), "{}", err.message);
    let err = fx.db.probe(&spec).await.unwrap_err();
    assert!(err.message.contains("does not exist"), "{}", err.message);
}

#[tokio::test]
async fn a_name_over_63_bytes_asks_for_sink_table() {
    let fx = Fixture::new().await;
    let long = "x".repeat(64);
    let err = fx
        .db
        .prepare(&fx.spec(&long, &[("id", KeyType::S)]))
        .await
        .unwrap_err();
    assert_eq!(
        err.message,
        format!(
            "postgres table name '{long}' is longer than 63 bytes; set sink.table to a shorter name"
        )
    );
    // 63 bytes (multi-byte characters count in bytes) is fine.
    let fits = format!("{}é", "y".repeat(61));
    assert_eq!(fits.len(), 63);
    fx.db
        .prepare(&fx.spec(&fits, &[("id", KeyType::S)]))
        .await
        .unwrap();
    let err = fx
        .db
        .prepare(&fx.spec("t", &[(&"k".repeat(64), KeyType::S)]))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("longer than 63 bytes"),
        "{}",
        err.message
    );
}

/// Applies `rows` to a model of the table, in order.
fn model(rows: &[RowChange], into: &mut BTreeMap<String, serde_json::Value>) {
    for row in rows {
        match row {
            RowChange::Upsert { key, document, .. } => {
                let [KeyValue::S(id)] = key.as_slice() else {
                    unreachable!()
                };
                into.insert(id.clone(), json(document));
            }
            RowChange::Delete { key, .. } => {
                let [KeyValue::S(id)] = key.as_slice() else {
                    unreachable!()
                };
                into.remove(id);
            }
        }
    }
}

#[tokio::test]
async fn changes_apply_in_order_within_a_batch() {
    let fx = Fixture::new().await;
    let spec = fx.table_t().await;

    // A short batch: upsert, delete, upsert again, and a delete that ends a key.
    let short = [
        upsert("a", 1, false),
        upsert("b", 1, false),
        delete("a"),
        upsert("a", 2, false),
        upsert("a", 3, false),
        delete("b"),
    ];
    // A long batch (over try_join_all's small-batch path): each of 10 keys changed 20 times.
    let mut long = Vec::new();
    for round in 0..20 {
        for k in 0..10 {
            let id = format!("k{k}");
            if (round + k) % 3 == 0 {
                long.push(delete(&id));
            } else {
                long.push(upsert(&id, round * 100 + k, false));
            }
        }
    }
    let mut want = BTreeMap::new();
    for batch in [&short[..], &long[..]] {
        fx.apply(&spec, batch, None).await;
        model(batch, &mut want);
        let got: BTreeMap<String, serde_json::Value> = fx
            .by_id("t")
            .await
            .into_iter()
            .map(|(id, (doc, _))| (id, doc))
            .collect();
        assert_eq!(got, want);
    }
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), want.len() as u64);
}

#[tokio::test]
async fn the_snapshot_marker_is_set_while_a_snapshot_is_open_and_kept_otherwise() {
    let fx = Fixture::new().await;
    let spec = fx.table_t().await;

    let batches = [
        (vec![upsert("a", 1, true), upsert("b", 1, true)], Some(7)),
        // A change while the snapshot is open marks its row too (docs/mirror.md §5.6).
        (vec![upsert("a", 2, false), upsert("c", 1, false)], Some(7)),
        // A change with no snapshot open keeps the marker; a new row from it has none.
        (vec![upsert("b", 2, false), upsert("d", 1, false)], None),
    ];
    for (rows, snapshot) in batches {
        fx.apply(&spec, &rows, snapshot).await;
    }
    let rows = fx.by_id("t").await;
    assert_eq!(rows["a"], (json(r#"{"id": "a", "v": 2}"#), Some(7)));
    assert_eq!(rows["b"], (json(r#"{"id": "b", "v": 2}"#), Some(7)));
    assert_eq!(rows["c"], (json(r#"{"id": "c", "v": 1}"#), Some(7)));
    assert_eq!(rows["d"], (json(r#"{"id": "d", "v": 1}"#), None));

    // A later snapshot re-marks the rows it writes.
    fx.apply(
        &spec,
        &[upsert("c", 3, true), upsert("a", 3, true)],
        Some(8),
    )
    .await;
    let rows = fx.by_id("t").await;
    assert_eq!(rows["a"].1, Some(8));
    assert_eq!(rows["b"].1, Some(7));
    assert_eq!(rows["c"], (json(r#"{"id": "c", "v": 3}"#), Some(8)));

    let updated_at: String = fx
        .admin
        .query_one(
            &format!(
                "SELECT to_char(_ddbpipe_updated_at AT TIME ZONE 'UTC', \
                 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') FROM \"{}\".t WHERE id = 'a'",
                fx.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // RFC 3339 UTC with milliseconds: 2024-05-01T12:00:00.000Z
    let shape: String = updated_at
        .chars()
        .map(|c| if c.is_ascii_digit() { '0' } else { c })
        .collect();
    assert_eq!(shape, "0000-00-00T00:00:00.000Z", "{updated_at}");

    // A snapshot row without a snapshot id is a bug of the caller.
    let err = fx
        .db
        .apply(&spec, &[upsert("d", 1, true)], None, &StateWrite::default())
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn replaying_a_batch_and_its_state_changes_nothing() {
    let fx = Fixture::new().await;
    let spec = fx.table_t().await;
    fx.apply(
        &spec,
        &[upsert("old", 1, false), upsert("x", 1, false)],
        None,
    )
    .await;

    let batch = [
        upsert("a", 1, true),
        delete("old"),
        upsert("x", 5, false),
        upsert("b", 1, true),
        delete("a"),
        upsert("a", 2, true),
    ];
    let write = state("p", &[("position", r#"{"seq": "42"}"#)], &["stale"]);
    fx.db.apply(&spec, &batch, Some(3), &write).await.unwrap();
    let rows_once = fx.by_id("t").await;
    let state_once = load(&fx.db, "p").await;
    fx.db.apply(&spec, &batch, Some(3), &write).await.unwrap();
    assert_eq!(fx.by_id("t").await, rows_once);
    assert_eq!(load(&fx.db, "p").await, state_once);
    assert_eq!(
        state_once,
        BTreeMap::from([("position".to_string(), json(r#"{"seq": "42"}"#))])
    );
    assert_eq!(rows_once.len(), 3);
}

#[tokio::test]
async fn a_bad_row_rolls_back_the_batch_and_the_state() {
    let fx = Fixture::new().await;
    let spec = fx.table_t().await;
    fx.db
        .apply(
            &spec,
            &[upsert("keep", 1, false)],
            None,
            &state("p", &[("pos", "1")], &[]),
        )
        .await
        .unwrap();
    let before = fx.by_id("t").await;

    let bad_document = upsert_key(vec![s("bad")], "{not json", false);
    let write = state("p", &[("pos", "2"), ("extra", "true")], &[]);
    let err = fx
        .db
        .apply(
            &spec,
            &[
                upsert("new", 1, false),
                delete("keep"),
                bad_document,
                upsert("later", 1, false),
            ],
            None,
            &write,
        )
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{}", err.message);
    assert!(
        err.message
            .starts_with(&format!("postgres table '{}.t': ", fx.schema)),
        "{}",
        err.message
    );
    assert!(err.message.contains("json"), "{}", err.message);
    assert_eq!(fx.by_id("t").await, before);
    assert_eq!(
        load(&fx.db, "p").await,
        BTreeMap::from([("pos".to_string(), json("1"))])
    );

    // The handle is still usable after the rollback.
    fx.db
        .apply(&spec, &[upsert("new", 1, false)], None, &write)
        .await
        .unwrap();
    assert_eq!(fx.by_id("t").await.len(), 2);
    assert_eq!(load(&fx.db, "p").await.len(), 2);

    // A bad number and a bad state value fail the same way.
    let nspec = fx.spec("n", &[("id", KeyType::N)]);
    fx.db.prepare(&nspec).await.unwrap();
    let good = upsert_key(vec![KeyValue::N("1".into())], "{}", false);
    let bad = upsert_key(vec![KeyValue::N("one".into())], "{}", false);
    let err = fx
        .db
        .apply(&nspec, &[good.clone(), bad], None, &StateWrite::default())
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    assert_eq!(fx.db.count_rows(&nspec).await.unwrap(), 0);
    let err = fx
        .db
        .apply(
            &nspec,
            std::slice::from_ref(&good),
            None,
            &state("p", &[("pos", "{oops")], &[]),
        )
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    assert_eq!(fx.db.count_rows(&nspec).await.unwrap(), 0);

    // Wrong number or type of key values: fatal, naming the table, nothing written.
    for key in [
        vec![s("x")],
        vec![KeyValue::N("1".into()), KeyValue::N("2".into())],
    ] {
        let err = fx
            .db
            .apply(
                &nspec,
                &[
                    good.clone(),
                    RowChange::Delete {
                        key,
                        version: Version::default(),
                    },
                ],
                None,
                &StateWrite::default(),
            )
            .await
            .unwrap_err();
        assert!(!err.is_retryable());
        assert!(
            err.message
                .contains(&format!("postgres table '{}.n'", fx.schema)),
            "{}",
            err.message
        );
        assert_eq!(fx.db.count_rows(&nspec).await.unwrap(), 0);
    }
}

#[tokio::test]
async fn state_round_trips_and_resets() {
    let fx = Fixture::new().await;
    // No state table yet: nothing stored, nothing to reset, no rows.
    assert!(fx.db.load_state("p").await.unwrap().is_empty());
    assert!(!fx.db.reset_state("p").await.unwrap());
    assert_eq!(
        fx.db
            .count_rows(&fx.spec("t", &[("id", KeyType::S)]))
            .await
            .unwrap(),
        0
    );
    assert!(
        fx.admin.tables(&fx.schema).await.is_empty(),
        "reading created something"
    );

    fx.db.prepare_state().await.unwrap();
    assert_eq!(
        fx.admin.tables(&fx.schema).await,
        ["_ddbpipe_fences", "_ddbpipe_state"]
    );
    fx.db
        .store_state(&state(
            "p",
            &[
                ("position", r#"{"shards": {"s1": "100"}}"#),
                ("snapshot", r#"{"id": 3}"#),
            ],
            &[],
        ))
        .await
        .unwrap();
    fx.db
        .store_state(&state("other", &[("position", "1")], &[]))
        .await
        .unwrap();
    fx.db
        .store_state(&state(
            "p",
            &[("position", r#"{"shards": {}}"#)],
            &["snapshot", "never"],
        ))
        .await
        .unwrap();
    assert_eq!(
        load(&fx.db, "p").await,
        BTreeMap::from([("position".to_string(), json(r#"{"shards": {}}"#))])
    );
    let updated_at: String = fx
        .admin
        .query_one(
            &format!(
                "SELECT updated_at FROM \"{}\"._ddbpipe_state WHERE pipeline = 'p'",
                fx.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(updated_at, "2024-05-01T12:00:00.000Z");

    // Another handle reads the same.
    assert_eq!(load(&fx.handle().await, "p").await, load(&fx.db, "p").await);

    assert!(fx.db.reset_state("p").await.unwrap());
    assert!(fx.db.load_state("p").await.unwrap().is_empty());
    assert!(!fx.db.reset_state("p").await.unwrap());
    assert_eq!(load(&fx.db, "other").await.len(), 1);

    // A schema that does not exist at all reads as empty too.
    let nowhere = Fixture::handle_in(&format!("{}_absent", fx.schema)).await;
    assert!(nowhere.load_state("p").await.unwrap().is_empty());
    assert!(!nowhere.reset_state("p").await.unwrap());
}

#[tokio::test]
async fn close_snapshot_deletes_unseen_rows_below_the_ceiling() {
    let fx = Fixture::new().await;
    let spec = fx.table_t().await;
    // `old` from snapshot 4, `changed` from a change outside a snapshot, `a` and `b` from
    // snapshot 5.
    let fill = || async {
        fx.apply(&spec, &[upsert("old", 1, true)], Some(4)).await;
        fx.apply(&spec, &[upsert("changed", 1, false)], None).await;
        let rows = [upsert("a", 1, true), upsert("b", 1, true)];
        fx.apply(&spec, &rows, Some(5)).await;
    };
    fill().await;
    let all_four = ["a", "b", "changed", "old"];

    let close = CloseSnapshot {
        id: 5,
        delete_unseen: true,
        max_keys: 1,
    };
    // One after the other: (step, close, state written, what it did, the keys after, the
    // `snapshot` state part after).
    let steps = [
        // Over the ceiling: nothing deleted, the state still written.
        (
            "over the ceiling",
            close,
            state("p", &[("snapshot", "\"closed\"")], &[]),
            Closed {
                keys_written: 2,
                deleted: 0,
                ceiling_hit: true,
            },
            &all_four[..],
            "\"closed\"",
        ),
        (
            "no deletes wanted",
            CloseSnapshot {
                delete_unseen: false,
                ..close
            },
            StateWrite::default(),
            Closed {
                keys_written: 2,
                deleted: 0,
                ceiling_hit: false,
            },
            &all_four,
            "\"closed\"",
        ),
        // At the ceiling: the row of an older snapshot and the unmarked one go.
        (
            "at the ceiling",
            CloseSnapshot {
                max_keys: 2,
                ..close
            },
            state("p", &[("snapshot", "null")], &[]),
            Closed {
                keys_written: 2,
                deleted: 2,
                ceiling_hit: false,
            },
            &["a", "b"],
            "null",
        ),
    ];
    for (step, close, write, want_closed, want_keys, want_snapshot) in steps {
        let closed = fx.db.close_snapshot(&spec, close, &write).await.unwrap();
        assert_eq!(closed, want_closed, "{step}");
        assert_eq!(
            fx.by_id("t").await.into_keys().collect::<Vec<_>>(),
            want_keys,
            "{step}"
        );
        assert_eq!(
            load(&fx.db, "p").await["snapshot"],
            json(want_snapshot),
            "{step}"
        );
    }

    // A failure inside rolls back the deletes: a state value that is not JSON.
    fill().await;
    let err = fx
        .db
        .close_snapshot(
            &spec,
            CloseSnapshot {
                max_keys: 10,
                ..close
            },
            &state("p", &[("snapshot", "{bad")], &[]),
        )
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    assert_eq!(fx.by_id("t").await.len(), 4);
}

/// FNV-1a 64 of "ddbpipe:" + schema + ":" + pipeline.
fn lock_key(schema: &str, pipeline: &str) -> u64 {
    let mut hash: u64 = 0xcbf29ce484222325;
    for b in format!("ddbpipe:{schema}:{pipeline}").bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    hash
}

/// The backend pid holding `pipeline`'s lock, seen by an independent query.
async fn lock_pid(admin: &tokio_postgres::Client, schema: &str, pipeline: &str) -> Option<i32> {
    let hash = lock_key(schema, pipeline);
    admin
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1",
            &[&((hash >> 32) as i64), &((hash & 0xffff_ffff) as i64)],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

/// The holder named by a lock attempt that found the lock held.
fn held_by(attempt: Result<LockAttempt, DbError>) -> LockHolder {
    match attempt {
        Ok(LockAttempt::HeldBy(holder)) => holder,
        other => panic!("expected the lock to be held by another run, got {other:?}"),
    }
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_lock_reports_its_holder_and_is_released_with_the_handle() {
    let fx = Fixture::new().await;
    let pipeline = format!("orders-{}", fx.schema);
    let first = fx.handle().await;
    let second = fx.handle().await;

    assert_eq!(second.lock_holder(&pipeline).await.unwrap(), None);
    assert_eq!(first.lock(&pipeline).await.unwrap(), LockAttempt::Acquired);
    // Again: already ours.
    assert_eq!(first.lock(&pipeline).await.unwrap(), LockAttempt::Acquired);
    let backend = lock_pid(&fx.admin, &fx.schema, &pipeline)
        .await
        .expect("lock not in pg_locks");

    // Issue 9 item 12: the holder is named by its ddbpipe process (this test process), not by
    // the PostgreSQL backend serving it.
    let holder = held_by(second.lock(&pipeline).await);
    assert_eq!(holder.pid, Some(std::process::id()));
    assert_ne!(holder.pid, Some(backend as u32));
    let config: tokio_postgres::Config = url().parse().unwrap();
    let tokio_postgres::config::Host::Tcp(host) = &config.get_hosts()[0] else {
        panic!("the tests need a TCP host")
    };
    assert_eq!(
        holder.location,
        format!(
            "postgres advisory lock {} on {host}:{}/{}",
            lock_key(&fx.schema, &pipeline) as i64,
            config.get_ports()[0],
            config.get_dbname().unwrap()
        )
    );
    assert_eq!(
        second.lock_holder(&pipeline).await.unwrap(),
        Some(holder.clone())
    );
    assert_eq!(
        first.lock_holder(&pipeline).await.unwrap(),
        None,
        "own lock reported"
    );
    // Another pipeline is free.
    assert_eq!(
        second.lock(&format!("{pipeline}-2")).await.unwrap(),
        LockAttempt::Acquired
    );

    // A clone keeps it; dropping every clone releases it.
    let clone = first.clone();
    drop(first);
    held_by(second.lock(&pipeline).await);
    drop(clone);
    eventually("the lock to be released", || async {
        second.lock(&pipeline).await.ok() == Some(LockAttempt::Acquired)
    })
    .await;
    let third = fx.handle().await;
    let holder = held_by(third.lock(&pipeline).await);
    assert_eq!(holder.pid, Some(std::process::id()));
    assert_ne!(
        holder.pid.map(|p| p as i32),
        lock_pid(&fx.admin, &fx.schema, &pipeline).await
    );
}

#[tokio::test]
async fn a_lost_connection_is_retryable_and_the_lock_is_retaken() {
    let fx = Fixture::new().await;
    let pipeline = format!("orders-{}", fx.schema);
    let spec = fx.spec("t", &[("id", KeyType::S)]);
    let db = fx.handle().await;
    db.prepare(&spec).await.unwrap();
    assert_eq!(db.lock(&pipeline).await.unwrap(), LockAttempt::Acquired);
    let pid = lock_pid(&fx.admin, &fx.schema, &pipeline).await.unwrap();

    let kill = |pid: i32| async move {
        let admin = admin().await;
        assert!(
            admin
                .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                .await
                .unwrap()
                .get::<_, bool>(0)
        );
        eventually("the backend to exit", || async {
            admin
                .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
                .await
                .unwrap()
                .is_none()
        })
        .await;
    };
    kill(pid).await;
    // The first call may notice the loss (retryable) or reconnect straight away; then it works.
    match db
        .apply(
            &spec,
            &[upsert("a", 1, false)],
            None,
            &StateWrite::default(),
        )
        .await
    {
        Ok(()) => {}
        Err(e) => {
            assert!(e.is_retryable(), "{}", e.message);
            db.apply(
                &spec,
                &[upsert("a", 1, false)],
                None,
                &StateWrite::default(),
            )
            .await
            .unwrap();
        }
    }
    assert_eq!(fx.by_id("t").await.len(), 1);
    let new_pid = lock_pid(&fx.admin, &fx.schema, &pipeline)
        .await
        .expect("lock not re-taken");
    assert_ne!(new_pid, pid);

    // Lost again, and another run takes the lock meanwhile: fatal.
    kill(new_pid).await;
    let other = fx.handle().await;
    assert_eq!(other.lock(&pipeline).await.unwrap(), LockAttempt::Acquired);
    let mut err = db.count_rows(&spec).await.unwrap_err();
    if err.is_retryable() {
        err = db.count_rows(&spec).await.unwrap_err();
    }
    assert!(!err.is_retryable(), "{}", err.message);
    assert!(err.message.contains("another run"), "{}", err.message);
    assert!(err.message.contains(&pipeline), "{}", err.message);
}

#[tokio::test]
async fn numbers_and_bytes_keys_are_exact() {
    let fx = Fixture::new().await;
    let spec = fx.spec("t", &[("n", KeyType::N), ("b", KeyType::B)]);
    fx.db.prepare(&spec).await.unwrap();
    let big = "12345678901234567890123456789012345678";
    let tiny = "-0.000000000000000000000000000000000001";
    let bytes = vec![0u8, 255, 1, 0x27, 0x5c];
    let key = |n: &str, b: &[u8]| vec![KeyValue::N(n.to_string()), KeyValue::B(b.to_vec())];
    let rows = [
        upsert_key(key(big, &bytes), r#"{"v": 1}"#, false),
        upsert_key(key(tiny, &bytes), r#"{"v": 2}"#, false),
        // One more than `big`: a float would merge them.
        upsert_key(
            key("12345678901234567890123456789012345679", &bytes),
            r#"{"v": 3}"#,
            false,
        ),
        upsert_key(key(big, &[]), r#"{"v": 4}"#, false),
    ];
    fx.apply(&spec, &rows, None).await;
    let got: Vec<(String, Vec<u8>)> = fx
        .admin
        .query(
            &format!("SELECT n::text, b FROM \"{}\".t ORDER BY n, b", fx.schema),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        got,
        [
            (tiny.to_string(), bytes.clone()),
            (big.to_string(), vec![]),
            (big.to_string(), bytes.clone()),
            (
                "12345678901234567890123456789012345679".to_string(),
                bytes.clone()
            ),
        ]
    );
    fx.apply(
        &spec,
        &[RowChange::Delete {
            key: key(big, &bytes),
            version: Version::default(),
        }],
        None,
    )
    .await;
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 3);
}

/// Issue 9 item 3: jsonb cannot hold U+0000. The batch fails before anything is sent, as a
/// definite error naming the item's key, the attribute and the option; nothing is written.
#[tokio::test]
async fn a_jsonb_document_with_u0000_fails_naming_the_key_the_attribute_and_the_option() {
    let fx = Fixture::new().await;
    let spec = fx.spec("t", &[("id", KeyType::S), ("n", KeyType::N)]);
    fx.db.prepare(&spec).await.unwrap();
    let rows = [
        upsert_key(
            vec![s("fine"), KeyValue::N("1".into())],
            r#"{"id":"fine","n":1}"#,
            false,
        ),
        upsert_key(
            vec![s("bad"), KeyValue::N("7".into())],
            r#"{"id":"bad","n":7,"tags":{"L":["ok","a\u0000b"]}}"#,
            false,
        ),
    ];
    let error = fx
        .db
        .apply(&spec, &rows, None, &state("p", &[("meta", "{}")], &[]))
        .await
        .unwrap_err();
    assert!(!error.is_retryable(), "{}", error.message);
    common::assert_contains_all(
        "U+0000",
        &error.message,
        &[
            "key id \"bad\", n 7",
            "U+0000 in attribute 'tags.L[1]'",
            "sink.document_type: json",
        ],
    );
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 0);
    assert!(load(&fx.db, "p").await.is_empty());
}

/// Issue 9 item 3: `json` and `text` keep a document byte for byte, `\u0000` included.
#[tokio::test]
async fn json_and_text_documents_keep_u0000_exactly() {
    let fx = Fixture::new().await;
    let document = r#"{"id":"a","v":"x\u0000y","w":"\\u0000","z":1.50}"#;
    for (table, kind) in [
        ("as_json", DocumentType::Json),
        ("as_text", DocumentType::Text),
    ] {
        let spec = TableSpec {
            document_type: kind,
            ..fx.spec(table, &[("id", KeyType::S)])
        };
        fx.db.prepare(&spec).await.unwrap();
        fx.apply(&spec, &[upsert_key(vec![s("a")], document, false)], None)
            .await;
        let row = fx
            .admin
            .query_one(
                &format!(
                    "SELECT doc::text, pg_catalog.format_type(pg_catalog.pg_typeof(doc), NULL) \
                     FROM \"{}\".\"{table}\"",
                    fx.schema
                ),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), document, "{table}");
        assert_eq!(row.get::<_, String>(1), kind.name(), "{table}");
    }
}

/// An existing table whose document column has another type than `document_type` is refused
/// naming both (as a key mismatch is).
#[tokio::test]
async fn an_existing_document_column_of_another_type_is_refused_naming_both() {
    let fx = Fixture::new().await;
    let jsonb = fx.table_t().await;
    let json = TableSpec {
        document_type: DocumentType::Json,
        ..jsonb.clone()
    };
    for db in [fx.db.clone(), fx.handle().await] {
        let error = db.prepare(&json).await.unwrap_err();
        common::assert_contains_all(
            "prepare",
            &error.message,
            &[
                "document column \"doc\" of type jsonb",
                "sink.document_type is json",
            ],
        );
        let error = db.probe(&json).await.unwrap_err();
        assert!(error.message.contains("of type jsonb"), "{}", error.message);
    }
    fx.db.prepare(&jsonb).await.unwrap();
}

#[test]
fn redact_hides_passwords() {
    for (url, want) in [
        (
            "postgres://ddbpipe:hunter22@db.example.com:5432/app?sslmode=require",
            "postgres://ddbpipe:***@db.example.com:5432/app?sslmode=require",
        ),
        (
            "postgresql://ddbpipe@db/app?password=hunter22",
            "postgresql://ddbpipe@db/app?password=***",
        ),
        (
            "host=db.example.com user=ddbpipe password=hunter22 dbname=app",
            "host=db.example.com user=ddbpipe password=*** dbname=app",
        ),
        (
            "host=db password='hunter 22' sslmode=prefer",
            "host=db password=*** sslmode=prefer",
        ),
    ] {
        let redacted = PostgresDatabase::redact(url);
        assert_eq!(redacted, want);
        assert!(!redacted.contains("hunter"));
    }
}

#[tokio::test]
async fn connect_errors_do_not_show_the_password() {
    let config: tokio_postgres::Config = url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the tests need a TCP host, got {other:?}"),
    };
    let port = config.get_ports()[0];
    let user = config.get_user().unwrap();

    // Wrong password, both forms.
    for url in [
        format!("postgres://{user}:hunter22-wrong@{host}:{port}/ddbpipe_test?sslmode=disable"),
        format!(
            "host={host} port={port} user={user} password=hunter22-wrong dbname=ddbpipe_test sslmode=disable"
        ),
    ] {
        let err = PostgresDatabase::connect(&url).await.unwrap_err();
        assert!(!err.message.contains("hunter22"), "{}", err.message);
        assert!(!err.is_retryable(), "{}", err.message);
        assert!(
            err.message.contains("password authentication failed"),
            "{}",
            err.message
        );
        assert!(
            err.message
                .starts_with(&format!("postgres {host}:{port}/ddbpipe_test: ")),
            "{}",
            err.message
        );
    }
    // Unparsable: the string is shown redacted.
    let err = PostgresDatabase::connect("postgres://u:hunter22@db:notaport/app")
        .await
        .unwrap_err();
    assert!(!err.message.contains("hunter22"), "{}", err.message);
    assert!(err.message.contains("u:***@db"), "{}", err.message);
    // Nobody listening: retryable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = PostgresDatabase::connect(&format!(
        "postgres://{user}:hunter22@127.0.0.1:{closed_port}/app?sslmode=disable"
    ))
    .await
    .unwrap_err();
    assert!(err.is_retryable(), "{}", err.message);
    assert!(!err.message.contains("hunter22"), "{}", err.message);
}

#[tokio::test]
async fn sslmode_require_and_prefer() {
    let fx = Fixture::new().await;
    let ssl: String = fx.admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    let base = url().replace("sslmode=disable", "");
    let with = |mode: &str| {
        if base.contains('?') {
            format!("{base}&sslmode={mode}")
                .replace("?&", "?")
                .replace("&&", "&")
        } else {
            format!("{base}?sslmode={mode}")
        }
    };
    // prefer always connects (encrypted when the server can).
    let db = Database::from(PostgresDatabase::connect(&with("prefer")).await.unwrap());
    assert!(db.load_state("p").await.unwrap().is_empty());
    let require = PostgresDatabase::connect(&with("require")).await;
    if ssl == "on" {
        // scripts/postgres.sh turns TLS on with a self-signed certificate: `require` does not
        // verify it, like libpq.
        let db = Database::from(require.unwrap().with_schema(&fx.schema));
        db.prepare_state().await.unwrap();
        let encrypted: i64 = fx
            .admin
            .query_one(
                "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE s.ssl AND a.application_name = 'ddbpipe'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(encrypted >= 1);
    } else {
        let err = require.unwrap_err();
        assert!(
            err.message.contains("TLS") || err.message.contains("tls"),
            "{}",
            err.message
        );
    }
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: T) {}
    let db: Option<Database> = None;
    if let Some(db) = db {
        let spec = TableSpec {
            table: String::new(),
            schema: String::new(),
            key: vec![],
            document_column: Some(String::new()),
            columns: Vec::new(),
            document_type: ddbpipe_keyed::DocumentType::Jsonb,
            create_table: false,
        };
        send(db.apply(&spec, &[], None, &StateWrite::default()));
        send(db.close_snapshot(
            &spec,
            CloseSnapshot {
                id: 0,
                delete_unseen: false,
                max_keys: 0,
            },
            &StateWrite::default(),
        ));
        send(db.lock("p"));
        send(db.probe(&spec));
    }
}

impl versions::Look for Fixture {
    async fn rows(&self, spec: &TableSpec) -> BTreeMap<String, versions::Seen> {
        let sql = format!(
            "SELECT \"{}\"::text, \"{}\"::text, _ddbpipe_snapshot, _ddbpipe_version_ms, \
             _ddbpipe_version_seq FROM \"{}\".\"{}\"",
            spec.key[0].name,
            spec.document_column.as_deref().unwrap_or_default(),
            self.schema,
            spec.table
        );
        self.admin
            .query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let doc: String = row.get(1);
                let seen = versions::Seen {
                    doc: json(&doc),
                    marker: row.get(2),
                    version_ms: row.get(3),
                    version_seq: row.get(4),
                };
                (row.get(0), seen)
            })
            .collect()
    }

    async fn markers(&self) -> Vec<versions::Marker> {
        let sql = format!(
            "SELECT table_name, key_text, version_ms FROM \"{}\"._ddbpipe_deleted ORDER BY 1, 2",
            self.schema
        );
        self.admin
            .query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }
}

/// Runs a scenario of `common::versions` in a fresh schema with `t` prepared.
macro_rules! versions_scenario {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let fx = Fixture::new().await;
            let spec = fx.table_t().await;
            versions::$name(&fx.db, &spec, &fx).await;
        }
    };
}

each_versions_scenario!(versions_scenario);

#[tokio::test]
async fn a_table_without_the_version_columns_is_upgraded_by_prepare_and_keeps_its_rows() {
    let fx = Fixture::new().await;
    // The DDL of ddbpipe before versions.
    fx.admin
        .batch_execute(&format!(
            "CREATE TABLE \"{0}\".\"t\" (\"id\" text NOT NULL, \"doc\" jsonb NOT NULL, \
             \"_ddbpipe_snapshot\" bigint, \"_ddbpipe_updated_at\" text NOT NULL, \
             PRIMARY KEY (\"id\")); \
             INSERT INTO \"{0}\".t VALUES ('old', '{{\"v\": 0}}', 3, '2025-01-01T00:00:00.000Z');",
            fx.schema
        ))
        .await
        .unwrap();
    let spec = fx.spec("t", &[("id", KeyType::S)]);
    let columns = || async {
        fx.admin
            .query(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = $1 AND table_name = 't' ORDER BY ordinal_position",
                &[&fx.schema],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect::<Vec<_>>()
    };
    let old_columns = columns().await;

    // `check` accepts it, says what the run changes, and changes nothing.
    let detail = fx.db.probe(&spec).await.unwrap();
    assert!(
        detail.contains(
            "exists, 1 row(s); run adds the version columns _ddbpipe_version_ms and \
             _ddbpipe_version_seq; run converts _ddbpipe_updated_at from text to timestamptz"
        ),
        "{detail}"
    );
    assert_eq!(columns().await, old_columns);
    assert_eq!(fx.admin.tables(&fx.schema).await, ["t"]);

    fx.db.prepare(&spec).await.unwrap();
    fx.db.prepare(&spec).await.unwrap();
    assert_eq!(
        columns().await,
        [
            "id",
            "doc",
            "_ddbpipe_snapshot",
            "_ddbpipe_updated_at",
            "_ddbpipe_version_ms",
            "_ddbpipe_version_seq"
        ]
    );
    assert_eq!(
        fx.admin.tables(&fx.schema).await,
        ["_ddbpipe_deleted", "_ddbpipe_fences", "_ddbpipe_state", "t"]
    );
    let old = versions::seen(r#"{"v":0}"#, Some(3), None, None);
    assert_eq!(versions::Look::rows(&fx, &spec).await["old"], old);

    // Its row does not hold a snapshot row back; new writes carry versions.
    let rows = [
        versions::snapshot_row("old", r#"{"v":1}"#, Some(versions::T)),
        versions::change("new", "{}", versions::T, "100"),
    ];
    fx.apply(&spec, &rows, Some(7)).await;
    let after = versions::Look::rows(&fx, &spec).await;
    assert_eq!(
        after["old"],
        versions::seen(r#"{"v":1}"#, Some(7), Some(versions::T), None)
    );
    assert_eq!(
        after["new"],
        versions::seen("{}", Some(7), Some(versions::T), Some("100"))
    );
}

/// docs/sinks.md §7.3: a role without the database's TEMPORARY privilege still copies new keys
/// straight into the table, and a batch meeting rows of the table, which would need the staging
/// table, is written one statement per row: the same rows either way.
#[tokio::test]
async fn a_role_without_temporary_copies_new_keys_and_writes_the_rest_row_by_row() {
    let admin = admin().await;
    let config: tokio_postgres::Config = url().parse().unwrap();
    let tokio_postgres::config::Host::Tcp(host) = &config.get_hosts()[0] else {
        panic!("the tests need a TCP host");
    };
    let port = config.get_ports()[0];
    let name = format!("notemp_{:016x}", rand::random::<u64>());
    // One statement each: CREATE DATABASE cannot run inside the implicit transaction of
    // several.
    for statement in [
        format!("CREATE ROLE {name} LOGIN PASSWORD 'pw-{name}'"),
        format!("GRANT {name} TO CURRENT_USER"),
        format!("CREATE DATABASE {name}"),
        format!("REVOKE TEMPORARY ON DATABASE {name} FROM PUBLIC"),
        format!("GRANT CONNECT ON DATABASE {name} TO {name}"),
    ] {
        admin.batch_execute(&statement).await.unwrap();
    }
    let admin_url = url().replace("/ddbpipe_test?", &format!("/{name}?"));
    let (owner, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    owner
        .batch_execute(&format!("CREATE SCHEMA s AUTHORIZATION {name}"))
        .await
        .unwrap();
    let role_url = format!("postgres://{name}:pw-{name}@{host}:{port}/{name}?sslmode=disable");
    let db = Database::from(
        PostgresDatabase::connect(&role_url)
            .await
            .unwrap()
            .with_schema("s"),
    );
    let spec = common::spec_in("s", "t", &[("id", KeyType::S)]);
    db.prepare(&spec).await.unwrap();
    let no_state = StateWrite::default();
    db.apply(
        &spec,
        &[upsert("a", 1, false), upsert("b", 1, false)],
        None,
        &no_state,
    )
    .await
    .unwrap();
    db.apply(
        &spec,
        &[upsert("b", 2, false), upsert("c", 2, false)],
        None,
        &no_state,
    )
    .await
    .unwrap();
    let rows: BTreeMap<String, serde_json::Value> = owner
        .query("SELECT id, doc::text FROM s.t", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), json(row.get(1))))
        .collect();
    assert_eq!(
        rows,
        BTreeMap::from([
            ("a".to_string(), json(r#"{"id": "a", "v": 1}"#)),
            ("b".to_string(), json(r#"{"id": "b", "v": 2}"#)),
            ("c".to_string(), json(r#"{"id": "c", "v": 2}"#)),
        ])
    );
    drop(db);
    drop(owner);
    // Best effort: the throwaway server goes with the test run anyway.
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("DROP ROLE IF EXISTS {name}"),
    ] {
        let _ = admin.batch_execute(&statement).await;
    }
}

#[tokio::test]
async fn a_lease_fence_refuses_an_older_owners_batches() {
    let fx = Fixture::new().await;
    let spec = fx.spec("orders", &[("pk", KeyType::S)]);
    fx.db.prepare(&spec).await.unwrap();
    common::fences_refuse_older_owners(&fx.db, &spec).await;
}

#[tokio::test]
async fn a_shared_snapshot_record_is_opened_once_and_its_cleanup_runs_once() {
    let fx = Fixture::new().await;
    let spec = fx.spec("orders", &[("pk", KeyType::S)]);
    fx.db.prepare(&spec).await.unwrap();
    common::a_shared_snapshot_opens_once_and_closes_once(&fx.db, &spec).await;
}

#[tokio::test]
async fn a_shared_snapshot_is_replaced_once_and_refuses_the_older_generation() {
    let fx = Fixture::new().await;
    let spec = fx.spec("orders", &[("pk", KeyType::S)]);
    fx.db.prepare(&spec).await.unwrap();
    common::a_shared_snapshot_is_replaced_once_and_refuses_the_older_generation(&fx.db, &spec)
        .await;
}

#[tokio::test]
async fn a_state_write_under_an_older_fence_is_refused_and_writes_nothing() {
    let fx = Fixture::new().await;
    let spec = fx.spec("orders", &[("pk", KeyType::S)]);
    fx.db.prepare(&spec).await.unwrap();
    common::a_state_write_under_an_older_fence_is_refused_and_writes_nothing(&fx.db, &spec).await;
}

/// Issue #24 item 8: a session that cannot write — read-only (`default_transaction_read_only`
/// in the URL's `options`) or with a `statement_timeout` under 1 s — fails `check`'s probe
/// with the same message as the run's `prepare`, naming the setting and the fix, and neither
/// leaves anything behind. (A standby, `pg_is_in_recovery()`, takes the same path; the test
/// server has none.)
#[tokio::test]
async fn a_session_that_cannot_write_fails_probe_and_prepare_alike() {
    let fx = Fixture::new().await;
    let spec = fx.spec("orders", &[("id", KeyType::S)]);
    for (option, wanted) in [
        (
            "default_transaction_read_only%3Don",
            &[
                "the session is read-only (transaction_read_only = on)",
                "default_transaction_read_only",
                "PGOPTIONS",
            ][..],
        ),
        (
            "statement_timeout%3D500",
            &["statement_timeout is 500ms, below the 1s", "set it to 0"][..],
        ),
    ] {
        let db = Database::from(
            PostgresDatabase::connect(&format!("{}&options=-c%20{option}", url()))
                .await
                .unwrap()
                .with_schema(&fx.schema),
        );
        let probed = db.probe(&spec).await.unwrap_err();
        let prepared = db.prepare(&spec).await.unwrap_err();
        common::assert_contains_all(&format!("probe, {option}"), &probed.message, wanted);
        assert_eq!(probed.message, prepared.message, "{option}");
        assert!(!probed.is_retryable(), "{option}");
        assert!(fx.admin.tables(&fx.schema).await.is_empty(), "{option}");
    }
    // A whole second is enough.
    let db = PostgresDatabase::connect(&format!("{}&options=-c%20statement_timeout%3D1s", url()))
        .await
        .unwrap();
    Database::from(db).probe(&spec).await.unwrap();
}

/// Issue #24 item 8: `check` runs the run's DDL in a transaction it rolls back, so what only
/// the DDL meets fails `check` too. Here a type of the table's name, which the catalog
/// reads do not see (no relation of that name) but `CREATE TABLE` trips on.
#[tokio::test]
async fn probe_runs_the_runs_ddl_and_rolls_it_back() {
    let fx = Fixture::new().await;
    fx.admin
        .batch_execute(&format!(
            "CREATE TYPE \"{}\".\"orders\" AS ENUM ('x')",
            fx.schema
        ))
        .await
        .unwrap();
    let spec = fx.spec("orders", &[("id", KeyType::S)]);
    let probed = fx.db.probe(&spec).await.unwrap_err();
    let prepared = fx.db.prepare(&spec).await.unwrap_err();
    for (what, error) in [("probe", &probed), ("prepare", &prepared)] {
        common::assert_contains_all(
            what,
            &error.message,
            &[
                &format!("postgres table '{}.orders'", fx.schema),
                "already exists",
            ],
        );
    }
    assert!(fx.admin.tables(&fx.schema).await.is_empty());
}

/// Issue #24 item 16: a number no double holds was a JSON string in a plain document while
/// its neighbours were numbers, so `(doc->'x')::numeric` failed on some rows. Into `jsonb` and
/// `json` plain documents are rendered by the exact rule (docs/values.md §3.7): every row's
/// `x` is a JSON number and casts to exactly the number DynamoDB held.
#[tokio::test]
async fn every_number_is_an_exact_json_number_in_json_and_jsonb_documents() {
    use ddbpipe_value::{Item, Number, Value, ValueFormat};

    let fx = Fixture::new().await;
    let numbers = [
        "12345678901234567890123456789012345678",
        "-9.9999999999999999999999999999999999999E+125",
        "1E-130",
        "1E+125",
        "123456789.123456789",
        "18446744073709551616",
        "1.50",
        "0.1",
        "7",
        "0",
    ];
    for kind in [DocumentType::Jsonb, DocumentType::Json] {
        let table = kind.name();
        let spec = TableSpec {
            document_type: kind,
            ..fx.spec(table, &[("id", KeyType::S)])
        };
        fx.db.prepare(&spec).await.unwrap();
        let format = kind.value_format(ValueFormat::Plain);
        let rows: Vec<RowChange> = numbers
            .iter()
            .enumerate()
            .map(|(i, number)| {
                let item = Item::from([
                    ("id".to_string(), Value::S(i.to_string())),
                    ("x".to_string(), Value::N(Number::new(*number))),
                    ("xs".to_string(), Value::Ns(vec![Number::new(*number)])),
                ]);
                let mut document = Vec::new();
                format.write_item(&item, &mut document);
                upsert_key(
                    vec![s(&i.to_string())],
                    std::str::from_utf8(&document).unwrap(),
                    false,
                )
            })
            .collect();
        fx.apply(&spec, &rows, None).await;
        let typeof_ = if kind == DocumentType::Jsonb {
            "jsonb_typeof"
        } else {
            "json_typeof"
        };
        let found = fx
            .admin
            .query(
                &format!(
                    "SELECT id, {typeof_}(doc->'x'), {typeof_}(doc->'xs'->0), \
                     (doc->>'x')::numeric::text, (doc->'xs'->>0)::numeric::text \
                     FROM \"{}\".\"{table}\" ORDER BY id::int",
                    fx.schema
                ),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(found.len(), numbers.len(), "{table}");
        for (row, number) in found.iter().zip(numbers) {
            let want: String = fx
                .admin
                .query_one("SELECT $1::text::numeric::text", &[&number])
                .await
                .unwrap()
                .get(0);
            let got: (String, String, String, String) =
                (row.get(1), row.get(2), row.get(3), row.get(4));
            assert_eq!(
                got,
                ("number".into(), "number".into(), want.clone(), want),
                "{table}: {number}"
            );
        }
    }
    // What a jsonb reader sees: numeric's text, with the digits after the point as written.
    let seen: Vec<String> = fx
        .admin
        .query(
            &format!(
                "SELECT (doc->'x')::text FROM \"{}\".jsonb WHERE id IN ('6', '2') ORDER BY id",
                fx.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        seen,
        [format!("0.{}1", "0".repeat(129)), "1.50".to_string()]
    );
    // jsonb's own cast: the number itself, not a string holding it.
    let exact: bool = fx
        .admin
        .query_one(
            &format!(
                "SELECT bool_and((doc->'x')::numeric = (doc->'xs'->0)::numeric) FROM \"{}\".jsonb",
                fx.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(exact);
}

/// The tables as the previous ddbpipe created them (`_ddbpipe_updated_at` text), in `schema`,
/// with rows `(id, updated_at)` in the destination table `t`.
async fn create_previous_version_table(
    admin: &tokio_postgres::Client,
    schema: &str,
    rows: &[(&str, &str)],
) {
    admin
        .batch_execute(&format!(
            "CREATE TABLE \"{schema}\".\"t\" (\"id\" text NOT NULL, \"doc\" jsonb NOT NULL, \
             \"_ddbpipe_snapshot\" bigint, \"_ddbpipe_updated_at\" text NOT NULL, \
             \"_ddbpipe_version_ms\" bigint, \"_ddbpipe_version_seq\" text, PRIMARY KEY (\"id\")); \
             CREATE TABLE \"{schema}\".\"_ddbpipe_state\" (pipeline text NOT NULL, \
             part text NOT NULL, value jsonb NOT NULL, updated_at text NOT NULL, \
             PRIMARY KEY (pipeline, part)); \
             CREATE TABLE \"{schema}\".\"_ddbpipe_fences\" (pipeline text NOT NULL, \
             unit text NOT NULL, counter bigint NOT NULL, position text, \
             PRIMARY KEY (pipeline, unit)); \
             CREATE TABLE \"{schema}\".\"_ddbpipe_deleted\" (table_name text NOT NULL, \
             key_text text NOT NULL, version_ms bigint, PRIMARY KEY (table_name, key_text))"
        ))
        .await
        .unwrap();
    for (id, updated_at) in rows {
        admin
            .execute(
                &format!("INSERT INTO \"{schema}\".t VALUES ($1, '{{\"v\": 0}}', 3, $2, 5, '9')"),
                &[id, updated_at],
            )
            .await
            .unwrap();
    }
}

/// The type of `_ddbpipe_updated_at` of table `t` in `schema`.
async fn updated_at_type(admin: &tokio_postgres::Client, schema: &str) -> String {
    admin
        .query_one(
            "SELECT data_type::text FROM information_schema.columns WHERE table_schema = $1 \
             AND table_name = 't' AND column_name = '_ddbpipe_updated_at'",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0)
}

/// Issue 30: the runs of several tables of one pipeline file prepare one schema at once. Each
/// creates its own table and the schema's `_ddbpipe_state`, fence and `_ddbpipe_deleted`
/// tables; PostgreSQL's `CREATE TABLE IF NOT EXISTS` of one name in two sessions at once fails
/// one of them (a unique violation in `pg_type`) unless they wait for each other. Eight rounds
/// of eight sessions at once, each into a fresh schema: every prepare succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_sessions_preparing_one_schema_at_once_all_succeed() {
    for round in 0..8 {
        let fx = Fixture::new().await;
        let mut preparing = Vec::new();
        let together = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        for table in 0..8 {
            let db = fx.handle().await;
            // Connected before the barrier, so the statements meet.
            db.count_rows(&fx.spec("absent", &[("id", KeyType::S)]))
                .await
                .ok();
            let spec = fx.spec(&format!("table_{table}"), &[("id", KeyType::S)]);
            let together = std::sync::Arc::clone(&together);
            preparing.push(tokio::spawn(async move {
                together.wait().await;
                db.prepare_state().await?;
                db.prepare(&spec).await
            }));
        }
        for (table, prepared) in preparing.into_iter().enumerate() {
            prepared
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}, table_{table}: {e}"));
        }
        let tables = fx.admin.tables(&fx.schema).await;
        assert_eq!(tables.len(), 8 + 3, "{tables:?}");
    }
}

/// Issue #24 item 16: `_ddbpipe_updated_at` is `timestamptz`. A table of the previous version
/// (text) is converted in place by `prepare`: `check` says so and changes nothing; two workers
/// preparing at once (both saw text, both wait for the table's lock) convert it once and both
/// go on; each value keeps its instant (one without an offset is UTC, whatever the session's
/// TimeZone); a second `prepare` does nothing; new writes land as timestamptz.
#[tokio::test]
async fn an_updated_at_text_column_becomes_timestamptz_in_place_keeping_each_instant() {
    let fx = Fixture::new().await;
    create_previous_version_table(
        &fx.admin,
        &fx.schema,
        &[
            ("utc", "2024-05-01T12:00:00.123Z"),
            ("offset", "2024-05-01T14:00:00.123+02:00"),
            ("bare", "2024-05-01T12:00:00.123"),
        ],
    )
    .await;
    let spec = fx.spec("t", &[("id", KeyType::S)]);
    // Sessions in another time zone than UTC.
    let tokyo = || async {
        Database::from(
            PostgresDatabase::connect(&format!("{}&options=-c%20TimeZone%3DAsia%2FTokyo", url()))
                .await
                .unwrap()
                .with_schema(&fx.schema),
        )
    };
    let (first, second) = (tokyo().await, tokyo().await);

    let detail = first.probe(&spec).await.unwrap();
    assert!(
        detail.contains(
            "exists, 3 row(s); run converts _ddbpipe_updated_at from text to timestamptz"
        ),
        "{detail}"
    );
    assert_eq!(updated_at_type(&fx.admin, &fx.schema).await, "text");

    // Both workers reach the conversion while a reader holds the table.
    let mut reader = admin().await;
    let reading = reader.transaction().await.unwrap();
    reading
        .batch_execute(&format!(
            "LOCK TABLE \"{}\".t IN ACCESS SHARE MODE",
            fx.schema
        ))
        .await
        .unwrap();
    let prepare = |db: Database| {
        let spec = spec.clone();
        tokio::spawn(async move { db.prepare(&spec).await })
    };
    let (a, b) = (prepare(first.clone()), prepare(second.clone()));
    eventually("both workers waiting for the table's lock", || async {
        let waiting: i64 = fx
            .admin
            .query_one(
                "SELECT count(*) FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_class c \
                 ON c.oid = l.relation JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = 't' AND NOT l.granted",
                &[&fx.schema],
            )
            .await
            .unwrap()
            .get(0);
        waiting == 2
    })
    .await;
    reading.commit().await.unwrap();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();

    assert_eq!(
        updated_at_type(&fx.admin, &fx.schema).await,
        "timestamp with time zone"
    );
    let instants: BTreeMap<String, String> = fx
        .admin
        .query(
            &format!(
                "SELECT id, to_char(_ddbpipe_updated_at AT TIME ZONE 'UTC', \
                 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') FROM \"{}\".t",
                fx.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for id in ["utc", "offset", "bare"] {
        assert_eq!(instants[id], "2024-05-01T12:00:00.123Z", "{id}");
    }

    // Done once: check and prepare find nothing more to do; writes carry the state's time.
    let detail = first.probe(&spec).await.unwrap();
    assert!(detail.ends_with("exists, 3 row(s)"), "{detail}");
    first.prepare(&spec).await.unwrap();
    first
        .apply(
            &spec,
            &[upsert("new", 1, false)],
            None,
            &state("p", &[("meta", "{}")], &[]),
        )
        .await
        .unwrap();
    let written: bool = fx
        .admin
        .query_one(
            &format!(
                "SELECT _ddbpipe_updated_at = '2024-05-01T12:00:00Z'::timestamptz \
                 FROM \"{}\".t WHERE id = 'new'",
                fx.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(written);
}

/// Issue #24 item 16: a value of the old text column that is no time fails `check` and the
/// run alike, naming the row's key, the value and what to do; the table is left as it was.
#[tokio::test]
async fn an_updated_at_value_that_is_no_time_fails_check_and_run_naming_the_row() {
    let fx = Fixture::new().await;
    create_previous_version_table(
        &fx.admin,
        &fx.schema,
        &[
            ("good", "2024-05-01T12:00:00.000Z"),
            ("it's bad", "yesterday"),
        ],
    )
    .await;
    let spec = fx.spec("t", &[("id", KeyType::S)]);
    let probed = fx.db.probe(&spec).await.unwrap_err();
    let prepared = fx.db.prepare(&spec).await.unwrap_err();
    for (what, error) in [("probe", &probed), ("prepare", &prepared)] {
        assert!(!error.is_retryable(), "{what}");
        common::assert_contains_all(
            what,
            &error.message,
            &[
                &format!("postgres table '{}.t'", fx.schema),
                "the row with key id 'it''s bad' holds 'yesterday' in _ddbpipe_updated_at",
                "no RFC 3339 time",
                "nothing was changed",
                "or delete the row, then run again",
            ],
        );
    }
    assert_eq!(updated_at_type(&fx.admin, &fx.schema).await, "text");
    assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 2);
}

/// Issue #24 item 12: no PostgreSQL text value holds U+0000, so an item with one in a string
/// key attribute cannot be stored whatever `document_type` says (the old advice, `json`,
/// could not help, and with `json` the server's error named no item). The batch fails before
/// anything is written, naming the item's key and the attribute and saying what can help.
#[tokio::test]
async fn a_key_holding_u0000_fails_naming_the_item_for_every_document_type() {
    let fx = Fixture::new().await;
    for kind in [DocumentType::Jsonb, DocumentType::Json, DocumentType::Text] {
        let spec = TableSpec {
            document_type: kind,
            ..fx.spec(kind.name(), &[("pk", KeyType::S), ("sk", KeyType::S)])
        };
        fx.db.prepare(&spec).await.unwrap();
        let key = || vec![s("a"), s("b\u{0}c")];
        for bad in [
            upsert_key(key(), r#"{"pk":"a","sk":"b\u0000c"}"#, false),
            RowChange::Delete {
                key: key(),
                version: Version::default(),
            },
        ] {
            let rows = [upsert_key(vec![s("a"), s("fine")], "{}", false), bad];
            let error = fx
                .db
                .apply(&spec, &rows, None, &state("p", &[("meta", "{}")], &[]))
                .await
                .unwrap_err();
            assert!(!error.is_retryable(), "{}", error.message);
            common::assert_contains_all(
                kind.name(),
                &error.message,
                &[
                    "the item with key pk \"a\", sk \"b\\0c\" holds U+0000 in key attribute 'sk'",
                    "cannot be written to PostgreSQL",
                    "whatever sink.document_type says",
                    "sqlite or jsonl sink",
                ],
            );
            assert_eq!(fx.db.count_rows(&spec).await.unwrap(), 0, "{}", kind.name());
            assert!(load(&fx.db, "p").await.is_empty());
        }
    }
}
