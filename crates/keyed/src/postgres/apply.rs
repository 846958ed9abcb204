//! [`PostgresDatabase::apply`]: one batch of row changes and its state in one transaction,
//! copied straight in, merged through the staging table (`bulk`), or one statement per row
//! (see the module docs of `postgres`, "SQL shape" and "Transactions").

use std::borrow::Cow;

use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::PostgresDatabase;
use super::bulk::{self, Bulk};
use super::document;
use super::script::{PgDialect, PgTx, prepare_calls};
use super::session::{Failure, execute_pipelined, prepare_if, prepared};
use super::sql::{
    UpsertKind, check_key, delete_sql, key_param, mark_deleted_sql, qualified, repair_delete_sql,
    repair_mark_sql, repair_upsert_sql, spec_context, upsert_sql, validate,
};
use crate::database::state_calls;
use crate::fence;
use crate::sql::{
    NoSnapshotOpen, Write, columns_misfit, describe_key, key_text, now_rfc3339, plan, row_columns,
    row_key,
};
use crate::{ColumnValue, DbError, RowChange, StateWrite, TableSpec};

/// A statement parameter.
type Param<'a> = &'a (dyn ToSql + Sync);

impl PostgresDatabase {
    /// Writes `rows` and `state` in one transaction (see the module docs). Rows PostgreSQL
    /// cannot store (U+0000 in a key, or in a kept `jsonb` document: `document`) fail the batch
    /// before anything is sent, naming the item; so does a row with another number of typed
    /// values than the table has typed columns.
    pub(crate) async fn apply(
        &self,
        spec: &TableSpec,
        rows: &[RowChange],
        snapshot_id: Option<i64>,
        state: &StateWrite,
    ) -> Result<(), DbError> {
        validate(spec)?;
        let context = spec_context(spec);
        let mut writes = Vec::with_capacity(rows.len());
        // The key texts of deleted-key markers and guarded snapshot rows (empty for the others):
        // owned here, borrowed by the calls.
        let mut key_texts = Vec::with_capacity(rows.len());
        for (index, row) in rows.iter().enumerate() {
            let key = row_key(row);
            check_key(spec, key)?;
            if let Some(misfit) = columns_misfit(spec, index, row) {
                return Err(DbError::fatal(format!("{context}: {misfit}")));
            }
            if let Some(attribute) = document::nul_in_key(&spec.key, key) {
                return Err(DbError::fatal(format!(
                    "{context}: the item with key {} holds U+0000 in key attribute '{attribute}', \
                     which PostgreSQL cannot store in any text value (whatever \
                     sink.document_type says), so this item cannot be written to PostgreSQL; \
                     remove the U+0000 from the item's key in DynamoDB (a new item under \
                     another key), or copy the table with the sqlite or jsonl sink, which keep it",
                    describe_key(&spec.key, key)
                )));
            }
            if let RowChange::Upsert { document, .. } = row
                && spec.document_column.is_some()
                && let Some(path) = document::unstorable(spec.document_type, document)
            {
                return Err(DbError::fatal(format!(
                    "{context}: the item with key {} holds U+0000 in attribute '{path}', \
                     which a jsonb document cannot store; set sink.document_type: json \
                     (keeps the document exactly) or text",
                    describe_key(&spec.key, key)
                )));
            }
            let write = plan(row, snapshot_id).map_err(|NoSnapshotOpen| {
                DbError::fatal(format!(
                    "{context}: a snapshot row without an open snapshot id"
                ))
            })?;
            key_texts.push(match write {
                Write::UpsertUnlessNewer { .. } | Write::DeleteMarked { .. } => key_text(key),
                _ => String::new(),
            });
            writes.push(write);
        }
        // Rows carry the time of the state they commit with, so a reader can match them.
        let updated_at = if state.updated_at.is_empty() {
            now_rfc3339()
        } else {
            state.updated_at.clone()
        };
        let mut session = self.shared.session.lock().await;
        let bulk = Bulk::of(rows, &writes, snapshot_id);
        let table = qualified(&spec.schema, &spec.table);
        let direct = bulk.is_some_and(Bulk::direct) && !session.staged_tables.contains(&table);
        let staged = bulk.filter(|_| !session.no_temp_tables);
        let mut no_temp_tables = false;
        let mut met_rows = false;
        let dialect = PgDialect {
            schema: spec.schema.clone(),
        };
        let state_sql = state_calls(&dialect, state);
        let mut lost = false;
        let result = async {
            let (client, cache) = session.connected(&self.shared).await?;
            let state_prepared = prepare_calls(client, cache, &state_sql).await?;
            let state_writes = || state_prepared.iter().map(|(statement, params)| (statement, params.clone()));
            let direct = match bulk.filter(|_| direct) {
                Some(bulk) => bulk::markers_allow(client, cache, spec, bulk)
                    .await?
                    .then_some(bulk),
                None => None,
            };
            if let Some(bulk) = direct {
                let calls: Vec<_> = state_writes().collect();
                let mut tx =
                    PgTx::begin(client, cache, &self.shared, &dialect, &context, &mut lost).await?;
                let written = async {
                    fence::pass(&mut tx, state).await?;
                    let inner = tx.transaction()?;
                    bulk::direct(inner, spec, rows, &writes, bulk, &updated_at).await?;
                    execute_pipelined(inner, &calls).await
                }
                .await;
                match written {
                    Err(Failure::Pg(error))
                        if error.code() == Some(&SqlState::UNIQUE_VIOLATION) =>
                    {
                        // Nothing of it stays: the staging table's path, in a transaction of
                        // its own.
                        tx.into_inner()?.rollback().await?;
                        met_rows = true;
                    }
                    written => return tx.end(written).await,
                }
            }
            let merge = match staged {
                Some(bulk) => match bulk::merge_statement(client, cache, spec, bulk).await {
                    Ok(merge) => Some((bulk, merge)),
                    Err(error) if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                        tracing::warn!(
                            table = %context,
                            "This role may not create temporary tables (the TEMPORARY privilege on the database): batches over rows already in the table are written one statement per row, which is slower; grant TEMPORARY to write them at COPY speed."
                        );
                        no_temp_tables = true;
                        None
                    }
                    Err(error) => return Err(error.into()),
                },
                None => None,
            };
            if let Some((bulk, merge)) = merge {
                let calls: Vec<_> = state_writes().collect();
                let mut tx =
                    PgTx::begin(client, cache, &self.shared, &dialect, &context, &mut lost).await?;
                let written = async {
                    fence::pass(&mut tx, state).await?;
                    let inner = tx.transaction()?;
                    bulk::write(inner, spec, rows, &writes, &key_texts, bulk, &merge, &updated_at).await?;
                    execute_pipelined(inner, &calls).await
                }
                .await;
                return tx.end(written).await;
            }
            let needs = |f: fn(&Write<'_>) -> bool| writes.iter().any(f);
            // Each statement's text is built only when the batch needs it.
            let upsert_change = prepare_if(
                client,
                cache,
                needs(|w| matches!(w, Write::Upsert { .. })),
                || upsert_sql(spec, UpsertKind::Change),
            )
            .await?;
            let upsert_marked = prepare_if(
                client,
                cache,
                needs(|w| matches!(w, Write::UpsertMarked { .. })),
                || upsert_sql(spec, UpsertKind::Marked),
            )
            .await?;
            let upsert_unless_newer = prepare_if(
                client,
                cache,
                needs(|w| matches!(w, Write::UpsertUnlessNewer { .. })),
                || upsert_sql(spec, UpsertKind::UnlessNewer),
            )
            .await?;
            let delete = prepare_if(
                client,
                cache,
                needs(|w| matches!(w, Write::Delete | Write::DeleteMarked { .. })),
                || delete_sql(spec),
            )
            .await?;
            let mark_deleted = prepare_if(
                client,
                cache,
                needs(|w| matches!(w, Write::DeleteMarked { .. })),
                || mark_deleted_sql(&spec.schema),
            )
            .await?;
            let repairs_upsert = needs(|w| matches!(w, Write::RepairUpsert { .. }));
            let repairs_delete = needs(|w| matches!(w, Write::RepairDelete { .. }));
            let repair_upsert =
                prepare_if(client, cache, repairs_upsert, || repair_upsert_sql(spec)).await?;
            let repair_delete =
                prepare_if(client, cache, repairs_delete, || repair_delete_sql(spec)).await?;
            let repair_mark =
                prepare_if(client, cache, repairs_delete, || repair_mark_sql(spec)).await?;
            let mut calls: Vec<(&Statement, Vec<&(dyn ToSql + Sync)>)> =
                Vec::with_capacity(rows.len() + state_prepared.len());
            // The typed values as text (`sql::column_cast`), owned here, borrowed by the calls.
            let texts: Vec<Vec<Option<Cow<'_, str>>>> = rows
                .iter()
                .map(|row| row_columns(row).iter().map(ColumnValue::sql_text).collect())
                .collect();
            for (((row, write), key_text), texts) in
                rows.iter().zip(&writes).zip(&key_texts).zip(&texts)
            {
                let mut params: Vec<&(dyn ToSql + Sync)> =
                    row_key(row).iter().map(key_param).collect();
                // The document (when kept) and the typed columns, in `sql::value_casts` order.
                let mut values: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(texts.len() + 1);
                if let RowChange::Upsert { document, .. } = row
                    && spec.document_column.is_some()
                {
                    values.push(document);
                }
                values.extend(texts.iter().map(|text| text as &(dyn ToSql + Sync)));
                let statement = match write {
                    Write::Upsert {
                        version_ms,
                        version_seq,
                    } => {
                        params.extend(values);
                        params.extend([&updated_at as Param<'_>, version_ms, version_seq]);
                        upsert_change.as_ref()
                    }
                    Write::UpsertMarked {
                        id,
                        version_ms,
                        version_seq,
                    } => {
                        params.extend(values);
                        params.extend([id as Param<'_>, &updated_at, version_ms, version_seq]);
                        upsert_marked.as_ref()
                    }
                    Write::UpsertUnlessNewer {
                        id,
                        read_ms,
                        cutoff_ms,
                    } => {
                        params.extend(values);
                        params.extend([
                            id as Param<'_>,
                            &updated_at,
                            read_ms,
                            cutoff_ms,
                            &spec.table,
                            key_text,
                        ]);
                        upsert_unless_newer.as_ref()
                    }
                    Write::Delete => delete.as_ref(),
                    Write::DeleteMarked { version_ms } => {
                        calls.push((prepared(delete.as_ref())?, params));
                        params = vec![&spec.table, key_text, version_ms];
                        mark_deleted.as_ref()
                    }
                    Write::RepairUpsert { id, version_ms } => {
                        params.extend(values);
                        params.extend([id as Param<'_>, &updated_at, version_ms]);
                        repair_upsert.as_ref()
                    }
                    Write::RepairDelete { id, version_ms } => {
                        let mut mark = params.clone();
                        params.push(version_ms);
                        calls.push((prepared(repair_delete.as_ref())?, params));
                        mark.push(id);
                        params = mark;
                        repair_mark.as_ref()
                    }
                };
                calls.push((prepared(statement)?, params));
            }
            calls.extend(state_writes());

            let mut tx =
                PgTx::begin(client, cache, &self.shared, &dialect, &context, &mut lost).await?;
            let written = async {
                fence::pass(&mut tx, state).await?;
                execute_pipelined(tx.transaction()?, &calls).await
            }
            .await;
            tx.end(written).await
        }
        .await;
        if lost {
            session.drop_connection();
        }
        session.no_temp_tables |= no_temp_tables;
        if met_rows {
            tracing::debug!(
                table = %context,
                "a batch met rows of the table: its batches go through the staging table from now on"
            );
            session.staged_tables.insert(table);
        }
        session.finish(&self.shared, &context, result)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// `bulk` rule 6: a batch of new keys goes straight into the table, text the `COPY` format
    /// reserves included; one that meets a row of the table is merged through the staging
    /// table, and so are the table's later batches.
    #[tokio::test]
    async fn new_keys_are_copied_into_the_table_and_a_batch_meeting_rows_is_staged() {
        let admin = ddbpipe_testkit::postgres::connect().await;
        let schema = ddbpipe_testkit::postgres::TestSchema::create(&admin, "direct").await;
        let db = PostgresDatabase::connect(&ddbpipe_testkit::postgres::url())
            .await
            .expect("connect")
            .with_schema(schema.name());
        let spec = TableSpec {
            table: "t".into(),
            schema: schema.name().into(),
            key: vec![crate::KeyColumn {
                name: "id".into(),
                kind: crate::KeyType::S,
            }],
            document_column: Some("doc".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        };
        db.prepare(&spec, None).await.expect("prepare");
        let upsert = |id: &str, doc: &str| RowChange::Upsert {
            key: vec![crate::KeyValue::S(id.into())],
            document: doc.into(),
            columns: Vec::new(),
            snapshot: false,
            version: crate::Version::default(),
        };
        let state = |position: &str| StateWrite {
            pipeline: "p".into(),
            upserts: vec![("position".into(), position.into())],
            deletes: Vec::new(),
            updated_at: String::new(),
            fences: Vec::new(),
            snapshot: None,
            record_of: None,
        };
        let odd = "tab\there\nnewline\\back\rcr";
        let first = [
            upsert("a", r#"{"v":1}"#),
            upsert(odd, r#"{"v":"x\\ty\"z\n"}"#),
        ];
        db.apply(&spec, &first, None, &state("1"))
            .await
            .expect("first");
        let staged = |db: &PostgresDatabase| {
            let db = db.clone();
            async move { db.shared.session.lock().await.staged_tables.clone() }
        };
        assert!(staged(&db).await.is_empty(), "new keys: copied straight in");
        let second = [upsert("a", r#"{"v":2}"#), upsert("c", r#"{"v":3}"#)];
        db.apply(&spec, &second, None, &state("2"))
            .await
            .expect("second");
        let table = qualified(&spec.schema, &spec.table);
        assert!(staged(&db).await.contains(&table), "met row a: staged");
        let rows: BTreeMap<String, String> = admin
            .query(
                &format!("SELECT id, doc::text FROM {table} ORDER BY id"),
                &[],
            )
            .await
            .expect("rows")
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        let want: BTreeMap<String, String> = [
            ("a", r#"{"v": 2}"#),
            ("c", r#"{"v": 3}"#),
            (odd, r#"{"v": "x\\ty\"z\n"}"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(rows, want);
        let state = crate::Database::from(db)
            .load_state("p")
            .await
            .expect("state");
        assert_eq!(state, [("position".to_string(), "2".to_string())].into());
    }
}
