//! Vonage's Voice REST API, the calls patterd makes, each authenticated with an application
//! JWT (`Authorization: Bearer`, RS256 with the application's private key; claims
//! `application_id`, `iat`, `exp`, `jti`): place an outbound call with `POST
//! {api_base_url}/v1/calls` (answered by the call's `uuid`), hang up with `PUT
//! /v1/calls/{uuid}` `{"action":"hangup"}`, cold-transfer with `PUT /v1/calls/{uuid}`
//! `{"action":"transfer","destination":{"type":"ncco","ncco":[…]}}`, and send DTMF with `PUT
//! /v1/calls/{uuid}/dtmf` `{"digits":…}`. 404 on a hang-up means the call already ended and
//! counts as done.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use serde_json::{Value, json};

use super::Config;
use crate::carrier::rest_client::{build_client, path_safe, send_error};
use crate::carrier::webhook::unix_now;
use crate::carrier::{AccountConfig, CarrierError};

const CARRIER: &str = "Vonage";
/// Vonage's public Voice API root.
pub(crate) const DEFAULT_API_BASE: &str = "https://api.nexmo.com";
/// How long an application JWT is good for.
pub(crate) const JWT_TTL_S: u64 = 300;
/// How long a transfer's destination rings.
pub(crate) const TRANSFER_RING_S: u32 = 30;

/// An outbound call to place (`POST /v1/calls`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateCall {
    pub from: String,
    pub to: String,
    pub answer_url: String,
    pub event_url: String,
    pub ringing_timer: u32,
    pub(crate) length_timer: u64,
}

/// Body of `POST /v1/calls` (numbers without `+`, as Vonage writes them).
pub(crate) fn create_call_body(c: &CreateCall) -> Value {
    json!({
        "to": [{"type": "phone", "number": c.to.trim_start_matches('+')}],
        "from": {"type": "phone", "number": c.from.trim_start_matches('+')},
        "answer_url": [c.answer_url],
        "answer_method": "POST",
        "event_url": [c.event_url],
        "event_method": "POST",
        "ringing_timer": c.ringing_timer,
        "length_timer": c.length_timer,
    })
}

/// The DER of a PEM block (the private key as written in the config; `\n` escapes allowed).
fn pem_der(pem: &str) -> Option<Vec<u8>> {
    let pem = pem.replace("\\n", "\n");
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .collect();
    STANDARD.decode(body).ok()
}

/// Client for Vonage's Voice API.
pub(crate) struct VonageRest {
    pub client: reqwest::Client,
    pub base: String,
    pub application_id: String,
    key: RsaKeyPair,
}

impl std::fmt::Debug for VonageRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VonageRest")
            .field("base", &self.base)
            .field("application_id", &self.application_id)
            .field("private_key", &"***")
            .finish()
    }
}

impl VonageRest {
    pub(crate) fn new(base: &str, application_id: &str, private_key_pem: &str) -> Result<Self, CarrierError> {
        let config = |message: &str| CarrierError::Config {
            carrier: CARRIER,
            message: message.to_string(),
        };
        if application_id.trim().is_empty() {
            return Err(config("application_id must be set"));
        }
        let der = pem_der(private_key_pem)
            .ok_or_else(|| config("private_key is not a PEM block (paste the application's private.key)"))?;
        let key = RsaKeyPair::from_pkcs8(&der)
            .map_err(|_| config("private_key is not an RSA private key in PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`)"))?;
        Ok(Self {
            client: build_client(CARRIER)?,
            base: base.trim_end_matches('/').to_string(),
            application_id: application_id.trim().to_string(),
            key,
        })
    }

    /// From a `[carriers.*]` entry of kind vonage.
    pub(crate) fn from_config(cfg: &Config) -> Result<Self, CarrierError> {
        Self::new(cfg.api_base(), cfg.application_id.expose(), cfg.private_key.expose())
    }

    /// A fresh application JWT (RS256) issued at `now`.
    pub(crate) fn jwt(&self, now: u64) -> Result<String, CarrierError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = json!({
            "application_id": self.application_id,
            "iat": now,
            "exp": now + JWT_TTL_S,
            "jti": format!("patterd-{now}-{n}-{}", std::process::id()),
        });
        let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
        let mut sig = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), signed.as_bytes(), &mut sig)
            .map_err(|_| CarrierError::Config {
                carrier: CARRIER,
                message: "could not sign the application JWT with private_key".into(),
            })?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }

    /// Places an outbound call; returns its `uuid`.
    pub(crate) async fn create_call(&self, c: &CreateCall) -> Result<String, CarrierError> {
        let url = format!("{}/v1/calls", self.base);
        let (status, v) = self.send(reqwest::Method::POST, &url, &create_call_body(c)).await?;
        match status {
            200..=299 => v
                .get("uuid")
                .and_then(Value::as_str)
                .filter(|i| path_safe(i))
                .map(str::to_string)
                .ok_or_else(|| CarrierError::Http {
                    carrier: CARRIER,
                    status,
                    message: "the response has no usable uuid".into(),
                }),
            _ => Err(http_error(status, &v)),
        }
    }

    /// Hangs up a call; one that has already ended counts as hung up.
    pub(crate) async fn hang_up(&self, uuid: &str) -> Result<(), CarrierError> {
        self.modify(uuid, "", &json!({"action": "hangup"}), true).await
    }

    /// Cold-transfers a live call to `to` with a `connect` NCCO.
    pub(crate) async fn transfer(&self, uuid: &str, to: &str, caller_id: &str) -> Result<(), CarrierError> {
        let ncco = super::ncco::connect_phone(to, caller_id, TRANSFER_RING_S);
        let body = json!({"action": "transfer", "destination": {"type": "ncco", "ncco": ncco}});
        self.modify(uuid, "", &body, false).await
    }

    /// Sends DTMF digits into a live call.
    pub(crate) async fn send_dtmf(&self, uuid: &str, digits: &str) -> Result<(), CarrierError> {
        self.modify(uuid, "/dtmf", &json!({"digits": digits}), false).await
    }

    async fn modify(
        &self,
        uuid: &str,
        suffix: &str,
        body: &Value,
        gone_is_done: bool,
    ) -> Result<(), CarrierError> {
        if !path_safe(uuid) {
            return Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call `{}`", uuid.escape_default()),
            });
        }
        let url = format!("{}/v1/calls/{uuid}{suffix}", self.base);
        let (status, v) = self.send(reqwest::Method::PUT, &url, body).await?;
        match status {
            200..=299 => Ok(()),
            404 if gone_is_done => Ok(()),
            404 => Err(CarrierError::NotFound {
                carrier: CARRIER,
                what: format!("call {uuid}"),
            }),
            _ => Err(http_error(status, &v)),
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        body: &Value,
    ) -> Result<(u16, Value), CarrierError> {
        let resp = self
            .client
            .request(method, url)
            .header("Authorization", format!("Bearer {}", self.jwt(unix_now())?))
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| send_error(CARRIER, &self.base, url, e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or_else(|_| json!({"title": text.chars().take(200).collect::<String>()}));
        Ok((status, v))
    }
}

/// The error for a non-2xx answer (Vonage's errors carry `title` and `detail`).
fn http_error(status: u16, v: &Value) -> CarrierError {
    if matches!(status, 401 | 403) {
        return CarrierError::Unauthorized {
            carrier: CARRIER,
            status,
        };
    }
    let part = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
    let message = [part("title"), part("detail")]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    CarrierError::Http {
        carrier: CARRIER,
        status,
        message,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};

    /// A throwaway 2048-bit RSA key (PKCS#8 PEM), for tests only.
    pub(crate) const TEST_KEY: &str = include_str!("test_key.pem");

    #[test]
    fn the_application_jwt_is_rs256_with_the_application_id() {
        let rest = VonageRest::new("http://127.0.0.1:1/", "app-1", TEST_KEY).expect("key loads");
        let t = rest.jwt(1_800_000_000).unwrap();
        let parts: Vec<&str> = t.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["application_id"], "app-1");
        assert_eq!(claims["exp"], 1_800_000_000u64 + JWT_TTL_S);
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, rest.key.public().as_ref().to_vec());
        public
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
            .expect("signature verifies with the public key");
        assert_ne!(rest.jwt(1_800_000_000).unwrap(), t, "every token has its own jti");
        assert!(VonageRest::new("http://x", "app", "not a key").is_err());
    }

    #[test]
    fn create_call_body_has_the_documented_fields() {
        let b = create_call_body(&CreateCall {
            from: "+15550001111".into(),
            to: "+15550002222".into(),
            answer_url: "https://x/vonage/answer".into(),
            event_url: "https://x/vonage/event".into(),
            ringing_timer: 30,
            length_timer: 600,
        });
        assert_eq!(b["to"][0], json!({"type": "phone", "number": "15550002222"}));
        assert_eq!(b["from"]["number"], "15550001111");
        assert_eq!(b["answer_url"][0], "https://x/vonage/answer");
        assert_eq!(b["event_url"][0], "https://x/vonage/event");
    }
}
