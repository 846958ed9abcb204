//! A shared mirror's snapshots, one after another (docs/coordination.md §11.12 rule 8): when a
//! worker finds that its snapshot cannot be completed or kept up — a gap in the stream with
//! `on_gap: resnapshot`, a damaged export file — it opens a snapshot of the next generation in
//! place of its own, and every worker moves to it.
//!
//! # Rules
//! 1. **One record, one generation at a time.** The destination's record names the snapshot
//!    every worker reads; a new one replaces it in one transaction that locks the record and
//!    succeeds only while the record is still the replaced snapshot's
//!    ([`SharedSnapshots::reopen_shared_snapshot`]): of workers finding the same gap, the first
//!    one's snapshot is kept and the others move to it.
//! 2. **A generation's leases are new.** They are kept under the generation's own name
//!    ([`SharedSnapshot::lease_pipeline`]), in the lease table and the fence table: nothing of
//!    an earlier generation (a segment `Done`, a shard's position, a fence's counter) is taken
//!    for its own, and a worker that crashes between the record's replacement and its first
//!    lease finds an empty generation, which its leader fills: segments from the start, shards
//!    from their trim horizon, as a first snapshot's.
//! 3. **An earlier generation writes nothing.** Every batch names its generation's snapshot
//!    (`Fence::of`, its snapshot rows `Fence::snapshot`) and is refused once the record is
//!    another's, so a worker still reading the replaced snapshot, or a zombie of it, cannot
//!    write an old image or change over the new snapshot's rows.
//! 4. **Moving.** Each worker reads the record every `watch_interval`; once it names another
//!    snapshot, the worker stops its generation as a signal would (the leases handed back
//!    with their checkpoints) and runs the new one. The worker that replaced it moves at once,
//!    and so does one whose generation failed after it was replaced (its close refused).
//! 5. **What replaces a snapshot.** A gap (a position the stream no longer holds, a listed
//!    shard whose parent expired unread, a row unread past the staleness limit) with
//!    `on_gap: resnapshot`; without it the gap fails the worker as before. A damaged or
//!    missing export file, whatever `on_gap` says, once: a snapshot that replaced a damaged
//!    export and meets another fails the worker naming the file (as one process abandons a
//!    damaged export once, docs/scan.md §2.10).
//! 6. A signal ends the worker in whatever generation it is, one that comes as its generation
//!    ends on what rule 5 names or as it finds the record replaced too
//!    ([`StreamRunError::ReplacementInterrupted`]: nothing replaced, the leases handed back,
//!    the next run replaces the snapshot or moves); a failure that is none of rule 5 fails it.
//! 7. **A repair is generations too.** With `on_gap: repair`, a gap that can be repaired
//!    replaces the snapshot by a generation that applies the gap's changes from an incremental
//!    export instead of reading the table, a generation per window of at most 24 h; once a
//!    window is applied and closed, the next window's replaces it (`super::repair`; docs/
//!    coordination.md §11.12 rule 9). Where the gap cannot be repaired it opens a snapshot.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ddbpipe_source::api::{StreamsApi, TableApi};
use ddbpipe_source::clock::unix_now_ms;
use ddbpipe_source::lease::LeaseTable;
use ddbpipe_source::retry::{Cancel, CancelHandle};
use ddbpipe_source::streams::gaps;
use ddbpipe_source::streams::shard_reader::StreamError;

use super::mirror::Ended;
use super::{LeasedMirror, LeasedMirrorOutcome};
use crate::runner::{Progress, RunError};
use crate::sink::{RecordReader, SharedSnapshot, SharedSnapshots};
use crate::streams::StreamRunError;

/// The reason a snapshot opened in place of one whose export was damaged begins with (rule 5).
const DAMAGED_EXPORT: &str = "a damaged export file";

impl<TA: TableApi, SA: StreamsApi + 'static, T: LeaseTable + Clone> LeasedMirror<TA, SA, T> {
    /// Runs this worker through the generations of the pipeline's snapshot (module docs),
    /// each through its phases ([`LeasedMirror::generation`]). A stop during the segments is
    /// [`StreamRunError::SnapshotInterrupted`]: the leases are handed back with their
    /// checkpoints and the next run resumes the snapshot.
    pub async fn run<S: SharedSnapshots>(
        self,
        sink: &mut S,
        stop: Cancel,
        progress: &dyn Progress,
    ) -> Result<LeasedMirrorOutcome, StreamRunError> {
        let pipeline = self.scan.worker.pipeline().to_string();
        let reader = sink.record_reader();
        let mut snapshot = sink
            .open_shared_snapshot(&pipeline, unix_now_ms())
            .await
            .map_err(RunError::from)?;
        let mut replaced = 0;
        loop {
            // A repair whose window is applied goes on with its next window, in a generation of
            // its own (rule 9); of workers opening it at once, the first one's is kept.
            if let Some(next) = snapshot.next_window() {
                let (window, windows) = next.window_of();
                tracing::info!(
                    snapshot = snapshot.id,
                    window,
                    windows,
                    "The shared repair's window is applied: the next one follows."
                );
                let why =
                    (snapshot.replaced.clone()).unwrap_or_else(|| "a gap in the stream".into());
                snapshot = sink
                    .reopen_shared_snapshot(
                        &pipeline,
                        snapshot.id,
                        unix_now_ms(),
                        &why,
                        Some(&next),
                    )
                    .await
                    .map_err(RunError::from)?;
                replaced += 1;
                continue;
            }
            let (handle, generation_stop) = Cancel::new();
            let moved = Arc::new(AtomicBool::new(false));
            let watch = tokio::spawn(watch(
                Arc::clone(&reader),
                pipeline.clone(),
                snapshot.id,
                self.watch_interval,
                stop.clone(),
                handle,
                Arc::clone(&moved),
            ));
            let id = snapshot.id;
            let ended = self
                .generation(snapshot.clone(), sink, generation_stop, progress)
                .await;
            watch.abort();
            let result = match ended {
                Ok(Ended::WindowApplied) if stop.is_cancelled() => {
                    return Err(StreamRunError::RepairInterrupted);
                }
                // The record as stored: closed (by whichever worker), or already the next
                // window's.
                Ok(Ended::WindowApplied) => {
                    snapshot = stored_record(&reader, &pipeline).await?;
                    continue;
                }
                Ok(Ended::Worker(outcome)) => Ok(*outcome),
                Err(error) => Err(error),
            };
            let moved = moved.load(Ordering::SeqCst);
            // A failure of a generation already replaced (its close refused, say, as another
            // worker replaced it between this one's last segment and its close) moves too.
            let stored = match &result {
                Err(_) if !moved => reader.read(pipeline.clone()).await.ok().flatten(),
                _ => None,
            };
            let replaces = match stored {
                _ if moved => None,
                Some(stored) if stored.id != id => None,
                stored => {
                    let current = stored.unwrap_or_else(|| snapshot.clone());
                    match self.replaces(&current, &result) {
                        Some(replaces) => Some((current, replaces)),
                        None => return with_earlier(result, replaced),
                    }
                }
            };
            // A signal ends the worker in whatever generation it is (rule 6), one that came as
            // its generation ended on what replaces the snapshot or moves past it too: nothing
            // is replaced, the leases are handed back, and the next run finds the same (or the
            // record another worker replaced) and goes on from there.
            if stop.is_cancelled() {
                return match result {
                    Ok(outcome) => with_earlier(Ok(outcome), replaced),
                    Err(error) => {
                        let why =
                            replaces.map_or("another worker replaced it".into(), |r| r.1.why());
                        tracing::info!(
                            snapshot = id,
                            reason = %why,
                            error = %error,
                            "A signal came as the shared snapshot was to be replaced or left: \
                             this worker stops; the next run replaces it or moves to its \
                             replacement."
                        );
                        Err(StreamRunError::ReplacementInterrupted)
                    }
                };
            }
            let replacement = match replaces {
                Some((current, Replaces::Gap(why))) => {
                    Some((why, self.plan_repair(&current, sink, &stop).await?))
                }
                Some((_, Replaces::DamagedExport(why))) => Some((why, None)),
                None => None,
            };
            snapshot = match replacement {
                Some((why, repair)) => {
                    tracing::warn!(
                        snapshot = id,
                        generation = snapshot.generation,
                        reason = %why,
                        repair = repair.is_some(),
                        "The shared snapshot cannot be completed or kept up: a generation that \
                         snapshots the table again (or, with repair, applies the gap's changes \
                         from incremental exports) replaces it, and every worker moves to it."
                    );
                    sink.reopen_shared_snapshot(&pipeline, id, unix_now_ms(), &why, repair.as_ref())
                        .await
                        .map_err(RunError::from)?
                }
                None => stored_record(&reader, &pipeline).await?,
            };
            replaced += 1;
            tracing::info!(
                replaced = id,
                snapshot = snapshot.id,
                generation = snapshot.generation,
                "Moving to the shared snapshot that replaced this worker's."
            );
        }
    }

    /// What in `result`, the end of a generation on this worker whose record is `current`,
    /// replaces the snapshot (rule 5); `None` when it is the worker's end. A gap's repair,
    /// where one mends it, is planned after (rule 9).
    fn replaces(
        &self,
        current: &SharedSnapshot,
        result: &Result<LeasedMirrorOutcome, StreamRunError>,
    ) -> Option<Replaces> {
        let error = result.as_ref().err()?;
        if let Some(damaged) = error.damaged_export() {
            let again =
                (current.replaced.as_deref()).is_some_and(|why| why.starts_with(DAMAGED_EXPORT));
            return (!again)
                .then(|| Replaces::DamagedExport(format!("{DAMAGED_EXPORT}: {damaged}")));
        }
        match error {
            StreamRunError::Run(RunError::Stream(StreamError::Gap(gap))) if self.resnapshot => {
                let gap = gaps::without_remedy(gap, gaps::GapRemedy::StateReset);
                Some(Replaces::Gap(format!("a gap in the stream: {gap}")))
            }
            _ => None,
        }
    }
}

/// What replaces a generation's snapshot (rule 5), with the reason the new record keeps.
enum Replaces {
    /// A gap: a new snapshot, or with `on_gap: repair` a repair where one mends it.
    Gap(String),
    /// A damaged or missing export file: a new snapshot.
    DamagedExport(String),
}

impl Replaces {
    fn why(self) -> String {
        match self {
            Replaces::Gap(why) | Replaces::DamagedExport(why) => why,
        }
    }
}

/// The pipeline's record as stored now; gone, a `state reset` ran while this worker ran.
async fn stored_record(
    reader: &Arc<dyn RecordReader>,
    pipeline: &str,
) -> Result<SharedSnapshot, StreamRunError> {
    reader
        .read(pipeline.to_string())
        .await
        .map_err(RunError::from)?
        .ok_or_else(|| {
            StreamRunError::Gap(format!(
                "the shared snapshot record of pipeline '{pipeline}' is gone (a `state reset` \
                 ran while this worker ran): stop every worker and start them again"
            ))
        })
}

/// `result` with the snapshots this worker moved past.
fn with_earlier(
    result: Result<LeasedMirrorOutcome, StreamRunError>,
    replaced: u32,
) -> Result<LeasedMirrorOutcome, StreamRunError> {
    result.map(|outcome| LeasedMirrorOutcome {
        replaced,
        ..outcome
    })
}

/// Reads the record every `interval` until it names another snapshot than `id` (rule 4): then
/// sets `moved` and fires `handle`. Fires it too when `stop` fires: the generation stops with
/// the worker.
async fn watch(
    reader: Arc<dyn RecordReader>,
    pipeline: String,
    id: i64,
    interval: Duration,
    stop: Cancel,
    handle: CancelHandle,
    moved: Arc<AtomicBool>,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => {
                handle.cancel();
                return;
            }
            () = tokio::time::sleep(interval) => {}
        }
        match reader.read(pipeline.clone()).await {
            Ok(Some(record)) if record.id != id => {
                moved.store(true, Ordering::SeqCst);
                handle.cancel();
                return;
            }
            // Gone (a reset): the generation's batches are refused; the worker ends on them.
            Ok(_) => {}
            Err(error) => tracing::debug!(
                error = %error,
                "The shared snapshot record could not be read; read again at the next interval."
            ),
        }
    }
}
