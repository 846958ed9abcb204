//! Tests of the jsonl sink: partial tails, rotation, one writer per file, the write modes and
//! gzip.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ddbpipe_source::records::Lines;

use super::names::parse_rotation;
use super::*;
use crate::batch::Batch;
use crate::files;
use crate::sink::{RunStart, Sink};

fn batch(lines: &[&str]) -> Batch {
    let mut records = Lines::default();
    for line in lines {
        records.push_with(|buf| buf.extend_from_slice(line.as_bytes()));
    }
    Batch {
        records,
        ..Batch::default()
    }
}

fn settings(path: PathBuf, rotate_bytes: Option<u64>) -> JsonlSettings {
    JsonlSettings {
        target: JsonlTarget::File(path),
        rotate_bytes,
        fsync: true,
        write: WriteMode::Append,
        compression: Compression::None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_trailing_partial_line_is_cut_before_appending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out/items.jsonl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "{\"a\":1}\n{\"b\":").unwrap();
    let mut sink = JsonlSink::open(settings(path.clone(), None), "p").unwrap();
    sink.write(&batch(&["{\"c\":3}"]), None).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{\"a\":1}\n{\"c\":3}\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_file_without_any_newline_is_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    std::fs::write(&path, "{\"half").unwrap();
    let mut sink = JsonlSink::open(settings(path.clone(), None), "p").unwrap();
    sink.write(&batch(&["x"]), None).await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "x\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn rotation_opens_the_next_file_after_a_full_one_and_never_splits_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    let big = "x".repeat(700_000);
    let mut sink = JsonlSink::open(settings(path.clone(), Some(1_048_576)), "p").unwrap();
    sink.write(&batch(&[&big]), None).await.unwrap();
    sink.write(&batch(&[&big]), None).await.unwrap(); // same file: it was below the size
    sink.write(&batch(&["small"]), None).await.unwrap(); // the first file is full now
    let first = dir.path().join("items.000001.jsonl");
    let second = dir.path().join("items.000002.jsonl");
    assert_eq!(std::fs::metadata(&first).unwrap().len(), 1_400_002);
    assert_eq!(std::fs::read_to_string(&second).unwrap(), "small\n");
    drop(sink);
    // A new run continues the highest-numbered file.
    let mut sink = JsonlSink::open(settings(path.clone(), Some(1_048_576)), "p").unwrap();
    sink.write(&batch(&["again"]), None).await.unwrap();
    assert_eq!(std::fs::read_to_string(&second).unwrap(), "small\nagain\n");
    assert!(!path.exists());
}

/// `O_APPEND`: a batch lands at the end of the file even when something else appended
/// after the sink opened it (without it, the sink's own offset would overwrite that).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn writes_land_at_the_end_even_after_another_append() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    let mut sink = JsonlSink::open(settings(path.clone(), None), "p").unwrap();
    sink.write(&batch(&["first"]), None).await.unwrap();
    let mut other = OpenOptions::new().append(true).open(&path).unwrap();
    other.write_all(b"other\n").unwrap();
    sink.write(&batch(&["mine"]), None).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "first\nother\nmine\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_second_writer_is_refused_naming_the_holder_and_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    let mut sink = JsonlSink::open(settings(path.clone(), None), "orders").unwrap();
    sink.write(&batch(&["{\"a\":1}"]), None).await.unwrap();
    // The holder is mid-line: the refused writer must not cut it.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"b\":")
        .unwrap();
    // Through a symlink too: the lock is beside the file the path leads to.
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    for second in [path.clone(), link] {
        let error = JsonlSink::open(settings(second, Some(1_048_576)), "refunds")
            .err()
            .expect("a second writer is refused")
            .to_string();
        assert!(
            error.contains("is being written by pipeline 'orders'"),
            "{error}"
        );
        assert!(
            error.contains(&format!("pid {}", std::process::id())),
            "{error}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{\"a\":1}\n{\"b\":"
    );
    drop(sink);
    assert!(JsonlSink::open(settings(path, None), "refunds").is_ok());
}

fn with(path: PathBuf, write: WriteMode, compression: Compression) -> JsonlSettings {
    JsonlSettings {
        write,
        compression,
        ..settings(path, None)
    }
}

fn gunzip(path: &Path) -> String {
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn overwrite_keeps_the_old_file_until_completion_then_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    std::fs::write(&path, "old\n").unwrap();
    let mut sink = JsonlSink::open(
        with(path.clone(), WriteMode::Overwrite, Compression::None),
        "p",
    )
    .unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    sink.write(&batch(&["new1", "new2"]), None).await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
    sink.complete().await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "new1\nnew2\n");
    drop(sink);
    assert_eq!(names(dir.path()), ["items.jsonl", "items.jsonl.lock"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_interrupted_overwrite_leaves_the_old_file_and_its_resume_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    std::fs::write(&path, "old\n").unwrap();
    let settings = with(path.clone(), WriteMode::Overwrite, Compression::None);
    let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    sink.write(&batch(&["a"]), None).await.unwrap();
    drop(sink); // interrupted: never completed
    let temp = dir.path().join(".items.jsonl.tmp-p");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&temp)
        .unwrap()
        .write_all(b"{\"half")
        .unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
    // The resumed run continues the temporary file (its partial line cut).
    let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
    sink.start(RunStart::Resumed).await.unwrap();
    sink.write(&batch(&["b"]), None).await.unwrap();
    sink.complete().await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");
    assert!(!temp.exists());
    // A fresh run empties a left-over temporary file first.
    std::fs::write(&temp, "stale\n").unwrap();
    drop(sink);
    let mut sink = JsonlSink::open(settings, "p").unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    sink.write(&batch(&["c"]), None).await.unwrap();
    sink.complete().await.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "c\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn new_file_per_run_publishes_a_timestamped_file_at_completion() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    let settings = with(
        path.clone(),
        WriteMode::NewFilePerRun(Publish::OnCompletion),
        Compression::None,
    );
    let mut published = Vec::new();
    for line in ["one", "two"] {
        let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
        sink.start(RunStart::Fresh).await.unwrap();
        sink.write(&batch(&[line]), None).await.unwrap();
        assert_eq!(
            names(dir.path()).len(),
            2 + published.len(),
            "only the temp file, the lock and earlier runs' files"
        );
        sink.complete().await.unwrap();
        drop(sink);
        let new: Vec<String> = names(dir.path())
            .into_iter()
            .filter(|n| n != "items.jsonl.lock" && !published.contains(n))
            .collect();
        assert_eq!(new.len(), 1, "{new:?}");
        let name = new[0].clone();
        let stamp = name
            .strip_prefix("items.")
            .and_then(|n| n.strip_suffix(".jsonl"))
            .unwrap();
        assert!(
            stamp.starts_with("20") && stamp.as_bytes()[8] == b'T',
            "{name}"
        );
        assert!(
            stamp[..15].ends_with(|c: char| c.is_ascii_digit()),
            "{name}"
        );
        assert_eq!(&stamp[15..16], "Z", "{name}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(&name)).unwrap(),
            format!("{line}\n")
        );
        published.push(name);
    }
    assert!(!path.exists());
}

#[test]
fn timestamped_names_are_utc_and_keep_the_extension() {
    let at = time::macros::datetime!(2025-03-04 05:06:07 +02:00);
    assert_eq!(
        timestamped_path(Path::new("out/orders.jsonl.gz"), at, 1),
        PathBuf::from("out/orders.jsonl.20250304T030607Z.gz")
    );
    assert_eq!(
        timestamped_path(Path::new("out/orders.jsonl"), at, 2),
        PathBuf::from("out/orders.20250304T030607Z-2.jsonl")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn gzip_output_decompresses_to_the_lines_and_a_partial_member_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl.gz");
    let settings = with(path.clone(), WriteMode::Overwrite, Compression::Gzip);
    let mut sink = JsonlSink::open(settings.clone(), "p").unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    sink.write(&batch(&["{\"a\":1}", "{\"b\":2}"]), None)
        .await
        .unwrap();
    drop(sink);
    // A crash in the middle of the next member.
    let temp = dir.path().join(".items.jsonl.gz.tmp-p");
    let mut half = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    half.write_all(b"lost\n").unwrap();
    let half = half.finish().unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&temp)
        .unwrap()
        .write_all(&half[..half.len() - 5])
        .unwrap();
    let mut sink = JsonlSink::open(settings, "p").unwrap();
    sink.start(RunStart::Resumed).await.unwrap();
    sink.write(&batch(&["{\"c\":3}"]), None).await.unwrap();
    sink.complete().await.unwrap();
    assert_eq!(gunzip(&path), "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_device_is_written_without_fdatasync_which_it_refuses() {
    let mut sink = JsonlSink::open(settings(PathBuf::from("/dev/null"), None), "p").unwrap();
    sink.write(&batch(&["{\"a\":1}"]), None).await.unwrap();
}

#[test]
fn a_device_is_written_without_a_lock() {
    assert_eq!(output_lock_path(Path::new("/dev/null")), None);
}

#[test]
fn rotated_names_keep_the_extension() {
    assert_eq!(
        rotated_path(Path::new("out/orders.jsonl"), 3),
        PathBuf::from("out/orders.000003.jsonl")
    );
    assert_eq!(
        parse_rotation(Path::new("out/orders.jsonl"), "orders.000012.jsonl"),
        Some(12)
    );
    assert_eq!(
        parse_rotation(Path::new("out/orders.jsonl"), "orders.12.jsonl"),
        None
    );
}

/// `check` shows and probes the files `run_files` names: they must be those a run opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn run_files_names_the_files_a_run_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    for write in [
        WriteMode::Append,
        WriteMode::Overwrite,
        WriteMode::NewFilePerRun(Publish::OnCompletion),
        WriteMode::NewFilePerRun(Publish::Immediately),
    ] {
        let files = run_files(&path, write, None, "p").unwrap();
        let sink = JsonlSink::open(with(path.clone(), write, Compression::None), "p").unwrap();
        // A timestamped name is that of the second the run opens it.
        let opened = names(dir.path()).contains(
            &files
                .written
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        );
        let immediately = write == WriteMode::NewFilePerRun(Publish::Immediately);
        assert!(opened || immediately, "{write:?}: {files:?}");
        let published = match write {
            WriteMode::Append | WriteMode::NewFilePerRun(Publish::Immediately) => None,
            WriteMode::Overwrite => Some(Published::Over(files::resolve(&path))),
            WriteMode::NewFilePerRun(Publish::OnCompletion) => {
                Some(Published::Timestamped(path.clone()))
            }
        };
        assert_eq!(files.published, published, "{write:?}");
        drop(sink);
        for name in names(dir.path()) {
            if !name.ends_with(".lock") {
                std::fs::remove_file(dir.path().join(name)).unwrap();
            }
        }
    }
    let rotated = run_files(&path, WriteMode::Append, Some(1 << 20), "p").unwrap();
    assert_eq!(
        (rotated.written, rotated.rotation),
        (dir.path().join("items.000001.jsonl"), 1)
    );
}
