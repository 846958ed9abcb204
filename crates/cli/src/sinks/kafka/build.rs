//! How a run builds the kafka sink: the topic's name from its template, the client settings
//! from the section and the source's retry policy, the message shape from the table's key, and
//! the store of its positions (docs/sinks.md §7.7).

use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_kafka::client::{Connection, Delivery};
use ddbpipe_kafka::envelope::{Shaper, ShaperSettings};
use ddbpipe_kafka::log::Security;
use ddbpipe_kafka::positions::KafkaPositions;
use ddbpipe_kafka::sink::{KafkaSettings, KafkaSink};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::api::TableDescription;

use super::KafkaConfig;
use super::config::fill_topic;
use crate::failure::Failure;
use crate::sinks::Target;

/// The data topic of `kafka` for `target`'s table and pipeline.
pub fn topic_name(kafka: &KafkaConfig, target: Target<'_>) -> String {
    fill_topic(&kafka.topic, &target.source.table_name, target.pipeline)
}

/// The shape of `kafka`'s messages, for the position's identity: the envelope, and whether
/// deletes are followed by tombstones (`debezium, tombstones`).
pub fn message_shape(kafka: &KafkaConfig) -> String {
    let envelope = crate::yaml::types::Choice::name(kafka.envelope);
    if kafka.tombstones {
        format!("{envelope}, tombstones")
    } else {
        envelope.to_string()
    }
}

/// The producer's `transactional.id`: one per pipeline, so a second run of it fences the
/// first (docs/sinks.md §7.7).
fn transactional_id(pipeline: &str) -> String {
    format!("ddbpipe-{pipeline}")
}

/// The client settings of `kafka`.
pub fn kafka_settings(kafka: &KafkaConfig, target: Target<'_>) -> KafkaSettings {
    let retry = target.source.retry.policy();
    KafkaSettings {
        connection: connection(kafka, retry.attempt_timeout),
        topic: topic_name(kafka, target),
        topic_shape: kafka.topic_config,
        delivery: kafka.delivery,
        positions_topic: kafka.positions_topic.clone(),
        transactional_id: transactional_id(target.pipeline),
        retry,
        shared: false,
    }
}

fn connection(kafka: &KafkaConfig, timeout: Duration) -> Connection {
    Connection {
        brokers: kafka.brokers.clone(),
        properties: kafka
            .properties
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().to_string()))
            .collect(),
        timeout,
    }
}

/// Opens the kafka sink of `target`: its topics made when missing and, for `exactly_once`,
/// its transactional producer started (older producers of the pipeline fenced); its store of
/// positions when the positions topic keeps them. `shared`: one worker of several
/// (`coordination:`): an `exactly_once` sink starts a producer per unit it is given instead,
/// and keeps no pipeline position (docs/coordination.md §11.13).
pub async fn open_kafka(
    kafka: &KafkaConfig,
    target: Target<'_>,
    table: Option<&TableDescription>,
    records: Records,
    shared: bool,
) -> Result<(KafkaSink, Option<KafkaPositions>), Failure> {
    let Some(table) = table else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a kafka sink needs the table's key schema"
        )));
    };
    let shaper = Shaper::new(ShaperSettings {
        envelope: kafka.envelope,
        records,
        key_attributes: table.key_schema.iter().map(|k| k.name.clone()).collect(),
        pipeline: target.pipeline.to_string(),
        table: target.source.table_name.clone(),
        region: target.source.region.clone(),
        tombstones: kafka.tombstones,
    })
    .map_err(|problem| Failure::runtime(anyhow!("sink kafka: {problem}")))?;
    let settings = KafkaSettings {
        shared,
        ..kafka_settings(kafka, target)
    };
    let sink = KafkaSink::open(settings, shaper)
        .await
        .map_err(|e| Failure::runtime(anyhow!(e)))?;
    let positions = KafkaPositions::of(&sink, &kafka.brokers);
    Ok((sink, positions))
}

/// The positions topic of an `exactly_once` kafka sink, for reading (`state show`, `lag`,
/// `check`); `None` for `at_least_once`, whose position is in the state file.
pub fn positions_reader(
    kafka: &KafkaConfig,
    target: Target<'_>,
) -> Result<Option<KafkaPositions>, Failure> {
    if kafka.delivery != Delivery::ExactlyOnce {
        return Ok(None);
    }
    let timeout = target.source.retry.policy().attempt_timeout;
    let security = Security::of(&connection(kafka, timeout).properties)
        .map_err(|problem| Failure::usage(anyhow!("config error: {problem}")))?;
    Ok(Some(KafkaPositions::reading(
        &kafka.brokers,
        &kafka.positions_topic,
        timeout,
        security,
    )))
}
