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
    optional(
        "msk_iam",
        Shape::Section(MSK_IAM),
        "Amazon MSK's IAM access control: SASL OAUTHBEARER with tokens signed by the run's AWS \
         credentials (security.protocol SASL_SSL unless set); {} for the defaults.",
    ),
];

/// The keys of `sink.msk_iam`.
static MSK_IAM: &[Field] = &[optional(
    "region",
    of::<String>(),
    "The cluster's region; default source.region, else the run's.",
)];

/// `sink.msk_iam`: MSK's IAM access control (docs/sinks.md §7.7 rule 4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MskIamConfig {
    /// The cluster's region; `None`: the source's, else the run's.
    pub region: Option<String>,
}

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
    /// MSK's IAM access control, when set.
    pub msk_iam: Option<MskIamConfig>,
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
    let msk_iam = f.section("msk_iam").map(|mut section| {
        let region = section.get::<String>("region");
        section.finish();
        MskIamConfig { region }
    });
    KafkaConfig {
        brokers: brokers.unwrap_or_default(),
        topic,
        envelope,
        tombstones,
        delivery,
        positions_topic,
        properties,
        topic_config,
        msk_iam,
    }
}

impl KafkaConfig {
    /// The client properties: the section's, and with `msk_iam` SASL `OAUTHBEARER` over
    /// `SASL_SSL` unless `security.protocol` says `SASL_PLAINTEXT` (docs/sinks.md §7.7 rule 4).
    pub(crate) fn client_properties(&self) -> Vec<(String, String)> {
        let mut properties: Vec<(String, String)> = (self.properties.iter())
            .map(|(name, value)| (name.clone(), value.expose().to_string()))
            .collect();
        if self.msk_iam.is_some() {
            if !self.properties.contains_key(PROTOCOL) {
                properties.push((PROTOCOL.into(), "SASL_SSL".into()));
            }
            properties.push((MECHANISM.into(), OAUTHBEARER.into()));
        }
        properties
    }
}

const PROTOCOL: &str = "security.protocol";
const MECHANISM: &str = "sasl.mechanism";
const OAUTHBEARER: &str = "OAUTHBEARER";

/// What `msk_iam` cannot be set beside, or needs of `properties` (docs/sinks.md §7.7 rule
/// 4); without `msk_iam`, `OAUTHBEARER` has no token (librdkafka's own sources are not used:
/// ddbpipe answers its token refreshes).
fn msk_iam_problems(kafka: &KafkaConfig, errors: &mut Vec<ConfigError>) {
    let property = |name: &str| kafka.properties.get(name).map(|value| value.expose());
    let mechanism = property(MECHANISM).or(property("sasl.mechanisms"));
    if kafka.msk_iam.is_none() {
        if mechanism.is_some_and(|m| m.eq_ignore_ascii_case(OAUTHBEARER)) {
            let (field, message) = (ddbpipe_kafka::log::NO_TOKENS.split_once(": "))
                .unwrap_or(("sink.properties", ddbpipe_kafka::log::NO_TOKENS));
            errors.push(ConfigError::new(field, message));
        }
        return;
    }
    for name in [
        MECHANISM,
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
    ] {
        if property(name).is_some() {
            errors.push(ConfigError::new(
                format!("sink.properties.{name}"),
                "msk_iam authenticates with its own OAUTHBEARER tokens: remove this property",
            ));
        }
    }
    if let Some(protocol) = property(PROTOCOL)
        && !["SASL_SSL", "SASL_PLAINTEXT"]
            .iter()
            .any(|sasl| protocol.eq_ignore_ascii_case(sasl))
    {
        errors.push(ConfigError::new(
            format!("sink.properties.{PROTOCOL}"),
            "msk_iam authenticates over SASL: SASL_SSL (the default with msk_iam, as MSK's IAM \
             listener on port 9098 takes), or SASL_PLAINTEXT",
        ));
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
    let before = errors.len();
    msk_iam_problems(kafka, errors);
    // The positions are read back by ddbpipe's own reader of the log, over PLAINTEXT or TLS
    // as the same properties say (docs/sinks.md §7.7 rule 4): what it cannot use is refused
    // here, naming the property, before anything connects. With msk_iam its SASL is the
    // tokens' (checked above), and the rest is read as for any connection.
    if kafka.delivery == Delivery::ExactlyOnce && errors.len() == before {
        let mut properties = kafka.client_properties();
        if kafka.msk_iam.is_some() {
            properties.retain(|(name, _)| name != MECHANISM);
            for (name, value) in &mut properties {
                if name == PROTOCOL {
                    *value = value.to_ascii_uppercase().replace("SASL_", "");
                }
            }
        }
        if let Err(problem) = Security::of(&properties, None) {
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
