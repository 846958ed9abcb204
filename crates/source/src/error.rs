//! Errors of the DynamoDB source, each one transient or definite.
//!
//! # Error handling
//! An [`ApiError`] is what one request attempt returned, already classified by its AWS error
//! code (docs/errors.md §9.1). The one retry layer ([`crate::retry`]) retries throttles and transients
//! and turns the last failure into a [`ReadError`], which is definite: it stops the run. An
//! [`ExportError`] says why an export's files do not read (definite; `crate::export` makes them).

use std::fmt;

/// How the retry layer treats a failed attempt (docs/errors.md §9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The service asked us to slow down: back off and retry; a read limit halves its rate.
    Throttle,
    /// A passing fault (connection, timeout, 5xx): back off and retry the same request.
    Transient,
    /// Retrying cannot change the answer: stop.
    Fatal,
}

impl ErrorClass {
    /// The `outcome` label of `ddbpipe_requests_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Throttle => "throttled",
            ErrorClass::Transient => "transient",
            ErrorClass::Fatal => "fatal",
        }
    }

    /// Classifies an AWS error code; `None` (no code at all) is transient.
    pub fn of_code(code: Option<&str>) -> ErrorClass {
        match code {
            None => ErrorClass::Transient,
            Some(
                "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "Throttling"
                | "RequestLimitExceeded"
                | "LimitExceededException"
                | "SlowDown",
            ) => ErrorClass::Throttle,
            Some(
                "InternalServerError"
                | "InternalFailure"
                | "ServiceUnavailable"
                | "ServiceUnavailableException"
                | "TransactionInProgressException"
                | "InternalError"
                | "RequestTimeout"
                | "InternalServiceException"
                | "InternalServerErrorException"
                | "ConditionalRequestConflict",
            ) => ErrorClass::Transient,
            Some(_) => ErrorClass::Fatal,
        }
    }
}

/// One failed request attempt, as the API layer reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// How to treat it.
    pub class: ErrorClass,
    /// The AWS error code, when the service sent one.
    pub code: Option<String>,
    /// The service's message (or the transport's), verbatim.
    pub message: String,
    /// Whether a connection to the service was made.
    pub contact: Contact,
}

/// Whether a failed request reached the service (docs/errors.md §9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contact {
    /// An answer came, or a connection was made and failed later: the service is there.
    Made,
    /// No connection could be made: refused, no route to the host, or the connect timed out.
    /// Transient within a run; at a run's first request it means the endpoint is wrong.
    NotMade,
}

impl ApiError {
    /// An error classified by its code.
    pub fn from_code(code: Option<String>, message: impl Into<String>) -> Self {
        ApiError {
            class: ErrorClass::of_code(code.as_deref()),
            code,
            message: message.into(),
            contact: Contact::Made,
        }
    }

    /// A transport failure without an error code: transient.
    pub fn transport(message: impl Into<String>) -> Self {
        ApiError::from_code(None, message)
    }

    /// A definite problem found in a response (e.g. an attribute type we do not know).
    pub fn fatal(message: impl Into<String>) -> Self {
        ApiError {
            class: ErrorClass::Fatal,
            code: None,
            message: message.into(),
            contact: Contact::Made,
        }
    }

    /// A request that made no connection: transient.
    pub fn not_reached(message: impl Into<String>) -> Self {
        ApiError {
            contact: Contact::NotMade,
            ..ApiError::transport(message)
        }
    }

    /// This error made final: a connection that could not be made at a run's first request
    /// is not retried further (docs/errors.md §9.6).
    pub fn final_if_not_reached(self) -> Self {
        match self.contact {
            Contact::NotMade => ApiError {
                class: ErrorClass::Fatal,
                ..self
            },
            Contact::Made => self,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{code}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ApiError {}

/// A definite failure of a read: the run stops with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Definite: a request failed with a fatal error, or its retry budget ran out.
    #[error("{what} failed after {attempts} attempt(s): {error}")]
    Request {
        /// The call and its object, e.g. "scan of 'orders'".
        what: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's error.
        error: ApiError,
    },
    /// Definite: a segment task panicked; its output cannot be trusted.
    #[error("internal error: segment {segment} task panicked: {message}")]
    Panicked {
        /// The segment whose task panicked.
        segment: u32,
        /// The panic message.
        message: String,
    },
    /// Definite: a task of the engine itself failed.
    #[error("internal error: {0}")]
    Internal(String),
    /// Definite: an export failed, or its files do not read or verify (the error names the
    /// export or the file).
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The run was asked to stop (signal or failure elsewhere) while this read waited.
    #[error("the read was cancelled")]
    Cancelled,
}

impl ReadError {
    /// The AWS error code behind this failure, if any.
    pub fn code(&self) -> Option<&str> {
        match self {
            ReadError::Request { error, .. } => error.code.as_deref(),
            _ => None,
        }
    }
}

/// Why an export cannot be read; definite: the same files give the same error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {problem}")]
pub struct ExportError {
    /// The S3 key of the object (or the manifest) that does not read.
    pub object: String,
    /// What is wrong, and where in it.
    pub problem: String,
    /// Whether the export itself is beyond use (`export` rule 13).
    pub kind: ExportProblem,
}

/// What an [`ExportError`] says of its export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportProblem {
    /// The export, its request or the settings: reading the same export again may work once
    /// the cause is fixed.
    Export,
    /// A data file is damaged or gone (it does not verify, does not decode, holds an item
    /// DynamoDB could not hold, or was deleted): reading the same export again fails the same
    /// way, so the run abandons it for a new one (`export` rule 13).
    Damaged,
}

impl ExportError {
    pub(crate) fn new(object: &str, problem: impl Into<String>) -> Self {
        ExportError {
            object: object.to_string(),
            problem: problem.into(),
            kind: ExportProblem::Export,
        }
    }

    /// A damaged or missing data file (`export` rule 13).
    pub(crate) fn damaged(object: &str, problem: impl Into<String>) -> Self {
        ExportError {
            kind: ExportProblem::Damaged,
            ..ExportError::new(object, problem)
        }
    }

    /// Whether the export is beyond use: a new export is needed.
    pub fn is_damaged(&self) -> bool {
        self.kind == ExportProblem::Damaged
    }
}
