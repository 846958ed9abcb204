//! The documentation against the binary (issue 24 item 24): every `ddbpipe …` command line in
//! README.md and docs/ names a command and options the binary has, and docs/cli.md §8.1's table
//! lists every command and every option the binary has. The binary's own `--help` is the truth.
//! (Written when docs/cli.md lacked `demo --keep`, `run --metrics-file`, `init`, `man` and
//! `completions`: both tests failed on them.)

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use ddbpipe_testkit::repository;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

/// Options every command has.
const GLOBAL: &[&str] = &["--help", "--version", "--log-level", "--log-format"];

fn help(path: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_ddbpipe"))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success(), "ddbpipe {path:?} --help failed");
    String::from_utf8(output.stdout).unwrap()
}

/// The names listed under `Commands:` in a help text (`help` left out).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// The long options a help text lists (`--name`, at the start of an option line).
fn long_options(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter_map(|line| {
            let line = line.strip_prefix("-").map_or(line, |rest| {
                // `-y, --yes`
                rest.split_once(", ").map_or(line, |(_, long)| long)
            });
            let name = line.strip_prefix("--")?;
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .filter(|option| !GLOBAL.contains(&option.as_str()))
        .collect()
}

/// Every command path of the binary (`run`, `state show`, …) with its own long options.
fn commands() -> BTreeMap<String, BTreeSet<String>> {
    let mut commands = BTreeMap::new();
    for name in subcommands(&help(&[])) {
        let text = help(&[&name]);
        let nested = subcommands(&text);
        if nested.is_empty() {
            commands.insert(name, long_options(&text));
        } else {
            for sub in nested {
                let text = help(&[&name, &sub]);
                commands.insert(format!("{name} {sub}"), long_options(&text));
            }
        }
    }
    commands
}

/// README.md and every page of docs/, with their names.
fn pages() -> Vec<(String, String)> {
    let root = repository();
    let mut pages = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    for path in docs {
        let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
        pages.push((name, std::fs::read_to_string(path).unwrap()));
    }
    pages
}

/// The code of a page: the lines of its fenced blocks and its inline code spans, each one
/// piece of text.
fn code(page: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            pieces.push(line.to_string());
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find('`') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('`') else { break };
            pieces.push(after[..end].to_string());
            rest = &after[end + 1..];
        }
    }
    pieces
}

/// A documented command line: the command path it names and the options it gives.
#[derive(Debug)]
struct Invocation {
    words: Vec<String>,
    options: Vec<String>,
    text: String,
}

/// Every `ddbpipe <command> …` in a piece of code, up to a shell separator or comment.
fn invocations(piece: &str) -> Vec<Invocation> {
    let mut found = Vec::new();
    let piece = piece.replace("\\|", "|");
    for part in piece.split(['|', ';', '&', '#', '>', '<', '(', ')']) {
        let tokens: Vec<&str> = part.split_whitespace().collect();
        for (at, token) in tokens.iter().enumerate() {
            if *token != "ddbpipe" {
                continue;
            }
            let rest = &tokens[at + 1..];
            let words: Vec<String> = rest
                .iter()
                .take_while(|t| t.chars().all(|c| c.is_ascii_lowercase()) && t.len() > 1)
                .take(2)
                .map(|t| t.to_string())
                .collect();
            let options = rest
                .iter()
                .map(|t| t.trim_matches(['[', ']', '`', ',']))
                .filter(|t| t.starts_with("--") && t.len() > 2)
                .map(|t| t.split('=').next().unwrap_or(t).to_string())
                .collect();
            found.push(Invocation {
                words,
                options,
                text: part.trim().to_string(),
            });
        }
    }
    found
}

/// Which command of `commands` a documented line names: its longest matching path.
fn command_of<'a>(
    commands: &'a BTreeMap<String, BTreeSet<String>>,
    words: &[String],
) -> Option<(&'a String, &'a BTreeSet<String>)> {
    (1..=words.len())
        .rev()
        .find_map(|n| commands.get_key_value(&words[..n].join(" ")))
}

#[test]
fn every_documented_command_and_option_exists() {
    let commands = commands();
    assert!(commands.contains_key("run") && commands.contains_key("state reset"));
    let wrong: Vec<String> = pages()
        .iter()
        .flat_map(|(page, text)| absent(&commands, page, text))
        .collect();
    assert!(
        wrong.is_empty(),
        "documented but absent:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_made_up_command_or_option_is_caught() {
    let commands = commands();
    let page = "Run `ddbpipe run x.yaml --no-such-flag`, or:\n\n```sh\nddbpipe state reset x.yaml --yes\nddbpipe frobnicate --all\nddbpipe lag x.yaml --json # --not-an-option\n```\n\n`ddbpipe writes` is prose.";
    let wrong = absent(&commands, "page", page);
    assert_eq!(wrong.len(), 2, "{wrong:#?}");
    assert!(
        wrong[0].contains("`ddbpipe run` has no --no-such-flag"),
        "{}",
        wrong[0]
    );
    assert!(wrong[1].contains("no command 'frobnicate'"), "{}", wrong[1]);
}

/// What `text` (page `page`) documents that the binary lacks.
fn absent(commands: &BTreeMap<String, BTreeSet<String>>, page: &str, text: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for piece in code(text) {
        for call in invocations(&piece) {
            let Some(first) = call.words.first() else {
                // `ddbpipe --version`, or the name alone.
                for option in &call.options {
                    if !GLOBAL.contains(&option.as_str()) {
                        wrong.push(format!("{page}: `{}`: no global {option}", call.text));
                    }
                }
                continue;
            };
            // Prose that happens to follow the name in code ("ddbpipe writes …") names
            // no command: only a line whose first word is a command is checked.
            let known_first = commands.keys().any(|c| c.split(' ').next() == Some(first));
            if !known_first {
                if !call.options.is_empty() {
                    wrong.push(format!("{page}: `{}`: no command '{first}'", call.text));
                }
                continue;
            }
            let Some((name, options)) = command_of(commands, &call.words) else {
                wrong.push(format!("{page}: `{}`: no such command", call.text));
                continue;
            };
            for option in &call.options {
                if !options.contains(option) && !GLOBAL.contains(&option.as_str()) {
                    wrong.push(format!(
                        "{page}: `{}`: `ddbpipe {name}` has no {option}",
                        call.text
                    ));
                }
            }
        }
    }
    wrong
}

#[test]
fn the_command_table_of_docs_cli_lists_every_command_and_option() {
    let cli = std::fs::read_to_string(repository().join("docs/cli.md")).unwrap();
    let table: Vec<&str> = cli
        .split("## 8.1")
        .nth(1)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("| `ddbpipe "))
        .collect();
    let mut missing = Vec::new();
    for (name, options) in commands() {
        let prefix = format!("| `ddbpipe {name}");
        let Some(row) = table.iter().find(|row| {
            row.strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with([' ', '`']))
        }) else {
            missing.push(format!("no row for `ddbpipe {name}`"));
            continue;
        };
        for option in options {
            let listed = row
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|word| word == option);
            if !listed {
                missing.push(format!("`ddbpipe {name}`'s row lacks {option}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md §8.1 is behind the binary:\n{}",
        missing.join("\n")
    );
}
