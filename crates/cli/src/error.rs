//! The library's error: a run or a config that failed, what went wrong with its causes, and
//! what to do.

use std::fmt;

use ddbpipe_source::config::ConfigError;

use crate::config::LoadError;
use crate::failure::{Exit, Failure};

/// A run or a config that failed: what went wrong, with its causes, and what to do.
#[derive(Debug)]
pub struct Error(pub(crate) Failure);

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The config is wrong (or does not fit the table, the stream or the stored position):
    /// change it, then run again. `ddbpipe` exits 2.
    Config,
    /// The run failed (AWS, the destination, the stored state): what was acknowledged is
    /// saved; the remedy says whether a rerun resumes. `ddbpipe` exits 1.
    Runtime,
}

impl Error {
    /// Which kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self.0.exit {
            Exit::Usage => ErrorKind::Config,
            Exit::Ok | Exit::Runtime => ErrorKind::Runtime,
        }
    }

    /// What to do about it, when something can be done.
    pub fn hint(&self) -> Option<&str> {
        self.0.hint.as_deref()
    }

    /// Every problem of an invalid config, each naming its field (`source.segments`) and
    /// what is wrong; empty for other errors.
    pub fn config_errors(&self) -> &[ConfigError] {
        match self.0.error.downcast_ref::<LoadError>() {
            Some(LoadError::Invalid(errors)) => &errors.0,
            _ => &[],
        }
    }

    /// The command's failure (exit code, message, hint).
    pub(crate) fn into_failure(self) -> Failure {
        self.0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0.error)
    }
}

/// Its `Display` already says every cause (`error: cause: cause`), as `ddbpipe` prints it: no
/// `source`, so a reporter walking sources does not print them twice.
impl std::error::Error for Error {}
