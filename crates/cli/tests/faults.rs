//! Fault injection through the real binary: a scripted DynamoDB endpoint throttles, fails,
//! hangs and describes awkward tables, and `ddbpipe run` / `ddbpipe check` must retry, stop
//! and report exactly as docs/errors.md §9 (errors and retries), docs/scan.md §2.2 (requests) and §2.7 (read-capacity
//! limit) say. Nothing here measures elapsed time: backoffs are configured short and
//! outcomes are counted in requests.

mod fake_dynamodb;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use fake_dynamodb::{
    FakeDynamoDb, Op, Pipeline, aws_error, on_demand_table, provisioned_table, scan_page, throttle,
};

/// A fake whose `DescribeTable` answers with a provisioned table `t` of 100 RCU.
async fn fake_with_table() -> FakeDynamoDb {
    let fake = FakeDynamoDb::start().await;
    fake.always(Op::DescribeTable, provisioned_table("t", 100))
        .await;
    fake
}

/// The probe called `name` in a `check --json` report.
fn probe<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["probes"]
        .as_array()
        .expect("probes is an array")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no probe '{name}' in {report}"))
}

/// The first number in a line of text.
fn first_number(text: &str) -> Option<f64> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|word| word.chars().any(|c| c.is_ascii_digit()))
        .and_then(|word| word.trim_matches('.').parse().ok())
}

// --- docs/errors.md §9.3: the retry budget, pinned cases -------------------------------------------

#[tokio::test]
async fn a_scan_throttled_twice_succeeds_on_the_third_call() {
    let fake = fake_with_table().await;
    fake.next(Op::Scan, 2, throttle()).await;
    fake.always(Op::Scan, scan_page("t", &["a", "b", "c"], None))
        .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 3);
    assert_eq!(pipeline.written_keys(), ["a", "b", "c"]);
}

/// docs/errors.md §9.7: retries show at `info` once a minute per operation, with the count and
/// the last cause; each one at `debug`.
#[tokio::test]
async fn retries_are_logged_at_info_once_with_their_count_and_cause() {
    let fake = fake_with_table().await;
    fake.next(
        Op::Scan,
        3,
        aws_error(503, "ServiceUnavailable", "try again"),
    )
    .await;
    fake.always(Op::Scan, scan_page("t", &["a"], None)).await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run_with(&["--log-format", "json"]).await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 4);
    let retries: Vec<serde_json::Value> = outcome
        .stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["operation"] == "scan" && line["retries"].is_u64())
        .collect();
    // Three retries within a minute: the first is the one line (the others are `debug`).
    assert_eq!(retries.len(), 1, "{}", outcome.stderr);
    assert_eq!(retries[0]["level"], "INFO", "{}", outcome.stderr);
    assert_eq!(retries[0]["retries"], 1, "{}", outcome.stderr);
    let cause = retries[0]["error"].as_str().unwrap_or_default();
    assert!(cause.contains("ServiceUnavailable"), "{}", outcome.stderr);
}

#[tokio::test]
async fn a_scan_that_always_throttles_fails_once_the_retries_are_spent() {
    let fake = fake_with_table().await;
    fake.always(Op::Scan, throttle()).await;
    let pipeline = Pipeline::new(&fake).max_retries(1);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome
            .stderr
            .contains("scan of 't' failed after 2 attempt(s)"),
        "{}",
        outcome.stderr
    );
    assert!(
        outcome
            .stderr
            .contains("ProvisionedThroughputExceededException"),
        "{}",
        outcome.stderr
    );
    assert_eq!(fake.calls(Op::Scan).await, 2);
    assert!(pipeline.written_keys().is_empty());
}

#[tokio::test]
async fn a_fatal_scan_error_is_not_retried_and_its_message_is_shown_verbatim() {
    let fake = fake_with_table().await;
    let message =
        "One or more parameter values were invalid: ExclusiveStartKey is bogus (ref 7f3a)";
    fake.always(Op::Scan, aws_error(400, "ValidationException", message))
        .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 1);
    assert!(
        outcome
            .stderr
            .contains("scan of 't' failed after 1 attempt(s)"),
        "{}",
        outcome.stderr
    );
    assert!(outcome.stderr.contains(message), "{}", outcome.stderr);
}

/// Issue 9 item 12: a complete answer that does not decode is definite: one attempt, not the
/// whole retry budget.
#[tokio::test]
async fn a_scan_answer_that_does_not_decode_is_not_retried() {
    let fake = fake_with_table().await;
    fake.always(
        Op::Scan,
        fake_dynamodb::ok(json!({"Items": [{"pk": {"S": 1}}], "Count": 1})),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 1);
    assert!(
        outcome.stderr.contains(
            "scan of 't' failed after 1 attempt(s): the Scan or Query response cannot be read"
        ),
        "{}",
        outcome.stderr
    );
}

#[tokio::test]
async fn a_transient_server_error_is_retried_up_to_the_budget_then_fails() {
    let fake = fake_with_table().await;
    fake.always(
        Op::Scan,
        aws_error(500, "InternalServerError", "Internal server error"),
    )
    .await;
    let pipeline = Pipeline::new(&fake).max_retries(2);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 3);
    assert!(
        outcome
            .stderr
            .contains("scan of 't' failed after 3 attempt(s)"),
        "{}",
        outcome.stderr
    );
    assert!(
        outcome.stderr.contains("InternalServerError"),
        "{}",
        outcome.stderr
    );
}

#[tokio::test]
async fn throttles_and_transients_share_one_budget() {
    let fake = fake_with_table().await;
    fake.next(Op::Scan, 1, throttle()).await;
    fake.always(Op::Scan, aws_error(503, "ServiceUnavailable", "try again"))
        .await;
    let pipeline = Pipeline::new(&fake).max_retries(2);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 3);
    assert!(
        outcome.stderr.contains("failed after 3 attempt(s)"),
        "{}",
        outcome.stderr
    );
}

// --- docs/errors.md §9.1 Differs: an attempt that hangs is a transient -----------------------------

#[tokio::test]
async fn an_attempt_that_hangs_past_the_attempt_timeout_is_retried() {
    let fake = fake_with_table().await;
    // Had the hung attempt been waited for, its (fatal) answer would fail the run.
    let late = aws_error(
        400,
        "ValidationException",
        "the hung attempt was waited for",
    )
    .set_delay(Duration::from_secs(20));
    fake.next(Op::Scan, 1, late).await;
    fake.always(Op::Scan, scan_page("t", &["a"], None)).await;
    let pipeline = Pipeline::new(&fake).attempt_timeout_ms(2, 1000);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 2);
    assert_eq!(pipeline.written_keys(), ["a"]);
}

// --- docs/scan.md §2.2: what every Scan request carries ------------------------------------------

#[tokio::test]
async fn a_one_segment_scan_asks_for_total_capacity_and_the_page_limit_without_segment_fields() {
    let fake = fake_with_table().await;
    fake.always(Op::Scan, scan_page("t", &["a"], None)).await;
    let pipeline = Pipeline::new(&fake)
        .source("segments: 1")
        .source("page_limit: 25");

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let bodies = fake.bodies(Op::Scan).await;
    assert_eq!(bodies.len(), 1);
    let body = &bodies[0];
    assert_eq!(body["TableName"], "t");
    assert_eq!(body["ReturnConsumedCapacity"], "TOTAL");
    assert_eq!(body["Limit"], 25);
    assert!(body.get("Segment").is_none(), "{body}");
    assert!(body.get("TotalSegments").is_none(), "{body}");
    assert!(body.get("ExclusiveStartKey").is_none(), "{body}");
}

#[tokio::test]
async fn a_parallel_scan_sends_each_segment_with_the_total() {
    let fake = fake_with_table().await;
    fake.always(Op::Scan, scan_page("t", &[], None)).await;
    let pipeline = Pipeline::new(&fake)
        .source("segments: 3")
        .source("page_limit: 7");

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let bodies = fake.bodies(Op::Scan).await;
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    for body in &bodies {
        assert_eq!(body["ReturnConsumedCapacity"], "TOTAL", "{body}");
        assert_eq!(body["TotalSegments"], 3, "{body}");
        assert_eq!(body["Limit"], 7, "{body}");
    }
    let segments: BTreeSet<i64> = bodies
        .iter()
        .filter_map(|b| b["Segment"].as_i64())
        .collect();
    assert_eq!(segments, BTreeSet::from([0, 1, 2]));
}

#[tokio::test]
async fn the_second_page_starts_at_the_first_pages_last_evaluated_key() {
    let fake = fake_with_table().await;
    fake.next(Op::Scan, 1, scan_page("t", &["a"], Some("a")))
        .await;
    fake.always(Op::Scan, scan_page("t", &["b"], None)).await;
    let pipeline = Pipeline::new(&fake).source("page_limit: 1");

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let bodies = fake.bodies(Op::Scan).await;
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(
        bodies[0].get("ExclusiveStartKey").is_none(),
        "{}",
        bodies[0]
    );
    assert_eq!(bodies[1]["ExclusiveStartKey"], json!({"pk": {"S": "a"}}));
    for body in &bodies {
        assert_eq!(body["ReturnConsumedCapacity"], "TOTAL", "{body}");
        assert_eq!(body["Limit"], 1, "{body}");
    }
    assert_eq!(pipeline.written_keys(), ["a", "b"]);
}

// --- docs/scan.md §2.7: the read-capacity fraction needs a base -----------------------------------

#[tokio::test]
async fn check_fails_read_capacity_for_a_fraction_of_an_on_demand_table_without_a_maximum() {
    let fake = FakeDynamoDb::start().await;
    fake.always(Op::DescribeTable, on_demand_table("t")).await;
    let pipeline = Pipeline::new(&fake).source("read_capacity_fraction: 0.5");

    let (outcome, report) = pipeline.check_json().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert_eq!(report["ok"], false, "{report}");
    let read_capacity = probe(&report, "read_capacity");
    assert_eq!(read_capacity["status"], "FAIL", "{report}");
    let detail = read_capacity["detail"]
        .as_str()
        .expect("detail is a string");
    assert!(detail.contains("needs a base"), "{detail}");
    assert_eq!(fake.calls(Op::Scan).await, 0);
}

#[tokio::test]
async fn run_refuses_a_fraction_of_an_on_demand_table_without_a_maximum_before_scanning() {
    let fake = FakeDynamoDb::start().await;
    fake.always(Op::DescribeTable, on_demand_table("t")).await;
    fake.always(Op::Scan, scan_page("t", &["a"], None)).await;
    let pipeline = Pipeline::new(&fake).source("read_capacity_fraction: 0.5");

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("needs a base"),
        "{}",
        outcome.stderr
    );
    assert_eq!(fake.calls(Op::Scan).await, 0);
    assert!(pipeline.written_keys().is_empty());
}

#[tokio::test]
async fn check_shows_half_the_provisioned_read_capacity_for_a_fraction_of_one_half() {
    let fake = FakeDynamoDb::start().await;
    fake.always(Op::DescribeTable, provisioned_table("t", 100))
        .await;
    let pipeline = Pipeline::new(&fake).source("read_capacity_fraction: 0.5");

    let (outcome, report) = pipeline.check_json().await;

    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    assert_eq!(report["ok"], true, "{report}");
    let read_capacity = probe(&report, "read_capacity");
    assert_eq!(read_capacity["status"], "PASS", "{report}");
    let detail = read_capacity["detail"]
        .as_str()
        .expect("detail is a string");
    assert_eq!(first_number(detail), Some(50.0), "{detail}");
    assert_eq!(fake.calls(Op::Scan).await, 0);
}

// --- docs/errors.md §9.5: messages -------------------------------------------------------------------

#[tokio::test]
async fn a_missing_table_fails_naming_the_table_with_a_hint() {
    let fake = FakeDynamoDb::start().await;
    fake.always(
        Op::DescribeTable,
        aws_error(
            400,
            "ResourceNotFoundException",
            "Requested resource not found",
        ),
    )
    .await;
    fake.always(Op::Scan, scan_page("orders", &["a"], None))
        .await;
    let pipeline = Pipeline::new(&fake).table("orders");

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(outcome.stderr.contains("'orders'"), "{}", outcome.stderr);
    assert!(
        outcome.stderr.contains("Requested resource not found"),
        "{}",
        outcome.stderr
    );
    assert!(
        outcome
            .stderr
            .lines()
            .any(|line| line.starts_with("hint: ")),
        "{}",
        outcome.stderr
    );
    assert_eq!(
        fake.calls(Op::DescribeTable).await,
        1,
        "a fatal error is not retried"
    );
    assert_eq!(fake.calls(Op::Scan).await, 0);
}

#[tokio::test]
async fn the_secret_access_key_appears_in_no_output_of_a_failing_run_or_a_check() {
    const SECRET: &str = "SUPERSECRET123";
    let fake = fake_with_table().await;
    fake.always(Op::Scan, throttle()).await;
    let pipeline = Pipeline::new(&fake)
        .max_retries(1)
        .secret_access_key(SECRET);

    let run = pipeline.run_with(&["--log-level", "trace"]).await;
    let (check, _) = pipeline.check_json().await;

    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("failed after 2 attempt(s)"),
        "{}",
        run.stderr
    );
    assert_eq!(check.code, Some(0), "{check:?}");
    for (what, text) in [
        ("run stdout", &run.stdout),
        ("run stderr", &run.stderr),
        ("check stdout", &check.stdout),
        ("check stderr", &check.stderr),
    ] {
        assert!(!text.contains(SECRET), "{what} shows the secret:\n{text}");
    }
}

// --- docs/errors.md §9.5: access errors name the action, the resource and the credentials ------------

#[tokio::test]
async fn an_access_denied_scan_names_the_action_the_table_and_the_credentials() {
    let fake = fake_with_table().await;
    fake.always(
        Op::Scan,
        aws_error(
            400,
            "AccessDeniedException",
            "User is not authorized to perform dynamodb:Scan",
        ),
    )
    .await;
    let pipeline = Pipeline::new(&fake);

    let outcome = pipeline.run().await;

    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert_eq!(fake.calls(Op::Scan).await, 1, "access errors are fatal");
    assert!(
        outcome
            .stderr
            .contains("User is not authorized to perform dynamodb:Scan"),
        "the AWS message verbatim: {}",
        outcome.stderr
    );
    assert!(
        outcome
            .stderr
            .contains("hint: access denied for dynamodb:Scan on table 't' — grant it to the credentials in use (access key"),
        "{}",
        outcome.stderr
    );
}
