//! Helpers every carrier's routes share: the public URLs carriers call (and sign), reading
//! form fields and headers, and the decision
//! on a call we placed when the carrier says it was answered (a machine gets the voicemail
//! message and the call ends, a person gets the media stream), with the outcome recorded;
//! a new call's busy refusal, which in a cluster hands the webhook to a ready peer; and the
//! answer to an inbound text message's webhook.

use hyper::body::Incoming;
use hyper::{Request, Response};
use tracing::info;

use super::dial::{CallOutcome, Machine, OutboundCall, Phase, StatusUpdate};
use super::messaging::SmsReceipt;
use super::port::{Arrived, GuardUnavailable, Host, Refusal};
use crate::net::http::{Body, read_body};

/// The answer to a text message's webhook once the host has it: `stored` (the carrier's
/// acknowledgement) for a stored or repeated message, 503 while the replay guard cannot be
/// asked (the carrier retries; nothing was stored).
pub(crate) fn sms_answer(
    receipt: Result<SmsReceipt, GuardUnavailable>,
    stored: impl FnOnce() -> Response<Body>,
) -> Response<Body> {
    match receipt {
        Ok(_) => stored(),
        Err(e) => {
            tracing::warn!(error = %e, "text message refused for now (the carrier retries)");
            crate::net::http::text(503, "the replay guard is unavailable; try again\n")
        }
    }
}

/// Reads a webhook's body (up to `limit` bytes), keeping the request as it arrived so it can
/// be handed to a peer. `Err` is the response to send.
pub(crate) async fn arrive(
    req: Request<Incoming>,
    limit: usize,
) -> Result<Arrived, Response<Body>> {
    let (parts, body) = req.into_parts();
    let body = read_body(body, limit).await.map_err(|e| e.response())?;
    Ok(Arrived {
        method: parts.method,
        uri: parts.uri,
        headers: parts.headers,
        body,
        seen: None,
    })
}

/// The answer to a new call refused with `refusal`: a busy refusal (draining, `max_calls`)
/// is handed to a ready peer when there is one ([`Host::hand_off`]) and answered with the
/// peer's response; otherwise, and for every other refusal, `refused`.
pub(crate) async fn refused_or_handed(
    host: &dyn Host,
    refusal: Refusal,
    webhook: Arrived,
    refused: Response<Body>,
) -> Response<Body> {
    if matches!(refusal, Refusal::Draining | Refusal::Full)
        && let Some(answer) = host.hand_off(refusal, webhook).await
    {
        return answer;
    }
    refused
}

/// Splits a public base URL into `scheme://authority` and a path prefix without trailing `/`.
fn split_base(public_url: &str) -> (&str, &str) {
    let base = public_url.trim_end_matches('/');
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    match base[after_scheme..].find('/') {
        Some(i) => base.split_at(after_scheme + i),
        None => (base, ""),
    }
}

/// Rebuilds the URL a carrier requested (and signed): `public_url` (scheme, host, optional port and
/// path prefix) + the request `path` + `?raw_query` exactly as received. A prefix in
/// `public_url` is added unless `path` already starts with it (a proxy that does not strip
/// it). Slashes are never doubled.
pub fn public_request_url(public_url: &str, path: &str, raw_query: Option<&str>) -> String {
    let (origin, prefix) = split_base(public_url);
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let has_prefix =
        !prefix.is_empty() && (path == prefix || path.starts_with(&format!("{prefix}/")));
    let mut url = String::with_capacity(origin.len() + prefix.len() + path.len() + 16);
    url.push_str(origin);
    if !has_prefix {
        url.push_str(prefix);
    }
    url.push_str(&path);
    if let Some(q) = raw_query.filter(|q| !q.is_empty()) {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// The WebSocket URL for `path` under `public_url`: `https` → `wss`, `http` → `ws`.
pub fn public_ws_url(public_url: &str, path: &str) -> String {
    let url = public_request_url(public_url, path, None);
    if let Some(rest) = url.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = url.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        url
    }
}

/// The non-empty, trimmed value of form field `name`.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The value of form field `name`, or `""`.
pub(crate) fn field_or_empty<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// A request header as a string.
pub fn header(headers: &hyper::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What to answer a carrier that says a call we placed was picked up.
pub enum Answer {
    /// Not a live outbound call of ours: hang up.
    NotOurs,
    /// A machine without anything to say to it (no voicemail message, or a fax): hang up.
    HangUp,
    /// Connect the media stream with this token (a person, or a machine the call leaves its
    /// voicemail message on).
    Connect(String),
}

/// Decides on an answered outbound call and records the outcome. `machine` is the carrier's
/// verdict (`None`: a person); `answered_by(machine, call)` what to record as who answered.
pub fn answer_outbound(
    host: &dyn Host,
    call_id: &str,
    machine: Option<Machine>,
    answered_by: impl FnOnce(bool, &OutboundCall) -> Option<String>,
) -> Answer {
    let (Some(_), Some(call)) = (
        host.live_call_account(call_id),
        host.outbound().live(call_id),
    ) else {
        return Answer::NotOurs;
    };
    if let Some(machine) = machine.filter(|_| call.machine_detection) {
        let by = answered_by(true, &call);
        return if reached_machine(host, call_id, &call, machine, by) {
            Answer::Connect(host.mint_token(call_id))
        } else {
            Answer::HangUp
        };
    }
    host.report(StatusUpdate::outcome(
        call_id,
        CallOutcome::Answered,
        answered_by(false, &call),
    ));
    host.outbound()
        .set_phase(call_id, super::dial::Phase::Connected);
    Answer::Connect(host.mint_token(call_id))
}

/// Machine detection heard a machine on our call `call_id`: the outcome is `voicemail`. A
/// voice machine on a call with a voicemail message gets the call's media (true: connect it;
/// the call waits for the greeting's end and leaves the message in the agent's voice);
/// anything else ends the call (false: hang up).
pub(crate) fn reached_machine(
    host: &dyn Host,
    call_id: &str,
    call: &OutboundCall,
    machine: Machine,
    answered_by: Option<String>,
) -> bool {
    info!(call_id, ?machine, "outbound call reached a machine");
    host.report(StatusUpdate::outcome(
        call_id,
        CallOutcome::Voicemail,
        answered_by,
    ));
    let message = call
        .voicemail_message
        .as_deref()
        .filter(|_| machine != Machine::Fax);
    if let Some(message) = message
        && host.machine_answered(call_id, message, machine)
    {
        host.outbound().set_phase(call_id, Phase::Voicemail);
        return true;
    }
    host.outbound().set_phase(call_id, Phase::Ended);
    host.end_call(call_id, "voicemail");
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::carrier::CarrierKind;
    use crate::carrier::dial::Outbound;
    use crate::carrier::port::{Counter, IncomingCall, MediaSocket, Refusal};
    use std::sync::{Arc, Mutex};

    /// A host with one live call and a record of what carriers report.
    #[derive(Default)]
    struct FakeHost {
        outbound: Outbound,
        live: Mutex<Vec<String>>,
        reports: Mutex<Vec<StatusUpdate>>,
        machines: Mutex<Vec<(String, String, Machine)>>,
    }

    impl Host for FakeHost {
        fn public_url(&self) -> &str {
            "https://voice.example.com"
        }
        fn max_body_bytes(&self) -> usize {
            1024
        }
        fn count(&self, _: Counter) {}
        fn admit<'a>(&'a self, _: IncomingCall<'a>) -> crate::carrier::port::Admission<'a> {
            Box::pin(std::future::ready(Err(Refusal::Draining)))
        }
        fn first_seen(
            &self,
            _: &'static str,
            _: &str,
            _: std::time::Duration,
        ) -> crate::carrier::port::Pending<
            'static,
            Result<bool, crate::carrier::port::GuardUnavailable>,
        > {
            Box::pin(std::future::ready(Ok(true)))
        }
        fn mint_token(&self, call_id: &str) -> String {
            format!("token-{call_id}")
        }
        fn live_call_account(&self, call_id: &str) -> Option<String> {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.iter()
                .any(|c| c == call_id)
                .then(|| "acct".to_string())
        }
        fn end_call(&self, call_id: &str, _: &str) -> bool {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let before = live.len();
            live.retain(|c| c != call_id);
            live.len() < before
        }
        fn machine_answered(&self, call_id: &str, message: &str, machine: Machine) -> bool {
            if self.live_call_account(call_id).is_none() {
                return false;
            }
            self.machines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((call_id.into(), message.into(), machine));
            true
        }
        fn outbound(&self) -> &Outbound {
            &self.outbound
        }
        fn report(&self, update: StatusUpdate) {
            self.reports
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(update);
        }
        fn accept_media(
            self: Arc<Self>,
            _: hyper::Request<hyper::body::Incoming>,
            _: MediaSocket,
        ) -> hyper::Response<crate::net::http::Body> {
            crate::net::http::empty(500)
        }
    }

    fn host_with(call_id: &str, machine_detection: bool, message: Option<&str>) -> FakeHost {
        let host = FakeHost::default();
        host.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call_id.to_string());
        host.outbound.register(
            call_id,
            OutboundCall {
                account: "acct".into(),
                kind: CarrierKind::Twilio,
                machine_detection,
                voicemail_message: message.map(str::to_string),
                leg_id: None,
                phase: Phase::Ringing,
            },
        );
        host
    }

    fn by(machine: bool, _: &OutboundCall) -> Option<String> {
        Some(if machine { "machine" } else { "human" }.into())
    }

    fn reports(host: &FakeHost) -> Vec<StatusUpdate> {
        host.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A machine on a call with a voicemail message gets the media stream and the call is
    /// told to leave the message; the outcome is `voicemail`.
    #[test]
    fn a_machine_gets_the_stream_and_the_call_leaves_the_message() {
        let host = host_with("CA1", true, Some("Call me back"));
        match answer_outbound(&host, "CA1", Some(Machine::Greeting), by) {
            Answer::Connect(token) => assert_eq!(token, "token-CA1"),
            _ => panic!("a machine with a message to leave gets the stream"),
        }
        assert!(host.live_call_account("CA1").is_some(), "the call goes on");
        assert_eq!(
            host.machines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            vec![("CA1".into(), "Call me back".into(), Machine::Greeting)]
        );
        assert_eq!(
            host.outbound.live("CA1").map(|c| c.phase),
            Some(Phase::Voicemail)
        );
        assert_eq!(
            reports(&host),
            vec![StatusUpdate::outcome(
                "CA1",
                CallOutcome::Voicemail,
                Some("machine".into())
            )]
        );
    }

    /// Without a message, or for a fax, a machine is hung up on (outcome `voicemail`).
    #[test]
    fn a_machine_without_a_message_or_a_fax_is_hung_up_on() {
        for (id, message, machine) in [
            ("CA1", None, Machine::Greeting),
            ("CA2", Some("Call me back"), Machine::Fax),
        ] {
            let host = host_with(id, true, message);
            assert!(matches!(
                answer_outbound(&host, id, Some(machine), by),
                Answer::HangUp
            ));
            assert!(host.live_call_account(id).is_none(), "the actor is ended");
            assert!(
                host.machines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty()
            );
            assert_eq!(reports(&host)[0].outcome, Some(CallOutcome::Voicemail));
        }
    }

    #[test]
    fn a_person_gets_the_stream() {
        let host = host_with("CA3", true, Some("Call me back"));
        match answer_outbound(&host, "CA3", None, by) {
            Answer::Connect(token) => assert_eq!(token, "token-CA3"),
            _ => panic!("connect"),
        }
        assert_eq!(reports(&host)[0].outcome, Some(CallOutcome::Answered));
        // Without machine detection a machine is treated as a person.
        let host = host_with("CA2", false, Some("Call me back"));
        match answer_outbound(&host, "CA2", Some(Machine::Greeting), by) {
            Answer::Connect(token) => assert_eq!(token, "token-CA2"),
            _ => panic!("connect"),
        }
        assert!(
            host.machines
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        );
        assert_eq!(
            host.outbound.live("CA2").map(|c| c.phase),
            Some(Phase::Connected)
        );
        assert!(matches!(
            answer_outbound(&host, "CAnot-ours", None, by),
            Answer::NotOurs
        ));
    }

    #[test]
    fn rebuilds_public_urls() {
        let f = public_request_url;
        assert_eq!(
            f("https://gw.example.com", "/twilio/voice", None),
            "https://gw.example.com/twilio/voice"
        );
        assert_eq!(
            f("https://gw.example.com/", "/twilio/voice", Some("")),
            "https://gw.example.com/twilio/voice"
        );
        assert_eq!(
            f(
                "https://gw.example.com/pd/",
                "/twilio/voice",
                Some("a=1&b=2")
            ),
            "https://gw.example.com/pd/twilio/voice?a=1&b=2"
        );
        assert_eq!(
            f("https://gw.example.com/pd", "/pd/twilio/voice", None),
            "https://gw.example.com/pd/twilio/voice"
        );
        assert_eq!(
            f("https://gw.example.com/pd", "/pdx/voice", None),
            "https://gw.example.com/pd/pdx/voice"
        );
        assert_eq!(f("http://h:8080", "x", None), "http://h:8080/x");
        assert_eq!(
            public_ws_url("https://gw.example.com/pd", "/twilio/media"),
            "wss://gw.example.com/pd/twilio/media"
        );
        assert_eq!(
            public_ws_url("http://127.0.0.1:9", "/m"),
            "ws://127.0.0.1:9/m"
        );
    }
}
