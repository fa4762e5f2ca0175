//! The Plivo simulator: plays Plivo's side of a call against a running patterd.
//! [`SimPlivo`] signs answer and hangup callbacks with `X-Plivo-Signature-V3` (random nonce,
//! over the public URL) and posts Plivo's form fields (numbers as digits without `+`);
//! [`PlivoAnswer`] reads the XML the way Plivo acts on it (`<Stream>` URL in the element text,
//! its attributes, or a `<Hangup reason>`); [`SimPlivo::open_stream`] opens the media socket
//! offering `audio.drachtio.org` and speaking Plivo's frames (μ-law or L16);
//! [`FakePlivoRest`] is the Call API on 127.0.0.1 with Basic auth and the trailing slash Plivo
//! insists on — `POST /v1/Account/{auth_id}/Call/` (answered 201 with a `request_uuid`),
//! `DELETE …/Call/{uuid}/` and `DELETE …/Request/{uuid}/` — recording every request;
//! [`SimPlivo::answer_outbound`] fetches a placed call's `answer_url` the way Plivo does and
//! [`SimPlivo::hangup_outbound`] posts its hangup callback. Number administration
//! (what `patterd wire` and the doctor's credential check ask): `GET` on the account itself, `GET`/`POST Number/{digits}/`
//! (`application` as a URI; `app_id` to attach) and `GET`/`POST Application/{app_id}/`
//! (only the fields sent change), all with the trailing slash; the state is [`PlivoAccount`].

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::http::{Recorder, full, json as json_resp, read_body, serve};
use super::stream::{Dialect, SimCall, SimCallConfig, new_uuid};
use super::twilio::xml::parse_xml;
use super::twilio::{WebhookResponse, new_sid, signed_url};
use patterd::carrier::plivo::signature::compute_v3;
use patterd::util::TaskGuard;

/// The Plivo account id the simulator uses.
pub const ACCOUNT_ID: &str = "MA0000000000000000AB";

/// What Plivo makes of an answer document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlivoAnswer {
    /// The `<Stream>` element text.
    pub stream_url: Option<String>,
    pub bidirectional: bool,
    pub keep_call_alive: bool,
    pub content_type: Option<String>,
    /// `Some(reason)` for `<Hangup>` (`""` without a reason).
    pub hangup: Option<String>,
    pub speak: Vec<String>,
}

impl PlivoAnswer {
    /// Parses Plivo XML; errors if it is not XML or the root is not `<Response>`.
    pub fn parse(xml: &str) -> Result<Self, String> {
        let root = parse_xml(xml)?;
        if root.name != "Response" {
            return Err(format!("root is `<{}>`, not `<Response>`", root.name));
        }
        let mut a = Self::default();
        for el in &root.children {
            match el.name.as_str() {
                "Stream" => {
                    a.stream_url = Some(el.text.clone());
                    a.bidirectional = el.attr("bidirectional") == Some("true");
                    a.keep_call_alive = el.attr("keepCallAlive") == Some("true");
                    a.content_type = el.attr("contentType").map(str::to_string);
                }
                "Hangup" => a.hangup = Some(el.attr("reason").unwrap_or("").to_string()),
                "Speak" => a.speak.push(el.text.clone()),
                other => return Err(format!("element <{other}> not modelled")),
            }
        }
        Ok(a)
    }
}

/// One request the fake REST API received.
#[derive(Debug, Clone, PartialEq)]
pub struct PlivoRequest {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// The JSON body (`Null` when absent or not JSON).
    pub body: serde_json::Value,
    /// For a call placed (`POST Call/` answered 201): its `request_uuid`.
    pub request_uuid: Option<String>,
}

impl PlivoRequest {
    /// A string field of the JSON body.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.body.get(name).and_then(|v| v.as_str())
    }
}

/// The account's numbers (`number` digits → `app_id`, empty for none) and applications.
#[derive(Debug, Clone, Default)]
pub struct PlivoAccount {
    pub numbers: Vec<(String, String)>,
    pub apps: Vec<serde_json::Value>,
}

const APP_UPDATABLE: &[&str] = &[
    "answer_url",
    "answer_method",
    "hangup_url",
    "hangup_method",
    "fallback_answer_url",
    "fallback_method",
    "message_url",
    "message_method",
    "default_number_app",
    "default_endpoint_app",
    "subaccount",
    "log_incoming_messages",
    "public_uri",
];

/// The account, number and application routes; `None` for every other path.
fn account_api(
    account: &std::sync::Mutex<PlivoAccount>,
    auth_id: &str,
    method: &str,
    path: &str,
    query: &str,
    body: &serde_json::Value,
) -> Option<(u16, hyper::Response<super::http::Body>)> {
    let base = format!("/v1/Account/{auth_id}/");
    let tail = path.strip_prefix(&base)?;
    let mut acc = account.lock().unwrap_or_else(|e| e.into_inner());
    let changed = || {
        (
            202,
            json_resp(202, &json!({"api_id": new_uuid(), "message": "changed"})),
        )
    };
    let parts: Vec<&str> = tail.split('/').collect();
    match (method, parts.as_slice()) {
        ("GET", [""]) => Some((
            200,
            json_resp(
                200,
                &json!({"api_id": new_uuid(), "auth_id": auth_id, "account_type": "standard",
                        "billing_mode": "prepaid", "cash_credits": "12.50", "name": "sim",
                        "resource_uri": base}),
            ),
        )),
        ("GET", ["Number", ""]) => {
            // The account's numbers, `limit` (at most 20) from `offset`, as Plivo lists them.
            let param = |name: &str| {
                form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| v.parse::<usize>().ok())
            };
            let limit = param("limit").unwrap_or(20).clamp(1, 20);
            let offset = param("offset").unwrap_or(0);
            let total = acc.numbers.len();
            let objects: Vec<serde_json::Value> = acc
                .numbers
                .iter()
                .skip(offset)
                .take(limit)
                .map(|(digits, app)| {
                    let uri = (!app.is_empty()).then(|| format!("{base}Application/{app}/"));
                    json!({"number": digits, "application": uri, "voice_enabled": true,
                           "number_type": "local"})
                })
                .collect();
            let next = (offset + limit < total)
                .then(|| format!("{base}Number/?limit={limit}&offset={}", offset + limit));
            Some((
                200,
                json_resp(
                    200,
                    &json!({"api_id": new_uuid(),
                            "meta": {"limit": limit, "offset": offset, "total_count": total,
                                     "next": next, "previous": null},
                            "objects": objects}),
                ),
            ))
        }
        (m, ["Number", digits, ""]) => {
            let i = acc.numbers.iter().position(|(n, _)| n == digits)?;
            if m == "POST" {
                let Some(app) = body.get("app_id").and_then(|a| a.as_str()) else {
                    return Some((400, json_resp(400, &json!({"error": "app_id is required"}))));
                };
                if !acc.apps.iter().any(|a| a["app_id"] == app) {
                    return Some((400, json_resp(400, &json!({"error": "invalid app_id"}))));
                }
                acc.numbers[i].1 = app.to_string();
                return Some(changed());
            }
            let app = &acc.numbers[i].1;
            let uri = (!app.is_empty()).then(|| format!("{base}Application/{app}/"));
            Some((
                200,
                json_resp(
                    200,
                    &json!({"api_id": new_uuid(), "number": digits, "application": uri,
                            "voice_enabled": true, "number_type": "local"}),
                ),
            ))
        }
        (m, ["Application", app_id, ""]) => {
            let a = acc.apps.iter_mut().find(|a| a["app_id"] == *app_id)?;
            if m == "POST" {
                let Some(fields) = body.as_object() else {
                    return Some((400, json_resp(400, &json!({"error": "JSON body expected"}))));
                };
                if let Some(k) = fields.keys().find(|k| !APP_UPDATABLE.contains(&k.as_str())) {
                    return Some((
                        400,
                        json_resp(400, &json!({"error": format!("unknown field {k}")})),
                    ));
                }
                for (k, v) in fields {
                    a[k.as_str()] = v.clone();
                }
                return Some(changed());
            }
            Some((200, json_resp(200, a)))
        }
        _ => None,
    }
}

#[derive(Debug, Clone, Default)]
pub struct PlivoRestRecord {
    pub requests: Vec<PlivoRequest>,
}

/// A fake Plivo Call API. Dropping it stops the server.
pub struct FakePlivoRest {
    pub base_url: String,
    record: Arc<Recorder<PlivoRestRecord>>,
    /// Answer `POST Call/` with this status (0: place the call).
    fail_create: Arc<std::sync::atomic::AtomicU16>,
    account: Arc<std::sync::Mutex<PlivoAccount>>,
    /// Messages sent, lookups answered and messaging requests refused (`crate::sms`).
    pub sms: Arc<Recorder<crate::sms::SmsLedger>>,
    _server: TaskGuard,
}

impl FakePlivoRest {
    /// Starts on an ephemeral port, accepting Basic `auth_id:auth_token`.
    pub async fn start(auth_id: &str, auth_token: &str) -> std::io::Result<Self> {
        let record = Arc::new(Recorder::<PlivoRestRecord>::default());
        let expected = format!(
            "Basic {}",
            STANDARD.encode(format!("{auth_id}:{auth_token}"))
        );
        let prefix = format!("/v1/Account/{auth_id}/Call/");
        let request_prefix = format!("/v1/Account/{auth_id}/Request/");
        let rec = record.clone();
        let fail_create = Arc::new(std::sync::atomic::AtomicU16::new(0));
        let fail = fail_create.clone();
        let account = Arc::new(std::sync::Mutex::new(PlivoAccount::default()));
        let acc = account.clone();
        let account_id = auth_id.to_string();
        let sms = Arc::new(Recorder::<crate::sms::SmsLedger>::default());
        let sms_ledger = sms.clone();
        let (addr, guard) = serve(move |req| {
            let rec = rec.clone();
            let acc = acc.clone();
            let sms = sms_ledger.clone();
            let account_id = account_id.clone();
            let expected = expected.clone();
            let prefix = prefix.clone();
            let request_prefix = request_prefix.clone();
            let fail = fail.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                let method = req.method().to_string();
                let auth_ok = super::http::authorized(&req, &expected);
                let headers = super::http::header_pairs(&req);
                let raw = read_body(req, 1 << 20).await.unwrap_or_default();
                if auth_ok {
                    let sms_req = crate::sms::SmsRequest {
                        method: &method,
                        path: &path,
                        query: &query,
                        headers: &headers,
                        body: &raw,
                    };
                    if let Some(resp) = crate::sms::plivo::handle(&sms, &sms_req, &account_id) {
                        return resp;
                    }
                }
                let body: serde_json::Value = serde_json::from_slice(&raw).unwrap_or_default();
                let uuid = path
                    .strip_prefix(&prefix)
                    .or_else(|| path.strip_prefix(&request_prefix))
                    .and_then(|t| t.strip_suffix('/'))
                    .filter(|u| !u.is_empty() && !u.contains('/'));
                let mut request_uuid = None;
                let admin = if auth_ok {
                    account_api(&acc, &account_id, &method, &path, &query, &body)
                } else {
                    None
                };
                let (status, resp) = if !auth_ok {
                    (
                        401,
                        full(401, "text/plain", "Could not verify your access level"),
                    )
                } else if let Some(r) = admin {
                    r
                } else if method == "POST" && path == prefix && fail != 0 {
                    (
                        fail,
                        json_resp(
                            fail,
                            &json!({"api_id": new_uuid(), "error": "simulated failure"}),
                        ),
                    )
                } else if method == "POST" && path == prefix {
                    let ok = ["from", "to", "answer_url"]
                        .iter()
                        .all(|k| body[*k].as_str().is_some_and(|v| !v.is_empty()))
                        && body["from"].as_str().is_some_and(|v| !v.starts_with('+'))
                        && body["to"].as_str().is_some_and(|v| !v.starts_with('+'));
                    if ok {
                        let id = new_uuid();
                        request_uuid = Some(id.clone());
                        (
                            201,
                            json_resp(
                                201,
                                &json!({"api_id": new_uuid(), "message": "call fired",
                                        "request_uuid": id}),
                            ),
                        )
                    } else {
                        (
                            400,
                            json_resp(
                                400,
                                &json!({"api_id": new_uuid(),
                                "error": "from, to (digits) and answer_url are required"}),
                            ),
                        )
                    }
                } else if method == "POST" && uuid.is_some() {
                    // The Transfer API: `legs` = aleg, an absolute
                    // `aleg_url`, `aleg_method` POST or GET.
                    let ok = body["legs"] == "aleg"
                        && body["aleg_url"]
                            .as_str()
                            .is_some_and(|u| u.starts_with("http://") || u.starts_with("https://"))
                        && body
                            .get("aleg_method")
                            .is_none_or(|m| m == "POST" || m == "GET");
                    if ok {
                        (
                            202,
                            json_resp(
                                202,
                                &json!({"api_id": new_uuid(), "message": "call transferred"}),
                            ),
                        )
                    } else {
                        (
                            400,
                            json_resp(
                                400,
                                &json!({"api_id": new_uuid(),
                                "error": "legs=aleg with an absolute aleg_url is required"}),
                            ),
                        )
                    }
                } else if method == "POST"
                    && path.strip_prefix(&prefix).is_some_and(|t| {
                        t.strip_suffix("/DTMF/")
                            .is_some_and(|u| !u.is_empty() && !u.contains('/'))
                    })
                {
                    // DTMF: digits `0-9 * #`, `leg` aleg or bleg.
                    let ok = body["digits"].as_str().is_some_and(|d| {
                        !d.is_empty()
                            && d.chars()
                                .all(|c| c.is_ascii_digit() || c == '*' || c == '#')
                    }) && body.get("leg").is_none_or(|l| l == "aleg" || l == "bleg");
                    if ok {
                        (
                            202,
                            json_resp(
                                202,
                                &json!({"api_id": new_uuid(), "message": "digits sent"}),
                            ),
                        )
                    } else {
                        (
                            400,
                            json_resp(
                                400,
                                &json!({"api_id": new_uuid(), "error": "invalid digits or leg"}),
                            ),
                        )
                    }
                } else if method != "DELETE" || uuid.is_none() {
                    (
                        404,
                        json_resp(404, &json!({"api_id": new_sid(""), "error": "not found"})),
                    )
                } else {
                    (204, full(204, "application/json", ""))
                };
                rec.modify(|r| {
                    r.requests.push(PlivoRequest {
                        method,
                        path,
                        status,
                        body,
                        request_uuid,
                    })
                });
                resp
            }
        })
        .await?;
        Ok(Self {
            base_url: format!("http://{addr}"),
            record,
            fail_create,
            account,
            sms,
            _server: guard,
        })
    }

    /// Adds an application.
    pub fn add_app(&self, app_id: &str, answer_url: &str, hangup_url: &str) {
        self.account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .apps
            .push(
                json!({"app_id": app_id, "app_name": format!("app-{app_id}"),
                         "answer_url": answer_url, "answer_method": "GET",
                         "hangup_url": hangup_url, "hangup_method": "GET",
                         "fallback_answer_url": "", "fallback_method": "POST",
                         "message_url": "", "default_app": false,
                         "default_endpoint_app": false, "enabled": true}),
            );
    }

    /// Adds a number (digits, no `+`) attached to `app_id` (empty: none).
    pub fn add_number(&self, digits: &str, app_id: &str) {
        self.account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .numbers
            .push((digits.to_string(), app_id.to_string()));
    }

    /// The numbers and applications now.
    pub fn account(&self) -> PlivoAccount {
        self.account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests that changed something (any method but GET).
    pub fn writes(&self) -> Vec<PlivoRequest> {
        self.record
            .snapshot()
            .requests
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Refuse every following `POST Call/` with this HTTP status (`None`: place calls).
    pub fn fail_create_with(&self, status: Option<u16>) {
        self.fail_create
            .store(status.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    pub fn record(&self) -> PlivoRestRecord {
        self.record.snapshot()
    }

    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&PlivoRestRecord) -> bool,
    ) -> PlivoRestRecord {
        self.record.wait_until(what, pred).await
    }

    /// Calls placed (`POST Call/` answered 201), oldest first.
    pub fn created(&self) -> Vec<PlivoRequest> {
        self.record()
            .requests
            .into_iter()
            .filter(|r| r.request_uuid.is_some())
            .collect()
    }

    /// Waits until `n` calls have been placed.
    pub async fn wait_for_created(&self, n: usize) -> Vec<PlivoRequest> {
        self.wait_until("calls placed", |r| {
            r.requests
                .iter()
                .filter(|q| q.request_uuid.is_some())
                .count()
                >= n
        })
        .await;
        self.created()
    }

    /// Request UUIDs cancelled before the answer (`DELETE Request/{uuid}/`).
    pub fn cancelled(&self) -> Vec<String> {
        self.record().deleted("/Request/")
    }

    /// Call UUIDs hung up through the API.
    pub fn hung_up(&self) -> Vec<String> {
        self.record().hung_up()
    }
}

impl PlivoRestRecord {
    /// Call UUIDs hung up through the API (`DELETE Call/{uuid}/`).
    pub fn hung_up(&self) -> Vec<String> {
        self.deleted("/Call/")
    }

    /// Ids whose `DELETE` of `kind` (`/Call/` or `/Request/`) succeeded.
    pub fn deleted(&self, kind: &str) -> Vec<String> {
        self.requests
            .iter()
            .filter(|r| r.status == 204 && r.method == "DELETE" && r.path.contains(kind))
            .filter_map(|r| {
                r.path
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .map(str::to_string)
            })
            .collect()
    }
}

/// Plivo's webhook side: posts signed callbacks to a patterd instance.
#[derive(Debug, Clone)]
pub struct SimPlivo {
    pub client: reqwest::Client,
    pub base_url: String,
    /// patterd's `server.public_url` (what Plivo signs).
    pub public_url: String,
    pub auth_token: String,
}

/// The form fields Plivo posts to the answer URL of an inbound call (numbers as digits).
pub fn answer_params(call_uuid: &str, from: &str, to: &str) -> Vec<(String, String)> {
    [
        ("ALegRequestUUID", call_uuid),
        ("ALegUUID", call_uuid),
        ("BillRate", "0.0085"),
        ("CallStatus", "in-progress"),
        ("CallUUID", call_uuid),
        ("CallerName", ""),
        ("Direction", "inbound"),
        ("Event", "StartApp"),
        ("From", from.trim_start_matches('+')),
        ("RequestUUID", call_uuid),
        ("SessionStart", "2026-01-01 00:00:00.000000"),
        ("To", to.trim_start_matches('+')),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl SimPlivo {
    pub fn new(base_url: &str, public_url: &str, auth_token: &str) -> Self {
        patterd::util::init_tls();
        Self {
            client: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_string(),
            public_url: public_url.to_string(),
            auth_token: auth_token.to_string(),
        }
    }

    /// POSTs `params` to `path`, signed with V3 over the public URL and a fresh nonce.
    pub async fn post(
        &self,
        path: &str,
        params: &[(String, String)],
    ) -> Result<WebhookResponse, reqwest::Error> {
        let url = signed_url(&self.public_url, path);
        let nonce: String = new_sid("")
            .bytes()
            .take(20)
            .map(|b| char::from(b'0' + b % 10))
            .collect();
        let sig = compute_v3(&self.auth_token, "POST", &url, params, &nonce);
        self.post_with(
            path,
            params,
            &[
                ("X-Plivo-Signature-V3", sig.as_str()),
                ("X-Plivo-Signature-V3-Nonce", nonce.as_str()),
            ],
        )
        .await
    }

    /// The form fields Plivo posts to an application's `message_url` (numbers as digits).
    pub fn message_params(
        message_uuid: &str,
        from: &str,
        to: &str,
        text: &str,
    ) -> Vec<(String, String)> {
        [
            ("From", from.trim_start_matches('+')),
            ("MessageIntent", ""),
            ("MessageUUID", message_uuid),
            ("PowerpackUUID", ""),
            ("Text", text),
            ("To", to.trim_start_matches('+')),
            ("TotalAmount", "0.00000"),
            ("TotalRate", "0.00000"),
            ("Type", "sms"),
            ("Units", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// The V2 headers Plivo signs a messaging webhook with: HMAC-SHA256 over the URL without
    /// its query and a fresh nonce.
    pub fn v2_headers(&self, path: &str) -> (String, String) {
        let url = signed_url(&self.public_url, path);
        let nonce: String = new_sid("")
            .bytes()
            .take(20)
            .map(|b| char::from(b'0' + b % 10))
            .collect();
        let sig = patterd::carrier::plivo::signature::compute_v2(&self.auth_token, &url, &nonce);
        (sig, nonce)
    }

    /// An inbound text message: posts the `message_url` (`/plivo/message`) signed with V2 as
    /// Plivo does, with a fresh `MessageUUID`. Returns it and patterd's answer.
    pub async fn incoming_message(
        &self,
        from: &str,
        to: &str,
        text: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let id = new_uuid();
        let params = Self::message_params(&id, from, to, text);
        let (sig, nonce) = self.v2_headers("/plivo/message");
        let r = self
            .post_with(
                "/plivo/message",
                &params,
                &[
                    ("X-Plivo-Signature-V2", sig.as_str()),
                    ("X-Plivo-Signature-V2-Nonce", nonce.as_str()),
                ],
            )
            .await?;
        Ok((id, r))
    }

    /// POSTs with caller-chosen headers (negative tests).
    pub async fn post_with(
        &self,
        path: &str,
        params: &[(String, String)],
        headers: &[(&str, &str)],
    ) -> Result<WebhookResponse, reqwest::Error> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter())
            .finish();
        let mut req = self
            .client
            .post(format!("{}{path}", self.base_url))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("User-Agent", "PlivoHttp/1.0")
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        WebhookResponse::read(req.send().await?).await
    }

    /// Plivo answering a call patterd placed: fetches its `answer_url` (signed, `Direction:
    /// outbound`, the `RequestUUID` it was given, `Machine` when machine detection was asked
    /// for) with a fresh `CallUUID`. Open the stream from the answer with
    /// [`SimPlivo::open_stream`].
    pub async fn answer_outbound(
        &self,
        create: &PlivoRequest,
        machine: Option<bool>,
    ) -> Result<(String, WebhookResponse), String> {
        let request_uuid = create.request_uuid.clone().ok_or("not a placed call")?;
        let path = self.local_path(create.field("answer_url").unwrap_or(""))?;
        let call_uuid = new_uuid();
        let mut params = answer_params(
            &call_uuid,
            create.field("from").unwrap_or(""),
            create.field("to").unwrap_or(""),
        );
        for (k, v) in params.iter_mut() {
            match k.as_str() {
                "Direction" => *v = "outbound".into(),
                "RequestUUID" | "ALegRequestUUID" => *v = request_uuid.clone(),
                _ => {}
            }
        }
        if let Some(m) = machine {
            params.push(("Machine".into(), m.to_string()));
        }
        let r = self.post(&path, &params).await.map_err(|e| e.to_string())?;
        Ok((call_uuid, r))
    }

    /// The hangup callback of a call patterd placed: `cause` such as `USER_BUSY`,
    /// `NO_ANSWER` or `NORMAL_CLEARING`; `call_uuid` and `answered` when it was answered.
    pub async fn hangup_outbound(
        &self,
        create: &PlivoRequest,
        call_uuid: Option<&str>,
        cause: &str,
        duration_s: u32,
    ) -> Result<WebhookResponse, String> {
        let request_uuid = create.request_uuid.clone().ok_or("not a placed call")?;
        let path = self.local_path(create.field("hangup_url").unwrap_or(""))?;
        let uuid = call_uuid.map(str::to_string).unwrap_or_else(new_uuid);
        let mut params: Vec<(String, String)> = [
            ("CallUUID", uuid.as_str()),
            ("RequestUUID", request_uuid.as_str()),
            ("Direction", "outbound"),
            ("From", create.field("from").unwrap_or("")),
            ("To", create.field("to").unwrap_or("")),
            ("HangupCause", cause),
            ("HangupSource", "Callee"),
            ("CallStatus", "completed"),
            ("Event", "Hangup"),
            ("StartTime", "2026-01-01 00:00:00"),
            ("EndTime", "2026-01-01 00:00:30"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let answered = call_uuid.is_some();
        params.push(("Duration".into(), duration_s.to_string()));
        params.push((
            "AnswerTime".into(),
            if answered {
                "2026-01-01 00:00:02".into()
            } else {
                String::new()
            },
        ));
        self.post(&path, &params).await.map_err(|e| e.to_string())
    }

    /// The path of one of patterd's public URLs.
    fn local_path(&self, url: &str) -> Result<String, String> {
        url.strip_prefix(self.public_url.trim_end_matches('/'))
            .filter(|p| p.starts_with('/'))
            .map(str::to_string)
            .ok_or_else(|| format!("{url:?} is not under {}", self.public_url))
    }

    /// A new inbound call: posts the answer webhook with a fresh `CallUUID`.
    pub async fn incoming_call(
        &self,
        from: &str,
        to: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let h = new_sid("");
        let uuid = format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        );
        let r = self
            .post("/plivo/answer", &answer_params(&uuid, from, to))
            .await?;
        Ok((uuid, r))
    }

    /// Opens the media stream an answer asks for, on `ws_base`, in the format its
    /// `contentType` names (as Plivo does).
    pub async fn open_stream(
        &self,
        answer: &PlivoAnswer,
        ws_base: &str,
        call_uuid: &str,
    ) -> Result<SimCall, super::stream::SimError> {
        let dialect = match answer.content_type.as_deref() {
            Some(ct) if ct.starts_with("audio/x-l16") => Dialect::PlivoL16,
            _ => Dialect::PlivoMulaw,
        };
        self.open_stream_as(answer, ws_base, call_uuid, dialect)
            .await
    }

    /// Opens the stream in an explicit dialect (format tests).
    pub async fn open_stream_as(
        &self,
        answer: &PlivoAnswer,
        ws_base: &str,
        call_uuid: &str,
        dialect: Dialect,
    ) -> Result<SimCall, super::stream::SimError> {
        let url = answer
            .stream_url
            .as_deref()
            .ok_or(super::stream::SimError::NoStream)?;
        let cfg = SimCallConfig::new(ws_base, ACCOUNT_ID, call_uuid).with_dialect(dialect);
        SimCall::connect(url, &Default::default(), cfg).await
    }
}
