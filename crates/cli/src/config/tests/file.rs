//! The file itself: not a mapping, loading and paths, BOM, duplicate keys, nesting, the README examples.

use super::*;

#[test]
fn a_file_that_is_not_a_pipeline_mapping_is_one_error() {
    assert_eq!(
        errors(""),
        ["config error: the file is empty: it needs name, source and sink"]
    );
    assert_eq!(
        errors("- a\n"),
        ["config error: expected a mapping, found a list"]
    );
    let syntax = errors("name: [unclosed\n");
    assert_eq!(syntax.len(), 1);
    assert!(
        syntax[0].starts_with("config error: invalid YAML: "),
        "{syntax:?}"
    );
}

#[test]
fn loading_reads_the_file_and_puts_the_state_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.yaml");
    std::fs::write(
        &path,
        "name: orders\nsource: {table_name: o}\nsink: {type: jsonl}\n",
    )
    .unwrap();
    let config = load(&path, &env).unwrap();
    assert_eq!(config.state.path, dir.path().join("orders.state.json"));

    let missing = dir.path().join("missing.yaml");
    let error = load(&missing, &env).unwrap_err();
    assert!(matches!(error, LoadError::Read { .. }));
    assert_eq!(
        error.to_string(),
        format!("cannot read config file {}", missing.display())
    );
    assert!(std::error::Error::source(&error).is_some());

    std::fs::write(
        &path,
        "name: orders\nsource: {table_name: o, bogus: 1}\nsink: {type: jsonl}\n",
    )
    .unwrap();
    let error = load(&path, &env).unwrap_err();
    assert_eq!(
        error.to_string(),
        "config error: source.bogus: unknown field"
    );
}

#[test]
fn a_byte_order_mark_is_not_content() {
    let text = format!("\u{feff}{}", with_source("segments: 2"));
    assert_eq!(parse_ok(&text).source.segments, 2);
}

#[test]
fn a_duplicate_key_is_reported_at_its_second_entry() {
    let block = "name: t\nsource:\n  table_name: orders\n  segments: 2\n  max_concurrency: 2\n  \
                 segments: 3\nsink:\n  type: jsonl\n";
    assert_eq!(
        errors(block),
        [
            "config error: invalid YAML: duplicate key \"segments\" in source at line 6 (first \
             at line 4); remove one of them"
        ]
    );
    let flow = "name: t\nsource: {table_name: orders,\n  segments: 2, segments: 3}\nsink:\n  type: jsonl\n";
    assert_eq!(
        errors(flow),
        [
            "config error: invalid YAML: duplicate key \"segments\" in source at line 3 (first \
             at line 3); remove one of them"
        ]
    );
    let top =
        "# a pipeline\nname: t\nsource: {table_name: orders}\nname: u\nsink:\n  type: jsonl\n";
    assert_eq!(
        errors(top),
        [
            "config error: invalid YAML: duplicate key \"name\" at line 4 (first at line 2); \
             remove one of them"
        ]
    );
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let flow = format!("name: t\nsource: {}", "[".repeat(100_000));
    let lines = errors(&flow);
    assert_eq!(
        lines,
        [
            "config error: invalid YAML: nested more than 64 levels deep at line 2; a pipeline \
             file is a few levels deep"
        ]
    );
    let block: String = (0..70)
        .map(|depth| format!("{}k{depth}:\n", " ".repeat(depth)))
        .collect();
    assert!(errors(&block)[0].contains("nested more than 64 levels deep at line 65"));
    // Brackets in quotes and comments do not count; a real file passes.
    let quoted = with_source(&format!(
        "filter_expression: \"{}\" # {}",
        "[".repeat(100),
        "{".repeat(100)
    ));
    assert_eq!(
        parse_ok(&quoted).source.filter_expression.unwrap().len(),
        100
    );
}

/// Every pipeline example of the README is a valid pipeline file (issue 11: its GSI query
/// example named the reserved word `total` bare and failed at run time).
#[test]
fn every_pipeline_example_in_the_readme_is_valid() {
    let readme = include_str!("../../../../../README.md");
    let mut examples = 0;
    for block in readme.split("```yaml\n").skip(1) {
        let Some((yaml, _)) = block.split_once("```") else {
            continue;
        };
        if !yaml.starts_with("name:") {
            continue;
        }
        examples += 1;
        let parsed = parse(yaml, Path::new("/etc/ddbpipe"), &|_| Some("x".to_string()));
        if let Err(errors) = parsed {
            panic!("README example is invalid:\n{yaml}\n{errors}");
        }
    }
    assert!(examples >= 5, "found {examples} examples");
}
