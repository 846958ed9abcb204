//! `exactly_once` with several workers (rule 6 of `super`; docs/coordination.md §11.13): one
//! transactional producer per leased unit, so Kafka itself fences a unit's earlier owner.
//!
//! # Rules
//! 1. **A producer per unit.** Its `transactional.id` is the pipeline's followed by `/` and the
//!    unit (`ddbpipe-orders/shard:shardId-…`): the same for every worker, so the producer a
//!    worker starts when it takes the unit's lease fences every earlier owner's, whose open
//!    transaction the broker aborts before the start returns.
//! 2. **The unit's position** is a message in partition 0 of the positions topic, keyed
//!    `<pipeline>/<unit>` (a pipeline's own key has no `/`), its value
//!    `{"counter": <lease counter>, "checkpoint": "<the lease checkpoint's text>"}`, committed
//!    in the transaction of the batch that reaches it; a null value (a tombstone) is its
//!    removal (`state reset`).
//! 3. **A claim** starts the unit's producer, then reads the unit's last committed position
//!    (the committed view): final, since the start fenced the earlier owners. The worker
//!    follows partition 0 of the positions topic for its pipeline's keys (`log` rule 11), so
//!    a claim reads what was written since its previous read, not the partition's history:
//!    a unit never written (a new shard) costs no read back to the partition's start.
//!    A position stored under a newer lease counter refuses the claim
//!    ([`SinkErrorClass::Fenced`]): a newer owner wrote, this holding is stale.
//! 4. **A batch** of a unit commits on the unit's producer with the position it reaches. A
//!    producer fenced by a newer one refuses it with nothing visible
//!    ([`SinkErrorClass::Fenced`]) and is dropped; so is the producer of a unit whose batch
//!    reached the unit's end (its lease is finished).
//! 5. **A commit or abort that times out** reads the unit's position before it is resumed: one
//!    stored under a newer lease counter than the producer's means a newer owner started and
//!    committed, so the producer is fenced ([`SinkErrorClass::Fenced`]) even where the broker
//!    keeps the late transaction step waiting instead of refusing it (seen with the tests'
//!    broker: a worker stopped past its lease, continued, waited out every resume).

use std::collections::HashMap;
use std::sync::Arc;

use ddbpipe_pipeline::sink::{Fence, SinkError, SinkErrorClass};
use ddbpipe_source::lease::UnitId;
use ddbpipe_source::position::LeaseCheckpoint;

use super::{Failed, KafkaSettings, Transactions, blocking_drop, retried};
use crate::envelope::Message;
use crate::log::{Follower, LogReader};

/// The producers of the units this worker holds.
pub(crate) struct UnitProducers {
    settings: KafkaSettings,
    target: String,
    reader: LogReader,
    /// The pipeline's unit positions as last read (rule 3), made at the first claim.
    follower: Option<Arc<tokio::sync::Mutex<Follower>>>,
    held: HashMap<UnitId, Transactions>,
}

/// Where a unit producer's newer owner shows (rule 5): the unit's position, and the lease
/// counter the producer was claimed under.
pub(super) struct UnitOwner {
    reader: LogReader,
    follower: Arc<tokio::sync::Mutex<Follower>>,
    topic: String,
    key: String,
    unit: UnitId,
    counter: u64,
}

impl UnitOwner {
    /// The unit's last committed position (rule 3), read from the positions topic.
    async fn stored(&self) -> Result<Option<StoredPosition>, Failed> {
        let mut follower = self.follower.lock().await;
        self.reader
            .follow(&self.topic, 0, &mut follower)
            .await
            .map_err(|e| Failed::transient(format!("cannot read the unit's position: {e}")))?;
        let last = follower.last(self.key.as_bytes());
        let Some(value) = last.and_then(|record| record.value.clone()) else {
            return Ok(None);
        };
        serde_json::from_slice(&value).map(Some).map_err(|e| {
            Failed::definite(format!(
                "the position of unit {} in topic '{}' is not a unit position ({e}): run \
                 `ddbpipe state reset` once no worker runs",
                self.unit, self.topic
            ))
        })
    }

    /// Rules 3 and 5: the failure to tell when `stored` was written under a newer lease
    /// counter than this producer's.
    fn newer(&self, stored: &StoredPosition) -> Option<Failed> {
        (stored.counter > self.counter).then(|| {
            Failed::fenced(format!(
                "another worker took over: unit {} was written under lease counter {}, newer \
                 than this worker's {}",
                self.unit, stored.counter, self.counter
            ))
        })
    }

    /// Rule 5: [`UnitOwner::newer`] on the position read now; `None` as well when it cannot
    /// be read now (the step is resumed as before).
    pub(super) async fn superseded(&self) -> Option<Failed> {
        self.newer(&self.stored().await.ok()??)
    }
}

/// A unit's stored position (rule 2).
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct StoredPosition {
    counter: u64,
    checkpoint: String,
}

impl UnitProducers {
    /// No producer yet: each starts with its unit's claim.
    pub(crate) fn new(settings: &KafkaSettings, target: &str) -> Result<Self, SinkError> {
        Ok(UnitProducers {
            settings: settings.clone(),
            target: target.to_string(),
            reader: settings.positions_reader(target)?,
            follower: None,
            held: HashMap::new(),
        })
    }

    fn error(&self, failed: Failed) -> SinkError {
        SinkError {
            sink: self.target.clone(),
            message: failed.message,
            class: failed.class,
        }
    }

    /// Rule 3.
    pub(crate) async fn claim(
        &mut self,
        fence: &Fence,
    ) -> Result<Option<LeaseCheckpoint>, SinkError> {
        self.drop_producer(&fence.unit);
        let id = unit_transactional_id(&self.settings.transactional_id, &fence.unit);
        let mut transactions =
            Transactions::start_as(&self.settings, &id, self.reader.clone(), &self.target).await?;
        let follower = self.follower.get_or_insert_with(|| {
            let prefix = position_prefix(&fence.pipeline);
            Arc::new(tokio::sync::Mutex::new(Follower::new(prefix.as_bytes())))
        });
        let owner = UnitOwner {
            reader: self.reader.clone(),
            follower: Arc::clone(follower),
            topic: self.settings.positions_topic.clone(),
            key: position_key(&fence.pipeline, &fence.unit),
            unit: fence.unit.clone(),
            counter: fence.counter,
        };
        let stored = retried(&self.settings.retry, &self.target, || owner.stored())
            .await
            .map_err(|failed| self.error(failed))?;
        if let Some(fenced) = stored.as_ref().and_then(|stored| owner.newer(stored)) {
            blocking_drop(transactions);
            return Err(self.error(fenced));
        }
        transactions.owner = Some(std::sync::Arc::new(owner));
        self.held.insert(fence.unit.clone(), transactions);
        Ok(stored.map(|stored| fence.unit.checkpoint(&stored.checkpoint)))
    }

    /// Rule 4: `messages` into `topic` with the unit's position, in one transaction.
    pub(crate) async fn commit(
        &mut self,
        topic: &str,
        messages: &[Message],
        fence: &Fence,
    ) -> Result<(), SinkError> {
        let Some(transactions) = self.held.get(&fence.unit) else {
            return Err(self.error(Failed::definite(format!(
                "internal error: unit {} written before its claim",
                fence.unit
            ))));
        };
        let position: Vec<Message> = fence
            .position
            .iter()
            .map(|at| position_message(&fence.pipeline, &fence.unit, fence.counter, at))
            .collect();
        if messages.is_empty() && position.is_empty() {
            return Ok(());
        }
        let committed = retried(&self.settings.retry, &self.target, || {
            transactions.commit_batch(topic, messages, &position)
        })
        .await;
        let ended = fence
            .position
            .as_ref()
            .is_some_and(LeaseCheckpoint::is_finished);
        match committed {
            Ok(()) => {
                if ended {
                    self.drop_producer(&fence.unit);
                }
                Ok(())
            }
            Err(failed) => {
                if failed.class == SinkErrorClass::Fenced {
                    self.drop_producer(&fence.unit);
                }
                Err(self.error(failed))
            }
        }
    }

    fn drop_producer(&mut self, unit: &UnitId) {
        if let Some(transactions) = self.held.remove(unit) {
            blocking_drop(transactions);
        }
    }
}

/// Rule 1.
pub(crate) fn unit_transactional_id(pipeline_id: &str, unit: &UnitId) -> String {
    format!("{pipeline_id}/{unit}")
}

/// Rule 2: the key of `unit`'s position.
pub(crate) fn position_key(pipeline: &str, unit: &UnitId) -> String {
    format!("{}{unit}", position_prefix(pipeline))
}

/// Rule 2: how the keys of a pipeline's unit positions begin.
pub(crate) fn position_prefix(pipeline: &str) -> String {
    format!("{pipeline}/")
}

/// Rule 2: the message storing `unit`'s position `at`, reached under lease `counter`.
fn position_message(pipeline: &str, unit: &UnitId, counter: u64, at: &LeaseCheckpoint) -> Message {
    let stored = StoredPosition {
        counter,
        checkpoint: at.encode(),
    };
    Message {
        key: position_key(pipeline, unit).into_bytes(),
        value: Some(serde_json::to_vec(&stored).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(unit: &UnitId, counter: u64, at: Option<&str>) -> Fence {
        Fence {
            pipeline: "owners".to_string(),
            unit: unit.clone(),
            counter,
            position: at.map(|text| unit.checkpoint(text)),
            snapshot: None,
            beside: None,
            of: None,
            repair: None,
        }
    }

    /// Rule 5: a unit producer whose unit a newer owner committed under a higher lease counter
    /// learns it from the position, without the broker's word; the newer owner's does not.
    #[tokio::test]
    async fn a_producer_learns_of_a_newer_owner_from_the_units_position() {
        let settings = super::super::tests_broker::exactly_once("owners", true).await;
        let topic = settings.topic.clone();
        let unit: UnitId = "shard:shardId-00000001".parse().unwrap();
        let mut first = UnitProducers::new(&settings, "kafka").unwrap();
        first.claim(&fence(&unit, 1, None)).await.unwrap();
        let owner = |producers: &UnitProducers| producers.held[&unit].owner.clone().unwrap();
        assert!(
            owner(&first).superseded().await.is_none(),
            "nothing stored yet"
        );

        let mut second = UnitProducers::new(&settings, "kafka").unwrap();
        second.claim(&fence(&unit, 2, None)).await.unwrap();
        second
            .commit(&topic, &[], &fence(&unit, 2, Some("after:5")))
            .await
            .unwrap();

        let fenced = owner(&first)
            .superseded()
            .await
            .expect("counter 2 is newer than 1");
        assert_eq!(fenced.class, SinkErrorClass::Fenced);
        assert!(
            fenced.message.contains("lease counter 2"),
            "{}",
            fenced.message
        );
        assert!(
            owner(&second).superseded().await.is_none(),
            "its own position"
        );
    }

    #[test]
    fn a_units_position_reads_back_as_its_checkpoint() {
        let unit: UnitId = "shard:shardId-0001".parse().unwrap();
        let at = unit.checkpoint("after:000000000000000000123");
        let message = position_message("orders", &unit, 7, &at);
        assert_eq!(message.key, b"orders/shard:shardId-0001");
        let value = message.value.unwrap();
        assert_eq!(
            String::from_utf8(value.clone()).unwrap(),
            r#"{"counter":7,"checkpoint":"after:000000000000000000123"}"#
        );
        let stored: StoredPosition = serde_json::from_slice(&value).unwrap();
        assert_eq!(unit.checkpoint(&stored.checkpoint), at);
        assert_eq!(
            unit_transactional_id("ddbpipe-orders", &unit),
            "ddbpipe-orders/shard:shardId-0001"
        );
    }
}
