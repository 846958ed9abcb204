//! `mode: scan` and `mode: query` in one process: the scan plan over what was built
//! (`build`), then the library's runner: a parallel scan, a query, or an export's files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddbpipe_pipeline::runner::{RunError, ScanOutcome, run_scan};
use ddbpipe_source::api::{Render, TableApi};
use ddbpipe_source::capacity::ReadLimiter;
use ddbpipe_source::events::RequestMetrics;
use ddbpipe_source::plan::{Refresher, ScanPlan};
use ddbpipe_source::position::ScanKind;
use ddbpipe_source::retry::Cancel;
use ddbpipe_source::scan::SegmentReader;

use super::build::{self, Alone, Read, Run};
use crate::config::PipelineConfig;
use crate::destination;
use crate::export;
use crate::failure::{self, Failure};
use crate::origin::Origin;
use crate::summary::{Ended, Summary};
use crate::telemetry::ScanProgress;

/// Runs a `mode: scan` or `mode: query` pipeline in this process.
pub(super) async fn run(
    run: Run<'_>,
    read: Read,
    alone: Alone,
    stop: Cancel,
) -> Result<Summary, Failure> {
    let Run {
        config,
        origin,
        progress,
    } = run;
    let source = &config.source;
    let table = read.table()?.clone();
    let kind = build::scan_kind(source);
    let Alone {
        mut sink,
        mut checkpointer,
        ..
    } = alone;
    let resumed = checkpointer.position().has_progress();

    let plan = ScanPlan::build(source, &table)
        .map_err(|problem| Failure::usage(problem.config_error()))?;
    let started = Instant::now();
    let render = Render::keyed_items(plan.format, &table.key_schema);
    let outcome = match export::engine(&read.sdk, source) {
        Some(engine) => {
            let table_arn = export::table_arn(source, &table)?;
            let mut arn =
                export::begin_scan(&engine, &config.name, &table_arn, &mut checkpointer, &stop)
                    .await?;
            tracing::info!(mode = %source.mode, export = %arn, resumed, "Run started.");
            // The export's files are known once it completed: no segment total yet.
            let bar = ScanProgress::new(progress, table.item_count, 0, 0);
            let mut abandoned = false;
            let outcome = loop {
                let reader = engine.typed_reader(&arn, render.clone(), table.key_schema.clone());
                let outcome = run_scan(
                    reader,
                    plan.batch,
                    &mut sink,
                    &mut checkpointer,
                    stop.clone(),
                    &bar,
                )
                .await;
                match outcome {
                    // A damaged export fails every read the same way: a new one, once
                    // (docs/scan.md §2.10 rule 9).
                    Err(error) if !abandoned && error.damaged_export().is_some() => {
                        tracing::warn!(error = %error, "The export is damaged.");
                        abandoned = true;
                        arn = export::abandon_scan(
                            &engine,
                            &config.name,
                            &table_arn,
                            &arn,
                            &mut checkpointer,
                            &stop,
                        )
                        .await?;
                    }
                    outcome => break outcome,
                }
            };
            bar.finish();
            outcome
        }
        None => {
            let (reader, refresher) = segment_reader(read.table_api, &plan, render, &stop);
            tracing::info!(
                mode = %source.mode,
                segments = plan.total_segments,
                resumed,
                "Run started."
            );
            let bar = ScanProgress::new(
                progress,
                table.item_count,
                checkpointer.position().done.count(),
                plan.total_segments,
            );
            let outcome =
                run_scan(reader, plan.batch, &mut sink, &mut checkpointer, stop, &bar).await;
            bar.finish();
            drop(refresher);
            outcome
        }
    };
    let outcome = outcome.map_err(|error| run_failure(error, config, origin, kind))?;
    finish(config, origin, &outcome, started.elapsed())
}

/// A failed scan or query run, with what to do about it.
pub(super) fn run_failure(
    error: RunError,
    config: &PipelineConfig,
    origin: &Origin,
    kind: ScanKind,
) -> Failure {
    let source = &config.source;
    let hint = match &error {
        RunError::Read(read)
            if kind != ScanKind::Export && read.code() == Some("AccessDeniedException") =>
        {
            format!(
                "access denied for dynamodb:{} on table '{}' — grant it to the credentials in use ({})",
                if kind == ScanKind::Query {
                    "Query"
                } else {
                    "Scan"
                },
                source.table_name,
                source.credentials.describe()
            )
        }
        _ => failure::rerun_hint(Some(&error), origin, "the last committed page"),
    };
    Failure::runtime(error).hint(hint)
}

/// The parallel Scan (or Query) reader of `plan`, and the refresher that keeps its capacity
/// governor's rate current while it is held.
pub(crate) fn segment_reader<A: TableApi>(
    api: Arc<A>,
    plan: &ScanPlan,
    render: Render,
    stop: &Cancel,
) -> (SegmentReader<A>, Option<Refresher>) {
    let limiter = Arc::new(ReadLimiter::new(plan.read_rate));
    if let Some(rate) = plan.read_rate {
        tracing::info!(units_per_second = rate, "Read capacity limited.");
    }
    let observer = Arc::new(RequestMetrics);
    let refresher = Refresher::start(
        Arc::clone(&api),
        &plan.read_rule,
        Arc::clone(&limiter),
        plan.retry,
        stop.clone(),
        observer.clone(),
    );
    let reader = SegmentReader {
        api,
        template: plan.template.clone(),
        total_segments: plan.total_segments,
        max_concurrency: plan.max_concurrency,
        limiter,
        retry: plan.retry,
        render,
        observer,
        slots: plan.slots.clone(),
    };
    (reader, refresher)
}

/// How the run ended. A run stopped by a signal saved its position: it ends well (exit 0,
/// docs/cli.md §8.5), and its summary says the output is incomplete until a rerun resumes.
fn finish(
    config: &PipelineConfig,
    origin: &Origin,
    outcome: &ScanOutcome,
    took: Duration,
) -> Result<Summary, Failure> {
    let mut summary = summarize(config, outcome, took);
    if !outcome.completed {
        summary.note = Some(super::stopped_note(
            origin,
            "the output is incomplete",
            "resumes it",
        ));
    }
    Ok(summary)
}

fn summarize(config: &PipelineConfig, outcome: &ScanOutcome, took: Duration) -> Summary {
    let position = if outcome.completed {
        "position cleared (the next run reads the table afresh)".to_string()
    } else {
        format!(
            "position saved in {} ({} segment(s) done)",
            destination::position_label(config),
            outcome.segments_done
        )
    };
    let (ended, status) = if outcome.completed {
        (Ended::Complete, "complete")
    } else {
        (Ended::Stopped, "stopped by a signal")
    };
    tracing::info!(
        items = outcome.written,
        capacity_units = outcome.capacity_units,
        "{} {status}.",
        capitalized(config.source.mode.as_str())
    );
    if let Some(warning) = crate::config::stale_rows_warning(&config.source, &config.sink) {
        tracing::warn!("{warning}.");
    }
    super::summary(
        ended,
        outcome.written,
        format!(
            "ddbpipe: {} of '{}' {status}: {} read, {} written, {:.1} capacity units, {:.1}s; {position}",
            config.source.mode,
            config.source.table_name,
            outcome.read,
            outcome.written,
            outcome.capacity_units,
            took.as_secs_f64(),
        ),
    )
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
