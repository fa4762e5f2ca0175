//! Doctor's credential checks: one read-only request per carrier
//! account (through the carrier's [`NumberAdmin`](crate::carrier::admin::NumberAdmin)) and per
//! speech provider, the request its kind names (`provider::kinds`: Deepgram `GET
//! /v1/projects`, ElevenLabs `GET /v1/user`, OpenAI-style servers `GET {base}/models`,
//! Cartesia `GET /voices`, AssemblyAI's REST transcript list). 401/403 is a rejection; a
//! timeout, 5xx or network error only means the credentials could not be verified. Accounts
//! without credentials are left to the config warnings.

use super::Finding;
use crate::carrier::CarrierError;
use crate::carrier::registry::BoxFuture;
use crate::config::Config;
use crate::provider::kinds;

pub(super) fn checks(config: &Config, client: &reqwest::Client) -> Vec<BoxFuture<Vec<Finding>>> {
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
        let Some(req) = kinds::stt_credential_check(stt, client) else {
            continue;
        };
        out.push(provider(format!("[stt.{name}]"), req));
    }
    for (name, tts) in &config.tts {
        if tts.api_key.is_empty() {
            continue;
        }
        if let Some(req) = kinds::tts_credential_check(tts, client) {
            out.push(provider(format!("[tts.{name}]"), req));
        }
    }
    out
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
