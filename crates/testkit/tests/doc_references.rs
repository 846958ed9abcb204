//! What the code refers to outside itself: every reference to the behaviour reference
//! (`docs/<topic>.md §x.y`) names a page that exists and a section that page has
//! (docs/README.md); no test takes a path from the directory its binary was built in
//! (`ddbpipe_testkit::package_dir` and `repository` give the checkout it runs in: a binary built
//! from another checkout sharing the target directory is fresh for cargo, and the path compiled
//! into it may be gone there, as the gate met).

use ddbpipe_testkit::repository;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The section numbers a page's headings carry (`## 6.3 Positions by mode` → `6.3`).
fn sections(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter(|line| line.starts_with('#'))
        .filter_map(|line| line.trim_start_matches('#').split_whitespace().next())
        .map(|number| number.trim_end_matches('.').to_string())
        .filter(|number| number.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .collect()
}

/// `(page, section)` of each `docs/<page>.md §<section>` in `text`.
fn references(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/") {
        rest = &rest[at + "docs/".len()..];
        let Some(end) = rest.find(".md") else { break };
        let page = &rest[..end];
        if page.is_empty() || !page.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
            continue;
        }
        let after = &rest[end + ".md".len()..];
        if let Some(section) = after.strip_prefix(" §") {
            let number: String = section
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            found.push((page.to_string(), number.trim_end_matches('.').to_string()));
        } else {
            found.push((page.to_string(), String::new()));
        }
    }
    found
}

#[test]
fn every_reference_in_the_code_resolves_in_docs() {
    let root = repository();
    let mut files = Vec::new();
    sources(&root.join("crates"), &mut files);
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (page, section) in references(&text) {
            let path = root.join("docs").join(format!("{page}.md"));
            let Ok(doc) = std::fs::read_to_string(&path) else {
                problems.push(format!("{}: docs/{page}.md does not exist", file.display()));
                continue;
            };
            if !section.is_empty() && !sections(&doc).contains(&section) {
                problems.push(format!(
                    "{}: docs/{page}.md has no section §{section}",
                    file.display()
                ));
            }
            checked += 1;
        }
    }
    assert!(
        checked > 100,
        "only {checked} references found: is the scan broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_reference_scanner_finds_pages_and_sections() {
    let text = "see docs/state.md §6.3, docs/cli.md and docs/x.rs; docs/mirror.md §5.3.";
    assert_eq!(
        references(text),
        [
            ("state".to_string(), "6.3".to_string()),
            ("cli".to_string(), String::new()),
            ("mirror".to_string(), "5.3".to_string()),
        ]
    );
    assert!(sections("# 6 State\n## 6.3 Positions\ntext").contains("6.3"));
}

/// The `crates/…` paths a page names in backticks (`crates/a/src/b.rs`, `crates/a/src/c/`).
fn code_paths(page: &str) -> Vec<String> {
    page.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("crates/") && !span.contains(' '))
        .map(|span| span.split(':').next().unwrap_or(span).to_string())
        .collect()
}

#[test]
fn every_code_path_the_reference_and_the_readme_name_exists() {
    let root = repository();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.push(root.join("README.md"));
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a readable page");
        for path in code_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                problems.push(format!(
                    "{} names {path}, which does not exist",
                    page.display()
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} paths found: is the scan broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_code_reads_the_package_directory_it_was_built_in() {
    // Spelled in two parts so that this file does not find itself.
    let built_in = ["env!(\"CARGO_", "MANIFEST_DIR\")"].concat();
    let mut files = Vec::new();
    sources(&repository().join("crates"), &mut files);
    assert!(files.len() > 100, "the crates' sources were not found");
    let found: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let file = file.display().to_string();
            text.lines()
                .enumerate()
                .filter(|(_, line)| !line.trim_start().starts_with("//"))
                .filter(|(_, line)| line.contains(&built_in))
                .map(|(n, _)| format!("{file}:{}", n + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "use ddbpipe_testkit::package_dir() or repository() instead of the directory the binary \
         was built in: {found:?}"
    );
}
