//! Rust source text to tokens: identifiers, punctuation (`::` as one), literals and
//! lifetimes, each with its line; comments, doc comments and whitespace left out.

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Ident,
    /// One punctuation character, or `::`.
    Punct,
    /// A string, character or number literal (its text is not kept).
    Literal,
    Lifetime,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) kind: Kind,
    pub(crate) text: String,
    pub(crate) line: usize,
}

impl Token {
    pub(crate) fn is(&self, text: &str) -> bool {
        self.kind != Kind::Literal && self.text == text
    }
}

/// Rust source text to tokens, comments (doc comments too) and whitespace left out.
pub(crate) fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        let start_line = line;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"…", r#"…"#, br"…", cr"…": no escapes, ends at the quote and as many hashes.
            i = hashes.0;
            let closing: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes.1))
                .collect();
            let closing: Vec<char> = closing.chars().collect();
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                if chars[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
            let text: String = chars[hashes.0..i.min(chars.len())].iter().collect();
            i += closing.len();
            out.push(string(text, start_line));
        } else if c == '"' || ((c == 'b' || c == 'c') && at(i + 1) == '"') {
            i += if c == '"' { 1 } else { 2 };
            let from = i;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if at(i) == '\n' {
                    line += 1;
                }
                i += 1;
            }
            let text: String = chars[from..i.min(chars.len())].iter().collect();
            i += 1;
            out.push(string(text, start_line));
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            let quote = if c == '\'' { i } else { i + 1 };
            if at(quote + 1) == '\\' {
                // '\n', '\'', '\u{…}': past the backslash and the character after it.
                i = quote + 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push(literal(start_line));
            } else if at(quote + 2) == '\'' {
                i = quote + 3;
                out.push(literal(start_line));
            } else {
                // A lifetime or a label: 'a, 'static.
                i = quote + 1;
                let from = i;
                while is_ident_char(at(i)) {
                    i += 1;
                }
                out.push(Token {
                    kind: Kind::Lifetime,
                    text: chars[from..i].iter().collect(),
                    line: start_line,
                });
            }
        } else if c.is_ascii_digit() {
            while is_ident_char(at(i)) || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            out.push(literal(start_line));
        } else if c == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
            i += 2;
            let from = i;
            while is_ident_char(at(i)) {
                i += 1;
            }
            out.push(ident(chars[from..i].iter().collect(), start_line));
        } else if is_ident_start(c) {
            let from = i;
            while is_ident_char(at(i)) {
                i += 1;
            }
            out.push(ident(chars[from..i].iter().collect(), start_line));
        } else if c == ':' && at(i + 1) == ':' {
            i += 2;
            out.push(punct("::", start_line));
        } else {
            i += 1;
            out.push(punct(&c.to_string(), start_line));
        }
    }
    out
}

/// Where a raw string's text starts and how many `#` close it, if one starts at `i`.
pub(crate) fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if matches!(chars.get(j), Some('b' | 'c')) {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    if i > 0 && is_ident_char(chars[i - 1]) {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((j + 1, hashes))
}

pub(crate) fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

pub(crate) fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

pub(crate) fn literal(line: usize) -> Token {
    Token {
        kind: Kind::Literal,
        text: String::new(),
        line,
    }
}

/// A string literal, its text as written (escapes not undone).
pub(crate) fn string(text: String, line: usize) -> Token {
    Token {
        kind: Kind::Literal,
        text,
        line,
    }
}

pub(crate) fn ident(text: String, line: usize) -> Token {
    Token {
        kind: Kind::Ident,
        text,
        line,
    }
}

pub(crate) fn punct(text: &str, line: usize) -> Token {
    Token {
        kind: Kind::Punct,
        text: text.to_string(),
        line,
    }
}

/// The index just past the group opened at `open` (`(`, `[` or `{`), or the end.
pub(crate) fn close_of(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        if token.kind != Kind::Punct {
            continue;
        }
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

#[test]
fn the_lexer_keeps_lines_and_tells_lifetimes_from_characters() {
    let found = lex("let c = '\\'';\nfn f<'a>() {}\n/* a\nb */ x");
    let idents: Vec<(String, usize)> = found
        .iter()
        .filter(|t| t.kind == Kind::Ident)
        .map(|t| (t.text.clone(), t.line))
        .collect();
    assert_eq!(
        idents,
        [
            ("let".to_string(), 1),
            ("c".to_string(), 1),
            ("fn".to_string(), 2),
            ("f".to_string(), 2),
            ("x".to_string(), 4),
        ]
    );
    let lifetimes: Vec<&str> = found
        .iter()
        .filter(|t| t.kind == Kind::Lifetime)
        .map(|t| t.text.as_str())
        .collect();
    assert_eq!(lifetimes, ["a"]);
}
