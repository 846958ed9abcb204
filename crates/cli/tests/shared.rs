//! Several `ddbpipe run` processes sharing one scan or one stream through a lease table, on
//! both emulators (docs/coordination.md §11.10, §11.11): one SIGKILLed, one SIGSTOPped past its
//! lease; the union of the workers' files holds every item, a keyed table ends equal to the
//! source table; `check`, `state show` and `state reset` of the leases.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;
mod fake_export;
#[path = "shared/repair_faults.rs"]
mod repair_faults;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use aws_sdk_dynamodb::types::ScalarAttributeType;
use serde_json::Value;

use common::keyed::{Destination, Target};
use common::{
    Emulator, finished, item, s, shard_lease, shard_owner, signal, stderr, stdout, worker_of,
};

const ITEMS: usize = 1200;

/// A pipeline file sharing a slow scan of `items` (12 segments, 10 items a page, one read
/// unit a second per worker) into `out-{worker}.jsonl`.
fn shared_pipeline(dir: &Path, endpoint: &str, worker_id: Option<&str>) -> PathBuf {
    let sink = format!(
        "sink:\n  type: jsonl\n  path: '{}/out-{{worker}}.jsonl'\n",
        dir.display()
    );
    shared_pipeline_into(dir, endpoint, worker_id, &sink, 1)
}

/// [`shared_pipeline`] with another `sink:` section and read rate.
fn shared_pipeline_into(
    dir: &Path,
    endpoint: &str,
    worker_id: Option<&str>,
    sink: &str,
    units_per_second: u32,
) -> PathBuf {
    let worker = worker_id.map_or(String::new(), |id| format!("\n  worker_id: {id}"));
    let yaml = format!(
        "name: shared-scan\nsource:\n  region: us-east-1\n  endpoint_url: {endpoint}\n  \
         credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}\n  \
         table_name: items\n  segments: 12\n  max_concurrency: 2\n  page_limit: 10\n  batch_size: 10\n  \
         max_read_units_per_second: {units_per_second}\n\
         {sink}\
         state:\n  flush_interval_ms: 0\n\
         coordination:\n  lease_table: ddbpipe-leases\n  lease_duration_secs: 3{worker}\n"
    );
    let config = dir.join("pipeline.yaml");
    std::fs::write(&config, yaml).unwrap();
    config
}

fn seed(running: &common::Running) {
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    let items = (0..ITEMS)
        .map(|i| item(vec![("pk", s(&format!("k{i:05}")))]))
        .collect();
    running.put_items("items", items);
}

fn worker_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("out-") && name.ends_with(".jsonl")
        })
        .collect();
    files.sort();
    files
}

fn keys_in(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    ddbpipe_testkit::pks(text.lines())
}

fn three_workers_survive_a_kill_and_a_stop_and_their_files_hold_every_item(emulator: Emulator) {
    let running = emulator.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let config = shared_pipeline(dir.path(), &running.endpoint, None);

    let check = common::ddbpipe(&["check"], &config);
    let said = stdout(&check);
    assert_eq!(check.status.code(), Some(0), "{said}{}", stderr(&check));
    assert!(
        said.contains("WARN leases") && said.contains("does not exist"),
        "check says the first worker creates the lease table: {said}"
    );

    let killed = common::spawn_run(&config);
    let stopped = common::spawn_run(&config);
    let steady = common::spawn_run(&config);
    // Each has written part of its share.
    let writing = common::wait_for(Duration::from_secs(90), || {
        let files = worker_files(dir.path());
        files.len() == 3 && files.iter().all(|f| !keys_in(f).is_empty())
    });
    assert!(
        writing,
        "three workers write: {:?}",
        worker_files(dir.path())
    );
    let mut killed = killed;
    killed.kill().unwrap(); // SIGKILL: no final checkpoint, no hand-back.
    killed.wait().unwrap();
    signal(&stopped, "STOP");
    std::thread::sleep(Duration::from_secs(7)); // past the 3 s lease: a zombie.
    signal(&stopped, "CONT");

    let stopped = finished(stopped);
    let steady = finished(steady);
    for (what, output) in [
        ("the stopped worker", &stopped),
        ("the steady worker", &steady),
    ] {
        let said = stderr(output);
        assert_eq!(output.status.code(), Some(0), "{what}: {said}");
        assert!(said.contains("complete"), "{what}: {said}");
        assert!(said.contains("12 of 12 segment(s) done"), "{what}: {said}");
    }
    assert!(
        stderr(&stopped).contains("Lease lost"),
        "the zombie learns it lost its leases: {}",
        stderr(&stopped)
    );

    let mut all = BTreeSet::new();
    for file in worker_files(dir.path()) {
        all.extend(keys_in(&file));
    }
    assert_eq!(
        all.len(),
        ITEMS,
        "the union of the worker files holds every item"
    );

    let show = common::ddbpipe(&["state", "show", "--json"], &config);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(shown["units"], 12, "{shown}");
    assert_eq!(shown["finished"], 12, "{shown}");
    for lease in shown["leases"].as_array().unwrap() {
        // The killed worker's presence row stays until a leader sees it expired.
        let unit = lease["unit"].as_str().unwrap();
        if unit != "leader" && !unit.starts_with("worker:") {
            assert_eq!(lease["state"], "Done", "{lease}");
            assert_eq!(lease["owner"], Value::Null, "{lease}");
        }
    }

    // A rerun finds the scan done and reads nothing; a reset forgets it.
    let rerun = common::ddbpipe(&["run", "--progress", "never"], &config);
    assert_eq!(rerun.status.code(), Some(0), "{}", stderr(&rerun));
    assert!(stderr(&rerun).contains("state reset"), "{}", stderr(&rerun));
    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert!(stdout(&reset).contains("removed"), "{}", stdout(&reset));
    let show = common::ddbpipe(&["state", "show"], &config);
    assert!(stdout(&show).contains("none"), "{}", stdout(&show));
}

fn state_reset_refuses_while_a_worker_holds_leases(emulator: Emulator) {
    let running = emulator.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let config = shared_pipeline(dir.path(), &running.endpoint, Some("only-worker"));
    let worker = common::spawn_run(&config);
    let writing = common::wait_for(Duration::from_secs(60), || {
        worker_files(dir.path())
            .first()
            .is_some_and(|f| !keys_in(f).is_empty())
    });
    assert!(writing);
    assert_eq!(
        worker_files(dir.path()),
        vec![dir.path().join("out-only-worker.jsonl")],
        "{{worker}} is the configured worker_id"
    );
    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_ne!(reset.status.code(), Some(0));
    assert!(
        stderr(&reset).contains("live leases") && stderr(&reset).contains("only-worker"),
        "{}",
        stderr(&reset)
    );
    // SIGTERM hands the leases back with their checkpoints; the reset then goes through.
    // Issue 24 item 19: a stop by a signal that saved its progress is a clean stop (exit 0);
    // the summary says the worker was stopped and the scan goes on elsewhere.
    signal(&worker, "TERM");
    let output = finished(worker);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("stopped by a signal")
            && stderr(&output).contains("other workers go on"),
        "{}",
        stderr(&output)
    );
    let show = common::ddbpipe(&["state", "show", "--json"], &config);
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap();
    for lease in shown["leases"].as_array().unwrap() {
        assert_eq!(lease["owner"], Value::Null, "handed back: {lease}");
    }
    // An unfinished segment's checkpoint edited into a shard's form: the worker that takes it
    // stops naming the row, and `check` fails on it first (docs/coordination.md §11.1).
    let unfinished = shown["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["unit"].as_str().unwrap().starts_with("segment:") && l["state"] != "Done")
        .map(|l| l["unit"].as_str().unwrap().to_string())
        .expect("a segment left unfinished by the stop");
    common::rt()
        .block_on(
            common::client(&running.endpoint)
                .update_item()
                .table_name("ddbpipe-leases")
                .key("pipeline", s("shared-scan"))
                .key("unit", s(&unfinished))
                .update_expression("SET #c = :c")
                .expression_attribute_names("#c", "checkpoint")
                .expression_attribute_values(":c", s("after:000000000000000000001"))
                .send(),
        )
        .unwrap();
    let named = format!("lease {unfinished}: its checkpoint 'after:000000000000000000001'");
    let check = common::ddbpipe(&["check"], &config);
    assert_ne!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("FAIL leases") && stdout(&check).contains(&named),
        "{}",
        stdout(&check)
    );
    let run = common::ddbpipe(&["run", "--progress", "never"], &config);
    assert_ne!(run.status.code(), Some(0));
    assert!(stderr(&run).contains(&named), "{}", stderr(&run));
    // Other settings for the unfinished shared scan: `check` fails as `run` does.
    let yaml = std::fs::read_to_string(&config).unwrap();
    let changed = yaml.replace(
        "table_name: items\n",
        "table_name: items\n  value_format: typed\n",
    );
    assert_ne!(changed, yaml);
    std::fs::write(&config, changed).unwrap();
    let check = common::ddbpipe(&["check"], &config);
    assert_ne!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("FAIL leases") && stdout(&check).contains("value_format changed"),
        "{}",
        stdout(&check)
    );
    let run = common::ddbpipe(&["run", "--progress", "never"], &config);
    assert_ne!(run.status.code(), Some(0));
    assert!(
        stderr(&run).contains("other settings") && stderr(&run).contains("value_format changed"),
        "{}",
        stderr(&run)
    );
    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let check = common::ddbpipe(&["check"], &config);
    assert_eq!(
        check.status.code(),
        Some(0),
        "after the reset: {}",
        stdout(&check)
    );
}

/// Three workers load one keyed table, one SIGKILLed and one SIGSTOPped past its lease: the
/// table ends holding every item, each batch having passed its lease fence; `state reset`
/// clears the leases and the fences.
fn three_workers_load_one_table_through_their_fences(emulator: Emulator, target: Target) {
    let running = emulator.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(target, dir.path());
    let config = shared_pipeline_into(
        dir.path(),
        &running.endpoint,
        None,
        &destination.sink_yaml(),
        2,
    );
    passes_check(&config);

    let mut killed = common::spawn_run(&config);
    let stopped = common::spawn_run(&config);
    let steady = common::spawn_run(&config);
    let loading = common::wait_for(Duration::from_secs(90), || {
        destination.rows("items").len() >= 100
    });
    assert!(loading, "the workers load the table");
    killed.kill().unwrap();
    killed.wait().unwrap();
    signal(&stopped, "STOP");
    std::thread::sleep(Duration::from_secs(6));
    signal(&stopped, "CONT");
    for (what, output) in [("stopped", finished(stopped)), ("steady", finished(steady))] {
        assert_eq!(output.status.code(), Some(0), "{what}: {}", stderr(&output));
    }
    let keys: BTreeSet<String> = destination.rows("items").into_keys().collect();
    let expected: BTreeSet<String> = (0..ITEMS).map(|i| format!("k{i:05}")).collect();
    assert_eq!(keys, expected, "the table holds every item");

    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert!(
        stdout(&reset).contains("removed the lease fences"),
        "{}",
        stdout(&reset)
    );
}

/// One worker loading the seeded table into SQLite (`worker_id`, read units a second), once it
/// has written rows: the emulator, the test's directory, the destination, the pipeline file and
/// the running worker.
fn one_worker_loading(
    emulator: Emulator,
    worker_id: Option<&str>,
    units_per_second: u32,
) -> (
    common::Running,
    tempfile::TempDir,
    Destination,
    PathBuf,
    Child,
) {
    let running = emulator.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Sqlite, dir.path());
    let config = shared_pipeline_into(
        dir.path(),
        &running.endpoint,
        worker_id,
        &destination.sink_yaml(),
        units_per_second,
    );
    let worker = common::spawn_run(&config);
    let loading = common::wait_for(Duration::from_secs(60), || {
        !destination.rows("items").is_empty()
    });
    assert!(loading, "the worker loads the table");
    (running, dir, destination, config, worker)
}

/// A worker whose destination is not the running workers' (another SQLite file, worker files)
/// is refused before it opens it, naming both destinations; `check` fails the same way. (It
/// used to take a share of the segments into its own destination, lost to the others'.)
fn a_worker_writing_elsewhere_is_refused_naming_both_destinations(emulator: Emulator) {
    let (_running, dir, destination, config, mut first) = one_worker_loading(emulator, None, 1);
    let yaml = std::fs::read_to_string(&config).unwrap();
    let elsewhere = dir.path().join("elsewhere.db");
    let jsonl = format!(
        "sink:\n  type: jsonl\n  path: '{}/out-{{worker}}.jsonl'\n",
        dir.path().display()
    );
    for (what, sink, named) in [
        (
            "another sqlite file",
            format!("sink:\n  type: sqlite\n  path: {}\n", elsewhere.display()),
            elsewhere.display().to_string(),
        ),
        ("worker files", jsonl, "out-{worker}.jsonl".to_string()),
    ] {
        let other = dir.path().join("other.yaml");
        std::fs::write(&other, yaml.replace(&destination.sink_yaml(), &sink)).unwrap();
        let check = common::ddbpipe(&["check"], &other);
        let said = stdout(&check);
        assert_ne!(check.status.code(), Some(0), "{what}: {said}");
        assert!(
            said.contains("FAIL leases")
                && said.contains("sink changed from")
                && said.contains(&destination.path.display().to_string())
                && said.contains(&named),
            "{what}: check names both destinations: {said}"
        );
        let run = common::ddbpipe(&["run", "--progress", "never"], &other);
        let said = stderr(&run);
        assert_ne!(run.status.code(), Some(0), "{what}: {said}");
        assert!(
            said.contains("other settings")
                && said.contains(&destination.path.display().to_string())
                && said.contains(&named),
            "{what}: run names both destinations: {said}"
        );
    }
    assert!(
        !elsewhere.exists(),
        "the other database is not even created"
    );
    assert!(worker_files(dir.path()).is_empty(), "no worker file either");
    signal(&first, "TERM");
    first.wait().unwrap();
}

/// Two processes started with one `worker_id`: the second is refused before it opens its
/// sink, naming the first's pid and host; the lease rows name each process apart (its owner
/// is the id and a token of the process, so the twins' writes are fenced per process); the
/// first goes on and loads every item.
fn a_second_process_with_a_live_workers_id_is_refused(emulator: Emulator) {
    let (_running, _dir, destination, config, first) =
        one_worker_loading(emulator, Some("twin"), 5);
    let show = common::ddbpipe(&["state", "show", "--json"], &config);
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap();
    let owners: BTreeSet<String> = shown["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|lease| lease["owner"].as_str().map(str::to_string))
        .collect();
    let process = format!("/{}/", first.id());
    assert!(
        !owners.is_empty()
            && owners
                .iter()
                .all(|owner| owner.starts_with("twin#") && owner.contains(&process)),
        "the rows name the first process: {owners:?}"
    );
    let second = common::ddbpipe(&["run", "--progress", "never"], &config);
    let said = stderr(&second);
    assert_ne!(second.status.code(), Some(0), "{said}");
    assert!(
        said.contains("worker id 'twin' is in use by a live process")
            && said.contains(&format!("pid {} on host ", first.id())),
        "{said}"
    );
    let first = finished(first);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert_eq!(destination.rows("items").len(), ITEMS);
}

/// [`shared_pipeline_into`] with one segment, in its own file: one worker reads, the others
/// wait holding no unit.
fn one_segment_pipeline(dir: &Path, endpoint: &str, worker_id: &str, sink: &str) -> PathBuf {
    let config = shared_pipeline_into(dir, endpoint, Some(worker_id), sink, 1);
    let yaml = std::fs::read_to_string(&config)
        .unwrap()
        .replace("segments: 12", "segments: 1");
    let own = dir.join(format!("{worker_id}.yaml"));
    std::fs::write(&own, yaml).unwrap();
    own
}

/// The lease rows as `state show --json` lists them.
fn lease_rows(config: &Path) -> Vec<Value> {
    let show = common::ddbpipe(&["state", "show", "--json"], config);
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap_or(Value::Null);
    shown["leases"].as_array().cloned().unwrap_or_default()
}

/// A live process that holds no unit (a standby: the one segment is the other worker's) is
/// seen by its presence row, `worker:<id>`: a second process started with its id is refused,
/// naming its pid (docs/coordination.md §11.2 rule 7, §11.10 run rule 8). Before the presence
/// row the second process was let in.
fn a_second_process_with_a_standbys_id_is_refused(emulator: Emulator) {
    let running = emulator.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let sink = format!(
        "sink:\n  type: jsonl\n  path: '{}/out-{{worker}}.jsonl'\n",
        dir.path().display()
    );
    let busy = one_segment_pipeline(dir.path(), &running.endpoint, "busy", &sink);
    let standby = one_segment_pipeline(dir.path(), &running.endpoint, "standby", &sink);
    let reader = common::spawn_run(&busy);
    let reading = common::wait_for(Duration::from_secs(60), || {
        worker_files(dir.path())
            .iter()
            .any(|f| !keys_in(f).is_empty())
    });
    assert!(reading, "the first worker reads the segment");
    let waiting = common::spawn_run(&standby);
    let present = common::wait_for(Duration::from_secs(30), || {
        lease_rows(&standby).iter().any(|row| {
            row["unit"] == "worker:standby"
                && row["owner"]
                    .as_str()
                    .is_some_and(|o| o.contains(&format!("/{}/", waiting.id())))
        })
    });
    assert!(present, "the standby holds its presence row");
    let held_by_standby: Vec<Value> = lease_rows(&standby)
        .into_iter()
        .filter(|row| {
            row["owner"]
                .as_str()
                .is_some_and(|o| o.starts_with("standby#"))
                && row["unit"] != "worker:standby"
        })
        .collect();
    assert!(
        held_by_standby.is_empty(),
        "the standby holds no other lease: {held_by_standby:?}"
    );
    let twin = common::ddbpipe(&["run", "--progress", "never"], &standby);
    let said = stderr(&twin);
    assert_ne!(twin.status.code(), Some(0), "{said}");
    assert!(
        said.contains("worker id 'standby' is in use by a live process")
            && said.contains(&format!("pid {} on host ", waiting.id()))
            && said.contains("worker:standby"),
        "{said}"
    );
    for child in [&reader, &waiting] {
        signal(child, "TERM");
    }
    for (what, child) in [("reader", reader), ("standby", waiting)] {
        let output = finished(child);
        assert_eq!(output.status.code(), Some(0), "{what}: {}", stderr(&output));
    }
    assert!(
        !lease_rows(&standby).iter().any(|row| row["unit"]
            .as_str()
            .is_some_and(|u| u.starts_with("worker:"))),
        "a graceful stop deletes the presence rows"
    );
}

/// A worker SIGKILLed in the middle of a segment: the next owner continues after the position
/// committed with the rows (the lease row's checkpoint is written only every 10 minutes
/// here), says so (`resumed=true`, the key), and does not read what was committed again: the
/// two workers' writes add up to the table (docs/coordination.md §11.10 run rule 3).
fn a_killed_workers_segment_is_resumed_after_its_committed_position(emulator: Emulator) {
    let running = emulator.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Sqlite, dir.path());
    let sink = destination.sink_yaml();
    let first = one_segment_pipeline(dir.path(), &running.endpoint, "first", &sink);
    let yaml = std::fs::read_to_string(&first)
        .unwrap()
        .replace("flush_interval_ms: 0", "flush_interval_ms: 600000");
    std::fs::write(&first, yaml).unwrap();
    let second = dir.path().join("second.yaml");
    let yaml = std::fs::read_to_string(&first)
        .unwrap()
        .replace("worker_id: first", "worker_id: second");
    std::fs::write(&second, yaml).unwrap();
    let mut killed = common::spawn_run(&first);
    let loading = common::wait_for(Duration::from_secs(60), || {
        destination.rows("items").len() >= 100
    });
    assert!(loading, "the first worker loads part of the segment");
    killed.kill().unwrap(); // SIGKILL: no checkpoint, no hand-back.
    killed.wait().unwrap();
    let committed = destination.rows("items").len();
    assert!(committed < ITEMS, "killed mid-segment: {committed}");
    let taker = common::ddbpipe(&["run", "--progress", "never"], &second);
    let said = stderr(&taker);
    assert_eq!(taker.status.code(), Some(0), "{said}");
    let taken = said
        .lines()
        .find(|line| line.contains("Lease taken.") && line.contains("segment:0/1"))
        .unwrap_or_else(|| panic!("the segment is taken: {said}"));
    assert!(
        taken.contains("resumed=true") && taken.contains("after="),
        "{taken}"
    );
    assert_eq!(destination.rows("items").len(), ITEMS);
    let written: usize = said
        .lines()
        .find_map(|line| {
            let (_, rest) = line.split_once(" read, ")?;
            rest.split_once(" written")?.0.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("the summary names what was written: {said}"));
    assert_eq!(
        committed + written,
        ITEMS,
        "the taker writes what the killed worker had not committed, no more: {said}"
    );
}

/// `ddbpipe check` of `config` passes.
fn passes_check(config: &Path) {
    let check = common::ddbpipe(&["check"], config);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}{}",
        stdout(&check),
        stderr(&check)
    );
}

/// A started emulator with the table `items` (its stream of new and old images) holding
/// `k00`, `k01`, … (`count` keys, each `v` = 0).
fn streamed_items(emulator: Emulator, count: usize) -> common::Running {
    let running = emulator.start();
    running.create_pk_table(
        "items",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    for i in 0..count {
        running.put_pk("items", &format!("k{i:02}"), "0");
    }
    running
}

/// A shared `mode: streams` pipeline into `sink`, following the stream until stopped.
fn shared_stream_pipeline(dir: &Path, endpoint: &str, sink: &str) -> PathBuf {
    let yaml = format!(
        "name: shared-stream\nsource:\n  region: us-east-1\n  endpoint_url: {endpoint}\n  \
         credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}\n  \
         table_name: items\n  value_format: typed\n  mode: streams\n  follow: true\n  poll_interval_ms: 200\n\
         {sink}\
         state:\n  flush_interval_ms: 0\n\
         coordination:\n  lease_table: ddbpipe-leases\n  lease_duration_secs: 3\n"
    );
    let config = dir.join("pipeline.yaml");
    std::fs::write(&config, yaml).unwrap();
    config
}

/// A thread writing `steps` changes to `items`, one every `pause`: step `n` puts
/// `{pk, v: n}` or deletes `pk`, as `change(n)` says (the key, and whether it is a delete).
fn writer(
    endpoint: &str,
    steps: u32,
    pause: Duration,
    change: impl Fn(u32) -> (String, bool) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let endpoint = endpoint.to_string();
    std::thread::spawn(move || {
        let client = common::client(&endpoint);
        for step in 0..steps {
            let (key, remove) = change(step);
            let request = if remove {
                common::rt()
                    .block_on(
                        client
                            .delete_item()
                            .table_name("items")
                            .key("pk", s(&key))
                            .send(),
                    )
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}"))
            } else {
                common::rt()
                    .block_on(
                        client
                            .put_item()
                            .table_name("items")
                            .set_item(Some(item(vec![
                                ("pk", s(&key)),
                                ("v", common::n(&step.to_string())),
                            ])))
                            .send(),
                    )
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}"))
            };
            request.expect("a write");
            std::thread::sleep(pause);
        }
    })
}

/// Three workers follow one stream into a keyed table while it is written: the one reading
/// the shard is SIGKILLed, the next one SIGSTOPped past its lease and continued; the table
/// ends equal to the source table, the zombie learns it lost the lease, and SIGTERM hands
/// every lease back.
fn three_workers_follow_one_stream_through_a_kill_and_a_stop(emulator: Emulator, target: Target) {
    let running = streamed_items(emulator, 20);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(target, dir.path());
    let config = shared_stream_pipeline(dir.path(), &running.endpoint, &destination.sink_yaml());
    passes_check(&config);
    let mut workers: Vec<Child> = (0..3).map(|_| common::spawn_run(&config)).collect();

    // A writer changes the table all along: puts, updates and deletes of 40 keys.
    let writer = writer(&running.endpoint, 150, Duration::from_millis(100), |step| {
        (format!("k{:02}", (step * 7) % 40), step % 5 == 4)
    });

    let reading = common::wait_for(Duration::from_secs(60), || {
        destination.rows("items").len() >= 10 && shard_owner(&config).is_some()
    });
    assert!(reading, "a worker reads the shard");
    let first = shard_owner(&config).unwrap();
    let mut killed = worker_of(&mut workers, &first).expect("the owner is one of the workers");
    killed.kill().unwrap(); // SIGKILL: no final checkpoint, no hand-back.
    killed.wait().unwrap();
    let mut second = None;
    let taken = common::wait_for(Duration::from_secs(30), || {
        second = shard_owner(&config).filter(|owner| *owner != first);
        second.is_some()
    });
    assert!(
        taken,
        "another worker takes the shard after the lease expires"
    );
    let stopped = worker_of(&mut workers, &second.unwrap()).expect("a live worker");
    signal(&stopped, "STOP");
    std::thread::sleep(Duration::from_secs(7)); // past the 3 s lease: a zombie.
    signal(&stopped, "CONT");
    writer.join().unwrap();

    let table = common::keyed::table_items(&running.endpoint, "items");
    let converged = common::wait_for(Duration::from_secs(60), || {
        destination.items("items") == table
    });
    assert_eq!(
        destination.items("items"),
        table,
        "the destination ends equal to the table (converged: {converged})"
    );
    workers.push(stopped);
    let mut said = String::new();
    for worker in workers {
        signal(&worker, "TERM");
        let output = finished(worker);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("stopped by a signal"),
            "{}",
            stderr(&output)
        );
        said.push_str(&stderr(&output));
    }
    assert!(
        said.contains("Lease lost"),
        "the zombie learns it lost the lease: {said}"
    );
    assert_eq!(shard_owner(&config), None, "SIGTERM hands the lease back");
}

/// A worker of a shared stream serves the single-process stream metrics (records, the source
/// lag of the shards it holds, shard counts) and its leases (held, taken, the lease table's
/// requests) on `--metrics-addr` while it runs.
fn a_shared_stream_worker_serves_its_lag_and_leases_as_metrics(emulator: Emulator) {
    let running = streamed_items(emulator, 5);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Sqlite, dir.path());
    let config = shared_stream_pipeline(dir.path(), &running.endpoint, &destination.sink_yaml());
    let port = ddbpipe_testkit::free_port();
    let address = format!("127.0.0.1:{port}");
    let child = common::spawn_run_with(&config, &["--metrics-addr", &address]);
    let scrape = || common::scrape_metrics(port);
    // A series of the pipeline: its name, labels (in any order) and, when given, its value.
    let has = |body: &str, name: &str, labels: &[&str], value: Option<&str>| {
        body.lines().any(|line| {
            line.starts_with(&format!("{name}{{"))
                && line.contains("pipeline=\"shared-stream\"")
                && labels.iter().all(|label| line.contains(label))
                && value.is_none_or(|v| line.ends_with(&format!(" {v}")))
        })
    };
    let worker = format!("-{}\"", child.id());
    let mut body = String::new();
    // The lag gauge is set once the worker's round has read its shard.
    let served = common::wait_for(Duration::from_secs(60), || {
        body = scrape();
        destination.rows("items").len() >= 5
            && has(&body, "ddbpipe_source_lag_seconds", &[], None)
            && has(&body, "ddbpipe_leases_held", &[&worker], Some("1"))
    });
    signal(&child, "TERM");
    let output = finished(child);
    assert!(served, "the worker serves its metrics:\n{body}");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let expected: [(&str, &[&str], Option<&str>); 5] = [
        ("ddbpipe_records_written_total", &["op=\"c\""], Some("5")),
        ("ddbpipe_shards", &[], None),
        ("ddbpipe_leases_total", &[&worker, "event=\"taken\""], None),
        ("ddbpipe_lease_requests_total", &[], None),
        ("ddbpipe_source_lag_seconds", &[], None),
    ];
    for (name, labels, value) in expected {
        assert!(
            has(&body, name, labels, value),
            "missing {name} {labels:?} {value:?} in:\n{body}"
        );
    }
}

/// `<command> --json` of `config`: the exit code and the parsed answer.
fn json_of(args: &[&str], config: &Path) -> (Option<i32>, Value) {
    let output = common::ddbpipe(args, config);
    let answer = serde_json::from_str(&stdout(&output))
        .unwrap_or_else(|e| panic!("{args:?} prints JSON ({e}): {}", stderr(&output)));
    (output.status.code(), answer)
}

/// The `state` probe of `check --json`.
fn state_probe(config: &Path) -> (Option<i32>, Value) {
    let (code, report) = json_of(&["check", "--json"], config);
    let state = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|probe| probe["name"] == "state")
        .cloned()
        .unwrap_or_else(|| panic!("a state probe: {report}"));
    (code, state)
}

/// The checkpoint of the stream's one shard lease.
fn shard_checkpoint(config: &Path) -> Option<String> {
    shard_lease(config).and_then(|lease| lease["checkpoint"].as_str().map(str::to_string))
}

/// Issue 24 item 14: `lag`, `check` and `state show` of a shared stream read its position
/// from the lease rows: the lag is measured from each shard's checkpoint (caught up: 0, where
/// the state file, which a shared run never writes, would start it from the trim horizon) and
/// reported per shard and per worker; a shard nobody holds counts too; a row of a shard the
/// stream no longer lists is the gap the worker taking it stops on (issue 24 item 15).
fn lag_check_and_state_show_of_a_shared_stream_read_its_lease_checkpoints(emulator: Emulator) {
    let running = streamed_items(emulator, 3);
    // Some emulators round ApproximateCreationDateTime down to the second.
    std::thread::sleep(Duration::from_millis(1600));
    let dir = tempfile::tempdir().unwrap();
    let sink = format!(
        "sink:\n  type: jsonl\n  path: '{}/out-{{worker}}.jsonl'\n",
        dir.path().display()
    );
    let config = shared_stream_pipeline(dir.path(), &running.endpoint, &sink);
    let worker = common::spawn_run(&config);
    let worker_id = |owner: &str| owner.split('#').next().unwrap().to_string();
    let read = common::wait_for(Duration::from_secs(60), || {
        let changes: usize = worker_files(dir.path())
            .iter()
            .map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .count()
            })
            .sum();
        changes == 3
            && shard_owner(&config).is_some()
            && shard_checkpoint(&config).is_some_and(|c| c.starts_with("after:"))
    });
    assert!(read, "the worker reads and checkpoints the shard");
    let owner = worker_id(&shard_owner(&config).unwrap());
    assert!(owner.ends_with(&format!("-{}", worker.id())), "{owner}");

    let (code, report) = json_of(&["lag", "--json", "--max-lag-seconds", "0"], &config);
    assert_eq!(
        code,
        Some(0),
        "caught up from the lease checkpoint: {report}"
    );
    assert_eq!(report["lag_seconds"].as_f64(), Some(0.0), "{report}");
    assert_eq!(report["phase"], "streaming");
    assert_eq!(report["lease_table"], "ddbpipe-leases");
    assert_eq!(report["shards"][0]["worker"], owner.as_str(), "{report}");
    assert_eq!(
        report["workers"],
        serde_json::json!([{"lag_seconds": 0.0, "shards": 1, "worker": owner}]),
        "{report}"
    );
    let (code, state) = state_probe(&config);
    assert_eq!(code, Some(0), "{state}");
    assert_eq!(state["status"], "PASS", "{state}");
    let detail = state["detail"].as_str().unwrap();
    assert!(
        detail.contains(
            "1 shard(s): 0 finished, 1 positioned, 0 at its start; 1 held by 1 worker(s)"
        ) && detail.contains("the stream still holds every checkpoint"),
        "{detail}"
    );
    let show = common::ddbpipe(&["state", "show"], &config);
    assert!(
        stdout(&show).contains("positions:    1 shard(s): 0 finished, 1 positioned"),
        "{}",
        stdout(&show)
    );

    // Stopped: the lease is handed back with its checkpoint; a new change waits in a shard
    // nobody holds.
    signal(&worker, "TERM");
    let output = finished(worker);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    running.put_pk("items", "k99", "1");
    std::thread::sleep(Duration::from_millis(1600));
    let (code, report) = json_of(&["lag", "--json", "--max-lag-seconds", "0"], &config);
    assert_eq!(code, Some(1), "behind: {report}");
    assert!(report["lag_seconds"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["shards"][0]["worker"], Value::Null, "{report}");
    assert_eq!(report["workers"][0]["worker"], Value::Null, "{report}");

    // A row of a shard the stream no longer lists (trimmed after 24 h): the worker that takes
    // it fails; `lag` and `check` say so now.
    let client = common::client(&running.endpoint);
    common::rt()
        .block_on(
            client
                .put_item()
                .table_name("ddbpipe-leases")
                .set_item(Some(item(vec![
                    ("pipeline", s("shared-stream")),
                    ("unit", s("shard:shardId-gone")),
                    ("counter", common::n("4")),
                    ("state", s("Processing")),
                    ("checkpoint", s("after:000000000000000000001")),
                    ("owner_switches", common::n("0")),
                    ("written_ms", common::n("0")),
                ])))
                .send(),
        )
        .unwrap();
    let gap = "shard shardId-gone expired before it was fully read";
    let (code, report) = json_of(&["lag", "--json"], &config);
    assert_eq!(code, Some(1), "{report}");
    let error = report["error"].as_str().unwrap();
    assert!(
        error.contains(gap) && error.contains("the next run applies on_gap: fail"),
        "{error}"
    );
    let (code, state) = state_probe(&config);
    assert_eq!(code, Some(1), "{state}");
    assert_eq!(state["status"], "FAIL", "{state}");
    assert!(state["detail"].as_str().unwrap().contains(gap), "{state}");
}

/// Issue 24 item 14: `lag` of a shared mirror in its streaming phase measures the shard
/// checkpoints of its lease rows (it said `no value (no snapshot yet …)` and failed every
/// limit), and `state show` names its phase.
fn lag_of_a_shared_mirror_streaming_is_measured_from_its_lease_rows(emulator: Emulator) {
    let running = streamed_items(emulator, 3);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Sqlite, dir.path());
    let config = shared_mirror_pipeline(dir.path(), &running.endpoint, &destination.sink_yaml());
    let worker = common::spawn_run(&config);
    // The stream is read beside the snapshot: the phase is `streaming` once every segment is
    // done.
    let streaming = common::wait_for(Duration::from_secs(90), || {
        shard_checkpoint(&config).is_some_and(|c| c.starts_with("after:"))
            && json_of(&["state", "show", "--json"], &config).1["phase"] == "streaming"
    });
    assert!(streaming, "the worker streams after its snapshot");
    let (code, report) = json_of(&["lag", "--json", "--max-lag-seconds", "60"], &config);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["phase"], "streaming", "{report}");
    assert!(report["lag_seconds"].as_f64().is_some(), "{report}");
    assert_eq!(report["workers"].as_array().unwrap().len(), 1, "{report}");
    let (_, shown) = json_of(&["state", "show", "--json"], &config);
    assert_eq!(shown["phase"], "streaming", "{shown}");
    signal(&worker, "TERM");
    let output = finished(worker);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn lag_check_and_state_show_of_a_shared_stream_read_its_lease_checkpoints_on_moto() {
    lag_check_and_state_show_of_a_shared_stream_read_its_lease_checkpoints(Emulator::Moto);
}

#[test]
fn lag_of_a_shared_mirror_streaming_is_measured_from_its_lease_rows_on_moto() {
    lag_of_a_shared_mirror_streaming_is_measured_from_its_lease_rows(Emulator::Moto);
}

/// Issue 24 item 10: the password of an endpoint URL reaches no lease row (the leader row
/// keeps the run's identity), metric, log line, `check --json` or `state show --json` of a
/// shared run.
#[test]
fn an_endpoints_password_reaches_no_lease_row_or_metric_of_a_shared_run() {
    const SECRET: &str = "Wq7xK9zTpw";
    let running = Emulator::Dynoxide.start();
    seed(&running);
    let dir = tempfile::tempdir().unwrap();
    let endpoint = running
        .endpoint
        .replace("http://", &format!("http://user:{SECRET}@"));
    let config = shared_pipeline(dir.path(), &endpoint, Some("only-worker"));
    let port = ddbpipe_testkit::free_port();
    let address = format!("127.0.0.1:{port}");
    let worker = common::spawn_run_with(
        &config,
        &[
            "--metrics-addr",
            &address,
            "--log-format",
            "json",
            "--log-level",
            "trace",
        ],
    );
    let mut metrics = String::new();
    let writing = common::wait_for(Duration::from_secs(60), || {
        metrics = common::scrape_metrics(port);
        metrics.contains("ddbpipe_leases_held")
            && worker_files(dir.path())
                .first()
                .is_some_and(|f| !keys_in(f).is_empty())
    });
    assert!(writing, "{metrics}");
    let rows = common::rt()
        .block_on(running.client.scan().table_name("ddbpipe-leases").send())
        .unwrap();
    let rows = format!("{:?}", rows.items());
    assert!(rows.contains("leader"), "{rows}");
    let mut said = String::new();
    let commands: [&[&str]; 2] = [&["check", "--json"], &["state", "show", "--json"]];
    for args in commands {
        let (_, text) = common::traced_at(&config, args);
        said.push_str(&text);
    }
    signal(&worker, "TERM");
    let output = finished(worker);
    for (text, what) in [
        (&rows, "the lease rows"),
        (&metrics, "the metrics"),
        (&said, "check and state show"),
        (&stderr(&output), "the worker's log"),
    ] {
        common::assert_hidden(text, SECRET, 6, what);
    }
    assert!(
        rows.contains(&running.endpoint.replace("http://", "http://***@")),
        "the leader row keeps the masked endpoint: {rows}"
    );
}

/// A shared `mode: mirror` pipeline into `sink`: a slow snapshot (6 segments, 10 items a page,
/// two read units a second per worker), then the stream, followed until stopped.
fn shared_mirror_pipeline(dir: &Path, endpoint: &str, sink: &str) -> PathBuf {
    let yaml = format!(
        "name: shared-mirror\nsource:\n  region: us-east-1\n  endpoint_url: {endpoint}\n  \
         credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}\n  \
         table_name: items\n  value_format: typed\n  mode: mirror\n  follow: true\n  poll_interval_ms: 200\n  \
         segments: 6\n  max_concurrency: 2\n  page_limit: 10\n  batch_size: 10\n  max_read_units_per_second: 2\n\
         {sink}\
         state:\n  flush_interval_ms: 0\n\
         coordination:\n  lease_table: ddbpipe-leases\n  lease_duration_secs: 3\n"
    );
    let config = dir.join("mirror.yaml");
    std::fs::write(&config, yaml).unwrap();
    config
}

/// Starts a worker of `config`, waits until the destination's snapshot record is closed and
/// its `items` rows are `table`, then stops it (SIGTERM, exit 0).
fn mirror_until_closed_and_equal(
    config: &Path,
    destination: &Destination,
    table: &std::collections::BTreeMap<String, Value>,
) {
    let worker = common::spawn_run(config);
    let converged = common::wait_for(Duration::from_secs(120), || {
        !snapshot_record(destination)["closed"].is_null() && destination.items("items") == *table
    });
    signal(&worker, "TERM");
    let output = finished(worker);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        converged,
        "the snapshot mirrors the table: {}; {text}",
        snapshot_record(destination)
    );
}

/// The shared snapshot record of pipeline `shared-mirror` in `destination` (null when none).
fn snapshot_record(destination: &Destination) -> Value {
    let stored = destination.query_texts(
        "SELECT position FROM _ddbpipe_fences WHERE pipeline = 'shared-mirror' AND unit = 'snapshot'",
    );
    stored
        .first()
        .map_or(Value::Null, |row| serde_json::from_str(&row[0]).unwrap())
}

/// Moto with table `items` (a stream of new and old images) holding `n` items, and the export
/// fake in front of it, exporting into bucket `exports`.
fn exported_items(n: usize) -> (common::Running, fake_export::FakeExport) {
    let running = Emulator::Moto.start();
    running.create_pk_table(
        "items",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    for i in 0..n {
        running.put_pk("items", &format!("k{i:03}"), "0");
    }
    fake_export::create_bucket(&running.endpoint, "exports");
    let fake = fake_export::FakeExport::start(&running.endpoint, &running.endpoint);
    (running, fake)
}

/// Starts a worker of `config`, waits until `reached` (what the worker `does`), stops it with
/// SIGTERM and checks it ends as a stop `during` its snapshot or its repair: exit 0, the
/// snapshot (or repair) incomplete.
fn stop_once(config: &Path, does: &str, during: &str, reached: impl FnMut() -> bool) {
    let worker = common::spawn_run(config);
    assert!(
        common::wait_for(Duration::from_secs(60), reached),
        "the worker {does}"
    );
    signal(&worker, "TERM");
    let output = finished(worker);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("during its {during}")), "{text}");
}

/// [`shared_mirror_pipeline`] reading its snapshot from an export in bucket `exports`, one
/// data file at a time per worker, 10 lines a batch.
fn shared_export_mirror_pipeline(dir: &Path, endpoint: &str, sink: &str) -> PathBuf {
    let config = shared_mirror_pipeline(dir, endpoint, sink);
    let exported = std::fs::read_to_string(&config).unwrap().replace(
        "  segments: 6\n  max_concurrency: 2\n  page_limit: 10\n  batch_size: 10\n  \
             max_read_units_per_second: 2\n",
        "  snapshot: {engine: export, s3_bucket: exports}\n  max_concurrency: 1\n  \
             batch_size: 10\n",
    );
    assert!(exported.contains("engine: export"), "{exported}");
    std::fs::write(&config, exported).unwrap();
    config
}

/// Three workers mirror one table into a keyed table that already holds rows, some of them of
/// items the table no longer has, while the table is written: one worker is SIGKILLed during
/// the snapshot and another SIGSTOPped past its lease. The destination ends equal to the
/// table (the rows of vanished items deleted by the cleanup, the changes made during the
/// snapshot streamed after it), the cleanup ran once, and a worker that joins late streams at
/// once.
fn three_workers_mirror_one_table_through_a_kill_and_a_stop(emulator: Emulator, target: Target) {
    let running = emulator.start();
    running.create_pk_table(
        "items",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    for i in 0..240 {
        running.put_pk("items", &format!("k{i:03}"), "0");
    }
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(target, dir.path());
    // The destination holds rows before the mirror: the table's items, loaded by a scan of
    // another pipeline, 20 of them then re-keyed to items the table does not have.
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        format!(
            "name: seed\nsource:\n  region: us-east-1\n  endpoint_url: {}\n  \
             credentials: {{type: access_key, config: {{access_key_id: testing, secret_access_key: testing}}}}\n  \
             table_name: items\n  value_format: typed\n{}",
            running.endpoint,
            destination.sink_yaml()
        ),
    )
    .unwrap();
    let seeded = common::ddbpipe(&["run"], &seed);
    assert_eq!(seeded.status.code(), Some(0), "{}", stderr(&seeded));
    destination.execute("UPDATE items SET pk = 'ghost-' || pk WHERE pk < 'k020'");
    let ghosts = destination
        .rows("items")
        .into_keys()
        .filter(|k| k.starts_with("ghost-"))
        .count();
    assert_eq!(ghosts, 20);

    let config = shared_mirror_pipeline(dir.path(), &running.endpoint, &destination.sink_yaml());
    passes_check(&config);
    let mut workers: Vec<Child> = (0..3).map(|_| common::spawn_run(&config)).collect();
    // A writer changes the table during the snapshot and after it.
    let writer = writer(&running.endpoint, 120, Duration::from_millis(150), |step| {
        (format!("k{:03}", (step * 37) % 260), step % 4 == 3)
    });
    // Snapshot rows are marked: wait for some, then kill a worker and pause another.
    let marked = || {
        destination
            .rows("items")
            .values()
            .filter(|row| row.snapshot.is_some())
            .count()
    };
    let snapshotting = common::wait_for(Duration::from_secs(60), || marked() >= 40);
    assert!(snapshotting, "the workers write the snapshot");
    common::kill_one_and_stall_another(&mut workers);
    writer.join().unwrap();

    let table = common::keyed::table_items(&running.endpoint, "items");
    let converged = common::wait_for(Duration::from_secs(120), || {
        destination.items("items") == table
    });
    assert_eq!(
        destination.items("items"),
        table,
        "the destination ends equal to the table (converged: {converged})"
    );
    // A worker that joins now finds the snapshot closed and streams at once.
    let late = common::spawn_run(&config);
    std::thread::sleep(Duration::from_secs(3));
    workers.push(late);
    let mut said = Vec::new();
    for worker in workers {
        signal(&worker, "TERM");
        let output = finished(worker);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        said.push(stderr(&output));
    }
    let closed_here = said.iter().filter(|s| s.contains("closed here")).count();
    assert_eq!(closed_here, 1, "the cleanup ran once: {said:#?}");
    assert!(
        said[2].contains("closed before this worker came"),
        "the late worker streams at once: {}",
        said[2]
    );
    assert_eq!(shard_owner(&config), None, "SIGTERM hands the lease back");
}

/// Three workers of the shared mirror `config` while the writer that `writer` starts changes the
/// table: once 20 snapshot rows are written one is SIGKILLed and another SIGSTOPped past its
/// lease; then the snapshot record closes, the destination converges to the table and the
/// workers are stopped (each exits 0). Returns the snapshot's record (kept with the fences)
/// and the surviving workers' logs.
fn three_workers_through_a_kill_and_a_stop(
    config: &Path,
    running: &common::Running,
    destination: &Destination,
    writer: impl FnOnce() -> std::thread::JoinHandle<()>,
) -> (Value, Vec<String>) {
    passes_check(config);
    let mut workers: Vec<Child> = (0..3).map(|_| common::spawn_run(config)).collect();
    let writer = writer();
    let marked = || {
        destination
            .rows("items")
            .values()
            .filter(|row| row.snapshot.is_some())
            .count()
    };
    assert!(
        common::wait_for(Duration::from_secs(90), || marked() >= 20),
        "the workers write the snapshot"
    );
    common::kill_one_and_stall_another(&mut workers);
    writer.join().unwrap();
    let record = || -> Value {
        let stored = destination.query_texts(
            "SELECT position FROM _ddbpipe_fences WHERE pipeline = 'shared-mirror' AND unit = 'snapshot'",
        );
        serde_json::from_str(&stored[0][0]).unwrap()
    };
    let closed = common::wait_for(Duration::from_secs(240), || !record()["closed"].is_null());
    let table = common::keyed::table_items(&running.endpoint, "items");
    let converged = common::wait_for(Duration::from_secs(120), || {
        destination.items("items") == table
    });
    let mut said = Vec::new();
    for worker in workers {
        signal(&worker, "TERM");
        let output = finished(worker);
        said.push(stderr(&output));
        assert_eq!(output.status.code(), Some(0), "{}", said.last().unwrap());
    }
    let record = record();
    assert!(closed, "the snapshot was closed: {record}; {said:#?}");
    assert_eq!(
        destination.items("items"),
        table,
        "the destination ends equal to the table (converged: {converged}); {said:#?}"
    );
    (record, said)
}

/// Three workers mirror a table whose snapshot lasts longer than its stream keeps records (a
/// rolling 10 s retention of the scripted fake in front of moto; the slow snapshot takes about
/// twice that) into PostgreSQL while a writer changes it, one worker SIGKILLed during the snapshot and another
/// SIGSTOPped past its lease: the stream is read beside the snapshot from its start, so no
/// change is trimmed before it is read, and the destination ends equal to the table. (Read
/// after the snapshot, as shared mirrors did before, the changes of the snapshot's first
/// seconds were trimmed unread and lost without a word.)
#[test]
fn three_workers_mirror_a_snapshot_longer_than_the_streams_retention() {
    const RETENTION: Duration = Duration::from_secs(10);
    let running = Emulator::Moto.start();
    running.create_pk_table(
        "items",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    for i in 0..240 {
        running.put_pk("items", &format!("k{i:03}"), "0");
    }
    let fake = fake_export::FakeExport::start(&running.endpoint, &running.endpoint);
    fake.set_stream_retention(RETENTION);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Postgres, dir.path());
    let config = shared_mirror_pipeline(dir.path(), &fake.url(), &destination.sink_yaml());
    let slower = std::fs::read_to_string(&config)
        .unwrap()
        .replace("page_limit: 10", "page_limit: 5")
        .replace(
            "max_read_units_per_second: 2",
            "max_read_units_per_second: 1",
        );
    std::fs::write(&config, slower).unwrap();
    // Changes from the snapshot's first second on, through and after it.
    let (record, _) =
        three_workers_through_a_kill_and_a_stop(&config, &running, &destination, || {
            writer(&running.endpoint, 200, Duration::from_millis(150), |step| {
                (format!("k{:03}", (step * 37) % 260), step % 4 == 3)
            })
        });
    let took = record["closed"]["at_ms"].as_i64().unwrap() - record["id"].as_i64().unwrap();
    assert!(
        took > RETENTION.as_millis() as i64,
        "the snapshot took {took} ms, longer than the stream keeps records"
    );
    eprintln!("the snapshot took {took} ms; the stream keeps records {RETENTION:?}");
}

/// Three workers mirror a table from one export (`snapshot.engine: export`, docs/coordination.md
/// §11.12 rule 7) into PostgreSQL while a writer changes it: the export fake in front of moto
/// writes 6 data files and answers `IN_PROGRESS` to the first describes; one worker is
/// SIGKILLed once snapshot rows are written and another SIGSTOPped past its lease. One export
/// is started for the three (its ARN kept in the snapshot's record), no `Scan` request is
/// made, the cleanup runs once, and the destination ends equal to the table.
#[test]
fn three_workers_mirror_one_table_from_one_export() {
    let (running, fake) = exported_items(300);
    fake.set_data_files(6);
    fake.set_in_progress_describes(3);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Postgres, dir.path());
    // One file at a time per worker, 10 lines a page: the files outlast the first kill.
    let config = shared_export_mirror_pipeline(dir.path(), &fake.url(), &destination.sink_yaml());
    let (record, said) =
        three_workers_through_a_kill_and_a_stop(&config, &running, &destination, || {
            writer(&running.endpoint, 150, Duration::from_millis(100), |step| {
                (format!("k{:03}", (step * 37) % 320), step % 4 == 3)
            })
        });
    assert_eq!(
        fake.exports_started(),
        1,
        "one export for the three workers: {said:#?}"
    );
    assert!(
        record["export"]
            .as_str()
            .is_some_and(|arn| arn.contains("/export/")),
        "the record keeps the export: {record}"
    );
    assert_eq!(fake.forwarded("Scan"), 0, "no Scan request: {said:#?}");
    // `state show` lists the record the destination keeps: closed, naming its export.
    let (code, shown) = json_of(&["state", "show", "--json"], &config);
    assert_eq!(code, Some(0), "{shown}");
    assert_eq!(shown["snapshot"], record, "{shown}");
    let text = stdout(&common::ddbpipe(&["state", "show"], &config));
    assert!(
        text.contains("snapshot:") && text.contains("closed by") && text.contains("export arn:"),
        "{text}"
    );
    let closed_here = said.iter().filter(|s| s.contains("closed here")).count();
    assert_eq!(closed_here, 1, "the cleanup ran once: {said:#?}");
}

/// A shared mirror of `items` (40 items, NEW_AND_OLD_IMAGES) on moto behind the scripted fake,
/// into SQLite, with `source` added to its source section (`on_gap: …`).
struct GapSetup {
    running: common::Running,
    fake: fake_export::FakeExport,
    dir: tempfile::TempDir,
    destination: Destination,
    config: PathBuf,
}

fn gap_setup(source: &str) -> GapSetup {
    let running = Emulator::Moto.start();
    running.create_pk_table(
        "items",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    for i in 0..40 {
        running.put_pk("items", &format!("k{i:03}"), "0");
    }
    let fake = fake_export::FakeExport::start(&running.endpoint, &running.endpoint);
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Sqlite, dir.path());
    let config = shared_mirror_pipeline(dir.path(), &fake.url(), &destination.sink_yaml());
    let yaml = std::fs::read_to_string(&config)
        .unwrap()
        .replace("  mode: mirror\n", &format!("  mode: mirror\n  {source}"))
        .replace(
            "max_read_units_per_second: 2",
            "max_read_units_per_second: 50",
        );
    assert!(yaml.contains(source), "{yaml}");
    std::fs::write(&config, yaml).unwrap();
    GapSetup {
        running,
        fake,
        dir,
        destination,
        config,
    }
}

/// What changes while no worker runs: five items updated, five deleted, five new.
fn changes_while_no_worker_runs(running: &common::Running) {
    for i in 0..5 {
        running.put_pk("items", &format!("k{i:03}"), "1");
    }
    for i in 5..10 {
        running.delete_pk("items", &format!("k{i:03}"));
    }
    for i in 40..45 {
        running.put_pk("items", &format!("k{i:03}"), "0");
    }
}

/// Starts two workers of `config` and waits until the destination's record names another
/// snapshot than `first`, closed, with the destination equal to `table`; runs `meanwhile` while
/// they run; stops them (SIGTERM, exit 0). Whether it converged, what `meanwhile` gave, and the
/// workers' stderr.
fn two_workers_past<T>(
    config: &Path,
    destination: &Destination,
    first: &Value,
    table: &dyn Fn() -> std::collections::BTreeMap<String, Value>,
    meanwhile: impl FnOnce() -> T,
) -> (bool, T, Vec<String>) {
    let workers = [common::spawn_run(config), common::spawn_run(config)];
    let converged = common::wait_for(Duration::from_secs(120), || {
        let record = snapshot_record(destination);
        record["id"] != *first
            && !record["closed"].is_null()
            && destination.items("items") == table()
    });
    let seen = meanwhile();
    let mut said = Vec::new();
    for worker in workers {
        signal(&worker, "TERM");
        let output = finished(worker);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{text}");
        said.push(text);
    }
    (converged, seen, said)
}

/// docs/coordination.md §11.12 rule 8 end to end: a shared mirror with `on_gap: resnapshot`
/// into SQLite, on moto behind the scripted fake. A worker mirrors the table and is stopped;
/// while none runs, items are changed, deleted and added, and the stream is trimmed past
/// every record it had read. Two workers started then find the gap, take one snapshot of the
/// next generation between them (generation 1, not 2), and the destination ends equal to the
/// table (the deleted items' rows removed by its cleanup). `lag` reads the new generation's
/// shard rows (the first generation's stored checkpoints are trimmed: read there, it fails
/// on the gap), and `state reset` removes them with the record. With `on_gap: fail` the same
/// gap stops the workers (`keyed_mirror::a_shared_mirror_finds_a_gap_...`).
#[test]
fn two_workers_take_one_new_snapshot_between_them_on_a_gap() {
    let GapSetup {
        running,
        fake,
        dir: _dir,
        destination,
        config,
    } = gap_setup("on_gap: resnapshot\n");
    let table = || common::keyed::table_items(&running.endpoint, "items");
    let record = || snapshot_record(&destination);

    let worker = common::spawn_run(&config);
    let mirrored = common::wait_for(Duration::from_secs(60), || {
        !record()["closed"].is_null() && destination.items("items") == table()
    });
    signal(&worker, "TERM");
    let output = finished(worker);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        mirrored,
        "the first snapshot mirrors the table: {}",
        record()
    );
    let first = record()["id"].clone();
    // The gap: changes while no worker runs, then every record read so far is trimmed.
    changes_while_no_worker_runs(&running);
    fake.trim_stream_before(fake_export::now_ms());

    let (converged, (lag, state, shown), said) =
        two_workers_past(&config, &destination, &first, &table, || {
            let lag = common::ddbpipe(&["lag"], &config);
            let (_, state) = state_probe(&config);
            (lag, state, json_of(&["state", "show", "--json"], &config))
        });
    let (shown_code, shown) = shown;
    let replaced = record();
    assert!(
        converged,
        "the new snapshot mirrors the table: {replaced}; {said:#?}"
    );
    assert_eq!(replaced["generation"], 1, "one replacement: {replaced}");
    let why = replaced["replaced"].as_str().unwrap_or_default();
    assert!(
        why.contains("a gap in the stream") && why.contains("trimmed"),
        "{why}"
    );
    assert!(
        said.iter().any(|text| text.contains("generation 1")),
        "a worker's summary names the generation: {said:#?}"
    );
    assert_eq!(lag.status.code(), Some(0), "{}", stderr(&lag));
    // `check` and `state show` read the new generation's rows too: the first generation's
    // checkpoints are trimmed.
    assert_eq!(state["status"], "PASS", "{state}");
    assert_eq!(shown_code, Some(0), "{shown}");
    assert_eq!(shown["snapshot"]["generation"], 1, "{shown}");
    assert!(
        shown["leases"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|row| row["unit"]
                .as_str()
                .is_some_and(|u| u.starts_with("shard:")))),
        "the new generation's shard rows: {shown}"
    );

    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    assert_eq!(record(), Value::Null, "the record is gone");
    let fences = destination.query_texts("SELECT pipeline, unit FROM _ddbpipe_fences");
    assert!(
        fences.is_empty(),
        "every generation's fences are gone: {fences:?}"
    );
    let (code, shown) = json_of(&["state", "show", "--json"], &config);
    assert_eq!(code, Some(0), "{shown}");
    assert_eq!(
        shown["units"], 0,
        "no lease of either generation is left: {shown}"
    );
}

/// [`gap_setup`] with `on_gap: repair` and bucket `exports` (backups reaching back an hour: the
/// shortest incremental export, 15 min, fits), and a gap a repair mends: a worker mirrors the
/// table (a Scan snapshot, closed) and is stopped; while none runs, items are changed,
/// deleted, added, one is created and deleted, and the stream is trimmed past every record it
/// had read. The first snapshot's id and the Scan requests it made.
fn repairable_gap() -> (GapSetup, Value, usize) {
    let setup = gap_setup("on_gap: repair\n  snapshot: {s3_bucket: exports}\n");
    let GapSetup {
        running,
        fake,
        destination,
        config,
        ..
    } = &setup;
    fake_export::create_bucket(&running.endpoint, "exports");
    fake.set_earliest_restorable_ms(Some(fake_export::now_ms() - 3_600_000));
    let table = common::keyed::table_items(&running.endpoint, "items");
    mirror_until_closed_and_equal(config, destination, &table);
    let first = snapshot_record(destination)["id"].clone();
    let scans = fake.forwarded("Scan");
    assert!(scans > 0, "the first snapshot scans the table");
    let shown = stdout(&common::ddbpipe(&["state", "show"], config));
    assert!(
        shown.contains(",read:"),
        "a positioned shard row keeps its read_at: {shown}"
    );
    // The gap: changes while no worker runs, then every record read so far is trimmed.
    std::thread::sleep(Duration::from_millis(1100));
    changes_while_no_worker_runs(running);
    running.put_pk("items", "ghost", "1");
    running.delete_pk("items", "ghost");
    std::thread::sleep(Duration::from_millis(1100));
    fake.trim_stream_before(fake_export::now_ms());
    (setup, first, scans)
}

/// docs/coordination.md §11.12 rule 9 end to end: a shared mirror with `on_gap: repair` into
/// SQLite, on moto behind the export fake. A worker mirrors the table (a Scan snapshot) and is
/// stopped; while none runs, items are changed, deleted, added, and one is created and deleted,
/// and the stream is trimmed past every record it had read. Two workers started then plan one
/// repair from the shard rows' `read_at`, apply one incremental export between them (its files
/// leased as segments) and make no Scan request; the destination ends equal to the table, the
/// items deleted in the gap gone (the export's deletes).
#[test]
fn two_workers_repair_a_gap_from_one_incremental_export_between_them() {
    let (gap, first, scans) = repairable_gap();
    let GapSetup {
        running,
        fake,
        destination,
        config,
        ..
    } = &gap;
    let table = || common::keyed::table_items(&running.endpoint, "items");
    let record = || snapshot_record(destination);

    let (converged, (), said) = two_workers_past(config, destination, &first, &table, || ());
    let repaired = record();
    assert!(
        converged,
        "the repair mirrors the table: {repaired}; {said:#?}"
    );
    assert_eq!(repaired["generation"], 1, "one repair: {repaired}");
    assert!(
        repaired["repair"]["window_from_ms"].is_i64() && repaired["export"].is_string(),
        "the record names its window and its incremental export: {repaired}"
    );
    assert!(
        repaired["replaced"]
            .as_str()
            .is_some_and(|why| why.contains("a gap in the stream")),
        "{repaired}"
    );
    assert_eq!(
        fake.exports_started(),
        1,
        "one incremental export: {said:#?}"
    );
    assert_eq!(
        fake.forwarded("Scan"),
        scans,
        "no Scan request for the repair: {said:#?}"
    );
    let rows = destination.items("items");
    assert!(
        !rows.contains_key("ghost") && !rows.contains_key("k005"),
        "{rows:?}"
    );
    assert!(
        said.iter()
            .any(|text| text.contains("repair ") && text.contains("applied")),
        "a worker's summary names the repair: {said:#?}"
    );

    // `lag` of an open repair window (docs/coordination.md §11.11): the record as a worker
    // leaves it when it opens the repair's next generation, whose rows are not made yet.
    let mut open = repaired.clone();
    let map = open.as_object_mut().unwrap();
    map.remove("closed");
    map.remove("export");
    map.insert(
        "id".into(),
        Value::from(repaired["id"].as_i64().unwrap() + 1),
    );
    map.insert("generation".into(), Value::from(2));
    destination.execute(&format!(
        "UPDATE _ddbpipe_fences SET position = '{open}' WHERE pipeline = 'shared-mirror' AND \
         unit = 'snapshot'"
    ));
    let (code, lag) = json_of(&["lag", "--json"], config);
    assert_eq!(code, Some(0), "{lag}");
    assert_eq!(lag["snapshot"]["repair"], repaired["repair"], "{lag}");
    let limited = common::ddbpipe(&["lag", "--max-lag-seconds", "60"], config);
    let text = format!("{}{}", stdout(&limited), stderr(&limited));
    assert_eq!(
        limited.status.code(),
        Some(1),
        "no value to compare: {text}"
    );
    assert!(
        text.contains("shared repair open (the gap from")
            && text.contains("its incremental export is not read yet"),
        "{text}"
    );
}

#[test]
fn three_workers_mirror_one_table_into_sqlite_on_moto() {
    three_workers_mirror_one_table_through_a_kill_and_a_stop(Emulator::Moto, Target::Sqlite);
}

#[test]
fn three_workers_mirror_one_table_into_postgres_on_dynoxide() {
    three_workers_mirror_one_table_through_a_kill_and_a_stop(Emulator::Dynoxide, Target::Postgres);
}

#[test]
fn a_shared_stream_worker_serves_its_lag_and_leases_as_metrics_on_moto() {
    a_shared_stream_worker_serves_its_lag_and_leases_as_metrics(Emulator::Moto);
}

#[test]
fn three_workers_follow_one_stream_into_sqlite_on_moto() {
    three_workers_follow_one_stream_through_a_kill_and_a_stop(Emulator::Moto, Target::Sqlite);
}

#[test]
fn three_workers_follow_one_stream_into_postgres_on_dynoxide() {
    three_workers_follow_one_stream_through_a_kill_and_a_stop(Emulator::Dynoxide, Target::Postgres);
}

#[test]
fn three_workers_load_one_sqlite_table_on_moto() {
    three_workers_load_one_table_through_their_fences(Emulator::Moto, Target::Sqlite);
}

#[test]
fn three_workers_load_one_postgres_table_on_dynoxide() {
    three_workers_load_one_table_through_their_fences(Emulator::Dynoxide, Target::Postgres);
}

#[test]
fn a_second_process_with_a_live_workers_id_is_refused_on_moto() {
    a_second_process_with_a_live_workers_id_is_refused(Emulator::Moto);
}

#[test]
fn a_worker_writing_elsewhere_is_refused_naming_both_destinations_on_moto() {
    a_worker_writing_elsewhere_is_refused_naming_both_destinations(Emulator::Moto);
}

on_both_emulators!(
    three_workers_survive_a_kill_and_a_stop_and_their_files_hold_every_item,
    state_reset_refuses_while_a_worker_holds_leases,
);

#[test]
fn a_second_process_with_a_standbys_id_is_refused_on_moto() {
    a_second_process_with_a_standbys_id_is_refused(Emulator::Moto);
}

#[test]
fn a_killed_workers_segment_is_resumed_after_its_committed_position_on_dynoxide() {
    a_killed_workers_segment_is_resumed_after_its_committed_position(Emulator::Dynoxide);
}

/// docs/coordination.md §11.12 rules 7 and 8: a damaged data file of a shared export snapshot
/// (its MD5 differs from the manifest's) replaces the snapshot by one of the next generation,
/// which starts a new export: the worker reads it and the destination ends equal to the table,
/// the record naming generation 1 and the damage. A snapshot that replaced a damaged export and
/// meets another stops the worker (exit 1) naming the file, with the remedy that works with
/// workers: check the bucket, stop every worker, `state reset`, start them again. After it, a
/// worker stopped while the new snapshot starts its export, and one stopped while it waits for
/// it, exit 0; the next start awaits the same export and mirrors the table.
#[test]
fn a_damaged_shared_export_is_replaced_once_then_stops_the_worker_with_the_remedy() {
    let (running, fake) = exported_items(60);
    fake.set_data_files(1);
    fake.damage_next_export();
    let dir = tempfile::tempdir().unwrap();
    let destination = Destination::new(Target::Sqlite, dir.path());
    let config = shared_export_mirror_pipeline(dir.path(), &fake.url(), &destination.sink_yaml());
    let record = || snapshot_record(&destination);
    let table = common::keyed::table_items(&running.endpoint, "items");

    mirror_until_closed_and_equal(&config, &destination, &table);
    let replaced = record();
    assert_eq!(replaced["generation"], 1, "{replaced}");
    let why = replaced["replaced"].as_str().unwrap_or_default();
    assert!(
        why.contains("damaged export") && why.contains("its MD5 is"),
        "{why}"
    );
    assert_eq!(
        fake.exports_started(),
        2,
        "the damaged export and its replacement"
    );

    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    fake.damage_next_exports(2);
    let output = common::ddbpipe(&["run", "--progress", "never"], &config);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("its MD5 is"), "{text}");
    assert!(
        text.contains("damaged or gone again") && text.contains("ddbpipe state reset"),
        "{text}"
    );
    assert_eq!(
        record()["generation"],
        1,
        "replaced once, not again: {}",
        record()
    );

    let reset = common::ddbpipe(&["state", "reset", "--yes"], &config);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    // A stop while the new snapshot starts its export (the fake holds the StartExport), then
    // one while it waits for it (its first describes answer IN_PROGRESS): each exits 0, the
    // snapshot incomplete.
    fake.set_in_progress_describes(3);
    fake.delay_export_starts(Duration::from_secs(5));
    let started = fake.exports_started();
    stop_once(&config, "starts the new export", "snapshot", || {
        fake.exports_started() > started
    });
    fake.delay_export_starts(Duration::ZERO);
    let described = fake.describe_calls();
    stop_once(&config, "waits for the new export", "snapshot", || {
        fake.describe_calls() > described
    });

    // The next start waits for the same export and mirrors the table. (A StartExport the
    // stopped worker abandoned is dropped by the fake with its connection, so the one awaited
    // is the second worker's.)
    let started = fake.exports_started();
    mirror_until_closed_and_equal(&config, &destination, &table);
    assert_eq!(
        fake.exports_started(),
        started,
        "the export awaited before the stop is read after it"
    );
}
