//! One crate's module graph: its files found from the root through every `mod` declaration,
//! test-only code left out, and each path that reaches another top-level module an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::lex::{Kind, Token, close_of, lex};

/// Whether a `cfg(…)` predicate holds only when testing: `test`, `all(…, test, …)`,
/// `any(…)` of test-only predicates.
fn test_only_predicate(tokens: &[Token]) -> bool {
    let Some(first) = tokens.first() else {
        return false;
    };
    if tokens.len() == 1 {
        return first.is("test");
    }
    let args = match tokens.get(1) {
        Some(open) if open.is("(") => &tokens[2..close_of(tokens, 1) - 1],
        _ => return false,
    };
    let parts = split_commas(args);
    match first.text.as_str() {
        "all" => parts.iter().any(|part| test_only_predicate(part)),
        "any" => !parts.is_empty() && parts.iter().all(|part| test_only_predicate(part)),
        _ => false,
    }
}

/// `tokens` split at its top-level commas (empty parts left out).
fn split_commas(tokens: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let mut from = 0;
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].is("(") || tokens[i].is("[") || tokens[i].is("{") {
            i = close_of(tokens, i);
            continue;
        }
        if tokens[i].is(",") {
            parts.push(&tokens[from..i]);
            from = i + 1;
        }
        i += 1;
    }
    parts.push(&tokens[from..]);
    parts.into_iter().filter(|part| !part.is_empty()).collect()
}

/// What an attribute's tokens (inside `#[…]`) say about the item it is on.
#[derive(Debug, PartialEq)]
enum Attribute {
    TestOnly,
    Path(String),
    Other,
}

fn attribute(inside: &[Token]) -> Attribute {
    let names: Vec<&str> = inside
        .iter()
        .take_while(|t| t.kind == Kind::Ident || t.is("::"))
        .map(|t| t.text.as_str())
        .collect();
    match names.as_slice() {
        ["cfg"] if inside.get(1).is_some_and(|t| t.is("(")) => {
            if test_only_predicate(&inside[2..inside.len() - 1]) {
                Attribute::TestOnly
            } else {
                Attribute::Other
            }
        }
        ["test"] => Attribute::TestOnly,
        [.., "::", "test"] => Attribute::TestOnly,
        ["path"] => match inside.get(2) {
            Some(text) if inside[1].is("=") && text.kind == Kind::Literal => {
                Attribute::Path(text.text.clone())
            }
            _ => Attribute::Other,
        },
        _ => Attribute::Other,
    }
}

/// The index just past the item (or statement, field, arm) that starts at `from`.
fn end_of_item(tokens: &[Token], from: usize) -> usize {
    // Attributes first.
    let mut i = from;
    while tokens.get(i).is_some_and(|t| t.is("#")) && tokens.get(i + 1).is_some_and(|t| t.is("[")) {
        i = close_of(tokens, i + 1);
    }
    let mut head = i;
    if tokens.get(head).is_some_and(|t| t.is("pub")) {
        head += 1;
        if tokens.get(head).is_some_and(|t| t.is("(")) {
            head = close_of(tokens, head);
        }
    }
    let to_semicolon = match tokens.get(head).map(|t| t.text.as_str()) {
        Some("use" | "static" | "let" | "type") => true,
        Some("const") => !tokens.get(head + 1).is_some_and(|t| t.is("fn")),
        _ => false,
    };
    while let Some(token) = tokens.get(i) {
        if token.kind == Kind::Punct {
            match token.text.as_str() {
                ";" => return i + 1,
                "," if !to_semicolon => return i + 1,
                ")" | "]" | "}" => return i,
                "{" if !to_semicolon => return close_of(tokens, i),
                "(" | "[" | "{" => {
                    i = close_of(tokens, i);
                    continue;
                }
                _ => {}
            }
        }
        i += 1;
    }
    tokens.len()
}

/// A reference from one top-level module to another, where it is written.
#[derive(Debug, Clone)]
pub(crate) struct Edge {
    pub(crate) file: PathBuf,
    pub(crate) line: usize,
    pub(crate) path: String,
}

/// The name of the crate root's node (code written in `lib.rs`/`main.rs` itself).
pub(crate) const ROOT: &str = "(crate root)";

#[derive(Default, Debug)]
pub(crate) struct Graph {
    /// Every top-level module, and the root.
    pub(crate) modules: BTreeSet<String>,
    /// `from -> to -> the places it is written` (first ones kept).
    pub(crate) edges: BTreeMap<String, BTreeMap<String, Vec<Edge>>>,
    /// Source files read (test-only ones are not).
    pub(crate) files: usize,
}

/// Reads a source file; `None` when it does not exist.
pub(crate) type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// A path found in the code: the modules it names from the crate root (`crate::a::b` → `a`,
/// `use crate::{a, b::c}` → `a`, `b`), with where it is.
struct Reference {
    names: Vec<String>,
    line: usize,
    text: String,
}

/// The module graph of the crate whose root file is `root_file`.
pub(crate) fn crate_graph(root_file: &Path, read: Read) -> Result<Graph, String> {
    let text = read(root_file).ok_or_else(|| format!("{} is missing", root_file.display()))?;
    let root_tokens = lex(&text);
    let dir = root_file.parent().unwrap_or(Path::new("")).to_path_buf();
    // The top-level modules and the names the root re-exports (`pub use a::X` → X from a).
    let mut top = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    let mut i = 0;
    while i < root_tokens.len() {
        if root_tokens[i].is("#") && root_tokens.get(i + 1).is_some_and(|t| t.is("!")) {
            i = close_of(&root_tokens, i + 2);
            continue;
        }
        let item_end = end_of_item(&root_tokens, i).max(i + 1);
        let (attrs, head) = attributes_of(&root_tokens, i);
        let test_only = attrs.contains(&Attribute::TestOnly);
        let body = &root_tokens[head..item_end];
        let body = strip_visibility(body);
        if !test_only
            && body.first().is_some_and(|t| t.is("mod"))
            && let Some(name) = body.get(1)
        {
            top.insert(name.text.clone());
        }
        if !test_only && body.first().is_some_and(|t| t.is("use")) {
            for (name, from) in use_leaves(&body[1..]) {
                reexports.insert(name, from);
            }
        }
        i = item_end;
    }
    let mut graph = Graph::default();
    graph.modules.insert(ROOT.to_string());
    graph.modules.extend(top.iter().cloned());
    let resolve = |name: &str| -> Option<String> {
        if top.contains(name) {
            Some(name.to_string())
        } else if let Some(from) = reexports.get(name) {
            top.contains(from).then(|| from.clone())
        } else if name == "self" {
            None
        } else {
            Some(ROOT.to_string())
        }
    };
    let mut visit = Visit {
        read,
        resolve: &resolve,
        top: &top,
        graph: &mut graph,
    };
    visit.graph.files += 1;
    visit.block(root_file, &root_tokens, &[], &dir)?;
    Ok(graph)
}

/// The attributes before the item at `from`, and where the item proper starts.
fn attributes_of(tokens: &[Token], from: usize) -> (Vec<Attribute>, usize) {
    let mut attrs = Vec::new();
    let mut i = from;
    while tokens.get(i).is_some_and(|t| t.is("#")) && tokens.get(i + 1).is_some_and(|t| t.is("[")) {
        let end = close_of(tokens, i + 1);
        let inside = &tokens[i + 2..end - 1];
        attrs.push(attribute(inside));
        i = end;
    }
    (attrs, i)
}

fn strip_visibility(tokens: &[Token]) -> &[Token] {
    if tokens.first().is_some_and(|t| t.is("pub")) {
        if tokens.get(1).is_some_and(|t| t.is("(")) {
            return &tokens[close_of(tokens, 1)..];
        }
        return &tokens[1..];
    }
    tokens
}

/// The names a `use` tree (after `use`) brings in, each with the first segment of its path:
/// `a::b::{C, D as E}` → (C, a), (E, a); `crate::a::F` → (F, a).
fn use_leaves(tokens: &[Token]) -> Vec<(String, String)> {
    fn walk(tokens: &[Token], first: Option<&str>, out: &mut Vec<(String, String)>) {
        let mut first = first.map(str::to_string);
        let mut last = None;
        let mut i = 0;
        while i < tokens.len() {
            let token = &tokens[i];
            if token.is("{") {
                let end = close_of(tokens, i);
                for part in split_commas(&tokens[i + 1..end - 1]) {
                    walk(part, first.as_deref(), out);
                }
                return;
            }
            if token.is("as") {
                if let (Some(alias), Some(first)) = (tokens.get(i + 1), &first) {
                    out.push((alias.text.clone(), first.clone()));
                }
                return;
            }
            if token.kind == Kind::Ident {
                if first.is_none() && !token.is("crate") && !token.is("self") {
                    first = Some(token.text.clone());
                }
                last = Some(token.text.clone());
            }
            i += 1;
        }
        if let (Some(last), Some(first)) = (last, first) {
            out.push((last, first));
        }
    }
    let end = tokens
        .iter()
        .position(|t| t.is(";"))
        .unwrap_or(tokens.len());
    let mut out = Vec::new();
    walk(&tokens[..end], None, &mut out);
    out
}

struct Visit<'a> {
    read: Read<'a>,
    resolve: &'a dyn Fn(&str) -> Option<String>,
    top: &'a BTreeSet<String>,
    graph: &'a mut Graph,
}

impl Visit<'_> {
    /// The code of one module (a file, or an inline `mod { … }` in one): `module` is its path
    /// from the crate root, `dir` where its `mod x;` children live.
    fn block(
        &mut self,
        file: &Path,
        tokens: &[Token],
        module: &[String],
        dir: &Path,
    ) -> Result<(), String> {
        let from = module.first().cloned().unwrap_or_else(|| ROOT.to_string());
        let mut i = 0;
        while i < tokens.len() {
            let token = &tokens[i];
            // `#![cfg(test)]`: the rest of this module is test-only.
            if token.is("#") && tokens.get(i + 1).is_some_and(|t| t.is("!")) {
                let end = close_of(tokens, i + 2);
                let inside = &tokens[(i + 3).min(end)..end.saturating_sub(1)];
                if attribute(inside) == Attribute::TestOnly {
                    return Ok(());
                }
                i = end;
                continue;
            }
            if token.is("#") && tokens.get(i + 1).is_some_and(|t| t.is("[")) {
                let (attrs, head) = attributes_of(tokens, i);
                if attrs.contains(&Attribute::TestOnly) {
                    i = end_of_item(tokens, i);
                    continue;
                }
                let path = attrs.into_iter().find_map(|attr| match attr {
                    Attribute::Path(path) => Some(path),
                    _ => None,
                });
                // A `mod` after its attributes; otherwise the attributes are read as code.
                let item = strip_visibility(&tokens[head..]);
                let at = tokens.len() - item.len();
                if is_mod(tokens, at) {
                    i = self.module(file, tokens, at, module, dir, path)?;
                } else {
                    i += 1;
                }
                continue;
            }
            if is_mod(tokens, i) {
                i = self.module(file, tokens, i, module, dir, None)?;
                continue;
            }
            // A `use` item in the root: re-exports (`pub use`) are resolved through, not edges.
            if module.is_empty() && token.is("use") {
                let public = i > 0 && (tokens[i - 1].is("pub") || tokens[i - 1].is(")"));
                if public {
                    i = end_of_item(tokens, i);
                    continue;
                }
            }
            if let Some((reference, next)) = self.reference(tokens, i, module) {
                let targets = reference
                    .names
                    .iter()
                    .filter_map(|name| (self.resolve)(name));
                for to in targets.filter(|to| *to != from) {
                    let places = self
                        .graph
                        .edges
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_default();
                    // A few places are enough to show where an edge is written.
                    if places.len() < 3 {
                        places.push(Edge {
                            file: file.to_path_buf(),
                            line: reference.line,
                            path: reference.text.clone(),
                        });
                    }
                }
                i = next;
                continue;
            }
            i += 1;
        }
        Ok(())
    }

    /// A `mod` declaration at `at` (its `mod` keyword): reads the module it declares and
    /// returns the index after the declaration.
    fn module(
        &mut self,
        file: &Path,
        tokens: &[Token],
        at: usize,
        module: &[String],
        dir: &Path,
        path: Option<String>,
    ) -> Result<usize, String> {
        let name = tokens[at + 1].text.clone();
        let mut inner: Vec<String> = module.to_vec();
        inner.push(name.clone());
        if tokens.get(at + 2).is_some_and(|t| t.is("{")) {
            let end = close_of(tokens, at + 2);
            let body = &tokens[at + 3..end - 1];
            self.block(file, body, &inner, &dir.join(&name))?;
            return Ok(end);
        }
        let candidates = match &path {
            Some(path) => vec![file.parent().unwrap_or(Path::new("")).join(path)],
            None => vec![
                dir.join(format!("{name}.rs")),
                dir.join(&name).join("mod.rs"),
            ],
        };
        for candidate in &candidates {
            if let Some(text) = (self.read)(candidate) {
                // A `mod.rs`, or a file named by `#[path]`, holds its children beside it.
                let child_dir =
                    if path.is_some() || candidate.file_name().is_some_and(|n| n == "mod.rs") {
                        candidate.parent().unwrap_or(Path::new("")).to_path_buf()
                    } else {
                        candidate.with_extension("")
                    };
                self.graph.files += 1;
                self.block(candidate, &lex(&text), &inner, &child_dir)?;
                return Ok(at + 3);
            }
        }
        Err(format!(
            "{}:{}: mod {name}; found in none of {candidates:?}",
            file.display(),
            tokens[at].line
        ))
    }

    /// The path starting at `i`, if it names something from the crate root: `crate::…`,
    /// `super::…` climbing to the root, or (in the root) a top-level module by its name.
    fn reference(
        &self,
        tokens: &[Token],
        i: usize,
        module: &[String],
    ) -> Option<(Reference, usize)> {
        let token = &tokens[i];
        if token.kind != Kind::Ident || !tokens.get(i + 1).is_some_and(|t| t.is("::")) {
            return None;
        }
        if i > 0 && tokens[i - 1].is("::") {
            return None;
        }
        // How many modules up from `module` the path starts, and where its rest begins.
        let (up, mut rest) = if token.is("crate") {
            (module.len(), i + 2)
        } else if token.is("super") {
            let mut up = 1;
            let mut j = i + 2;
            while tokens.get(j).is_some_and(|t| t.is("super"))
                && tokens.get(j + 1).is_some_and(|t| t.is("::"))
            {
                up += 1;
                j += 2;
            }
            (up, j)
        } else if module.is_empty() && (token.is("self") || self.top.contains(&token.text)) {
            (0, if token.is("self") { i + 2 } else { i })
        } else {
            return None;
        };
        if up != module.len() {
            // Below the root: the path stays inside this top-level module.
            return Some((
                Reference {
                    names: Vec::new(),
                    line: token.line,
                    text: String::new(),
                },
                rest.max(i + 1),
            ));
        }
        let start = rest;
        let mut names = Vec::new();
        if tokens.get(rest).is_some_and(|t| t.is("{")) {
            let end = close_of(tokens, rest);
            for part in split_commas(&tokens[rest + 1..end - 1]) {
                if let Some(first) = part.first().filter(|t| t.kind == Kind::Ident) {
                    names.push(first.text.clone());
                }
            }
            rest = end;
        } else if let Some(name) = tokens.get(rest).filter(|t| t.kind == Kind::Ident) {
            names.push(name.text.clone());
            rest += 1;
            // The rest of the path, for the message.
            while tokens.get(rest).is_some_and(|t| t.is("::"))
                && tokens.get(rest + 1).is_some_and(|t| t.kind == Kind::Ident)
            {
                rest += 2;
            }
        }
        let text = tokens[i..rest.max(start)]
            .iter()
            .map(|t| t.text.as_str())
            .collect::<Vec<_>>()
            .join("")
            .replace(',', ", ");
        Some((
            Reference {
                names,
                line: token.line,
                text,
            },
            rest.max(i + 1),
        ))
    }
}

/// Whether a module declaration (`mod x;` or `mod x { … }`) starts at `i`.
fn is_mod(tokens: &[Token], i: usize) -> bool {
    tokens.get(i).is_some_and(|t| t.is("mod"))
        && tokens.get(i + 1).is_some_and(|t| t.kind == Kind::Ident)
        && tokens.get(i + 2).is_some_and(|t| t.is(";") || t.is("{"))
}
