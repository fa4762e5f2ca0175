//! Configuration: the `patter.toml` schema ([`schema`]), loading it and checking it. Loading
//! reads the TOML file, replaces `${VAR}` / `${VAR:-default}` inside string values, applies
//! `PATTERD_<SECTION>__<KEY>` environment overrides (figment), deserializes, then validates
//! cross-references and values. Every error names the file and line (or the environment
//! variable) and says what to do; unconfigured carriers and providers are warnings.

mod error;
pub mod schema;
mod source;
pub mod tools;
pub mod validate;

pub use error::{ConfigError, Problem};
pub use schema::*;
pub(crate) use source::ENV_PREFIX;
pub use tools::{BuiltinTool, ConsultConfig, WebhookToolConfig};

use std::path::Path;

use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};

/// A configuration that loaded, with the warnings it produced (unconfigured carriers and
/// providers). `check --strict` turns warnings into errors.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    pub warnings: Vec<String>,
}

/// Loads and validates the configuration file at `path`, reading the process environment
/// for `${VAR}` references and `PATTERD_<SECTION>__<KEY>` overrides.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    load_str_with_env_overrides(
        &text,
        &path.display().to_string(),
        &|k| std::env::var(k).ok(),
        &vars,
    )
}

/// Loads and validates configuration text without environment overrides. `origin` names it
/// in messages (usually the file name); `env` looks up `${VAR}` references.
pub fn load_str(
    text: &str,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LoadedConfig, ConfigError> {
    load_str_with_env_overrides(text, origin, env, &[])
}

/// As [`load_str`], with one explicit environment (name, value pairs) used both for `${VAR}`
/// references and for `PATTERD_<SECTION>__<KEY>` overrides. Tests use this instead of
/// touching the process environment.
pub fn load_str_with_vars(
    text: &str,
    origin: &str,
    vars: &[(&str, &str)],
) -> Result<LoadedConfig, ConfigError> {
    let owned: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |k: &str| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    };
    load_str_with_env_overrides(text, origin, &lookup, &owned)
}

/// The full loader: `text` (named `origin` in messages), `${VAR}` looked up through `env`,
/// then the overrides among `overrides` (all environment variables may be passed; only
/// `PATTERD_<SECTION>__<KEY>` ones are used) merged over the file.
pub(crate) fn load_str_with_env_overrides(
    text: &str,
    origin: &str,
    env: &dyn Fn(&str) -> Option<String>,
    overrides: &[(String, String)],
) -> Result<LoadedConfig, ConfigError> {
    let file = source::parse_file(text, origin, env)?;
    let mut locator = file.locator;
    let env_dict = source::env_overrides(overrides, &mut locator);

    let figment = Figment::new()
        .merge(DictProvider {
            name: origin.to_string(),
            dict: file.dict,
        })
        .merge(DictProvider {
            name: format!("`{ENV_PREFIX}` environment variables"),
            dict: env_dict,
        });
    let mut config: Config = figment.extract_lossy().map_err(|e| {
        ConfigError::Invalid(
            e.into_iter()
                .map(|e| error::from_figment(&e, &locator))
                .collect(),
        )
    })?;

    for tts in config.tts.values_mut() {
        tts.fill_kind_defaults();
    }
    let problems = validate::validate(&config, &locator);
    if !problems.is_empty() {
        return Err(ConfigError::Invalid(problems));
    }
    let warnings = validate::warnings(&config);
    Ok(LoadedConfig { config, warnings })
}

/// The effective configuration as TOML, for `patterd check`: defaults filled in, overrides
/// applied, every secret shown as `***` (or `""` when unset).
pub fn render_effective(config: &Config) -> String {
    match toml::to_string_pretty(config) {
        Ok(body) => format!(
            "# Effective patterd configuration (defaults applied, secrets shown as \"***\")\n\n{body}"
        ),
        Err(e) => format!("# cannot render the effective configuration: {e}\n"),
    }
}

/// A figment provider over an already-built dictionary, named for figment's metadata.
struct DictProvider {
    name: String,
    dict: Dict,
}

impl Provider for DictProvider {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(carrier: &str) -> String {
        let text = format!("[carriers.tw]\n{carrier}\n");
        match load_str_with_vars(&text, "p.toml", &[]) {
            Ok(_) => panic!("expected an error for {carrier}"),
            Err(e) => e.to_string(),
        }
    }

    /// A carrier section is a tagged enum, but its errors read like every other table's.
    #[test]
    fn carrier_tables_report_keys_and_lines() {
        assert_eq!(
            err("kind = \"twilio\"\nauth_tokn = \"x\""),
            "p.toml:3: unknown key `auth_tokn` in [carriers.tw]; did you mean `auth_token`?"
        );
        assert_eq!(
            err("kind = \"twilio\"\naccount_sid = 5"),
            "p.toml:3: [carriers.tw] account_sid: expected a string, found signed int `5`"
        );
        assert!(err("kind = \"twillio\"").starts_with(
            "p.toml:2: [carriers.tw] kind: `twillio` is not one of the allowed values"
        ),);
        assert_eq!(
            err("account_sid = \"x\""),
            "p.toml:1: [carriers.tw] is missing the required key `kind`"
        );
        assert!(err("kind = \"twilio\"\npublic_key = \"p\"").contains(
            "unknown key `public_key` in [carriers.tw]; valid keys: `account_sid`, `auth_token`, `api_base_url`"
        ));
        let ok = load_str_with_vars(
            "[carriers.tx]\nkind = \"telnyx\"\napi_key = \"k\"\npublic_key = \"p\"\n",
            "p.toml",
            &[],
        )
        .expect("loads");
        let tx = &ok.config.carriers["tx"];
        assert_eq!(tx.kind(), CarrierKind::Telnyx);
        assert_eq!(tx.api_base(), "https://api.telnyx.com");
        assert!(tx.missing_credentials().is_empty());
    }
}
