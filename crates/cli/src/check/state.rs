//! The `state` probe (docs/cli.md §8.2 item 6): the stored entry is readable, of this source,
//! and resumable: the run's start-up gap layers (docs/streams.md §4.5) are applied to a streams
//! position through [`crate::stream_gaps`], listing the stream and probing each positioned
//! shard with `GetShardIterator(AFTER_SEQUENCE_NUMBER)`, so `check` fails (or warns) where the
//! next run stops (or resnapshots).

use std::time::Duration;

use ddbpipe_pipeline::files;
use ddbpipe_pipeline::state::identity::Location;
use ddbpipe_pipeline::state::{Entry, StateFile};
use ddbpipe_source::aws;
use ddbpipe_source::config::OnGap;
use ddbpipe_source::plan;
use ddbpipe_source::position::{Position, StreamsPosition};

use super::paths::{creatable_beside, writable};
use super::{Probes, Status};
use crate::config::PipelineConfig;
use crate::stream_gaps;
use crate::wiring;

/// The `state` probe of a state file.
pub(super) async fn probe_state(
    config: &PipelineConfig,
    location: &Location,
    stream: Option<&str>,
    timeout: Duration,
    probes: &mut Probes,
) {
    let file = StateFile::new(&config.state.path);
    let where_ = config.state.path.display();
    let (mut status, mut detail) = match file.load(&config.name) {
        Err(error) => (Status::Fail, error.to_string()),
        Ok(entry) => {
            state_verdict(
                config,
                location,
                stream,
                &where_.to_string(),
                entry,
                timeout,
            )
            .await
        }
    };
    // A run takes the lock file, then replaces the state file by rename in the directory the
    // path leads to.
    let written = writable(&file.lock_path())
        .and_then(|_| creatable_beside(&files::resolve(&config.state.path)));
    if let Err(problem) = written {
        status = Status::Fail;
        detail = format!(
            "cannot write state file {where_}: {problem} (state.path: make it writable or \
             choose another state.path)"
        );
    }
    if status == Status::Pass
        && let Some(holder) = file.lock_holder()
    {
        status = Status::Warn;
        detail.push_str(&format!(
            "; pipeline '{}' is running now (lock held{})",
            holder.pipeline.as_deref().unwrap_or(&config.name),
            holder.pid_suffix()
        ));
    }
    probes.add("state", status, detail);
}

/// Whether a stored entry suits this source and can be resumed.
pub(super) async fn state_verdict(
    config: &PipelineConfig,
    location: &Location,
    stream: Option<&str>,
    where_: &str,
    entry: Option<Entry>,
    timeout: Duration,
) -> (Status, String) {
    let Some(entry) = entry else {
        return (Status::Pass, format!("{where_}: no stored position"));
    };
    let Some(position) = &entry.position else {
        return (Status::Pass, format!("{where_}: no position in progress"));
    };
    let changes = wiring::identity(config, location, None).changes_for(&entry.identity, position);
    if !changes.is_empty() {
        return (
            Status::Fail,
            format!(
                "{where_}: the stored position was made with a different source: {}",
                changes.join("; ")
            ),
        );
    }
    // An open repair is resumed before anything else, through the export bucket.
    if matches!(position, Position::Streams(s) if s.repair.is_some())
        && config.source.snapshot.s3_bucket.is_none()
    {
        return (
            Status::Fail,
            format!(
                "{where_}: the stored position holds an open repair, whose incremental exports \
                 need source.snapshot.s3_bucket: restore it (and on_gap: repair), or run \
                 `ddbpipe state reset` to start afresh"
            ),
        );
    }
    let (Position::Streams(streams), Some(current)) = (position, stream) else {
        return (
            Status::Pass,
            format!("{where_}: position matches the source"),
        );
    };
    match start_up_gaps(config, streams, current, timeout).await {
        Ok(reasons) if reasons.is_empty() => (
            Status::Pass,
            format!("{where_}: position matches the source and the stream still holds it"),
        ),
        Ok(reasons) => gap_verdict(config.source.on_gap, streams, where_, &reasons),
        Err(problem) => (
            Status::Fail,
            format!(
                "{where_}: the stored position could not be checked against the stream \
                 (the run lists it and probes each stored shard before reading): {problem}"
            ),
        ),
    }
}

/// The gap reasons the start-up of the next run finds in `stored` on `stream_arn`, within
/// `timeout`.
async fn start_up_gaps(
    config: &PipelineConfig,
    stored: &StreamsPosition,
    stream_arn: &str,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let source = &config.source;
    let sdk = aws::load_sdk_config(&plan::client_settings(source)).await;
    let api = aws::streams_api(&sdk);
    let found = async {
        let graph = stream_gaps::listed(&api, source, stream_arn).await?;
        stream_gaps::findings(&api, source, stream_arn, stored, &graph).await
    };
    match tokio::time::timeout(timeout, found).await {
        Ok(Ok(findings)) => Ok(findings.reasons),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    }
}

/// A gap the next run finds: FAIL where it stops (`on_gap: fail`, or a snapshot open, when it
/// fails whatever `on_gap` says), WARN where it resnapshots or repairs; the detail names the
/// reasons and what the run does.
pub(super) fn gap_verdict(
    on_gap: OnGap,
    stored: &StreamsPosition,
    where_: &str,
    reasons: &[String],
) -> (Status, String) {
    // With a snapshot open the run does not apply on_gap: it fails on the gap (during the
    // snapshot into a keyed sink, after it into a jsonl one).
    if stored.snapshot.is_some() {
        return (
            Status::Fail,
            format!(
                "{where_}: {}; a snapshot is open, so the run fails on this gap whatever \
                 on_gap says: run `ddbpipe state reset` to start afresh",
                reasons.join("; ")
            ),
        );
    }
    let status = match on_gap {
        OnGap::Fail => Status::Fail,
        OnGap::Resnapshot | OnGap::Repair => Status::Warn,
    };
    (
        status,
        format!("{where_}: {}", stream_gaps::unresumable(reasons, on_gap)),
    )
}
