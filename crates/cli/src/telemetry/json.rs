//! `--log-format json`: one JSON object a line, with the fields of the spans around an event
//! (`pipeline`, `table`) at its top level beside the event's own (docs/cli.md §8.6).
//!
//! The formatter of `tracing-subscriber` nests span fields in a `span` object, so a log
//! collector had to look inside it to tell pipelines apart. Here every line is flat:
//! `timestamp`, `level`, the span fields from the outermost span in, then the event's fields
//! (`message` among them); an inner name overrides an outer one.

use std::fmt;

use serde_json::{Map, Value as Json};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of `--log-format json`; span fields are recorded by
/// [`tracing_subscriber::fmt::format::JsonFields`], so each span's are a JSON object.
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Json::String(ddbpipe_source::clock::now_rfc3339()),
        );
        line.insert(
            "level".into(),
            Json::String(event.metadata().level().as_str().into()),
        );
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Json::Object(fields)) = serde_json::from_str::<Json>(fields) {
                    line.extend(fields);
                }
            }
        }
        // Lines outside the run's span (a signal's, the metrics listener's) name the run too.
        if let Some((pipeline, table)) = super::RUN.get() {
            line.entry("pipeline")
                .or_insert_with(|| Json::String(pipeline.clone()));
            line.entry("table")
                .or_insert_with(|| Json::String(table.clone()));
        }
        event.record(&mut Fields(&mut line));
        writeln!(writer, "{}", Json::Object(line))
    }
}

/// Collects an event's fields into the line's object.
struct Fields<'a>(&'a mut Map<String, Json>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Json::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Json::String(value.into()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Json::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Json::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Json::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Json::from(value));
    }
}
