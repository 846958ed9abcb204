//! A taken shard's reading task: slice after slice, a read slot per slice, until the shard
//! drains or its lease is lost (docs/coordination.md §11.11 run rule 2).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use ddbpipe_source::api::StreamsApi;
use ddbpipe_source::streams::shard_reader::{ShardState, SliceEnd, StreamContext, StreamError};
use tokio::sync::Semaphore;

/// What a shard's task tells the loop after each slice.
pub(super) struct ReadFlags {
    pub(super) caught_up: Arc<AtomicBool>,
    pub(super) newest_ms: Arc<AtomicI64>,
}

/// Reads one shard slice after slice, a read slot per slice, until it drains or is stopped.
/// The context (and with it the hand-over's sender) is dropped at the end.
pub(super) async fn read_shard<A: StreamsApi>(
    ctx: StreamContext<A>,
    mut state: ShardState,
    slots: Arc<Semaphore>,
    flags: ReadFlags,
) -> Result<(), StreamError> {
    loop {
        let slot = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(StreamError::Stopped),
            slot = Arc::clone(&slots).acquire_owned() => slot.map_err(|_| StreamError::Stopped)?,
        };
        let end = ctx.slice(&mut state).await;
        drop(slot);
        flags.caught_up.store(state.caught_up, Ordering::Relaxed);
        if let Some(ms) = state.newest_ts_ms {
            flags.newest_ms.store(ms, Ordering::Relaxed);
        }
        match end? {
            SliceEnd::Drained => return Ok(()),
            SliceEnd::Yield(delay) => {
                tokio::select! {
                    biased;
                    () = ctx.cancel.cancelled() => return Err(StreamError::Stopped),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
