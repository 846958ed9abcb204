//! The library's entry point: a [`Pipeline`] built from the YAML the command reads, run to a
//! [`Summary`] or an [`Error`]. `ddbpipe run` is this, with the command's output around it
//! (progress bars, metrics, exit codes).

use std::fmt;
use std::num::NonZeroUsize;
use std::path::Path;
use std::pin::Pin;

use ddbpipe_source::retry::Cancel;

pub use crate::args::ProgressMode;
use crate::config::load_failure;
use crate::config::{self, LoadError, PipelineConfig};
use crate::drive::Batches;
pub use crate::error::{Error, ErrorKind};
use crate::failure::Failure;
use crate::given::Given;
use crate::origin::Origin;
use crate::run::Built;
use crate::sink::{GivenSink, Sink};
use crate::store::{CheckpointStore, GivenStore};
pub use crate::summary::{Ended, Summary};

/// A pipeline ready to run: its config parsed and validated.
///
/// Built from a pipeline file ([`Pipeline::from_path`]) or from YAML text
/// ([`Pipeline::from_yaml`]); `${VAR}` references are taken from the process's environment.
/// Running it does what `ddbpipe run` of the same file does, in every mode: scan, query,
/// streams and mirror, one process or one worker of several (`coordination:`), export
/// snapshots, repairs.
#[derive(Debug, Clone)]
pub struct Pipeline {
    config: PipelineConfig,
    /// The file the config came from (relative paths in it were taken from its directory),
    /// or YAML given in code: remedies say how to run it again in the caller's words.
    origin: Origin,
    progress: ProgressMode,
    /// The sink and the checkpoint store given in code.
    given: Given,
    /// Batches a driven run holds ([`Pipeline::batches`]).
    window: NonZeroUsize,
}

impl Pipeline {
    /// Reads, parses and validates the pipeline file at `path`. Every problem of the file is
    /// in the one error ([`Error::config_errors`]), as `ddbpipe check` lists them.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Pipeline, Error> {
        let path = path.as_ref();
        let env = |name: &str| std::env::var(name).ok();
        let origin = Origin::File(path.to_owned());
        let config =
            config::load(path, &env).map_err(|error| Error(load_failure(error, &origin)))?;
        Ok(Pipeline::of(config, origin))
    }

    /// Parses and validates a pipeline from YAML text; relative paths in it (a jsonl file, a
    /// SQLite database, a state file) are taken from `dir`.
    pub fn from_yaml(yaml: &str, dir: impl AsRef<Path>) -> Result<Pipeline, Error> {
        let env = |name: &str| std::env::var(name).ok();
        let config = config::parse(yaml, dir.as_ref(), &env)
            .map_err(|errors| Error(load_failure(LoadError::Invalid(errors), &Origin::Code)))?;
        Ok(Pipeline::of(config, Origin::Code))
    }

    fn of(config: PipelineConfig, origin: Origin) -> Pipeline {
        Pipeline {
            config,
            origin,
            progress: ProgressMode::Never,
            given: Given::default(),
            window: crate::drive::DEFAULT_WINDOW,
        }
    }

    /// Writes the pipeline's records into `sink` (docs/sinks.md §7.5): the config's sink must
    /// be `{type: custom}`, its position is kept in the state file (`state:`). Each run of the
    /// pipeline writes into this one sink.
    pub fn with_sink(mut self, sink: impl Sink) -> Pipeline {
        self.given.sink = Some(GivenSink::new(sink));
        self
    }

    /// Keeps the pipeline's position in `store` instead of the state file (docs/state.md
    /// §6.7): for a jsonl or custom sink in one process (a keyed sink keeps its position in its
    /// database, a shared run in its lease rows: such a run is refused).
    pub fn with_checkpoint_store(mut self, store: impl CheckpointStore) -> Pipeline {
        self.given.store = Some(GivenStore::new(store));
        self
    }

    /// Builds every AWS client of the run (DynamoDB, Streams, S3 for exports, the lease
    /// table) from the program's own SDK configuration: its region, credentials, endpoint and
    /// HTTP client take the place of the source's `region`, `credentials` and `endpoint_url`.
    /// ddbpipe turns the SDK's own retries off and sets its connect timeout on its copy: its
    /// retry layer decides (docs/errors.md §9).
    pub fn with_sdk_config(mut self, sdk: ddbpipe_source::aws::SdkSettings) -> Pipeline {
        self.given.sdk = Some(sdk);
        self
    }

    /// Holds at most `batches` batches in a run driven through [`Pipeline::batches`]: handed
    /// out and not yet committed (default [`drive::DEFAULT_WINDOW`], 16). While they are all
    /// held, reading waits.
    ///
    /// [`drive::DEFAULT_WINDOW`]: crate::drive::DEFAULT_WINDOW
    pub fn with_ack_window(mut self, batches: NonZeroUsize) -> Pipeline {
        self.window = batches;
        self
    }

    /// Draws a progress bar on stderr while a snapshot or scan runs (default: never).
    pub fn with_progress(mut self, progress: ProgressMode) -> Pipeline {
        self.progress = progress;
        self
    }

    /// The pipeline's name (`name:`), which keys its stored position.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The table it reads; empty for a file of several tables (`source.tables`), whose
    /// tables are read by the pipelines of [`Pipeline::tables`].
    pub fn table(&self) -> &str {
        &self.config.source.table_name
    }

    /// The pipelines that read its tables: itself for one table (`source.table_name`); for a
    /// file of several (`source.tables`, or the tables `source.discover` finds now: docs/
    /// config.md §1.5), one per table, in the list's order (found ones by name), each named
    /// `<name>:<table>` with a position of its own and `{table}` filled in. Each one runs on
    /// its own; `ddbpipe run` runs them at once. A discovery that finds no table is an error.
    pub async fn tables(&self) -> Result<Vec<Pipeline>, Error> {
        let tables = crate::discover::each_table(&self.config)
            .await
            .map_err(Error)?;
        Ok(tables
            .into_iter()
            .map(|config| Pipeline {
                config,
                ..self.clone()
            })
            .collect())
    }

    /// A pipeline of several tables is run through [`Pipeline::tables`]: each table's
    /// outcome is its own.
    fn one_table(&self) -> Result<(), Error> {
        if !self.config.is_multi_table() {
            return Ok(());
        }
        Err(Error(Failure::usage(anyhow::anyhow!(
            "pipeline '{}' reads several tables (source.tables or source.discover): run each \
             of Pipeline::tables(), as `ddbpipe run` does",
            self.config.name,
        ))))
    }

    /// Fields that are valid but have no effect in the pipeline's mode, one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.config.warnings
    }

    /// Runs the pipeline until it ends: a scan or query when every segment is read, a stream
    /// at its end condition, any of them when `stop` is cancelled (its progress saved, so a
    /// later run resumes: [`Summary::ended`] says [`Ended::Stopped`]). The same as
    /// [`Pipeline::open`], then [`Opened::run`].
    ///
    /// The future is `Send`: it may be spawned on a multi-threaded runtime.
    pub async fn run(&self, stop: Cancel) -> Result<Summary, Error> {
        self.open(stop).await?.run().await
    }

    /// Builds the run without reading anything: makes the AWS clients, describes the table
    /// (and resolves its stream), opens the destination — the sink, the pipeline's lock, the
    /// position store — and loads the stored position, checking that it was made by this
    /// pipeline (or joins the lease table as one worker). A problem any of these finds comes
    /// back now, before a record is read; [`Opened::run`] then reads and writes.
    ///
    /// The future is `Send`.
    pub async fn open(&self, stop: Cancel) -> Result<Opened<'_>, Error> {
        self.one_table()?;
        // Boxed: the futures are deep; a caller's crate must not need a recursion limit to
        // lay out its own future around them.
        let opening: Pin<Box<dyn Future<Output = Result<Built<'_>, Failure>> + Send + '_>> =
            Box::pin(crate::run::open(
                &self.config,
                &self.origin,
                &self.given,
                self.progress,
                stop,
            ));
        opening.await.map(Opened).map_err(Error)
    }

    /// Starts the pipeline and hands its batches to your own loop (docs/state.md §6.9): each
    /// [`drive::Batch`] is done when you call [`drive::Batch::ack`], in any order, and the
    /// position saved is the acknowledged prefix of each segment and shard. The run is the one
    /// [`Pipeline::run`] does with a custom sink, in every mode of one process; the config's
    /// sink must be `{type: custom}` (without [`Pipeline::with_sink`]). It is opened as
    /// [`Pipeline::open`] opens it, so what that finds comes back here, before a record is
    /// read. `stop` stops it: the batches then end, and [`drive::Batches::finish`] returns the
    /// summary.
    ///
    /// Must be called within a Tokio runtime: the run is spawned on it.
    ///
    /// [`drive::Batch`]: crate::drive::Batch
    /// [`drive::Batch::ack`]: crate::drive::Batch::ack
    /// [`drive::Batches::finish`]: crate::drive::Batches::finish
    pub async fn batches(&self, stop: Cancel) -> Result<Batches, Error> {
        self.one_table()?;
        Batches::start(
            &self.config,
            &self.origin,
            &self.given,
            self.progress,
            self.window,
            stop,
        )
        .await
    }

    /// The validated config (the command's own use).
    pub(crate) fn config(&self) -> &PipelineConfig {
        &self.config
    }
}

/// A pipeline whose run is built ([`Pipeline::open`]): its clients, its destination and its
/// position are open, nothing is read yet. Dropping it releases the pipeline's lock.
pub struct Opened<'a>(Built<'a>);

impl Opened<'_> {
    /// Reads, writes and commits until the run ends, as [`Pipeline::run`] says; the `stop`
    /// given to [`Pipeline::open`] stops it.
    ///
    /// The future is `Send`.
    pub async fn run(self) -> Result<Summary, Error> {
        let running: Pin<Box<dyn Future<Output = Result<Summary, Failure>> + Send + '_>> =
            Box::pin(self.0.run());
        running.await.map_err(Error)
    }
}

impl fmt::Debug for Opened<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("pipeline", &self.0.run.config.name)
            .finish_non_exhaustive()
    }
}
