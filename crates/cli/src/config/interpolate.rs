//! `${VAR}` interpolation of the string scalars of a config file (docs/config.md §1.1).
//!
//! # Rules
//! 1. `${NAME}` is replaced by the value of the environment variable `NAME`
//!    (`[A-Za-z_][A-Za-z0-9_]*`). Set to the empty string, it is the empty string.
//! 2. `${NAME:-text}` is `text` when `NAME` is unset or empty, as in a shell. The default runs
//!    to the first `}` and is not interpolated itself.
//! 3. `$${` is a literal `${`. Any other `$` is kept as it is.
//! 4. An unset variable without a default, a bad name or a `${` without `}` is an error at the
//!    scalar's path. Every such problem of a scalar is reported.
//! 5. A scalar that is exactly one `${…}` is re-read as a YAML scalar after substitution, so
//!    `segments: ${SEGMENTS}` with `SEGMENTS=8` is the number 8. Only null, booleans and
//!    numbers are taken from the re-read; any other text stays the substituted string, so a
//!    value such as `a # b` or `"quoted"` is never changed by YAML syntax.
//! 6. Keys are never interpolated. Values inside lists and mappings are, at any depth.
//!
//! Interpolation runs on the parsed YAML, before any type is checked; the variables are read
//! only through the `env` function the caller passes.

use yaml_serde::Value;

use crate::yaml::fields::{Report, Stage, is_secret, join};

/// Interpolates every string scalar of `value` (at `path`) in place, recording problems,
/// failed paths and re-read scalars in `report`.
pub(super) fn interpolate(
    value: &mut Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    report: &mut Report,
) {
    match value {
        Value::String(text) => {
            if !text.contains('$') {
                return;
            }
            match substitute(text, env, is_secret(path)) {
                Ok(Substituted::Text(result)) => *text = result,
                Ok(Substituted::Whole(result)) => {
                    *value = reread(result.clone());
                    if matches!(value, Value::Bool(_) | Value::Number(_)) {
                        report.substituted.insert(path.to_owned(), result);
                    }
                }
                Err(problems) => {
                    for problem in problems {
                        report.error(Stage::Interpolate, path, problem);
                    }
                    report.failed.insert(path.to_owned());
                }
            }
        }
        Value::Sequence(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                interpolate(item, &format!("{path}[{index}]"), env, report);
            }
        }
        Value::Mapping(mapping) => {
            for (key, item) in mapping.iter_mut() {
                // A non-string key is reported by the walker; its value is still interpolated.
                let key = match key {
                    Value::String(key) => key.clone(),
                    other => format!("{other:?}"),
                };
                interpolate(item, &join(path, &key), env, report);
            }
        }
        Value::Tagged(tagged) => interpolate(&mut tagged.value, path, env, report),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The result of substituting one scalar.
#[derive(Debug, PartialEq, Eq)]
enum Substituted {
    /// The scalar had text around or between its references: it stays a string.
    Text(String),
    /// The scalar was exactly one `${…}`: its result is re-read as a YAML scalar.
    Whole(String),
}

/// Substitutes the references of one scalar, or lists every problem in it. The problems of a
/// `secret` value never quote its text (it may hold the secret itself): only variable names.
fn substitute(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    secret: bool,
) -> Result<Substituted, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    let mut references = 0;
    let mut literal = false;
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        let (before, after) = rest.split_at(dollar);
        out.push_str(before);
        literal |= !before.is_empty();
        if let Some(escaped) = after.strip_prefix("$${") {
            out.push_str("${");
            literal = true;
            rest = escaped;
        } else if let Some(reference) = after.strip_prefix("${") {
            let Some(end) = reference.find('}') else {
                problems.push(if secret {
                    "unterminated ${ in the value (not shown: it may be a secret): a reference \
                     is written ${NAME}"
                        .to_owned()
                } else {
                    format!("unterminated ${{ in {text:?}: a reference is written ${{NAME}}")
                });
                return Err(problems);
            };
            references += 1;
            match resolve(&reference[..end], env, secret) {
                Ok(value) => out.push_str(&value),
                Err(problem) => problems.push(problem),
            }
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            literal = true;
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    literal |= !rest.is_empty();
    if !problems.is_empty() {
        Err(problems)
    } else if references == 1 && !literal {
        Ok(Substituted::Whole(out))
    } else {
        Ok(Substituted::Text(out))
    }
}

/// The value of the inside of one `${…}`: `NAME` or `NAME:-default`.
fn resolve(
    reference: &str,
    env: &dyn Fn(&str) -> Option<String>,
    secret: bool,
) -> Result<String, String> {
    let (name, default) = match reference.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (reference, None),
    };
    if !is_variable_name(name) {
        return Err(if secret {
            "invalid variable name in a ${…} of the value (not shown: it may be a secret): use \
             letters, digits and '_', not starting with a digit"
                .to_owned()
        } else {
            format!(
                "invalid variable name {name:?} in ${{{reference}}}: use letters, digits and \
                 '_', not starting with a digit"
            )
        });
    }
    match (env(name), default) {
        (Some(value), None) => Ok(value),
        (Some(value), Some(_)) if !value.is_empty() => Ok(value),
        (_, Some(default)) => Ok(default.to_owned()),
        (None, None) => Err(format!(
            "environment variable {name} is not set (write ${{{name}:-default}} to give a \
             default)"
        )),
    }
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Re-reads a substituted whole scalar: null, a boolean or a number when YAML reads it so,
/// the text itself otherwise (rule 5).
fn reread(text: String) -> Value {
    match yaml_serde::from_str::<Value>(&text) {
        Ok(value @ (Value::Null | Value::Bool(_) | Value::Number(_))) => value,
        _ => Value::String(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TABLE" => Some("orders".to_owned()),
            "SEGMENTS" => Some("8".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn sub(text: &str) -> Result<Substituted, Vec<String>> {
        substitute(text, &env, false)
    }

    #[test]
    fn the_problems_of_a_secret_value_never_quote_it() {
        for text in [
            "hunter2${",
            "hunter2${bad-name}",
            "hunter2${bad-name:-x}${UNSET}",
        ] {
            let problems = substitute(text, &env, true).unwrap_err();
            assert!(!problems.is_empty());
            for problem in &problems {
                assert!(!problem.contains("hunter2"), "{problem}");
                assert!(!problem.contains("bad-name"), "{problem}");
            }
            let shown = substitute(text, &env, false).unwrap_err();
            assert!(
                shown
                    .iter()
                    .any(|p| p.contains("hunter2") || p.contains("bad-name"))
            );
        }
    }

    #[test]
    fn a_reference_inside_text_keeps_the_text_around_it() {
        assert_eq!(
            sub("arn:${TABLE}/x"),
            Ok(Substituted::Text("arn:orders/x".into()))
        );
    }

    #[test]
    fn a_lone_reference_is_marked_for_rereading() {
        assert_eq!(sub("${SEGMENTS}"), Ok(Substituted::Whole("8".into())));
        assert_eq!(
            sub("${TABLE}${SEGMENTS}"),
            Ok(Substituted::Text("orders8".into()))
        );
    }

    #[test]
    fn a_default_applies_when_the_variable_is_unset_or_empty() {
        assert_eq!(
            sub("${NOPE:-us-east-1}"),
            Ok(Substituted::Whole("us-east-1".into()))
        );
        assert_eq!(sub("${EMPTY:-x}"), Ok(Substituted::Whole("x".into())));
        assert_eq!(sub("${TABLE:-x}"), Ok(Substituted::Whole("orders".into())));
        assert_eq!(sub("${EMPTY}"), Ok(Substituted::Whole(String::new())));
    }

    #[test]
    fn a_doubled_dollar_before_a_brace_is_a_literal_reference() {
        assert_eq!(sub("$${TABLE}"), Ok(Substituted::Text("${TABLE}".into())));
        assert_eq!(sub("a$b $$c"), Ok(Substituted::Text("a$b $$c".into())));
    }

    #[test]
    fn every_unset_variable_of_a_scalar_is_named() {
        let problems = sub("${A}-${TABLE}-${B}").unwrap_err();
        assert_eq!(problems.len(), 2);
        assert!(problems[0].contains("environment variable A is not set"));
        assert!(problems[1].contains("environment variable B is not set"));
    }

    #[test]
    fn bad_references_are_errors() {
        assert!(sub("${TABLE").unwrap_err()[0].starts_with("unterminated ${"));
        assert!(sub("${1X}").unwrap_err()[0].starts_with("invalid variable name \"1X\""));
        assert!(sub("${}").unwrap_err()[0].starts_with("invalid variable name \"\""));
    }

    #[test]
    fn rereading_takes_only_scalars_that_are_not_strings() {
        assert_eq!(reread("8".into()), Value::Number(8.into()));
        assert_eq!(reread("true".into()), Value::Bool(true));
        assert_eq!(reread(String::new()), Value::Null);
        assert_eq!(reread("a # b".into()), Value::String("a # b".into()));
        assert_eq!(reread("\"q\"".into()), Value::String("\"q\"".into()));
        assert_eq!(reread("k: v".into()), Value::String("k: v".into()));
    }
}
