//! The `coordination:` section (docs/coordination.md §11.10).

use super::*;

fn shared(source: &str, sink: &str, coordination: &str) -> String {
    format!(
        "name: orders\nsource: {{table_name: orders, {source}}}\nsink: {sink}\ncoordination: {coordination}\n"
    )
}

const WORKER_FILE: &str = "{type: jsonl, path: 'out/orders-{worker}.jsonl'}";

#[test]
fn the_section_is_read_with_its_defaults() {
    let config = parse_ok(&shared(
        "segments: 4",
        WORKER_FILE,
        "{lease_table: ddbpipe-leases}",
    ));
    let coordination = config.coordination.expect("a coordination section");
    assert_eq!(coordination.lease_table, "ddbpipe-leases");
    assert_eq!(coordination.worker_id, None);
    assert_eq!(coordination.lease_duration_secs, 10);
    let id = coordination.worker_id();
    assert!(
        id.ends_with(&format!("-{}", std::process::id())),
        "the default id is <hostname>-<pid>: {id}"
    );
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')),
        "{id}"
    );
    let config = parse_ok(&shared(
        "mode: query, key_condition_expression: 'pk = :p', expression_attribute_values: {':p': x}",
        WORKER_FILE,
        "{lease_table: leases, worker_id: host-1, lease_duration_secs: 30}",
    ));
    let coordination = config.coordination.unwrap();
    assert_eq!(coordination.worker_id(), "host-1");
    assert_eq!(coordination.lease_duration_secs, 30);
    assert!(
        parse_ok("name: t\nsource: {table_name: t}\nsink: {type: jsonl}\n")
            .coordination
            .is_none()
    );
}

#[test]
fn bad_values_are_named_by_their_field() {
    let lines = errors(&shared(
        "segments: 4",
        WORKER_FILE,
        "{lease_table: 'a b', worker_id: 'host/1', lease_duration_secs: 2}",
    ));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("config error: coordination.lease_table:")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("config error: coordination.worker_id:")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with("config error: coordination.lease_duration_secs:")
                && l.contains("3 to 300")
        ),
        "{lines:?}"
    );
    let lines = errors(&shared("segments: 4", WORKER_FILE, "{worker_id: w}"));
    assert!(
        lines.iter().any(|l| l.contains("coordination.lease_table")),
        "{lines:?}"
    );
}

#[test]
fn a_jsonl_sink_needs_the_worker_in_its_path_and_append() {
    let lines = errors(&shared(
        "segments: 4",
        "{type: jsonl, path: out/orders.jsonl}",
        "{lease_table: leases}",
    ));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("config error: sink.path:") && l.contains("{worker}")),
        "{lines:?}"
    );
    let lines = errors(&shared(
        "segments: 4",
        "{type: jsonl}",
        "{lease_table: leases}",
    ));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("config error: sink.path:")),
        "stdout is one stream, not a file per worker: {lines:?}"
    );
    let lines = errors(&shared(
        "segments: 4",
        "{type: jsonl, path: 'out/{worker}.jsonl', write: overwrite}",
        "{lease_table: leases}",
    ));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("config error: sink.write:") && l.contains("append")),
        "{lines:?}"
    );
    // Without coordination there is no worker to name.
    let lines =
        errors("name: t\nsource: {table_name: t}\nsink: {type: jsonl, path: 'o-{worker}.jsonl'}\n");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("config error: sink.path:") && l.contains("coordination")),
        "{lines:?}"
    );
}

/// docs/coordination.md §11.12 rule 8: a shared mirror's gap opens a new snapshot across the
/// workers.
#[test]
fn a_shared_mirror_may_resnapshot_on_a_gap() {
    let config = parse_ok(&shared(
        "mode: mirror, follow: true, on_gap: resnapshot",
        "{type: sqlite, path: m.db}",
        "{lease_table: leases}",
    ));
    assert!(config.coordination.is_some());
}

#[test]
fn a_mirror_into_a_keyed_sink_is_shared() {
    for sink in [
        "{type: sqlite, path: m.db}",
        "{type: postgres, url: 'postgres://u@h/db', table: orders}",
    ] {
        let config = parse_ok(&shared(
            "mode: mirror, follow: true",
            sink,
            "{lease_table: leases}",
        ));
        assert!(config.coordination.is_some(), "{sink}");
    }
    // A gap across workers is repaired by incremental exports (docs/coordination.md §11.12
    // rule 9), which need the bucket as one process's repair does.
    let config = parse_ok(&shared(
        "mode: mirror, follow: true, on_gap: repair, snapshot: {s3_bucket: b}",
        "{type: sqlite, path: m.db}",
        "{lease_table: leases}",
    ));
    assert!(config.coordination.is_some());
    let lines = errors(&shared(
        "mode: mirror, follow: true, on_gap: repair",
        "{type: sqlite, path: m.db}",
        "{lease_table: leases}",
    ));
    assert!(
        lines.iter().any(|l| l.contains("s3_bucket")),
        "a repair without its bucket: {lines:?}"
    );
}

#[test]
fn what_this_version_does_not_share_is_refused_up_front() {
    for (source, sink, field) in [
        ("mode: mirror", WORKER_FILE, "coordination"),
        (
            "mode: mirror, max_messages: 10",
            "{type: postgres, url: 'postgres://u@h/db', table: orders}",
            "source.max_messages",
        ),
        (
            "mode: streams, on_gap: resnapshot",
            "{type: sqlite, path: m.db}",
            "source.on_gap",
        ),
        (
            "mode: streams, on_gap: repair, snapshot: {s3_bucket: b}",
            WORKER_FILE,
            "source.on_gap",
        ),
        (
            "mode: streams, max_messages: 10",
            WORKER_FILE,
            "source.max_messages",
        ),
    ] {
        let lines = errors(&shared(source, sink, "{lease_table: leases}"));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("config error: {field}:"))),
            "{source} into {sink}: {lines:?}"
        );
    }
}

#[test]
fn a_shared_stream_goes_into_worker_files_or_one_keyed_table() {
    for sink in [WORKER_FILE, "{type: sqlite, path: m.db}"] {
        let config = parse_ok(&shared(
            "mode: streams, start_position: latest, idle_termination_secs: 30",
            sink,
            "{lease_table: leases}",
        ));
        assert!(config.coordination.is_some(), "{sink}");
    }
}

#[test]
fn a_state_path_is_ineffective_with_coordination() {
    let config = parse_ok(&format!(
        "{}state: {{path: s.json}}\n",
        shared("segments: 4", WORKER_FILE, "{lease_table: leases}")
    ));
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.starts_with("state.path has no effect")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn a_shared_scan_may_load_one_keyed_table() {
    let config = parse_ok(&shared(
        "segments: 2",
        "{type: sqlite, path: m.db}",
        "{lease_table: leases}",
    ));
    assert!(config.coordination.is_some());
}

#[test]
fn dot_and_dot_dot_are_not_worker_ids() {
    for id in [".", "..", "'..'"] {
        let lines = errors(&shared(
            "segments: 4",
            "{type: jsonl, path: '{worker}/out.jsonl'}",
            &format!("{{lease_table: leases, worker_id: {id}}}"),
        ));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("config error: coordination.worker_id:")
                    && l.contains("other than . and ..")),
            "{id}: {lines:?}"
        );
    }
    // Dots inside an id are fine.
    let config = parse_ok(&shared(
        "segments: 4",
        "{type: jsonl, path: '{worker}/out.jsonl'}",
        "{lease_table: leases, worker_id: host.1..2}",
    ));
    assert!(config.coordination.is_some());
}

/// Issue 24 item 12: a 65-bit integer in a field that is not an expression value is named as
/// out of range, not pointed at `expression_attribute_values_typed`.
#[test]
fn a_wide_integer_outside_expression_values_is_out_of_range() {
    let lines = errors(&shared(
        "segments: 4",
        WORKER_FILE,
        "{lease_table: leases, worker_id: w, lease_duration_secs: 18446744073709551616}",
    ));
    assert_eq!(
        lines,
        [
            "config error: coordination.lease_duration_secs: the integer 18446744073709551616 is \
          far out of range (wider than 64 bits): see the field's range in docs/config.md"
        ],
    );
}

/// Issue 24 item 12: an unset variable in the section is its only error; the `{worker}` path
/// is not refused as "without a coordination section".
#[test]
fn an_unset_worker_variable_is_the_only_error() {
    let lines = errors(&shared(
        "segments: 4",
        WORKER_FILE,
        "{lease_table: leases, worker_id: '${WID}'}",
    ));
    assert_eq!(
        lines,
        [
            "config error: coordination.worker_id: environment variable WID is not set (write \
          ${WID:-default} to give a default)"
        ],
    );
}
