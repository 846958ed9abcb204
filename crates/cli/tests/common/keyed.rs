//! Keyed destinations for the end-to-end tests: a SQLite file in the test's directory, or a
//! fresh schema in the PostgreSQL server `scripts/test.sh` starts (`DDBPIPE_TEST_POSTGRES_URL`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ddbpipe_testkit::postgres::TestSchema;
use serde_json::Value;

use super::rt;

/// Which database a test mirrors into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A SQLite file.
    Sqlite,
    /// PostgreSQL on loopback.
    Postgres,
}

/// One destination row: the document, the snapshot marker and `_ddbpipe_updated_at` (RFC 3339
/// UTC with milliseconds, as SQLite stores it and PostgreSQL's `timestamptz` is read back).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub document: Value,
    pub snapshot: Option<i64>,
    pub updated_at: String,
}

/// A destination database of one test.
pub struct Destination {
    pub target: Target,
    /// The SQLite file.
    pub path: PathBuf,
    /// The PostgreSQL URL and the test's schema.
    pub url: String,
    pub schema: String,
    /// Drops the PostgreSQL schema with the destination.
    _owned: Option<TestSchema>,
}

pub use ddbpipe_testkit::postgres::url as postgres_url;

async fn pg() -> tokio_postgres::Client {
    ddbpipe_testkit::postgres::connect().await
}

impl Destination {
    /// A fresh destination in `dir` (SQLite) or a fresh schema (PostgreSQL).
    pub fn new(target: Target, dir: &Path) -> Destination {
        let owned = (target == Target::Postgres).then(|| TestSchema::create_blocking("t"));
        let schema = match &owned {
            Some(owned) => owned.name().to_string(),
            None => format!("t_{:016x}", rand::random::<u64>()),
        };
        Destination {
            target,
            path: dir.join("mirror.db"),
            url: match target {
                Target::Sqlite => String::new(),
                Target::Postgres => postgres_url(),
            },
            schema,
            _owned: owned,
        }
    }

    /// The `sink:` section.
    pub fn sink_yaml(&self) -> String {
        match self.target {
            Target::Sqlite => format!("sink:\n  type: sqlite\n  path: {}\n", self.path.display()),
            Target::Postgres => format!(
                "sink:\n  type: postgres\n  url: '{}'\n  schema: {}\n",
                self.url, self.schema
            ),
        }
    }

    /// Runs SQL statements (test set-up: drops, edits).
    pub fn execute(&self, sql: &str) {
        match self.target {
            Target::Sqlite => {
                let db = rusqlite::Connection::open(&self.path).expect("open the sqlite file");
                db.execute_batch(sql).expect("sqlite statements");
            }
            Target::Postgres => rt().block_on(async {
                let client = pg().await;
                client
                    .batch_execute(&format!("SET search_path TO \"{}\"; {sql}", self.schema))
                    .await
                    .expect("postgres statements");
            }),
        }
    }

    /// The rows of a query (PostgreSQL: in the destination's schema), every column as text
    /// (`NULL` for null). SQLite: none while the file or a table it reads does not exist.
    pub fn query_texts(&self, sql: &str) -> Vec<Vec<String>> {
        if self.target == Target::Sqlite {
            let Some(db) = self.read_only() else {
                return Vec::new();
            };
            let Ok(mut statement) = db.prepare(sql) else {
                return Vec::new();
            };
            let columns = statement.column_count();
            return statement
                .query_map([], |row| {
                    (0..columns)
                        .map(|i| {
                            Ok(match row.get_ref(i)? {
                                rusqlite::types::ValueRef::Null => "NULL".to_string(),
                                rusqlite::types::ValueRef::Integer(n) => n.to_string(),
                                rusqlite::types::ValueRef::Real(x) => x.to_string(),
                                rusqlite::types::ValueRef::Text(t)
                                | rusqlite::types::ValueRef::Blob(t) => {
                                    String::from_utf8_lossy(t).into_owned()
                                }
                            })
                        })
                        .collect()
                })
                .expect("sqlite query")
                .collect::<Result<_, _>>()
                .expect("sqlite rows");
        }
        rt().block_on(async {
            let client = pg().await;
            client
                .batch_execute(&format!("SET search_path TO \"{}\"", self.schema))
                .await
                .expect("search_path");
            client
                .simple_query(sql)
                .await
                .expect("postgres query")
                .iter()
                .filter_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).unwrap_or("NULL").to_string())
                            .collect(),
                    ),
                    _ => None,
                })
                .collect()
        })
    }

    /// The SQLite file opened read-only (`None` before it exists).
    fn read_only(&self) -> Option<rusqlite::Connection> {
        rusqlite::Connection::open_with_flags(
            &self.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .ok()
    }

    /// The rows of `table` by hash key `pk` (text).
    pub fn rows(&self, table: &str) -> BTreeMap<String, Row> {
        match self.target {
            Target::Sqlite => {
                let Some(db) = self.read_only() else {
                    return BTreeMap::new();
                };
                let sql = format!(
                    "SELECT pk, document, _ddbpipe_snapshot, _ddbpipe_updated_at FROM \"{table}\""
                );
                let Ok(mut statement) = db.prepare(&sql) else {
                    return BTreeMap::new();
                };
                statement
                    .query_map([], |row| {
                        let document: String = row.get(1)?;
                        Ok((
                            row.get::<_, String>(0)?,
                            Row {
                                document: serde_json::from_str(&document).expect("JSON document"),
                                snapshot: row.get(2)?,
                                updated_at: row.get(3)?,
                            },
                        ))
                    })
                    .expect("query rows")
                    .map(|row| row.expect("a row"))
                    .collect()
            }
            Target::Postgres => rt().block_on(async {
                let client = pg().await;
                let sql = format!(
                    "SELECT pk::text, document::text, _ddbpipe_snapshot, \
                     to_char(_ddbpipe_updated_at AT TIME ZONE 'UTC', \
                     'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') FROM \"{}\".\"{table}\"",
                    self.schema
                );
                let Ok(rows) = client.query(&sql, &[]).await else {
                    return BTreeMap::new();
                };
                rows.iter()
                    .map(|row| {
                        let document: String = row.get(1);
                        (
                            row.get::<_, String>(0),
                            Row {
                                document: serde_json::from_str(&document).expect("JSON document"),
                                snapshot: row.get(2),
                                updated_at: row.get(3),
                            },
                        )
                    })
                    .collect()
            }),
        }
    }

    /// The values of `columns` of `table` by `pk`, each as text (NULL as `None`): PostgreSQL's
    /// text output of the column's type (`col::text`), SQLite's stored value (an INTEGER as its
    /// digits, a REAL in Rust's shortest round-trip form, TEXT as it is).
    pub fn column_texts(
        &self,
        table: &str,
        columns: &[&str],
    ) -> BTreeMap<String, Vec<Option<String>>> {
        let list = |cast: &str| {
            columns
                .iter()
                .map(|c| format!("\"{c}\"{cast}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.target {
            Target::Sqlite => {
                let db = self.read_only().expect("the sqlite file");
                let sql = format!("SELECT pk, {} FROM \"{table}\"", list(""));
                let mut statement = db.prepare(&sql).expect("the columns' query");
                statement
                    .query_map([], |row| {
                        let values = (1..=columns.len())
                            .map(|i| {
                                Ok(match row.get::<_, rusqlite::types::Value>(i)? {
                                    rusqlite::types::Value::Null => None,
                                    rusqlite::types::Value::Integer(n) => Some(n.to_string()),
                                    rusqlite::types::Value::Real(x) => Some(format!("{x:?}")),
                                    rusqlite::types::Value::Text(t) => Some(t),
                                    rusqlite::types::Value::Blob(b) => Some(format!("blob {b:?}")),
                                })
                            })
                            .collect::<rusqlite::Result<Vec<_>>>()?;
                        Ok((row.get::<_, String>(0)?, values))
                    })
                    .expect("query columns")
                    .map(|row| row.expect("a row"))
                    .collect()
            }
            Target::Postgres => rt().block_on(async {
                let client = pg().await;
                let sql = format!(
                    "SELECT pk::text, {} FROM \"{}\".\"{table}\"",
                    list("::text"),
                    self.schema
                );
                let rows = client.query(&sql, &[]).await.expect("the columns' query");
                rows.iter()
                    .map(|row| {
                        let values = (1..=columns.len())
                            .map(|i| row.get::<_, Option<String>>(i))
                            .collect();
                        (row.get::<_, String>(0), values)
                    })
                    .collect()
            }),
        }
    }

    /// The documents of `table` by `pk`.
    pub fn documents(&self, table: &str) -> BTreeMap<String, Value> {
        self.rows(table)
            .into_iter()
            .map(|(pk, row)| (pk, row.document))
            .collect()
    }

    /// The stored state parts of `pipeline`: part → (value, updated_at).
    pub fn state(&self, pipeline: &str) -> BTreeMap<String, (Value, String)> {
        match self.target {
            Target::Sqlite => {
                let Some(db) = self.read_only() else {
                    return BTreeMap::new();
                };
                let Ok(mut statement) = db.prepare(
                    "SELECT part, value, updated_at FROM _ddbpipe_state WHERE pipeline = ?1",
                ) else {
                    return BTreeMap::new();
                };
                statement
                    .query_map([pipeline], |row| {
                        let value: String = row.get(1)?;
                        Ok((
                            row.get::<_, String>(0)?,
                            (serde_json::from_str(&value).expect("JSON"), row.get(2)?),
                        ))
                    })
                    .expect("query state")
                    .map(|row| row.expect("a row"))
                    .collect()
            }
            Target::Postgres => rt().block_on(async {
                let client = pg().await;
                let sql = format!(
                    "SELECT part, value::text, updated_at FROM \"{}\"._ddbpipe_state WHERE pipeline = $1",
                    self.schema
                );
                let Ok(rows) = client.query(&sql, &[&pipeline]).await else {
                    return BTreeMap::new();
                };
                rows.iter()
                    .map(|row| {
                        let value: String = row.get(1);
                        (
                            row.get::<_, String>(0),
                            (serde_json::from_str(&value).expect("JSON"), row.get(2)),
                        )
                    })
                    .collect()
            }),
        }
    }
}

/// The items of table `table` at `endpoint` in typed JSON by `pk` (sets sorted), read by a
/// `mode: scan` pipeline of their own.
pub fn table_items(endpoint: &str, table: &str) -> BTreeMap<String, Value> {
    let dump = super::Pipeline::new(
        "dump",
        endpoint,
        &format!("table_name: {table}\nvalue_format: typed\nsegments: 2"),
    );
    let output = dump.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", super::stderr(&output));
    dump.records()
        .into_iter()
        .map(|mut item| {
            normalize_sets(&mut item);
            let pk = item["pk"]["S"].as_str().expect("a string pk").to_string();
            (pk, item)
        })
        .collect()
}

impl Destination {
    /// The documents of `table` by `pk`, sets sorted: comparable with [`table_items`].
    pub fn items(&self, table: &str) -> BTreeMap<String, Value> {
        self.documents(table)
            .into_iter()
            .map(|(pk, mut doc)| {
                normalize_sets(&mut doc);
                (pk, doc)
            })
            .collect()
    }
}

/// Sorts the members of every set (`SS`, `NS`, `BS`) in typed JSON, so two renderings of one
/// item compare equal whatever order the sets came in.
pub fn normalize_sets(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (tag, member) in map.iter_mut() {
                if matches!(tag.as_str(), "SS" | "NS" | "BS")
                    && let Value::Array(items) = member
                {
                    items.sort_by_key(|v| v.to_string());
                }
                normalize_sets(member);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_sets),
        _ => {}
    }
}
