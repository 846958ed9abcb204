//! How a run builds the kafka sink: the topic's name from its template, the client settings
//! from the section and the source's retry policy, the message shape from the table's key, and
//! the store of its positions (docs/sinks.md §7.7).

use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_kafka::client::{Connection, Delivery};
use ddbpipe_kafka::envelope::{Shaper, ShaperSettings};
use ddbpipe_kafka::log::Security;
use ddbpipe_kafka::msk_iam::MskIam;
use ddbpipe_kafka::positions::KafkaPositions;
use ddbpipe_kafka::sink::{KafkaSettings, KafkaSink};
use ddbpipe_pipeline::sink::Records;
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::{aws, plan};

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

/// The client settings of `kafka`; with `msk_iam`, its tokens signed with `sdk`'s credentials
/// (a run's AWS configuration; `None`: the one the source's settings load, as `check` and
/// `state` do).
pub async fn kafka_settings(
    kafka: &KafkaConfig,
    target: Target<'_>,
    sdk: Option<&aws::SdkSettings>,
) -> Result<KafkaSettings, Failure> {
    let retry = target.source.retry.policy();
    Ok(KafkaSettings {
        connection: connection(kafka, target, sdk, retry.attempt_timeout).await?,
        topic: topic_name(kafka, target),
        topic_shape: kafka.topic_config,
        delivery: kafka.delivery,
        positions_topic: kafka.positions_topic.clone(),
        transactional_id: transactional_id(target.pipeline),
        retry,
        shared: false,
    })
}

async fn connection(
    kafka: &KafkaConfig,
    target: Target<'_>,
    sdk: Option<&aws::SdkSettings>,
    timeout: Duration,
) -> Result<Connection, Failure> {
    Ok(Connection {
        brokers: kafka.brokers.clone(),
        properties: kafka.client_properties(),
        timeout,
        msk_iam: msk_iam(kafka, target, sdk).await?,
    })
}

/// The MSK IAM tokens of `kafka` (docs/sinks.md §7.7 rule 4): for the cluster's region
/// (`msk_iam.region`, else `source.region`, else the AWS configuration's), signed with the
/// AWS configuration's credentials; `None` without `msk_iam`.
async fn msk_iam(
    kafka: &KafkaConfig,
    target: Target<'_>,
    sdk: Option<&aws::SdkSettings>,
) -> Result<Option<MskIam>, Failure> {
    let Some(msk_iam) = &kafka.msk_iam else {
        return Ok(None);
    };
    let loaded;
    let sdk = match sdk {
        Some(sdk) => sdk,
        None => {
            loaded = aws::load_sdk_config(&plan::client_settings(target.source)).await;
            &loaded
        }
    };
    let region = (msk_iam.region.clone())
        .or_else(|| target.source.region.clone())
        .or_else(|| sdk.region().map(ToString::to_string));
    let Some(region) = region else {
        return Err(Failure::usage(anyhow!(
            "config error: sink.msk_iam.region: the cluster's region is not known: set \
             msk_iam.region (or source.region, or AWS_REGION)"
        )));
    };
    let Some(credentials) = sdk.credentials_provider() else {
        return Err(Failure::usage(anyhow!(
            "config error: sink.msk_iam: the AWS configuration has no credentials to sign \
             MSK IAM tokens with"
        )));
    };
    Ok(Some(MskIam::new(region, credentials)))
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
    sdk: Option<&aws::SdkSettings>,
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
        ..kafka_settings(kafka, target, sdk).await?
    };
    let sink = KafkaSink::open(settings, shaper)
        .await
        .map_err(|e| Failure::runtime(anyhow!(e)))?;
    let positions = KafkaPositions::of(&sink, &kafka.brokers);
    Ok((sink, positions))
}

/// The positions topic of an `exactly_once` kafka sink, for reading (`state show`, `lag`,
/// `check`); `None` for `at_least_once`, whose position is in the state file.
pub async fn positions_reader(
    kafka: &KafkaConfig,
    target: Target<'_>,
) -> Result<Option<KafkaPositions>, Failure> {
    if kafka.delivery != Delivery::ExactlyOnce {
        return Ok(None);
    }
    let timeout = target.source.retry.policy().attempt_timeout;
    let connection = connection(kafka, target, None, timeout).await?;
    let security = Security::of(&connection.properties, connection.msk_iam.as_ref())
        .map_err(|problem| Failure::usage(anyhow!("config error: {problem}")))?;
    Ok(Some(KafkaPositions::reading(
        &kafka.brokers,
        &kafka.positions_topic,
        timeout,
        security,
    )))
}
