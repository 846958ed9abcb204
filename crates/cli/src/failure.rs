//! How a command fails: the documented exit code, the message, and a remedy (also for the
//! library's state and start-up errors).

use std::fmt;
use std::process::ExitCode;

use ddbpipe_pipeline::checkpoint::StartError;
use ddbpipe_pipeline::runner::RunError;
use ddbpipe_pipeline::sink::SinkErrorClass;
use ddbpipe_pipeline::state::StateError;
use ddbpipe_source::lease::LeaseError;

use crate::origin::Origin;
use crate::telemetry::{Line, say};

/// Exit codes (README "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success.
    Ok,
    /// 1: runtime failure (AWS, sink, corrupt state, internal error, failed probe).
    Runtime,
    /// 2: bad config or usage (validation, config errors found at start, changed identity).
    Usage,
}

impl Exit {
    /// The process exit code.
    pub fn code(self) -> ExitCode {
        ExitCode::from(match self {
            Exit::Ok => 0,
            Exit::Runtime => 1,
            Exit::Usage => 2,
        })
    }
}

/// A failed command: printed as `error: …` and `hint: …` lines.
#[derive(Debug)]
pub struct Failure {
    /// Which exit code.
    pub exit: Exit,
    /// What went wrong, with its causes.
    pub error: anyhow::Error,
    /// What the user can do.
    pub hint: Option<String>,
}

impl Failure {
    /// A runtime failure (exit 1).
    pub fn runtime(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            exit: Exit::Runtime,
            error: error.into(),
            hint: None,
        }
    }

    /// A config or usage failure (exit 2).
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            exit: Exit::Usage,
            error: error.into(),
            hint: None,
        }
    }

    /// Adds a remedy.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

/// The hint after a failed run (`error`, when the run itself failed): a definite sink error
/// fails every rerun on the same batch, so the hint asks to fix its cause and promises no
/// resumption; any other failure resumes after `resumes_after` ("it", "the last committed
/// page").
pub fn rerun_hint(error: Option<&RunError>, origin: &Origin, resumes_after: &str) -> String {
    let rerun = origin.rerun();
    match error {
        Some(error) if error.damaged_export().is_some() => format!(
            "the export's files are damaged or gone and this run already replaced it once: \
             check the bucket's objects (S3 is the trust boundary, docs/scan.md §2.10); \
             {rerun} abandons the damaged export and requests a new one (nothing \
             of a damaged file was written)"
        ),
        // Definite lease errors (a foreign or exhausted row, refused access): a rerun meets
        // the same rows until the error's own remedy is applied.
        Some(RunError::Lease(LeaseError::Fatal(_))) => format!(
            "retrying cannot help: {rerun} meets the same lease rows until the cause above is fixed (what was written before it is committed)"
        ),
        Some(RunError::Sink(sink)) if sink.class == SinkErrorClass::Definite => format!(
            "retrying cannot help: {rerun} fails on the same batch until the cause above is fixed (what was written before it is committed)"
        ),
        _ => format!("what was written is committed; {rerun} resumes after {resumes_after}"),
    }
}

/// Maps a state problem to its failure: corrupt state and locks are runtime failures.
pub fn state_failure(error: StateError, origin: &Origin) -> Failure {
    let hint = match &error {
        StateError::Corrupt { .. } => Some(format!("fix the entry or {}", origin.reset())),
        StateError::Locked { .. } => {
            Some("wait for the other run to finish, or stop it (SIGTERM drains it)".to_string())
        }
        StateError::Write { .. } => Some(
            "state.path: make its directory writable, or choose another state.path".to_string(),
        ),
        _ => None,
    };
    let failure = Failure::runtime(error);
    match hint {
        Some(hint) => failure.hint(hint),
        None => failure,
    }
}

/// Maps a failure to start from the stored state: corrupt state and locks are runtime
/// failures, a position of another source is a usage failure with the reset remedy.
pub fn start_failure(error: StartError, origin: &Origin) -> Failure {
    match error {
        StartError::State(error) => state_failure(error, origin),
        other => {
            Failure::usage(other).hint(format!("{} to forget the stored position", origin.reset()))
        }
    }
}

/// Prints a failure to stderr and returns its exit code.
pub fn report(failure: &Failure) -> ExitCode {
    let text = format!("{:#}", failure.error);
    // Config errors are already one `config error: …` line each.
    for line in text.lines() {
        if line.starts_with("config error:") {
            say(Line::ConfigError, line);
        } else {
            say(Line::Error, &format!("error: {line}"));
        }
    }
    if let Some(hint) = &failure.hint {
        say(Line::Hint, &format!("hint: {hint}"));
    }
    failure.exit.code()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24 item 12: a definite lease error (here a counter that cannot advance, whose
    /// remedy is `state reset`) is not followed by a promise that a rerun resumes.
    #[test]
    fn a_definite_lease_error_promises_no_resumption() {
        let error = RunError::Lease(LeaseError::Fatal(
            "lease row 'segment-3' cannot be written again: run `ddbpipe state reset`".into(),
        ));
        let hint = rerun_hint(Some(&error), &Origin::File("orders.yaml".into()), "it");
        assert!(hint.starts_with("retrying cannot help"), "{hint}");
        assert!(!hint.contains("resumes"), "{hint}");
    }
}
