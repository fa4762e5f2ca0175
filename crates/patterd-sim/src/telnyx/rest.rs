//! The fake Telnyx Call Control REST API ([`FakeTelnyxRest`]) on 127.0.0.1: the Bearer key,
//! command bodies and their order checked as Telnyx checks them (`answer` before
//! `streaming_start`, bidirectional RTP PCMU on the inbound track, 422 / 90018 on an ended
//! call), dial and `speak` for outbound calls, and the number administration routes over
//! [`TelnyxAccount`]. Every command is recorded ([`TelnyxRestRecord`]).
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::http::{Recorder, json as json_resp, read_body, serve};
use crate::twilio::new_sid;
use patterd::util::TaskGuard;

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
) -> Option<hyper::Response<crate::http::Body>> {
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
            let param = |name: &str| {
                form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
            };
            let filter = param("filter[phone_number]");
            let connection = param("filter[connection_id]");
            let size: usize = param("page[size]")
                .and_then(|s| s.parse().ok())
                .unwrap_or(20)
                .clamp(1, 250);
            let page: usize = param("page[number]")
                .and_then(|s| s.parse().ok())
                .unwrap_or(1)
                .max(1);
            let matching: Vec<Value> = acc
                .numbers
                .iter()
                .filter(|n| match &filter {
                    // As Telnyx: at least three digits, non-digits match nothing.
                    Some(f) => {
                        f.len() >= 3
                            && f.bytes().all(|b| b.is_ascii_digit())
                            && n["phone_number"].as_str().is_some_and(|p| p.contains(f))
                    }
                    None => true,
                })
                .filter(|n| {
                    connection
                        .as_ref()
                        .is_none_or(|c| n["connection_id"].as_str() == Some(c))
                })
                .cloned()
                .collect();
            let total_pages = matching.len().div_ceil(size).max(1);
            let data: Vec<Value> = matching
                .into_iter()
                .skip((page - 1) * size)
                .take(size)
                .collect();
            Some(json_resp(
                200,
                &json!({"data": data, "meta": {"page_number": page, "page_size": size,
                        "total_pages": total_pages}}),
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
    /// Messages sent, lookups answered and messaging requests refused (`crate::sms`).
    pub sms: Arc<Recorder<crate::sms::SmsLedger>>,
    _server: TaskGuard,
}

fn telnyx_error(status: u16, code: &str, title: &str) -> hyper::Response<crate::http::Body> {
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
) -> hyper::Response<crate::http::Body> {
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
        let sms = Arc::new(Recorder::<crate::sms::SmsLedger>::default());
        let sms_ledger = sms.clone();
        let (addr, guard) = serve(move |req| {
            let rec = rec.clone();
            let acc = acc.clone();
            let sms = sms_ledger.clone();
            let calls = calls.clone();
            let expected = expected.clone();
            let fail = fail.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                let auth_ok = crate::http::authorized(&req, &expected);
                let json_ct = req
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/json"));
                let method = req.method().clone();
                let headers = crate::http::header_pairs(&req);
                let body = read_body(req, 1 << 20).await.unwrap_or_default();
                let refuse = |status: u16, code: &str, title: &str| {
                    rec.modify(|r| r.refused.push((path.clone(), status)));
                    telnyx_error(status, code, title)
                };
                if !auth_ok {
                    return refuse(401, "10009", "Authentication failed");
                }
                let sms_req = crate::sms::SmsRequest {
                    method: method.as_str(),
                    path: &path,
                    query: &query,
                    headers: &headers,
                    body: &body,
                };
                if let Some(resp) = crate::sms::telnyx::handle(&sms, &sms_req) {
                    return resp;
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
                            // `to` (+E.164 or SIP URI) required,
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
                            // Digits `0-9 A-D * # w W`, duration 100..=500.
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
            sms,
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

    /// Sets one field of application `id` (e.g. an older `webhook_api_version`).
    pub fn set_app_field(&self, id: &str, key: &str, value: Value) {
        let mut acc = self.account.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = acc.apps.iter_mut().find(|a| a["id"] == id) {
            a[key] = value;
        }
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
