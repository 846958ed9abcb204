//! File helpers the state file and the jsonl sink share: where a path really leads, and
//! exclusive run locks that say who holds them.
//!
//! # Run locks
//! A run lock is an OS exclusive lock ([`File::try_lock`]) on a sidecar file. The holder
//! writes `<pid>\n<pipeline>\n` into it once it holds the lock, so a refused process can name
//! the pipeline and the process in its message. The OS releases the lock with the descriptor;
//! the file stays in place, so a process waiting for it never locks an unlinked inode.
//!
//! # Symlinks
//! [`resolve`] follows symlinks (also dangling ones) and makes the path absolute, so a file
//! replaced by rename is replaced where the link points, and two spellings of one file compare
//! equal.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// How many symlinks [`resolve`] follows before it gives up (the kernel's limit).
const MAX_LINKS: usize = 40;

/// The absolute path `path` leads to: symlinks followed (also a dangling one, whose target
/// does not exist yet), `.` and `..` removed where the directories exist. A path that cannot
/// be resolved (no permission to look) is returned as it is.
pub fn resolve(path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::read_link(&path) {
            Ok(target) => path = parent_of(&path).join(target),
            Err(_) => break,
        }
    }
    if let Ok(canonical) = std::fs::canonicalize(&path) {
        return canonical;
    }
    match path.file_name() {
        Some(name) => resolve(&parent_of(&path)).join(name),
        None => path,
    }
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `<path>.lock`, beside the file.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Who holds a run lock, as written in its lock file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    /// The holding process.
    pub pid: Option<u32>,
    /// The holding pipeline (lock files of older versions hold only the pid).
    pub pipeline: Option<String>,
}

impl Holder {
    fn parse(text: &str) -> Holder {
        let mut lines = text.lines();
        Holder {
            pid: lines.next().and_then(|l| l.trim().parse().ok()),
            pipeline: lines
                .next()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        }
    }

    /// `", pid N"`, or nothing when the pid is unknown.
    pub fn pid_suffix(&self) -> String {
        self.pid.map(|p| format!(", pid {p}")).unwrap_or_default()
    }
}

/// Why a run lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it.
    Held(Holder),
    /// The lock file could not be created, opened, locked or written.
    Io(std::io::Error),
}

/// A held run lock; released when dropped.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes the exclusive lock on the file `path` (created, with its directory, when missing)
    /// and records this process and `pipeline` in it.
    pub fn acquire(path: &Path, pipeline: &str) -> Result<RunLock, LockError> {
        std::fs::create_dir_all(parent_of(path)).map_err(LockError::Io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(LockError::Io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LockError::Held(read_holder(&mut file)));
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(LockError::Io(error)),
        }
        file.set_len(0)
            .and_then(|()| write!(file, "{}\n{pipeline}\n", std::process::id()))
            .and_then(|()| file.flush())
            .map_err(LockError::Io)?;
        Ok(RunLock { _file: file })
    }

    /// Who holds the lock at `path` now, when another process does (for `check`; takes
    /// nothing and creates nothing).
    pub fn holder(path: &Path) -> Option<Holder> {
        let mut file = File::open(path).ok()?;
        match file.try_lock_shared() {
            Ok(()) => {
                let _ = file.unlock();
                None
            }
            Err(_) => Some(read_holder(&mut file)),
        }
    }
}

/// How long a refused process waits for a holder that has the lock but has not written its
/// record yet (it writes right after locking): two processes started together meet there.
const HOLDER_RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The holder's record in a held lock file, read again while it is still empty (the holder
/// is between its lock and its write), up to [`HOLDER_RECORD_WAIT`]. An unreadable record
/// still leaves the lock held.
fn read_holder(file: &mut File) -> Holder {
    let started = std::time::Instant::now();
    loop {
        let mut text = String::new();
        let _ = file
            .seek(std::io::SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text));
        let holder = Holder::parse(&text);
        if holder.pid.is_some() || started.elapsed() >= HOLDER_RECORD_WAIT {
            return holder;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holding_pipeline_and_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/x.lock");
        let held = RunLock::acquire(&path, "orders").unwrap();
        let expected = Holder {
            pid: Some(std::process::id()),
            pipeline: Some("orders".into()),
        };
        match RunLock::acquire(&path, "other") {
            Err(LockError::Held(holder)) => assert_eq!(holder, expected),
            other => panic!("expected a held lock, got {other:?}"),
        }
        assert_eq!(RunLock::holder(&path), Some(expected));
        drop(held);
        assert_eq!(RunLock::holder(&path), None);
        assert!(RunLock::acquire(&path, "other").is_ok());
    }

    /// Issue 24 item 12: a process refused while the holder is between its lock and its record
    /// waits for the record instead of naming pipeline 'unknown' without a pid.
    #[test]
    fn a_refused_process_waits_for_the_holders_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let mut held = File::create(&path).unwrap();
        held.try_lock().unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            write!(held, "4242\norders\n").unwrap();
            held
        });
        let expected = Holder {
            pid: Some(4242),
            pipeline: Some("orders".into()),
        };
        match RunLock::acquire(&path, "other") {
            Err(LockError::Held(holder)) => assert_eq!(holder, expected),
            other => panic!("expected a held lock, got {other:?}"),
        }
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_lock_file_with_only_a_pid_still_names_the_process() {
        assert_eq!(
            Holder::parse("42"),
            Holder {
                pid: Some(42),
                pipeline: None
            }
        );
    }

    #[test]
    fn resolve_follows_links_also_to_files_that_do_not_exist_yet() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        std::os::unix::fs::symlink(real.join("state.json"), dir.path().join("link")).unwrap();
        assert_eq!(resolve(&dir.path().join("link")), real.join("state.json"));
        assert_eq!(
            resolve(&dir.path().join("real/../real/new/x.json")),
            real.join("new/x.json")
        );
    }
}
