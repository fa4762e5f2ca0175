//! Number administration through a carrier's REST API, carrier-neutrally: the cheap
//! authenticated request that proves an account's credentials (`patterd doctor`), reading
//! where a number's voice webhook points, and the requests that point it at `public_url` and
//! back (`patterd wire` / `unwire`). Each carrier implements [`NumberAdmin`] in its own
//! `numbers.rs`; the restore record it keeps ([`Wiring::saved`]) is its own JSON, opaque here.
//! Requests are planned as values ([`AdminRequest`]) first, so `--dry-run` prints exactly
//! what would be sent.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::CarrierError;
use super::registry::BoxFuture;
use super::rest_client::send_error;

/// The HTTP method of an [`AdminRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AdminMethod {
    Get,
    Post,
    Patch,
}

impl AdminMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminMethod::Get => "GET",
            AdminMethod::Post => "POST",
            AdminMethod::Patch => "PATCH",
        }
    }
}

/// How an [`AdminRequest`]'s body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum BodyKind {
    None,
    Form,
    Json,
}

/// One REST request to a carrier, without its credentials (the carrier adds them when it
/// sends it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdminRequest {
    pub method: AdminMethod,
    pub url: String,
    pub(crate) body_kind: BodyKind,
    pub body: String,
}

impl AdminRequest {
    pub fn get(url: String) -> Self {
        Self {
            method: AdminMethod::Get,
            url,
            body_kind: BodyKind::None,
            body: String::new(),
        }
    }

    pub fn form(url: String, body: String) -> Self {
        Self {
            method: AdminMethod::Post,
            url,
            body_kind: BodyKind::Form,
            body,
        }
    }

    pub fn json(method: AdminMethod, url: String, body: &serde_json::Value) -> Self {
        Self {
            method,
            url,
            body_kind: BodyKind::Json,
            body: body.to_string(),
        }
    }
}

impl fmt::Display for AdminRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method.as_str(), self.url)?;
        match self.body_kind {
            BodyKind::None => Ok(()),
            BodyKind::Form => write!(
                f,
                "\n  Content-Type: application/x-www-form-urlencoded\n  {}",
                self.body
            ),
            BodyKind::Json => write!(f, "\n  Content-Type: application/json\n  {}", self.body),
        }
    }
}

/// Where a number's inbound calls go now, as read from the carrier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wiring {
    /// The number, E.164.
    pub number: String,
    /// The URL the carrier requests when a call arrives, if the number has one (not a TwiML
    /// app, SIP trunk or missing application).
    pub voice_url: Option<String>,
    /// A short human description of the current routing.
    pub(crate) describe: String,
    /// The carrier's own restore record (everything `unwire` needs to put it back).
    pub saved: serde_json::Value,
    /// The application the wire rewrites, when the carrier routes numbers through one that
    /// several numbers may share (Telnyx's Call Control application, Plivo's application).
    /// Its settings are kept once per application (`store::wiring`), restored when the last
    /// number wired through it is unwired. None for Twilio (per number) and in records saved
    /// before this existed (their `saved` holds the application, restored with the number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<SharedApp>,
}

/// A carrier application several numbers may route through.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedApp {
    /// Its id at the carrier.
    pub id: String,
    /// Where it sends calls as read (empty: nowhere).
    pub voice_url: String,
    /// Its settings as read: what [`NumberAdmin::restore_app_plan`] puts back.
    pub saved: serde_json::Value,
}

impl Wiring {
    /// True when the number's calls arrive at `inbound_url` (trailing slashes ignored).
    pub(crate) fn points_at(&self, inbound_url: &str) -> bool {
        self.voice_url
            .as_deref()
            .is_some_and(|u| u.trim_end_matches('/') == inbound_url.trim_end_matches('/'))
    }
}

/// A carrier account's number administration.
pub trait NumberAdmin: Send + Sync {
    /// One cheap, read-only authenticated request; `Ok` with a short account description.
    fn check_credentials(&self) -> BoxFuture<Result<String, CarrierError>>;
    /// The URL under `public_url` the carrier must request for an incoming call.
    fn inbound_url(&self, public_url: &str) -> String;
    /// Reads where `number` (E.164) routes now.
    fn read_wiring(&self, number: &str) -> BoxFuture<Result<Wiring, CarrierError>>;
    /// The requests that point the number read as `current` at `public_url`.
    fn wire_plan(
        &self,
        current: &Wiring,
        public_url: &str,
    ) -> Result<Vec<AdminRequest>, CarrierError>;
    /// The requests that restore exactly the settings saved in `previous` — the number's own
    /// when `previous.app` is set (its application is restored apart, by
    /// [`NumberAdmin::restore_app_plan`], once no other wired number uses it).
    fn restore_plan(&self, previous: &Wiring) -> Result<Vec<AdminRequest>, CarrierError>;
    /// The numbers (E.164) that route through `app` now, this one included (read through the
    /// carrier's number list). Carriers without shared applications have none.
    fn app_numbers(&self, app: &SharedApp) -> BoxFuture<Result<Vec<String>, CarrierError>> {
        let _ = app;
        Box::pin(async { Ok(Vec::new()) })
    }
    /// The requests that restore `app` as it was saved.
    fn restore_app_plan(&self, app: &SharedApp) -> Result<Vec<AdminRequest>, CarrierError> {
        let _ = app;
        Ok(Vec::new())
    }
    /// Sends one planned request with the account's credentials.
    fn send(&self, req: AdminRequest) -> BoxFuture<Result<serde_json::Value, CarrierError>>;
}

/// Sends `req` with `authorization` through `client`: 2xx → the JSON body (`Null` when empty),
/// 401/403 → [`CarrierError::Unauthorized`], anything else (404 included) →
/// [`CarrierError::Http`] with the carrier's message. Never returns or logs the body on
/// success beyond what the caller reads.
pub(crate) async fn send_with(
    client: &reqwest::Client,
    carrier: &'static str,
    base: &str,
    authorization: &str,
    req: &AdminRequest,
) -> Result<serde_json::Value, CarrierError> {
    let method = match req.method {
        AdminMethod::Get => reqwest::Method::GET,
        AdminMethod::Post => reqwest::Method::POST,
        AdminMethod::Patch => reqwest::Method::PATCH,
    };
    let mut rb = client
        .request(method, &req.url)
        .header("Authorization", authorization)
        .header("Accept", "application/json");
    match req.body_kind {
        BodyKind::None => {}
        BodyKind::Form => {
            rb = rb
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(req.body.clone())
        }
        BodyKind::Json => {
            rb = rb
                .header("Content-Type", "application/json")
                .body(req.body.clone())
        }
    }
    let resp = rb
        .send()
        .await
        .map_err(|e| send_error(carrier, base, &req.url, e))?;
    let status = resp.status().as_u16();
    let text = resp
        .text()
        .await
        .map_err(|e| send_error(carrier, base, &req.url, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    match status {
        200..=299 => Ok(v),
        401 | 403 => Err(CarrierError::Unauthorized { carrier, status }),
        // Not `NotFound`, whose message is about calls; callers that know what was missing
        // (a number) say so themselves.
        404 => Err(CarrierError::Http {
            carrier,
            status,
            message: format!(
                "no such resource: {}",
                req.url.strip_prefix(base).unwrap_or(&req.url)
            ),
        }),
        _ => {
            let message = v
                .get("message")
                .or_else(|| v.get("error"))
                .or_else(|| v.pointer("/errors/0/detail"))
                .or_else(|| v.pointer("/errors/0/title"))
                .and_then(|m| m.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| text.chars().take(200).collect());
            Err(CarrierError::Http {
                carrier,
                status,
                message,
            })
        }
    }
}

/// A string field of a carrier's JSON (empty when absent or null).
pub(crate) fn str_field(v: &serde_json::Value, name: &str) -> String {
    v.get(name)
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_string()
}

/// The error for a restore record that is not the carrier's own shape.
pub(crate) fn bad_record(carrier: &'static str) -> CarrierError {
    CarrierError::Config {
        carrier,
        message: "the saved wiring record is not this carrier's; was the number moved to \
                  another carrier account since `patterd wire`?"
            .into(),
    }
}
