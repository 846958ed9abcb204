//! The library's entry point (`ddbpipe::Pipeline`, issue 25): a pipeline built from the YAML the
//! command reads runs as `ddbpipe run` does, against the embedded emulator, and says how it
//! ended as a value; a bad config comes back with every problem at once.

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use common::{Emulator, Pipeline, rt};
use ddbpipe::{Cancel, Ended, ErrorKind};

/// Runs `pipeline` on a task of its own and stops it through its cancel handle 1.5 s later.
fn stopped_after_1500_ms(pipeline: ddbpipe::Pipeline) -> ddbpipe::Summary {
    let (handle, stop) = Cancel::new();
    let summary = rt().block_on(async {
        let run = tokio::spawn(async move { pipeline.run(stop).await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        handle.cancel();
        run.await.expect("the run's task")
    });
    summary.unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh emulator with table `orders` (its stream of `view`, if any) holding 40 items.
fn forty_orders(view: Option<StreamViewType>) -> common::Running {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", view);
    for i in 0..40 {
        emulator.put_pk("orders", &format!("k{i:02}"), "1");
    }
    emulator
}

#[test]
fn a_pipeline_file_runs_through_the_library_as_the_command_runs_it() {
    let emulator = forty_orders(None);
    let files = Pipeline::new(
        "orders",
        &emulator.endpoint,
        "table_name: orders\nsegments: 3",
    );
    let pipeline = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    assert_eq!(pipeline.name(), "orders");
    assert_eq!(pipeline.table(), "orders");

    let summary = rt()
        .block_on(pipeline.run(Cancel::never()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Complete);
    assert_eq!(summary.written(), Some(40));
    assert!(summary.note().is_none(), "{summary:?}");
    let said = summary.to_string();
    assert!(
        said.starts_with("ddbpipe: scan of 'orders' complete: 40 read, 40 written"),
        "{said}"
    );
    assert_eq!(files.records().len(), 40);

    // The command says the same sentence.
    std::fs::remove_file(&files.out).expect("remove the output");
    let output = files.ddbpipe(&["run"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("ddbpipe: scan of 'orders' complete: 40 read, 40 written"),
        "{stderr}"
    );
}

#[test]
fn a_stream_ends_with_its_end_condition_as_a_value() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let files = Pipeline::new(
        "changes",
        &emulator.endpoint,
        "table_name: orders\nmode: streams\nstart_position: trim_horizon\nidle_termination_secs: 2",
    );
    for i in 0..5 {
        emulator.put_pk("orders", &format!("k{i}"), "1");
    }
    let pipeline = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    let summary = rt()
        .block_on(pipeline.run(Cancel::never()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Idle, "{summary}");
    assert_eq!(summary.written(), Some(5), "{summary}");
    assert_eq!(files.records().len(), 5);

    // A stop through the cancel handle ends the run cleanly, its position saved.
    emulator.put_pk("orders", "k9", "1");
    let summary = stopped_after_1500_ms(pipeline);
    assert_eq!(summary.ended(), Ended::Stopped, "{summary}");
    assert_eq!(files.records().len(), 6);
}

#[test]
fn a_bad_config_comes_back_with_every_problem_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = "name: orders\nsource:\n  table_name: orders\n  segments: 0\n  mode: sideways\n\
                sink:\n  type: jsonl\n  path: out.jsonl\n";
    let error = ddbpipe::Pipeline::from_yaml(yaml, dir.path()).expect_err("an invalid config");
    assert_eq!(error.kind(), ErrorKind::Config);
    let fields: Vec<&str> = error
        .config_errors()
        .iter()
        .map(|e| e.path.as_str())
        .collect();
    assert!(
        fields.contains(&"source.segments") && fields.contains(&"source.mode"),
        "{fields:?}: {error}"
    );
    assert!(
        error
            .hint()
            .is_some_and(|hint| hint == "fix the fields above in the YAML given in code"),
        "{:?}",
        error.hint()
    );

    let missing =
        ddbpipe::Pipeline::from_path(dir.path().join("missing.yaml")).expect_err("no such file");
    assert_eq!(missing.kind(), ErrorKind::Config);
    assert!(missing.config_errors().is_empty());
    assert!(missing.to_string().contains("missing.yaml"), "{missing}");
}

/// A sink that keeps what it is given, and fails the batch `fail_at` (counted from 0) once.
#[derive(Clone, Default)]
struct Kept {
    records: std::sync::Arc<std::sync::Mutex<Vec<ddbpipe::sink::Record>>>,
    batches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    fail_at: Option<usize>,
}

impl ddbpipe::sink::Sink for Kept {
    fn describe(&self) -> String {
        "kept in memory".to_string()
    }

    async fn write(
        &mut self,
        batch: &ddbpipe::sink::Batch,
    ) -> Result<(), ddbpipe::sink::SinkError> {
        let index = self
            .batches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail_at == Some(index) {
            return Err(ddbpipe::sink::SinkError::transient("the service is busy"));
        }
        self.records
            .lock()
            .expect("the records")
            .extend(batch.records().iter().cloned());
        Ok(())
    }
}

/// [`Kept`] under another name.
struct Renamed(Kept);

impl ddbpipe::sink::Sink for Renamed {
    fn describe(&self) -> String {
        "another service".to_string()
    }

    async fn write(
        &mut self,
        batch: &ddbpipe::sink::Batch,
    ) -> Result<(), ddbpipe::sink::SinkError> {
        self.0.write(batch).await
    }
}

impl Kept {
    fn records(&self) -> Vec<ddbpipe::sink::Record> {
        self.records.lock().expect("the records").clone()
    }
}

const CUSTOM: &str = "sink:\n  type: custom\nstate:\n  path: state.json\n  flush_interval_ms: 0\n";

/// A table with a stream on a fresh emulator, and the file of a pipeline reading its changes
/// into a custom sink until 2 s pass without one.
fn changes_into_a_custom_sink() -> (common::Running, Pipeline) {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", Some(StreamViewType::NewAndOldImages));
    let files = Pipeline::new("changes", &emulator.endpoint, "");
    files.write_with_sink(
        "changes",
        &emulator.endpoint,
        "table_name: orders\nmode: streams\nidle_termination_secs: 2",
        CUSTOM,
    );
    (emulator, files)
}

#[test]
fn a_sink_given_in_code_gets_every_item_and_a_rerun_resumes_after_its_acknowledgements() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    for i in 0..30 {
        emulator.put_pk("orders", &format!("k{i:02}"), &i.to_string());
    }
    let files = Pipeline::new("orders", &emulator.endpoint, "");
    files.write_with_sink(
        "orders",
        &emulator.endpoint,
        "table_name: orders\nbatch_size: 10\npage_limit: 10",
        CUSTOM,
    );
    // The second batch fails: the run stops, its position after the first batch.
    let failing = Kept {
        fail_at: Some(1),
        ..Kept::default()
    };
    let pipeline = ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_sink(failing.clone());
    let error = rt()
        .block_on(pipeline.run(Cancel::never()))
        .expect_err("the sink failed a batch");
    assert_eq!(error.kind(), ErrorKind::Runtime);
    assert!(
        error.to_string().contains("the service is busy")
            && error.to_string().contains("kept in memory"),
        "{error}"
    );
    let first = failing.records();
    assert_eq!(first.len(), 10, "only the acknowledged batch");
    assert!(files.dir.path().join("state.json").exists());

    // The position belongs to that sink: the same file writing into jsonl instead, or into a
    // sink of another name, is refused naming the change, and the position stays.
    let stored = std::fs::read_to_string(files.dir.path().join("state.json")).expect("state");
    files.write_with_sink(
        "orders",
        &emulator.endpoint,
        "table_name: orders\nbatch_size: 10\npage_limit: 10",
        &format!(
            "sink:\n  type: jsonl\n  path: {}\n{}",
            files.out.display(),
            &CUSTOM[CUSTOM.find("state:").expect("a state section")..]
        ),
    );
    let output = files.ddbpipe(&["run"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("sink_path changed from \"custom kept in memory\""),
        "{stderr}"
    );
    files.write_with_sink(
        "orders",
        &emulator.endpoint,
        "table_name: orders\nbatch_size: 10\npage_limit: 10",
        CUSTOM,
    );
    let renamed = Renamed(Kept::default());
    let pipeline = ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_sink(renamed);
    let error = rt()
        .block_on(pipeline.run(Cancel::never()))
        .expect_err("another sink");
    assert_eq!(error.kind(), ErrorKind::Config, "{error}");
    assert!(error.to_string().contains("sink_path changed"), "{error}");
    assert_eq!(
        std::fs::read_to_string(files.dir.path().join("state.json")).expect("state"),
        stored
    );

    // The rerun goes on after the acknowledged batch: every item once across both runs.
    let working = Kept::default();
    let pipeline = ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_sink(working.clone());
    let summary = rt()
        .block_on(pipeline.run(Cancel::never()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Complete);
    assert_eq!(summary.written(), Some(20), "{summary}");
    let mut keys: Vec<String> = first
        .iter()
        .chain(working.records().iter())
        .map(|record| {
            assert_eq!(record.op(), ddbpipe::sink::Op::Item);
            let item = record.item().expect("an item");
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(record.json()).expect("JSON"),
                *item
            );
            item["pk"].as_str().expect("a key").to_string()
        })
        .collect();
    keys.sort();
    let expected: Vec<String> = (0..30).map(|i| format!("k{i:02}")).collect();
    assert_eq!(keys, expected);
}

#[test]
fn a_sink_given_in_code_gets_changes_with_their_key_images_and_sequence_numbers() {
    let (emulator, files) = changes_into_a_custom_sink();
    emulator.put_pk("orders", "a", "1");
    emulator.put_pk("orders", "a", "2");
    emulator.delete_pk("orders", "a");
    let kept = Kept::default();
    let pipeline = ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_sink(kept.clone());
    let summary = rt()
        .block_on(pipeline.run(Cancel::never()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.ended(), Ended::Idle);
    let records = kept.records();
    let ops: Vec<ddbpipe::sink::Op> = records.iter().map(|r| r.op()).collect();
    use ddbpipe::sink::Op;
    assert_eq!(ops, [Op::Insert, Op::Modify, Op::Remove]);
    for record in &records {
        assert_eq!(record.key(), Some(&serde_json::json!({"pk": "a"})));
        assert!(record.sequence_number().is_some() && record.shard_id().is_some());
    }
    assert_eq!(
        records[1].item().map(|i| i["v"].clone()),
        Some(serde_json::json!(2))
    );
    assert_eq!(
        records[1].before().map(|i| i["v"].clone()),
        Some(serde_json::json!(1))
    );
    assert_eq!(records[2].item(), None);
}

#[test]
fn a_custom_sink_without_one_given_in_code_is_refused_by_run_and_check() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    let files = Pipeline::new("orders", &emulator.endpoint, "");
    files.write_with_sink("orders", &emulator.endpoint, "table_name: orders", CUSTOM);
    for command in ["run", "check"] {
        let output = files.ddbpipe(&[command]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "{command}: {stderr}");
        assert!(
            format!("{stdout}{stderr}").contains("sink.type: custom is a sink given in code"),
            "{command}: {stdout}{stderr}"
        );
    }
    assert_eq!(files.ddbpipe(&["run"]).status.code(), Some(2));
    // Through the library as well, until a sink is given.
    let pipeline = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    let error = rt()
        .block_on(pipeline.run(Cancel::never()))
        .expect_err("no sink given");
    assert_eq!(error.kind(), ErrorKind::Config);

    // With coordination a custom sink is a config error naming the field.
    let yaml = format!(
        "name: orders\nsource: {{table_name: orders}}\n{CUSTOM}coordination: {{lease_table: leases}}\n"
    );
    let error = ddbpipe::Pipeline::from_yaml(&yaml, files.dir.path()).expect_err("refused");
    assert!(
        error.config_errors().iter().any(|e| e.path == "sink.type"),
        "{error}"
    );
    // It cannot delete rows a resnapshot did not see, as jsonl cannot.
    let yaml = format!(
        "name: orders\nsource: {{table_name: orders, mode: mirror, on_gap: resnapshot}}\n{CUSTOM}"
    );
    let error = ddbpipe::Pipeline::from_yaml(&yaml, files.dir.path()).expect_err("refused");
    assert!(
        error
            .config_errors()
            .iter()
            .any(|e| e.path == "source.resnapshot_deletes" && e.message.contains("custom sink")),
        "{error}"
    );
}

/// A checkpoint store in memory: the text of each pipeline's checkpoint, and how often it
/// was written.
#[derive(Clone, Default)]
struct Positions {
    texts: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>,
}

impl ddbpipe::store::CheckpointStore for Positions {
    fn describe(&self) -> String {
        "positions in memory".to_string()
    }

    async fn load(
        &mut self,
        pipeline: &str,
    ) -> Result<Option<ddbpipe::store::Checkpoint>, ddbpipe::store::StoreError> {
        let text = self.texts.lock().expect("the texts").get(pipeline).cloned();
        Ok(text.map(ddbpipe::store::Checkpoint::from_json))
    }

    async fn store(
        &mut self,
        pipeline: &str,
        checkpoint: Option<&ddbpipe::store::Checkpoint>,
    ) -> Result<(), ddbpipe::store::StoreError> {
        let mut texts = self.texts.lock().expect("the texts");
        match checkpoint {
            Some(checkpoint) => {
                texts.insert(pipeline.to_string(), checkpoint.as_json().to_string())
            }
            None => texts.remove(pipeline),
        };
        Ok(())
    }
}

#[test]
fn positions_kept_in_a_store_given_in_code_resume_a_stream_where_it_stopped() {
    let (emulator, files) = changes_into_a_custom_sink();
    let positions = Positions::default();
    let run = |kept: &Kept| {
        let pipeline = ddbpipe::Pipeline::from_path(&files.config)
            .expect("a valid pipeline")
            .with_sink(kept.clone())
            .with_checkpoint_store(positions.clone());
        rt().block_on(pipeline.run(Cancel::never()))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    emulator.put_pk("orders", "a", "1");
    emulator.put_pk("orders", "b", "1");
    let first = Kept::default();
    assert_eq!(run(&first).written(), Some(2));
    // The position is in the store, not in a state file.
    assert!(!files.dir.path().join("state.json").exists());
    let text = positions.texts.lock().expect("the texts")["changes"].clone();
    assert!(text.contains("\"position\""), "{text}");

    // The next run reads only what came after.
    emulator.put_pk("orders", "c", "1");
    let second = Kept::default();
    assert_eq!(run(&second).written(), Some(1));
    let keys: Vec<serde_json::Value> = second
        .records()
        .iter()
        .filter_map(|r| r.key().cloned())
        .collect();
    assert_eq!(keys, [serde_json::json!({"pk": "c"})]);

    // A text that is not a checkpoint stops the run and is left as it is.
    positions
        .texts
        .lock()
        .expect("the texts")
        .insert("changes".into(), "{\"position\": 7}".into());
    let pipeline = ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_sink(Kept::default())
        .with_checkpoint_store(positions.clone());
    let error = rt()
        .block_on(pipeline.run(Cancel::never()))
        .expect_err("a corrupt checkpoint");
    assert!(
        error.to_string().contains("positions in memory")
            && error.to_string().contains("pipeline 'changes'"),
        "{error}"
    );
    assert_eq!(
        positions.texts.lock().expect("the texts")["changes"],
        "{\"position\": 7}"
    );

    // A keyed sink keeps its position in its database: a store given beside it is refused.
    let db = files.dir.path().join("out.db");
    files.write_with_sink(
        "changes",
        &emulator.endpoint,
        "table_name: orders\nmode: streams\nidle_termination_secs: 2",
        &format!("sink:\n  type: sqlite\n  path: {}\n", db.display()),
    );
    let pipeline = ddbpipe::Pipeline::from_path(&files.config)
        .expect("a valid pipeline")
        .with_checkpoint_store(positions.clone());
    let error = rt()
        .block_on(pipeline.run(Cancel::never()))
        .expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(
        error.to_string().contains("sqlite sink keeps the position"),
        "{error}"
    );
    assert!(!db.exists(), "nothing was opened");
}

#[test]
fn a_program_s_own_sdk_config_builds_every_client() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    for i in 0..7 {
        emulator.put_pk("orders", &format!("k{i}"), "1");
    }
    // The file names no endpoint and a region the emulator is not: only the program's SDK
    // configuration leads to it.
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "name: orders\nsource:\n  table_name: orders\n  region: eu-north-1\n\
         sink:\n  type: jsonl\n  path: {}\n",
        dir.path().join("out.jsonl").display()
    );
    let sdk = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&emulator.endpoint)
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(
                aws_credential_types::Credentials::new("testing", "testing", None, None, "program"),
            ),
        )
        .build();
    let pipeline = ddbpipe::Pipeline::from_yaml(&yaml, dir.path())
        .expect("a valid pipeline")
        .with_sdk_config(sdk);
    let summary = rt()
        .block_on(pipeline.run(Cancel::never()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(summary.written(), Some(7), "{summary}");
    let lines = std::fs::read_to_string(dir.path().join("out.jsonl")).expect("the output");
    assert_eq!(lines.lines().count(), 7);
}

#[test]
fn a_stop_inside_a_mirror_s_snapshot_ends_snapshot_stopped_without_a_count() {
    let emulator = forty_orders(Some(StreamViewType::NewAndOldImages));
    // One item a page at one read unit a second: the snapshot takes far longer than the stop.
    let files = Pipeline::new(
        "mirror",
        &emulator.endpoint,
        "table_name: orders\nmode: mirror\nidle_termination_secs: 2\npage_limit: 1\n\
         max_read_units_per_second: 1\nresnapshot_deletes: false",
    );
    let pipeline = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    let summary = stopped_after_1500_ms(pipeline);
    assert_eq!(summary.ended(), Ended::SnapshotStopped, "{summary}");
    assert_eq!(summary.written(), None, "{summary}");
    assert!(
        summary
            .note()
            .is_some_and(|note| note.contains("the snapshot is incomplete")),
        "{summary:?}"
    );
    assert!(files.records().len() < 40, "the snapshot was stopped");
}

#[test]
fn an_error_says_each_cause_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let error =
        ddbpipe::Pipeline::from_path(dir.path().join("missing.yaml")).expect_err("no such file");
    // Display holds the causes; a reporter walking `source()` adds none again.
    assert!(std::error::Error::source(&error).is_none(), "{error:?}");
    let said = error.to_string();
    assert!(
        said.contains("missing.yaml") && said.contains("No such file"),
        "{said}"
    );
}

#[test]
fn an_opened_pipeline_holds_its_lock_and_reads_nothing_until_it_runs() {
    let emulator = forty_orders(None);
    let files = Pipeline::new("orders", &emulator.endpoint, "table_name: orders");
    let pipeline = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    let second = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    rt().block_on(async {
        let opened = pipeline.open(Cancel::never()).await.expect("opened");
        assert!(
            !files.out.exists() || files.records().is_empty(),
            "nothing is read before Opened::run"
        );
        // Open, the run holds the pipeline's lock: another run of it is refused.
        let refused = second
            .open(Cancel::never())
            .await
            .expect_err("the pipeline is locked");
        assert_eq!(refused.kind(), ErrorKind::Runtime, "{refused}");
        assert!(
            refused
                .hint()
                .is_some_and(|hint| hint.contains("wait for the other run to finish")),
            "{refused}: {:?}",
            refused.hint()
        );
        let summary = opened.run().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(summary.written(), Some(40), "{summary}");
        // Its run over, the lock is released.
        let again = second
            .open(Cancel::never())
            .await
            .expect("the lock is free");
        drop(again);
    });
    assert_eq!(files.records().len(), 40);
}

#[test]
fn a_pipeline_given_as_yaml_says_how_to_resume_in_the_library_s_words() {
    let emulator = forty_orders(None);
    // One item a page at one read unit a second: the scan takes far longer than the stop.
    let files = Pipeline::new(
        "orders",
        &emulator.endpoint,
        "table_name: orders\npage_limit: 1\nmax_read_units_per_second: 1",
    );
    let yaml = std::fs::read_to_string(&files.config).expect("the pipeline file");
    let dir = files.config.parent().expect("its directory");
    let pipeline = ddbpipe::Pipeline::from_yaml(&yaml, dir).expect("a valid pipeline");
    let summary = stopped_after_1500_ms(pipeline);
    assert_eq!(summary.ended(), Ended::Stopped, "{summary}");
    let note = summary.note().expect("a stopped scan's note");
    // No file a command could be given: the remedy is the library's.
    assert!(
        note.contains("running the pipeline again resumes it"),
        "{note}"
    );
    assert!(!note.contains("ddbpipe run"), "{note}");

    // The same file through from_path: the command that resumes it.
    let pipeline = ddbpipe::Pipeline::from_path(&files.config).expect("a valid pipeline");
    let summary = stopped_after_1500_ms(pipeline);
    let note = summary.note().expect("a stopped scan's note");
    let resume = format!("`ddbpipe run {}` resumes it", files.config.display());
    assert!(note.contains(&resume), "{note}");
}
