//! [`ColumnPath`]: where a column's value sits in an item, parsed from and printed back to the
//! config's spelling (rule 1 of the module docs).
//!
//! # Grammar
//! 1. A path is a name, then any number of `.name` and `[index]` steps.
//! 2. A bare name is one or more characters other than `.`, `[`, `]` and `"`.
//! 3. A quoted name is `"…"`; inside, `\"` is a quote and `\\` a backslash, and no other
//!    escape exists. It may be empty.
//! 4. An index is decimal digits that fit `usize`.
//! 5. Printing quotes exactly the names a bare name cannot spell (empty, or holding `.`, `[`,
//!    `]` or `"`), so parsing what was printed gives the same path.

use std::fmt;

use super::PathStep;

/// Where a column's value sits in an item (rule 1): a first attribute name, then names and
/// indexes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ColumnPath {
    steps: Vec<PathStep>,
}

impl ColumnPath {
    /// Parses a path (rule 1). The error says what is wrong and where (`"a..b": an empty name
    /// at byte 2`).
    pub fn parse(text: &str) -> Result<ColumnPath, String> {
        let mut cursor = Cursor { text, at: 0 };
        if cursor.peek() == Some('[') {
            return Err(cursor.error("a path starts with an attribute name, not an index"));
        }
        let mut steps = vec![PathStep::Name(cursor.name()?)];
        while let Some(next) = cursor.peek() {
            match next {
                '.' => {
                    cursor.advance(next);
                    steps.push(PathStep::Name(cursor.name()?));
                }
                '[' => {
                    cursor.advance(next);
                    steps.push(PathStep::Index(cursor.index()?));
                }
                ']' => return Err(cursor.error("a ']' without its '['")),
                '"' => {
                    return Err(cursor.error("a '\"' inside a name (quote the whole name)"));
                }
                _ => return Err(cursor.error("expected '.', '[' or the end")),
            }
        }
        Ok(ColumnPath { steps })
    }

    /// The item's attribute the path starts at.
    pub fn root(&self) -> &str {
        match self.steps.first() {
            Some(PathStep::Name(name)) => name,
            _ => "",
        }
    }

    /// The steps, the root first.
    pub fn steps(&self) -> &[PathStep] {
        &self.steps
    }
}

impl fmt::Display for ColumnPath {
    /// The path as it would be written in the config (names quoted where rule 1 needs it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, step) in self.steps.iter().enumerate() {
            match step {
                PathStep::Name(name) if at == 0 => write_name(f, name)?,
                step => write!(f, "{}", StepText(step))?,
            }
        }
        Ok(())
    }
}

/// One step after the root as a path writes it (`.city`, `."a.b"`, `[2]`), for messages.
pub(super) struct StepText<'a>(pub(super) &'a PathStep);

impl fmt::Display for StepText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            PathStep::Name(name) => {
                f.write_str(".")?;
                write_name(f, name)
            }
            PathStep::Index(index) => write!(f, "[{index}]"),
        }
    }
}

/// The characters a bare name cannot hold (grammar rule 2).
const SPECIAL: [char; 4] = ['.', '[', ']', '"'];

/// Writes a name bare when grammar rule 2 allows it, else quoted (rule 5).
fn write_name(f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
    if !name.is_empty() && !name.contains(SPECIAL) {
        return f.write_str(name);
    }
    f.write_str("\"")?;
    for character in name.chars() {
        if matches!(character, '"' | '\\') {
            f.write_str("\\")?;
        }
        write!(f, "{character}")?;
    }
    f.write_str("\"")
}

/// A position in the text being parsed.
struct Cursor<'a> {
    text: &'a str,
    /// The byte offset of the next character.
    at: usize,
}

impl Cursor<'_> {
    /// The next character, not consumed.
    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    /// Consumes `character`, which [`Cursor::peek`] just returned.
    fn advance(&mut self, character: char) {
        self.at += character.len_utf8();
    }

    /// The error `what` at the current byte.
    fn error(&self, what: &str) -> String {
        self.error_at(self.at, what)
    }

    /// The error `what` at byte `at`.
    fn error_at(&self, at: usize, what: &str) -> String {
        format!("{:?}: {what} at byte {at}", self.text)
    }

    /// A bare or quoted name (grammar rules 2 and 3).
    fn name(&mut self) -> Result<String, String> {
        if self.peek() == Some('"') {
            return self.quoted();
        }
        let start = self.at;
        while let Some(next) = self.peek().filter(|next| !SPECIAL.contains(next)) {
            self.advance(next);
        }
        if self.at == start {
            return Err(match self.peek() {
                Some(']') => self.error("a ']' without its '['"),
                _ => self.error("an empty name"),
            });
        }
        Ok(self.text[start..self.at].to_owned())
    }

    /// A quoted name, the cursor at its opening quote.
    fn quoted(&mut self) -> Result<String, String> {
        let start = self.at;
        self.advance('"');
        let mut name = String::new();
        loop {
            let Some(next) = self.peek() else {
                return Err(self.error_at(start, "a quote not closed"));
            };
            self.advance(next);
            match next {
                '"' => break,
                '\\' => match self.peek() {
                    Some(escaped @ ('"' | '\\')) => {
                        self.advance(escaped);
                        name.push(escaped);
                    }
                    Some(_) => {
                        return Err(self.error_at(
                            self.at - 1,
                            "an escape other than \\\" or \\\\ in a quoted name",
                        ));
                    }
                    None => return Err(self.error_at(start, "a quote not closed")),
                },
                other => name.push(other),
            }
        }
        match self.peek() {
            None | Some('.' | '[') => Ok(name),
            Some(_) => Err(self.error("expected '.', '[' or the end after a quoted name")),
        }
    }

    /// An index, the cursor just after its `[` (grammar rule 4).
    fn index(&mut self) -> Result<usize, String> {
        let start = self.at;
        while let Some(next) = self.peek().filter(char::is_ascii_digit) {
            self.advance(next);
        }
        let digits = &self.text[start..self.at];
        match self.peek() {
            Some(']') if digits.is_empty() => Err(self.error("an index without digits")),
            Some(']') => {
                self.advance(']');
                digits
                    .parse()
                    .map_err(|_| self.error_at(start, "an index too large"))
            }
            Some(_) => Err(self.error("an index of anything but digits")),
            None => Err(self.error_at(start - 1, "a '[' not closed")),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn name(text: &str) -> PathStep {
        PathStep::Name(text.to_owned())
    }

    #[test]
    fn names_and_indexes_parse_into_steps() {
        let cases = [
            ("status", vec![name("status")]),
            ("address.city", vec![name("address"), name("city")]),
            ("tags[0]", vec![name("tags"), PathStep::Index(0)]),
            (
                "lines[2].sku",
                vec![name("lines"), PathStep::Index(2), name("sku")],
            ),
            (
                "m[10][3]",
                vec![name("m"), PathStep::Index(10), PathStep::Index(3)],
            ),
            ("\"a.b\".c", vec![name("a.b"), name("c")]),
            (r#""say \"hi\" \\ ok""#, vec![name(r#"say "hi" \ ok"#)]),
            (r#"a."""#, vec![name("a"), name("")]),
            ("a b.é-x", vec![name("a b"), name("é-x")]),
            (
                r#"x."[0]"[1]"#,
                vec![name("x"), name("[0]"), PathStep::Index(1)],
            ),
        ];
        for (text, steps) in cases {
            let path = ColumnPath::parse(text).unwrap();
            assert_eq!(path.steps(), steps, "{text}");
            assert_eq!(path.to_string(), text, "{text}");
        }
        assert_eq!(ColumnPath::parse("lines[2].sku").unwrap().root(), "lines");
    }

    #[test]
    fn leading_zeros_of_an_index_are_read_and_not_written() {
        let path = ColumnPath::parse("a[007]").unwrap();
        assert_eq!(path.steps()[1], PathStep::Index(7));
        assert_eq!(path.to_string(), "a[7]");
    }

    #[test]
    fn a_bad_path_says_what_and_where() {
        let cases = [
            ("", r#""": an empty name at byte 0"#),
            ("a..b", r#""a..b": an empty name at byte 2"#),
            ("a.", r#""a.": an empty name at byte 2"#),
            (".a", r#"".a": an empty name at byte 0"#),
            (
                "[0]",
                r#""[0]": a path starts with an attribute name, not an index at byte 0"#,
            ),
            ("a.[0]", r#""a.[0]": an empty name at byte 2"#),
            ("a]", r#""a]": a ']' without its '[' at byte 1"#),
            ("a.]", r#""a.]": a ']' without its '[' at byte 2"#),
            ("a[]", r#""a[]": an index without digits at byte 2"#),
            (
                "a[x]",
                r#""a[x]": an index of anything but digits at byte 2"#,
            ),
            (
                "a[-1]",
                r#""a[-1]": an index of anything but digits at byte 2"#,
            ),
            ("a[1", r#""a[1": a '[' not closed at byte 1"#),
            (
                "a[99999999999999999999999]",
                r#""a[99999999999999999999999]": an index too large at byte 2"#,
            ),
            (
                r#"a"b""#,
                r#""a\"b\"": a '"' inside a name (quote the whole name) at byte 1"#,
            ),
            (r#""ab"#, r#""\"ab": a quote not closed at byte 0"#),
            (r#"x."a\"#, r#""x.\"a\\": a quote not closed at byte 2"#),
            (
                r#""a\n""#,
                r#""\"a\\n\"": an escape other than \" or \\ in a quoted name at byte 2"#,
            ),
            (
                r#""a"b"#,
                r#""\"a\"b": expected '.', '[' or the end after a quoted name at byte 3"#,
            ),
            (
                "a[1]b",
                r#""a[1]b": expected '.', '[' or the end at byte 4"#,
            ),
        ];
        for (text, error) in cases {
            assert_eq!(ColumnPath::parse(text), Err(error.to_owned()), "{text}");
        }
    }

    /// Names of characters that need quoting and escaping as well as plain ones.
    fn any_name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 .\\[\\]\"\\\\é_-]{0,6}"
    }

    fn any_step() -> impl Strategy<Value = PathStep> {
        prop_oneof![
            any_name().prop_map(PathStep::Name),
            any::<usize>().prop_map(PathStep::Index),
        ]
    }

    proptest! {
        #[test]
        fn a_printed_path_parses_back_to_itself(
            root in any_name(),
            rest in proptest::collection::vec(any_step(), 0..6),
        ) {
            let mut steps = vec![PathStep::Name(root)];
            steps.extend(rest);
            let path = ColumnPath { steps };
            let printed = path.to_string();
            prop_assert_eq!(ColumnPath::parse(&printed), Ok(path), "{}", printed);
        }
    }
}
