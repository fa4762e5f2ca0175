//! The two inputs of a configuration, turned into figment dictionaries: the TOML text (parsed
//! with `toml_edit` so every key keeps its line, with `${VAR}` / `${VAR:-default}` replaced in
//! string values) and the `PATTERD_<SECTION>__<KEY>` environment overrides. Alongside the
//! values it builds the [`Locator`] that later turns a key path into "file:line" or the name of
//! the environment variable that set it.

use std::collections::HashMap;

use figment::value::{Dict, Value};
use toml_edit::{Item, Table};

use super::error::{ConfigError, Problem};

/// The prefix of environment overrides.
pub(crate) const ENV_PREFIX: &str = "PATTERD_";
/// The separator between the levels of an environment override's name.
pub(crate) const ENV_SEPARATOR: &str = "__";

/// Maps a key path (`["server", "listen"]`, `["numbers", "0", "agent"]`) to where it was set.
#[derive(Debug, Default, Clone)]
pub(crate) struct Locator {
    origin: String,
    lines: HashMap<Vec<String>, usize>,
    env: Vec<(Vec<String>, String)>,
}

impl Locator {
    /// The 1-based line where `path` (or, failing that, its nearest enclosing table) appears
    /// in the file.
    pub(crate) fn line(&self, path: &[String]) -> Option<usize> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.lines.get(&path[..n]).copied())
    }

    /// The line of exactly `path`, if the file has it.
    pub(crate) fn exact_line(&self, path: &[String]) -> Option<usize> {
        self.lines.get(path).copied()
    }

    /// The environment variable that overrides `path`, if one does.
    pub(crate) fn env_var(&self, path: &[String]) -> Option<&str> {
        self.env
            .iter()
            .find(|(p, _)| p.as_slice() == path)
            .map(|(_, name)| name.as_str())
    }

    /// Where `path` was set, for the front of a message: the environment variable when one
    /// overrides it, else `file:line` (the key's line, or its table's), else the file name.
    pub(crate) fn locate(&self, path: &[String]) -> String {
        if let Some(var) = self.env_var(path) {
            return format!("environment variable {var}");
        }
        match self.line(path) {
            Some(line) => format!("{}:{line}", self.origin),
            None => self.origin.clone(),
        }
    }
}

/// The parsed file: its values (after substitution) and where each key is.
pub(crate) struct FileSource {
    pub(crate) dict: Dict,
    pub(crate) locator: Locator,
}

/// Parses `text`, substitutes `${VAR}` references from `env` and indexes every key's line.
/// A syntax error stops here; missing variables are all collected before failing.
pub(crate) fn parse_file(
    text: &str,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<FileSource, ConfigError> {
    let lines = LineIndex::new(text);
    let doc = toml_edit::Document::parse(text).map_err(|e| {
        let (line, column) = e
            .span()
            .map(|s| lines.line_col(text, s.start))
            .unwrap_or((1, 1));
        let message = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        ConfigError::Syntax {
            origin: origin.to_string(),
            line,
            column,
            message,
        }
    })?;

    let mut walker = Walker {
        text,
        index: &lines,
        env,
        locator: Locator {
            origin: origin.to_string(),
            ..Locator::default()
        },
        problems: Vec::new(),
        path: Vec::new(),
    };
    let dict = walker.table(doc.as_table());
    if !walker.problems.is_empty() {
        return Err(ConfigError::Invalid(walker.problems));
    }
    Ok(FileSource {
        dict,
        locator: walker.locator,
    })
}

/// Builds the override dictionary from `vars` (every variable of the environment; those
/// without the `PATTERD_` prefix or without a `__` are ignored, so `PATTERD_API_TOKEN` stays
/// free for `${PATTERD_API_TOKEN}`), and records which variable set which path in `locator`.
pub(crate) fn env_overrides(vars: &[(String, String)], locator: &mut Locator) -> Dict {
    let mut dict = Dict::new();
    for (name, raw) in vars {
        let Some(rest) = strip_prefix_ignore_case(name, ENV_PREFIX) else {
            continue;
        };
        if !rest.contains(ENV_SEPARATOR) {
            continue;
        }
        let path: Vec<String> = rest
            .split(ENV_SEPARATOR)
            .map(|s| s.trim().to_ascii_lowercase())
            .collect();
        if path.iter().any(String::is_empty) {
            continue;
        }
        insert_path(&mut dict, &path, env_value(raw));
        locator.env.push((path, name.clone()));
    }
    dict
}

fn strip_prefix_ignore_case<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let head = name.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &name[prefix.len()..])
}

/// An override's value: a string, unless it is written as a TOML-like array or table
/// (`[1, 2]`, `{a = 1}`). Numbers and booleans stay strings here and are converted when the
/// target key wants one (figment's lossy extraction), so a numeric-looking token stays a token.
fn env_value(raw: &str) -> Value {
    let trimmed = raw.trim();
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        let Ok(v) = trimmed.parse::<Value>();
        if matches!(v, Value::Array(..) | Value::Dict(..)) {
            return v;
        }
    }
    Value::from(raw.to_string())
}

fn insert_path(dict: &mut Dict, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        dict.insert(first.clone(), value);
        return;
    }
    let entry = dict
        .entry(first.clone())
        .or_insert_with(|| Value::from(Dict::new()));
    if !matches!(entry, Value::Dict(..)) {
        *entry = Value::from(Dict::new());
    }
    if let Value::Dict(_, inner) = entry {
        insert_path(inner, rest, value);
    }
}

/// Byte offset → 1-based line and column.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self { starts }
    }

    fn line(&self, offset: usize) -> usize {
        match self.starts.binary_search(&offset) {
            Ok(i) => i + 1,
            Err(i) => i,
        }
    }

    fn line_col(&self, text: &str, offset: usize) -> (usize, usize) {
        let line = self.line(offset);
        let start = self.starts.get(line - 1).copied().unwrap_or(0);
        let column = text
            .get(start..offset.min(text.len()))
            .map(|s| s.chars().count() + 1)
            .unwrap_or(1);
        (line, column)
    }
}

struct Walker<'a> {
    text: &'a str,
    index: &'a LineIndex,
    env: &'a dyn Fn(&str) -> Option<String>,
    locator: Locator,
    problems: Vec<Problem>,
    path: Vec<String>,
}

impl Walker<'_> {
    fn record(&mut self, span: Option<std::ops::Range<usize>>, overwrite: bool) {
        let Some(span) = span else { return };
        if span.start > self.text.len() {
            return;
        }
        let line = self.index.line(span.start);
        if overwrite {
            self.locator.lines.insert(self.path.clone(), line);
        } else {
            self.locator.lines.entry(self.path.clone()).or_insert(line);
        }
    }

    fn table(&mut self, table: &Table) -> Dict {
        let mut dict = Dict::new();
        for (name, item) in table.iter() {
            self.path.push(name.to_string());
            self.record(table.key(name).and_then(|k| k.span()), false);
            if let Some(value) = self.item(item) {
                dict.insert(name.to_string(), value);
            }
            self.path.pop();
        }
        dict
    }

    fn item(&mut self, item: &Item) -> Option<Value> {
        match item {
            Item::None => None,
            Item::Value(v) => Some(self.value(v)),
            Item::Table(t) => {
                // A `[header]` table is located at its header.
                if !t.is_implicit() && !t.is_dotted() {
                    self.record(t.span(), true);
                }
                Some(Value::from(self.table(t)))
            }
            Item::ArrayOfTables(array) => {
                let mut out = Vec::new();
                for (i, t) in array.iter().enumerate() {
                    self.path.push(i.to_string());
                    self.record(t.span(), true);
                    out.push(Value::from(self.table(t)));
                    self.path.pop();
                }
                Some(Value::from(out))
            }
        }
    }

    fn value(&mut self, value: &toml_edit::Value) -> Value {
        use toml_edit::Value as V;
        self.record(value.span(), false);
        match value {
            V::String(s) => Value::from(self.substitute(s.value())),
            V::Integer(i) => Value::from(*i.value()),
            V::Float(f) => Value::from(*f.value()),
            V::Boolean(b) => Value::from(*b.value()),
            V::Datetime(d) => Value::from(d.value().to_string()),
            V::Array(array) => {
                let mut out = Vec::new();
                for (i, v) in array.iter().enumerate() {
                    self.path.push(i.to_string());
                    out.push(self.value(v));
                    self.path.pop();
                }
                Value::from(out)
            }
            V::InlineTable(t) => {
                let mut dict = Dict::new();
                for (name, v) in t.iter() {
                    self.path.push(name.to_string());
                    self.record(t.key(name).and_then(|k| k.span()), false);
                    dict.insert(name.to_string(), self.value(v));
                    self.path.pop();
                }
                Value::from(dict)
            }
        }
    }

    fn substitute(&mut self, s: &str) -> String {
        match substitute(s, self.env) {
            Ok(out) => out,
            Err(errors) => {
                let location = self.locator.locate(&self.path);
                let key = super::error::describe_key(&self.path);
                for e in errors {
                    let message = match e {
                        SubstError::Missing(var) => format!(
                            "{key} needs environment variable {var}, which is not set \
                             (use ${{{var}:-}} to make it optional)"
                        ),
                        SubstError::Unterminated => format!(
                            "{key}: `${{` without a closing `}}` (write `$${{` for a literal `${{`)"
                        ),
                        SubstError::BadName(name) => format!(
                            "{key}: `${{{name}}}` is not a valid variable reference \
                             (use ${{NAME}} or ${{NAME:-default}}, NAME made of A-Z, 0-9, _)"
                        ),
                    };
                    self.problems.push(Problem::new(location.clone(), message));
                }
                String::new()
            }
        }
    }
}

/// What went wrong replacing a `${...}` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SubstError {
    /// `${VAR}` with `VAR` unset.
    Missing(String),
    /// `${` with no closing `}`.
    Unterminated,
    /// `${...}` whose name is not `[A-Za-z_][A-Za-z0-9_]*`.
    BadName(String),
}

/// Replaces `${VAR}` (required) and `${VAR:-default}` (used when `VAR` is unset or empty) in
/// `s`; `$${` is a literal `${`. Returns every problem found, not just the first.
pub(crate) fn substitute(
    s: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, Vec<SubstError>> {
    let mut out = String::with_capacity(s.len());
    let mut errors = Vec::new();
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let Some(end) = tail.find('}') else {
                errors.push(SubstError::Unterminated);
                rest = "";
                break;
            };
            let inner = &tail[..end];
            rest = &tail[end + 1..];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            if !is_var_name(name) {
                errors.push(SubstError::BadName(inner.to_string()));
                continue;
            }
            match (env(name), default) {
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => errors.push(SubstError::Missing(name.to_string())),
            }
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn substitution_forms() {
        assert_eq!(substitute("a ${SET} b", &env).as_deref(), Ok("a value b"));
        assert_eq!(substitute("${UNSET:-dflt}", &env).as_deref(), Ok("dflt"));
        assert_eq!(substitute("${UNSET:-}", &env).as_deref(), Ok(""));
        assert_eq!(substitute("${EMPTY:-x}", &env).as_deref(), Ok("x"));
        assert_eq!(substitute("${EMPTY}", &env).as_deref(), Ok(""));
        assert_eq!(substitute("$${SET} $5", &env).as_deref(), Ok("${SET} $5"));
        assert_eq!(
            substitute("${A} ${B}", &env),
            Err(vec![
                SubstError::Missing("A".into()),
                SubstError::Missing("B".into())
            ])
        );
        assert_eq!(
            substitute("${SET", &env),
            Err(vec![SubstError::Unterminated])
        );
        assert_eq!(
            substitute("${1X}", &env),
            Err(vec![SubstError::BadName("1X".into())])
        );
    }

    #[test]
    fn lines_and_columns() {
        let text = "a\nbc\n\nd";
        let idx = LineIndex::new(text);
        assert_eq!(idx.line(0), 1);
        assert_eq!(idx.line(2), 2);
        assert_eq!(idx.line_col(text, 3), (2, 2));
        assert_eq!(idx.line(6), 4);
    }

    #[test]
    fn env_overrides_nest_and_skip_unqualified() {
        let mut loc = Locator::default();
        let vars = vec![
            (
                "PATTERD_SERVER__LISTEN".to_string(),
                "0.0.0.0:9000".to_string(),
            ),
            ("PATTERD_API_TOKEN".to_string(), "x".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ];
        let dict = env_overrides(&vars, &mut loc);
        assert_eq!(dict.len(), 1);
        let path = vec!["server".to_string(), "listen".to_string()];
        assert_eq!(loc.env_var(&path), Some("PATTERD_SERVER__LISTEN"));
    }
}
