//! What a reload applies and what it keeps. [`plan`] takes the re-read configuration and keeps
//! `[server]`, `[log]`, `[store]`, `[carriers.*]`, `[turn_model.*]` and `[telemetry]` as the daemon started
//! (they need a restart), except `server.api_token` and `[[server.api_tokens]]`, which take
//! effect: the API's bearer check and scopes, the phone-link key and the page cookie all
//! derive from the configuration in force.
//! Each kept key whose value changed is named in [`Plan::needs_restart`]. Sections are
//! compared through their serialized form with secrets fingerprinted
//! ([`crate::util::secret::fingerprinted`]), so a rotated secret counts as a change.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use crate::config::Config;

/// The configuration a reload applies and what it could not apply.
pub struct Plan {
    /// The re-read file with the restart-only sections of the running configuration.
    pub config: Config,
    /// One line per kept key whose value changed (`server.listen changed: …`).
    pub needs_restart: Vec<String>,
    /// `server.api_token` changed and is in force.
    pub token_rotated: bool,
    /// `[[server.api_tokens]]` changed (added, removed, rotated, rescoped) and is in force.
    pub tokens_changed: bool,
}

/// What a reload of `new` over the running `old` applies ([`Plan`]).
pub fn plan(old: &Config, mut new: Config) -> Plan {
    let mut needs_restart = Vec::new();
    let mut kept = |section: &str, a: &dyn Erased, b: &dyn Erased, why: &str| {
        for key in changed_keys(section, &a.value(), &b.value()) {
            if key != "server.api_token" && key != "server.api_tokens" {
                needs_restart.push(format!(
                    "{key} changed: {why}; restart to apply (the running value stays in force)"
                ));
            }
        }
    };
    kept(
        "server",
        &old.server,
        &new.server,
        "the listener, TLS, public_url and limits are set at start",
    );
    kept("log", &old.log, &new.log, "logging is set up at start");
    kept(
        "store",
        &old.store,
        &new.store,
        "the call store opens at start",
    );
    kept(
        "cluster",
        &old.cluster,
        &new.cluster,
        "the instance's name is set at start",
    );
    kept(
        "carriers",
        &old.carriers,
        &new.carriers,
        "carrier accounts and credentials are read at start",
    );
    kept(
        "turn_model",
        &old.turn_model,
        &new.turn_model,
        "end-of-turn models load at start",
    );
    kept(
        "telemetry",
        &old.telemetry,
        &new.telemetry,
        "the trace exporter starts with the daemon",
    );
    let token_rotated = old.server.api_token != new.server.api_token;
    let tokens_changed = changed_keys(
        "server",
        &old.server.api_tokens.value(),
        &new.server.api_tokens.value(),
    )
    .into_iter()
    .next()
    .is_some();
    let token = std::mem::take(&mut new.server.api_token);
    let tokens = std::mem::take(&mut new.server.api_tokens);
    new.server = old.server.clone();
    new.server.api_token = token;
    new.server.api_tokens = tokens;
    new.log = old.log.clone();
    new.store = old.store.clone();
    new.cluster = old.cluster.clone();
    new.carriers = old.carriers.clone();
    new.turn_model = old.turn_model.clone();
    new.telemetry = old.telemetry.clone();
    Plan {
        config: new,
        needs_restart,
        token_rotated,
        tokens_changed,
    }
}

/// A config section as JSON with its secrets fingerprinted (the schema derives `Serialize`,
/// not `PartialEq`).
trait Erased {
    fn value(&self) -> Value;
}

impl<T: Serialize> Erased for T {
    fn value(&self) -> Value {
        crate::util::secret::fingerprinted(|| serde_json::to_value(self).unwrap_or(Value::Null))
    }
}

/// The dotted paths under `prefix` where `a` and `b` differ: object keys are followed, any
/// other value is compared whole.
fn changed_keys(prefix: &str, a: &Value, b: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff(prefix, a, b, &mut out);
    out
}

fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                diff(&format!("{path}.{k}"), l, r, out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ_TOKEN: &str = "[[server.api_tokens]]\nname = \"dash\"\nscope = \"read\"\ntoken = ";

    /// `[[server.api_tokens]]` added, rotated or rescoped takes effect, and is never named as
    /// needing a restart.
    #[test]
    fn scoped_tokens_take_effect() {
        let entry = |t: char| format!("{READ_TOKEN}\"{}\"\n", t.to_string().repeat(32));
        let old = config('a', 't', "");
        let p = plan(&old, config('a', 't', &entry('r')));
        assert!(p.tokens_changed && !p.token_rotated);
        assert!(p.needs_restart.is_empty(), "{:?}", p.needs_restart);
        assert_eq!(p.config.server.api_tokens[0].token.expose(), "r".repeat(32));
        let with = config('a', 't', &entry('r'));
        let rotated = plan(&with, config('a', 't', &entry('s')));
        assert!(rotated.tokens_changed);
        assert_eq!(
            rotated.config.server.api_tokens[0].token.expose(),
            "s".repeat(32)
        );
        assert!(!plan(&with, config('a', 't', &entry('r'))).tokens_changed);
    }

    fn config(token: char, carrier_token: char, extra: &str) -> Config {
        let text = format!(
            "[server]\napi_token = \"{}\"\n{extra}\n[carriers.tw]\nkind = \"twilio\"\n\
             account_sid = \"AC00000000000000000000000000000001\"\nauth_token = \"{}\"\n",
            token.to_string().repeat(32),
            carrier_token.to_string().repeat(32),
        );
        crate::config::load_str_with_vars(&text, "t.toml", &[])
            .expect("config")
            .config
    }

    #[test]
    fn a_rotated_token_applies_and_a_rotated_carrier_secret_is_named() {
        let old = config('a', 't', "");
        let p = plan(&old, config('b', 'u', "max_calls = 7"));
        assert!(p.token_rotated);
        assert_eq!(p.config.server.api_token.expose(), "b".repeat(32));
        assert_eq!(p.config.server.max_calls, old.server.max_calls);
        assert_eq!(p.config.carriers.len(), 1);
        let keys: Vec<&str> = p
            .needs_restart
            .iter()
            .map(|n| n.split_once(' ').map_or(n.as_str(), |(k, _)| k))
            .collect();
        assert_eq!(keys, ["server.max_calls", "carriers.tw.auth_token"]);
        assert!(!p.needs_restart.iter().any(|n| n.contains("uuuu")));

        let same = plan(&old, config('a', 't', ""));
        assert!(!same.token_rotated && !same.tokens_changed);
        assert!(same.needs_restart.is_empty(), "{:?}", same.needs_restart);
    }

    /// The trace exporter starts with the daemon: a changed `[telemetry]` is named and kept.
    #[test]
    fn a_changed_telemetry_section_is_kept_and_named() {
        let old = config('a', 't', "");
        let new = {
            let mut c = config('a', 't', "");
            c.telemetry.otlp_endpoint = "http://127.0.0.1:4318".into();
            c
        };
        let p = plan(&old, new);
        assert!(!p.config.telemetry.enabled(), "the running value stays");
        assert_eq!(p.needs_restart.len(), 1, "{:?}", p.needs_restart);
        assert!(
            p.needs_restart[0].starts_with("telemetry.otlp_endpoint changed"),
            "{:?}",
            p.needs_restart
        );
    }
}
