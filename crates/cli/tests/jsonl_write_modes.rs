//! The jsonl sink's `write` modes and `gzip` end to end through the CLI, on both emulators
//! (docs/sinks.md §7.1): nightly exports that never double, never leave a half file where
//! readers look, and keep each run's file apart.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use aws_sdk_dynamodb::types::ScalarAttributeType;

use common::{Emulator, Pipeline, item, n, names_in, s, stderr};

const PIPELINE: &str = "items-export";

/// 501 items `{pk: kNNN, n: N}`.
fn seed_501(emulator: &common::Running) {
    emulator.create_table("items", ("pk", ScalarAttributeType::S), None);
    let items = (0..501)
        .map(|i| {
            item(vec![
                ("pk", s(&format!("k{i:03}"))),
                ("n", n(&i.to_string())),
            ])
        })
        .collect();
    emulator.put_items("items", items);
}

/// Rewrites the pipeline file: `source` lines and a jsonl sink to `out.jsonl` with `sink`
/// lines (`write: …`, `gzip: …`).
fn write(pipeline: &Pipeline, endpoint: &str, source: &str, sink: &str) {
    let sink: String = sink
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("  {}\n", l.trim_start()))
        .collect();
    let sections = format!(
        "sink:\n  type: jsonl\n  path: {}\n{sink}state:\n  path: {}\n  flush_interval_ms: 0\n",
        pipeline.out.display(),
        pipeline.state.display()
    );
    pipeline.write_with_sink(PIPELINE, endpoint, source, &sections);
}

fn run(pipeline: &Pipeline) {
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// The `pk`s of a file of JSON lines; every line is complete JSON.
fn keys(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a complete JSON line ({e}): {line:?}"));
            record["pk"].as_str().unwrap().to_string()
        })
        .collect()
}

fn gunzip(path: &Path) -> String {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap()),
        &mut text,
    )
    .unwrap();
    text
}

/// `out.<YYYYMMDDTHHMMSSZ>.jsonl`, or with `-N` after the timestamp when that name was taken.
fn is_timestamped(name: &str) -> bool {
    let Some(stamp) = name
        .strip_prefix("out.")
        .and_then(|n| n.strip_suffix(".jsonl"))
    else {
        return false;
    };
    let (stamp, suffix) = stamp.split_at(stamp.len().min(16));
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    stamp.len() == 16
        && digits(&stamp[..8])
        && &stamp[8..9] == "T"
        && digits(&stamp[9..15])
        && &stamp[15..] == "Z"
        && (suffix.is_empty() || suffix.strip_prefix('-').is_some_and(digits))
}

/// Issue 11: two scan runs with `write: new_file_per_run` write two complete files, named
/// `<stem>.<YYYYMMDDTHHMMSSZ><ext>` beside `path`; the second run touches no byte of the
/// first run's file, and `path` itself is never written.
fn two_new_file_per_run_scans_write_two_complete_files(emulator: Emulator) {
    let running = emulator.start();
    seed_501(&running);
    let pipeline = Pipeline::new(PIPELINE, &running.endpoint, "");
    let source = "table_name: items\nsegments: 2\nbatch_size: 100";
    write(
        &pipeline,
        &running.endpoint,
        source,
        "write: new_file_per_run",
    );
    let dir = pipeline.dir.path();
    let published = |dir: &Path| -> Vec<String> {
        names_in(dir)
            .into_iter()
            .filter(|name| name.starts_with("out.") && !name.ends_with(".lock"))
            .collect()
    };

    run(&pipeline);
    let first = published(dir);
    assert_eq!(first.len(), 1, "{:?}", names_in(dir));
    let first_path = dir.join(&first[0]);
    let first_text = std::fs::read_to_string(&first_path).unwrap();
    let first_meta = std::fs::metadata(&first_path).unwrap();

    run(&pipeline);
    let both = published(dir);
    assert_eq!(both.len(), 2, "{:?}", names_in(dir));
    for name in &both {
        assert!(is_timestamped(name), "documented name: {name}");
        let keys = keys(&std::fs::read_to_string(dir.join(name)).unwrap());
        let distinct: BTreeSet<&String> = keys.iter().collect();
        assert_eq!((keys.len(), distinct.len()), (501, 501), "{name}");
    }
    let meta = std::fs::metadata(&first_path).unwrap();
    assert_eq!(std::fs::read_to_string(&first_path).unwrap(), first_text);
    assert_eq!(
        (meta.ino(), meta.mtime(), meta.mtime_nsec()),
        (
            first_meta.ino(),
            first_meta.mtime(),
            first_meta.mtime_nsec()
        ),
        "the second run left the first run's file alone"
    );
    assert!(!pipeline.out.exists(), "path itself is never written");
    assert!(
        !names_in(dir).iter().any(|name| name.contains(".tmp-")),
        "no temporary file is left: {:?}",
        names_in(dir)
    );
}

/// Issue 11: with `write: overwrite`, a run killed in the middle leaves the previous complete
/// file at `path` untouched and no part of its own output there; the next run resumes and
/// replaces the file by rename (a new inode, never a truncated old one), with every item.
fn an_interrupted_overwrite_keeps_the_previous_file_and_the_next_run_replaces_it(
    emulator: Emulator,
) {
    let running = emulator.start();
    seed_501(&running);
    let pipeline = Pipeline::new(PIPELINE, &running.endpoint, "");
    let fast = "table_name: items\nsegments: 4\nmax_concurrency: 2\npage_limit: 10\nbatch_size: 10";
    write(&pipeline, &running.endpoint, fast, "write: overwrite");
    run(&pipeline);
    let previous = std::fs::read_to_string(&pipeline.out).unwrap();
    assert_eq!(keys(&previous).len(), 501);
    let previous_inode = std::fs::metadata(&pipeline.out).unwrap().ino();

    let slow = format!("{fast}\nmax_read_units_per_second: 1");
    write(&pipeline, &running.endpoint, &slow, "write: overwrite");
    let temp = pipeline
        .dir
        .path()
        .join(format!(".out.jsonl.tmp-{PIPELINE}"));
    let mut child = common::spawn_run(&pipeline.config);
    let midway = common::wait_for(Duration::from_secs(60), || {
        let written = std::fs::read_to_string(&temp).unwrap_or_default();
        let committed = pipeline
            .entry(PIPELINE)
            .is_some_and(|e| !e["position"].is_null());
        committed && !written.is_empty()
    });
    assert!(
        midway,
        "the second run wrote and committed part of the table"
    );
    // Readers see the previous export the whole time.
    assert_eq!(std::fs::read_to_string(&pipeline.out).unwrap(), previous);
    child.kill().unwrap(); // SIGKILL: no drain, no completion.
    child.wait().unwrap();
    assert_eq!(
        std::fs::read_to_string(&pipeline.out).unwrap(),
        previous,
        "the previous complete file is intact"
    );
    assert_eq!(
        std::fs::metadata(&pipeline.out).unwrap().ino(),
        previous_inode
    );
    let partial = std::fs::read_to_string(&temp).unwrap();
    let partial_lines = partial.lines().count();
    assert!(
        partial_lines < 501,
        "interrupted mid-way ({partial_lines} lines)"
    );

    write(&pipeline, &running.endpoint, fast, "write: overwrite");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("resumed=true"),
        "{}",
        stderr(&output)
    );
    let replaced = std::fs::read_to_string(&pipeline.out).unwrap();
    let keys = keys(&replaced);
    let distinct: BTreeSet<&String> = keys.iter().collect();
    assert_eq!(distinct.len(), 501, "the resumed run holds every key");
    assert_ne!(
        std::fs::metadata(&pipeline.out).unwrap().ino(),
        previous_inode,
        "replaced by rename"
    );
    assert!(!temp.exists(), "the temporary file was renamed");
}

/// Issue 11: `gzip: true` output decompresses to exactly the lines of the same export written
/// plain.
fn gzip_output_decompresses_to_the_lines_of_plain_output(emulator: Emulator) {
    let running = emulator.start();
    seed_501(&running);
    // One segment: the same order in both runs.
    let source = "table_name: items\nsegments: 1\nbatch_size: 64";
    let mut texts = Vec::new();
    for gzip in [false, true] {
        let pipeline = Pipeline::new(PIPELINE, &running.endpoint, "");
        let sink = format!("write: overwrite\ngzip: {gzip}");
        write(&pipeline, &running.endpoint, source, &sink);
        run(&pipeline);
        let bytes = std::fs::read(&pipeline.out).unwrap();
        assert_eq!(bytes.starts_with(&[0x1f, 0x8b]), gzip, "gzip magic: {gzip}");
        let text = if gzip {
            gunzip(&pipeline.out)
        } else {
            String::from_utf8(bytes).unwrap()
        };
        texts.push(text);
    }
    assert_eq!(keys(&texts[0]).len(), 501);
    assert_eq!(texts[0], texts[1]);
}

on_both_emulators!(
    two_new_file_per_run_scans_write_two_complete_files,
    an_interrupted_overwrite_keeps_the_previous_file_and_the_next_run_replaces_it,
    gzip_output_decompresses_to_the_lines_of_plain_output,
);
