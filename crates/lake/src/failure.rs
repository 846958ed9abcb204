//! A failed step of a lake sink, and what it means for a rerun: the class the run reports
//! (`SinkErrorClass`), and the message.

use ddbpipe_pipeline::sink::{SinkError, SinkErrorClass};

/// A failed step, and what it means for a rerun.
#[derive(Debug)]
pub(crate) struct Failure {
    /// What failed, for the run's report.
    pub message: String,
    /// What it means for a rerun.
    pub class: SinkErrorClass,
}

impl Failure {
    pub(crate) fn transient(message: String) -> Failure {
        Failure {
            message,
            class: SinkErrorClass::Transient,
        }
    }

    pub(crate) fn definite(message: String) -> Failure {
        Failure {
            message,
            class: SinkErrorClass::Definite,
        }
    }

    pub(crate) fn error(self, target: &str) -> SinkError {
        SinkError {
            sink: target.to_string(),
            message: self.message,
            class: self.class,
        }
    }
}
