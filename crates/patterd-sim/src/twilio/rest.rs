//! A fake of Twilio's REST API on 127.0.0.1 ([`FakeTwilioRest`]): accepts call updates
//! (`POST /2010-04-01/Accounts/{sid}/Calls/{CallSid}.json`) and call creation
//! (`POST .../Calls.json`), checks HTTP Basic auth against the configured account, answers with
//! Twilio-shaped JSON (401 / 404 errors included), and records every request for assertions.
//! Call creations are also counted as they arrive ([`FakeTwilioRest::dials_started`]) and can be
//! held until released ([`FakeTwilioRest::hold_dials`]), to test a dial in flight. It also
//! holds the account's phone numbers (`IncomingPhoneNumbers`: listed by `PhoneNumber`, which
//! must arrive percent-encoded since a raw `+` decodes to a space, and updated by `POST`),
//! and answers the credential check `GET Accounts/{sid}.json`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hyper::{Request, Response};
use serde_json::json;
use tokio::sync::watch;

use crate::http::{Body, header_pairs, json as json_response, read_body, serve};
use patterd::util::TaskGuard;

/// One request the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// What the fake answered.
    pub status: u16,
    /// For a created call (`POST .../Calls.json` answered 201): the new `CallSid`.
    pub created_sid: Option<String>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The form body as pairs.
    pub fn form(&self) -> Vec<(String, String)> {
        patterd::carrier::twilio::parse_form(&self.body)
    }

    /// The first form field called `name`.
    pub fn field(&self, name: &str) -> Option<String> {
        self.form()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// The `CallSid` in a `.../Calls/{CallSid}.json` path.
    pub fn call_sid(&self) -> Option<&str> {
        let rest = self.path.split('?').next()?;
        let (_, tail) = rest.rsplit_once("/Calls/")?;
        tail.strip_suffix(".json")
    }
}

/// Call creations as they arrive, and the hold on answering them.
struct Gates {
    started: watch::Sender<usize>,
    hold: watch::Sender<bool>,
}

struct Inner {
    account_sid: String,
    auth_token: String,
    fail_with: Option<u16>,
    delay: Duration,
    requests: Vec<RecordedRequest>,
    /// `IncomingPhoneNumbers` instances.
    numbers: Vec<serde_json::Value>,
    /// Messages and lookups (`crate::sms::twilio`).
    sms: Arc<crate::http::Recorder<crate::sms::SmsLedger>>,
}

/// The number fields `POST IncomingPhoneNumbers/{sid}.json` may change, by form name.
const NUMBER_FIELDS: &[(&str, &str)] = &[
    ("VoiceUrl", "voice_url"),
    ("VoiceMethod", "voice_method"),
    ("VoiceFallbackUrl", "voice_fallback_url"),
    ("VoiceFallbackMethod", "voice_fallback_method"),
    ("StatusCallback", "status_callback"),
    ("StatusCallbackMethod", "status_callback_method"),
    ("VoiceApplicationSid", "voice_application_sid"),
    ("FriendlyName", "friendly_name"),
];

/// The fake REST server. Dropping it stops the server.
pub struct FakeTwilioRest {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:port`: use as the carrier's `api_base_url`.
    pub base_url: String,
    inner: Arc<Mutex<Inner>>,
    count: watch::Receiver<usize>,
    gates: Arc<Gates>,
    /// Messages sent, lookups answered and messaging requests refused (`crate::sms`).
    pub sms: Arc<crate::http::Recorder<crate::sms::SmsLedger>>,
    _server: TaskGuard,
}

impl FakeTwilioRest {
    /// Starts on an ephemeral port, accepting `account_sid:auth_token`.
    pub async fn start(account_sid: &str, auth_token: &str) -> std::io::Result<Self> {
        let sms = Arc::new(crate::http::Recorder::default());
        let inner = Arc::new(Mutex::new(Inner {
            account_sid: account_sid.to_string(),
            auth_token: auth_token.to_string(),
            fail_with: None,
            delay: Duration::ZERO,
            requests: Vec::new(),
            numbers: Vec::new(),
            sms: sms.clone(),
        }));
        let (count_tx, count_rx) = watch::channel(0usize);
        let count_tx = Arc::new(count_tx);
        let gates = Arc::new(Gates {
            started: watch::Sender::new(0),
            hold: watch::Sender::new(false),
        });
        let server_gates = gates.clone();
        let server_inner = inner.clone();
        let (addr, server) = serve(move |req| {
            handle(
                req,
                server_inner.clone(),
                count_tx.clone(),
                server_gates.clone(),
            )
        })
        .await?;
        Ok(Self {
            addr,
            base_url: format!("http://{addr}"),
            inner,
            count: count_rx,
            gates,
            sms,
            _server: server,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a number to the account with these voice settings (`voice_url`,
    /// `voice_method`, `status_callback`, `status_callback_method`, `voice_application_sid`,
    /// `trunk_sid`; missing ones are empty / `POST`); returns its `PN…` sid.
    pub fn add_number(&self, phone_number: &str, settings: &[(&str, &str)]) -> String {
        let sid = super::new_sid("PN");
        let mut v = json!({
            "sid": sid,
            "account_sid": self.lock().account_sid.clone(),
            "phone_number": phone_number,
            "friendly_name": phone_number,
            "voice_url": "",
            "voice_method": "POST",
            "voice_fallback_url": "",
            "voice_fallback_method": "POST",
            "status_callback": "",
            "status_callback_method": "POST",
            "voice_application_sid": "",
            "trunk_sid": null,
            "api_version": "2010-04-01",
        });
        for (k, val) in settings {
            v[*k] = json!(val);
        }
        self.lock().numbers.push(v);
        sid
    }

    /// The number's instance as the API would show it.
    pub fn number(&self, phone_number: &str) -> Option<serde_json::Value> {
        self.lock()
            .numbers
            .iter()
            .find(|n| n["phone_number"] == phone_number)
            .cloned()
    }

    /// Requests that changed something (any method but GET).
    pub fn writes(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// `CallSid`s that were hung up (`Status=completed`, answered 200).
    pub fn hung_up(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| r.status == 200)
            .filter(|r| {
                r.form()
                    .iter()
                    .any(|(k, v)| k == "Status" && v == "completed")
            })
            .filter_map(|r| r.call_sid().map(str::to_string))
            .collect()
    }

    /// Calls created so far (`POST .../Calls.json` answered 201), oldest first.
    pub fn created(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.created_sid.is_some())
            .collect()
    }

    /// Waits until at least `n` calls have been created; returns them.
    pub async fn wait_for_created(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>, Vec<RecordedRequest>> {
        let mut rx = self.count.clone();
        let fut = async {
            loop {
                let created = self.created();
                if created.len() >= n {
                    return created;
                }
                if rx.changed().await.is_err() {
                    return created;
                }
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(c) if c.len() >= n => Ok(c),
            _ => Err(self.created()),
        }
    }

    /// Answer every following request with this HTTP status (`None` → normal behaviour).
    pub fn fail_with(&self, status: Option<u16>) {
        self.lock().fail_with = status;
    }

    /// While `hold` is true, call creations (`POST .../Calls.json`) are received (and counted
    /// by [`FakeTwilioRest::dials_started`]) but not answered; releasing answers them all.
    pub fn hold_dials(&self, hold: bool) {
        self.gates.hold.send_replace(hold);
    }

    /// Call creations received so far, answered or not.
    pub fn dials_started(&self) -> usize {
        *self.gates.started.borrow()
    }

    /// Waits until at least `n` call creations have arrived (answered or not).
    pub async fn wait_for_dials_started(&self, n: usize, timeout: Duration) -> Result<(), usize> {
        let mut rx = self.gates.started.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|c| *c >= n)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(self.dials_started()),
        }
    }

    /// Delay every answer (timeout tests).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Waits (up to `timeout`) until `call_sid` has been hung up through the API; on timeout
    /// returns every request seen.
    pub async fn wait_for_hang_up(
        &self,
        call_sid: &str,
        timeout: Duration,
    ) -> Result<(), Vec<RecordedRequest>> {
        let mut rx = self.count.clone();
        let fut = async {
            loop {
                if self.hung_up().iter().any(|s| s == call_sid) {
                    return true;
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(true) => Ok(()),
            _ => Err(self.requests()),
        }
    }

    /// Waits until at least `n` requests have arrived; returns them.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>, Vec<RecordedRequest>> {
        let mut rx = self.count.clone();
        match tokio::time::timeout(timeout, rx.wait_for(|c| *c >= n)).await {
            Ok(Ok(_)) => Ok(self.requests()),
            _ => Err(self.requests()),
        }
    }
}

fn twilio_error(status: u16, code: u32, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({
            "code": code,
            "message": message,
            "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
            "status": status,
        }),
    )
}

/// The account and `IncomingPhoneNumbers` routes; `None` for every other path.
fn numbers_api(
    inner: &Mutex<Inner>,
    method: &str,
    path: &str,
    form: &[(String, String)],
    account_sid: &str,
) -> Option<Response<Body>> {
    let account = format!("/2010-04-01/Accounts/{account_sid}");
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    if route == format!("{account}.json") {
        if method != "GET" {
            return Some(twilio_error(405, 20004, "Method not allowed"));
        }
        let g = inner.lock().unwrap_or_else(|e| e.into_inner());
        // Like Twilio's: the body holds the auth token (never print it).
        return Some(json_response(
            200,
            &json!({"sid": account_sid, "friendly_name": "sim account", "status": "active",
                    "type": "Full", "auth_token": g.auth_token}),
        ));
    }
    let list = format!("{account}/IncomingPhoneNumbers.json");
    if route == list {
        if method != "GET" {
            return Some(twilio_error(405, 20004, "Method not allowed"));
        }
        let wanted = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "PhoneNumber")
            .map(|(_, v)| v.into_owned());
        let g = inner.lock().unwrap_or_else(|e| e.into_inner());
        let found: Vec<_> = g
            .numbers
            .iter()
            .filter(|n| {
                wanted
                    .as_deref()
                    .is_none_or(|w| n["phone_number"].as_str().is_some_and(|p| p.contains(w)))
            })
            .cloned()
            .collect();
        return Some(json_response(
            200,
            &json!({"incoming_phone_numbers": found, "page": 0, "page_size": 50,
                    "next_page_uri": null, "uri": list}),
        ));
    }
    let sid = route
        .strip_prefix(&format!("{account}/IncomingPhoneNumbers/"))?
        .strip_suffix(".json")?;
    if method != "POST" && method != "GET" {
        return Some(twilio_error(405, 20004, "Method not allowed"));
    }
    let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
    let Some(n) = g.numbers.iter_mut().find(|n| n["sid"] == sid) else {
        return Some(twilio_error(
            404,
            20404,
            &format!("The requested resource {route} was not found"),
        ));
    };
    if method == "POST" {
        for (k, v) in form {
            let Some((_, field)) = NUMBER_FIELDS.iter().find(|(f, _)| f == k) else {
                return Some(twilio_error(400, 20001, &format!("Unknown parameter {k}")));
            };
            if field.ends_with("_method") && v != "GET" && v != "POST" {
                return Some(twilio_error(
                    400,
                    21221,
                    &format!("{k} must be GET or POST"),
                ));
            }
            n[*field] = json!(v);
        }
    }
    Some(json_response(200, n))
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    inner: Arc<Mutex<Inner>>,
    count: Arc<watch::Sender<usize>>,
    gates: Arc<Gates>,
) -> Response<Body> {
    let method = req.method().to_string();
    let is_create = method == "POST" && req.uri().path().ends_with("/Calls.json");
    if is_create {
        gates.started.send_modify(|n| *n += 1);
        let mut hold = gates.hold.subscribe();
        let _ = hold.wait_for(|held| !*held).await;
    }
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    // Header names are lower-case (hyper's `HeaderName`).
    let headers = header_pairs(&req);
    let body = read_body(req, 1 << 20)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    let (account_sid, auth_token, fail_with, delay, sms) = {
        let g = inner.lock().unwrap_or_else(|e| e.into_inner());
        (
            g.account_sid.clone(),
            g.auth_token.clone(),
            g.fail_with,
            g.delay,
            g.sms.clone(),
        )
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let expected_auth = format!(
        "Basic {}",
        STANDARD.encode(format!("{account_sid}:{auth_token}"))
    );
    let auth_ok = headers.iter().any(|(k, v)| {
        k == "authorization" && patterd::security::ct_eq(v.as_bytes(), expected_auth.as_bytes())
    });
    let form = patterd::carrier::twilio::parse_form(&body);
    let prefix = format!("/2010-04-01/Accounts/{account_sid}/Calls");
    let route_path = path.split('?').next().unwrap_or("").to_string();

    let mut created_sid = None;
    let resp = if let Some(status) = fail_with {
        twilio_error(status, 20500, "Injected failure")
    } else if !auth_ok {
        let mut r = twilio_error(401, 20003, "Authenticate");
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Basic realm=\"Twilio API\""),
        );
        r
    } else if let Some(resp) = crate::sms::twilio::handle(
        &sms,
        &crate::sms::SmsRequest {
            method: &method,
            path: &route_path,
            query: path.split_once('?').map_or("", |(_, q)| q),
            headers: &headers,
            body: &body,
        },
        &account_sid,
    ) {
        resp
    } else if let Some(resp) = numbers_api(&inner, &method, &path, &form, &account_sid) {
        resp
    } else if method != "POST" {
        twilio_error(405, 20004, "Method not allowed")
    } else if route_path == format!("{prefix}.json") {
        let sid = super::new_sid("CA");
        created_sid = Some(sid.clone());
        let field = |n: &str| {
            form.iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        json_response(
            201,
            &json!({
                "sid": sid,
                "account_sid": account_sid,
                "to": field("To"),
                "from": field("From"),
                "status": "queued",
                "direction": "outbound-api",
                "api_version": "2010-04-01",
            }),
        )
    } else if let Some(call_sid) = route_path
        .strip_prefix(&format!("{prefix}/"))
        .and_then(|t| t.strip_suffix(".json"))
        .filter(|s| {
            s.starts_with("CA") && s.len() == 34 && s.bytes().all(|b| b.is_ascii_alphanumeric())
        })
    {
        let field = |n: &str| form.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        let status = field("Status").unwrap_or("in-progress");
        // `Twiml` and `Url` are mutually exclusive; inline TwiML must be
        // a well-formed `<Response>` of at most 4000 characters.
        let twiml_problem = field("Twiml").and_then(|t| {
            if field("Url").is_some() {
                return Some("Twiml and Url are mutually exclusive".to_string());
            }
            if t.chars().count() > 4000 {
                return Some("Twiml exceeds 4000 characters".to_string());
            }
            match super::parse_xml(t) {
                Ok(root) if root.name == "Response" => None,
                Ok(root) => Some(format!(
                    "the root element is <{}>, not <Response>",
                    root.name
                )),
                Err(e) => Some(format!("Document parse failure: {e}")),
            }
        });
        if let Some(problem) = twiml_problem {
            let resp = twilio_error(400, 12100, &problem);
            let n = {
                let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
                g.requests.push(RecordedRequest {
                    method,
                    path,
                    headers,
                    body,
                    status: 400,
                    created_sid: None,
                });
                g.requests.len()
            };
            count.send_replace(n);
            return resp;
        }
        json_response(
            200,
            &json!({
                "sid": call_sid,
                "account_sid": account_sid,
                "status": status,
                "api_version": "2010-04-01",
                "uri": format!("{prefix}/{call_sid}.json"),
            }),
        )
    } else {
        twilio_error(
            404,
            20404,
            &format!("The requested resource {route_path} was not found"),
        )
    };

    let status = resp.status().as_u16();
    let n = {
        let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
        g.requests.push(RecordedRequest {
            method,
            path,
            headers,
            body,
            status,
            created_sid,
        });
        g.requests.len()
    };
    count.send_replace(n);
    resp
}
