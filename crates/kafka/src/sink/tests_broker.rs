//! The `exactly_once` settings of this module's tests against the tests' broker
//! (`scripts/kafka.sh`), their topics created.

use std::time::Duration;

use ddbpipe_source::retry::RetryPolicy;

use super::KafkaSettings;
use crate::client::{Connection, Delivery, TopicShape};

/// `exactly_once` settings into a new topic named after `name`, with a new positions topic,
/// both created; `shared`: several workers' (`units`).
pub(super) async fn exactly_once(name: &str, shared: bool) -> KafkaSettings {
    let topic = ddbpipe_testkit::kafka::topic_name(name);
    let settings = KafkaSettings {
        connection: Connection {
            brokers: ddbpipe_testkit::kafka::brokers(),
            properties: Vec::new(),
            timeout: Duration::from_secs(30),
            msk_iam: None,
        },
        topic: topic.clone(),
        topic_shape: TopicShape::default(),
        delivery: Delivery::ExactlyOnce,
        positions_topic: ddbpipe_testkit::kafka::topic_name(&format!("{name}-positions")),
        transactional_id: format!("ddbpipe-{topic}"),
        retry: RetryPolicy {
            max_retries: 1,
            ..RetryPolicy::default()
        },
        shared,
    };
    for (name, compacted) in [(&settings.topic, false), (&settings.positions_topic, true)] {
        settings
            .connection
            .ensure_topic(name, TopicShape::default(), compacted)
            .await
            .unwrap_or_else(|e| panic!("cannot create topic {name}: {e:?}"));
    }
    settings
}
