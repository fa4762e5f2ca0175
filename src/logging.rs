//! Logging setup: `tracing-subscriber` in the `[log]` format (`pretty` for people, `json` for
//! log shippers) at the `[log]` level. Phone numbers reach logs only through
//! [`crate::security::mask_number`]; secrets never do.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

use crate::config::{LogConfig, LogFormat};

/// What decides which events are logged.
#[derive(Debug)]
enum Filter {
    /// One level for everything (`info`, `debug`, …): a static maximum, which costs nothing
    /// when a span is entered. Every call's tasks run inside the call's span, so its futures
    /// enter and leave it on every poll — tens of thousands of times a second under load.
    Level(LevelFilter),
    /// Per-target or per-span directives (`patterd=debug,hyper=warn`): `EnvFilter`, which
    /// tracks the spans it may have to match on every enter and exit.
    Directives(Box<EnvFilter>),
}

/// `RUST_LOG` when set and valid, else `[log] level`, else `info`.
fn filter(rust_log: Option<&str>, level: &str) -> Filter {
    let parse = |s: &str| -> Option<Filter> {
        if let Ok(l) = s.trim().parse::<LevelFilter>() {
            return Some(Filter::Level(l));
        }
        EnvFilter::try_new(s)
            .ok()
            .map(|f| Filter::Directives(Box::new(f)))
    };
    rust_log
        .and_then(parse)
        .or_else(|| parse(level))
        .unwrap_or(Filter::Level(LevelFilter::INFO))
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `[log] level`. Calling it
/// twice keeps the first subscriber.
pub fn init(cfg: &LogConfig) {
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    let rust_log = std::env::var("RUST_LOG").ok();
    // The builder's type changes with each choice, so each combination installs itself.
    let _ = match (filter(rust_log.as_deref(), &cfg.level), cfg.format) {
        (Filter::Level(l), LogFormat::Json) => builder
            .with_max_level(l)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        (Filter::Level(l), LogFormat::Pretty) => builder.with_max_level(l).compact().try_init(),
        (Filter::Directives(f), LogFormat::Json) => builder
            .with_env_filter(*f)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        (Filter::Directives(f), LogFormat::Pretty) => {
            builder.with_env_filter(*f).compact().try_init()
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_level_needs_no_directive_filter() {
        assert!(matches!(
            filter(None, "debug"),
            Filter::Level(LevelFilter::DEBUG)
        ));
        assert!(matches!(
            filter(None, " WARN "),
            Filter::Level(LevelFilter::WARN)
        ));
        assert!(matches!(
            filter(Some("error"), "debug"),
            Filter::Level(LevelFilter::ERROR)
        ));
    }

    #[test]
    fn directives_keep_the_env_filter_and_rust_log_wins() {
        match filter(Some("patterd=debug,hyper=warn"), "info") {
            Filter::Directives(f) => assert!(f.to_string().contains("patterd=debug"), "{f}"),
            other => panic!("expected directives, got {other:?}"),
        }
        match filter(None, "patterd::call=trace") {
            Filter::Directives(f) => assert!(f.to_string().contains("patterd::call=trace")),
            other => panic!("expected directives, got {other:?}"),
        }
    }

    #[test]
    fn an_unusable_rust_log_falls_back_to_the_config_then_info() {
        assert!(matches!(
            filter(Some("=,=x["), "warn"),
            Filter::Level(LevelFilter::WARN)
        ));
        assert!(matches!(
            filter(None, "=,=x["),
            Filter::Level(LevelFilter::INFO)
        ));
    }
}
