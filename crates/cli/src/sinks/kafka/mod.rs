//! The kafka sink (docs/sinks.md §7.7): its section, and how a run builds it.

mod build;
mod config;

pub use build::{kafka_settings, message_shape, open_kafka, positions_reader, topic_name};
pub use config::KafkaConfig;
pub(crate) use config::{FIELDS, read, validate};
