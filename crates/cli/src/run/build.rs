//! The one build path under every run, whatever its mode and coordination: the clients and
//! what the table says ([`Read`]), then where the batches go and the position is kept
//! ([`Place`]: this process's destination and checkpointer, or one worker's sink and lease
//! table). [`Built::run`] then hands both to the runner of the mode.

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use ddbpipe_pipeline::checkpoint::Checkpointer;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::state::StateLock;
use ddbpipe_pipeline::state::identity::Location;
use ddbpipe_source::api::TableDescription;
use ddbpipe_source::aws::{self, AwsTableApi};
use ddbpipe_source::config::{Mode, SnapshotEngine, SourceConfig};
use ddbpipe_source::plan::{self, ResolvedStream};
use ddbpipe_source::position::ScanKind;
use ddbpipe_source::retry::Cancel;
use tracing::Instrument;

use super::join::{self, Joined};
use crate::args::ProgressMode;
use crate::config::PipelineConfig;
use crate::destination::{self, AnySink};
use crate::failure::{Failure, start_failure};
use crate::given::Given;
use crate::origin::Origin;
use crate::summary::Summary;
use crate::wiring::{self, describe};

/// A run built and ready to read: nothing is read or written before [`Built::run`].
pub(crate) struct Built<'a> {
    /// What the run is.
    pub run: Run<'a>,
    /// What it reads.
    pub read: Read,
    /// Where its batches go and its position is kept.
    pub place: Place,
    /// Stops the run.
    pub stop: Cancel,
}

/// The pipeline a run runs, and how it shows its progress.
#[derive(Clone, Copy)]
pub(crate) struct Run<'a> {
    /// The validated config.
    pub config: &'a PipelineConfig,
    /// Where the config came from: remedies say how to run it again.
    pub origin: &'a Origin,
    /// Whether a snapshot or scan draws a progress bar.
    pub progress: ProgressMode,
}

/// What a run reads, resolved before its destination opens.
pub(crate) struct Read {
    /// The SDK settings every client is built from.
    pub sdk: aws::SdkSettings,
    /// The table API (scans, snapshots, exports).
    pub table_api: Arc<AwsTableApi>,
    /// The table's description, when the run needs it: always for a scan or query.
    pub table: Option<TableDescription>,
    /// The stream a streams or mirror run reads.
    pub stream: Option<ResolvedStream>,
    /// Where the clients read, with what `DescribeTable` said.
    pub location: Location,
}

/// Where a run's batches go and its position is kept.
pub(crate) enum Place {
    /// This process alone: its destination and the checkpointer of its position.
    Alone(Box<Alone>),
    /// One worker of a shared run: its sink, its position in the lease rows.
    Worker(Box<Joined>),
}

/// A single process's destination: its sink, the checkpointer of its position, and the
/// pipeline's lock while it runs.
pub(crate) struct Alone {
    /// The sink.
    pub sink: AnySink,
    /// Where the position is committed.
    pub checkpointer: Checkpointer,
    _lock: Option<StateLock>,
}

impl<'a> Built<'a> {
    /// Builds the run of `config`: its clients, the table's description (and stream), then
    /// its destination and position (this process's, or this worker's in the lease table).
    pub async fn open(run: Run<'a>, given: &Given, stop: Cancel) -> Result<Built<'a>, Failure> {
        let config = run.config;
        let read = Read::open(config, given, &stop).await?;
        let records = match config.source.mode {
            Mode::Scan | Mode::Query => Records::Items,
            Mode::Streams | Mode::Mirror => Records::Envelopes,
        };
        let place = match &config.coordination {
            Some(coordination) => Place::Worker(Box::new(
                join::join(config, coordination, &read, records, &stop).await?,
            )),
            None => Place::Alone(Box::new(Alone::open(run, &read, records, given).await?)),
        };
        Ok(Built {
            run,
            read,
            place,
            stop,
        })
    }

    /// Runs what was built with the runner of its mode until it ends.
    pub async fn run(self) -> Result<Summary, Failure> {
        let Built {
            run,
            read,
            place,
            stop,
        } = self;
        let config = run.config;
        let span = run.span();
        let ran = async move {
            match (config.source.mode, place, &config.coordination) {
                (Mode::Scan | Mode::Query, Place::Alone(alone), _) => {
                    super::scan::run(run, read, *alone, stop).await
                }
                (Mode::Streams | Mode::Mirror, Place::Alone(alone), _) => {
                    super::streams::run(run, read, *alone, stop).await
                }
                (Mode::Scan | Mode::Query, Place::Worker(joined), Some(coordination)) => {
                    super::shared::run(run, coordination, read, *joined, stop).await
                }
                (Mode::Streams, Place::Worker(joined), Some(coordination)) => {
                    super::shared::run_streams(run, coordination, read, *joined, stop).await
                }
                (Mode::Mirror, Place::Worker(joined), Some(coordination)) => {
                    super::shared::run_mirror(run, coordination, read, *joined, stop).await
                }
                (_, Place::Worker(_), None) => Err(Failure::runtime(anyhow!(
                    "internal error: a worker's place without coordination"
                ))),
            }
        };
        ran.instrument(span).await
    }
}

impl Run<'_> {
    /// The span every log line of the run is in.
    pub fn span(&self) -> tracing::Span {
        let config = self.config;
        tracing::info_span!("run", pipeline = %config.name, table = %config.source.table_name)
    }
}

impl Read {
    /// The clients of `config` (the program's SDK configuration when it gave one), and what
    /// the run needs to know before it opens its destination: the table's description for a
    /// scan or query; for a stream or mirror its stream, resolved (the table described when
    /// the run needs it: the stream, or the key schema of a keyed or kafka sink or of
    /// snapshot rows; draining a configured `stream_arn` into jsonl needs no table), refusing
    /// a view type a keyed sink or a mirror cannot apply.
    async fn open(config: &PipelineConfig, given: &Given, stop: &Cancel) -> Result<Read, Failure> {
        let source = &config.source;
        let (sdk, table_api, mut location) = wiring::clients(source, given.sdk.as_ref()).await;
        let (table, stream) = match source.mode {
            Mode::Scan | Mode::Query => (Some(describe(&table_api, source, stop).await?), None),
            Mode::Streams | Mode::Mirror => {
                let (table, stream) = stream_of(config, &table_api, stop).await?;
                (table, Some(stream))
            }
        };
        if let Some(table) = &table {
            location.learn(table);
        }
        Ok(Read {
            sdk,
            table_api: Arc::new(table_api),
            table,
            stream,
            location,
        })
    }

    /// The table's description; a run that needs it has it (see [`Read::open`]).
    pub fn table(&self) -> Result<&TableDescription, Failure> {
        self.table.as_ref().ok_or_else(|| {
            Failure::runtime(anyhow!(
                "internal error: the run needs the table's description"
            ))
        })
    }

    /// The stream of a streams or mirror run.
    pub fn stream(&self) -> Result<&ResolvedStream, Failure> {
        self.stream
            .as_ref()
            .ok_or_else(|| Failure::runtime(anyhow!("internal error: the run reads no stream")))
    }
}

/// The table's description (when needed) and the stream of a streams or mirror run.
async fn stream_of(
    config: &PipelineConfig,
    table_api: &AwsTableApi,
    stop: &Cancel,
) -> Result<(Option<TableDescription>, ResolvedStream), Failure> {
    let source = &config.source;
    let mirror = source.mode == Mode::Mirror;
    let needs_new_images = config.sink.needs_new_images();
    let table = if config.sink.needs_key_schema() || mirror || source.stream_arn.is_none() {
        Some(describe(table_api, source, stop).await?)
    } else {
        None
    };
    let stream = match &table {
        Some(table) => plan::resolve_stream(source, table).map_err(Failure::runtime)?,
        // Without a table description the stream is the configured one (see above).
        None => plan::configured_stream(source).ok_or_else(|| {
            Failure::runtime(anyhow!(
                "internal error: no stream_arn and no table description"
            ))
        })?,
    };
    if (needs_new_images || mirror)
        && let Some(view) = stream.view_type.as_deref()
        && plan::lacks_new_images(view)
    {
        let who = if mirror {
            "mode: mirror".to_string()
        } else {
            format!("the {} sink", config.sink.kind())
        };
        return Err(Failure::usage(anyhow!(
            "config error: the stream of table '{}' has view type {view}; {who} needs NEW_IMAGE or NEW_AND_OLD_IMAGES",
            source.table_name
        ))
        .hint(plan::NEW_IMAGES_REMEDY));
    }
    if let Some(warning) = plan::view_warning(stream.view_type.as_deref()) {
        tracing::warn!("{warning}.");
    }
    Ok((table, stream))
}

impl Alone {
    /// Opens this process's destination (its sink and position store, under the pipeline's
    /// lock) and the checkpointer of its position, checking the position's identity.
    async fn open(
        run: Run<'_>,
        read: &Read,
        records: Records,
        given: &Given,
    ) -> Result<Alone, Failure> {
        let Run { config, origin, .. } = run;
        let source = &config.source;
        let destination = destination::open(
            config,
            origin,
            &read.sdk,
            read.table.as_ref(),
            records,
            given,
        )
        .await?;
        let identity = wiring::identity(config, &read.location, given.sink.as_ref());
        let interval = Duration::from_millis(config.state.flush_interval_ms);
        let checkpointer = match records {
            // The plan's segments: validation makes a query one segment (docs/config.md §1.3
            // rule 4).
            Records::Items => Checkpointer::open_scan(
                destination.store,
                &config.name,
                identity,
                scan_kind(source),
                source.segments,
                interval,
            )
            .await
            .map_err(|error| start_failure(error, origin))?
            .with_hand_out(given.driven.clone()),
            Records::Envelopes => {
                let checkpointer =
                    Checkpointer::open_streams(destination.store, &config.name, identity, interval)
                        .await
                        .map_err(|error| start_failure(error, origin))?
                        .with_cleanup(destination.cleanup)
                        .with_hand_out(given.driven.clone());
                if checkpointer.streams_position().is_some() && source.start_position.is_some() {
                    tracing::info!(
                        "start_position applies to the first run only; the stored position is used."
                    );
                }
                checkpointer
            }
        };
        Ok(Alone {
            sink: destination.sink,
            checkpointer,
            _lock: destination.lock,
        })
    }
}

/// What a scan-mode run reads: a query, an export's files (`snapshot.engine: export`,
/// docs/scan.md §2.10; one process only), or a parallel scan.
pub(crate) fn scan_kind(source: &SourceConfig) -> ScanKind {
    match (source.mode, source.snapshot.engine) {
        (Mode::Query, _) => ScanKind::Query,
        (_, SnapshotEngine::Export) => ScanKind::Export,
        (_, SnapshotEngine::Scan) => ScanKind::Scan,
    }
}
