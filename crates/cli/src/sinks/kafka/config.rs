//! The kafka sink's section: `{type: kafka, brokers, topic, envelope, tombstones, delivery,
//! positions_topic, properties, topic_config}` (docs/sinks.md §7.7).

use std::collections::BTreeMap;

use ddbpipe_kafka::client::{Delivery, OWN_PROPERTIES, TopicShape};
use ddbpipe_kafka::envelope::EnvelopeKind;
use ddbpipe_kafka::log::Security;
use ddbpipe_source::config::{ConfigError, Secret};
use serde_json::json;

use crate::yaml::fields::{Fields, convert};
use crate::yaml::schema::{Field, Shape, defaulted, of, optional, required};
use crate::yaml::types::{Choice, FromYaml};

/// `sink.topic` when unset.
pub const DEFAULT_TOPIC: &str = "dynamodb.{table}";
/// `sink.positions_topic` when unset.
pub const DEFAULT_POSITIONS_TOPIC: &str = "_ddbpipe_positions";
/// What a topic name may hold besides its characters: the placeholders a template fills in.
const PLACEHOLDERS: [&str; 2] = ["{table}", "{pipeline}"];

/// The keys of the kafka sink.
pub(crate) static FIELDS: &[Field] = &[
    required(
        "brokers",
        of::<String>(),
        "Bootstrap servers, comma-separated host:port; ${ENV} allowed.",
    ),
    defaulted(
        "topic",
        of::<String>(),
        || json!(DEFAULT_TOPIC),
        "The topic of the messages: {table} and {pipeline} are filled in; created when missing.",
    ),
    defaulted(
        "envelope",
        of::<EnvelopeKind>(),
        || json!(EnvelopeKind::Debezium.name()),
        "The message value: debezium (a Debezium-shaped change event) or ddbpipe (the jsonl \
         line).",
    ),
    defaulted(
        "tombstones",
        of::<bool>(),
        || json!(true),
        "After a delete, a message with the same key and a null value.",
    ),
    defaulted(
        "delivery",
        of::<Delivery>(),
        || json!(Delivery::ExactlyOnce.name()),
        "exactly_once: each batch and the position commit in one Kafka transaction; \
         at_least_once: an idempotent producer, the position in the state file.",
    ),
    defaulted(
        "positions_topic",
        of::<String>(),
        || json!(DEFAULT_POSITIONS_TOPIC),
        "The compacted topic of the positions (exactly_once); created when missing.",
    ),
    optional(
        "properties",
        Shape::Map(<String as FromYaml>::schema),
        "Kafka client properties as librdkafka names them (security.protocol, sasl.*, ssl.*, \
         compression.type, ...); values are never printed.",
    ),
    optional(
        "topic_config",
        Shape::Section(TOPIC_CONFIG),
        "Partitions and replication of a topic ddbpipe creates; unset: the broker's defaults.",
    ),
];

/// The keys of `sink.topic_config`.
static TOPIC_CONFIG: &[Field] = &[
    optional("partitions", of::<u32>(), "Partitions of a created topic."),
    optional(
        "replication_factor",
        of::<u32>(),
        "Replication factor of a created topic (and of the positions topic).",
    ),
];

/// The `kafka` sink (docs/sinks.md §7.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// The topic template: `{table}`, `{pipeline}` are filled in.
    pub topic: String,
    /// What a message's value is.
    pub envelope: EnvelopeKind,
    /// A tombstone after each delete.
    pub tombstones: bool,
    /// The delivery guarantee.
    pub delivery: Delivery,
    /// The compacted positions topic (`exactly_once`).
    pub positions_topic: String,
    /// Client properties; their values may be secrets.
    pub properties: BTreeMap<String, Secret>,
    /// How a missing topic is made.
    pub topic_config: TopicShape,
}

impl Choice for EnvelopeKind {
    fn all() -> &'static [Self] {
        &[EnvelopeKind::Debezium, EnvelopeKind::Ddbpipe]
    }
    fn name(self) -> &'static str {
        match self {
            EnvelopeKind::Debezium => "debezium",
            EnvelopeKind::Ddbpipe => "ddbpipe",
        }
    }
}

impl Choice for Delivery {
    fn all() -> &'static [Self] {
        &[Delivery::ExactlyOnce, Delivery::AtLeastOnce]
    }
    fn name(self) -> &'static str {
        Delivery::name(self)
    }
    fn hint(found: &str) -> Option<&'static str> {
        matches!(found, "exactly-once" | "eos" | "transactional")
            .then_some("exactly once is `delivery: exactly_once`")
    }
}

/// Reads the kafka sink's keys.
pub(crate) fn read(f: &mut Fields<'_>) -> KafkaConfig {
    let brokers = f.required::<String>("brokers");
    let topic = f.or("topic", DEFAULT_TOPIC.to_string());
    let envelope = f.or("envelope", EnvelopeKind::Debezium);
    let tombstones = f.or("tombstones", true);
    let delivery = f.or("delivery", Delivery::ExactlyOnce);
    let positions_topic = f.or("positions_topic", DEFAULT_POSITIONS_TOPIC.to_string());
    let properties = f.map("properties", |report, path, value| {
        convert::<Secret>(report, path, value)
    });
    let topic_config = match f.section("topic_config") {
        Some(mut section) => {
            let partitions = section.get::<u32>("partitions");
            let replication = section.get::<u32>("replication_factor");
            section.finish();
            TopicShape {
                partitions: partitions.map(|p| i32::try_from(p).unwrap_or(i32::MAX)),
                replication_factor: replication.map(|r| i32::try_from(r).unwrap_or(i32::MAX)),
            }
        }
        None => TopicShape::default(),
    };
    KafkaConfig {
        brokers: brokers.unwrap_or_default(),
        topic,
        envelope,
        tombstones,
        delivery,
        positions_topic,
        properties,
        topic_config,
    }
}

/// The kafka rules: brokers as host:port, topic names Kafka takes (a template's placeholders
/// aside), two different topics, no property ddbpipe sets itself, at least one partition.
pub(crate) fn validate(kafka: &KafkaConfig, errors: &mut Vec<ConfigError>) {
    if kafka.brokers.trim().is_empty() {
        errors.push(ConfigError::new(
            "sink.brokers",
            "brokers must not be empty",
        ));
    }
    for broker in kafka
        .brokers
        .split(',')
        .map(str::trim)
        .filter(|b| !b.is_empty())
    {
        let port = broker.rsplit_once(':').map(|(_, port)| port);
        if port.is_none_or(|port| port.parse::<u16>().is_err()) {
            errors.push(ConfigError::new(
                "sink.brokers",
                format!("'{broker}' is not host:port (e.g. kafka-1.internal:9092)"),
            ));
        }
    }
    if let Err(problem) = topic_name_problem(&kafka.topic, true) {
        errors.push(ConfigError::new("sink.topic", problem));
    }
    if let Err(problem) = topic_name_problem(&kafka.positions_topic, false) {
        errors.push(ConfigError::new("sink.positions_topic", problem));
    } else if kafka.positions_topic == kafka.topic {
        errors.push(ConfigError::new(
            "sink.positions_topic",
            "the positions topic must not be the topic of the messages",
        ));
    }
    for name in kafka.properties.keys() {
        if OWN_PROPERTIES.contains(&name.as_str()) {
            errors.push(ConfigError::new(
                format!("sink.properties.{name}"),
                "ddbpipe sets this property itself (from brokers and delivery, and the \
                 pipeline's name for transactional.id): remove it",
            ));
        }
    }
    // The positions are read back by ddbpipe's own reader of the log, over PLAINTEXT or TLS
    // as the same properties say (docs/sinks.md §7.7 rule 4): what it cannot use is refused
    // here, naming the property, before anything connects.
    if kafka.delivery == Delivery::ExactlyOnce {
        let properties: Vec<(String, String)> = kafka
            .properties
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().to_string()))
            .collect();
        if let Err(problem) = Security::of(&properties) {
            let (field, message) = problem
                .split_once(": ")
                .unwrap_or(("sink.properties", &problem));
            errors.push(ConfigError::new(field.to_string(), message.to_string()));
        }
    }
    if kafka.topic_config.partitions == Some(0) {
        errors.push(ConfigError::new(
            "sink.topic_config.partitions",
            "a topic needs at least one partition",
        ));
    }
    if kafka.topic_config.replication_factor == Some(0) {
        errors.push(ConfigError::new(
            "sink.topic_config.replication_factor",
            "the replication factor must be at least 1",
        ));
    }
}

/// What keeps `name` from being a Kafka topic name: 1 to 249 of `a-z A-Z 0-9 . _ -`, not `.`
/// or `..`; a `template` may also hold the placeholders.
fn topic_name_problem(name: &str, template: bool) -> Result<(), String> {
    let mut bare = name.to_string();
    if template {
        for placeholder in PLACEHOLDERS {
            bare = bare.replace(placeholder, "x");
        }
    }
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if bare.is_empty() {
        return Err("a topic name must not be empty".into());
    }
    if let Some(bad) = bare.chars().find(|c| !legal(*c)) {
        let also = if template {
            " (and the placeholders {table}, {pipeline})"
        } else {
            ""
        };
        return Err(format!(
            "'{name}' holds '{bad}': a topic name has only letters, digits, '.', '_' and '-'{also}"
        ));
    }
    if bare == "." || bare == ".." || bare.len() > 249 {
        return Err(format!(
            "'{name}' is not a topic name Kafka takes (not . or .., at most 249 characters)"
        ));
    }
    Ok(())
}

/// `template` with the table's and the pipeline's names filled in; the names' characters a
/// topic cannot hold become `_`.
pub(crate) fn fill_topic(template: &str, table: &str, pipeline: &str) -> String {
    let clean = |name: &str| -> String {
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    template
        .replace("{table}", &clean(table))
        .replace("{pipeline}", &clean(pipeline))
}
