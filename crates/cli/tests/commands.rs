//! `check`, `discover`, config errors and a bad endpoint, through the CLI.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use aws_sdk_dynamodb::types::ScalarAttributeType;

use common::{Emulator, Pipeline, item, names_in, s, stderr, stdout};

fn check_passes_on_a_good_pipeline_and_fails_on_a_missing_index(emulator: Emulator) {
    let running = emulator.start();
    running.create_table(
        "items",
        ("pk", ScalarAttributeType::S),
        Some(("sk", ScalarAttributeType::N)),
    );
    running.put_items(
        "items",
        vec![item(vec![("pk", s("a")), ("sk", common::n("1"))])],
    );
    let pipeline = Pipeline::new(
        "items-export",
        &running.endpoint,
        "table_name: items\nsegments: 2",
    );
    let output = pipeline.ddbpipe(&["check", "--json"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["ok"], true);
    let names: Vec<&str> = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "config",
            "describe_table",
            "key_schema",
            "index",
            "read_capacity",
            "write_mode",
            "sink",
            "state"
        ]
    );
    let key_schema = &report["probes"][2];
    assert_eq!(key_schema["detail"], "pk (S), sk (N)");
    assert!(pipeline.lines().is_empty(), "check reads no data");

    pipeline.write(
        "items-export",
        &running.endpoint,
        "table_name: items\nindex_name: nope",
    );
    let output = pipeline.ddbpipe(&["check"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).contains("FAIL index"),
        "{}",
        stdout(&output)
    );
    assert!(stdout(&output).contains("index 'nope' not found on table 'items'; indexes: none"));
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("config error: source.index_name: index 'nope' not found"));
}

fn discover_lists_every_table_with_its_key_schema(emulator: Emulator) {
    let running = emulator.start();
    running.create_table(
        "orders",
        ("customer", ScalarAttributeType::S),
        Some(("order", ScalarAttributeType::N)),
    );
    running.create_table("blobs", ("id", ScalarAttributeType::B), None);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args([
            "discover",
            "--json",
            "--region",
            "us-east-1",
            "--endpoint-url",
            &running.endpoint,
        ])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let tables: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let tables = tables.as_array().unwrap();
    assert_eq!(tables.len(), 2);
    assert_eq!(tables[0]["name"], "blobs", "sorted by name");
    assert_eq!(tables[0]["schema"]["properties"]["id"]["type"], "string");
    assert_eq!(tables[1]["name"], "orders");
    assert_eq!(
        tables[1]["primary_key"],
        serde_json::json!(["customer", "order"])
    );
    assert_eq!(
        tables[1]["schema"]["properties"]["order"]["type"],
        serde_json::json!(["number", "string"])
    );
    assert_eq!(tables[1]["config_patch"]["table_name"], "orders");
    assert_eq!(tables[1]["kind"], "table");
}

/// Issue 11: `discover --table` of a missing table is a failure naming it, not an empty
/// success; the text lines carry the size and the billing with its capacity.
fn discover_of_a_missing_table_fails_and_text_lines_show_size_and_capacity(emulator: Emulator) {
    let running = emulator.start();
    running.create_table("orders", ("pk", ScalarAttributeType::S), None);
    let discover = |extra: &[&str]| {
        let mut args = vec![
            "discover",
            "--region",
            "us-east-1",
            "--endpoint-url",
            &running.endpoint,
        ];
        args.extend_from_slice(extra);
        common::ddbpipe_with_test_credentials(&args)
    };
    let output = discover(&["--table", "nope"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("table 'nope' not found"),
        "{}",
        stderr(&output)
    );
    let output = discover(&["--table", "orders"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let line = stdout(&output);
    assert!(
        line.starts_with("orders  key: pk (S)  ~0 items  0 B  PAY_PER_REQUEST"),
        "{line}"
    );
}

on_both_emulators!(
    check_passes_on_a_good_pipeline_and_fails_on_a_missing_index,
    discover_lists_every_table_with_its_key_schema,
    discover_of_a_missing_table_fails_and_text_lines_show_size_and_capacity,
);

#[test]
fn every_config_problem_is_reported_at_once_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "name: orders\nbogus: 1\nsource:\n  table_name: orders\n  segments: 0\n  batch_size: 0\n  \
         resnapshot_deletes: \"false\"\nsink:\n  type: jsonl\n",
    )
    .unwrap();
    let output = common::ddbpipe(&["run"], &config);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    for expected in [
        "config error: bogus: unknown field",
        "config error: source.resnapshot_deletes:",
        "config error: source.batch_size: batch_size must be 1..=1000000 (got 0)",
        "config error: source.segments: segments must be 1..=1000000 (got 0)",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    let check = common::ddbpipe(&["check"], &config);
    assert_eq!(check.status.code(), Some(2));

    std::fs::write(
        &config,
        "name: orders\nsource:\n  table_name: orders\n  mode: query\nsink:\n  type: jsonl\n",
    )
    .unwrap();
    let err = stderr(&common::ddbpipe(&["run"], &config));
    assert!(
        err.contains("mode: query requires key_condition_expression"),
        "{err}"
    );
    std::fs::write(
        &config,
        "name: orders\nsource:\n  table_name: orders\n  mode: streams\nsink:\n  type: jsonl\n",
    )
    .unwrap();
    let err = stderr(&common::ddbpipe(&["run"], &config));
    assert!(err.contains("needs a way to terminate"), "{err}");
    let missing = common::ddbpipe(&["run"], &dir.path().join("missing.yaml"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("cannot read config file"),
        "{}",
        stderr(&missing)
    );
}

/// Issue 9 item 4(c): no value under `credentials` reaches any output, in any command, even
/// when it is typed into the wrong place; with a good secret, not at trace level either.
#[test]
fn no_credentials_value_reaches_any_output_of_any_command() {
    const SECRET: &str = "SUPERSECRETVALUE123";
    let running = Emulator::Dynoxide.start();
    running.create_pk_table(
        "orders",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    running.put_pk("orders", "a", "1");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pipeline.yaml");
    let write = |credentials: &str| {
        std::fs::write(
            &config,
            format!(
                "name: orders-cdc\nsource:\n  table_name: orders\n  region: us-east-1\n  \
                 endpoint_url: {}\n  mode: streams\n  idle_termination_secs: 1\n  \
                 credentials: {credentials}\nsink:\n  type: jsonl\n  path: {}\n",
                running.endpoint,
                dir.path().join("out.jsonl").display()
            ),
        )
        .unwrap();
    };
    let misplaced = [
        format!("{{type: access_key, config: {SECRET}}}"),
        format!("{{type: {SECRET}}}"),
        format!(
            "{{type: access_key, config: {{access_key_id: [{SECRET}], secret_access_key: x}}}}"
        ),
        format!(
            "{{type: access_key, config: {{access_key_id: {SECRET}, secret_access_key: [{SECRET}]}}}}"
        ),
        format!("{{type: profile, config: {{name: {{a: {SECRET}}}}}}}"),
        SECRET.to_string(),
        // Interpolation problems quote the value they are in.
        format!(
            "{{type: access_key, config: {{access_key_id: testing, secret_access_key: 'x${{{SECRET}'}}}}"
        ),
        format!(
            "{{type: access_key, config: {{access_key_id: testing, secret_access_key: 'x${{{SECRET}!}}'}}}}"
        ),
    ];
    for credentials in &misplaced {
        write(credentials);
        for args in common::COMMANDS {
            let (output, text) = common::traced_at(&config, args);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{credentials} {args:?}: {text}"
            );
            assert!(
                text.contains("source.credentials"),
                "{credentials} {args:?}: {text}"
            );
            common::assert_hidden(&text, SECRET, 6, &format!("{credentials} {args:?}"));
        }
    }
    write("{type: access_key, config: {access_key_id: testing, secret_access_key: ''}}");
    let output = common::ddbpipe(&["check"], &config);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains(
            "source.credentials.config.secret_access_key: secret_access_key must not be empty"
        ),
        "{}",
        stderr(&output)
    );
    write(&format!(
        "{{type: access_key, config: {{access_key_id: testing, secret_access_key: {SECRET}}}}}"
    ));
    for args in common::COMMANDS {
        let (output, text) = common::traced_at(&config, args);
        assert_ne!(output.status.code(), Some(2), "{args:?}: {text}");
        common::assert_hidden(&text, SECRET, 6, &format!("{args:?}"));
    }
}

/// Issue 24 item 10: an endpoint URL's user-info and query values reach no output — log lines
/// (JSON and text), errors and hints, `--json` answers, the state file, `state show` — and an
/// entry an earlier ddbpipe stored with the password still reads, and is stored masked.
#[test]
fn an_endpoints_password_reaches_no_output_of_any_command() {
    const SECRET: &str = "Wq7xK9zTpw";
    let running = Emulator::Dynoxide.start();
    running.create_pk_table(
        "items",
        Some(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages),
    );
    running.put_pk("items", "a", "1");
    let endpoint = running
        .endpoint
        .replace("http://", &format!("http://user:{SECRET}@"));
    let masked = running.endpoint.replace("http://", "http://***@");
    let pipeline = Pipeline::new(
        "items-export",
        &endpoint,
        "table_name: items\nmode: mirror\nidle_termination_secs: 1",
    );

    // A run in text logs, then the state file it wrote.
    let run = pipeline.ddbpipe(&["run", "--progress", "never", "--log-level", "trace"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    common::assert_hidden(&stderr(&run), SECRET, 6, "run (text logs)");
    let state = std::fs::read_to_string(&pipeline.state).unwrap();
    common::assert_hidden(&state, SECRET, 6, "the state file");
    assert!(state.contains(&masked), "{state}");

    // As an earlier ddbpipe stored it: with the password, fingerprinted so.
    let mut doc: serde_json::Value = serde_json::from_str(&state).unwrap();
    let entry = &mut doc["pipelines"]["items-export"];
    entry["identity"]["endpoint_url"] = serde_json::json!(endpoint);
    entry["fingerprint"] = serde_json::json!(
        ddbpipe_pipeline::state::identity::Identity::fingerprint_of(&entry["identity"])
    );
    std::fs::write(&pipeline.state, doc.to_string()).unwrap();
    let (show, text) = common::traced(&pipeline, &["state", "show", "--json"]);
    assert_eq!(show.status.code(), Some(0), "{text}");
    assert!(text.contains(&masked), "{text}");
    common::assert_hidden(&text, SECRET, 6, "state show --json of an earlier entry");
    for args in common::COMMANDS {
        let (output, text) = common::traced(&pipeline, args);
        assert_ne!(output.status.code(), Some(2), "{args:?}: {text}");
        common::assert_hidden(&text, SECRET, 6, &format!("{args:?}"));
        if args[0] == "run" {
            assert_eq!(output.status.code(), Some(0), "{args:?}: {text}");
            let state = std::fs::read_to_string(&pipeline.state).unwrap();
            common::assert_hidden(&state, SECRET, 6, "the state file written again");
        }
    }
    let discover = common::ddbpipe_with_test_credentials(&[
        "discover",
        "--json",
        "--region",
        "us-east-1",
        "--endpoint-url",
        &endpoint,
        "--log-level",
        "trace",
    ]);
    assert_eq!(discover.status.code(), Some(0), "{}", stderr(&discover));
    let text = format!("{}{}", stdout(&discover), stderr(&discover));
    common::assert_hidden(&text, SECRET, 6, "discover --json");

    // Refused when read, by every command, without quoting the URL: a query (presigned
    // style), and a ${…} problem in the value.
    let refused = [
        (
            format!("endpoint_url: 'http://h/?X-Amz-Signature={SECRET}'"),
            "source.endpoint_url",
        ),
        (
            format!(
                "snapshot: {{engine: export, s3_bucket: b, \
                 s3_endpoint_url: 'http://u:{SECRET}@s3.local/?X-Amz-Signature={SECRET}'}}"
            ),
            "source.snapshot.s3_endpoint_url",
        ),
        (
            format!("endpoint_url: 'http://u:{SECRET}${{@h'"),
            "source.endpoint_url",
        ),
    ];
    let config = pipeline.dir.path().join("refused.yaml");
    for (line, field) in refused {
        std::fs::write(
            &config,
            format!(
                "name: items-export\nsource:\n  table_name: items\n  region: us-east-1\n  \
                 credentials: {{type: access_key, config: {{access_key_id: testing, \
                 secret_access_key: testing}}}}\n  {line}\nsink:\n  type: jsonl\n  path: out.jsonl\n"
            ),
        )
        .unwrap();
        for args in common::COMMANDS {
            let (output, said) = common::traced_at(&config, args);
            assert_eq!(output.status.code(), Some(2), "{line} {args:?}: {said}");
            assert!(said.contains(field), "{line} {args:?}: {said}");
            common::assert_hidden(&said, SECRET, 6, &format!("{line} {args:?}"));
        }
    }
}

/// Issue 11: relative paths in a pipeline file are relative to the file's directory, so a
/// run from cron (another working directory) writes and resumes the same files.
#[test]
fn relative_paths_are_relative_to_the_pipeline_file_wherever_ddbpipe_runs() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items("items", vec![item(vec![("pk", s("a"))])]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pipeline.yaml");
    std::fs::write(
        &config,
        format!(
            "name: items-export\nsource:\n  table_name: items\n  region: us-east-1\n  \
             endpoint_url: {}\n  credentials: {{type: access_key, config: {{access_key_id: t, \
             secret_access_key: t}}}}\nsink:\n  type: jsonl\n  path: out/items.jsonl\n\
             state:\n  path: state/items.json\n",
            running.endpoint
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    std::fs::create_dir(dir.path().join("state")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(["run", "--progress", "never"])
        .arg(&config)
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let written = std::fs::read_to_string(dir.path().join("out/items.jsonl")).unwrap();
    assert_eq!(written.lines().count(), 1);
    assert!(dir.path().join("state/items.json").exists());
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).unwrap().count(),
        0,
        "nothing was written in the working directory"
    );
}

/// Issue 11: without credentials a command fails at the first attempt with one line naming
/// the credential chain and the fix: no retries through the chain, no SDK `Debug` dumps.
#[test]
fn missing_credentials_fail_at_once_in_one_line() {
    let home = tempfile::tempdir().unwrap();
    let port = ddbpipe_testkit::free_port();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(["discover", "--region", "us-east-1", "--endpoint-url"])
        .arg(format!("http://127.0.0.1:{port}"))
        .env_clear()
        .env("HOME", home.path())
        // No instance metadata service to wait for in CI; the chain still fails the same way.
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("after 1 attempt(s): no AWS credentials"),
        "{err}"
    );
    assert!(
        err.contains("set one of them, or source.credentials"),
        "{err}"
    );
    for dump in ["DispatchFailure(", "ConnectorError {", "WARN"] {
        assert!(!err.contains(dump), "{dump} in {err}");
    }
    assert!(err.lines().count() <= 2, "{err}");
}

/// Issue #24 item 22: a run without credentials was told to check an endpoint that answers;
/// its hint is about the credentials.
#[test]
fn missing_credentials_are_hinted_as_credentials_not_as_an_unreachable_endpoint() {
    let running = Emulator::Dynoxide.start();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("p.yaml");
    std::fs::write(
        &config,
        format!(
            "name: nocreds\nsource:\n  table_name: orders\n  region: us-east-1\n  \
             endpoint_url: {}\nsink:\n  type: jsonl\n  path: {}\n",
            running.endpoint,
            home.path().join("out.jsonl").display()
        ),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(["run", "--progress", "never"])
        .arg(&config)
        .env_clear()
        .env("HOME", home.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("no AWS credentials"), "{err}");
    assert!(!err.contains("could not be reached"), "{err}");
    assert!(err.contains("hint: give ddbpipe credentials"), "{err}");
}

/// Issue 11: with `--log-format json` every line on stderr is a JSON object (logs, the run's
/// summary, `config error:`, `error:` and `hint:` lines); `check --json` of an invalid file
/// prints its errors as JSON on stdout.
#[test]
fn log_format_json_makes_every_stderr_line_json() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items("items", vec![item(vec![("pk", s("a"))])]);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let every_line_json = |output: &std::process::Output| -> Vec<serde_json::Value> {
        let err = stderr(output);
        err.lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{err}"))
            })
            .collect()
    };
    let output = pipeline.ddbpipe(&["--log-format", "json", "run", "--progress", "always"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines = every_line_json(&output);
    assert!(
        lines.iter().any(|l| l["kind"] == "summary"
            && l["message"].as_str().unwrap().contains("1 read, 1 written")),
        "{lines:?}"
    );
    // Issue 24 item 23: `pipeline` and `table` at the top level of every line (logs, progress
    // notes, the summary), not only inside a span object.
    assert!(
        lines.iter().any(
            |l| l["kind"] == "note" && l["message"].as_str().unwrap().starts_with("progress: ")
        ),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l["message"] == "Run started."),
        "{lines:?}"
    );
    for line in &lines {
        assert_eq!(line["pipeline"], "items-export", "{line}");
        assert_eq!(line["table"], "items", "{line}");
        assert!(line.get("span").is_none(), "{line}");
    }

    std::fs::write(
        &pipeline.config,
        "name: x\nsource: {table_name: t, segmnets: 2}\nsink: {type: jsonl}\n",
    )
    .unwrap();
    let output = pipeline.ddbpipe(&["--log-format", "json", "run"]);
    assert_eq!(output.status.code(), Some(2));
    let lines = every_line_json(&output);
    assert_eq!(lines[0]["kind"], "config_error", "{lines:?}");
    assert!(lines.iter().any(|l| l["kind"] == "hint"), "{lines:?}");

    let output = pipeline.ddbpipe(&["check", "--json"]);
    assert_eq!(output.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(
        report["errors"][0],
        "config error: source.segmnets: unknown field (did you mean segments?)"
    );
}

/// Issue 11: a `check` whose probe times out on a down endpoint says why (the connection was
/// refused), not only that nothing came back.
#[test]
fn check_names_the_connection_error_of_a_down_endpoint() {
    let port = ddbpipe_testkit::free_port();
    let pipeline = Pipeline::new(
        "items-export",
        &format!("http://127.0.0.1:{port}"),
        "table_name: items",
    );
    let output = pipeline.ddbpipe(&["check", "--timeout-secs", "1"]);
    assert_eq!(output.status.code(), Some(1));
    let text = stdout(&output);
    assert!(
        // A refused first request ends after three attempts (docs/errors.md §9.6), within
        // the timeout.
        text.contains("FAIL describe_table   DescribeTable 'items' failed after 3 attempt(s)")
            && text.contains("Connection refused"),
        "{text}"
    );
}

/// Issue 11: `--progress always` with stderr not a terminal writes progress lines instead of
/// drawing nothing.
#[test]
fn progress_always_writes_lines_when_stderr_is_no_terminal() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items(
        "items",
        (0..30)
            .map(|i| item(vec![("pk", s(&format!("k{i}")))]))
            .collect(),
    );
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let output = pipeline.ddbpipe(&["run", "--progress", "always"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.lines()
            .any(|l| l.starts_with("progress: ") && l.contains(" items")),
        "{err}"
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "auto"]);
    assert!(
        !stderr(&output).contains("progress: "),
        "auto draws nothing off a terminal"
    );
}

/// Issue 11: shell completions and the manual page come from the argument definitions.
#[test]
fn completions_and_the_manual_page_cover_every_command() {
    let ddbpipe = common::ddbpipe_with_test_credentials;
    for shell in ["bash", "zsh", "fish"] {
        let output = ddbpipe(&["completions", shell]);
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = stdout(&output);
        for word in ["discover", "lag", "schema", "metrics-file", "log-format"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    let output = ddbpipe(&["man"]);
    assert_eq!(output.status.code(), Some(0));
    let page = stdout(&output);
    assert!(page.contains(".TH ddbpipe 1"), "{page}");
    assert!(
        page.contains("check") && page.contains("discover") && page.contains("schema"),
        "{page}"
    );
}

/// Issue 11: `ddbpipe schema` prints a valid JSON Schema (draft 2020-12) of the pipeline file,
/// which accepts a pipeline `check` accepts and flags a mistyped key.
#[test]
fn schema_prints_a_json_schema_of_the_pipeline_file() {
    let output = common::ddbpipe_with_test_credentials(&["schema"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let schema: serde_json::Value =
        serde_json::from_str(&stdout(&output)).expect("schema prints JSON");
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    jsonschema::meta::validate(&schema).expect("a valid JSON Schema");
    let validator = jsonschema::draft202012::new(&schema).expect("the schema compiles");
    let mut pipeline = serde_json::json!({
        "name": "orders-export",
        "source": {"table_name": "orders", "mode": "scan", "segments": 4},
        "sink": {"type": "jsonl", "path": "out.jsonl", "write": "overwrite", "gzip": true},
        "state": {"flush_interval_ms": 0},
    });
    let errors: Vec<String> = validator
        .iter_errors(&pipeline)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    pipeline["sink"]["wirte"] = serde_json::json!("append");
    assert!(!validator.is_valid(&pipeline));
    for text in [
        "table_name",
        "\"description\"",
        "new_file_per_run",
        "assume_role",
    ] {
        assert!(stdout(&output).contains(text), "the schema names {text}");
    }
}

/// Issue 11: `init` describes a table and writes a pipeline file that `run` takes as it is;
/// it never overwrites a file.
#[test]
fn init_writes_a_pipeline_that_runs_and_never_overwrites() {
    let running = Emulator::Dynoxide.start();
    running.create_table("orders", ("pk", ScalarAttributeType::S), None);
    running.put_items(
        "orders",
        vec![item(vec![("pk", s("a"))]), item(vec![("pk", s("b"))])],
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("orders.yaml");
    let ddbpipe = common::ddbpipe_with_test_credentials;
    let init = [
        "init",
        "--table",
        "orders",
        "--region",
        "us-east-1",
        "--endpoint-url",
        &running.endpoint,
        "--output",
        file.to_str().unwrap(),
    ];
    let output = ddbpipe(&init);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("key pk (S)") && text.contains("mode: scan"),
        "{text}"
    );
    let output = ddbpipe(&["run", "--progress", "never", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let written = std::fs::read_to_string(dir.path().join("orders.jsonl")).unwrap();
    assert_eq!(written.lines().count(), 2, "{written}");

    let output = ddbpipe(&init);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("init never overwrites a file"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}

/// What `run` refuses, `check` refuses: `write: overwrite` cannot replace a device.
#[test]
fn check_fails_like_run_for_an_overwrite_of_a_device() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let state = pipeline.dir.path().join("state.json");
    pipeline.write_with_sink(
        "items-export",
        &running.endpoint,
        "table_name: items",
        &format!(
            "sink:\n  type: jsonl\n  path: /dev/null\n  write: overwrite\nstate:\n  path: {}\n",
            state.display()
        ),
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(
        stdout(&check)
            .contains("/dev/null is not a regular file: write: overwrite cannot replace it"),
        "{}",
        stdout(&check)
    );
    let run = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run)
            .contains("/dev/null is not a regular file: write: overwrite cannot replace it"),
        "{}",
        stderr(&run)
    );
}

/// Issue 9 item 10: a config file is read with a bound, and nesting is bounded before the
/// YAML parser (quadratic in the depth) sees it.
#[test]
fn an_endless_or_deeply_nested_config_file_is_refused_at_once() {
    let output = common::ddbpipe(&["check"], std::path::Path::new("/dev/zero"));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("config file /dev/zero is larger than 4 MiB"),
        "{}",
        stderr(&output)
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nested.yaml");
    std::fs::write(&config, "[".repeat(100_000)).unwrap();
    for command in ["check", "run"] {
        let output = common::ddbpipe(&[command], &config);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("nested more than 64 levels deep at line 1"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn an_unreachable_endpoint_fails_with_a_clear_error() {
    let port = ddbpipe_testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let pipeline = Pipeline::new(
        "items-export",
        &endpoint,
        "table_name: items\nretry: {max_retries: 1, initial_backoff_ms: 10}",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains("DescribeTable 'items' failed after 2 attempt(s)"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
    assert!(err.contains(&endpoint), "{err}");
    assert!(
        pipeline.entry("items-export").is_none(),
        "nothing was stored"
    );
    // Issue 24 item 10: the hint names the endpoint without its password.
    let with_password = format!("http://user:Wq7xK9zTpw@127.0.0.1:{port}");
    pipeline.write(
        "items-export",
        &with_password,
        "table_name: items\nretry: {max_retries: 1, initial_backoff_ms: 10}",
    );
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains(&format!("hint: check source.endpoint_url / source.region: http://***@127.0.0.1:{port} could not be reached")),
        "{err}"
    );
    common::assert_hidden(&err, "Wq7xK9zTpw", 6, "the hint");
}

/// Issue 24 item 22: a refused connection at a run's first request fails after three attempts
/// (well under a second), not the whole retry budget (nine attempts, ~17 s); `check` alike.
#[test]
fn a_refused_first_request_fails_after_three_attempts_not_the_whole_budget() {
    let port = ddbpipe_testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    // The default retry budget: eight retries.
    let pipeline = Pipeline::new("items-export", &endpoint, "table_name: items");
    let output = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert!(
        err.contains("DescribeTable 'items' failed after 3 attempt(s)"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "hint: check source.endpoint_url / source.region: {endpoint} could not be reached"
        )),
        "{err}"
    );
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("failed after 3 attempt(s)"),
        "{}",
        stdout(&check)
    );
}

/// `check` must fail where `run` fails at once, with the message `run` gives.
fn check_and_run_fail_alike(pipeline: &Pipeline, run_exit: i32, expected: &str) {
    let check = pipeline.ddbpipe(&["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(stdout(&check).contains(expected), "{}", stdout(&check));
    let run = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(run.status.code(), Some(run_exit), "{}", stderr(&run));
    assert!(stderr(&run).contains(expected), "{}", stderr(&run));
}

fn jsonl_sink(out: &std::path::Path, state: &std::path::Path) -> String {
    format!(
        "sink:\n  type: jsonl\n  path: {}\nstate:\n  path: {}\n",
        out.display(),
        state.display()
    )
}

/// Issue 9 item 11: a sink path that is the state file (here through a symlink) or the config
/// file passed `check`; `run` then wrote over the state or over its own config file.
#[test]
fn check_and_run_refuse_a_sink_path_that_is_the_state_file_or_the_config_file() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items("items", vec![item(vec![("pk", s("a"))])]);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let source = "table_name: items";
    let link = pipeline.dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&pipeline.state, &link).unwrap();
    let sink = jsonl_sink(&link, &pipeline.state);
    pipeline.write_with_sink("items-export", &running.endpoint, source, &sink);
    check_and_run_fail_alike(&pipeline, 2, "sink.path: ");
    check_and_run_fail_alike(&pipeline, 2, "is also the state file (state.path");
    assert!(!pipeline.state.exists(), "nothing was written");

    let sink = jsonl_sink(&pipeline.config, &pipeline.state);
    pipeline.write_with_sink("items-export", &running.endpoint, source, &sink);
    let config = std::fs::read_to_string(&pipeline.config).unwrap();
    check_and_run_fail_alike(&pipeline, 2, "sink.path: ");
    check_and_run_fail_alike(&pipeline, 2, "is the config file");
    assert_eq!(std::fs::read_to_string(&pipeline.config).unwrap(), config);

    // A relative spelling of the config file is the config file too.
    let relative = pipeline.dir.path().join(".").join("pipeline.yaml");
    let sink = jsonl_sink(&pipeline.out, &relative);
    pipeline.write_with_sink("items-export", &running.endpoint, source, &sink);
    let config = std::fs::read_to_string(&pipeline.config).unwrap();
    check_and_run_fail_alike(&pipeline, 2, "state.path: ");
    assert_eq!(std::fs::read_to_string(&pipeline.config).unwrap(), config);
    assert!(!pipeline.out.exists(), "nothing was written");
}

/// Issue 9 item 11: before the database existed, `check` skipped the key rules of keyed
/// sinks, and `run` then refused the table.
#[test]
fn check_applies_the_key_rules_of_run_before_the_database_exists() {
    let running = Emulator::Dynoxide.start();
    for (table, key) in [("docs", "document"), ("reserved", "_ddbpipe_key")] {
        running.create_table(table, (key, ScalarAttributeType::S), None);
        let pipeline = Pipeline::new("mirror", &running.endpoint, "table_name: items");
        let db = pipeline.dir.path().join("out.db");
        let sink = format!("sink:\n  type: sqlite\n  path: {}\n", db.display());
        let source = format!("table_name: {table}");
        pipeline.write_with_sink("mirror", &running.endpoint, &source, &sink);
        let expected = if key == "document" {
            "config error: sink.document_column: key attribute 'document'"
        } else {
            "config error: sink: key attribute '_ddbpipe_key' starts with the reserved prefix"
        };
        check_and_run_fail_alike(&pipeline, 2, expected);
    }
}

/// Issue 9 item 11: a state directory or a SQLite file the run cannot write passed `check`.
/// Root writes read-only files anyway, so both commands run as an unprivileged user
/// ([`common::ddbpipe_unprivileged`]); the probes make real write attempts, which are right
/// for every user.
#[test]
fn check_fails_like_run_when_the_state_directory_or_the_database_is_read_only() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items("items", vec![item(vec![("pk", s("a"))])]);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    common::open_to_all(&pipeline);
    let dir = pipeline.dir.path();
    let both = |expected: &[&str]| {
        let check = common::ddbpipe_unprivileged(&["check"], &pipeline.config, dir);
        let run =
            common::ddbpipe_unprivileged(&["run", "--progress", "never"], &pipeline.config, dir);
        assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
        assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
        for text in expected {
            assert!(stdout(&check).contains(text), "check: {}", stdout(&check));
            assert!(stderr(&run).contains(text), "run: {}", stderr(&run));
        }
    };

    // The state directory: the output is writable, the state's directory is not.
    let out_dir = dir.join("out");
    let state_dir = dir.join("state");
    for sub in [&out_dir, &state_dir] {
        std::fs::create_dir(sub).unwrap();
    }
    common::set_mode(&out_dir, 0o777);
    common::set_mode(&state_dir, 0o555);
    let sink = jsonl_sink(&out_dir.join("out.jsonl"), &state_dir.join("state.json"));
    pipeline.write_with_sink(
        "items-export",
        &running.endpoint,
        "table_name: items",
        &sink,
    );
    both(&["cannot write state file", "Permission denied", "state.path"]);

    // A database file the user cannot write, in a directory it can.
    let db_dir = dir.join("db");
    std::fs::create_dir(&db_dir).unwrap();
    common::set_mode(&db_dir, 0o777);
    let db = db_dir.join("out.db");
    let sink = format!("sink:\n  type: sqlite\n  path: {}\n", db.display());
    pipeline.write_with_sink(
        "items-export",
        &running.endpoint,
        "table_name: items",
        &sink,
    );
    let created = pipeline.ddbpipe(&["run", "--progress", "never"]);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    common::set_mode(&db, 0o444);
    let check = common::ddbpipe_unprivileged(&["check"], &pipeline.config, dir);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(stdout(&check).contains("FAIL sink"), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("Permission denied"),
        "{}",
        stdout(&check)
    );
    let run = common::ddbpipe_unprivileged(&["run", "--progress", "never"], &pipeline.config, dir);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));

    // The database file is writable, its directory (for the -wal and -shm files) is not.
    common::set_mode(&db, 0o666);
    common::set_mode(&db_dir, 0o555);
    let check = common::ddbpipe_unprivileged(&["check"], &pipeline.config, dir);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("is not writable"),
        "{}",
        stdout(&check)
    );
}

/// Issue 11: `check` says which write mode a jsonl sink has and which files a run writes —
/// for overwrite the temporary file and the file it replaces, for new_file_per_run the name
/// pattern and the next name — in text and in `--json`, and leaves the directory as it was.
#[test]
fn check_reports_the_write_mode_and_the_files_a_run_writes() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let dir = std::fs::canonicalize(pipeline.dir.path()).unwrap();
    let out = dir.join("out.jsonl");
    let temp = dir.join(".out.jsonl.tmp-items-export");
    let cases = [
        (
            "write: append",
            format!("append: appends to {}", out.display()),
        ),
        (
            "write: overwrite\n  gzip: true",
            format!(
                "overwrite, gzip: writes {}, renamed over {} when the run completes",
                temp.display(),
                out.display()
            ),
        ),
        (
            "write: new_file_per_run",
            format!(
                "new_file_per_run: writes {}, renamed to {} when the run completes (next: out.20",
                temp.display(),
                dir.join("out.<YYYYMMDDTHHMMSSZ>.jsonl").display()
            ),
        ),
    ];
    for (write, expected) in cases {
        let sink = format!(
            "sink:\n  type: jsonl\n  path: {}\n  {write}\nstate:\n  path: {}\n",
            out.display(),
            pipeline.state.display()
        );
        pipeline.write_with_sink(
            "items-export",
            &running.endpoint,
            "table_name: items",
            &sink,
        );
        let before = names_in(&dir);
        let check = pipeline.ddbpipe(&["check"]);
        assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
        let line = stdout(&check)
            .lines()
            .find(|line| line.starts_with("PASS write_mode"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("a write_mode probe: {}", stdout(&check)));
        assert!(line.contains(&expected), "{line}\nexpected: {expected}");
        assert_eq!(names_in(&dir), before, "check leaves no file behind");

        let check = pipeline.ddbpipe(&["check", "--json"]);
        let report: serde_json::Value = serde_json::from_str(&stdout(&check)).unwrap();
        let probe = report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|probe| probe["name"] == "write_mode")
            .cloned()
            .unwrap();
        let data = &probe["data"];
        let mode = write.split_whitespace().nth(1).unwrap();
        assert_eq!(data["write"], mode, "{probe}");
        match mode {
            "append" => assert_eq!(data["written"], out.display().to_string()),
            "overwrite" => {
                assert_eq!(data["written"], temp.display().to_string());
                assert_eq!(data["published"], out.display().to_string());
                assert_eq!(data["gzip"], true);
            }
            _ => {
                assert_eq!(data["written"], temp.display().to_string());
                let next = data["next"].as_str().unwrap();
                assert!(
                    next.starts_with(&format!("{}/out.20", dir.display())),
                    "{next}"
                );
                assert!(
                    data["pattern"]
                        .as_str()
                        .unwrap()
                        .ends_with("out.<YYYYMMDDTHHMMSSZ>.jsonl")
                );
            }
        }
        assert_eq!(names_in(&dir), before, "check --json leaves no file behind");
    }
}

/// Issue 11: `check` creates (and removes) the temporary file of an overwrite where the run
/// will, so what makes the run refuse it — a directory in its place, a name too long for the
/// file system — fails `check` too. Before, `check` probed only `path`, which the run never
/// opens in this mode.
#[test]
fn check_fails_like_run_when_the_temporary_file_cannot_be_created() {
    let running = Emulator::Dynoxide.start();
    running.create_table("items", ("pk", ScalarAttributeType::S), None);
    running.put_items("items", vec![item(vec![("pk", s("a"))])]);
    let pipeline = Pipeline::new("items-export", &running.endpoint, "table_name: items");
    let dir = std::fs::canonicalize(pipeline.dir.path()).unwrap();
    let overwrite = |out: &std::path::Path| {
        format!(
            "sink:\n  type: jsonl\n  path: {}\n  write: overwrite\nstate:\n  path: {}\n",
            out.display(),
            pipeline.state.display()
        )
    };
    let out = dir.join("out.jsonl");
    let temp = dir.join(".out.jsonl.tmp-items-export");
    std::fs::create_dir(&temp).unwrap();
    pipeline.write_with_sink(
        "items-export",
        &running.endpoint,
        "table_name: items",
        &overwrite(&out),
    );
    check_and_run_fail_alike(&pipeline, 1, &temp.display().to_string());
    assert!(!out.exists());
    std::fs::remove_dir(&temp).unwrap();

    // 245 characters are a valid name; the temporary file's 263 are not.
    let long = dir.join(format!("{}.jsonl", "x".repeat(239)));
    pipeline.write_with_sink(
        "items-export",
        &running.endpoint,
        "table_name: items",
        &overwrite(&long),
    );
    check_and_run_fail_alike(&pipeline, 1, "File name too long");
    assert!(!long.exists());
}
