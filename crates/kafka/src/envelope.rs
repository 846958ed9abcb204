//! A record to a Kafka message (docs/sinks.md §7.7).
