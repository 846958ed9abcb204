//! `check`'s kafka probe (docs/sinks.md §7.7 rule 9): the brokers answer, whether the topic is
//! there, and, for `exactly_once`, that the positions topic is compacted when it is there and
//! that the pipeline's transactional ids may be used (a producer of `ddbpipe-<pipeline>/check`,
//! an id no run uses: nothing running is fenced). Nothing is created.

use std::time::Duration;

use ddbpipe_kafka::client::Delivery;
use ddbpipe_pipeline::state::identity::Location;

use super::state::state_verdict;
use super::{Probes, Status};
use crate::config::PipelineConfig;
use crate::destination;
use crate::sinks::KafkaConfig;
use crate::sinks::kafka::kafka_settings;

/// Adds the `sink` probe of a kafka sink.
pub(super) async fn probe_kafka(
    config: &PipelineConfig,
    kafka: &KafkaConfig,
    timeout: Duration,
    probes: &mut Probes,
) {
    let mut settings = match kafka_settings(kafka, config.target(), None).await {
        Ok(settings) => settings,
        Err(failure) => {
            let detail = format!("kafka {}: {}", kafka.brokers, failure.error);
            return probes.add("sink", Status::Fail, detail);
        }
    };
    settings.connection.timeout = timeout;
    let (topic, connection) = (&settings.topic, &settings.connection);
    // With MSK IAM, the region its tokens are signed for (docs/sinks.md §7.7 rule 4).
    let brokers = match &connection.msk_iam {
        Some(msk_iam) => format!("{} (MSK IAM, {})", kafka.brokers, msk_iam.region()),
        None => kafka.brokers.clone(),
    };
    let mut said = Vec::new();
    let probed = async {
        said.push(connection.probe(topic, false).await?);
        if kafka.delivery == Delivery::ExactlyOnce {
            said.push(connection.probe(&kafka.positions_topic, true).await?);
            let probe_id = format!("{}/check", settings.transactional_id);
            said.push(connection.probe_transactional(&probe_id).await?);
        }
        Ok::<(), String>(())
    };
    let answer = tokio::time::timeout(timeout * 2, probed).await;
    match answer {
        Ok(Ok(())) => probes.add(
            "sink",
            Status::Pass,
            format!("kafka {brokers}: {}", said.join("; ")),
        ),
        Ok(Err(problem)) => probes.add("sink", Status::Fail, format!("kafka {brokers}: {problem}")),
        Err(_) => probes.add(
            "sink",
            Status::Fail,
            format!(
                "kafka {brokers}: no answer within {} s: check sink.brokers and that the brokers \
                 run",
                (timeout * 2).as_secs()
            ),
        ),
    }
}

/// The `state` probe of an `exactly_once` kafka sink: the entry read from the positions topic
/// (its committed view), judged as a state file's entry is.
pub(super) async fn probe_positions(
    config: &PipelineConfig,
    location: &Location,
    stream: Option<&str>,
    timeout: Duration,
    probes: &mut Probes,
) {
    let label = destination::position_label(config);
    let loaded = async {
        let Some(mut store) = destination::read_store(config)
            .await
            .map_err(|f| f.to_string())?
        else {
            return Ok(None);
        };
        store.load(&config.name).await.map_err(|e| e.to_string())
    };
    let (status, detail) = match tokio::time::timeout(timeout * 2, loaded).await {
        Err(_) => (
            Status::Fail,
            format!("{label}: no answer within {} s", (timeout * 2).as_secs()),
        ),
        Ok(Err(problem)) => (Status::Fail, problem),
        Ok(Ok(entry)) => state_verdict(config, location, stream, &label, entry, timeout).await,
    };
    probes.add("state", status, detail);
}
