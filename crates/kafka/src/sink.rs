//! The Kafka sink (docs/sinks.md §7.7): a batch's records as messages (`envelope`), sent at
//! least once or committed exactly once with the pipeline's position.
//!
//! # Rules
//! 1. `at_least_once`: every message of the batch is sent and the batch is acknowledged once
//!    the broker acknowledged each of them (`acks=all`); the position then moves in the state
//!    file. A failure before that leaves the position where it was: a later attempt (or run)
//!    sends the batch again.
//! 2. `exactly_once`: one transaction per batch holds its messages and, when the position lives
//!    in Kafka (`Staged`), the position message (key: the pipeline, partition 0 of the
//!    positions topic). The commit is the acknowledgement: a crash before it leaves neither,
//!    after it both. A position written outside a batch (the start of a stream, a closed
//!    snapshot) is a transaction of its own.
//! 3. A failed attempt is aborted (nothing of it becomes visible) and the batch is retried as a
//!    whole with the source's retry policy (docs/errors.md §9.4); a broker that stays away
//!    fails the run naming the brokers.
//! 4. A message the broker cannot take (over `max.message.bytes`, a topic this client may not
//!    write) fails the run at once naming the item's key and what to change: retrying cannot
//!    help, and skipping it would lose a change.
//! 5. A producer fenced by a newer one with the same `transactional.id` (another run of the
//!    pipeline took over) stops this run with nothing of the batch visible
//!    ([`SinkErrorClass::Fenced`]).
//! 6. **Several workers** (`coordination:`, docs/coordination.md §11.13): `at_least_once`
//!    writes as rule 1, the positions in the lease rows. `exactly_once` keeps no pipeline
//!    producer: each leased unit (a shard, a segment) gets its own transactional producer
//!    when its lease is taken (`units`), whose start fences the unit's earlier owner, and
//!    each of the unit's batches commits with the unit's position in the positions topic.
//! 7. **A mirror's snapshot beside its stream** (`exactly_once` in one process: the sink is
//!    [`Versioned`]): while a snapshot is open, a row of a key whose change was produced since
//!    it opened is not produced (`beside`), so the stream is read while the table is scanned and
//!    a snapshot may take longer than the stream's retention.

use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Fence, Fencing, Sink, SinkError, SinkErrorClass, Staged, Versioned};
use ddbpipe_source::position::LeaseCheckpoint;
use ddbpipe_source::retry::{Cancel, GaveUp, RetryPolicy};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer as _};

use crate::client::{Connection, Delivery, Producer, TopicError, TopicShape};
use crate::envelope::{Message, Shaper};
use crate::log::{LogReader, Security};
use beside::Beside;
pub(crate) use transactions::Transactions;
use units::UnitProducers;

mod beside;
#[cfg(test)]
mod tests_broker;
mod transactions;
pub(crate) mod units;

/// What a Kafka sink is built from.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// The brokers and the client properties.
    pub connection: Connection,
    /// The data topic (its template already filled in).
    pub topic: String,
    /// How a missing data topic is made.
    pub topic_shape: TopicShape,
    /// The delivery guarantee.
    pub delivery: Delivery,
    /// The compacted topic of the positions (`exactly_once`).
    pub positions_topic: String,
    /// The producer's `transactional.id` (`exactly_once`).
    pub transactional_id: String,
    /// The retries of a failed batch (rule 3).
    pub retry: RetryPolicy,
    /// Written by several workers (`coordination:`, rule 6): with `exactly_once`, one
    /// transactional producer per leased unit instead of the pipeline's.
    pub shared: bool,
}

impl KafkaSettings {
    /// The reader of the positions topic: connecting as the client properties say
    /// (`log::Security`), each request bounded by the sink's timeout; or the sink's error
    /// naming `target`. One per pipeline producer or worker, shared by its position checks and
    /// its positions store.
    pub(crate) fn positions_reader(&self, target: &str) -> Result<LogReader, SinkError> {
        let security = Security::of(
            &self.connection.properties,
            self.connection.msk_iam.as_ref(),
        )
        .map_err(|message| SinkError {
            sink: target.to_string(),
            message,
            class: SinkErrorClass::Definite,
        })?;
        // Bounded as the sink's own requests are (`source.retry`'s attempt time).
        Ok(
            LogReader::new(&self.connection.brokers, self.connection.timeout)
                .with_security(security),
        )
    }
}

/// The Kafka sink.
pub struct KafkaSink {
    producer: Producer,
    shaper: Shaper,
    topic: String,
    target: String,
    retry: RetryPolicy,
    /// How long the brokers may take to acknowledge a batch (`at_least_once`).
    timeout: Duration,
    /// `exactly_once`: the transactions, shared with the positions store.
    transactions: Option<Transactions>,
    /// `exactly_once` with several workers: a producer per held unit (rule 6).
    units: Option<Box<UnitProducers>>,
    /// The messages of the batch being written (kept to reuse its room).
    messages: Vec<Message>,
    /// `exactly_once` in one process: the keys changed while a mirror's snapshot is open
    /// (rule 7).
    beside: Beside,
}

/// One attempt's failure.
#[derive(Debug)]
struct Failed {
    message: String,
    class: SinkErrorClass,
    /// Whether another attempt may succeed.
    retry: bool,
}

impl Failed {
    fn transient(message: String) -> Failed {
        Failed {
            message,
            class: SinkErrorClass::Transient,
            retry: true,
        }
    }

    fn definite(message: String) -> Failed {
        Failed {
            message,
            class: SinkErrorClass::Definite,
            retry: false,
        }
    }

    /// Rule 5: a newer producer took over.
    fn fenced(message: String) -> Failed {
        Failed {
            message,
            class: SinkErrorClass::Fenced,
            retry: false,
        }
    }
}

impl KafkaSink {
    /// Connects: makes the topics that are missing, checks the positions topic and, for
    /// `exactly_once`, starts the transactional producer, which fences every older producer of
    /// the same `transactional.id` and aborts its open transaction (so the position read next
    /// is final). Retried with the retry policy while the brokers do not answer.
    pub async fn open(settings: KafkaSettings, shaper: Shaper) -> Result<KafkaSink, SinkError> {
        let target = format!(
            "kafka {} topic '{}'",
            settings.connection.brokers, settings.topic
        );
        let fail = |failed: Failed| SinkError {
            sink: target.clone(),
            message: failed.message,
            class: failed.class,
        };
        let connection = &settings.connection;
        let exactly_once = settings.delivery == Delivery::ExactlyOnce;
        let made = |error: TopicError| match error {
            TopicError::Transient(message) => Failed::transient(message),
            TopicError::Definite(message) => Failed::definite(message),
        };
        retried(&settings.retry, &target, || async {
            connection
                .ensure_topic(&settings.topic, settings.topic_shape, false)
                .await
                .map_err(made)?;
            if exactly_once {
                connection
                    .ensure_topic(&settings.positions_topic, settings.topic_shape, true)
                    .await
                    .map_err(made)?;
            }
            Ok(())
        })
        .await
        .map_err(fail)?;
        let units = (exactly_once && settings.shared)
            .then(|| UnitProducers::new(&settings, &target).map(Box::new))
            .transpose()?;
        let (producer, transactions) = if exactly_once && !settings.shared {
            let transactions = Transactions::start(&settings, &target).await?;
            (transactions.producer.clone(), Some(transactions))
        } else {
            let producer = connection
                .producer(None)
                .map_err(|message| fail(Failed::definite(message)))?;
            (producer, None)
        };
        Ok(KafkaSink {
            producer,
            shaper,
            topic: settings.topic,
            target,
            retry: settings.retry,
            timeout: settings.connection.timeout,
            transactions,
            units,
            messages: Vec::new(),
            beside: Beside::new(),
        })
    }

    /// The transactions of an `exactly_once` sink, which its positions store writes through.
    pub(crate) fn transactions(&self) -> Option<&Transactions> {
        self.transactions.as_ref()
    }

    fn error(&self, failed: Failed) -> SinkError {
        SinkError {
            sink: self.target.clone(),
            message: failed.message,
            class: failed.class,
        }
    }

    /// Sends every message (and no position).
    async fn send_all(&self, messages: &[Message]) -> Result<(), Failed> {
        send_all(&self.producer, &self.topic, messages, ("", &[])).await
    }

    /// Rule 1: sends the batch and waits for the broker's acknowledgement of each message.
    async fn deliver(&self, messages: &[Message]) -> Result<(), Failed> {
        let deliveries = self.producer.context();
        // An earlier attempt's messages report first: their refusals are not this attempt's.
        deliveries.settle(self.timeout).await;
        deliveries.reset();
        self.send_all(messages).await?;
        if !deliveries.settle(self.timeout).await {
            return Err(Failed::transient(format!(
                "the brokers did not acknowledge the batch within {} s",
                self.timeout.as_secs()
            )));
        }
        match deliveries.refused() {
            Some(refusal) => Err(refused(&refusal.error, &refusal.key, refusal.size)),
            None => Ok(()),
        }
    }

    /// Rule 2: the batch and its position in one transaction.
    async fn commit(&self, messages: &[Message], staged: Option<&Staged>) -> Result<(), Failed> {
        let Some(transactions) = &self.transactions else {
            return Err(Failed::definite(
                "internal error: a transaction without a transactional producer".into(),
            ));
        };
        let position: Vec<Message> = staged.map(position_message).into_iter().collect();
        transactions
            .commit_batch(&self.topic, messages, &position)
            .await
    }

    /// The messages of `batch`'s records, in the room of the last batch's.
    fn shape(&mut self, batch: &Batch) -> Result<Vec<Message>, SinkError> {
        let mut messages = std::mem::take(&mut self.messages);
        messages.clear();
        let produced_ms = now_ms();
        for i in 0..batch.records.len() {
            let start = messages.len();
            let shaped = self
                .shaper
                .messages(&batch.records, i, produced_ms, batch.read_ms, &mut messages)
                .map_err(|message| self.error(Failed::definite(message)))?;
            if !self.beside.keeps(shaped, &messages[start].key) {
                messages.truncate(start);
            }
        }
        Ok(messages)
    }
}

impl Sink for KafkaSink {
    async fn write(&mut self, batch: &Batch, staged: Option<&Staged>) -> Result<(), SinkError> {
        if self.units.is_some() {
            return Err(self.error(Failed::definite(
                "internal error: a shared exactly_once kafka sink writes fenced batches only"
                    .into(),
            )));
        }
        if self.transactions.is_some()
            && let Some(staged) = staged
        {
            // Rule 7: the snapshot the batch's rows belong to, when one is open.
            self.beside.open(staged.snapshot_id());
        }
        let messages = self.shape(batch)?;
        let written = if self.transactions.is_some() {
            if messages.is_empty() && staged.is_none() {
                Ok(())
            } else {
                retried(&self.retry, &self.target, || self.commit(&messages, staged)).await
            }
        } else {
            retried(&self.retry, &self.target, || self.deliver(&messages)).await
        };
        self.messages = messages;
        written.map_err(|failed| self.error(failed))
    }

    fn describe(&self) -> String {
        self.target.clone()
    }

    fn fencing(&mut self) -> Option<&mut impl Fencing> {
        self.units.is_some().then_some(self)
    }

    /// Rule 7: `exactly_once` in one process, whose position tells the open snapshot.
    fn versioned(&self) -> Option<&impl Versioned> {
        self.transactions.is_some().then_some(self)
    }
}

impl Versioned for KafkaSink {}

impl Fencing for KafkaSink {
    async fn claim(&mut self, fence: &Fence) -> Result<Option<LeaseCheckpoint>, SinkError> {
        let Some(units) = &mut self.units else {
            return Err(self.error(Failed::definite(
                "internal error: a kafka sink without unit producers was claimed".into(),
            )));
        };
        units.claim(fence).await
    }

    async fn write_fenced(&mut self, batch: &Batch, fence: &Fence) -> Result<(), SinkError> {
        if fence.snapshot.is_some() || fence.beside.is_some() {
            return Err(self.error(Failed::definite(
                "internal error: a kafka sink keeps no shared snapshot".into(),
            )));
        }
        let messages = self.shape(batch)?;
        let written = match &mut self.units {
            Some(units) => units.commit(&self.topic, &messages, fence).await,
            None => Err(self.error(Failed::definite(
                "internal error: a kafka sink without unit producers was fenced".into(),
            ))),
        };
        self.messages = messages;
        written
    }
}

/// The position message of a staged entry: key the pipeline, value the entry's JSON.
fn position_message(staged: &Staged) -> Message {
    Message {
        key: staged.pipeline.as_bytes().to_vec(),
        value: Some(staged.entry.to_json().to_string().into_bytes()),
    }
}

/// Sends every message into `topic`, then the positions into partition 0 of their topic.
async fn send_all(
    producer: &Producer,
    topic: &str,
    messages: &[Message],
    (positions_topic, positions): (&str, &[Message]),
) -> Result<(), Failed> {
    for message in messages {
        send(producer, topic, None, message).await?;
    }
    for position in positions {
        send(producer, positions_topic, Some(0), position).await?;
    }
    Ok(())
}

/// Sends one message, waiting while the producer's queue is full; its report is counted by
/// the producer's [`Deliveries`](crate::client::Deliveries).
async fn send(
    producer: &Producer,
    topic: &str,
    partition: Option<i32>,
    message: &Message,
) -> Result<(), Failed> {
    loop {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).key(message.key.as_slice());
        if let Some(value) = &message.value {
            record = record.payload(value.as_slice());
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        match producer.send(record) {
            Ok(()) => {
                producer.context().sent();
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((error, _)) => {
                let size = message.key.len() + message.value.as_ref().map_or(0, Vec::len);
                return Err(refused(&error, &message.key, size));
            }
        }
    }
}

/// What a refused message means (rules 3 and 4): `key` and `size` (key and value bytes) are
/// the message's.
fn refused(error: &KafkaError, key: &[u8], size: usize) -> Failed {
    let key = String::from_utf8_lossy(key);
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize) => {
            Failed::definite(format!(
                "the message of the item with key {key} ({size} bytes) is over the size the \
                 broker or the client takes: raise the topic's max.message.bytes (and \
                 message.max.bytes in sink.properties)"
            ))
        }
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => Failed::definite(format!(
            "not authorized to write the topic: grant this client WRITE on it ({error})"
        )),
        Some(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed,
        ) => Failed::definite(format!(
            "not authorized to use the transactional id: grant WRITE on it ({error})"
        )),
        Some(
            RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced,
        ) => fenced(error),
        _ => Failed::transient(format!("sending the item with key {key} failed: {error}")),
    }
}

/// A transaction step's failure.
fn transaction_failure(what: &str, error: &KafkaError) -> Failed {
    if let KafkaError::Transaction(transaction) = error {
        if matches!(
            transaction.code(),
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
        ) {
            return fenced(error);
        }
        if transaction.is_fatal() {
            return Failed::definite(format!("{what}: {error}"));
        }
    }
    Failed::transient(format!("{what}: {error}"))
}

/// Rule 5.
fn fenced(error: &KafkaError) -> Failed {
    Failed::fenced(format!(
        "another worker took over: a newer producer with this pipeline's transactional.id \
         fenced this one ({error}); nothing of the batch is visible"
    ))
}

/// Runs a blocking librdkafka call on the blocking pool.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

/// Rule 3: `attempt` retried with `policy` while its failures may pass.
async fn retried<T, F, Fut>(policy: &RetryPolicy, target: &str, mut attempt: F) -> Result<T, Failed>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failed>>,
{
    let retrying = |n: u32, failed: &Failed, _delay| {
        tracing::debug!(sink = target, attempt = n + 1, error = %failed.message, "Kafka attempt failed; retrying.");
        ddbpipe_source::retry::note_retry("sink_transaction", &failed.message);
    };
    match policy
        .retry(
            Duration::MAX,
            &Cancel::never(),
            |failed: &Failed| failed.retry,
            retrying,
            |_| attempt(),
        )
        .await
    {
        Ok(answer) => Ok(answer),
        Err(GaveUp::Failed {
            mut error,
            attempts,
        }) => {
            if attempts > 1 {
                error.message = format!("{} (failed after {attempts} attempts)", error.message);
            }
            Err(error)
        }
        Err(GaveUp::Cancelled) => Err(Failed::definite("cancelled".into())),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Drops a unit's producer on the blocking pool: librdkafka's destroy waits for its threads.
fn blocking_drop(transactions: Transactions) {
    drop(tokio::task::spawn_blocking(move || drop(transactions)));
}
