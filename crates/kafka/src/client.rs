//! The producer and the topics (docs/sinks.md §7.7): the client configuration a delivery
//! guarantee needs, the data and positions topics made when missing, the positions topic's
//! cleanup policy checked.
//!
//! # Rules
//! 1. `bootstrap.servers`, `transactional.id`, `enable.idempotence`, `acks` and
//!    `isolation.level` are ddbpipe's: `sink.properties` cannot set them (the config refuses
//!    them, [`OWN_PROPERTIES`]). Every other property goes to librdkafka as it is.
//! 2. Both guarantees use the idempotent producer with `acks=all`: a retried send never
//!    duplicates a message inside one producer session. `exactly_once` adds a
//!    `transactional.id`, so a newer producer with the same id fences an older one (the broker
//!    refuses its transactions from then on).
//! 3. A property value may be a secret (`sasl.password`, `ssl.key.password`): the
//!    configuration is never printed, and errors name the brokers and topics only.
//! 4. A missing data topic is created with `topic_config`'s partitions and replication factor
//!    (else the broker's defaults); a missing positions topic with one partition and
//!    `cleanup.policy=compact`. An existing positions topic must be compacted: a topic that
//!    deletes by age would one day lose the position of a pipeline that wrote none for a while.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message as _};
use rdkafka::producer::{ProducerContext, ThreadedProducer};

/// The client properties ddbpipe sets itself (rule 1).
pub const OWN_PROPERTIES: [&str; 5] = [
    "bootstrap.servers",
    "transactional.id",
    "enable.idempotence",
    "acks",
    "isolation.level",
];

/// How a batch reaches Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// `exactly_once`: each batch's messages and the pipeline's position commit in one
    /// transaction.
    #[default]
    ExactlyOnce,
    /// `at_least_once`: the position moves (in the state file) once the broker acknowledged
    /// every message of the batch; a crash may send a batch again.
    AtLeastOnce,
}

impl Delivery {
    /// The name in the config file.
    pub const fn name(self) -> &'static str {
        match self {
            Delivery::ExactlyOnce => "exactly_once",
            Delivery::AtLeastOnce => "at_least_once",
        }
    }
}

/// Partitions and replication of a data topic ddbpipe creates; unset: the broker's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicShape {
    /// Partitions.
    pub partitions: Option<i32>,
    /// Replication factor.
    pub replication_factor: Option<i32>,
}

/// How to reach the brokers: the bootstrap list, the client properties and the time one
/// request may take.
#[derive(Clone)]
pub struct Connection {
    /// Bootstrap servers, comma-separated.
    pub brokers: String,
    /// Client properties from `sink.properties`, values possibly secret (rule 3).
    pub properties: Vec<(String, String)>,
    /// Bound of one request or transaction step.
    pub timeout: Duration,
}

impl std::fmt::Debug for Connection {
    // Rule 3: the properties' names, never their values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("brokers", &self.brokers)
            .field(
                "properties",
                &self.properties.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Connection {
    /// The client configuration: the user's properties, then ddbpipe's own (rule 1).
    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config.set("bootstrap.servers", &self.brokers);
        config.set(
            "socket.timeout.ms",
            self.timeout.as_millis().max(10).to_string(),
        );
        config
    }

    /// A producer with the guarantee's settings (rule 2); `transactional_id` for
    /// `exactly_once`. Its delivery reports go to [`Deliveries`].
    pub fn producer(&self, transactional_id: Option<&str>) -> Result<Producer, String> {
        let mut config = self.config();
        config.set("enable.idempotence", "true");
        config.set("acks", "all");
        // Each send is bounded by the attempt's time; the sink retries the batch as a whole.
        config.set(
            "message.timeout.ms",
            self.timeout.as_millis().max(1_000).to_string(),
        );
        if let Some(id) = transactional_id {
            config.set("transactional.id", id);
            config.set(
                "transaction.timeout.ms",
                (self.timeout.as_millis().max(1_000) * 2).to_string(),
            );
        }
        config
            .create_with_context(Deliveries::default())
            .map(Arc::new)
            .map_err(|e| format!("cannot create the producer: {e}"))
    }

    fn admin(&self) -> Result<Arc<AdminClient<DefaultClientContext>>, String> {
        self.config()
            .create()
            .map(Arc::new)
            .map_err(|e| format!("cannot create the admin client: {e}"))
    }

    /// Makes `topic` when the broker does not have it (rule 4); `compacted` for the positions
    /// topic (one partition, compacted), which must be compacted when it exists. Returns
    /// whether it was created.
    pub async fn ensure_topic(
        &self,
        topic: &str,
        shape: TopicShape,
        compacted: bool,
    ) -> Result<bool, TopicError> {
        let admin = self.admin().map_err(TopicError::Definite)?;
        if self
            .topic_exists(&admin, topic)
            .await
            .map_err(TopicError::Transient)?
        {
            if compacted {
                self.check_compacted(&admin, topic).await?;
            }
            return Ok(false);
        }
        let (partitions, replication) = if compacted {
            (1, shape.replication_factor.unwrap_or(-1))
        } else {
            (
                shape.partitions.unwrap_or(-1),
                shape.replication_factor.unwrap_or(-1),
            )
        };
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
        if compacted {
            new = new.set("cleanup.policy", "compact");
        }
        let options = AdminOptions::new().operation_timeout(Some(self.timeout));
        let created = admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| TopicError::Transient(format!("cannot create topic '{topic}': {e}")))?;
        for result in created {
            match result {
                Ok(_) => {}
                // Another process made it meanwhile.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => return Ok(false),
                Err((_, RDKafkaErrorCode::TopicAuthorizationFailed))
                | Err((_, RDKafkaErrorCode::ClusterAuthorizationFailed)) => {
                    return Err(TopicError::Definite(format!(
                        "topic '{topic}' does not exist and this client may not create it: \
                         create it, or grant CREATE"
                    )));
                }
                Err((_, code)) => {
                    return Err(TopicError::Transient(format!(
                        "cannot create topic '{topic}': {code}"
                    )));
                }
            }
        }
        tracing::info!(topic, compacted, "Created Kafka topic.");
        Ok(true)
    }

    /// What `check` reports of `topic`: that the brokers answer, and whether the topic exists
    /// (nothing is made); for the positions topic (`compacted`) also that an existing one is
    /// compacted.
    pub async fn probe(&self, topic: &str, compacted: bool) -> Result<String, String> {
        let admin = self.admin()?;
        if let Some(partitions) = self.partitions(&admin, topic).await? {
            if compacted {
                self.check_compacted(&admin, topic)
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(format!("topic '{topic}' is there, compacted"));
            }
            return Ok(format!(
                "topic '{topic}' is there ({partitions} partitions)"
            ));
        }
        // Asking whether it may be created (CreateTopics with validate_only) is not safe: a
        // broker that ignores validate_only (tansu) would make it, without its settings.
        Ok(format!(
            "topic '{topic}' does not exist yet; the run creates it"
        ))
    }

    /// What `check` reports of the transactional ids of `exactly_once`: a producer of
    /// `probe_id` (the pipeline's own id followed by `/check`: the prefix the run's ids share,
    /// so one ACL on the prefix grants both, and an id no run uses, so nothing running is
    /// fenced) is started and dropped. Refused, it names the permission to grant.
    pub async fn probe_transactional(&self, probe_id: &str) -> Result<String, String> {
        let producer = self.producer(Some(probe_id))?;
        let timeout = self.timeout;
        let started = tokio::task::spawn_blocking(move || {
            rdkafka::producer::Producer::init_transactions(producer.as_ref(), timeout)
        })
        .await
        .map_err(|e| format!("starting a transactional producer did not finish: {e}"))?;
        match started {
            Ok(()) => Ok(format!("transactional id '{probe_id}' may be used")),
            Err(error)
                if matches!(
                    error.rdkafka_error_code(),
                    Some(
                        rdkafka::types::RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                            | rdkafka::types::RDKafkaErrorCode::ClusterAuthorizationFailed
                    )
                ) =>
            {
                Err(format!(
                    "not authorized to use the transactional id '{probe_id}': grant this \
                     client WRITE on the transactional ids with its prefix ({error})"
                ))
            }
            Err(error) => Err(broker_error(
                "cannot start a transactional producer",
                &error,
            )),
        }
    }

    /// Whether the cluster has `topic`, by the metadata of all topics (asking for one topic
    /// may create it where the broker creates topics on use).
    async fn topic_exists(
        &self,
        admin: &Arc<AdminClient<DefaultClientContext>>,
        topic: &str,
    ) -> Result<bool, String> {
        Ok(self.partitions(admin, topic).await?.is_some())
    }

    /// The partitions of `topic`; `None` when the cluster does not have it (read from the
    /// metadata of all topics: asking for one may create it where the broker creates topics on
    /// use).
    async fn partitions(
        &self,
        admin: &Arc<AdminClient<DefaultClientContext>>,
        topic: &str,
    ) -> Result<Option<usize>, String> {
        let admin = Arc::clone(admin);
        let timeout = self.timeout;
        let metadata =
            tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, timeout))
                .await
                .map_err(|e| format!("the metadata request did not finish: {e}"))?
                .map_err(|e| broker_error("cannot read the cluster's metadata", &e))?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| t.partitions().len()))
    }

    /// The positions topic must keep each key's last message (rule 4).
    async fn check_compacted(
        &self,
        admin: &AdminClient<DefaultClientContext>,
        topic: &str,
    ) -> Result<(), TopicError> {
        let options = AdminOptions::new().request_timeout(Some(self.timeout));
        let described = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
            .await
            .map_err(|e| {
                TopicError::Transient(format!(
                    "cannot read the configuration of topic '{topic}': {e}"
                ))
            })?;
        let policy = described
            .into_iter()
            .filter_map(Result::ok)
            .flat_map(|resource| resource.entries)
            .find(|entry| entry.name == "cleanup.policy")
            .and_then(|entry| entry.value);
        match policy {
            Some(policy) if policy.split(',').any(|p| p.trim() == "compact") => Ok(()),
            found => Err(TopicError::Definite(format!(
                "the positions topic '{topic}' is not compacted (cleanup.policy={}): it would \
                 one day delete a pipeline's position; set cleanup.policy=compact on it, or \
                 name another positions_topic",
                found.as_deref().unwrap_or("unknown")
            ))),
        }
    }
}

/// Why a topic could not be made or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicError {
    /// The brokers did not answer or failed: a later attempt may succeed.
    Transient(String),
    /// The topic cannot be used as it is (not compacted, not creatable): retrying cannot help.
    Definite(String),
}

impl std::fmt::Display for TopicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopicError::Transient(message) | TopicError::Definite(message) => f.write_str(message),
        }
    }
}

/// The producer of a sink: librdkafka's, polled by its own thread, its delivery reports
/// counted by [`Deliveries`]; shared by the sink and its positions store.
pub type Producer = Arc<ThreadedProducer<Deliveries>>;

/// The delivery reports of a producer: how many messages still wait for theirs, and the first
/// message the broker refused since [`Deliveries::reset`] (its key, to name the item). No
/// per-message future: a report only updates a counter.
#[derive(Debug, Default)]
pub struct Deliveries {
    tally: std::sync::Mutex<Tally>,
    settled: tokio::sync::Notify,
}

/// What [`Deliveries`] counts.
#[derive(Debug, Default)]
struct Tally {
    outstanding: u64,
    refused: Option<Refused>,
}

/// A message the broker (or the client) refused.
#[derive(Debug, Clone)]
pub struct Refused {
    /// Why.
    pub error: KafkaError,
    /// The message's key.
    pub key: Vec<u8>,
    /// Its key and value bytes.
    pub size: usize,
}

impl Deliveries {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A message was handed to the producer: its report is awaited.
    pub fn sent(&self) {
        self.tally().outstanding += 1;
    }

    /// Forgets the last refusal (a new attempt starts).
    pub fn reset(&self) {
        self.tally().refused = None;
    }

    /// The first refusal since [`Deliveries::reset`].
    pub fn refused(&self) -> Option<Refused> {
        self.tally().refused.clone()
    }

    /// Waits until every message sent has its report, at most `limit`; whether they all do.
    pub async fn settle(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.tally().outstanding == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        let mut tally = self.tally();
        tally.outstanding = tally.outstanding.saturating_sub(1);
        if let Err((error, message)) = result
            && tally.refused.is_none()
        {
            let key = message.key().unwrap_or_default().to_vec();
            tally.refused = Some(Refused {
                error: error.clone(),
                size: key.len() + message.payload_len(),
                key,
            });
        }
        if tally.outstanding == 0 {
            self.settled.notify_waiters();
        }
    }
}

/// A client error, with the brokers' part of it.
pub fn broker_error(what: &str, error: &KafkaError) -> String {
    format!("{what}: {error}")
}
