//! Runtime overrides of the inbound agent: per number (or for every number, key `*`) a
//! different system prompt, first message or voice, or inbound calls switched off. Kept in
//! memory for admission and persisted in the store's settings (key [`SETTING_KEY`]), so they
//! survive a restart; changed through `crate::api::inbound` ([`change`]). With the PostgreSQL
//! store a change is merged in the database and reaches every instance of the cluster
//! (`app::cluster::settings`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::App;
use crate::config::AgentConfig;
use crate::store::{StoreError, Write};

/// Settings key the overrides are stored under.
pub const SETTING_KEY: &str = "inbound_overrides";

/// One override; unset fields keep the configured agent's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InboundOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_message: Option<String>,
    /// The name of a `[tts.NAME]` section to speak with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Overrides by number (`*` = every number).
pub type Overrides = BTreeMap<String, InboundOverride>;

impl InboundOverride {
    /// `self` with `more`'s set fields on top.
    pub fn merged(&self, more: &InboundOverride) -> InboundOverride {
        InboundOverride {
            system_prompt: more.system_prompt.clone().or(self.system_prompt.clone()),
            first_message: more.first_message.clone().or(self.first_message.clone()),
            voice: more.voice.clone().or(self.voice.clone()),
            enabled: more.enabled.or(self.enabled),
        }
    }

    /// The agent with this override applied.
    pub(crate) fn apply(&self, agent: &AgentConfig) -> AgentConfig {
        let mut a = agent.clone();
        if let Some(p) = &self.system_prompt {
            a.system_prompt = p.clone();
        }
        if let Some(m) = &self.first_message {
            a.first_message = m.clone();
        }
        if let Some(v) = &self.voice {
            a.tts = v.as_str().into();
        }
        a
    }
}

/// The effective override for `number`: the `*` entry with the number's own on top.
pub fn effective(app: &App, number: &str) -> InboundOverride {
    let all = app.inbound.read().unwrap_or_else(|e| e.into_inner());
    let base = all.get("*").cloned().unwrap_or_default();
    match all.get(number) {
        Some(o) => base.merged(o),
        None => base,
    }
}

/// Applies `change` to `key`'s override (`*`: every number), persists the result and puts it in
/// force; returns every override. With the PostgreSQL store the merge happens in the database,
/// so the change reaches the cluster and keeps a peer's concurrent change.
pub(crate) async fn change(
    app: &App,
    key: &str,
    change: &InboundOverride,
) -> Result<Overrides, StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = &app.cluster {
        return super::cluster::settings::change_inbound(app, cluster, key, change).await;
    }
    let snapshot = {
        let mut all = app.inbound.write().unwrap_or_else(|e| e.into_inner());
        let merged = all.get(key).cloned().unwrap_or_default().merged(change);
        all.insert(key.to_string(), merged);
        all.clone()
    };
    let text = serde_json::to_string(&snapshot).unwrap_or_else(|_| "{}".into());
    app.store.tx.send(Write::Setting {
        key: SETTING_KEY.into(),
        value: text,
    });
    app.store.tx.flush().await?;
    Ok(snapshot)
}
