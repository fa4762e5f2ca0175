//! The Telnyx simulator: plays Telnyx's side of a Call Control call against a running patterd.
//! [`SimTelnyx`] signs webhook envelopes with Ed25519 (`telnyx-signature-ed25519` over
//! `timestamp|body`) and posts them; [`FakeTelnyxRest`] is the Call Control API on 127.0.0.1,
//! checking the Bearer key and the command bodies (an `answer` must come before
//! `streaming_start`, streaming must be bidirectional RTP PCMU on the inbound track, commands
//! on an ended call get 422 / 90018, as Telnyx answers) and recording every command;
//! [`SimTelnyx::place_call`] runs the whole dance — `call.initiated`, wait for `answer`,
//! `call.answered`, wait for `streaming_start`, open the media socket its `stream_url` names
//! (media frames partly out of order, as Telnyx does not guarantee order). Outbound: the fake
//! takes `POST /v2/calls` (dial, answered with a new `call_control_id`) and `speak`;
//! [`SimTelnyx::answer_outbound`] plays the dialled leg (`call.initiated` outgoing,
//! `call.answered`, optional machine detection, then the stream patterd starts) and
//! [`SimTelnyx::hang_up`] ends it with a cause such as `user_busy`. Number administration
//! (`carrier-actions.md` §3.2, §5): `GET /v2/balance`; `GET /v2/phone_numbers` filtered by
//! `filter[phone_number]` (digits only: anything else matches nothing) and `PATCH
//! /v2/phone_numbers/{id}` (only the updatable fields); `GET`/`PATCH
//! /v2/call_control_applications/{id}`, whose update must carry `application_name` and
//! `webhook_event_url` (422 otherwise). The numbers and applications are [`TelnyxAccount`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::http::{Recorder, json as json_resp, read_body, serve};
use super::stream::{Dialect, SimCall, SimCallConfig};
use super::twilio::{WebhookResponse, new_sid};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use patterd::util::TaskGuard;

/// Signs a webhook as Telnyx does: base64 Ed25519 over `timestamp|body` with the key pair
/// derived from a 32-byte `seed` (patterd only verifies; see
/// `patterd::carrier::telnyx::signature`).
pub fn sign_webhook(seed: &[u8; 32], timestamp: u64, body: &[u8]) -> Option<String> {
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed).ok()?;
    let mut msg = format!("{timestamp}|").into_bytes();
    msg.extend_from_slice(body);
    Some(STANDARD.encode(pair.sign(&msg).as_ref()))
}

/// The base64 public key of the key pair derived from `seed` (what `public_key` in patterd's
/// config holds).
pub fn public_key_for_seed(seed: &[u8; 32]) -> Option<String> {
    use ring::signature::KeyPair;
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed).ok()?;
    Some(STANDARD.encode(pair.public_key().as_ref()))
}

/// A `call.*` webhook body as Telnyx sends it.
pub fn envelope_json(
    event_type: &str,
    id: &str,
    payload: serde_json::Value,
    delivered_to: &str,
) -> String {
    serde_json::json!({
        "data": {
            "event_type": event_type,
            "id": id,
            "occurred_at": "2026-01-01T00:00:00.000000Z",
            "payload": payload,
            "record_type": "event",
        },
        "meta": {"attempt": 1, "delivered_to": delivered_to},
    })
    .to_string()
}

/// One command the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct TelnyxCommand {
    /// `answer`, `streaming_start`, `hangup`, `reject`, ...
    pub action: String,
    pub call_control_id: String,
    pub body: Value,
    /// What the fake answered.
    pub status: u16,
}

/// The account's phone numbers and Call Control applications (JSON as the API shows them).
#[derive(Debug, Clone, Default)]
pub struct TelnyxAccount {
    pub numbers: Vec<Value>,
    pub apps: Vec<Value>,
}

/// Number and application routes; `None` for every other path.
fn account_api(
    account: &Mutex<TelnyxAccount>,
    method: &hyper::Method,
    parts: &[&str],
    query: &str,
    body: &[u8],
) -> Option<hyper::Response<super::http::Body>> {
    let mut acc = account.lock().unwrap_or_else(|e| e.into_inner());
    let patch = serde_json::from_slice::<Value>(body).ok();
    match (method.as_str(), parts) {
        ("GET", ["v2", "balance"]) => Some(json_resp(
            200,
            &json!({"data": {"balance": "300.00", "available_credit": "400.00",
                    "credit_limit": "100.00", "pending": "0.00", "currency": "USD",
                    "record_type": "balance"}}),
        )),
        ("GET", ["v2", "phone_numbers"]) => {
            let filter = form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == "filter[phone_number]")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            let digits_only = filter.len() >= 3 && filter.bytes().all(|b| b.is_ascii_digit());
            let data: Vec<Value> = acc
                .numbers
                .iter()
                .filter(|n| {
                    digits_only
                        && n["phone_number"]
                            .as_str()
                            .is_some_and(|p| p.contains(&filter))
                })
                .cloned()
                .collect();
            Some(json_resp(
                200,
                &json!({"data": data, "meta": {"page_number": 1, "total_pages": 1}}),
            ))
        }
        ("PATCH", ["v2", "phone_numbers", id]) => {
            let Some(Value::Object(p)) = patch else {
                return Some(telnyx_error(
                    400,
                    "10015",
                    "Bad request: JSON object expected",
                ));
            };
            const UPDATABLE: &[&str] = &[
                "connection_id",
                "billing_group_id",
                "address_id",
                "customer_reference",
                "external_pin",
                "hd_voice_enabled",
                "tags",
            ];
            if let Some(k) = p.keys().find(|k| !UPDATABLE.contains(&k.as_str())) {
                return Some(telnyx_error(
                    422,
                    "10015",
                    &format!("{k} cannot be updated"),
                ));
            }
            let n = acc.numbers.iter_mut().find(|n| n["id"] == *id)?;
            for (k, v) in p {
                n[k.as_str()] = v;
            }
            Some(json_resp(200, &json!({"data": n})))
        }
        ("GET", ["v2", "call_control_applications", id]) => {
            let a = acc.apps.iter().find(|a| a["id"] == *id)?;
            Some(json_resp(200, &json!({"data": a})))
        }
        ("PATCH", ["v2", "call_control_applications", id]) => {
            let Some(Value::Object(p)) = patch else {
                return Some(telnyx_error(
                    400,
                    "10015",
                    "Bad request: JSON object expected",
                ));
            };
            if ["application_name", "webhook_event_url"]
                .iter()
                .any(|k| !p.get(*k).is_some_and(Value::is_string))
            {
                return Some(telnyx_error(
                    422,
                    "10015",
                    "application_name and webhook_event_url are required",
                ));
            }
            let a = acc.apps.iter_mut().find(|a| a["id"] == *id)?;
            for (k, v) in p {
                a[k.as_str()] = v;
            }
            Some(json_resp(200, &json!({"data": a})))
        }
        _ => None,
    }
}

/// Everything the fake saw.
#[derive(Debug, Clone, Default)]
pub struct TelnyxRestRecord {
    pub commands: Vec<TelnyxCommand>,
    /// Requests refused before routing (bad auth, bad path, bad body).
    pub refused: Vec<(String, u16)>,
    /// Number administration requests: method, path, status.
    pub admin: Vec<(String, String, u16)>,
}

impl TelnyxRestRecord {
    /// Commands of one kind that succeeded.
    pub fn ok(&self, action: &str) -> Vec<&TelnyxCommand> {
        self.commands
            .iter()
            .filter(|c| c.action == action && c.status == 200)
            .collect()
    }

    /// Calls hung up through the API.
    pub fn hung_up(&self) -> Vec<String> {
        self.ok("hangup")
            .iter()
            .map(|c| c.call_control_id.clone())
            .collect()
    }
}

#[derive(Default)]
struct CallState {
    answered: HashSet<String>,
    ended: HashSet<String>,
}

/// A fake Telnyx Call Control API. Dropping it stops the server.
pub struct FakeTelnyxRest {
    /// `http://127.0.0.1:port`: the carrier's `api_base_url`.
    pub base_url: String,
    record: Arc<Recorder<TelnyxRestRecord>>,
    /// Answer dials with this status (0: place the call).
    fail_dial: Arc<std::sync::atomic::AtomicU16>,
    account: Arc<Mutex<TelnyxAccount>>,
    _server: TaskGuard,
}

fn telnyx_error(status: u16, code: &str, title: &str) -> hyper::Response<super::http::Body> {
    json_resp(
        status,
        &json!({"errors": [{"code": code, "title": title, "detail": title}]}),
    )
}

/// `POST /v2/calls`: a new outbound call, recorded as the command `dial` with the new
/// `call_control_id`. The call counts as answered for `streaming_start` (the simulator posts
/// `call.answered` before patterd may start the stream).
fn dial(
    rec: &Recorder<TelnyxRestRecord>,
    calls: &Mutex<CallState>,
    method: &hyper::Method,
    json_ct: bool,
    body: &[u8],
    path: &str,
) -> hyper::Response<super::http::Body> {
    let parsed = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    let field_ok = |k: &str| parsed[k].as_str().is_some_and(|v| !v.is_empty());
    if *method != hyper::Method::POST
        || !json_ct
        || !["connection_id", "to", "from"].iter().all(|k| field_ok(k))
    {
        rec.modify(|r| r.refused.push((path.to_string(), 422)));
        return telnyx_error(
            422,
            "10015",
            "Invalid dial: connection_id, to and from are required",
        );
    }
    let id = format!("v3:{}", &new_sid("")[..30]);
    calls
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .answered
        .insert(id.clone());
    rec.modify(|r| {
        r.commands.push(TelnyxCommand {
            action: "dial".into(),
            call_control_id: id.clone(),
            body: parsed.clone(),
            status: 200,
        })
    });
    json_resp(
        200,
        &json!({"data": {
            "call_control_id": id,
            "call_leg_id": new_sid("")[..32].to_string(),
            "call_session_id": new_sid("")[..32].to_string(),
            "is_alive": false,
            "record_type": "call",
        }}),
    )
}

impl FakeTelnyxRest {
    /// Starts on an ephemeral port, accepting `Authorization: Bearer {api_key}`.
    pub async fn start(api_key: &str) -> std::io::Result<Self> {
        let record = Arc::new(Recorder::<TelnyxRestRecord>::default());
        let calls = Arc::new(Mutex::new(CallState::default()));
        let expected = format!("Bearer {api_key}");
        let rec = record.clone();
        let fail_dial = Arc::new(std::sync::atomic::AtomicU16::new(0));
        let fail = fail_dial.clone();
        let account = Arc::new(Mutex::new(TelnyxAccount::default()));
        let acc = account.clone();
        let (addr, guard) = serve(move |req| {
            let rec = rec.clone();
            let acc = acc.clone();
            let calls = calls.clone();
            let expected = expected.clone();
            let fail = fail.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                let auth_ok = super::http::authorized(&req, &expected);
                let json_ct = req
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/json"));
                let method = req.method().clone();
                let body = read_body(req, 1 << 20).await.unwrap_or_default();
                let refuse = |status: u16, code: &str, title: &str| {
                    rec.modify(|r| r.refused.push((path.clone(), status)));
                    telnyx_error(status, code, title)
                };
                if !auth_ok {
                    return refuse(401, "10009", "Authentication failed");
                }
                let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                if let Some(resp) = account_api(&acc, &method, &parts, &query, &body) {
                    let status = resp.status().as_u16();
                    rec.modify(|r| r.admin.push((method.to_string(), path.clone(), status)));
                    return resp;
                }
                if parts.as_slice() == ["v2", "calls"] {
                    if fail != 0 {
                        return refuse(fail, "10011", "Dial refused (simulated)");
                    }
                    return dial(&rec, &calls, &method, json_ct, &body, &path);
                }
                let (id, action) = match parts.as_slice() {
                    ["v2", "calls", id, "actions", action] if !id.is_empty() => {
                        (id.to_string(), action.to_string())
                    }
                    _ => return refuse(404, "10005", "Resource not found"),
                };
                if method != hyper::Method::POST || !json_ct {
                    return refuse(400, "10015", "Bad request: POST application/json expected");
                }
                let Ok(body @ Value::Object(_)) = serde_json::from_slice::<Value>(&body) else {
                    return refuse(400, "10015", "Bad request: body is not a JSON object");
                };
                let status = {
                    let mut c = calls.lock().unwrap_or_else(|e| e.into_inner());
                    if c.ended.contains(&id) {
                        422
                    } else {
                        match action.as_str() {
                            "answer" => {
                                c.answered.insert(id.clone());
                                200
                            }
                            "streaming_start" => {
                                let ok = c.answered.contains(&id)
                                    && body["stream_url"]
                                        .as_str()
                                        .is_some_and(|u| u.starts_with("ws"))
                                    && body["stream_track"] == "inbound_track"
                                    && body["stream_bidirectional_mode"] == "rtp"
                                    && body["stream_bidirectional_codec"] == "PCMU";
                                if ok { 200 } else { 400 }
                            }
                            "speak" => {
                                if body["payload"].as_str().is_some_and(|p| !p.is_empty()) {
                                    200
                                } else {
                                    400
                                }
                            }
                            "hangup" | "reject" => {
                                c.ended.insert(id.clone());
                                200
                            }
                            // carrier-actions §1.2: `to` (+E.164 or SIP URI) required,
                            // `from` +E.164, `timeout_secs` 5..=600, `command_id` a string.
                            "transfer" => {
                                let e164 = |v: &Value| {
                                    v.as_str().is_some_and(|n| {
                                        n.strip_prefix('+').is_some_and(|d| {
                                            (8..=15).contains(&d.len())
                                                && d.bytes().all(|b| b.is_ascii_digit())
                                        })
                                    })
                                };
                                let ok = c.answered.contains(&id)
                                    && (e164(&body["to"])
                                        || body["to"]
                                            .as_str()
                                            .is_some_and(|t| t.starts_with("sip:")))
                                    && (body.get("from").is_none() || e164(&body["from"]))
                                    && body.get("timeout_secs").is_none_or(|t| {
                                        t.as_u64().is_some_and(|t| (5..=600).contains(&t))
                                    })
                                    && body.get("command_id").is_none_or(Value::is_string);
                                if ok { 200 } else { 400 }
                            }
                            // carrier-actions §2.1: digits `0-9 A-D * # w W`, duration 100..=500.
                            "send_dtmf" => {
                                let ok = c.answered.contains(&id)
                                    && body["digits"].as_str().is_some_and(|d| {
                                        !d.is_empty()
                                            && d.chars().all(|c| {
                                                c.is_ascii_digit() || "ABCD*#wW".contains(c)
                                            })
                                    })
                                    && body.get("duration_millis").is_none_or(|t| {
                                        t.as_u64().is_some_and(|t| (100..=500).contains(&t))
                                    });
                                if ok { 200 } else { 400 }
                            }
                            _ => 404,
                        }
                    }
                };
                rec.modify(|r| {
                    r.commands.push(TelnyxCommand {
                        action: action.clone(),
                        call_control_id: id.clone(),
                        body: body.clone(),
                        status,
                    })
                });
                match status {
                    200 => json_resp(200, &json!({"data": {"result": "ok"}})),
                    422 => telnyx_error(422, "90018", "Call has already ended"),
                    404 => telnyx_error(404, "10005", "Resource not found"),
                    _ => telnyx_error(400, "10015", &format!("Invalid {action} parameters")),
                }
            }
        })
        .await?;
        Ok(Self {
            base_url: format!("http://{addr}"),
            record,
            fail_dial,
            account,
            _server: guard,
        })
    }

    /// Adds a Call Control application.
    pub fn add_app(&self, id: &str, name: &str, webhook_event_url: &str) {
        self.account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .apps
            .push(json!({"id": id, "application_name": name,
                         "webhook_event_url": webhook_event_url,
                         "webhook_api_version": "2", "active": true,
                         "record_type": "call_control_application"}));
    }

    /// Adds a number routed to `connection_id` (empty: none); returns its id.
    pub fn add_number(&self, phone_number: &str, connection_id: &str) -> String {
        let id = new_sid("")[..19].to_string();
        self.account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .numbers
            .push(json!({"id": id, "phone_number": phone_number,
                         "connection_id": connection_id, "status": "active",
                         "record_type": "phone_number"}));
        id
    }

    /// The numbers and applications now.
    pub fn account(&self) -> TelnyxAccount {
        self.account
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Refuse every following dial with this HTTP status (`None`: place calls).
    pub fn fail_dial_with(&self, status: Option<u16>) {
        self.fail_dial
            .store(status.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    pub fn record(&self) -> TelnyxRestRecord {
        self.record.snapshot()
    }

    /// Waits until `pred` holds (panics after the recorder's limit).
    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&TelnyxRestRecord) -> bool,
    ) -> TelnyxRestRecord {
        self.record.wait_until(what, pred).await
    }

    /// Calls dialled (`POST /v2/calls`), oldest first.
    pub fn dialled(&self) -> Vec<TelnyxCommand> {
        self.record().ok("dial").into_iter().cloned().collect()
    }

    /// Waits until `n` calls have been dialled.
    pub async fn wait_for_dialled(&self, n: usize) -> Vec<TelnyxCommand> {
        self.wait_until("dial", |r| r.ok("dial").len() >= n)
            .await
            .ok("dial")
            .into_iter()
            .cloned()
            .collect()
    }

    /// Calls hung up through the API.
    pub fn hung_up(&self) -> Vec<String> {
        self.record().hung_up()
    }
}

/// Telnyx's webhook side: posts signed Call Control events to a patterd instance.
#[derive(Debug, Clone)]
pub struct SimTelnyx {
    pub client: reqwest::Client,
    /// Where patterd listens, e.g. `http://127.0.0.1:4321`.
    pub base_url: String,
    /// The webhook URL Telnyx would report in `meta.delivered_to`.
    pub public_url: String,
    seed: [u8; 32],
}

impl SimTelnyx {
    /// `seed` is the Ed25519 seed whose public key patterd is configured with.
    pub fn new(base_url: &str, public_url: &str, seed: [u8; 32]) -> Self {
        patterd::util::init_tls();
        Self {
            client: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_string(),
            public_url: public_url.trim_end_matches('/').to_string(),
            seed,
        }
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    /// A signed event body for `call_control_id`; `extra` fields are merged into the payload.
    pub fn event(&self, event_type: &str, call_control_id: &str, extra: Value) -> String {
        let mut payload = json!({
            "call_control_id": call_control_id,
            "call_leg_id": new_sid("")[..32].to_string(),
            "call_session_id": new_sid("")[..32].to_string(),
            "connection_id": "1684641123236054244",
            "client_state": null,
        });
        if let (Some(p), Value::Object(extra)) = (payload.as_object_mut(), extra) {
            p.extend(extra);
        }
        envelope_json(
            event_type,
            &new_sid("")[..32],
            payload,
            &format!("{}/telnyx/webhook", self.public_url),
        )
    }

    /// Posts `body` signed now.
    pub async fn post(&self, body: &str) -> Result<WebhookResponse, reqwest::Error> {
        let ts = Self::now();
        let sig = sign_webhook(&self.seed, ts, body.as_bytes()).unwrap_or_default();
        self.post_signed(body, Some(&sig), Some(&ts.to_string()))
            .await
    }

    /// Posts `body` with caller-chosen signature headers (negative tests).
    pub async fn post_signed(
        &self,
        body: &str,
        signature: Option<&str>,
        timestamp: Option<&str>,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let mut req = self
            .client
            .post(format!("{}/telnyx/webhook", self.base_url))
            .header("Content-Type", "application/json")
            .header("User-Agent", "telnyx-webhooks")
            .body(body.to_string());
        if let Some(s) = signature {
            req = req.header("telnyx-signature-ed25519", s);
        }
        if let Some(t) = timestamp {
            req = req.header("telnyx-timestamp", t);
        }
        WebhookResponse::read(req.send().await?).await
    }

    /// The `call.initiated` body of a new inbound call.
    pub fn initiated(&self, call_control_id: &str, from: &str, to: &str) -> String {
        self.event(
            "call.initiated",
            call_control_id,
            json!({"direction": "incoming", "state": "parked", "from": from, "to": to,
                   "start_time": "2026-01-01T00:00:00.000000Z"}),
        )
    }

    /// A new inbound call: posts `call.initiated` with a fresh `call_control_id`.
    pub async fn incoming_call(
        &self,
        from: &str,
        to: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let id = format!("v3:{}", &new_sid("")[..30]);
        let r = self.post(&self.initiated(&id, from, to)).await?;
        Ok((id, r))
    }

    /// Telnyx answering a call patterd dialled: `call.initiated` (`outgoing`), `call.answered`,
    /// with `amd` a `call.machine.detection.ended` carrying that result; unless the result is
    /// `machine`, waits for patterd's `streaming_start` and opens the media socket.
    pub async fn answer_outbound(
        &self,
        rest: &FakeTelnyxRest,
        dial: &TelnyxCommand,
        ws_base: &str,
        amd: Option<&str>,
    ) -> Result<Option<SimCall>, String> {
        let id = dial.call_control_id.clone();
        let from = dial.body["from"].as_str().unwrap_or("").to_string();
        let to = dial.body["to"].as_str().unwrap_or("").to_string();
        let client_state = dial.body["client_state"].clone();
        let legs = json!({"from": from, "to": to, "client_state": client_state});
        let mut initiated = legs.clone();
        initiated["direction"] = json!("outgoing");
        initiated["state"] = json!("bridging");
        let mut answered = legs.clone();
        answered["state"] = json!("answered");
        for (event, payload) in [("call.initiated", initiated), ("call.answered", answered)] {
            let r = self
                .post(&self.event(event, &id, payload))
                .await
                .map_err(|e| e.to_string())?;
            if r.status != 200 {
                return Err(format!("{event} answered {r:?}"));
            }
        }
        if let Some(result) = amd {
            let mut p = legs.clone();
            p["result"] = json!(result);
            self.post(&self.event("call.machine.detection.ended", &id, p))
                .await
                .map_err(|e| e.to_string())?;
            if result == "machine" {
                return Ok(None);
            }
        }
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            rest.wait_until("streaming_start", |r| {
                r.commands
                    .iter()
                    .any(|c| c.action == "streaming_start" && c.call_control_id == id)
            }),
        )
        .await
        .map_err(|_| format!("patterd sent no streaming_start for {id}"))?;
        let cmd = stream
            .commands
            .iter()
            .find(|c| c.action == "streaming_start" && c.call_control_id == id)
            .cloned()
            .ok_or("streaming_start vanished")?;
        if cmd.status != 200 {
            return Err(format!("streaming_start refused: {cmd:?}"));
        }
        Ok(Some(open_stream(ws_base, &id, &cmd.body).await?))
    }

    /// `call.hangup` with `cause` (`user_busy`, `no_answer`, `normal_clearing`, ...).
    pub async fn hang_up(
        &self,
        call_control_id: &str,
        cause: &str,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let body = self.event(
            "call.hangup",
            call_control_id,
            json!({"state": "hangup", "hangup_cause": cause, "hangup_source": "callee"}),
        );
        self.post(&body).await
    }

    /// `call.speak.ended` (Telnyx finished a `speak`).
    pub async fn speak_ended(
        &self,
        call_control_id: &str,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let body = self.event(
            "call.speak.ended",
            call_control_id,
            json!({"status": "completed"}),
        );
        self.post(&body).await
    }

    /// The whole inbound call: `call.initiated` → (patterd answers) → `call.answered` →
    /// (patterd starts streaming) → the media socket opens on `ws_base`. Returns the call id
    /// and the stream.
    pub async fn place_call(
        &self,
        rest: &FakeTelnyxRest,
        ws_base: &str,
        from: &str,
        to: &str,
    ) -> Result<(String, SimCall), String> {
        let (id, r) = self
            .incoming_call(from, to)
            .await
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!("call.initiated answered {r:?}"));
        }
        let wait = |action: &'static str, id: String| async move {
            let deadline = Duration::from_secs(10);
            tokio::time::timeout(deadline, async {
                loop {
                    let rec = rest.record();
                    if let Some(c) = rec
                        .commands
                        .iter()
                        .find(|c| c.action == action && c.call_control_id == id)
                    {
                        return c.clone();
                    }
                    if rec
                        .commands
                        .iter()
                        .any(|c| c.action == "reject" && c.call_control_id == id)
                    {
                        return TelnyxCommand {
                            action: "reject".into(),
                            call_control_id: id.clone(),
                            body: Value::Null,
                            status: 0,
                        };
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .map_err(|_| format!("patterd sent no `{action}` for {id}"))
        };
        let answer = wait("answer", id.clone()).await?;
        if answer.action != "answer" {
            return Err(format!(
                "patterd rejected the call: {:?}",
                rest.record().commands
            ));
        }
        let answered = self.event(
            "call.answered",
            &id,
            json!({"state": "answered", "from": from, "to": to}),
        );
        self.post(&answered).await.map_err(|e| e.to_string())?;
        let stream = wait("streaming_start", id.clone()).await?;
        if stream.status != 200 {
            return Err(format!("streaming_start refused: {stream:?}"));
        }
        let sim = open_stream(ws_base, &id, &stream.body).await?;
        Ok((id, sim))
    }
}

/// Opens the media socket a `streaming_start` body names, as Telnyx does (frames partly out of
/// order).
async fn open_stream(ws_base: &str, id: &str, streaming_start: &Value) -> Result<SimCall, String> {
    let url = streaming_start["stream_url"].as_str().unwrap_or("");
    let mut cfg = SimCallConfig::new(ws_base, "7C0D9E11-0000-4000-8000-000000000001", id)
        .with_dialect(Dialect::Telnyx);
    cfg.reorder_media = true;
    SimCall::connect(url, &Default::default(), cfg)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    //! The signing helpers against patterd's own verifier and parser (these tests lived beside
    //! the verifier before the helpers moved here).
    use super::*;
    use patterd::carrier::telnyx::signature::{SignatureError, verify_webhook};
    use patterd::carrier::telnyx::webhook::{WebhookEnvelope, WebhookError};

    #[test]
    fn round_trip_and_window() {
        let seed = [7u8; 32];
        let pk = public_key_for_seed(&seed).expect("key");
        let sig = sign_webhook(&seed, 1000, b"{}").expect("sig");
        assert_eq!(
            verify_webhook(&pk, Some(&sig), Some("1000"), b"{}", 1300),
            Ok(())
        );
        assert_eq!(
            verify_webhook(&pk, Some(&sig), Some("1000"), b"{}", 1301),
            Err(SignatureError::Stale(301))
        );
        assert_eq!(
            verify_webhook(&pk, Some(&sig), Some("1000"), b"{ }", 1000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_webhook(&pk, None, Some("1000"), b"{}", 1000),
            Err(SignatureError::MissingHeader)
        );
        assert_eq!(
            verify_webhook(&pk, Some("abc"), Some("x"), b"{}", 1000),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            verify_webhook(&pk, Some("!!"), Some("1000"), b"{}", 1000),
            Err(SignatureError::BadSignature)
        );
        assert_eq!(
            verify_webhook("AAAA", Some(&sig), Some("1000"), b"{}", 1000),
            Err(SignatureError::BadPublicKey)
        );
    }

    #[test]
    fn parses_and_refuses() {
        let body = envelope_json(
            "call.dtmf.received",
            "e1",
            serde_json::json!({"call_control_id": "v3:abc", "digit": "#", "from": "+1", "client_state": null}),
            "x",
        );
        let w = WebhookEnvelope::parse(body.as_bytes()).expect("parses");
        assert_eq!(w.event_type, "call.dtmf.received");
        assert_eq!(w.call.call_control_id, "v3:abc");
        assert_eq!(w.call.digit.as_deref(), Some("#"));
        assert_eq!(w.call.client_state, None);
        assert!(matches!(
            WebhookEnvelope::parse(b"nope"),
            Err(WebhookError::BadJson(_))
        ));
        assert_eq!(
            WebhookEnvelope::parse(b"{}"),
            Err(WebhookError::MissingField("data"))
        );
        assert_eq!(
            WebhookEnvelope::parse(br#"{"data":{"event_type":"call.answered","payload":5}}"#),
            Err(WebhookError::MissingField("data.payload.call_control_id"))
        );
        assert!(matches!(
            WebhookEnvelope::parse(br#"{"data":{"event_type":7}}"#),
            Err(WebhookError::BadJson(_))
        ));
    }
}
