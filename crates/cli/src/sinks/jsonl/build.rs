//! How a run builds the jsonl sink: its settings from the config, and a worker's own file
//! (`{worker}` in `sink.path`, docs/coordination.md §11.10).

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use ddbpipe_pipeline::sink::Records;
use ddbpipe_pipeline::sinks::jsonl::{self, JsonlSettings, JsonlSink};

use super::WORKER_PLACEHOLDER;
use super::{JsonlConfig, JsonlTarget, WriteMode};
use crate::failure::Failure;
use crate::sinks::{SinkConfig, Target};

/// The settings of a jsonl sink. `records` says whether the run can complete (items: scan,
/// query) or never does (envelopes: streams, mirror), which decides when a
/// `new_file_per_run` file gets its name.
pub fn jsonl_settings(jsonl: &JsonlConfig, records: Records) -> JsonlSettings {
    JsonlSettings {
        target: match &jsonl.path {
            JsonlTarget::Stdout => jsonl::JsonlTarget::Stdout,
            JsonlTarget::File(path) => jsonl::JsonlTarget::File(path.clone()),
        },
        rotate_bytes: jsonl.rotate_bytes,
        fsync: jsonl.fsync,
        write: match jsonl.write {
            WriteMode::Append => jsonl::WriteMode::Append,
            WriteMode::Overwrite => jsonl::WriteMode::Overwrite,
            WriteMode::NewFilePerRun => jsonl::WriteMode::NewFilePerRun(match records {
                Records::Items => jsonl::Publish::OnCompletion,
                Records::Envelopes => jsonl::Publish::Immediately,
            }),
        },
        compression: if jsonl.gzip {
            jsonl::Compression::Gzip
        } else {
            jsonl::Compression::None
        },
    }
}

/// `sink.path` with this worker's id in place of `{worker}`; `None` for a sink that is not a
/// jsonl file. Every part of the path that holds `{worker}` must stay one file or directory
/// name once the id is in it: an id making it `.` or `..` (or splitting it) would put the file
/// somewhere the template does not, and is refused naming the field.
pub fn worker_path(sink: &SinkConfig, worker_id: &str) -> Result<Option<PathBuf>, Failure> {
    let SinkConfig::Jsonl(jsonl) = sink else {
        return Ok(None);
    };
    let JsonlTarget::File(template) = &jsonl.path else {
        return Ok(None);
    };
    let mut path = PathBuf::new();
    for part in template.components() {
        let text = part.as_os_str().to_string_lossy();
        if !text.contains(WORKER_PLACEHOLDER) {
            path.push(part);
            continue;
        }
        let replaced = text.replace(WORKER_PLACEHOLDER, worker_id);
        let mut parts = Path::new(&replaced).components();
        match (parts.next(), parts.next()) {
            (Some(std::path::Component::Normal(name)), None) => path.push(name),
            _ => {
                return Err(Failure::usage(anyhow!(
                    "config error: sink.path: '{}' with worker id '{worker_id}' names '{replaced}', \
                     which leaves the place the template gives its file: use another \
                     coordination.worker_id",
                    template.display()
                )));
            }
        }
    }
    Ok(Some(path))
}

/// This worker's own jsonl file (validation made the sink a jsonl file with `{worker}`).
pub fn open_worker_file(
    target: Target<'_>,
    worker_id: &str,
    records: Records,
) -> Result<JsonlSink, Failure> {
    let (SinkConfig::Jsonl(jsonl), Some(path)) =
        (target.sink, worker_path(target.sink, worker_id)?)
    else {
        return Err(Failure::runtime(anyhow!(
            "internal error: a shared run into jsonl needs a file path"
        )));
    };
    let mut settings = jsonl_settings(jsonl, records);
    settings.target = jsonl::JsonlTarget::File(path);
    JsonlSink::open(settings, target.pipeline).map_err(Failure::runtime)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::worker_path;
    use crate::config::{PipelineConfig, parse};

    fn shared_into(path: &str) -> PipelineConfig {
        let yaml = format!(
            "name: orders\nsource: {{table_name: orders}}\nsink: {{type: jsonl, path: '{path}'}}\n\
             coordination: {{lease_table: leases}}\n"
        );
        parse(&yaml, Path::new("conf"), &|_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_worker_path_stays_where_its_template_puts_it() {
        let config = shared_into("out/{worker}/orders-{worker}.jsonl");
        let path = worker_path(&config.sink, "host-1").unwrap();
        assert_eq!(
            path,
            Some(PathBuf::from("conf/out/host-1/orders-host-1.jsonl"))
        );
        // Ids that config validation refuses, should one reach here by another way: none of
        // them may move the file out of its directory, or into another one.
        for id in ["..", ".", "a/b", "../x", ""] {
            let config = shared_into("out/{worker}/orders.jsonl");
            let refused = worker_path(&config.sink, id);
            let Err(failure) = refused else {
                panic!("{id}: {refused:?}");
            };
            let said = failure.to_string();
            assert!(
                said.starts_with("config error: sink.path:") && said.contains(&format!("'{id}'")),
                "{id}: {said}"
            );
        }
        // Inside a name, dots are just dots.
        let config = shared_into("out/orders-{worker}.jsonl");
        assert_eq!(
            worker_path(&config.sink, "..").unwrap(),
            Some(PathBuf::from("conf/out/orders-...jsonl"))
        );
    }
}
