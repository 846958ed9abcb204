//! The run lock (see the `sqlite` module docs, "The run lock"): an exclusive OS lock on a file
//! beside the database, holding the holder's pid.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use super::{SqliteDatabase, blocking, lock_mutex};
use crate::{DbError, LockAttempt, LockHolder};

impl SqliteDatabase {
    pub(crate) async fn lock(&self, pipeline: &str) -> Result<LockAttempt, DbError> {
        let path = self.lock_path(pipeline)?;
        blocking(|| {
            let mut locks = lock_mutex(&self.shared.locks);
            if locks.contains_key(pipeline) {
                return Ok(LockAttempt::Acquired);
            }
            let io_err = |e: std::io::Error| {
                DbError::fatal(format!("sqlite lock file {}: {e}", path.display()))
            };
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io_err)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Ok(LockAttempt::HeldBy(LockHolder {
                        location: path.display().to_string(),
                        pid: read_pid(&mut file),
                    }));
                }
                Err(TryLockError::Error(e)) => return Err(io_err(e)),
            }
            file.set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)))
                .and_then(|_| writeln!(file, "{}", std::process::id()))
                .map_err(io_err)?;
            locks.insert(pipeline.to_string(), file);
            Ok(LockAttempt::Acquired)
        })
    }

    pub(crate) async fn lock_holder(&self, pipeline: &str) -> Result<Option<LockHolder>, DbError> {
        let path = self.lock_path(pipeline)?;
        blocking(|| {
            if lock_mutex(&self.shared.locks).contains_key(pipeline) {
                // This handle holds it: no other run does.
                return Ok(None);
            }
            let io_err = |e: std::io::Error| {
                DbError::fatal(format!("sqlite lock file {}: {e}", path.display()))
            };
            let mut file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_err(e)),
            };
            match file.try_lock() {
                Ok(()) => {
                    file.unlock().map_err(io_err)?;
                    Ok(None)
                }
                Err(TryLockError::WouldBlock) => Ok(Some(LockHolder {
                    location: path.display().to_string(),
                    pid: read_pid(&mut file),
                })),
                Err(TryLockError::Error(e)) => Err(io_err(e)),
            }
        })
    }
    /// `<database path>-ddbpipe-<pipeline>.lock`.
    fn lock_path(&self, pipeline: &str) -> Result<PathBuf, DbError> {
        if pipeline.is_empty() || pipeline.contains(['/', '\\', '\0']) {
            return Err(DbError::fatal(format!(
                "sqlite lock: the pipeline name {pipeline:?} cannot name a lock file"
            )));
        }
        let mut name = OsString::from(self.shared.path.as_os_str());
        name.push(format!("-ddbpipe-{pipeline}.lock"));
        Ok(PathBuf::from(name))
    }
}

/// The pid written in a lock file, when it parses.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
