//! The Vonage simulator: plays Vonage's side of a call against a running patterd.
//! [`SimVonage`] posts the answer and event webhooks as JSON, each signed with an HS256 JWT in
//! `Authorization: Bearer` (the signature secret; `iat`, a fresh `jti` and the body's
//! `payload_hash`); [`VonageAnswer`] reads the NCCO the way Vonage acts on it (the `connect`
//! action's `websocket` endpoint: URI, content type, headers); [`SimVonage::open_stream`] opens
//! the media socket and speaks Vonage's protocol ([`Dialect::Vonage`]). [`FakeVonageRest`] is
//! the Voice API on 127.0.0.1, strict about its application JWT (RS256 over the application's
//! public key, `application_id`, unexpired): `POST /v1/calls` (201 with a `uuid`), `PUT
//! /v1/calls/{uuid}` (`hangup`, `transfer` with an NCCO destination; 204) and `PUT
//! /v1/calls/{uuid}/dtmf` (200), recording every request.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{KeyPair, RSA_PKCS1_2048_8192_SHA256, RsaKeyPair, UnparsedPublicKey};
use serde_json::{Value, json};

use super::http::{Recorder, full, json as json_resp, read_body, serve};
use super::stream::{Dialect, SimCall, SimCallConfig, SimError, new_uuid};
use super::twilio::WebhookResponse;
use patterd::util::TaskGuard;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An HS256 JWT over `claims` with `secret`, as Vonage signs its webhooks.
pub fn sign_webhook(secret: &str, claims: &Value) -> String {
    let head = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let sig = ring::hmac::sign(&key, format!("{head}.{body}").as_bytes());
    format!("{head}.{body}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// The claims Vonage puts in a webhook's token for `body`.
pub fn webhook_claims(body: &[u8]) -> Value {
    json!({
        "iat": unix_now(),
        "jti": new_uuid(),
        "iss": "Vonage",
        "payload_hash": hex::encode(ring::digest::digest(&ring::digest::SHA256, body)),
        "api_key": "abcd1234",
        "application_id": "sim-app",
    })
}

/// What Vonage makes of an answer NCCO.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VonageAnswer {
    /// The `connect` action's websocket endpoint URI, if any.
    pub websocket_uri: Option<String>,
    pub content_type: Option<String>,
    pub headers: std::collections::BTreeMap<String, String>,
    /// The NCCO's action names, in order.
    pub actions: Vec<String>,
}

impl VonageAnswer {
    /// Parses an NCCO (a JSON array of actions).
    pub fn parse(body: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(body).map_err(|e| format!("NCCO is not JSON: {e}"))?;
        let actions = v.as_array().ok_or("an NCCO is a JSON array")?;
        let mut out = Self::default();
        for a in actions {
            let name = a["action"]
                .as_str()
                .ok_or("an NCCO action without `action`")?;
            out.actions.push(name.to_string());
            if name != "connect" {
                continue;
            }
            let endpoints = a["endpoint"]
                .as_array()
                .ok_or("connect without an endpoint array")?;
            for ep in endpoints.iter().filter(|e| e["type"] == "websocket") {
                out.websocket_uri = ep["uri"].as_str().map(str::to_string);
                out.content_type = ep["content-type"].as_str().map(str::to_string);
                if let Some(h) = ep["headers"].as_object() {
                    for (k, v) in h {
                        out.headers
                            .insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Vonage's webhook side: posts signed JSON webhooks to a patterd instance.
#[derive(Debug, Clone)]
pub struct SimVonage {
    pub client: reqwest::Client,
    pub base_url: String,
    pub signature_secret: String,
}

impl SimVonage {
    pub fn new(base_url: &str, signature_secret: &str) -> Self {
        patterd::util::init_tls();
        Self {
            client: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_string(),
            signature_secret: signature_secret.to_string(),
        }
    }

    /// POSTs `body` as JSON to `path`, signed.
    pub async fn post(&self, path: &str, body: &Value) -> Result<WebhookResponse, reqwest::Error> {
        let raw = body.to_string();
        let token = sign_webhook(&self.signature_secret, &webhook_claims(raw.as_bytes()));
        self.post_with(path, &raw, Some(&format!("Bearer {token}")))
            .await
    }

    /// POSTs `raw` with a caller-chosen `Authorization` (negative tests).
    pub async fn post_with(
        &self,
        path: &str,
        raw: &str,
        authorization: Option<&str>,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base_url))
            .header("Content-Type", "application/json")
            .header("User-Agent", "Vonage-Webhook/1.0")
            .body(raw.to_string());
        if let Some(a) = authorization {
            req = req.header("Authorization", a);
        }
        WebhookResponse::read(req.send().await?).await
    }

    /// The answer webhook's body for a call `uuid` from `from` to `to` (digits, no `+`).
    pub fn answer_body(uuid: &str, from: &str, to: &str) -> Value {
        json!({
            "to": to.trim_start_matches('+'),
            "from": from.trim_start_matches('+'),
            "uuid": uuid,
            "conversation_uuid": format!("CON-{}", new_uuid()),
            "region_url": "https://api-us-3.vonage.com",
        })
    }

    /// A new inbound call: posts the answer webhook with a fresh `uuid`.
    pub async fn incoming_call(
        &self,
        from: &str,
        to: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let uuid = new_uuid();
        let r = self
            .post("/vonage/answer", &Self::answer_body(&uuid, from, to))
            .await?;
        Ok((uuid, r))
    }

    /// Vonage answering a call patterd placed: posts to its `answer_url` (the path under
    /// patterd's public URL) with the `uuid` the create was answered with. Open the stream from
    /// the answer with [`SimVonage::open_stream`].
    pub async fn answer_outbound(
        &self,
        create: &VonageRequest,
    ) -> Result<(String, WebhookResponse), String> {
        let uuid = create.uuid.clone().ok_or("not a placed call")?;
        let url = create.body["answer_url"][0].as_str().unwrap_or("");
        let path = url
            .find("/vonage/")
            .map(|i| &url[i..])
            .ok_or_else(|| format!("{url:?} is not a patterd answer URL"))?;
        let body = Self::answer_body(
            &uuid,
            create.body["from"]["number"].as_str().unwrap_or(""),
            create.body["to"][0]["number"].as_str().unwrap_or(""),
        );
        let r = self.post(path, &body).await.map_err(|e| e.to_string())?;
        Ok((uuid, r))
    }

    /// Posts a call event (`status` such as `completed`, `busy`, `timeout`).
    pub async fn event(&self, uuid: &str, status: &str) -> Result<WebhookResponse, reqwest::Error> {
        let body = json!({
            "uuid": uuid,
            "conversation_uuid": format!("CON-{uuid}"),
            "status": status,
            "direction": "inbound",
            "timestamp": "2026-01-01T00:00:00.000Z",
        });
        self.post("/vonage/event", &body).await
    }

    /// Opens the media socket an answer asks for, on `ws_base`.
    pub async fn open_stream(
        &self,
        answer: &VonageAnswer,
        ws_base: &str,
        uuid: &str,
    ) -> Result<SimCall, SimError> {
        let uri = answer.websocket_uri.as_deref().ok_or(SimError::NoStream)?;
        let cfg = SimCallConfig::new(ws_base, "sim-app", uuid).with_dialect(Dialect::Vonage);
        SimCall::connect(uri, &answer.headers, cfg).await
    }
}

/// One request the fake Voice API saw.
#[derive(Debug, Clone)]
pub struct VonageRequest {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub body: Value,
    /// The `uuid` a `POST /v1/calls` was answered with.
    pub uuid: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct VonageRestRecord {
    pub requests: Vec<VonageRequest>,
}

impl VonageRestRecord {
    /// Call uuids hung up through the API.
    pub fn hung_up(&self) -> Vec<String> {
        self.requests
            .iter()
            .filter(|r| r.method == "PUT" && r.status == 204 && r.body["action"] == "hangup")
            .filter_map(|r| r.path.rsplit('/').next().map(str::to_string))
            .collect()
    }
}

/// Whether `authorization` is a valid application JWT for `application_id` under `public`.
fn app_jwt_ok(authorization: Option<&str>, public: &[u8], application_id: &str) -> bool {
    let Some(token) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else {
        return false;
    };
    let parts: Vec<&str> = token.split('.').collect();
    let [h, p, s] = parts[..] else {
        return false;
    };
    let decode = |x: &str| URL_SAFE_NO_PAD.decode(x).ok();
    let (Some(head), Some(claims), Some(sig)) = (decode(h), decode(p), decode(s)) else {
        return false;
    };
    let head: Value = serde_json::from_slice(&head).unwrap_or_default();
    let claims: Value = serde_json::from_slice(&claims).unwrap_or_default();
    let key = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public);
    head["alg"] == "RS256"
        && key.verify(format!("{h}.{p}").as_bytes(), &sig).is_ok()
        && claims["application_id"] == application_id
        && claims["exp"].as_u64().is_some_and(|e| e > unix_now())
        && claims["jti"].as_str().is_some_and(|j| !j.is_empty())
}

/// The Voice API's answer to one authenticated request.
fn voice_api(method: &str, path: &str, body: &Value) -> (u16, Value, Option<String>) {
    let tail = path.strip_prefix("/v1/calls");
    match (method, tail) {
        ("POST", Some("")) => {
            let ok = body["to"][0]["number"].as_str().is_some()
                && body["from"]["number"].as_str().is_some()
                && body["answer_url"][0].as_str().is_some()
                && body["event_url"][0].as_str().is_some();
            if !ok {
                return (
                    400,
                    json!({"title": "Bad Request", "detail": "to, from, answer_url and event_url are required"}),
                    None,
                );
            }
            let uuid = new_uuid();
            let v = json!({"uuid": uuid, "status": "started", "direction": "outbound", "conversation_uuid": format!("CON-{uuid}")});
            (201, v, Some(uuid))
        }
        ("PUT", Some(rest)) => {
            let rest = rest.trim_start_matches('/');
            match rest.split_once('/') {
                Some((_, "dtmf")) if body["digits"].as_str().is_some() => {
                    (200, json!({"message": "DTMF sent"}), None)
                }
                None if !rest.is_empty() => match body["action"].as_str() {
                    Some("hangup") => (204, Value::Null, None),
                    Some("transfer")
                        if body["destination"]["type"] == "ncco"
                            && body["destination"]["ncco"].is_array() =>
                    {
                        (204, Value::Null, None)
                    }
                    _ => (
                        400,
                        json!({"title": "Bad Request", "detail": "unknown action"}),
                        None,
                    ),
                },
                _ => (400, json!({"title": "Bad Request"}), None),
            }
        }
        _ => (404, json!({"title": "Not Found"}), None),
    }
}

/// A fake Vonage Voice API. Dropping it stops the server.
pub struct FakeVonageRest {
    pub base_url: String,
    record: Arc<Recorder<VonageRestRecord>>,
    /// Answer `POST /v1/calls` with this status (0: place the call).
    fail_create: Arc<std::sync::atomic::AtomicU16>,
    _server: TaskGuard,
}

impl FakeVonageRest {
    /// Starts on an ephemeral port, accepting application JWTs for `application_id` signed by
    /// the key whose PKCS#8 PEM is `private_key_pem` (the fake keeps only its public half).
    pub async fn start(application_id: &str, private_key_pem: &str) -> std::io::Result<Self> {
        let der: String = private_key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(der).map_err(std::io::Error::other)?;
        let pair =
            RsaKeyPair::from_pkcs8(&der).map_err(|e| std::io::Error::other(e.to_string()))?;
        let public: Arc<Vec<u8>> = Arc::new(pair.public_key().as_ref().to_vec());
        let record = Arc::new(Recorder::<VonageRestRecord>::default());
        let rec = record.clone();
        let app = application_id.to_string();
        let fail_create = Arc::new(std::sync::atomic::AtomicU16::new(0));
        let fail = fail_create.clone();
        let (addr, guard) = serve(move |req| {
            let (rec, public, app) = (rec.clone(), public.clone(), app.clone());
            let fail = fail.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                let path = req.uri().path().to_string();
                let method = req.method().to_string();
                let auth = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let raw = read_body(req, 1 << 20).await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&raw).unwrap_or_default();
                let (status, v, uuid) = if !app_jwt_ok(auth.as_deref(), &public, &app) {
                    (401, json!({"title": "Invalid Token"}), None)
                } else if fail != 0 && method == "POST" {
                    (fail, json!({"title": "simulated failure"}), None)
                } else {
                    voice_api(&method, &path, &body)
                };
                rec.modify(|r| {
                    r.requests.push(VonageRequest {
                        method,
                        path,
                        status,
                        body,
                        uuid,
                    })
                });
                if status == 204 {
                    full(204, "application/json", "")
                } else {
                    json_resp(status, &v)
                }
            }
        })
        .await?;
        Ok(Self {
            base_url: format!("http://{addr}"),
            record,
            fail_create,
            _server: guard,
        })
    }

    pub fn record(&self) -> VonageRestRecord {
        self.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&VonageRestRecord) -> bool,
    ) -> VonageRestRecord {
        self.record.wait_until(what, pred).await
    }

    /// Call uuids hung up through the API.
    pub fn hung_up(&self) -> Vec<String> {
        self.record().hung_up()
    }

    /// Answer `POST /v1/calls` with `status` (`None`: place calls again).
    pub fn fail_create_with(&self, status: Option<u16>) {
        self.fail_create
            .store(status.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Calls placed (`POST /v1/calls` answered 201), oldest first.
    pub fn created(&self) -> Vec<VonageRequest> {
        self.record()
            .requests
            .into_iter()
            .filter(|r| r.uuid.is_some())
            .collect()
    }

    /// Waits until `n` calls have been placed.
    pub async fn wait_for_created(&self, n: usize) -> Vec<VonageRequest> {
        self.wait_until("calls placed", |r| {
            r.requests.iter().filter(|q| q.uuid.is_some()).count() >= n
        })
        .await;
        self.created()
    }
}
