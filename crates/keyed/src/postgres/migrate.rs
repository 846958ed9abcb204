//! Bringing a destination table of an earlier ddbpipe to this version's shape (docs/sinks.md
//! §7.3): the version columns it lacks, and `_ddbpipe_updated_at` from `text` to `timestamptz`.
//! Both need the table's owner; `check` names what `run` will change and whether it may.
//!
//! # `_ddbpipe_updated_at` as `timestamptz`
//! Earlier versions wrote RFC 3339 text in UTC with milliseconds (`2024-05-01T12:00:00.000Z`)
//! into a `text` column. `prepare` converts it:
//! 1. The column's type comes from the catalog (`schema::inspect`): `timestamp with time zone`
//!    is this version's and nothing is done; `text` is converted; another type is refused by
//!    `Existing::check`, naming it.
//! 2. The conversion is one statement, a `DO` block and so one transaction: it locks the table
//!    (`ACCESS EXCLUSIVE`), reads the column's type again and goes on only while it is still
//!    `text`. A second worker converting at the same time waits for the lock, then finds
//!    `timestamptz` and does nothing; a rerun after a conversion does nothing either.
//! 3. Under the lock it looks for a value that is no RFC 3339 time ([`TIME_PATTERN`]: a date,
//!    `T` or a space, `hh:mm:ss`, an optional fraction, an optional `Z` or `±hh[:mm]` offset).
//!    The first such row fails the run naming its key and value, and the table is unchanged.
//! 4. `ALTER TABLE … ALTER COLUMN … TYPE timestamptz` rewrites the table. A value with an
//!    offset keeps its instant; one without is taken as UTC (what ddbpipe always wrote),
//!    whatever the session's `TimeZone`.
//!
//! `check` runs the same block without the lock and the `ALTER` ([`Conversion::Validate`]): it
//! finds a bad value as the run would, and does not rewrite or lock a table it only looks at.

use std::fmt::Write as _;

use super::sql::qualified;
use crate::TableSpec;
use crate::sql::{UPDATED_AT_COLUMN, quote};

/// The shape of an RFC 3339 time as earlier versions stored it (`[0-9]`, not `\d`, so that
/// `standard_conforming_strings` does not matter).
pub(super) const TIME_PATTERN: &str = "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}\
     (\\.[0-9]+)?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)?$";

/// A value that ends in an offset (rule 4): it is cast as it is, the rest is UTC.
const OFFSET_PATTERN: &str = "([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$";

/// What the conversion block does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conversion {
    /// The run's: lock, check the values, convert (rules 2–4).
    Convert,
    /// `check`'s: check the values only, without the lock.
    Validate,
}

/// The `DO` block converting `_ddbpipe_updated_at` of the table `oid` (`spec`'s) from `text` to
/// `timestamptz`, or only checking its values (see the module docs).
pub(super) fn convert_updated_at_sql(spec: &TableSpec, oid: u32, conversion: Conversion) -> String {
    let table = qualified(&spec.schema, &spec.table);
    let column = quote(UPDATED_AT_COLUMN);
    let key: Vec<String> = spec
        .key
        .iter()
        .map(|k| {
            format!(
                "{} || ' ' || pg_catalog.quote_nullable({}::text)",
                literal(&k.name),
                quote(&k.name)
            )
        })
        .collect();
    let message = format!(
        "the row with key %s holds %L in {UPDATED_AT_COLUMN}, which is no RFC 3339 time, so \
         the column cannot become timestamptz (a text column of an earlier ddbpipe; nothing \
         was changed); set the value to a time such as 2024-05-01T12:00:00.000Z, or delete the \
         row, then run again"
    );
    let mut body = String::from("DECLARE bad record; BEGIN ");
    if conversion == Conversion::Convert {
        let _ = write!(body, "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE; ");
    }
    let _ = write!(
        body,
        "IF (SELECT atttypid FROM pg_catalog.pg_attribute WHERE attrelid = {oid} \
         AND attname = {} AND NOT attisdropped) IS DISTINCT FROM 'pg_catalog.text'::regtype::oid \
         THEN RETURN; END IF; \
         SELECT concat_ws(', ', {}) AS key, {column} AS value INTO bad FROM {table} \
         WHERE {column} !~ {} LIMIT 1; \
         IF FOUND THEN RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format', \
         MESSAGE = pg_catalog.format({}, bad.key, bad.value); END IF; ",
        literal(UPDATED_AT_COLUMN),
        key.join(", "),
        literal(TIME_PATTERN),
        literal(&message),
    );
    if conversion == Conversion::Convert {
        let _ = write!(
            body,
            "ALTER TABLE {table} ALTER COLUMN {column} TYPE timestamptz USING CASE WHEN \
             {column} ~ {} THEN {column}::timestamptz ELSE ({column}::timestamp AT TIME ZONE \
             'UTC') END; ",
            literal(OFFSET_PATTERN)
        );
    }
    body.push_str("END");
    format!("DO {}", dollar_quoted(&body))
}

/// A SQL string literal, `'` doubled.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `body` between dollar quotes whose tag it does not contain (names may hold `$`).
fn dollar_quoted(body: &str) -> String {
    let mut tag = String::from("$ddbpipe$");
    let mut n = 0;
    while body.contains(&tag) {
        n += 1;
        tag = format!("$ddbpipe{n}$");
    }
    format!("{tag}{body}{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyColumn, KeyType};

    fn spec(table: &str) -> TableSpec {
        TableSpec {
            table: table.into(),
            schema: "s".into(),
            key: vec![KeyColumn {
                name: "it's".into(),
                kind: KeyType::S,
            }],
            document_column: Some("doc".into()),
            columns: Vec::new(),
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        }
    }

    #[test]
    fn a_table_name_holding_the_dollar_tag_gets_another_tag() {
        let sql = convert_updated_at_sql(&spec("a$ddbpipe$b"), 7, Conversion::Convert);
        assert!(sql.starts_with("DO $ddbpipe1$"), "{sql}");
        assert!(sql.ends_with("END$ddbpipe1$"), "{sql}");
    }

    #[test]
    fn only_the_run_locks_and_converts() {
        let run = convert_updated_at_sql(&spec("t"), 7, Conversion::Convert);
        let check = convert_updated_at_sql(&spec("t"), 7, Conversion::Validate);
        for (sql, present) in [(&run, true), (&check, false)] {
            assert_eq!(sql.contains("LOCK TABLE"), present, "{sql}");
            assert_eq!(sql.contains("ALTER TABLE"), present, "{sql}");
            assert!(sql.contains("'it''s' || ' '"), "{sql}");
            assert!(sql.contains("attrelid = 7"), "{sql}");
        }
    }
}
