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
//! 5. With MSK's IAM access control ([`crate::msk_iam`]) every producer of the connection
//!    answers librdkafka's token refresh with a new token; without it, a refresh is refused
//!    (an `OAUTHBEARER` token has no other source: the config refuses that mechanism without
//!    `msk_iam`).
//! 6. Topics are read, made and checked by librdkafka's admin client; with MSK IAM's tokens,
//!    which that client cannot use (it never serves its token refresh: rust-rdkafka #757), by
//!    the log reader's own connections (`crate::log`'s `admin`), over the same TLS and SASL.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::OAuthToken;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message as _};
use rdkafka::producer::{ProducerContext, ThreadedProducer};

use crate::log::{Created, LogReader, Security};
use crate::msk_iam::MskIam;

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
    /// MSK's IAM access control: the tokens of SASL `OAUTHBEARER` (rule 5).
    pub msk_iam: Option<MskIam>,
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
            .field("msk_iam", &self.msk_iam)
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
        let deliveries = Deliveries {
            tokens: Tokens(self.msk_iam.clone()),
            ..Deliveries::default()
        };
        config
            .create_with_context(deliveries)
            .map(Arc::new)
            .map_err(|e| format!("cannot create the producer: {e}"))
    }

    /// The topics' client (rule 6).
    fn admin(&self) -> Result<Admin, String> {
        if let Some(msk_iam) = &self.msk_iam {
            let security = Security::of(&self.properties, Some(msk_iam))?;
            let reader = LogReader::new(&self.brokers, self.timeout).with_security(security);
            return Ok(Admin::Reader(reader));
        }
        self.config()
            .create_with_context(Tokens(None))
            .map(|client| Admin::Client(Arc::new(client)))
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
        let found = (admin.partitions(topic, self.timeout).await).map_err(TopicError::Transient)?;
        if found.is_some() {
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
        let created = admin
            .create(topic, partitions, replication, compacted, self.timeout)
            .await
            .map_err(|e| TopicError::Transient(format!("cannot create topic '{topic}': {e}")))?;
        match created {
            Created::Made => {
                tracing::info!(topic, compacted, "Created Kafka topic.");
                Ok(true)
            }
            // Another process made it meanwhile.
            Created::There => Ok(false),
            Created::NotAllowed(why) => Err(TopicError::Definite(format!(
                "topic '{topic}' does not exist and this client may not create it ({why}): \
                 create it, or grant CREATE"
            ))),
        }
    }

    /// What `check` reports of `topic`: that the brokers answer, and whether the topic exists
    /// (nothing is made); for the positions topic (`compacted`) also that an existing one is
    /// compacted.
    pub async fn probe(&self, topic: &str, compacted: bool) -> Result<String, String> {
        let admin = self.admin()?;
        if let Some(partitions) = admin.partitions(topic, self.timeout).await? {
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

    /// The positions topic must keep each key's last message (rule 4).
    async fn check_compacted(&self, admin: &Admin, topic: &str) -> Result<(), TopicError> {
        let policy = (admin.cleanup_policy(topic, self.timeout).await).map_err(|e| {
            TopicError::Transient(format!(
                "cannot read the configuration of topic '{topic}': {e}"
            ))
        })?;
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

/// The client of a connection's topics (rule 6): librdkafka's admin client, or, with MSK
/// IAM's tokens (which librdkafka's admin client cannot use), the log reader's connections.
enum Admin {
    Client(Arc<AdminClient<Tokens>>),
    Reader(LogReader),
}

impl Admin {
    /// The partitions of `topic`; `None` when the cluster does not have it (nothing is made
    /// by asking: librdkafka's client reads the metadata of all topics, as asking for one may
    /// create it where the broker creates topics on use; the reader asks without creation).
    async fn partitions(&self, topic: &str, timeout: Duration) -> Result<Option<usize>, String> {
        let admin = match self {
            Admin::Reader(reader) => {
                // Boxed: the reader's futures are deep, and a sink's open awaits this.
                let partitions =
                    (Box::pin(reader.partitions(topic)).await).map_err(|e| e.to_string())?;
                return Ok(partitions.map(|p| p.len()));
            }
            Admin::Client(admin) => Arc::clone(admin),
        };
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

    /// Makes `topic` (rule 4's partitions and replication; `compacted`: the positions
    /// topic's cleanup policy).
    async fn create(
        &self,
        topic: &str,
        partitions: i32,
        replication: i32,
        compacted: bool,
        timeout: Duration,
    ) -> Result<Created, String> {
        let settings: &[(&str, &str)] = match compacted {
            true => &[("cleanup.policy", "compact")],
            false => &[],
        };
        let admin = match self {
            Admin::Reader(reader) => {
                let replication = i16::try_from(replication).unwrap_or(i16::MAX);
                let made = reader.create_topic(topic, partitions, replication, settings);
                return Box::pin(made).await.map_err(|e| e.to_string());
            }
            Admin::Client(admin) => admin,
        };
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
        for (name, value) in settings {
            new = new.set(name, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(timeout));
        let created = (admin.create_topics([&new], &options).await).map_err(|e| e.to_string())?;
        match created.into_iter().next() {
            None | Some(Ok(_)) => Ok(Created::Made),
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(Created::There),
            Some(Err((_, code @ RDKafkaErrorCode::TopicAuthorizationFailed)))
            | Some(Err((_, code @ RDKafkaErrorCode::ClusterAuthorizationFailed))) => {
                Ok(Created::NotAllowed(code.to_string()))
            }
            Some(Err((_, code))) => Err(code.to_string()),
        }
    }

    /// The cleanup policy of `topic`; `None` when the broker does not say.
    async fn cleanup_policy(
        &self,
        topic: &str,
        timeout: Duration,
    ) -> Result<Option<String>, String> {
        let admin = match self {
            Admin::Reader(reader) => {
                let setting = reader.topic_setting(topic, "cleanup.policy");
                return Box::pin(setting).await.map_err(|e| e.to_string());
            }
            Admin::Client(admin) => admin,
        };
        let options = AdminOptions::new().request_timeout(Some(timeout));
        let described = (admin.describe_configs([&ResourceSpecifier::Topic(topic)], &options))
            .await
            .map_err(|e| e.to_string())?;
        Ok(described
            .into_iter()
            .filter_map(Result::ok)
            .flat_map(|resource| resource.entries)
            .find(|entry| entry.name == "cleanup.policy")
            .and_then(|entry| entry.value))
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
    tokens: Tokens,
}

/// The context of a client: its tokens for SASL `OAUTHBEARER` when the cluster is MSK's with
/// IAM access control (rule 5).
#[derive(Debug, Default, Clone)]
pub struct Tokens(Option<MskIam>);

impl ClientContext for Tokens {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        match &self.0 {
            Some(msk_iam) => Ok(msk_iam.oauth_token()?),
            None => Err("an OAUTHBEARER token comes only from sink.msk_iam".into()),
        }
    }
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

impl ClientContext for Deliveries {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.tokens.generate_oauth_token(config)
    }
}

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
