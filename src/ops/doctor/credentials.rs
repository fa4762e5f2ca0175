//! Doctor's credential checks (`carrier-actions.md` §5): one read-only request per carrier
//! account (through the carrier's [`NumberAdmin`](crate::carrier::admin::NumberAdmin)) and per
//! speech provider — Deepgram `GET /v1/projects` (`Token`), ElevenLabs `GET /v1/user`
//! (`xi-api-key`), OpenAI-style servers `GET {base}/models` (bearer), Cartesia `GET /voices`
//! (`X-API-Key`). 401/403 is a rejection; a timeout, 5xx or network error only means the
//! credentials could not be verified. Accounts without credentials are left to the config
//! warnings.

use super::Finding;
use crate::carrier::CarrierError;
use crate::carrier::registry::BoxFuture;
use crate::config::Config;
use crate::config::schema::{SttKind, TtsKind};

pub fn checks(config: &Config, client: &reqwest::Client) -> Vec<BoxFuture<Vec<Finding>>> {
    let mut out: Vec<BoxFuture<Vec<Finding>>> = Vec::new();
    for (name, c) in &config.carriers {
        if !c.missing_credentials().is_empty() {
            continue;
        }
        let service = format!("[carriers.{name}] ({})", c.kind().as_str());
        let admin = c.admin();
        out.push(Box::pin(async move {
            let admin = match admin {
                Ok(a) => a,
                // A carrier without accounts to check (the browser phone).
                Err(CarrierError::Unsupported { .. }) => return Vec::new(),
                Err(e) => {
                    return vec![Finding::CredentialsRefused {
                        service,
                        error: e.to_string(),
                    }];
                }
            };
            vec![carrier_finding(service, admin.check_credentials().await)]
        }));
    }
    for (name, stt) in &config.stt {
        if stt.api_key.is_empty() {
            continue;
        }
        let base = http_base(stt.effective_base_url());
        let req = match stt.kind {
            SttKind::Deepgram | SttKind::DeepgramFlux => client
                .get(format!("{base}/v1/projects"))
                .header("Authorization", format!("Token {}", stt.api_key.expose())),
            // OpenAI's REST root is the Realtime base (`…/v1`) over HTTPS.
            SttKind::OpenaiCompatible | SttKind::OpenaiRealtime => client
                .get(format!("{base}/models"))
                .bearer_auth(stt.api_key.expose()),
            // The streaming host has no key-check endpoint; AssemblyAI's REST API lists
            // transcripts for a valid key (401 otherwise).
            SttKind::Assemblyai => client
                .get(assemblyai_rest_base(stt.effective_base_url()))
                .header("Authorization", stt.api_key.expose()),
        };
        out.push(provider(format!("[stt.{name}]"), req));
    }
    for (name, tts) in &config.tts {
        if tts.api_key.is_empty() {
            continue;
        }
        let base = http_base(&tts.base_url);
        let req = match tts.kind {
            TtsKind::Elevenlabs => client
                .get(format!("{base}/v1/user"))
                .header("xi-api-key", tts.api_key.expose()),
            TtsKind::Openai | TtsKind::OpenaiCompatible => client
                .get(format!("{base}/models"))
                .bearer_auth(tts.api_key.expose()),
            TtsKind::Cartesia => client
                .get(format!("{base}/voices"))
                .header("X-API-Key", tts.api_key.expose())
                .header(
                    "Cartesia-Version",
                    crate::provider::cartesia::CARTESIA_VERSION,
                ),
        };
        out.push(provider(format!("[tts.{name}]"), req));
    }
    out
}

/// A provider's REST root for a base URL that may be a WebSocket one.
fn http_base(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if let Some(rest) = base.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = base.strip_prefix("ws://") {
        format!("http://{rest}")
    } else {
        base.to_string()
    }
}

/// AssemblyAI's REST key check for a streaming `base_url`: `wss://streaming.assemblyai.com`
/// → `https://api.assemblyai.com/v2/transcript?limit=1` (EU: `streaming.eu.` → `api.eu.`); any
/// other host (a fake, a proxy) is asked at the same path.
fn assemblyai_rest_base(base: &str) -> String {
    let base = http_base(base).replace("://streaming.", "://api.");
    format!("{base}/v2/transcript?limit=1")
}

fn provider(service: String, req: reqwest::RequestBuilder) -> BoxFuture<Vec<Finding>> {
    Box::pin(async move {
        vec![match req.send().await {
            Ok(r) if r.status().is_success() => Finding::CredentialsAccepted {
                service,
                detail: format!("HTTP {}", r.status().as_u16()),
            },
            Ok(r) if matches!(r.status().as_u16(), 401 | 403) => Finding::CredentialsRejected {
                service,
                status: r.status().as_u16(),
            },
            Ok(r) => Finding::CredentialsUnverified {
                service,
                error: format!("HTTP {}", r.status().as_u16()),
            },
            Err(e) => Finding::CredentialsUnverified {
                service,
                error: crate::carrier::chain(&e),
            },
        }]
    })
}

fn carrier_finding(service: String, r: Result<String, CarrierError>) -> Finding {
    match r {
        Ok(detail) => Finding::CredentialsAccepted { service, detail },
        Err(CarrierError::Unauthorized { status, .. }) => {
            Finding::CredentialsRejected { service, status }
        }
        Err(CarrierError::Http { status, .. }) if status < 500 => Finding::CredentialsRefused {
            service,
            error: format!("HTTP {status} to the credential check"),
        },
        Err(e @ CarrierError::Config { .. }) => Finding::CredentialsRefused {
            service,
            error: e.to_string(),
        },
        Err(e) => Finding::CredentialsUnverified {
            service,
            error: e.to_string(),
        },
    }
}
