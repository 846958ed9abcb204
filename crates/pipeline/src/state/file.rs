//! The state file and its lock.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json, json};

use super::identity::Identity;
use crate::files::{self, Holder, LockError, RunLock};
use ddbpipe_source::position::Position;

const FORMAT: &str = "ddbpipe-state";

/// Why the state could not be read, locked or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Definite: the file exists but cannot be read.
    // The I/O error is part of the message, not a `source`: `{:#}` would print it twice.
    #[error("cannot read state file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Definite: the file does not hold valid state; it is left as it is.
    #[error("state in {path} is corrupt: {location}: {problem}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// "pipeline 'orders' at pipelines.orders.position.shards.s1", or "the file".
        location: String,
        /// What is wrong.
        problem: String,
    },
    /// Definite: another run holds the state file's lock.
    #[error("pipeline '{pipeline}' is already running (lock {lock}{pid}){shared}")]
    Locked {
        /// The pipeline holding the lock (as its lock file says; else the one asking).
        pipeline: String,
        /// The lock file.
        lock: String,
        /// ", pid N" when the holder wrote its pid.
        pid: String,
        /// "; pipeline 'b' shares its state file" when the holder is another pipeline.
        shared: String,
    },
    /// The sink database holding the state failed (the previous state stays).
    #[error("state in {store}: {message}")]
    Database {
        /// The database ("sqlite out.db").
        store: String,
        /// What went wrong.
        message: String,
    },
    /// The file could not be written (the previous state stays).
    #[error("cannot write state file {path}: {error}")]
    Write {
        /// The file (or its lock file).
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
}

impl StateError {
    /// Whether this is corrupt state (the user fixes the entry or resets it).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StateError::Corrupt { .. })
    }
}

/// One pipeline's stored entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Identity of the source the position belongs to.
    pub identity: Identity,
    /// `{"at", "capacity_units", "items"}` of the last completed scan, if any.
    pub last_completed: Option<Json>,
    /// Where the pipeline stands; `None` = nothing in progress.
    pub position: Option<Position>,
    /// When the entry was written (RFC 3339, ms).
    pub updated_at: String,
}

impl Entry {
    /// Reads one pipeline's entry strictly; problems are corruption in `path` (the state file,
    /// or the database holding the state) at `pipelines.<pipeline>.…`.
    pub fn from_json(raw: &Json, pipeline: &str, path: &Path) -> Result<Entry, StateError> {
        let base = format!("pipelines.{pipeline}");
        let here = |sub: &str| {
            let path = if sub.is_empty() {
                base.clone()
            } else {
                format!("{base}.{sub}")
            };
            format!("pipeline '{pipeline}' at {path}")
        };
        let Json::Object(entry) = raw else {
            return Err(corrupt(path, here(""), "not an object"));
        };
        for key in entry.keys() {
            if !matches!(
                key.as_str(),
                "fingerprint" | "identity" | "last_completed" | "position" | "updated_at"
            ) {
                return Err(corrupt(path, here(key), "unknown field"));
            }
        }
        let stored = match entry.get("identity") {
            Some(identity @ Json::Object(_)) => identity,
            _ => {
                return Err(corrupt(path, here("identity"), "missing or not an object"));
            }
        };
        match entry.get("fingerprint") {
            Some(Json::String(f)) if *f == Identity::fingerprint_of(stored) => {}
            Some(Json::String(_)) => {
                return Err(corrupt(
                    path,
                    here("fingerprint"),
                    "does not match the stored identity",
                ));
            }
            _ => {
                return Err(corrupt(
                    path,
                    here("fingerprint"),
                    "missing or not a string",
                ));
            }
        }
        let identity = Identity::from_json(stored.clone());
        let updated_at = match entry.get("updated_at") {
            Some(Json::String(s)) => s.clone(),
            _ => {
                return Err(corrupt(path, here("updated_at"), "missing or not a string"));
            }
        };
        let last_completed = match entry.get("last_completed") {
            None | Some(Json::Null) => None,
            Some(value @ Json::Object(_)) => Some(value.clone()),
            Some(_) => return Err(corrupt(path, here("last_completed"), "not an object")),
        };
        let position = match entry.get("position") {
            None | Some(Json::Null) => None,
            Some(json) => Some(Position::from_json(json).map_err(|e| {
                let sub = if e.path.is_empty() {
                    "position".to_string()
                } else {
                    format!("position.{}", e.path)
                };
                corrupt(path, here(&sub), e.problem)
            })?),
        };
        Ok(Entry {
            identity,
            last_completed,
            position,
            updated_at,
        })
    }

    /// The entry as stored: `{fingerprint, identity, last_completed, position, updated_at}`.
    pub fn to_json(&self) -> Json {
        json!({
            "fingerprint": self.identity.fingerprint(),
            "identity": self.identity.to_json(),
            "last_completed": self.last_completed,
            "position": self.position.as_ref().map(Position::to_json),
            "updated_at": self.updated_at,
        })
    }
}

/// A state file on disk.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

/// An exclusive lock on a state file, held until dropped. Every pipeline sharing the file
/// takes the same lock: their read-modify-write of the file must not interleave.
pub type StateLock = RunLock;

fn corrupt(path: &Path, location: impl Into<String>, problem: impl Into<String>) -> StateError {
    StateError::Corrupt {
        path: path.to_path_buf(),
        location: location.into(),
        problem: problem.into(),
    }
}

impl StateFile {
    /// The state file at `path` (it need not exist).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateFile { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Beside the file the path leads to, as the writes are: two spellings of one state file
    /// (a symlink and its target) take one lock.
    pub fn lock_path(&self) -> PathBuf {
        files::lock_path(&files::resolve(&self.path))
    }

    /// Takes the exclusive lock of the state file for `pipeline`, or says which pipeline and
    /// process hold it.
    pub fn lock(&self, pipeline: &str) -> Result<StateLock, StateError> {
        let lock_path = self.lock_path();
        RunLock::acquire(&lock_path, pipeline).map_err(|error| match error {
            LockError::Held(holder) => {
                let holding = holder
                    .pipeline
                    .clone()
                    .unwrap_or_else(|| pipeline.to_string());
                let shared = if holding == pipeline {
                    String::new()
                } else {
                    format!(
                        "; pipeline '{pipeline}' shares its state file {}",
                        self.path.display()
                    )
                };
                StateError::Locked {
                    pipeline: holding,
                    lock: lock_path.display().to_string(),
                    pid: holder.pid_suffix(),
                    shared,
                }
            }
            LockError::Io(error) => StateError::Write {
                path: lock_path.clone(),
                error,
            },
        })
    }

    /// Who holds the lock now, when another process does (for `check`).
    pub fn lock_holder(&self) -> Option<Holder> {
        RunLock::holder(&self.lock_path())
    }

    /// Reads the whole document; `None` when the file does not exist.
    fn read_document(&self) -> Result<Option<Map<String, Json>>, StateError> {
        let text = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(StateError::Read {
                    path: self.path.clone(),
                    error,
                });
            }
        };
        let doc: Json = serde_json::from_slice(&text)
            .map_err(|e| corrupt(&self.path, "the file", format!("not valid JSON: {e}")))?;
        let Json::Object(doc) = doc else {
            return Err(corrupt(&self.path, "the file", "not a JSON object"));
        };
        for key in doc.keys() {
            if !matches!(key.as_str(), "format" | "pipelines" | "version") {
                return Err(corrupt(&self.path, key.as_str(), "unknown field"));
            }
        }
        match doc.get("format") {
            Some(Json::String(f)) if f == FORMAT => {}
            _ => {
                return Err(corrupt(
                    &self.path,
                    "format",
                    format!("expected \"{FORMAT}\""),
                ));
            }
        }
        match doc.get("version") {
            Some(Json::Number(v)) if v.as_u64() == Some(1) => {}
            Some(v) => {
                return Err(corrupt(
                    &self.path,
                    "version",
                    format!("unsupported version {v}: this ddbpipe reads version 1"),
                ));
            }
            None => return Err(corrupt(&self.path, "version", "missing field")),
        }
        if !matches!(doc.get("pipelines"), Some(Json::Object(_))) {
            return Err(corrupt(&self.path, "pipelines", "missing or not an object"));
        }
        Ok(Some(doc))
    }

    /// Reads `pipeline`'s entry strictly; `None` when there is none.
    pub fn load(&self, pipeline: &str) -> Result<Option<Entry>, StateError> {
        let Some(doc) = self.read_document()? else {
            return Ok(None);
        };
        let Some(raw) = doc.get("pipelines").and_then(|p| p.get(pipeline)) else {
            return Ok(None);
        };
        Entry::from_json(raw, pipeline, &self.path).map(Some)
    }

    /// Replaces `pipeline`'s entry (`None` removes it), keeping every other entry.
    pub fn store(&self, pipeline: &str, entry: Option<&Entry>) -> Result<(), StateError> {
        let mut doc = self.read_document()?.unwrap_or_default();
        let mut pipelines = match doc.remove("pipelines") {
            Some(Json::Object(p)) => p,
            _ => Map::new(),
        };
        match entry {
            Some(entry) => {
                pipelines.insert(pipeline.to_string(), entry.to_json());
            }
            None => {
                pipelines.remove(pipeline);
            }
        }
        let doc = json!({"format": FORMAT, "pipelines": pipelines, "version": 1});
        self.write_atomically(doc.to_string().as_bytes())
    }

    /// Removes `pipeline`'s entry for `state reset`. A file that cannot be read at all is
    /// moved aside as `<path>.corrupt-<unix s>` first. Returns what was done.
    pub fn reset(&self, pipeline: &str) -> Result<String, StateError> {
        match self.read_document() {
            Ok(None) => Ok(format!("no stored state for pipeline '{pipeline}'")),
            Ok(Some(doc)) => {
                let present = doc.get("pipelines").and_then(|p| p.get(pipeline)).is_some();
                if !present {
                    return Ok(format!("no stored state for pipeline '{pipeline}'"));
                }
                self.store(pipeline, None)?;
                Ok(format!(
                    "removed the position of pipeline '{pipeline}' from {}",
                    self.path.display()
                ))
            }
            Err(StateError::Corrupt { location, .. }) if !location.starts_with("pipeline '") => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                let mut aside = self.path.as_os_str().to_owned();
                aside.push(format!(".corrupt-{secs}"));
                let aside = PathBuf::from(aside);
                std::fs::rename(&self.path, &aside).map_err(|error| StateError::Write {
                    path: self.path.clone(),
                    error,
                })?;
                Ok(format!(
                    "moved the unreadable state file aside to {}",
                    aside.display()
                ))
            }
            Err(StateError::Corrupt { .. }) => {
                // Our entry is broken but the file is readable: drop just our entry.
                self.store(pipeline, None)?;
                Ok(format!(
                    "removed the corrupt entry of pipeline '{pipeline}' from {}",
                    self.path.display()
                ))
            }
            Err(other) => Err(other),
        }
    }

    /// Writes `bytes` as the new file: temp file, `fsync`, rename, `fsync` the directory.
    ///
    /// 1. A symlinked state file is written where the link leads: the temp file goes beside
    ///    the target and is renamed onto it, so the link stays a link.
    /// 2. The temp file is in the target's directory, so the rename is atomic.
    fn write_atomically(&self, bytes: &[u8]) -> Result<(), StateError> {
        let write_error = |error| StateError::Write {
            path: self.path.clone(),
            error,
        };
        let target = files::resolve(&self.path);
        let dir = files::parent_of(&target);
        std::fs::create_dir_all(&dir).map_err(write_error)?;
        let mut tmp_name = target.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        {
            let mut file = File::create(&tmp).map_err(write_error)?;
            file.write_all(bytes).map_err(write_error)?;
            file.write_all(b"\n").map_err(write_error)?;
            file.sync_all().map_err(write_error)?;
        }
        std::fs::rename(&tmp, &target).map_err(write_error)?;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(write_error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddbpipe_source::position::{ScanKind, ScanPosition};

    fn entry() -> Entry {
        Entry {
            identity: Identity::from_json(json!({"table_name": "orders", "segments": 4})),
            last_completed: None,
            position: Some(Position::Scan(ScanPosition::new(ScanKind::Scan, 4))),
            updated_at: "2026-10-01T12:00:00.123Z".into(),
        }
    }

    #[test]
    fn an_entry_round_trips_and_other_pipelines_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("s.json"));
        file.store("other", Some(&entry())).unwrap();
        file.store("orders", Some(&entry())).unwrap();
        assert_eq!(file.load("orders").unwrap(), Some(entry()));
        file.store("orders", None).unwrap();
        assert_eq!(file.load("orders").unwrap(), None);
        assert!(file.load("other").unwrap().is_some());
        assert!(!dir.path().join("s.json.tmp").exists());
    }

    #[test]
    fn the_file_matches_the_documented_layout() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("s.json"));
        file.store("orders", Some(&entry())).unwrap();
        let text = std::fs::read_to_string(file.path()).unwrap();
        let fp = entry().identity.fingerprint();
        assert_eq!(
            text,
            format!(
                "{{\"format\":\"ddbpipe-state\",\"pipelines\":{{\"orders\":{{\"fingerprint\":\"{fp}\",\
                 \"identity\":{{\"segments\":4,\"table_name\":\"orders\"}},\"last_completed\":null,\
                 \"position\":{{\"cursors\":{{}},\"done\":[],\"kind\":\"scan\",\"total_segments\":4}},\
                 \"updated_at\":\"2026-10-01T12:00:00.123Z\"}}}},\"version\":1}}\n"
            )
        );
    }

    #[test]
    fn an_entry_stored_with_an_endpoints_password_reads_masked_and_is_stored_masked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        // As an earlier ddbpipe wrote it: the endpoint as given, fingerprinted so.
        let identity = json!({"endpoint_url": "http://u:s3cr3t@h:8000", "table_name": "orders"});
        let fp = Identity::fingerprint_of(&identity);
        let text = format!(
            "{{\"format\":\"ddbpipe-state\",\"pipelines\":{{\"orders\":{{\"fingerprint\":\"{fp}\",\
             \"identity\":{identity},\"last_completed\":null,\"position\":null,\
             \"updated_at\":\"2026-10-01T12:00:00.123Z\"}}}},\"version\":1}}\n"
        );
        std::fs::write(&path, text).unwrap();
        let file = StateFile::new(&path);
        let entry = file.load("orders").unwrap().unwrap();
        assert_eq!(
            entry.identity.to_json()["endpoint_url"],
            "http://***@h:8000"
        );
        file.store("orders", Some(&entry)).unwrap();
        let stored = std::fs::read_to_string(&path).unwrap();
        assert!(!stored.contains("s3cr3t"), "{stored}");
        assert_eq!(file.load("orders").unwrap(), Some(entry));
    }

    #[test]
    fn a_newer_version_is_corruption_and_the_file_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let text = r#"{"format":"ddbpipe-state","pipelines":{},"version":2}"#;
        std::fs::write(&path, text).unwrap();
        let file = StateFile::new(&path);
        let error = file.load("orders").unwrap_err();
        assert!(
            error.to_string().contains("unsupported version 2"),
            "{error}"
        );
        assert!(file.store("orders", Some(&entry())).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("s.json"));
        let _held = file.lock("orders").unwrap();
        let error = file.lock("orders").unwrap_err().to_string();
        assert!(
            error.contains("pipeline 'orders' is already running"),
            "{error}"
        );
        assert!(
            error.contains(&format!("pid {}", std::process::id())),
            "{error}"
        );
        assert!(file.lock_holder().is_some());
    }

    #[test]
    fn a_symlink_to_a_locked_state_file_shares_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("s.json");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let _held = StateFile::new(&real).lock("orders").unwrap();
        let error = StateFile::new(&link)
            .lock("orders")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("pipeline 'orders' is already running"),
            "{error}"
        );
    }

    #[test]
    fn the_lock_message_names_the_pipeline_holding_a_shared_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("s.json"));
        let _held = file.lock("orders").unwrap();
        let error = file.lock("refunds").unwrap_err().to_string();
        assert!(
            error.starts_with("pipeline 'orders' is already running"),
            "{error}"
        );
        assert!(
            error.contains("pipeline 'refunds' shares its state file"),
            "{error}"
        );
    }

    #[test]
    fn a_symlinked_state_file_is_written_through_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("s.json");
        std::os::unix::fs::symlink(real.join("s.json"), &link).unwrap();
        let file = StateFile::new(&link);
        file.store("orders", Some(&entry())).unwrap();
        file.store("other", Some(&entry())).unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link stays a link"
        );
        assert_eq!(file.load("orders").unwrap(), Some(entry()));
        let target = std::fs::read_to_string(real.join("s.json")).unwrap();
        assert!(target.contains("\"other\""), "{target}");
        assert!(!real.join("s.json.tmp").exists());
    }

    #[test]
    fn an_io_error_is_printed_once_with_its_causes() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("blocker");
        std::fs::write(&blocker, "").unwrap();
        let file = StateFile::new(blocker.join("s.json"));
        let error = file.store("orders", Some(&entry())).unwrap_err();
        let text = anyhow_like(&error);
        assert_eq!(text.matches("os error").count(), 1, "{text}");
    }

    /// The message and its source chain, joined the way the CLI prints them (anyhow's `{:#}`).
    fn anyhow_like(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn reset_moves_an_unreadable_file_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(&path, "{not json").unwrap();
        let file = StateFile::new(&path);
        let said = file.reset("orders").unwrap();
        assert!(
            said.contains("moved the unreadable state file aside"),
            "{said}"
        );
        assert!(!path.exists());
    }
}
