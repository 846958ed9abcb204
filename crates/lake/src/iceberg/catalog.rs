//! The SQL catalog of the Iceberg sink (docs/sinks.md §7.11): the tables Iceberg's JDBC
//! catalog and pyiceberg's `SqlCatalog` keep, in a SQLite file.
//!
//! # Rules
//! 1. The layout is the JDBC catalog's (its second, V1, which pyiceberg reads too):
//!    `iceberg_tables` (catalog name, namespace, table name, metadata location, previous
//!    metadata location, `iceberg_type` `TABLE`) and `iceberg_namespace_properties` (catalog
//!    name, namespace, key, value). Both are created when missing, with the file; a namespace
//!    is recorded by its `exists` property. A catalog of the first layout (no `iceberg_type`,
//!    as older pyiceberg creates it) is written in that layout.
//! 2. A commit swaps the metadata location only if it is still the one the commit was built on
//!    (`UPDATE … WHERE metadata_location = old`): one changed row, or a conflict (`false`).
//! 3. Every call opens the file, runs one statement or transaction, and closes it, on a
//!    blocking thread: a catalog is shared with every reader, and held open by nobody.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};

/// A SQL catalog in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqlCatalog {
    path: PathBuf,
    name: String,
}

/// The catalog tables (rule 1), as pyiceberg creates them.
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name VARCHAR(255) NOT NULL,
    table_namespace VARCHAR(255) NOT NULL,
    table_name VARCHAR(255) NOT NULL,
    metadata_location VARCHAR(1000),
    previous_metadata_location VARCHAR(1000),
    iceberg_type VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);
CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name VARCHAR(255) NOT NULL,
    namespace VARCHAR(255) NOT NULL,
    property_key VARCHAR(255) NOT NULL,
    property_value VARCHAR(1000),
    PRIMARY KEY (catalog_name, namespace, property_key)
);";

impl SqlCatalog {
    /// The catalog `name` in the SQLite file at `path`.
    pub fn new(path: PathBuf, name: String) -> SqlCatalog {
        SqlCatalog { path, name }
    }

    /// Reads `uri`: `sqlite:///` then the file's path (`sqlite:////abs/catalog.db`); a relative
    /// path is taken from `base`.
    pub fn path_of(uri: &str, base: &Path) -> Result<PathBuf, String> {
        let Some(path) = uri.strip_prefix("sqlite:///") else {
            return Err(format!(
                "catalog uri '{}' is not a SQLite file: write sqlite:////absolute/path/catalog.db \
                 (PostgreSQL and REST catalogs are not supported yet)",
                ddbpipe_source::endpoint::mask_url(uri)
            ));
        };
        if path.is_empty() {
            return Err("catalog uri 'sqlite:///' names no file".into());
        }
        Ok(base.join(path))
    }

    /// The catalog for messages.
    pub fn describe(&self) -> String {
        format!("SQL catalog '{}' in {}", self.name, self.path.display())
    }

    /// The name readers must give the catalog.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn call<T: Send + 'static>(
        &self,
        what: &'static str,
        work: impl FnOnce(&mut Connection, &str) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        let (path, name) = (self.path.clone(), self.name.clone());
        let described = self.describe();
        tokio::task::spawn_blocking(move || {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            let mut connection = Connection::open(&path).map_err(|e| e.to_string())?;
            connection
                .busy_timeout(std::time::Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            connection
                .execute_batch(TABLES)
                .map_err(|e| e.to_string())?;
            work(&mut connection, &name).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("internal error: {e}"))?
        .map_err(|e| format!("cannot {what} in the {described}: {e}"))
    }

    /// The current metadata location of `namespace.table`; `None` when the catalog has no
    /// such table.
    pub async fn location(&self, namespace: &str, table: &str) -> Result<Option<String>, String> {
        if !tokio::fs::try_exists(&self.path).await.unwrap_or(true) {
            // Reading creates nothing: no file, no table.
            return Ok(None);
        }
        let (namespace, table) = (namespace.to_string(), table.to_string());
        self.call("read a table", move |db, name| {
            db.query_row(
                "SELECT metadata_location FROM iceberg_tables
                 WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3",
                params![name, namespace, table],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
        })
        .await
    }

    /// Records a new table (and its namespace); `false` when another writer recorded it first.
    pub async fn create(
        &self,
        namespace: &str,
        table: &str,
        metadata_location: &str,
    ) -> Result<bool, String> {
        let (namespace, table) = (namespace.to_string(), table.to_string());
        let location = metadata_location.to_string();
        self.call("create a table", move |db, name| {
            let tx = db.transaction()?;
            tx.execute(
                "INSERT OR IGNORE INTO iceberg_namespace_properties
                 (catalog_name, namespace, property_key, property_value)
                 VALUES (?1, ?2, 'exists', 'true')",
                params![name, namespace],
            )?;
            let typed: bool = tx.query_row(
                "SELECT count(*) > 0 FROM pragma_table_info('iceberg_tables')
                 WHERE name = 'iceberg_type'",
                [],
                |row| row.get(0),
            )?;
            let insert = if typed {
                "INSERT OR IGNORE INTO iceberg_tables
                 (catalog_name, table_namespace, table_name, metadata_location,
                  previous_metadata_location, iceberg_type)
                 VALUES (?1, ?2, ?3, ?4, NULL, 'TABLE')"
            } else {
                "INSERT OR IGNORE INTO iceberg_tables
                 (catalog_name, table_namespace, table_name, metadata_location,
                  previous_metadata_location)
                 VALUES (?1, ?2, ?3, ?4, NULL)"
            };
            let created = tx.execute(insert, params![name, namespace, table, location])?;
            tx.commit()?;
            Ok(created == 1)
        })
        .await
    }

    /// Rule 2: moves `namespace.table` from metadata `old` to `new`; `false` on a conflict.
    pub async fn swap(
        &self,
        namespace: &str,
        table: &str,
        old: &str,
        new: &str,
    ) -> Result<bool, String> {
        let (namespace, table) = (namespace.to_string(), table.to_string());
        let (old, new) = (old.to_string(), new.to_string());
        self.call("commit", move |db, name| {
            let changed = db.execute(
                "UPDATE iceberg_tables
                 SET metadata_location = ?1, previous_metadata_location = ?2
                 WHERE catalog_name = ?3 AND table_namespace = ?4 AND table_name = ?5
                   AND metadata_location = ?2",
                params![new, old, name, namespace, table],
            )?;
            Ok(changed == 1)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_swaps_only_from_the_location_it_was_built_on() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = SqlCatalog::new(dir.path().join("sub/catalog.db"), "ddbpipe".into());
        assert_eq!(catalog.location("ns", "t").await.unwrap(), None);
        assert!(catalog.create("ns", "t", "m0").await.unwrap());
        assert!(!catalog.create("ns", "t", "other").await.unwrap(), "taken");
        assert!(catalog.swap("ns", "t", "m0", "m1").await.unwrap());
        assert!(!catalog.swap("ns", "t", "m0", "m2").await.unwrap(), "stale");
        assert_eq!(
            catalog.location("ns", "t").await.unwrap().as_deref(),
            Some("m1")
        );
        let other = SqlCatalog::new(dir.path().join("sub/catalog.db"), "other".into());
        assert_eq!(
            other.location("ns", "t").await.unwrap(),
            None,
            "by catalog name"
        );
    }

    #[tokio::test]
    async fn a_catalog_of_the_first_layout_is_written_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v0.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(&TABLES.replace("    iceberg_type VARCHAR(5),\n", ""))
            .unwrap();
        let catalog = SqlCatalog::new(path.clone(), "ddbpipe".into());
        assert!(catalog.create("ns", "t", "m0").await.unwrap());
        assert_eq!(
            catalog.location("ns", "t").await.unwrap().as_deref(),
            Some("m0")
        );
        let typed = SqlCatalog::new(dir.path().join("v1.db"), "ddbpipe".into());
        assert!(typed.create("ns", "t", "m0").await.unwrap());
        let kind: String = Connection::open(dir.path().join("v1.db"))
            .unwrap()
            .query_row("SELECT iceberg_type FROM iceberg_tables", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kind, "TABLE");
    }

    #[test]
    fn a_uri_names_a_sqlite_file() {
        let base = Path::new("/base");
        assert_eq!(
            SqlCatalog::path_of("sqlite:////var/lib/c.db", base).unwrap(),
            Path::new("/var/lib/c.db")
        );
        assert_eq!(
            SqlCatalog::path_of("sqlite:///rel/c.db", base).unwrap(),
            Path::new("/base/rel/c.db")
        );
        let refused = SqlCatalog::path_of("postgresql://u:secret@h/db", base).unwrap_err();
        assert!(refused.contains("not supported yet"), "{refused}");
        assert!(!refused.contains("secret"), "{refused}");
    }
}
