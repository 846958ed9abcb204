//! The comparison of the configured columns with an existing destination table
//! (docs/sinks.md §7.9, "Schema changes at start"): one plan that `prepare` carries out and
//! `check` reports (`Database::check_columns`), so the two cannot disagree.
//!
//! # Rules
//! 1. Compared here: the document column, the typed columns, and the table's columns
//!    ddbpipe does not write. The key columns and ddbpipe's own `_ddbpipe_*` columns are
//!    each backend's schema check.
//! 2. The configured document column: present is fine (PostgreSQL compares its type with
//!    `sink.document_type`); missing from an empty table, it is added; missing from a table
//!    with rows, refused: the rows' documents cannot be made up.
//! 3. A typed column present with the configured type is written as it is; with another type
//!    it is refused, naming the column, the table's type and the configured one: ddbpipe never
//!    re-types a column.
//! 4. A typed column missing is added (nullable). When the table has rows it is filled for
//!    them from their documents (the same conversion as the writes, in the transaction of the
//!    `ALTER`); without a document column in the table and the configuration, a table with
//!    rows is refused: the values cannot be filled, a resnapshot into an empty table is
//!    needed.
//! 5. Any other column of the table is left as it is and named (a warning at the start of a
//!    run, a note in `check`), unless it is `NOT NULL` without a default: every insert would
//!    fail, so it is refused, naming it (with `document_column: null`, saying how an earlier
//!    document column is dropped).
//! 6. Names compare as the database compares quoted identifiers (PostgreSQL exactly, SQLite
//!    ignoring ASCII case), types as the catalog names them ([`Naming`]).
//! 7. What each typed column holds is recorded per table (`records`: its definition, i.e.
//!    type, path and timestamp format), rewritten in the transaction that adds and fills
//!    columns whenever it differs from the configuration. A typed column present with the
//!    configured type but recorded with another definition — or not recorded: a column
//!    ddbpipe did not fill, or one left unwritten while a configuration without it ran —
//!    holds values some other definition gave, or none: over rows it is refilled from the
//!    documents like an added column (every row's value replaced, NULL where the new
//!    definition finds nothing), and refused without a document column; over an empty table
//!    it is only recorded. A column the configuration leaves out loses its record (rule 5),
//!    so configuring it again refills it.

use ddbpipe_value::{ColumnSpec, ColumnType};

use super::{ColumnCheck, Recorded};
use crate::TableSpec;
use crate::sql::quote;

/// How a backend names and compares columns (rule 6).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Naming {
    /// Whether two column names are one column.
    pub(crate) same: fn(&str, &str) -> bool,
    /// The type of a typed column as the catalog names it.
    pub(crate) type_name: fn(ColumnType) -> &'static str,
}

/// One column of an existing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableColumn {
    /// Its name.
    pub(crate) name: String,
    /// Its type as the catalog names it (PostgreSQL `format_type`, SQLite's declared type).
    pub(crate) type_name: String,
    /// `NOT NULL` without a default: an insert that leaves it out fails.
    pub(crate) required: bool,
}

/// What starting a run does to the table's columns (rules 2–5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnPlan<'s> {
    /// Why the run refuses to start (empty: it does not).
    pub(crate) refusals: Vec<String>,
    /// Add the configured document column (the table is empty; rule 2).
    pub(crate) add_document: bool,
    /// The typed columns to add, in configuration order (rule 4).
    pub(crate) added: Vec<&'s ColumnSpec>,
    /// The typed columns present whose values another definition wrote, each with what it
    /// was (`None`: not recorded), to refill over rows (rule 7).
    pub(crate) refilled: Vec<(&'s ColumnSpec, Option<String>)>,
    /// Fill `added` and `refilled` for the table's rows from their documents (rules 4, 7).
    pub(crate) fill: bool,
    /// The record of the table's typed columns differs from the configuration: rewrite it
    /// (rule 7).
    pub(crate) record: bool,
    /// The table's columns nobody writes any more (rule 5).
    pub(crate) unused: Vec<String>,
}

/// The plan for `spec` over a table with `columns`, its typed columns `recorded`, holding rows
/// when `has_rows` (rules 1–7).
pub(crate) fn plan<'s>(
    spec: &'s TableSpec,
    columns: &[TableColumn],
    recorded: &[Recorded],
    has_rows: bool,
    naming: Naming,
) -> ColumnPlan<'s> {
    let find = |name: &str| columns.iter().find(|c| (naming.same)(&c.name, name));
    let record_of = |name: &str| recorded.iter().find(|r| (naming.same)(&r.name, name));
    let mut plan = ColumnPlan {
        refusals: Vec::new(),
        add_document: false,
        added: Vec::new(),
        refilled: Vec::new(),
        fill: false,
        record: recorded.len() != spec.columns.len(),
        unused: Vec::new(),
    };
    let mut document_kept = false;
    if let Some(document) = &spec.document_column {
        match find(document) {
            Some(_) => document_kept = true,
            None if has_rows => plan.refusals.push(format!(
                "the table has rows but not the document column {} (sink.document_column), \
                 which cannot be filled for them; set sink.document_column to the table's \
                 document column (or null to keep none), or drop the table and run `ddbpipe \
                 state reset`, then run again",
                quote(document)
            )),
            None => plan.add_document = true,
        }
    }
    for column in &spec.columns {
        let wanted = (naming.type_name)(column.kind);
        let definition = column.definition();
        let was = record_of(&column.name).map(|r| r.definition.clone());
        plan.record |= was.as_ref() != Some(&definition);
        match find(&column.name) {
            Some(found) if found.type_name.eq_ignore_ascii_case(wanted) => {
                if !has_rows || was.as_ref() == Some(&definition) {
                    continue;
                }
                if !document_kept {
                    plan.refusals.push(format!(
                        "column {} holds values {}, not of its definition in sink.columns \
                         ({definition}), and they cannot be refilled for the rows there \
                         without a document column to read them from; set its path, type and \
                         format back, give it another name, or resnapshot into an empty table: \
                         drop the table (or delete its rows), run `ddbpipe state reset`, then \
                         run again",
                        quote(&column.name),
                        written_by(was.as_deref()),
                    ));
                    continue;
                }
                plan.fill = true;
                plan.refilled.push((column, was));
            }
            Some(found) => plan.refusals.push(format!(
                "column {} has type {} in the table but sink.columns gives it type {} ({wanted}); \
                 ddbpipe never re-types a column: set its type in sink.columns to the table's, \
                 change the column yourself (a new type's values are not ddbpipe's to convert), \
                 or give it another name",
                quote(&column.name),
                found.type_name,
                column.kind,
            )),
            None if has_rows && !document_kept => plan.refusals.push(format!(
                "column {} of sink.columns is not in the table, and its values cannot be filled \
                 for the rows there without a document column to read them from; a resnapshot \
                 into an empty table is needed: drop the table (or delete its rows), run \
                 `ddbpipe state reset`, then run again",
                quote(&column.name)
            )),
            None => {
                plan.fill |= has_rows;
                plan.added.push(column);
            }
        }
    }
    let written = |name: &str| {
        spec.key.iter().any(|k| (naming.same)(&k.name, name))
            || spec
                .document_column
                .as_deref()
                .is_some_and(|document| (naming.same)(document, name))
            || spec.columns.iter().any(|c| (naming.same)(&c.name, name))
            || name
                .get(..crate::RESERVED_PREFIX.len())
                .is_some_and(|prefix| prefix.eq_ignore_ascii_case(crate::RESERVED_PREFIX))
    };
    for column in columns.iter().filter(|c| !written(&c.name)) {
        if !column.required {
            plan.unused.push(column.name.clone());
            continue;
        }
        let document_hint = if spec.document_column.is_none() {
            format!(
                " (with document_column: null, the document column of an earlier \
                 configuration is such a column: dropping the document needs a resnapshot — drop \
                 the column, ALTER TABLE … DROP COLUMN {}, then `ddbpipe state reset` and run; \
                 or write a new table, another sink.table)",
                quote(&column.name)
            )
        } else {
            String::new()
        };
        plan.refusals.push(format!(
            "column {} of the table is NOT NULL without a default, but ddbpipe does not write it \
             (it is not a key attribute, the document column or in sink.columns), so every \
             insert would fail; add it to sink.columns, give it a default, or drop it{document_hint}",
            quote(&column.name)
        ));
    }
    plan
}

/// What a column's recorded definition says about its values (rule 7).
fn written_by(was: Option<&str>) -> String {
    match was {
        Some(definition) => format!("written as {definition}"),
        None => "ddbpipe has no record of (written by something else, or left unwritten while \
         a configuration without the column ran)"
            .to_string(),
    }
}

impl<'s> ColumnPlan<'s> {
    /// The refusals as one message, when there are any.
    pub(crate) fn refused(&self) -> Option<String> {
        (!self.refusals.is_empty()).then(|| self.refusals.join("; "))
    }

    /// Whether the run adds columns to the table (which takes its owner's rights).
    pub(crate) fn adds(&self) -> bool {
        self.add_document || !self.added.is_empty()
    }

    /// Whether the run changes the table, its rows' typed columns or their record.
    pub(crate) fn alters(&self) -> bool {
        self.adds() || !self.refilled.is_empty() || self.record
    }

    /// The typed columns the run fills for the table's rows, when it fills (rules 4, 7):
    /// those it adds, then those it refills.
    pub(crate) fn filled(&self) -> Vec<&'s ColumnSpec> {
        let added = self.added.iter().copied();
        added
            .chain(self.refilled.iter().map(|(column, _)| *column))
            .collect()
    }

    /// What `check` reports (rules 2–5).
    pub(crate) fn check(&self, spec: &TableSpec) -> ColumnCheck {
        let mut notes = Vec::new();
        if self.add_document
            && let Some(document) = &spec.document_column
        {
            notes.push(format!(
                "run adds the document column {} (the table is empty)",
                quote(document)
            ));
        }
        for column in &self.added {
            let filled = if self.fill {
                "and fills it for the table's rows from their documents, in one transaction"
            } else {
                "(the table is empty)"
            };
            notes.push(format!(
                "run adds column {} ({}) {filled}",
                quote(&column.name),
                column.kind
            ));
        }
        for (column, was) in &self.refilled {
            notes.push(format!(
                "run refills column {} for the table's rows from their documents, in one \
                 transaction: it holds values {}, not of its definition ({})",
                quote(&column.name),
                written_by(was.as_deref()),
                column.definition()
            ));
        }
        for name in &self.unused {
            notes.push(unused_note(name));
        }
        ColumnCheck {
            refusals: self.refusals.clone(),
            notes,
        }
    }

    /// Logs the columns left unused (rule 5), once per start of a run.
    pub(crate) fn warn_unused(&self, table: &str) {
        if self.unused.is_empty() {
            return;
        }
        let names: Vec<String> = self.unused.iter().map(|name| quote(name)).collect();
        tracing::warn!(
            table,
            columns = %names.join(", "),
            "Columns of the table are not written by this configuration (not a key attribute, \
             the document column or in sink.columns): they are left as they are, null in new \
             rows."
        );
    }
}

/// `check`'s note of a column nobody writes (rule 5).
fn unused_note(name: &str) -> String {
    format!(
        "column {} of the table is not written (not a key attribute, the document column or in \
         sink.columns): left as it is, null in new rows",
        quote(name)
    )
}

#[cfg(test)]
mod tests {
    use ddbpipe_value::{ColumnPath, TimeFormat};

    use super::*;
    use crate::{KeyColumn, KeyType};

    const EXACT: Naming = Naming {
        same: |a, b| a == b,
        type_name: |kind| kind.name(),
    };

    fn typed(name: &str, kind: ColumnType) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            path: ColumnPath::parse(name).expect("a path"),
            kind,
            time_format: TimeFormat::default(),
        }
    }

    /// The record of a table last written by `spec`.
    fn recorded(spec: &TableSpec) -> Vec<Recorded> {
        let rows = super::super::records::rows(&spec.columns).into_iter();
        rows.map(|(name, definition)| Recorded { name, definition })
            .collect()
    }

    /// The record of the table of [`table`].
    fn record() -> Vec<Recorded> {
        recorded(&spec(Some("doc"), vec![typed("qty", ColumnType::Bigint)]))
    }

    fn spec(document: Option<&str>, columns: Vec<ColumnSpec>) -> TableSpec {
        TableSpec {
            table: "t".into(),
            schema: "s".into(),
            key: vec![KeyColumn {
                name: "pk".into(),
                kind: KeyType::S,
            }],
            document_column: document.map(str::to_string),
            columns,
            document_type: crate::DocumentType::Jsonb,
            create_table: true,
        }
    }

    fn column(name: &str, type_name: &str, required: bool) -> TableColumn {
        TableColumn {
            name: name.into(),
            type_name: type_name.into(),
            required,
        }
    }

    /// The columns of a table written for `spec(Some("doc"), [qty bigint])`.
    fn table() -> Vec<TableColumn> {
        vec![
            column("pk", "text", true),
            column("doc", "jsonb", true),
            column("qty", "bigint", false),
            column("_ddbpipe_snapshot", "bigint", false),
            column("_ddbpipe_updated_at", "timestamptz", true),
        ]
    }

    #[test]
    fn a_table_of_the_configuration_is_written_as_it_is() {
        let spec = spec(Some("doc"), vec![typed("qty", ColumnType::Bigint)]);
        let plan = plan(&spec, &table(), &record(), true, EXACT);
        assert_eq!(plan.refused(), None);
        assert!(!plan.alters() && plan.unused.is_empty(), "{plan:?}");
        assert_eq!(plan.check(&spec), ColumnCheck::default());
    }

    /// Rule 4: added, filled over rows from the kept documents; refused over rows without
    /// them.
    #[test]
    fn a_new_column_is_added_filled_over_rows_and_refused_over_rows_without_documents() {
        let both = vec![
            typed("qty", ColumnType::Bigint),
            typed("total", ColumnType::Numeric),
        ];
        let spec_with = spec(Some("doc"), both.clone());
        let filled = plan(&spec_with, &table(), &record(), true, EXACT);
        assert_eq!(filled.added, [&spec_with.columns[1]]);
        assert!(filled.fill && filled.refused().is_none());
        let notes = filled.check(&spec_with).notes;
        assert!(
            notes[0].contains("adds column \"total\" (numeric) and fills it"),
            "{notes:?}"
        );
        let empty = plan(&spec_with, &table(), &record(), false, EXACT);
        assert!(!empty.fill && empty.added.len() == 1, "{empty:?}");

        let without = spec(None, both);
        let mut docless = table();
        docless.remove(1);
        let refused = plan(&without, &docless, &record(), true, EXACT);
        let message = refused.refused().expect("refused");
        assert!(
            message.contains("column \"total\" of sink.columns is not in the table")
                && message.contains("a resnapshot into an empty table is needed")
                && message.contains("ddbpipe state reset"),
            "{message}"
        );
        assert!(refused.added.is_empty());
        let added = plan(&without, &docless, &record(), false, EXACT);
        assert!(
            added.refused().is_none() && added.added.len() == 1,
            "{added:?}"
        );
    }

    /// Rule 3.
    #[test]
    fn a_column_of_another_type_is_refused_naming_both_types() {
        let spec = spec(Some("doc"), vec![typed("qty", ColumnType::Double)]);
        let message = plan(&spec, &table(), &record(), false, EXACT)
            .refused()
            .expect("refused");
        assert!(
            message.contains("column \"qty\" has type bigint in the table")
                && message.contains("gives it type double"),
            "{message}"
        );
    }

    /// Rule 5: unused columns are named; a required one is refused, with the document hint
    /// when the configuration keeps no document.
    #[test]
    fn columns_nobody_writes_are_left_unless_inserts_would_fail() {
        let spec_none = spec(Some("doc"), Vec::new());
        let left = plan(&spec_none, &table(), &record(), true, EXACT);
        assert_eq!(left.unused, ["qty"]);
        assert!(left.refused().is_none());
        assert!(left.check(&spec_none).notes[0].contains("\"qty\" of the table is not written"));

        let mut required = table();
        required.push(column("extra", "text", true));
        let message = plan(&spec_none, &required, &record(), true, EXACT)
            .refused()
            .expect("refused");
        assert!(
            message.contains("column \"extra\" of the table is NOT NULL"),
            "{message}"
        );
        assert!(!message.contains("DROP COLUMN"), "{message}");

        let dropped = spec(None, vec![typed("qty", ColumnType::Bigint)]);
        let message = plan(&dropped, &table(), &record(), false, EXACT)
            .refused()
            .expect("refused");
        assert!(
            message.contains("column \"doc\" of the table is NOT NULL")
                && message.contains("ALTER TABLE … DROP COLUMN \"doc\""),
            "{message}"
        );
    }

    /// Rule 2.
    #[test]
    fn a_missing_document_column_is_added_to_an_empty_table_and_refused_over_rows() {
        let spec = spec(Some("document"), vec![typed("qty", ColumnType::Bigint)]);
        let mut columns = table();
        columns.remove(1);
        let empty = plan(&spec, &columns, &record(), false, EXACT);
        assert!(empty.add_document && empty.refused().is_none(), "{empty:?}");
        let message = plan(&spec, &columns, &record(), true, EXACT)
            .refused()
            .expect("refused");
        assert!(
            message.contains("has rows but not the document column \"document\""),
            "{message}"
        );
    }

    /// Rule 6: SQLite compares names ignoring case.
    #[test]
    fn names_compare_as_the_naming_says() {
        let ignore_case = Naming {
            same: str::eq_ignore_ascii_case,
            ..EXACT
        };
        let spec = spec(Some("DOC"), vec![typed("QTY", ColumnType::Bigint)]);
        let plan_ignoring = plan(&spec, &table(), &recorded(&spec), true, ignore_case);
        assert!(!plan_ignoring.alters() && plan_ignoring.refused().is_none());
        let exact = plan(&spec, &table(), &record(), false, EXACT);
        assert!(exact.add_document && exact.added.len() == 1, "{exact:?}");
    }

    /// Rule 7: a column whose values another definition wrote is refilled over rows (and
    /// only recorded over an empty table), refused without documents; a column left out
    /// loses its record.
    #[test]
    fn a_column_written_by_another_definition_is_refilled() {
        let moved = ColumnSpec {
            path: ColumnPath::parse("order.qty").expect("a path"),
            ..typed("qty", ColumnType::Bigint)
        };
        let spec_moved = spec(Some("doc"), vec![moved.clone()]);
        let refill = plan(&spec_moved, &table(), &record(), true, EXACT);
        assert_eq!(
            refill.refilled,
            [(&spec_moved.columns[0], Some("bigint from qty".to_string()))]
        );
        assert!(refill.fill && refill.record && refill.added.is_empty());
        assert_eq!(refill.filled(), [&spec_moved.columns[0]]);
        let notes = refill.check(&spec_moved).notes;
        assert!(
            notes[0].contains("refills column \"qty\"")
                && notes[0].contains("written as bigint from qty")
                && notes[0].contains("(bigint from order.qty)"),
            "{notes:?}"
        );

        let empty = plan(&spec_moved, &table(), &record(), false, EXACT);
        assert!(empty.refilled.is_empty() && !empty.fill, "{empty:?}");
        assert!(empty.record && empty.alters());

        let same = spec(Some("doc"), vec![typed("qty", ColumnType::Bigint)]);
        let unrecorded = plan(&same, &table(), &[], true, EXACT);
        assert!(
            unrecorded.fill && unrecorded.refilled[0].1.is_none(),
            "{unrecorded:?}"
        );

        let mut docless = table();
        docless.remove(1);
        let spec_docless = spec(None, vec![moved]);
        let message = plan(&spec_docless, &docless, &record(), true, EXACT)
            .refused()
            .expect("refused");
        assert!(
            message.contains("column \"qty\" holds values written as bigint from qty, not of its definition in sink.columns (bigint from order.qty)")
                && message.contains("ddbpipe state reset"),
            "{message}"
        );

        let spec_none = spec(Some("doc"), vec![]);
        let left_out = plan(&spec_none, &table(), &record(), true, EXACT);
        assert!(
            left_out.record && left_out.refilled.is_empty(),
            "{left_out:?}"
        );
        assert!(!plan(&same, &table(), &record(), true, EXACT).alters());
    }
}
