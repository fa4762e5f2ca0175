//! `FakeWebhookReceiver`: an endpoint of the kind `[[webhooks]]` points at, strict as a real
//! Standard Webhooks consumer: only `POST /hooks` with `Content-Type: application/json` and all
//! three of `webhook-id`, `webhook-timestamp` and `webhook-signature` (400 otherwise). It
//! records every request exactly as received (headers, the body's bytes as text, what it
//! answered) and answers from a queue of scripted [`Answer`]s, else the failure status while a
//! failing window ([`FakeWebhookReceiver::fail_for`]) lasts, else 200. Verifying the signatures
//! is left to the tests (with the Standard Webhooks library itself).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::Request;
use hyper::body::Incoming;
use serde_json::Value;

use super::http::{self, Body, Recorder, Server, Tasks};

/// How the receiver answers one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    /// Extra response headers (e.g. `Retry-After`).
    pub headers: Vec<(String, String)>,
    /// Wait this long before answering (longer than patterd's timeout: it gives up).
    pub delay: Duration,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

/// One request as received.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    /// Lower-cased header names.
    pub headers: BTreeMap<String, String>,
    /// The body exactly as sent (what the signature covers).
    pub body: String,
    /// What the receiver answered.
    pub answered: u16,
    /// When it arrived, relative to the receiver's start.
    pub at: Duration,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The `webhook-id`.
    pub fn id(&self) -> &str {
        self.header("webhook-id").unwrap_or_default()
    }

    /// The body as JSON (`Null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// The payload's `type`.
    pub fn event(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_string()
    }

    pub fn acknowledged(&self) -> bool {
        (200..300).contains(&self.answered)
    }
}

#[derive(Debug, Clone, Default)]
pub struct WebhookRecord {
    pub deliveries: Vec<Delivery>,
}

impl WebhookRecord {
    /// The deliveries answered 2xx.
    pub fn acknowledged(&self) -> Vec<&Delivery> {
        self.deliveries
            .iter()
            .filter(|d| d.acknowledged())
            .collect()
    }

    /// Distinct `webhook-id`s seen (any answer).
    pub fn ids(&self) -> std::collections::BTreeSet<&str> {
        self.deliveries.iter().map(Delivery::id).collect()
    }

    /// Distinct `webhook-id`s answered 2xx.
    pub fn acknowledged_ids(&self) -> std::collections::BTreeSet<&str> {
        self.acknowledged().into_iter().map(Delivery::id).collect()
    }
}

struct Shared {
    started: Instant,
    queue: Mutex<VecDeque<Answer>>,
    fail_until: Mutex<Option<(Instant, u16)>>,
    record: Recorder<WebhookRecord>,
    tasks: Tasks,
}

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

pub struct FakeWebhookReceiver {
    server: Server<Shared>,
}

const REQUIRED: [&str; 3] = ["webhook-id", "webhook-timestamp", "webhook-signature"];

async fn handle(s: std::sync::Arc<Shared>, req: Request<Incoming>) -> hyper::Response<Body> {
    if req.method() != hyper::Method::POST {
        return http::plain(405, "POST only");
    }
    if req.uri().path() != "/hooks" {
        return http::plain(404, "no such endpoint");
    }
    let headers: BTreeMap<String, String> = http::header_pairs(&req)
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let json = headers
        .get("content-type")
        .is_some_and(|c| c.starts_with("application/json"));
    let body = match http::read_body(req, 1 << 20).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => return http::plain(400, "unreadable body"),
    };
    let answer = if !json {
        Answer::status(415)
    } else if REQUIRED.iter().any(|h| !headers.contains_key(*h)) {
        Answer::status(400)
    } else if let Some(a) = s
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front()
    {
        a
    } else {
        match *s.fail_until.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((until, status)) if Instant::now() < until => Answer::status(status),
            _ => Answer::status(200),
        }
    };
    let at = s.started.elapsed();
    s.record.modify(|r| {
        r.deliveries.push(Delivery {
            headers,
            body,
            answered: answer.status,
            at,
        })
    });
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    let mut resp = http::plain(answer.status, "");
    for (k, v) in &answer.headers {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(v),
        ) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

impl FakeWebhookReceiver {
    pub async fn start() -> std::io::Result<Self> {
        let shared = Shared {
            started: Instant::now(),
            queue: Mutex::new(VecDeque::new()),
            fail_until: Mutex::new(None),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self {
            server: Server::start(shared, handle).await?,
        })
    }

    /// The URL for `[[webhooks]] url`.
    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.server.addr)
    }

    /// The next request gets `a` (scripted answers go first, in order).
    pub fn push(&self, a: Answer) {
        self.server
            .shared
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(a);
    }

    /// From now, every request is answered `status` for `d` (then 200 again).
    pub fn fail_for(&self, d: Duration, status: u16) {
        *self
            .server
            .shared
            .fail_until
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((Instant::now() + d, status));
    }

    pub fn record(&self) -> WebhookRecord {
        self.server.shared.record.snapshot()
    }

    /// Waits up to `limit` until `pred` holds; panics with the record's summary after.
    pub async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        mut pred: impl FnMut(&WebhookRecord) -> bool,
    ) -> WebhookRecord {
        match self
            .server
            .shared
            .record
            .wait_within(limit, |r| pred(r))
            .await
        {
            Some(r) => r,
            None => {
                let r = self.record();
                let answered: Vec<u16> = r.deliveries.iter().map(|d| d.answered).collect();
                panic!(
                    "timed out after {limit:?} waiting until {what}: {} requests, {} distinct ids, \
                     {} acknowledged; answers: {answered:?}",
                    r.deliveries.len(),
                    r.ids().len(),
                    r.acknowledged_ids().len()
                )
            }
        }
    }
}
