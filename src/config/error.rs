//! Configuration errors written for the person editing `patter.toml`: every problem names
//! where it is (`file:line`, or the environment variable that set the key), the key in the
//! file's own terms (`[llm.hermes] api_key`) and, where there is one, what to write instead.
//! This module also translates figment's deserialization errors into such problems.

use std::fmt;

use figment::error::Kind;

use super::source::Locator;

/// One thing wrong with the configuration, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `patter.toml:12`, `patter.toml`, or `environment variable PATTERD_SERVER__LISTEN`.
    pub(crate) location: String,
    pub message: String,
}

impl Problem {
    pub fn new(location: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            location: location.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// Why a configuration could not be loaded. `Display` is the message for the user; an
/// [`Invalid`](ConfigError::Invalid) configuration lists every problem, one per line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read the configuration file: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{origin}:{line}:{column}: TOML syntax error: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}", join_lines(.0))]
    Invalid(Vec<Problem>),
}

fn join_lines(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many leading path segments name the table a key lives in.
fn table_depth(path: &[String]) -> usize {
    match path.first().map(String::as_str) {
        Some("server") if path.get(1).map(String::as_str) == Some("tls") => 2,
        Some("server" | "log" | "store" | "cluster" | "outbound") => 1,
        Some("llm" | "stt" | "tts" | "carriers" | "agents" | "numbers" | "turn_model") => 2,
        _ => 0,
    }
}

fn bare(segment: &str) -> String {
    if !segment.is_empty()
        && segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        segment.to_string()
    } else {
        format!("{segment:?}")
    }
}

/// The table part of `path` as written in TOML: `[server]`, `[llm.hermes]`,
/// `[[numbers]] entry 2`, or `the top level`.
pub(crate) fn describe_table(path: &[String]) -> String {
    let depth = table_depth(path).min(path.len());
    let table = &path[..depth];
    match table {
        [] => "the top level".to_string(),
        [first, index] if first == "numbers" => match index.parse::<usize>() {
            Ok(i) => format!("[[numbers]] entry {}", i + 1),
            Err(_) => format!("[numbers.{}]", bare(index)),
        },
        _ => format!(
            "[{}]",
            table.iter().map(|s| bare(s)).collect::<Vec<_>>().join(".")
        ),
    }
}

/// The key part of `path` below its table: `api_key`, `allowed_callers[0]`.
fn key_within_table(path: &[String]) -> String {
    let depth = table_depth(path).min(path.len());
    let mut out = String::new();
    for segment in &path[depth..] {
        if segment.parse::<usize>().is_ok() && !out.is_empty() {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&bare(segment));
        }
    }
    out
}

/// A key for messages: `[llm.hermes] api_key`, `[server]` for a table, `sever` at top level.
pub(crate) fn describe_key(path: &[String]) -> String {
    let key = key_within_table(path);
    if table_depth(path) == 0 {
        return if key.is_empty() {
            "the configuration".to_string()
        } else {
            format!("`{key}`")
        };
    }
    let table = describe_table(path);
    if key.is_empty() {
        table
    } else {
        format!("{table} {key}")
    }
}

/// The valid name closest to `name`, if it is close enough to be a likely typo.
pub(crate) fn suggest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .map(|c| (strsim::osa_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// serde's names for what it expected, in words.
fn expected_in_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative whole number".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" | "bool" => "true or false".into(),
        "a sequence" => "an array".into(),
        "a map" => "a table".into(),
        other => other.to_string(),
    }
}

/// Turns one figment error into a located problem.
pub(crate) fn from_figment(error: &figment::Error, locator: &Locator) -> Problem {
    let path = &error.path;
    let key = describe_key(path);
    let message = match &error.kind {
        Kind::UnknownField(name, expected) => {
            // Tables read in two steps (a carrier's keys, by its `kind`) report an unknown key
            // at the table itself; the key belongs below it.
            if path.len() == table_depth(path) && !path.is_empty() {
                let mut keyed = path.clone();
                keyed.push(name.clone());
                let mut e = error.clone();
                e.path = keyed;
                return from_figment(&e, locator);
            }
            let table = describe_table(&path[..path.len().saturating_sub(1)]);
            let place = if table == "the top level" {
                "at the top level".to_string()
            } else {
                format!("in {table}")
            };
            match suggest(name, expected.iter().copied()) {
                Some(s) => format!("unknown key `{name}` {place}; did you mean `{s}`?"),
                None if expected.is_empty() => format!("unknown key `{name}` {place}"),
                None => format!(
                    "unknown key `{name}` {place}; valid keys: {}",
                    list(expected)
                ),
            }
        }
        Kind::UnknownVariant(value, expected) => {
            let mut m = format!(
                "{key}: `{value}` is not one of the allowed values: {}",
                list(expected)
            );
            if let Some(s) = suggest(value, expected.iter().copied()) {
                m.push_str(&format!("; did you mean `{s}`?"));
            }
            m
        }
        Kind::MissingField(field) => {
            format!(
                "{} is missing the required key `{field}`",
                describe_table(path)
            )
        }
        Kind::InvalidType(actual, expected) => format!(
            "{key}: expected {}, found {actual}",
            expected_in_words(expected)
        ),
        Kind::InvalidValue(actual, expected) => format!(
            "{key}: invalid value {actual}, expected {}",
            expected_in_words(expected)
        ),
        Kind::InvalidLength(len, expected) => {
            format!("{key}: {len} elements, expected {expected}")
        }
        Kind::DuplicateField(field) => format!("{key}: `{field}` is given twice"),
        Kind::Message(m) => format!("{key}: {m}"),
        other => format!("{key}: {other}"),
    };
    Problem::new(locator.locate(path), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn describes_keys_in_toml_terms() {
        assert_eq!(describe_key(&p(&["server", "listen"])), "[server] listen");
        assert_eq!(
            describe_key(&p(&["server", "tls", "key"])),
            "[server.tls] key"
        );
        assert_eq!(
            describe_key(&p(&["llm", "hermes", "api_key"])),
            "[llm.hermes] api_key"
        );
        assert_eq!(
            describe_key(&p(&["numbers", "1", "allowed_callers", "0"])),
            "[[numbers]] entry 2 allowed_callers[0]"
        );
        assert_eq!(
            describe_key(&p(&["agents", "a b", "llm"])),
            "[agents.\"a b\"] llm"
        );
        assert_eq!(describe_key(&p(&["sever"])), "`sever`");
    }

    #[test]
    fn suggests_close_names_only() {
        let keys = ["listen", "public_url", "api_token"];
        assert_eq!(suggest("lisen", keys), Some("listen"));
        assert_eq!(suggest("api_tokn", keys), Some("api_token"));
        assert_eq!(suggest("colour", keys), None);
    }
}
