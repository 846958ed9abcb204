//! The Kafka destination (docs/sinks.md §7.7): each record becomes one message whose key is the
//! item's key attributes and whose value is a Debezium-shaped change event (or ddbpipe's own
//! envelope), written exactly once through Kafka transactions with the pipeline's position in
//! a compacted positions topic, or at least once by an idempotent producer.
//!
//! - [`envelope`]: a record (an item or a change envelope line) to a message's key and value
//!   (docs/sinks.md §7.8).
//! - [`log`]: a partition's log read at the record-batch level, with the transaction markers
//!   applied: what a correct `read_committed` consumer receives, whatever the broker serves.
//! - [`client`]: the producer's configuration and the topics, made when missing.
//! - [`sink`]: the sink: a batch's messages at least once, or exactly once in one transaction
//!   with the position.
//! - [`positions`]: the positions topic as the pipeline's checkpoint store.
//! - [`msk_iam`]: Amazon MSK's IAM access control: the SASL OAUTHBEARER token of the run's
//!   AWS credentials.

pub mod client;
pub mod envelope;
pub mod log;
pub mod msk_iam;
pub mod positions;
pub mod sink;
