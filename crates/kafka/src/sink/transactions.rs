//! The transactional producer of an `exactly_once` sink (rules 2 and 5 of `super`): one
//! transaction at a time, each batch's messages with its position; a step that times out is
//! resumed, a refused or fenced one aborted or left to the broker.
//!
//! # A step that times out
//! Before a timed-out commit or abort is resumed, the producer looks for a newer owner where
//! it would show, since a broker may keep a fenced producer's late step waiting instead of
//! refusing it (the tests' broker does, for the whole timeout, every time it is resumed):
//! - a unit's producer (`units` rule 5): the unit's position, written under a newer lease
//!   counter;
//! - the pipeline's producer (one process): the pipeline's position, holding a value this
//!   producer neither loaded nor wrote. Only another run's producer, started with the same
//!   `transactional.id` (which fenced this one), writes the key: this run is fenced.
//!
//! Either way the producer is fenced at once ([`SinkErrorClass::Fenced`]); a position that
//! cannot be read leaves the step resumed as before.

use std::sync::Arc;
use std::time::Duration;

use ddbpipe_pipeline::sink::{SinkError, SinkErrorClass};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer as _;

use super::{
    Failed, KafkaSettings, blocking, refused, retried, send_all, transaction_failure, units,
};
use crate::client::Producer;
use crate::envelope::Message;
use crate::log::LogReader;

/// How often a transaction's commit or abort is resumed after a retriable failure
/// ([`Transactions::resumed`]).
const RESUMES: u32 = 5;

/// The transactional producer of an `exactly_once` sink, shared with its positions store: one
/// transaction at a time.
#[derive(Clone)]
pub(crate) struct Transactions {
    pub(super) producer: Producer,
    turn: Arc<tokio::sync::Mutex<()>>,
    pub(crate) positions_topic: String,
    /// Bound of one transaction step.
    pub(crate) timeout: Duration,
    /// A unit's producer: where a newer owner's position would show (`units` rule 5).
    pub(super) owner: Option<Arc<units::UnitOwner>>,
    /// The pipeline's position as this producer knows it (module docs).
    own: Arc<std::sync::Mutex<OwnPosition>>,
    /// Reads the positions back (its own position checks, and the store's).
    pub(crate) reader: LogReader,
}

/// The pipeline's position as its producer knows it (module docs): the values of the
/// pipeline's key that are this run's.
#[derive(Debug, Default)]
struct OwnPosition {
    /// The pipeline's key in the positions topic; `None` until the run loaded its position.
    key: Option<Vec<u8>>,
    /// The value loaded or last committed (`None`: none stored).
    committed: Option<Vec<u8>>,
    /// The value the open (or last) transaction writes, when it writes the key.
    open: Option<Option<Vec<u8>>>,
    /// Values of transactions that failed since the last commit: a failed one may still
    /// have committed.
    failed: Vec<Option<Vec<u8>>>,
}

impl Transactions {
    /// The transactional producer of `settings`, started: every older producer of its
    /// `transactional.id` is fenced and its open transaction aborted (rule 5). Retried while
    /// the brokers do not answer.
    pub(crate) async fn start(
        settings: &KafkaSettings,
        target: &str,
    ) -> Result<Transactions, SinkError> {
        let reader = settings.positions_reader(target)?;
        Transactions::start_as(settings, &settings.transactional_id, reader, target).await
    }

    /// [`Transactions::start`] with `transactional_id` in place of the pipeline's (a unit's,
    /// rule 6) and the positions read back by `reader` (made once by the caller).
    pub(crate) async fn start_as(
        settings: &KafkaSettings,
        transactional_id: &str,
        reader: LogReader,
        target: &str,
    ) -> Result<Transactions, SinkError> {
        let fail = |failed: Failed| SinkError {
            sink: target.to_string(),
            message: failed.message,
            class: failed.class,
        };
        let producer = settings
            .connection
            .producer(Some(transactional_id))
            .map_err(|message| fail(Failed::definite(message)))?;
        let transactions = Transactions {
            producer,
            turn: Arc::new(tokio::sync::Mutex::new(())),
            positions_topic: settings.positions_topic.clone(),
            timeout: settings.connection.timeout,
            owner: None,
            own: Arc::default(),
            reader,
        };
        retried(&settings.retry, target, || transactions.init())
            .await
            .map_err(fail)?;
        Ok(transactions)
    }

    /// Starts the transactional producer (rule 5: fences older ones).
    async fn init(&self) -> Result<(), Failed> {
        let producer = self.producer.clone();
        let timeout = self.timeout;
        blocking(move || producer.init_transactions(timeout))
            .await
            .map_err(|e| transaction_failure("cannot start the transactional producer", &e))
    }

    fn begin(&self) -> Result<(), Failed> {
        self.producer
            .begin_transaction()
            .map_err(|e| transaction_failure("cannot begin a transaction", &e))
    }

    async fn commit(&self) -> Result<(), Failed> {
        // librdkafka's commit first flushes, and rdkafka's flush waits in steps of 100 ms for
        // reports the producer's own thread takes: wait for every report here instead, so the
        // flush finds none outstanding (measured: 103 ms → 17 ms a commit on the test broker).
        let deliveries = self.producer.context();
        if !deliveries.settle(self.timeout).await {
            return Err(Failed::transient(format!(
                "the brokers did not acknowledge the transaction's messages within {} s",
                self.timeout.as_secs()
            )));
        }
        // A refused message fails the transaction: it is aborted, never committed. Asking
        // librdkafka to commit it anyway can block for the whole timeout, every resume of it
        // (seen with a produce request refused as fenced: 150 s, past a stop's drain).
        if let Some(refusal) = deliveries.refused() {
            return Err(refused(&refusal.error, &refusal.key, refusal.size));
        }
        self.resumed(|producer, timeout| producer.commit_transaction(timeout))
            .await
            .map_err(|resumed| resumed.failure("the transaction did not commit"))
    }

    /// Runs a commit or an abort, calling it again while it fails retriably, up to
    /// [`RESUMES`] times: after a timeout librdkafka keeps the operation going and takes the
    /// same call to resume it, while any other call (an abort after a commit, a new
    /// transaction) conflicts with it.
    ///
    /// Before a resume the producer looks for a newer owner (module docs).
    async fn resumed(
        &self,
        call: fn(&Producer, Duration) -> Result<(), KafkaError>,
    ) -> Result<(), Resumed> {
        let mut resumes = 0;
        loop {
            let producer = self.producer.clone();
            let timeout = self.timeout;
            match blocking(move || call(&producer, timeout)).await {
                Err(KafkaError::Transaction(error))
                    if error.is_retriable() && resumes < RESUMES =>
                {
                    if let Some(fenced) = self.superseded().await {
                        return Err(Resumed::Superseded(fenced));
                    }
                    resumes += 1;
                    tracing::debug!(%error, resumes, "A transaction step timed out; resuming it.");
                }
                Ok(()) => return Ok(()),
                Err(error) => return Err(Resumed::Failed(error)),
            }
        }
    }

    /// Aborts the open transaction after `failed`; the failure to tell.
    async fn abort(&self, failed: Failed) -> Failed {
        // Rule 5: a fenced producer cannot abort (librdkafka may wait the whole timeout on
        // each try); the broker aborts its transaction as the newer producer starts.
        if failed.class == SinkErrorClass::Fenced {
            return failed;
        }
        match self
            .resumed(|producer, timeout| producer.abort_transaction(timeout))
            .await
        {
            Ok(()) => failed,
            Err(Resumed::Superseded(fenced)) => fenced,
            Err(Resumed::Failed(error)) => {
                let aborted = transaction_failure("the transaction could not be aborted", &error);
                Failed {
                    message: format!("{}; then {}", failed.message, aborted.message),
                    ..aborted
                }
            }
        }
    }

    /// `messages` into `topic` and `positions` (partition 0 of the positions topic) in one
    /// transaction, aborted when it fails (rules 2 and 3).
    pub(super) async fn commit_batch(
        &self,
        topic: &str,
        messages: &[Message],
        positions: &[Message],
    ) -> Result<(), Failed> {
        let _turn = self.turn.lock().await;
        let deliveries = self.producer.context();
        deliveries.reset();
        self.begin()?;
        self.writes(positions);
        let positions = (self.positions_topic.as_str(), positions);
        if let Err(failed) = send_all(&self.producer, topic, messages, positions).await {
            return Err(self.abort(failed).await);
        }
        if let Err(failed) = self.commit().await {
            // The message that was refused, when one was, says more than the commit.
            let failed = match deliveries.refused() {
                Some(refusal) => refused(&refusal.error, &refusal.key, refusal.size),
                None => failed,
            };
            return Err(self.abort(failed).await);
        }
        self.committed();
        Ok(())
    }

    /// A transaction holding only position messages (rule 2): a pipeline's, or the removals
    /// of its units' (`units` rule 2).
    pub(crate) async fn store_positions(&self, positions: &[Message]) -> Result<(), String> {
        self.commit_batch(&self.positions_topic, &[], positions)
            .await
            .map_err(|failed| failed.message)
    }
}

impl Transactions {
    /// The run loaded `value` as the pipeline's position, under `key` (module docs).
    pub(crate) fn loaded(&self, key: &[u8], value: Option<Vec<u8>>) {
        if let Ok(mut own) = self.own.lock() {
            *own = OwnPosition {
                key: Some(key.to_vec()),
                committed: value,
                ..OwnPosition::default()
            };
        }
    }

    /// A transaction begins that writes `positions`: the pipeline's value among them is this
    /// run's, whatever becomes of the transaction; so is the last one's, which did not commit.
    fn writes(&self, positions: &[Message]) {
        if let Ok(mut own) = self.own.lock()
            && let Some(key) = own.key.clone()
        {
            if let Some(unsure) = own.open.take() {
                own.failed.push(unsure);
            }
            own.open = positions
                .iter()
                .rev()
                .find(|message| message.key == key)
                .map(|message| message.value.clone());
        }
    }

    /// The open transaction committed: its value, if it wrote one, is the pipeline's position.
    fn committed(&self) {
        if let Ok(mut own) = self.own.lock()
            && let Some(value) = own.open.take()
        {
            own.committed = value;
            own.failed.clear();
        }
    }

    /// A newer owner, where it would show (module docs); `None` when there is none, or when
    /// the position cannot be read now.
    async fn superseded(&self) -> Option<Failed> {
        if let Some(owner) = &self.owner {
            return owner.superseded().await;
        }
        let (key, ours) = {
            let own = self.own.lock().ok()?;
            let mut ours = own.failed.clone();
            ours.extend(own.open.clone());
            ours.push(own.committed.clone());
            (own.key.clone()?, ours)
        };
        let stored = self
            .reader
            .last_committed(&self.positions_topic, 0, &key)
            .await
            .ok()?
            .and_then(|record| record.value)
            .map(|value| value.to_vec());
        (!ours.contains(&stored)).then(|| {
            Failed::fenced(format!(
                "another worker took over: the pipeline's position in topic '{}' was \
                 written by another producer since this run's last commit",
                self.positions_topic
            ))
        })
    }
}

/// How a resumed transaction step ended when it did not succeed.
enum Resumed {
    /// librdkafka's error.
    Failed(KafkaError),
    /// A newer owner of the unit wrote (`units` rule 5): fenced.
    Superseded(Failed),
}

impl Resumed {
    fn failure(self, what: &str) -> Failed {
        match self {
            Resumed::Failed(error) => transaction_failure(what, &error),
            Resumed::Superseded(fenced) => fenced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module docs' pipeline rule: a producer fenced by another run of its pipeline learns
    /// it from the pipeline's position, without the broker's word; its own values (loaded,
    /// committed, or of a transaction that failed) are not another run's.
    #[tokio::test]
    async fn a_pipeline_producer_learns_of_another_run_from_the_position() {
        let settings = super::super::tests_broker::exactly_once("runs", false).await;
        let position = |value: &str| Message {
            key: b"runs".to_vec(),
            value: Some(value.as_bytes().to_vec()),
        };
        let first = Transactions::start(&settings, "kafka").await.unwrap();
        first.loaded(b"runs", None);
        assert!(first.superseded().await.is_none(), "nothing stored yet");
        first.store_positions(&[position("1")]).await.unwrap();
        assert!(first.superseded().await.is_none(), "its own commit");
        // A transaction of its own that did not commit (here: never sent) stays its own.
        first.writes(&[position("2")]);
        assert!(first.superseded().await.is_none(), "its open transaction");

        let second = Transactions::start(&settings, "kafka").await.unwrap();
        second.loaded(b"runs", Some(b"1".to_vec()));
        second.store_positions(&[position("3")]).await.unwrap();
        let fenced = first
            .superseded()
            .await
            .expect("another producer wrote the key");
        assert_eq!(fenced.class, SinkErrorClass::Fenced);
        assert!(
            fenced.message.contains("another worker took over"),
            "{}",
            fenced.message
        );
        assert!(second.superseded().await.is_none(), "its own position");
    }
}
