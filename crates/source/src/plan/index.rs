//! The `index_name` rules that need `DescribeTable` (docs/config.md §1.3 last paragraph).
//!
//! # Rules
//! 1. The named index exists on the table; the message lists the indexes it has.
//! 2. A global secondary index cannot be read with `consistent_read: true`.

use crate::api::{IndexKind, TableDescription};
use crate::config::SourceConfig;

/// Definite: `index_name` cannot be read on this table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexProblem {
    /// Definite: the table has no index of that name (rule 1).
    #[error("index '{name}' not found on table '{table}'; indexes: {listed}")]
    NotFound {
        /// The configured index name.
        name: String,
        /// The configured table name.
        table: String,
        /// The table's index names, comma-separated, or `none`.
        listed: String,
    },
    /// Definite: consistent reads on a GSI (rule 2).
    #[error("global secondary indexes do not support consistent reads")]
    ConsistentGsi,
}

/// What is wrong with `source.index_name` on `table`, if anything.
pub fn index_problem(source: &SourceConfig, table: &TableDescription) -> Option<IndexProblem> {
    let name = source.index_name.as_ref()?;
    match table.index(name) {
        None => {
            let names: Vec<&str> = table.indexes.iter().map(|i| i.name.as_str()).collect();
            let listed = if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            };
            Some(IndexProblem::NotFound {
                name: name.clone(),
                table: source.table_name.clone(),
                listed,
            })
        }
        Some(found) if found.kind == IndexKind::Gsi && source.consistent_read => {
            Some(IndexProblem::ConsistentGsi)
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::IndexDescription;
    use crate::plan::read_rate::tests::table;

    fn with_gsi() -> TableDescription {
        let mut described = table("PROVISIONED", Some(1), None);
        described.indexes.push(IndexDescription {
            name: "by_date".into(),
            kind: IndexKind::Gsi,
            key_schema: Vec::new(),
            read_capacity_units: None,
            max_read_request_units: None,
        });
        described
    }

    #[test]
    fn a_missing_index_is_named_with_the_indexes_the_table_has() {
        let mut source = SourceConfig::new("orders");
        source.index_name = Some("nope".into());
        assert_eq!(
            index_problem(&source, &with_gsi()).map(|p| p.to_string()),
            Some("index 'nope' not found on table 'orders'; indexes: by_date".into())
        );
        let bare = table("PROVISIONED", Some(1), None);
        assert_eq!(
            index_problem(&source, &bare).map(|p| p.to_string()),
            Some("index 'nope' not found on table 'orders'; indexes: none".into())
        );
    }

    #[test]
    fn a_gsi_refuses_consistent_reads_and_reads_otherwise() {
        let mut source = SourceConfig::new("orders");
        source.index_name = Some("by_date".into());
        assert_eq!(index_problem(&source, &with_gsi()), None);
        source.consistent_read = true;
        assert_eq!(
            index_problem(&source, &with_gsi()),
            Some(IndexProblem::ConsistentGsi)
        );
    }

    #[test]
    fn no_index_name_has_no_problem() {
        assert_eq!(
            index_problem(&SourceConfig::new("orders"), &with_gsi()),
            None
        );
    }
}
