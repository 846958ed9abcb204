//! No module circles: in every crate but the bench, the top-level modules depend on each other
//! in one direction only (a DAG), so each layer can be read, tested and moved without the ones
//! above it. The crates already point one way (value → source → pipeline → keyed → cli); this
//! keeps their modules so (`crates/source/src/lib.rs` lists the source crate's layers).
//!
//! The check reads the sources the way the compiler finds them: from `lib.rs`/`main.rs` through
//! every `mod` declaration (`#[path]` honoured), leaving out comments, string literals and
//! test-only code (`#[cfg(test)]` items and modules, `#[test]` functions), so `tests.rs` and
//! `*_tests.rs` files may use anything. An edge `a -> b` is a path in module `a` (or below it)
//! that reaches the top-level module `b`: `crate::b::…`, `super::…::b` climbing to the crate
//! root, a `use crate::{b, c::d}` group, or a name the crate root re-exports from `b`. Code in
//! the crate root itself (other than its `pub use` re-exports) is a node of its own.
//!
//! `lex.rs` turns source text into tokens, `graph.rs` finds a crate's files and edges; this
//! file finds the circles (strongly connected components) and says where each step is written.

mod graph;
mod lex;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use ddbpipe_testkit::repository;
use graph::{Edge, Graph, ROOT, crate_graph};

/// The strongly connected components of more than one module (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn connect<'a>(state: &mut State<'a>, v: &'a str) {
        let n = state.index.len();
        state.index.insert(v, n);
        state.low.insert(v, n);
        state.stack.push(v);
        state.on_stack.insert(v);
        let graph = state.graph;
        for w in graph.edges.get(v).into_iter().flat_map(|to| to.keys()) {
            let w = w.as_str();
            if !state.index.contains_key(w) {
                connect(state, w);
                let low = state.low[v].min(state.low[w]);
                state.low.insert(v, low);
            } else if state.on_stack.contains(w) {
                let low = state.low[v].min(state.index[w]);
                state.low.insert(v, low);
            }
        }
        if state.low[v] == state.index[v] {
            let mut component = Vec::new();
            while let Some(w) = state.stack.pop() {
                state.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in &graph.modules {
        if !state.index.contains_key(module.as_str()) {
            connect(&mut state, module);
        }
    }
    state.found.sort();
    state.found
}

/// One shortest way round a component, from its first module back to it.
fn way_round(graph: &Graph, component: &[String]) -> Vec<String> {
    let start = &component[0];
    let inside: BTreeSet<&String> = component.iter().collect();
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph.edges.get(v).into_iter().flat_map(|to| to.keys()) {
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![v.clone()];
                let mut at = v;
                while at != start {
                    at = came_from[at];
                    path.push(at.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if !came_from.contains_key(w) && w != start {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    component.to_vec()
}

/// What a failing check says about one component.
fn describe(graph: &Graph, component: &[String], base: &Path) -> String {
    let place = |edge: &Edge| {
        let file = edge.file.strip_prefix(base).unwrap_or(&edge.file);
        format!("{}:{} `{}`", file.display(), edge.line, edge.path)
    };
    let mut text = format!(
        "a circle of {} modules: {}\n  one way round:\n",
        component.len(),
        component.join(", ")
    );
    let round = way_round(graph, component);
    for step in round.windows(2) {
        let edge = &graph.edges[&step[0]][&step[1]][0];
        text += &format!("    {} -> {}  ({})\n", step[0], step[1], place(edge));
    }
    text += "  every edge inside it:\n";
    for from in component {
        for (to, edges) in graph.edges.get(from).into_iter().flatten() {
            if component.contains(to) {
                let places: Vec<String> = edges.iter().map(place).collect();
                text += &format!("    {from} -> {to}  ({})\n", places.join("; "));
            }
        }
    }
    text
}

/// The root files of every crate in the workspace but the bench.
fn crate_roots(root: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.file_name().is_some_and(|name| name != "bench"))
        .collect();
    crates.sort();
    for dir in crates {
        for file in ["src/lib.rs", "src/main.rs"] {
            if dir.join(file).exists() {
                roots.push(dir.join(file));
            }
        }
    }
    roots
}

fn read_disk(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[test]
fn no_crate_has_a_circle_of_modules() {
    let root = repository().canonicalize().expect("the workspace root");
    let roots = crate_roots(&root);
    assert!(roots.len() >= 6, "only {roots:?}: is the scan broken?");
    let mut problems = Vec::new();
    let mut modules = 0;
    let mut edges = 0;
    for file in &roots {
        let graph = crate_graph(file, &read_disk).unwrap_or_else(|e| panic!("{e}"));
        modules += graph.modules.len();
        edges += graph.edges.values().map(BTreeMap::len).sum::<usize>();
        for component in circles(&graph) {
            let name = file.strip_prefix(&root).unwrap_or(file);
            problems.push(format!(
                "{}: {}",
                name.display(),
                describe(&graph, &component, &root)
            ));
        }
    }
    assert!(
        modules > 50 && edges > 120,
        "only {modules} modules and {edges} edges found: is the scan broken?"
    );
    assert!(
        problems.is_empty(),
        "top-level modules that depend on each other in a circle (move the item to the \
         module that owns its concept, or to a leaf module both can use):\n{}",
        problems.join("\n")
    );
}

// The checker's own tests, on sources in memory.

fn graph_of(files: &[(&str, &str)]) -> Graph {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(path, text)| (PathBuf::from(path), text.to_string()))
        .collect();
    crate_graph(Path::new("src/lib.rs"), &|path| files.get(path).cloned())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn edges_of(graph: &Graph) -> Vec<String> {
    graph
        .edges
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |to| format!("{from} -> {to}")))
        .collect()
}

#[test]
fn paths_from_the_crate_root_are_edges_and_comments_strings_and_tests_are_not() {
    let graph = graph_of(&[
        (
            "src/lib.rs",
            "pub mod a;\npub mod b;\npub mod c;\nmod d;\npub use c::Thing;\n",
        ),
        (
            "src/a.rs",
            r##"//! crate::d::Doc in a doc comment
use crate::{b, c::Other};
/* crate::d::Block /* nested */ crate::d::Still */
const TEXT: &str = "crate::d::InAString";
const RAW: &str = r#"crate::d::"Raw""#;
fn f<'a>(x: &'a str) -> char { let _ = crate::Thing; 'x' }
#[cfg(test)]
mod tests { use crate::d::Tested; }
#[cfg(all(test, feature = "x"))]
fn helper() { crate::d::OnlyInTests; }
#[test]
fn t() { crate::d::AlsoTests; }
"##,
        ),
        ("src/b/mod.rs", "mod inner;\n"),
        (
            "src/b/inner.rs",
            "use super::super::d::X;\nuse super::Sibling;\n",
        ),
        ("src/c.rs", "mod deep { use super::super::{a}; }\n"),
        (
            "src/d.rs",
            "#[cfg(any(test, feature = \"fake\"))]\nfn fake() { crate::a::Kept; }\n",
        ),
    ]);
    assert_eq!(
        edges_of(&graph),
        ["a -> b", "a -> c", "b -> d", "c -> a", "d -> a"]
    );
    assert_eq!(graph.files, 6);
    assert_eq!(circles(&graph), [vec!["a", "b", "c", "d"]]);
    let text = describe(&graph, &circles(&graph)[0], Path::new(""));
    assert!(
        text.contains("a -> c  (src/a.rs:2 `crate::{b, c::Other}`"),
        "{text}"
    );
    assert!(
        text.contains("c -> a  (src/c.rs:1 `super::super::{a}`"),
        "{text}"
    );
}

#[test]
fn test_only_files_and_path_attributes_follow_the_module_tree() {
    let graph = graph_of(&[
        (
            "src/lib.rs",
            "mod a;\nmod b;\n#[path = \"other/place.rs\"]\nmod c;\nfn root_helper() { b::go(); }\n",
        ),
        (
            "src/a.rs",
            "#[cfg(test)]\nmod tests;\n#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod more;\nfn f() { crate::root_helper(); }\n",
        ),
        ("src/a/tests.rs", "use crate::b::Anything;\n"),
        ("src/b.rs", "#![cfg(test)]\nuse crate::a::X;\n"),
        // A file named by `#[path]` holds its children beside it.
        ("src/other/place.rs", "mod inner;\n"),
        ("src/other/inner.rs", "use super::super::b::Y;\n"),
    ]);
    // a_tests.rs does not exist and is not asked for; tests.rs is not read.
    assert_eq!(graph.files, 5);
    assert_eq!(
        edges_of(&graph),
        [
            format!("{ROOT} -> b"),
            format!("a -> {ROOT}"),
            "c -> b".into()
        ]
    );
    assert!(circles(&graph).is_empty());
}
