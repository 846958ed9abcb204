//! Filling a typed column added to a table with rows, or refilling one whose values another
//! definition wrote (`crate::columns`, plan rules 4 and 7), from the rows' documents, by the
//! conversion the writes use (see the `sqlite` module docs, "Typed columns").
//!
//! # Rules
//! 1. One `UPDATE "t" SET "c" = _ddbpipe_column("doc", "pk", …)` per filled column (every
//!    row's value replaced), in the transaction of the `ALTER TABLE … ADD COLUMN`s and of the
//!    columns' record. `_ddbpipe_column` is a scalar function
//!    registered on the connection for that statement and removed after it: it reads the
//!    column out of the row's document with the sink's `TypedColumns` (no conversion in SQL);
//!    the key arguments only name the row in messages.
//! 2. A mismatch follows `on_type_mismatch`: NULL (counted, the first logged), or under `fail`
//!    the function fails, so the `UPDATE` fails naming the row's key and the column, and the
//!    caller rolls the transaction back: the table is unchanged, the `ALTER` included.

use rusqlite::Connection;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::{Value, ValueRef};

use super::sql::column_value;
use crate::sql::{describe_key, quote};
use crate::{ColumnSpec, KeyColumn, KeyType, KeyValue, TableSpec, TypedColumns};

/// The function of rule 1.
const FUNCTION: &str = "_ddbpipe_column";

/// Fills `column` (added or refilled) of every row of `spec`'s table from the document column
/// `document` (rules 1 and 2).
pub(super) fn fill(
    conn: &Connection,
    spec: &TableSpec,
    document: &str,
    column: &ColumnSpec,
    columns: &TypedColumns,
) -> rusqlite::Result<usize> {
    let only = columns.only(&[column.name.as_str()]);
    let key_columns = spec.key.clone();
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function(FUNCTION, -1, flags, move |ctx| {
        read(ctx, &only, &key_columns)
    })?;
    let mut arguments = vec![quote(document)];
    arguments.extend(spec.key.iter().map(|k| quote(&k.name)));
    let update = format!(
        "UPDATE {} SET {} = {FUNCTION}({})",
        quote(&spec.table),
        quote(&column.name),
        arguments.join(", ")
    );
    let updated = conn.execute(&update, []);
    conn.remove_function(FUNCTION, -1)?;
    updated
}

/// The function's value for one row: its document (argument 0), its key (the others).
fn read(
    ctx: &Context<'_>,
    only: &TypedColumns,
    key_columns: &[KeyColumn],
) -> rusqlite::Result<Value> {
    let document = match ctx.get_raw(0) {
        ValueRef::Text(text) => std::str::from_utf8(text).map_err(|e| failed(e.to_string()))?,
        ValueRef::Null => return Ok(Value::Null),
        _ => return Err(failed("a document that is not text".to_string())),
    };
    let key = || {
        let values: Vec<KeyValue> = key_columns
            .iter()
            .enumerate()
            .map(|(i, column)| key_value(ctx.get_raw(i + 1), column.kind))
            .collect();
        describe_key(key_columns, &values)
    };
    let values = only.values(document, |_| true, key).map_err(failed)?;
    Ok(values.first().map_or(Value::Null, column_value))
}

/// A key argument as a key value (for messages).
fn key_value(raw: ValueRef<'_>, kind: KeyType) -> KeyValue {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    match (raw, kind) {
        (ValueRef::Blob(bytes), _) => KeyValue::B(bytes.to_vec()),
        (ValueRef::Text(bytes), KeyType::N) => KeyValue::N(text(bytes)),
        (ValueRef::Text(bytes), _) => KeyValue::S(text(bytes)),
        (ValueRef::Integer(n), _) => KeyValue::N(n.to_string()),
        (ValueRef::Real(x), _) => KeyValue::N(x.to_string()),
        (ValueRef::Null, _) => KeyValue::S(String::new()),
    }
}

/// The function's error: the `UPDATE` fails with `message`.
fn failed(message: String) -> rusqlite::Error {
    rusqlite::Error::UserFunctionError(message.into())
}
