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
//! (what `patterd wire` and the doctor's credential check ask): `GET /v2/balance`; `GET /v2/phone_numbers` filtered by
//! `filter[phone_number]` (digits only: anything else matches nothing) and `PATCH
//! /v2/phone_numbers/{id}` (only the updatable fields); `GET`/`PATCH
//! /v2/call_control_applications/{id}`, whose update must carry `application_name` and
//! `webhook_event_url` (422 otherwise). The numbers and applications are [`TelnyxAccount`].

mod rest;

use std::time::Duration;

use serde_json::{Value, json};

use super::stream::{Dialect, SimCall, SimCallConfig};
use super::twilio::{WebhookResponse, new_sid};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

pub use rest::{FakeTelnyxRest, TelnyxAccount, TelnyxCommand, TelnyxRestRecord};

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
        self.post_signed_to("/telnyx/webhook", body, signature, timestamp)
            .await
    }

    /// `body` as a messaging profile's webhook would carry an inbound message (`message.received`).
    pub fn message_received(&self, message_id: &str, from: &str, to: &str, text: &str) -> String {
        envelope_json(
            "message.received",
            &new_sid("")[..32],
            json!({"record_type": "message", "direction": "inbound", "id": message_id,
                   "type": "SMS", "messaging_profile_id": "400174d6-a5e1-4e25-b6ee-000000000001",
                   "from": {"phone_number": from, "carrier": "T-MOBILE USA, INC.",
                            "line_type": "Wireless"},
                   "to": [{"phone_number": to, "status": "webhook_delivered",
                           "carrier": "TELNYX LLC", "line_type": "VoIP"}],
                   "cc": [], "text": text, "media": [], "encoding": "GSM-7", "parts": 1}),
            &format!("{}/telnyx/sms", self.public_url),
        )
    }

    /// An inbound text message: posts `message.received` to `/telnyx/sms`, signed now, with a
    /// fresh message id. Returns the id and patterd's answer.
    pub async fn incoming_sms(
        &self,
        from: &str,
        to: &str,
        text: &str,
    ) -> Result<(String, WebhookResponse), reqwest::Error> {
        let id = crate::stream::new_uuid();
        let body = self.message_received(&id, from, to, text);
        let ts = Self::now();
        let sig = sign_webhook(&self.seed, ts, body.as_bytes()).unwrap_or_default();
        let r = self
            .post_signed_to("/telnyx/sms", &body, Some(&sig), Some(&ts.to_string()))
            .await?;
        Ok((id, r))
    }

    /// Posts `body` to `path` with caller-chosen signature headers.
    pub async fn post_signed_to(
        &self,
        path: &str,
        body: &str,
        signature: Option<&str>,
        timestamp: Option<&str>,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base_url))
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
    /// with `amd` a `call.machine.detection.ended` carrying that result; then waits for
    /// patterd's `streaming_start` and opens the media socket — or, when patterd hangs up
    /// instead (a machine it has nothing to say to), returns `None`.
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
        }
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            rest.wait_until("streaming_start or hangup", |r| {
                r.commands.iter().any(|c| {
                    matches!(c.action.as_str(), "streaming_start" | "hangup")
                        && c.call_control_id == id
                })
            }),
        )
        .await
        .map_err(|_| format!("patterd sent no streaming_start for {id}"))?;
        if !stream
            .commands
            .iter()
            .any(|c| c.action == "streaming_start" && c.call_control_id == id)
        {
            return Ok(None);
        }
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

    /// `call.machine.greeting.ended` (`answering_machine_detection: detect_beep` heard the
    /// beep) with `result` (`beep_detected`, `ended`, `not_sure`).
    pub async fn greeting_ended(
        &self,
        call_control_id: &str,
        result: &str,
    ) -> Result<WebhookResponse, reqwest::Error> {
        let body = self.event(
            "call.machine.greeting.ended",
            call_control_id,
            json!({"result": result}),
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
