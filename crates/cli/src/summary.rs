//! How a run ended, as a value: [`Summary`] and [`Ended`].

use std::fmt;

/// How a run ended, when it did not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub(crate) ended: Ended,
    /// `None` when the run cannot say (a stop inside a snapshot or a repair).
    pub(crate) written: Option<u64>,
    /// The sentence `ddbpipe run` prints.
    pub(crate) line: String,
    /// What a stop before the end left and what the next run does.
    pub(crate) note: Option<String>,
}

impl Summary {
    /// Why the run ended.
    pub fn ended(&self) -> Ended {
        self.ended
    }

    /// Records (items or change records) this process wrote and had acknowledged; `None`
    /// when the run cannot say: a stop inside a snapshot or a repair
    /// ([`Ended::SnapshotStopped`], [`Ended::RepairStopped`]) counts nothing it could report.
    pub fn written(&self) -> Option<u64> {
        self.written
    }

    /// For a run stopped before its end: what it left and what the next run does.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

/// Why a run ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// A scan or query read every segment (this process's part of a shared one included).
    Complete,
    /// The run's `Cancel` fired: what was acknowledged is saved, a later run resumes.
    Stopped,
    /// Stopped during a snapshot (a mirror's, a resnapshot's): a later run resumes it.
    SnapshotStopped,
    /// Stopped during a repair: a later run resumes it.
    RepairStopped,
    /// A stream had no new record for `idle_termination_secs`.
    Idle,
    /// A stream reached `max_messages`.
    MaxMessages,
    /// The stream was disabled and every shard read to its end.
    StreamDisabled,
}
