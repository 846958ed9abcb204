//! Follow a table's changes into a sink of your own, keeping the stream's position in a SQLite
//! database of your own instead of ddbpipe's state file.
//!
//! ```text
//! cargo run --example changes_with_own_checkpoints -- orders positions.db http://127.0.0.1:8000
//! ```
//!
//! Run it twice: the second run reads only the changes made since the first one's last
//! acknowledged batch, from the position the first one stored in `positions.db`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use ddbpipe::sink::{Batch, Op, Sink, SinkError};
use ddbpipe::store::{Checkpoint, CheckpointStore, StoreError};

/// Positions in a table `positions (pipeline TEXT PRIMARY KEY, checkpoint TEXT)` of a SQLite
/// file.
pub struct SqlitePositions {
    db: Arc<Mutex<rusqlite::Connection>>,
}

impl SqlitePositions {
    /// Opens (creating) the positions table in the database at `path`.
    pub fn open(path: &Path) -> Result<SqlitePositions, StoreError> {
        let db = rusqlite::Connection::open(path).map_err(|e| StoreError::new(e.to_string()))?;
        db.execute(
            "CREATE TABLE IF NOT EXISTS positions (pipeline TEXT PRIMARY KEY, checkpoint TEXT NOT NULL)",
            [],
        )
        .map_err(|e| StoreError::new(e.to_string()))?;
        Ok(SqlitePositions {
            db: Arc::new(Mutex::new(db)),
        })
    }

    fn db(&self) -> Result<std::sync::MutexGuard<'_, rusqlite::Connection>, StoreError> {
        self.db
            .lock()
            .map_err(|_| StoreError::new("the positions database was poisoned"))
    }
}

impl CheckpointStore for SqlitePositions {
    fn describe(&self) -> String {
        "sqlite positions table".to_string()
    }

    async fn load(&mut self, pipeline: &str) -> Result<Option<Checkpoint>, StoreError> {
        let text: Option<String> = {
            let db = self.db()?;
            let mut statement = db
                .prepare("SELECT checkpoint FROM positions WHERE pipeline = ?1")
                .map_err(|e| StoreError::new(e.to_string()))?;
            let mut rows = statement
                .query([pipeline])
                .map_err(|e| StoreError::new(e.to_string()))?;
            match rows.next().map_err(|e| StoreError::new(e.to_string()))? {
                Some(row) => Some(row.get(0).map_err(|e| StoreError::new(e.to_string()))?),
                None => None,
            }
        };
        Ok(text.map(Checkpoint::from_json))
    }

    async fn store(
        &mut self,
        pipeline: &str,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<(), StoreError> {
        let db = self.db()?;
        let done = match checkpoint {
            Some(checkpoint) => db.execute(
                "INSERT INTO positions (pipeline, checkpoint) VALUES (?1, ?2) \
                 ON CONFLICT (pipeline) DO UPDATE SET checkpoint = excluded.checkpoint",
                [pipeline, checkpoint.as_json()],
            ),
            None => db.execute("DELETE FROM positions WHERE pipeline = ?1", [pipeline]),
        };
        done.map(|_| ()).map_err(|e| StoreError::new(e.to_string()))
    }
}

/// The changes seen, as `(op, key)` lines; printed by `main`.
#[derive(Clone, Default)]
pub struct Changes(pub Arc<Mutex<Vec<String>>>);

impl Sink for Changes {
    fn describe(&self) -> String {
        "changes printed".to_string()
    }

    async fn write(&mut self, batch: &Batch) -> Result<(), SinkError> {
        let mut seen = self
            .0
            .lock()
            .map_err(|_| SinkError::definite("the change list was poisoned"))?;
        for record in batch.records() {
            let op = match record.op() {
                Op::Insert => "insert",
                Op::Modify => "modify",
                Op::Remove => "remove",
                _ => "other",
            };
            let key = record.key().map(ToString::to_string).unwrap_or_default();
            seen.push(format!("{op} {key}"));
        }
        Ok(())
    }
}

/// Reads the changes of `table` at `endpoint` (`None`: AWS as the environment says) into
/// `changes` until no change came for 2 s, keeping the position in the SQLite file `db`.
pub async fn follow(
    table: &str,
    endpoint: Option<&str>,
    db: &Path,
    changes: Changes,
) -> Result<ddbpipe::Summary, Box<dyn std::error::Error>> {
    let endpoint = endpoint.map_or(String::new(), |url| {
        format!(
            "  endpoint_url: {url}\n  region: us-east-1\n  credentials: {{type: access_key, \
             config: {{access_key_id: local, secret_access_key: local}}}}\n"
        )
    });
    let yaml = format!(
        "name: changes\nsource:\n  table_name: {table}\n  mode: streams\n  \
         idle_termination_secs: 2\n{endpoint}sink:\n  type: custom\n"
    );
    let dir = std::env::current_dir()?;
    let summary = ddbpipe::Pipeline::from_yaml(&yaml, dir)?
        .with_sink(changes)
        .with_checkpoint_store(SqlitePositions::open(db)?)
        .run(ddbpipe::Cancel::never())
        .await?;
    Ok(summary)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: changes_with_own_checkpoints TABLE POSITIONS.db [ENDPOINT]";
    let table = args.next().ok_or(usage)?;
    let db = args.next().ok_or(usage)?;
    let endpoint = args.next();
    let changes = Changes::default();
    let summary = follow(&table, endpoint.as_deref(), Path::new(&db), changes.clone()).await?;
    for change in changes.0.lock().map_err(|_| "poisoned")?.iter() {
        println!("{change}");
    }
    println!("{summary}");
    Ok(())
}
