//! Bring your own checkpoint store (docs/state.md §6.7): where a pipeline's position lives when
//! the program keeps it (its own database, a key-value service), given with
//! [`Pipeline::with_checkpoint_store`] in place of the state file. Two methods: read a
//! pipeline's [`Checkpoint`], replace it.
//!
//! [`Pipeline::with_checkpoint_store`]: crate::Pipeline::with_checkpoint_store

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use ddbpipe_pipeline::checkpoint::store::CheckpointStore as Store;
use ddbpipe_pipeline::state::{Entry, StateError};
use tokio::sync::Mutex;

/// Where a pipeline's position is kept.
///
/// The store keeps one [`Checkpoint`] per pipeline name, as an opaque text
/// ([`Checkpoint::as_json`]); a run reads it once at its start and replaces it after each
/// acknowledged batch (at most every `state.flush_interval_ms`) and at its end. A store that
/// loses a write loses nothing but progress: the run resumes from the checkpoint it last
/// stored, at least once. One run of a pipeline at a time: ddbpipe takes no lock in a store it
/// was given.
pub trait CheckpointStore: Send + Sync + 'static {
    /// Names the store for messages ("orders-db table positions").
    fn describe(&self) -> String;

    /// The checkpoint stored for `pipeline`; `None` when there is none (a first run).
    fn load(
        &mut self,
        pipeline: &str,
    ) -> impl Future<Output = Result<Option<Checkpoint>, StoreError>> + Send;

    /// Replaces `pipeline`'s checkpoint; `None` removes it (a scan that completed).
    fn store(
        &mut self,
        pipeline: &str,
        checkpoint: Option<&Checkpoint>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A pipeline's position with the identity of what it reads (docs/state.md §6.2): an opaque
/// JSON text to keep as it is ([`Checkpoint::as_json`]) and give back as it was
/// ([`Checkpoint::from_json`]). It is the entry a state file holds under `pipelines.<name>`;
/// the run reads it strictly, so a text that is not one stops the run naming the store and
/// what is wrong, and nothing is overwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint(String);

impl Checkpoint {
    /// The text to keep.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// The checkpoint a kept text holds.
    pub fn from_json(text: impl Into<String>) -> Checkpoint {
        Checkpoint(text.into())
    }
}

/// A store that failed: the run stops, and the checkpoint stored before stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    message: String,
}

impl StoreError {
    /// A failure, said in `message`.
    pub fn new(message: impl Into<String>) -> StoreError {
        StoreError {
            message: message.into(),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

/// A future of a store.
type Stored<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A [`CheckpointStore`] behind a pointer.
trait ErasedStore: Send + Sync {
    fn load<'a>(&'a mut self, pipeline: &'a str) -> Stored<'a, Option<Checkpoint>>;
    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        checkpoint: Option<&'a Checkpoint>,
    ) -> Stored<'a, ()>;
}

impl<S: CheckpointStore> ErasedStore for S {
    fn load<'a>(&'a mut self, pipeline: &'a str) -> Stored<'a, Option<Checkpoint>> {
        Box::pin(CheckpointStore::load(self, pipeline))
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        checkpoint: Option<&'a Checkpoint>,
    ) -> Stored<'a, ()> {
        Box::pin(CheckpointStore::store(self, pipeline, checkpoint))
    }
}

/// The store a program gave a pipeline, shared by the pipeline's runs (one at a time).
#[derive(Clone)]
pub(crate) struct GivenStore {
    store: Arc<Mutex<Box<dyn ErasedStore>>>,
    name: String,
}

impl GivenStore {
    pub(crate) fn new(store: impl CheckpointStore) -> GivenStore {
        GivenStore {
            name: store.describe(),
            store: Arc::new(Mutex::new(Box::new(store))),
        }
    }

    /// `pipeline`'s entry in the text `checkpoint`, read as strictly as a state file's.
    fn entry(&self, pipeline: &str, checkpoint: &Checkpoint) -> Result<Entry, StateError> {
        let path = Path::new(&self.name);
        let json =
            serde_json::from_str(checkpoint.as_json()).map_err(|error| StateError::Corrupt {
                path: path.to_owned(),
                location: format!("pipeline '{pipeline}'"),
                problem: format!("the checkpoint is not JSON ({error})"),
            })?;
        Entry::from_json(&json, pipeline, path)
    }

    fn failed(&self, error: StoreError) -> StateError {
        StateError::Database {
            store: self.name.clone(),
            message: error.message,
        }
    }
}

impl fmt::Debug for GivenStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GivenStore({})", self.name)
    }
}

/// A given store is apart from the records, as the state file is: no rows to clean up when a
/// snapshot or a repair window closes, only the entry to write (it does not implement `WithRows`).
impl Store for GivenStore {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn load<'a>(
        &'a mut self,
        pipeline: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Entry>, StateError>> + Send + 'a>> {
        Box::pin(async move {
            let loaded = self.store.lock().await.load(pipeline).await;
            match loaded.map_err(|error| self.failed(error))? {
                Some(checkpoint) => self.entry(pipeline, &checkpoint).map(Some),
                None => Ok(None),
            }
        })
    }

    fn store<'a>(
        &'a mut self,
        pipeline: &'a str,
        entry: Option<&'a Entry>,
    ) -> Pin<Box<dyn Future<Output = Result<(), StateError>> + Send + 'a>> {
        Box::pin(async move {
            let checkpoint = entry.map(|entry| Checkpoint(entry.to_json().to_string()));
            let stored = self
                .store
                .lock()
                .await
                .store(pipeline, checkpoint.as_ref())
                .await;
            stored.map_err(|error| self.failed(error))
        })
    }
}
