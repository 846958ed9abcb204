//! A cluster's topics through the reader's own connections (docs/sinks.md §7.7 rule 4): a
//! topic made, and a setting of a topic's configuration read. For the clients librdkafka's
//! admin client cannot authenticate: with MSK IAM's tokens it never answers its token
//! refresh (rust-rdkafka #757), so a connection with `msk_iam` manages its topics here, over
//! the same TLS and SASL as the reader (`crate::client` rule 4).
//!
//! # Rules
//! 1. `CreateTopics` goes to a bootstrap broker (a broker forwards it to the controller,
//!    KIP-590), for one topic with its partitions, replication factor (`-1`: the broker's
//!    default) and settings; `TOPIC_ALREADY_EXISTS` is another writer's topic, an
//!    authorization error a topic this client may not make.
//! 2. `DescribeConfigs` of the topic, all its settings (as librdkafka asks: a broker may not
//!    serve a list of names, tansu closes the connection); a setting the broker does not list
//!    is `None`.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, DescribeConfigsRequest};
use kafka_protocol::protocol::StrBytes;

use super::wire::Api;
use super::{LogError, LogReader, broker_error, topic_name};

const CREATE_TOPICS: Api = Api {
    key: ApiKey::CreateTopics,
    name: "CreateTopics",
    min: 2,
    max: 7,
};

const DESCRIBE_CONFIGS: Api = Api {
    key: ApiKey::DescribeConfigs,
    name: "DescribeConfigs",
    min: 1,
    max: 4,
};

/// DescribeConfigs' resource type of a topic.
const TOPIC_RESOURCE: i8 = 2;

/// What asking for a topic made (rule 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// It was made.
    Made,
    /// It was there: another writer made it.
    There,
    /// This client may not make it (the broker's error, by name).
    NotAllowed(String),
}

impl LogReader {
    /// Makes `topic` with `partitions` and `replication` (`-1`: the broker's defaults) and
    /// the settings `configs` (rule 1).
    pub async fn create_topic(
        &self,
        topic: &str,
        partitions: i32,
        replication: i16,
        configs: &[(&str, &str)],
    ) -> Result<Created, LogError> {
        let mut connection = self.bootstrap().await?;
        let configs = configs
            .iter()
            .map(|(name, value)| {
                CreatableTopicConfig::default()
                    .with_name(StrBytes::from_string((*name).to_string()))
                    .with_value(Some(StrBytes::from_string((*value).to_string())))
            })
            .collect();
        let request = CreateTopicsRequest::default()
            .with_topics(vec![
                CreatableTopic::default()
                    .with_name(topic_name(topic))
                    .with_num_partitions(partitions)
                    .with_replication_factor(replication)
                    .with_configs(configs),
            ])
            .with_timeout_ms(i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX));
        let response = connection.send(CREATE_TOPICS, &request).await?;
        let code = response.topics.first().map_or(0, |t| t.error_code);
        match ResponseError::try_from_code(code) {
            None => Ok(Created::Made),
            Some(ResponseError::TopicAlreadyExists) => Ok(Created::There),
            Some(
                error @ (ResponseError::TopicAuthorizationFailed
                | ResponseError::ClusterAuthorizationFailed),
            ) => Ok(Created::NotAllowed(format!("{error:?}"))),
            Some(error) => Err(broker_error(
                connection.broker(),
                CREATE_TOPICS.name,
                topic,
                None,
                error,
            )),
        }
    }

    /// The value of the setting `name` of `topic` (rule 2).
    pub async fn topic_setting(&self, topic: &str, name: &str) -> Result<Option<String>, LogError> {
        let mut connection = self.bootstrap().await?;
        let request = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(TOPIC_RESOURCE)
                .with_resource_name(StrBytes::from_string(topic.to_string()))
                .with_configuration_keys(None),
        ]);
        let response = connection.send(DESCRIBE_CONFIGS, &request).await?;
        let Some(result) = response.results.first() else {
            return Ok(None);
        };
        if let Some(error) = ResponseError::try_from_code(result.error_code) {
            return Err(broker_error(
                connection.broker(),
                DESCRIBE_CONFIGS.name,
                topic,
                None,
                error,
            ));
        }
        Ok(result
            .configs
            .iter()
            .find(|config| config.name.as_str() == name)
            .and_then(|config| config.value.as_ref())
            .map(|value| value.as_str().to_string()))
    }
}
