//! The record of what each typed column of a destination table holds (`plan` rule 7): one
//! row per table and column in `_ddbpipe_columns`, beside the table (PostgreSQL: in its
//! schema), with the column's definition ([`ColumnSpec::definition`]).
//!
//! The statements are the same text for SQLite and PostgreSQL (`$n` parameters, which SQLite
//! binds by position, and column types both accept); each backend runs them with its own
//! client, inside the transaction that adds and fills the columns.

use ddbpipe_value::ColumnSpec;

/// The record table's name.
pub(crate) const COLUMNS_TABLE: &str = "_ddbpipe_columns";

/// One recorded column of a table: its values were written by `definition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The column's name.
    pub(crate) name: String,
    /// Its definition when its values were last written for every row.
    pub(crate) definition: String,
}

/// `CREATE TABLE IF NOT EXISTS` of the record table; `qualified` is its quoted name
/// (PostgreSQL: with the schema).
pub(crate) fn create_sql(qualified: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {qualified} (table_name text NOT NULL, \
         column_name text NOT NULL, definition text NOT NULL, \
         PRIMARY KEY (table_name, column_name))"
    )
}

/// The columns recorded for the table `$1`: name, definition.
pub(crate) fn select_sql(qualified: &str) -> String {
    format!("SELECT column_name, definition FROM {qualified} WHERE table_name = $1")
}

/// Forgets every column of the table `$1` (before [`insert_sql`] records the configured ones).
pub(crate) fn delete_sql(qualified: &str) -> String {
    format!("DELETE FROM {qualified} WHERE table_name = $1")
}

/// Records one column: table `$1`, column `$2`, definition `$3`.
pub(crate) fn insert_sql(qualified: &str) -> String {
    format!("INSERT INTO {qualified} (table_name, column_name, definition) VALUES ($1, $2, $3)")
}

/// The rows [`insert_sql`] writes for `columns`: name, definition.
pub(crate) fn rows(columns: &[ColumnSpec]) -> Vec<(String, String)> {
    columns
        .iter()
        .map(|column| (column.name.clone(), column.definition()))
        .collect()
}
