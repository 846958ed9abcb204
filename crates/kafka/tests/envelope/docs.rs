//! docs/sinks.md §7.8: its examples are what the code writes.

use super::*;

/// The ```json examples of docs/sinks.md §7.8, each joined into one compact line.
fn documented_examples() -> Vec<String> {
    let path = ddbpipe_testkit::repository().join("docs/sinks.md");
    let page = std::fs::read_to_string(path).expect("docs/sinks.md");
    let section = page
        .split("\n## ")
        .find(|section| section.starts_with("7.8 "))
        .expect("docs/sinks.md has §7.8");
    section
        .split("```json\n")
        .skip(1)
        .map(|block| {
            let block = block.split("```").next().unwrap_or_default();
            block.lines().map(str::trim).collect::<String>()
        })
        .collect()
}

#[test]
fn the_examples_in_the_docs_are_what_the_code_writes() {
    let old = order(n("7"), "10");
    let new = order(n("7"), "12.5");
    let modify = record(Some("MODIFY"), Some(old.clone()), Some(new), None);
    let expired = record(Some("REMOVE"), Some(old), None, Some(ttl()));
    let envelopes = shaper(EnvelopeKind::Debezium, Records::Envelopes, true);
    let produced: Vec<String> = [modify, expired]
        .iter()
        .map(|record| {
            let out = messages(&envelopes, &change_line(record, ValueFormat::Plain));
            text(out[0].value.clone().expect("a value"))
        })
        .collect();
    let documented: Vec<String> = documented_examples()
        .into_iter()
        .map(|example| {
            example.replace(
                r#""version":"0.1.0""#,
                concat!(r#""version":""#, env!("CARGO_PKG_VERSION"), r#"""#),
            )
        })
        .collect();
    assert_eq!(documented, produced);
}
