//! Twilio's REST API, the few calls patterd makes: hang up a live call (`Status=completed`) and
//! place an outbound call. Requests are byte-compatible with the official SDK (form bodies
//! encoded like Python's `urlencode`, HTTP Basic auth, `Accept: application/json`), each bounded
//! by a 10 s timeout; failures map to [`CarrierError`]s that say what to check.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::Config;
use crate::carrier::CarrierError;
use crate::carrier::rest_client::{build_client, send_error};

const CARRIER: &str = "Twilio";
/// Whole-request timeout for every REST call.
/// How long a transfer's destination rings (`<Dial timeout>`).
pub(crate) const TRANSFER_RING_S: u32 = 30;
/// Twilio's public API root.
pub(crate) const DEFAULT_API_BASE: &str = "https://api.twilio.com";
/// Twilio's Lookup API root (another host than the REST API's).
pub(crate) const DEFAULT_LOOKUP_BASE: &str = "https://lookups.twilio.com";

/// Encodes form pairs exactly like Python's `urllib.parse.urlencode` (what the Twilio SDK
/// sends): unreserved `A-Za-z0-9_.-~` kept, space → `+`, everything else `%XX` (uppercase).
pub(crate) fn encode_form(pairs: &[(&str, &str)]) -> String {
    fn push(out: &mut String, s: &str) {
        for &b in s.as_bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' | b'~' => {
                    out.push(b as char)
                }
                b' ' => out.push('+'),
                _ => {
                    const HEX: &[u8; 16] = b"0123456789ABCDEF";
                    out.push('%');
                    out.push(HEX[(b >> 4) as usize] as char);
                    out.push(HEX[(b & 0x0F) as usize] as char);
                }
            }
        }
    }
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        push(&mut out, k);
        out.push('=');
        push(&mut out, v);
    }
    out
}

/// An outbound call to place. Exactly one of `twiml` / `url` should be set.
#[derive(Debug, Clone, Default)]
pub struct CreateCall {
    pub to: String,
    pub from: String,
    /// Inline TwiML (no answer webhook needed).
    pub twiml: Option<String>,
    /// Answer webhook URL (fetched with POST).
    pub url: Option<String>,
    pub status_callback: Option<String>,
    /// `initiated`, `ringing`, `answered`, `completed`.
    pub status_callback_events: Vec<String>,
    /// Ring time in seconds.
    pub timeout_s: Option<u32>,
    /// `Enable` or `DetectMessageEnd`.
    pub machine_detection: Option<String>,
    /// Asynchronous AMD result callback (sets `AsyncAmd=true`).
    pub async_amd_status_callback: Option<String>,
}

impl CreateCall {
    /// Form fields in the SDK's order.
    pub fn form_fields(&self) -> Vec<(&str, String)> {
        let mut f: Vec<(&str, String)> = vec![("To", self.to.clone()), ("From", self.from.clone())];
        if self.url.is_some() {
            f.push(("Method", "POST".into()));
        }
        if let Some(cb) = &self.status_callback {
            f.push(("StatusCallback", cb.clone()));
            for e in &self.status_callback_events {
                f.push(("StatusCallbackEvent", e.clone()));
            }
            f.push(("StatusCallbackMethod", "POST".into()));
        }
        if let Some(t) = self.timeout_s {
            f.push(("Timeout", t.to_string()));
        }
        if let Some(md) = &self.machine_detection {
            f.push(("MachineDetection", md.clone()));
        }
        if let Some(cb) = &self.async_amd_status_callback {
            f.push(("AsyncAmd", "true".into()));
            f.push(("AsyncAmdStatusCallback", cb.clone()));
        }
        if let Some(t) = &self.twiml {
            f.push(("Twiml", t.clone()));
        }
        if let Some(u) = &self.url {
            f.push(("Url", u.clone()));
        }
        f
    }
}

/// Client for Twilio's Calls API.
#[derive(Clone)]
pub struct TwilioRest {
    pub client: reqwest::Client,
    /// API root without trailing slash (`https://api.twilio.com`, or a fake in tests).
    pub base: String,
    pub account_sid: String,
    auth_token: String,
    /// The Lookup API root without trailing slash: `lookup_base_url`, else
    /// `https://lookups.twilio.com` for the public API and the API root itself for any other
    /// (a proxy or a fake serves both).
    pub(crate) lookup_base: String,
}

impl std::fmt::Debug for TwilioRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwilioRest")
            .field("base", &self.base)
            .field("account_sid", &self.account_sid)
            .field("auth_token", &"***")
            .finish()
    }
}

impl TwilioRest {
    /// Builds a client (installs the TLS provider, 10 s timeouts).
    pub fn new(base: &str, account_sid: &str, auth_token: &str) -> Result<Self, CarrierError> {
        if account_sid.trim().is_empty() || auth_token.trim().is_empty() {
            return Err(CarrierError::Config {
                carrier: CARRIER,
                message: "account_sid and auth_token must both be set".into(),
            });
        }
        let client = build_client(CARRIER)?;
        Ok(Self::with_client(client, base, account_sid, auth_token))
    }

    /// Uses an existing client (share one across carriers).
    pub fn with_client(
        client: reqwest::Client,
        base: &str,
        account_sid: &str,
        auth_token: &str,
    ) -> Self {
        let base = base.trim_end_matches('/').to_string();
        let lookup_base = if base == DEFAULT_API_BASE {
            DEFAULT_LOOKUP_BASE.to_string()
        } else {
            base.clone()
        };
        Self {
            client,
            base,
            account_sid: account_sid.trim().to_string(),
            auth_token: auth_token.trim().to_string(),
            lookup_base,
        }
    }

    /// From a `[carriers.*]` entry of kind twilio.
    pub(crate) fn from_config(cfg: &Config) -> Result<Self, CarrierError> {
        use crate::carrier::AccountConfig;
        let mut rest = Self::new(
            cfg.api_base(),
            cfg.account_sid.expose(),
            cfg.auth_token.expose(),
        )?;
        if let Some(lookup) = &cfg.lookup_base_url {
            rest.lookup_base = lookup.trim_end_matches('/').to_string();
        }
        Ok(rest)
    }

    pub(crate) fn authorization(&self) -> String {
        let raw = format!("{}:{}", self.account_sid, self.auth_token);
        format!("Basic {}", STANDARD.encode(raw))
    }

    /// `…/2010-04-01/Accounts/{AccountSid}`.
    pub(crate) fn account_url(&self) -> String {
        format!("{}/2010-04-01/Accounts/{}", self.base, self.account_sid)
    }

    fn calls_url(&self) -> String {
        format!(
            "{}/2010-04-01/Accounts/{}/Calls",
            self.base, self.account_sid
        )
    }

    pub(crate) async fn post_form(
        &self,
        url: &str,
        what: &str,
        body: String,
    ) -> Result<serde_json::Value, CarrierError> {
        let req = self
            .client
            .post(url)
            .header("Authorization", self.authorization())
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Accept", "application/json")
            .body(body);
        self.send(req, url, what).await
    }

    /// `GET url` (its query already encoded), answered with JSON.
    pub(crate) async fn get_json(
        &self,
        url: &str,
        what: &str,
    ) -> Result<serde_json::Value, CarrierError> {
        let req = self
            .client
            .get(url)
            .header("Authorization", self.authorization())
            .header("Accept", "application/json");
        self.send(req, url, what).await
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
        what: &str,
    ) -> Result<serde_json::Value, CarrierError> {
        let resp = req.send().await.map_err(|e| self.map_send_error(url, e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.map_send_error(url, e))?;
        match status {
            200..=299 => Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)),
            401 | 403 => Err(CarrierError::Unauthorized {
                carrier: CARRIER,
                status,
            }),
            404 => Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: what.to_string(),
            }),
            _ => {
                let message = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| {
                        let msg = v.get("message")?.as_str()?.to_string();
                        Some(match v.get("code").and_then(|c| c.as_u64()) {
                            Some(code) => format!("{msg} (Twilio error {code})"),
                            None => msg,
                        })
                    })
                    .unwrap_or_else(|| text.chars().take(200).collect());
                Err(CarrierError::Http {
                    carrier: CARRIER,
                    status,
                    message,
                })
            }
        }
    }

    fn map_send_error(&self, url: &str, e: reqwest::Error) -> CarrierError {
        send_error(CARRIER, &self.base, url, e)
    }

    /// Updates a live call with the given form fields.
    pub(crate) async fn update_call(
        &self,
        call_sid: &str,
        fields: &[(&str, &str)],
    ) -> Result<serde_json::Value, CarrierError> {
        if call_sid.is_empty() || !call_sid.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call `{}`", call_sid.escape_default()),
            });
        }
        let url = format!("{}/{call_sid}.json", self.calls_url());
        self.post_form(&url, &format!("call {call_sid}"), encode_form(fields))
            .await
    }

    /// Hangs up a call: `POST .../Calls/{CallSid}.json` with `Status=completed`.
    pub async fn hang_up(&self, call_sid: &str) -> Result<(), CarrierError> {
        self.update_call(call_sid, &[("Status", "completed")])
            .await
            .map(|_| ())
    }

    /// Cold-transfers a live call: `POST .../Calls/{CallSid}.json` with `Twiml=<Dial>…`, which
    /// replaces the running `<Connect><Stream>` (the media stream stops).
    pub async fn transfer(&self, call_sid: &str, to: &str, caller_id: &str) -> Result<(), CarrierError> {
        let twiml = super::twiml::twiml_dial(to, caller_id, TRANSFER_RING_S);
        self.update_call(call_sid, &[("Twiml", &twiml)])
            .await
            .map(|_| ())
    }

    /// Places an outbound call; returns the new `CallSid`.
    pub async fn create_call(&self, call: &CreateCall) -> Result<String, CarrierError> {
        let fields = call.form_fields();
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let url = format!("{}.json", self.calls_url());
        let v = self
            .post_form(&url, "the account's Calls resource", encode_form(&pairs))
            .await?;
        v.get("sid")
            .and_then(|s| s.as_str())
            .map(str::to_string)
            .ok_or_else(|| CarrierError::Http {
                carrier: CARRIER,
                status: 201,
                message: "the created call resource has no `sid`".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding_matches_python() {
        assert_eq!(
            encode_form(&[("To", "+1 555"), ("Url", "https://a.b/c?d=e&f~*")]),
            "To=%2B1+555&Url=https%3A%2F%2Fa.b%2Fc%3Fd%3De%26f~%2A"
        );
    }

    #[test]
    fn refuses_empty_credentials() {
        assert!(matches!(
            TwilioRest::new(DEFAULT_API_BASE, "", "x"),
            Err(CarrierError::Config { .. })
        ));
    }
}
