//! The library's entry point (`ddbpipe::Pipeline`, issue 25): a pipeline built from the YAML the
//! command reads runs as `ddbpipe run` does, against the embedded emulator, and says how it
//! ended as a value; a bad config comes back with every problem at once.

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::types::StreamViewType;
use common::{Emulator, Pipeline, rt};
use ddbpipe::{Cancel, Ended, ErrorKind};

#[test]
fn a_pipeline_file_runs_through_the_library_as_the_command_runs_it() {
    let emulator = Emulator::Dynoxide.start();
    emulator.create_pk_table("orders", None);
    for i in 0..40 {
        emulator.put_pk("orders", &format!("k{i:02}"), "1");
    }
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
    assert_eq!(summary.written(), 40);
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
    assert_eq!(summary.written(), 5, "{summary}");
    assert_eq!(files.records().len(), 5);

    // A stop through the cancel handle ends the run cleanly, its position saved.
    emulator.put_pk("orders", "k9", "1");
    let (handle, stop) = Cancel::new();
    let summary = rt().block_on(async {
        let run = tokio::spawn(async move { pipeline.run(stop).await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        handle.cancel();
        run.await.expect("the run's task")
    });
    let summary = summary.unwrap_or_else(|e| panic!("{e}"));
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
            .is_some_and(|hint| hint.contains("fix the lines above"))
    );

    let missing =
        ddbpipe::Pipeline::from_path(dir.path().join("missing.yaml")).expect_err("no such file");
    assert_eq!(missing.kind(), ErrorKind::Config);
    assert!(missing.config_errors().is_empty());
    assert!(missing.to_string().contains("missing.yaml"), "{missing}");
}
