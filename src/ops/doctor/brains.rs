//! Doctor's brain checks, per `[llm.NAME]`: Hermes' open
//! `{base_url}/health`; `{base_url}/models` with the key (401 = wrong key; the configured
//! model should be served); and for Hermes the same request without a key, which a Hermes with
//! an `API_SERVER_KEY` refuses — one that answers has no key and refuses the
//! `X-Hermes-Session-Key` header with 403.

use serde_json::Value;

use super::Finding;
use crate::carrier::registry::BoxFuture;
use crate::config::Config;
use crate::config::schema::{LlmConfig, LlmKind};

pub(super) fn checks(config: &Config, client: &reqwest::Client) -> Vec<BoxFuture<Vec<Finding>>> {
    config
        .llm
        .iter()
        .map(|(name, llm)| {
            let (name, llm, client) = (name.clone(), llm.clone(), client.clone());
            Box::pin(async move { check(&name, &llm, &client).await }) as BoxFuture<_>
        })
        .collect()
}

async fn check(name: &str, llm: &LlmConfig, client: &reqwest::Client) -> Vec<Finding> {
    let base = llm.base_url.trim_end_matches('/');
    let mut out = Vec::new();
    let hermes = llm.kind == LlmKind::Hermes;
    if hermes {
        let url = format!("{base}/health");
        match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => {
                let v: Value = r.json().await.unwrap_or(Value::Null);
                out.push(Finding::HermesHealthy {
                    llm: name.into(),
                    version: v
                        .get("version")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .into(),
                });
            }
            Ok(r) => {
                out.push(Finding::HermesUnhealthy {
                    llm: name.into(),
                    url,
                    error: format!("HTTP {}", r.status().as_u16()),
                });
                return out;
            }
            Err(e) => {
                out.push(Finding::HermesUnhealthy {
                    llm: name.into(),
                    url,
                    error: crate::carrier::chain(&e),
                });
                return out;
            }
        }
    }
    let service = format!("[llm.{name}]");
    let url = format!("{base}/models");
    match client
        .get(&url)
        .bearer_auth(llm.api_key.expose())
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => {
            let v: Value = r.json().await.unwrap_or(Value::Null);
            let models: Vec<String> = v
                .get("data")
                .and_then(Value::as_array)
                .map(|l| {
                    l.iter()
                        .filter_map(|m| m.get("id").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let listed = models.contains(&llm.model);
            out.push(Finding::LlmKeyAccepted {
                llm: name.into(),
                models: models.clone(),
            });
            if !listed && !models.is_empty() {
                out.push(Finding::LlmModelUnlisted {
                    llm: name.into(),
                    model: llm.model.clone(),
                    models,
                });
            }
        }
        Ok(r) if matches!(r.status().as_u16(), 401 | 403) => out.push(Finding::LlmKeyRejected {
            llm: name.into(),
            status: r.status().as_u16(),
        }),
        Ok(r) => out.push(Finding::CredentialsUnverified {
            service,
            error: format!("{url} answered HTTP {}", r.status().as_u16()),
        }),
        Err(e) => out.push(Finding::CredentialsUnverified {
            service,
            error: crate::carrier::chain(&e),
        }),
    }
    if hermes
        && let Ok(r) = client.get(&url).send().await
        && r.status().is_success()
    {
        out.push(Finding::HermesWithoutKey {
            llm: name.into(),
            session_key_used: llm.session_key.is_some() || llm.session_key_from.is_some(),
        });
    }
    out
}
