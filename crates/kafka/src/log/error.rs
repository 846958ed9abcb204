//! Why a partition's log could not be read, each error transient or definite.

use std::time::Duration;

use ddbpipe_pipeline::sink::SinkErrorClass;
use kafka_protocol::ResponseError;

/// Why [`LogReader`](super::LogReader) could not read a topic. Each variant names the broker,
/// topic or partition it is about; [`LogError::class`] says whether a later attempt may
/// succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// Definite: `brokers` names no address.
    #[error("`brokers` names no Kafka broker: give one or more host:port, comma-separated")]
    NoBrokers,
    /// Definite: an entry of `brokers` is not `host:port`.
    #[error("`brokers` entry {address:?} is not host:port (e.g. 127.0.0.1:9092); fix `brokers`")]
    BadAddress {
        /// The entry as given.
        address: String,
    },
    /// Transient: no connection to the broker could be made.
    #[error(
        "cannot connect to Kafka broker {broker}: {source}; check `brokers` (the host:port of \
         a PLAINTEXT or SSL listener, as sink.properties.security.protocol says; SASL \
         listeners are not read here yet)"
    )]
    Connect {
        /// The broker's address.
        broker: String,
        /// What the connection attempt returned.
        source: std::io::Error,
    },
    /// Transient: no broker of `brokers` could be reached; each one's failure is listed.
    #[error("no Kafka broker of `brokers` answered: {}", list(.failures))]
    NoBrokerAnswered {
        /// Why each broker failed, in the order they were tried.
        failures: Vec<LogError>,
    },
    /// Transient: the connection broke during a request.
    #[error("the connection to Kafka broker {broker} broke during {api}: {source}")]
    Connection {
        /// The broker's address.
        broker: String,
        /// The request (`Metadata`, `ListOffsets`, `Fetch`, ...).
        api: &'static str,
        /// What the socket returned.
        source: std::io::Error,
    },
    /// Transient: the broker did not answer in time.
    #[error(
        "Kafka broker {broker} did not answer {api} within {timeout:?}; check that it is up \
         and not overloaded"
    )]
    TimedOut {
        /// The broker's address.
        broker: String,
        /// The request, or `connect`.
        api: &'static str,
        /// The request timeout the reader was built with.
        timeout: Duration,
    },
    /// Definite: the broker's answer does not decode as the protocol says.
    #[error("Kafka broker {broker} answered {api} with what does not decode: {what}")]
    Protocol {
        /// The broker's address.
        broker: String,
        /// The request.
        api: &'static str,
        /// What did not decode.
        what: String,
    },
    /// Definite: the broker speaks no version of a request this reader speaks.
    #[error(
        "Kafka broker {broker} serves {api} versions {served}, this reader speaks {ours_min} to \
         {ours_max}: use a broker of Kafka 0.11 or newer"
    )]
    Unsupported {
        /// The broker's address.
        broker: String,
        /// The request.
        api: &'static str,
        /// The versions the broker lists (`none` when it lists none).
        served: String,
        /// The lowest version this reader speaks.
        ours_min: i16,
        /// The highest version this reader speaks.
        ours_max: i16,
    },
    /// Transient when Kafka calls the error code retriable, else definite: the broker answered
    /// with an error code.
    #[error("Kafka broker {broker} answered {api} for {scope} with {error} (code {code})",
        code = .error.code())]
    Broker {
        /// The broker's address.
        broker: String,
        /// The request.
        api: &'static str,
        /// What the request was about: `topic "t"` or `topic "t" partition 2`.
        scope: String,
        /// The error code, by its protocol name.
        error: ResponseError,
    },
    /// Definite: the topic does not exist.
    #[error(
        "Kafka broker {broker} did not authenticate ddbpipe's position reader with SASL \
         {mechanism}: {message}; {remedy}"
    )]
    /// SASL failed (`sasl` rule 3).
    Authentication {
        /// The broker.
        broker: String,
        /// The mechanism.
        mechanism: &'static str,
        /// What failed, never a secret.
        message: String,
        /// What to check for the mechanism.
        remedy: &'static str,
    },
    #[error("Kafka topic {topic:?} does not exist; create it, or check the topic name")]
    UnknownTopic {
        /// The topic.
        topic: String,
    },
    /// Definite: the topic has no such partition.
    #[error("Kafka topic {topic:?} has no partition {partition} (its partitions: {partitions:?})")]
    UnknownPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: i32,
        /// The partitions the topic has.
        partitions: Vec<i32>,
    },
    /// Transient: the partition has no leader now, or its leader is not among the brokers the
    /// cluster lists.
    #[error("Kafka topic {topic:?} partition {partition} has no reachable leader now; retry")]
    NoLeader {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// Definite: a record batch of the partition does not decode.
    #[error(
        "Kafka topic {topic:?} partition {partition}: the record batch at offset {offset} does \
         not decode: {what}"
    )]
    Batch {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The batch's base offset (or the control record's offset).
        offset: i64,
        /// What is wrong with it.
        what: String,
    },
    /// Transient: the broker kept answering Fetch with no whole record batch before the end
    /// the read set out to reach.
    #[error(
        "Kafka broker {broker} returned no records of topic {topic:?} partition {partition} \
         at offset {at}, short of its end {end}; retry"
    )]
    StoppedShort {
        /// The partition leader's address.
        broker: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset the fetches asked for.
        at: i64,
        /// The end offset the read set out to reach.
        end: i64,
    },
}

impl LogError {
    /// Whether a later attempt may succeed ([`SinkErrorClass::Transient`]) or the cause must
    /// be fixed first ([`SinkErrorClass::Definite`]).
    pub fn class(&self) -> SinkErrorClass {
        match self {
            LogError::Connect { .. }
            | LogError::NoBrokerAnswered { .. }
            | LogError::Connection { .. }
            | LogError::TimedOut { .. }
            | LogError::NoLeader { .. }
            | LogError::StoppedShort { .. } => SinkErrorClass::Transient,
            LogError::Broker { error, .. } if error.is_retriable() => SinkErrorClass::Transient,
            LogError::NoBrokers
            | LogError::BadAddress { .. }
            | LogError::Protocol { .. }
            | LogError::Unsupported { .. }
            | LogError::Authentication { .. }
            | LogError::Broker { .. }
            | LogError::UnknownTopic { .. }
            | LogError::UnknownPartition { .. }
            | LogError::Batch { .. } => SinkErrorClass::Definite,
        }
    }
}

/// The failures of [`LogError::NoBrokerAnswered`], one after the other.
fn list(failures: &[LogError]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" | ")
}
