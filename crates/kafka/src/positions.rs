//! The positions topic as a checkpoint store (docs/sinks.md §7.7, docs/state.md §6.1): where an
//! `exactly_once` Kafka sink keeps its pipelines' positions, committed with the batches.
//!
//! # Rules
//! 1. One message per write, in partition 0 of the compacted positions topic: the key is the
//!    pipeline's name, the value its entry's JSON (the state file's `pipelines.<name>`), a
//!    null value its removal (`state reset`, a scan that completed).
//! 2. A position is read from the partition's **committed** view (`log`): the last message of
//!    the pipeline's key whose transaction committed, the transaction markers applied by
//!    ddbpipe itself, so a position of an aborted transaction is never taken, whatever the
//!    broker's `read_committed` serves. Only the partition's last records are read, further
//!    back until the key's last committed message is among them (`log` rule 10). The sink started its transactional producer first,
//!    which aborted its predecessor's open transaction: the view is final for this pipeline.
//! 3. The entry is read as strictly as a state file's: one that is not an entry stops the run
//!    naming the topic and the pipeline, and nothing is written over it.
//! 4. A store commits with the batches ([`CheckpointStore::commits_with_batches`]): each
//!    batch's position rides in the batch's transaction (`sink` rule 2).

use std::path::Path;
use std::time::Duration;

use ddbpipe_pipeline::checkpoint::store::CheckpointStore;
use ddbpipe_pipeline::state::{Entry, StateError};
use futures_util::future::BoxFuture;

use crate::envelope::Message;
use crate::log::{Follower, LogReader, Security};
use ddbpipe_pipeline::sink::SinkError;

use crate::sink::units::position_prefix;
use crate::sink::{KafkaSettings, KafkaSink, Transactions};

/// The positions topic of an `exactly_once` Kafka sink.
#[derive(Clone)]
pub struct KafkaPositions {
    reader: LogReader,
    transactions: Option<Transactions>,
    topic: String,
    brokers: String,
}

impl std::fmt::Debug for KafkaPositions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaPositions({})", self.describe())
    }
}

impl KafkaPositions {
    /// The store written through `transactions`.
    pub(crate) fn new(brokers: &str, transactions: Transactions) -> KafkaPositions {
        let topic = transactions.positions_topic.clone();
        KafkaPositions {
            reader: transactions.reader.clone(),
            transactions: Some(transactions),
            topic,
            brokers: brokers.to_string(),
        }
    }

    /// The positions store of an `exactly_once` sink: the positions topic, written in the
    /// sink's transactions. `None` for `at_least_once` (the state file keeps the position).
    pub fn of(sink: &KafkaSink, brokers: &str) -> Option<KafkaPositions> {
        let transactions = sink.transactions()?.clone();
        Some(KafkaPositions::new(brokers, transactions))
    }

    /// The store of `settings` for writing outside a run (`state reset`): its transactional
    /// producer started, which fences a running run of the pipeline.
    pub async fn writer(settings: &KafkaSettings) -> Result<KafkaPositions, SinkError> {
        let target = format!(
            "kafka {} topic '{}'",
            settings.connection.brokers, settings.positions_topic
        );
        let transactions = Transactions::start(settings, &target).await?;
        Ok(KafkaPositions::new(
            &settings.connection.brokers,
            transactions,
        ))
    }

    /// A store that only reads (`state show`, `lag`, `check`), connecting as `security` says:
    /// writing through it fails.
    pub fn reading(
        brokers: &str,
        topic: &str,
        timeout: Duration,
        security: Security,
    ) -> KafkaPositions {
        KafkaPositions {
            reader: LogReader::new(brokers, timeout).with_security(security),
            transactions: None,
            topic: topic.to_string(),
            brokers: brokers.to_string(),
        }
    }

    /// How the positions topic `topic` on `brokers` is named in messages.
    pub fn label(brokers: &str, topic: &str) -> String {
        format!("kafka {brokers} topic '{topic}'")
    }

    fn failed(&self, message: String) -> StateError {
        StateError::Database {
            store: self.describe(),
            message,
        }
    }

    /// Rule 2: the last committed value of `pipeline`'s key; `Some(None)` for a removal.
    async fn last_committed(&self, pipeline: &str) -> Result<Option<Option<Vec<u8>>>, StateError> {
        let partitions = self
            .reader
            .partitions(&self.topic)
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        if partitions.is_none() {
            return Ok(None);
        }
        let last = self
            .reader
            .last_committed(&self.topic, 0, pipeline.as_bytes())
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        Ok(last.map(|record| record.value.map(|value| value.to_vec())))
    }
}

impl KafkaPositions {
    /// Removes every unit position of `pipeline` (a pipeline of several workers,
    /// `sink::units` rule 2): a null value for each key `<pipeline>/<unit>` whose last
    /// committed value is not one, in one transaction. Returns how many were removed. The
    /// whole committed view of the partition is read: the units are not known otherwise.
    pub async fn remove_units(&mut self, pipeline: &str) -> Result<usize, StateError> {
        let Some(transactions) = &self.transactions else {
            return Err(self
                .failed("internal error: this store only reads; a reset writes positions".into()));
        };
        if self
            .reader
            .partitions(&self.topic)
            .await
            .map_err(|e| self.failed(e.to_string()))?
            .is_none()
        {
            return Ok(0);
        }
        let mut follower = Follower::new(position_prefix(pipeline).as_bytes());
        self.reader
            .follow(&self.topic, 0, &mut follower)
            .await
            .map_err(|e| self.failed(e.to_string()))?;
        let mut removals: Vec<Message> = follower
            .records()
            .filter(|record| record.value.is_some())
            .filter_map(|record| record.key.as_ref())
            .map(|key| Message {
                key: key.to_vec(),
                value: None,
            })
            .collect();
        removals.sort_by(|a, b| a.key.cmp(&b.key));
        if removals.is_empty() {
            return Ok(0);
        }
        transactions
            .store_positions(&removals)
            .await
            .map_err(|message| self.failed(message))?;
        Ok(removals.len())
    }
}

impl CheckpointStore for KafkaPositions {
    fn describe(&self) -> String {
        KafkaPositions::label(&self.brokers, &self.topic)
    }

    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> BoxFuture<'a, Result<Option<Entry>, StateError>> {
        Box::pin(async move {
            let stored = self.last_committed(pipeline).await?.flatten();
            if let Some(transactions) = &self.transactions {
                // A timed-out step finds another run's position by it (`sink::transactions`).
                transactions.loaded(pipeline.as_bytes(), stored.clone());
            }
            let Some(value) = stored else {
                return Ok(None);
            };
            let store = self.describe();
            let json = serde_json::from_slice(&value).map_err(|error| StateError::Corrupt {
                path: Path::new(&store).to_owned(),
                location: format!("pipeline '{pipeline}'"),
                problem: format!("the position message is not JSON ({error})"),
            })?;
            Entry::from_json(&json, pipeline, Path::new(&store)).map(Some)
        })
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            let Some(transactions) = &self.transactions else {
                return Err(self.failed(
                    "internal error: this store only reads; a run writes positions".into(),
                ));
            };
            let message = Message {
                key: pipeline.as_bytes().to_vec(),
                value: entry.map(|entry| entry.to_json().to_string().into_bytes()),
            };
            transactions
                .store_positions(std::slice::from_ref(&message))
                .await
                .map_err(|message| self.failed(message))
        })
    }

    fn commits_with_batches(&self) -> bool {
        true
    }
}
