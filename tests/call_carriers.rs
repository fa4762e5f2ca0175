//! The conversation scenarios run over all three carriers with the same assertions: each
//! carrier's simulator signs its own webhooks, speaks its own media dialect (Twilio Media
//! Streams, Telnyx Call Control streaming with frames out of order, Plivo audio streams with
//! `audio.drachtio.org`), and patterd behind them talks to the same fake Deepgram, ElevenLabs
//! and Hermes. A scenario is an `async fn(Carrier)`; `carrier_tests!` makes one test per
//! carrier of it.

mod common;

use std::collections::BTreeMap;

use common::*;
use patterd::call::Speaker;
use patterd::sim::hermes::{HermesReply, HermesStep};
use patterd::sim::plivo::PlivoAnswer;
use patterd::sim::stream::{ClosedBy, Dialect, SimCall, SimCallConfig, TimelineEvent};
use patterd::sim::twilio::WebhookResponse;
use patterd::sim::twilio::xml::parse_twiml;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    Twilio,
    Telnyx,
    Plivo,
}

impl Carrier {
    fn number(self) -> &'static str {
        match self {
            Carrier::Twilio => OUR_NUMBER,
            Carrier::Telnyx => TELNYX_NUMBER,
            Carrier::Plivo => PLIVO_NUMBER,
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Carrier::Twilio => Dialect::Twilio,
            Carrier::Telnyx => Dialect::Telnyx,
            Carrier::Plivo => Dialect::PlivoMulaw,
        }
    }

    /// The media socket URL patterd would hand out for `call_id` with `token`.
    fn media_url(self, call_id: &str, token: Option<&str>) -> String {
        match (self, token) {
            (Carrier::Twilio, _) => "wss://voice.example.test/twilio/media".to_string(),
            (Carrier::Telnyx, Some(t)) => format!("wss://voice.example.test/telnyx/media/{t}"),
            (Carrier::Telnyx, None) => "wss://voice.example.test/telnyx/media/".to_string(),
            (Carrier::Plivo, Some(t)) => {
                format!("wss://voice.example.test/plivo/media/{call_id}?t={t}")
            }
            (Carrier::Plivo, None) => format!("wss://voice.example.test/plivo/media/{call_id}"),
        }
    }
}

/// Carrier-specific views of a stack.
trait Carriers {
    async fn call_via(&self, c: Carrier) -> (String, SimCall);
    async fn ring_via(&self, c: Carrier, from: &str, to: &str) -> (String, WebhookResponse);
    fn rest_hang_ups(&self, c: Carrier) -> Vec<String>;
    /// Waits for `call_id` to be hung up through carrier `c`'s REST API (no polling).
    async fn wait_rest_hang_up(&self, c: Carrier, call_id: &str);
    async fn open_raw(
        &self,
        c: Carrier,
        call_id: &str,
        token: Option<&str>,
    ) -> Result<SimCall, String>;
}

impl Carriers for Stack {
    async fn call_via(&self, c: Carrier) -> (String, SimCall) {
        match c {
            Carrier::Twilio => self.call().await,
            Carrier::Telnyx => self
                .telnyx
                .place_call(&self.telnyx_rest, &self.ws_base(), CALLER, TELNYX_NUMBER)
                .await
                .expect("telnyx call"),
            Carrier::Plivo => {
                let (uuid, r) = self.ring_via(c, CALLER, PLIVO_NUMBER).await;
                assert_eq!(r.status, 200, "{r:?}");
                let answer = PlivoAnswer::parse(&r.body).expect("plivo xml");
                let sim = self
                    .plivo
                    .open_stream(&answer, &self.ws_base(), &uuid)
                    .await
                    .expect("plivo stream opens");
                (uuid, sim)
            }
        }
    }

    async fn ring_via(&self, c: Carrier, from: &str, to: &str) -> (String, WebhookResponse) {
        match c {
            Carrier::Twilio => self.twilio.incoming_call("/twilio/voice", from, to).await,
            Carrier::Telnyx => self.telnyx.incoming_call(from, to).await,
            Carrier::Plivo => self.plivo.incoming_call(from, to).await,
        }
        .expect("webhook request")
    }

    fn rest_hang_ups(&self, c: Carrier) -> Vec<String> {
        match c {
            Carrier::Twilio => self.rest.hung_up(),
            Carrier::Telnyx => self.telnyx_rest.hung_up(),
            Carrier::Plivo => self.plivo_rest.hung_up(),
        }
    }

    async fn wait_rest_hang_up(&self, c: Carrier, call_id: &str) {
        let hung_up = |ids: Vec<String>| ids.iter().any(|i| i == call_id);
        match c {
            Carrier::Twilio => {
                if let Err(seen) = self.rest.wait_for_hang_up(call_id, WAIT).await {
                    panic!("no REST hang-up for {call_id}: {seen:?}");
                }
            }
            Carrier::Telnyx => {
                self.telnyx_rest
                    .wait_until("REST hang-up", |r| hung_up(r.hung_up()))
                    .await;
            }
            Carrier::Plivo => {
                self.plivo_rest
                    .wait_until("REST hang-up", |r| hung_up(r.hung_up()))
                    .await;
            }
        }
    }

    async fn open_raw(
        &self,
        c: Carrier,
        call_id: &str,
        token: Option<&str>,
    ) -> Result<SimCall, String> {
        let mut params = BTreeMap::new();
        if let (Carrier::Twilio, Some(t)) = (c, token) {
            params.insert("token".to_string(), t.to_string());
        }
        let cfg =
            SimCallConfig::new(&self.ws_base(), ACCOUNT_SID, call_id).with_dialect(c.dialect());
        SimCall::connect(&c.media_url(call_id, token), &params, cfg)
            .await
            .map_err(|e| e.to_string())
    }
}

macro_rules! carrier_tests {
    ($($name:ident),* $(,)?) => {
        mod twilio { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Twilio).await } )* }
        mod telnyx { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Telnyx).await } )* }
        mod plivo { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Plivo).await } )* }
    };
}

carrier_tests!(
    greeting_then_two_turns_with_one_hermes_session,
    barge_in_sends_the_carriers_own_clear,
    dtmf_reaches_the_brain_as_text,
    caller_hanging_up_mid_reply_cancels_everything,
    forged_signatures_get_403_and_nothing_else,
    media_socket_with_bad_token_is_closed_before_any_provider,
    routing_rejects_with_the_carriers_own_refusal,
    agent_hang_up_goes_through_the_carriers_rest_api,
    malformed_frames_do_not_end_the_call,
);

async fn agent_hang_up_goes_through_the_carriers_rest_api(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    let (call_id, sim) = stack.call_via(c).await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    let handle = stack.server.app.calls.get(&call_id).expect("live call");
    handle.hang_up("operator").unwrap();
    let close = sim.wait_closed(WAIT).await.unwrap();
    assert_eq!(close.code, Some(1000), "{c:?}");
    let rec = stack.finished(&call_id).await;
    assert_eq!(rec.ended_reason, "hung up: operator");
    stack.wait_rest_hang_up(c, &call_id).await;
    assert_eq!(stack.rest_hang_ups(c), vec![call_id.clone()], "{c:?}");
}

async fn greeting_then_two_turns_with_one_hermes_session(c: Carrier) {
    let stack = Stack::start(Opts {
        transcripts: vec!["I would like a table".into(), "for two people".into()],
        ..Opts::default()
    })
    .await;
    stack
        .hermes
        .push(HermesReply::text("Sure. What day works for you?"));
    stack
        .hermes
        .push(HermesReply::text("Great, two people it is."));
    let (call_id, sim) = stack.call_via(c).await;

    let s = sim
        .wait_for("greeting audio and its mark", WAIT, |s| {
            s.agent_audio_bytes > 0 && !s.marks_echoed.is_empty()
        })
        .await
        .expect("greeting");
    assert!(
        s.protocol_errors.is_empty(),
        "{c:?}: {:?}",
        s.protocol_errors
    );
    assert_eq!(stack.spoken()[0], GREETING);

    speak(&sim, 700);
    let rec = stack
        .hermes
        .wait_until("first turn", |r| r.requests.len() == 1)
        .await;
    let r1 = &rec.requests[0];
    // Hermes' charset keeps `[A-Za-z0-9._-]`: Telnyx's `v3:…` becomes `patter-call-v3-…`.
    let session = patterd::provider::openai::session_id(&call_id);
    assert!(session.starts_with("patter-call-"));
    assert_eq!(r1.header("X-Hermes-Session-Id"), Some(session.as_str()));
    assert_eq!(
        r1.header("Authorization"),
        Some(format!("Bearer {HERMES_KEY}").as_str())
    );
    // The caller's memory key does not depend on how the carrier spells the number.
    let key = r1
        .header("X-Hermes-Session-Key")
        .expect("session key")
        .to_string();
    assert!(
        key.starts_with("patter-caller-") && key.len() == 14 + 16,
        "{key}"
    );
    assert_eq!(
        r1.messages(),
        vec![
            ("system".to_string(), SYSTEM_PROMPT.to_string()),
            ("user".to_string(), "I would like a table".to_string()),
        ]
    );
    sim.wait_for("reply marks", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .expect("reply audio and marks");

    speak(&sim, 700);
    let rec = stack
        .hermes
        .wait_until("second turn", |r| r.requests.len() == 2)
        .await;
    let r2 = &rec.requests[1];
    assert_eq!(r2.header("X-Hermes-Session-Id"), Some(session.as_str()));
    assert_eq!(r2.header("X-Hermes-Session-Key"), Some(key.as_str()));
    assert_eq!(
        r2.messages().last().map(|m| m.1.clone()),
        Some("for two people".to_string())
    );
    sim.wait_for("second reply mark", WAIT, |s| s.marks_echoed.len() >= 4)
        .await
        .expect("second reply");

    let dg = stack.dg.record();
    assert_eq!(dg.connections.len(), 1);
    assert_eq!(dg.connections[0].param("encoding"), Some("mulaw"));
    assert_eq!(dg.connections[0].param("sample_rate"), Some("8000"));

    sim.hang_up().await;
    let record = stack.finished(&call_id).await;
    assert_eq!(record.ended_reason, "caller hung up", "{c:?}");
    let who: Vec<(Speaker, &str)> = record
        .transcript
        .iter()
        .map(|e| (e.speaker, e.heard_text.as_str()))
        .collect();
    assert_eq!(
        who,
        vec![
            (Speaker::Agent, GREETING),
            (Speaker::Caller, "I would like a table"),
            (Speaker::Agent, "Sure. What day works for you?"),
            (Speaker::Caller, "for two people"),
            (Speaker::Agent, "Great, two people it is."),
        ]
    );
    assert_eq!(record.from_masked, "+1555***4321");
    assert!(
        stack.rest_hang_ups(c).is_empty(),
        "{c:?}: caller hung up, not us"
    );
    assert!(
        sim.state().protocol_errors.is_empty(),
        "{:?}",
        sim.state().protocol_errors
    );
}

async fn barge_in_sends_the_carriers_own_clear(c: Carrier) {
    let stack = Stack::start(Opts {
        transcripts: vec!["tell me everything".into(), "stop please".into()],
        ..Opts::default()
    })
    .await;
    let long = "This is the first of many sentences. ".repeat(12);
    stack.hermes.push(HermesReply::text(long.trim()));
    stack.hermes.push(HermesReply::text("Okay."));
    let (call_id, sim) = stack.call_via(c).await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&sim, 600);
    // The long reply is playing: audio queued at the carrier.
    sim.wait_for("reply playing", WAIT, |s| {
        s.utterances.len() >= 2 && s.playback_queued_bytes > 1600
    })
    .await
    .expect("reply playing");
    // The caller talks over it and finishes a turn.
    speak(&sim, 600);
    let s = sim
        .wait_for("the carrier's clear", WAIT, |s| !s.clears.is_empty())
        .await
        .expect("clear");
    // `clears` only counts frames valid in this carrier's dialect (a Twilio `clear` sent to
    // Plivo would be a protocol error, not a clear).
    assert!(
        s.protocol_errors.is_empty(),
        "{c:?}: {:?}",
        s.protocol_errors
    );
    assert!(
        s.timeline
            .iter()
            .any(|e| e.event == TimelineEvent::ReceivedClear)
    );
    assert!(s.utterances.iter().any(|u| u.cleared), "{c:?}");
    // The conversation goes on: the next reply plays and is acknowledged.
    let acked = s.marks_echoed.len();
    stack
        .hermes
        .wait_until("second turn", |r| r.requests.len() == 2)
        .await;
    sim.wait_for("next reply acknowledged", WAIT, |s| {
        s.marks_echoed.len() > acked
    })
    .await
    .expect("next reply");
    if c == Carrier::Plivo {
        // Plivo never acknowledges a cleared checkpoint; nothing waited on it.
        let received: Vec<&String> = s.marks_received.iter().map(|(_, n)| n).collect();
        let echoed = s.echoed_mark_names();
        assert!(received.len() > echoed.len(), "{received:?} vs {echoed:?}");
    }
    sim.hang_up().await;
    stack.finished(&call_id).await;
}

async fn dtmf_reaches_the_brain_as_text(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    let (call_id, sim) = stack.call_via(c).await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    sim.send_dtmf('5');
    let rec = stack
        .hermes
        .wait_until("dtmf turn", |r| r.requests.len() == 1)
        .await;
    assert_eq!(
        rec.requests[0].messages().last().map(|m| m.1.clone()),
        Some("The caller pressed 5.".to_string())
    );
    sim.hang_up().await;
    stack.finished(&call_id).await;
}

async fn caller_hanging_up_mid_reply_cancels_everything(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    stack.hermes.push(HermesReply::Stream(vec![
        HermesStep::Text("This is a long answer. ".into()),
        HermesStep::Delay(std::time::Duration::from_secs(20)),
        HermesStep::Text("It never gets here.".into()),
    ]));
    let (call_id, sim) = stack.call_via(c).await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    stack
        .el
        .wait_until("reply synthesis", |r| {
            r.requests
                .iter()
                .any(|q| q.text == "This is a long answer.")
        })
        .await;
    sim.hang_up().await;
    let rec = stack.finished(&call_id).await;
    assert_eq!(rec.ended_reason, "caller hung up", "{c:?}");
    stack
        .hermes
        .wait_until("hermes request cancelled", |r| {
            r.requests.len() == 1 && r.requests[0].disconnected
        })
        .await;
    assert!(stack.server.app.calls.is_empty());
    assert!(stack.rest_hang_ups(c).is_empty());
    stack
        .dg
        .wait_until("deepgram closed", |r| {
            r.connections.iter().all(|c| c.closed.is_some())
        })
        .await;
}

async fn forged_signatures_get_403_and_nothing_else(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    let mut refused: Vec<(&str, WebhookResponse)> = Vec::new();
    match c {
        Carrier::Twilio => {
            let params = patterd::sim::twilio::voice_webhook_params(
                ACCOUNT_SID,
                "CA11111111111111111111111111111111",
                CALLER,
                OUR_NUMBER,
            );
            for (what, sig) in [("missing", ""), ("forged", "bm90IGEgc2lnbmF0dXJl")] {
                let r = stack
                    .twilio
                    .post_form_with_signature("/twilio/voice", &params, sig)
                    .await
                    .unwrap();
                refused.push((what, r));
            }
            let wrong =
                patterd::sim::twilio::SimTwilio::new(&stack.base, PUBLIC_URL, ACCOUNT_SID, "wrong");
            refused.push((
                "wrong key",
                wrong.post_form("/twilio/voice", &params).await.unwrap(),
            ));
        }
        Carrier::Telnyx => {
            let body = stack.telnyx.initiated("v3:forged", CALLER, TELNYX_NUMBER);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let sign = |seed: &[u8; 32], ts: u64, b: &str| {
                patterd::carrier::telnyx::signature::sign_webhook(seed, ts, b.as_bytes()).unwrap()
            };
            let ok_sig = sign(&telnyx_seed(), now, &body);
            let t = now.to_string();
            refused.push((
                "missing",
                stack.telnyx.post_signed(&body, None, None).await.unwrap(),
            ));
            refused.push((
                "no timestamp",
                stack
                    .telnyx
                    .post_signed(&body, Some(&ok_sig), None)
                    .await
                    .unwrap(),
            ));
            refused.push((
                "forged",
                stack
                    .telnyx
                    .post_signed(&body, Some("bm90IGEgc2lnbmF0dXJl"), Some(&t))
                    .await
                    .unwrap(),
            ));
            let other = sign(&[9u8; 32], now, &body);
            refused.push((
                "wrong key",
                stack
                    .telnyx
                    .post_signed(&body, Some(&other), Some(&t))
                    .await
                    .unwrap(),
            ));
            let old = now - 301;
            let stale = sign(&telnyx_seed(), old, &body);
            refused.push((
                "stale",
                stack
                    .telnyx
                    .post_signed(&body, Some(&stale), Some(&old.to_string()))
                    .await
                    .unwrap(),
            ));
            let tampered = body.replace(CALLER, "+15550009999");
            refused.push((
                "tampered",
                stack
                    .telnyx
                    .post_signed(&tampered, Some(&ok_sig), Some(&t))
                    .await
                    .unwrap(),
            ));
        }
        Carrier::Plivo => {
            let params = patterd::sim::plivo::answer_params(
                "5b9a3a5e-0000-4000-8000-00000000f0f0",
                CALLER,
                PLIVO_NUMBER,
            );
            refused.push((
                "missing",
                stack
                    .plivo
                    .post_with("/plivo/answer", &params, &[])
                    .await
                    .unwrap(),
            ));
            refused.push((
                "forged",
                stack
                    .plivo
                    .post_with(
                        "/plivo/answer",
                        &params,
                        &[
                            ("X-Plivo-Signature-V3", "bm90IGEgc2lnbmF0dXJl"),
                            ("X-Plivo-Signature-V3-Nonce", "12345"),
                        ],
                    )
                    .await
                    .unwrap(),
            ));
            let wrong = patterd::sim::plivo::SimPlivo::new(&stack.base, PUBLIC_URL, "wrong");
            refused.push((
                "wrong key",
                wrong.post("/plivo/answer", &params).await.unwrap(),
            ));
            let other = patterd::sim::plivo::SimPlivo::new(
                &stack.base,
                "https://attacker.example",
                PLIVO_AUTH_TOKEN,
            );
            refused.push((
                "other url",
                other.post("/plivo/answer", &params).await.unwrap(),
            ));
            refused.push((
                "hangup forged",
                stack
                    .plivo
                    .post_with("/plivo/hangup", &params, &[])
                    .await
                    .unwrap(),
            ));
        }
    }
    for (what, r) in &refused {
        assert_eq!((r.status, r.body.as_str()), (403, ""), "{c:?} {what}");
    }
    // Nothing happened: no call, no provider, no carrier command.
    assert!(stack.server.app.calls.is_empty());
    assert!(stack.dg.record().connections.is_empty());
    assert!(stack.el.record().requests.is_empty());
    assert!(stack.hermes.record().requests.is_empty());
    assert!(stack.telnyx_rest.record().commands.is_empty());
    assert!(stack.plivo_rest.record().requests.is_empty());
    // A correctly signed one goes through.
    let (_, r) = stack.ring_via(c, CALLER, c.number()).await;
    assert_eq!(r.status, 200, "{c:?}: {r:?}");
}

async fn media_socket_with_bad_token_is_closed_before_any_provider(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    let tokens = &stack.server.app.tokens;
    let call = match c {
        Carrier::Twilio => "CA22222222222222222222222222222222",
        Carrier::Telnyx => "v3:bad-token-call",
        Carrier::Plivo => "5b9a3a5e-0000-4000-8000-000000002222",
    };
    let cases = vec![
        ("missing", None),
        (
            "forged",
            Some(
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                    .to_string(),
            ),
        ),
        ("other call", Some(tokens.mint("some-other-call"))),
        ("expired", Some(tokens.mint_with_expiry(call, 1))),
    ];
    for (what, token) in cases {
        match stack.open_raw(c, call, token.as_deref()).await {
            Ok(sim) => {
                let close = sim.wait_closed(WAIT).await.expect(what);
                assert_eq!(close.by, ClosedBy::Server, "{c:?} {what}");
                assert_eq!(close.code, Some(1008), "{c:?} {what}");
            }
            // Telnyx carries the token as the path: without one there is no route. Telnyx and
            // Plivo carry it in the URL, which is checked before the upgrade: 401/403, never a
            // socket (the token of another call passes that check, then fails at `start`).
            Err(e) => assert!(
                (c == Carrier::Telnyx && what == "missing")
                    || (c != Carrier::Twilio
                        && what != "other call"
                        && (e.contains("401") || e.contains("403"))),
                "{c:?} {what}: {e}"
            ),
        }
    }
    assert!(stack.dg.record().connections.is_empty());
    assert!(stack.el.record().requests.is_empty());

    // Reuse: a real call redeems its token; the same URL/token again is refused.
    let (call_id, sim) = stack.call_via(c).await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    let reopened = if c == Carrier::Telnyx {
        // The exact stream_url patterd gave Telnyx, opened a second time.
        let url = stack
            .telnyx_rest
            .record()
            .ok("streaming_start")
            .iter()
            .find(|s| s.call_control_id == call_id)
            .and_then(|s| s.body["stream_url"].as_str().map(str::to_string))
            .expect("stream_url");
        let cfg = SimCallConfig::new(&stack.ws_base(), ACCOUNT_SID, &call_id)
            .with_dialect(Dialect::Telnyx);
        SimCall::connect(&url, &BTreeMap::new(), cfg)
            .await
            .map_err(|e| e.to_string())
    } else {
        // The call's one token (minting again gives the same), redeemed once already.
        let t = stack.server.app.tokens.mint(&call_id);
        assert!(
            stack.server.app.tokens.redeem(&call_id, Some(&t)).is_err(),
            "a used token redeems again"
        );
        stack.open_raw(c, &call_id, Some(&t)).await
    };
    match reopened {
        Ok(reopened) => {
            let close = reopened
                .wait_closed(WAIT)
                .await
                .expect("reused token closed");
            assert_eq!(close.code, Some(1008), "{c:?}");
        }
        // A URL token is refused before the upgrade.
        Err(e) => assert!(c != Carrier::Twilio && e.contains("403"), "{c:?}: {e}"),
    }
    assert_eq!(
        stack.dg.record().connections.len(),
        1,
        "only the real call's STT"
    );
    assert!(!sim.state().is_closed());
}

async fn routing_rejects_with_the_carriers_own_refusal(c: Carrier) {
    let stack = Stack::start(Opts {
        allowed_callers: vec![CALLER.to_string()],
        max_calls: 1,
        ..Opts::default()
    })
    .await;
    // What the carrier was told for: unknown number, disallowed caller, busy, draining.
    async fn refusal(stack: &Stack, c: Carrier, from: &str, to: &str) -> String {
        let (id, r) = stack.ring_via(c, from, to).await;
        assert_eq!(r.status, 200, "{c:?}: {r:?}");
        match c {
            Carrier::Twilio => {
                let a = parse_twiml(&r.body).expect("twiml");
                format!("reject:{}", a.reject.expect("reject"))
            }
            Carrier::Plivo => {
                let a = PlivoAnswer::parse(&r.body).expect("xml");
                assert!(a.stream_url.is_none());
                format!("hangup:{}", a.hangup.expect("hangup"))
            }
            Carrier::Telnyx => {
                let rec = stack
                    .telnyx_rest
                    .wait_until("reject", |r| {
                        r.commands.iter().any(|k| k.call_control_id == id)
                    })
                    .await;
                let cmd = rec
                    .commands
                    .iter()
                    .find(|k| k.call_control_id == id)
                    .expect("cmd");
                assert_eq!(cmd.action, "reject");
                format!("reject:{}", cmd.body["cause"].as_str().unwrap_or(""))
            }
        }
    }
    let expect = |kind: &str| -> String {
        match (c, kind) {
            (Carrier::Twilio, "unknown") => "reject:".into(),
            (Carrier::Twilio, "caller") => "reject:rejected".into(),
            (Carrier::Twilio, _) => "reject:busy".into(),
            (Carrier::Plivo, "unknown") => "hangup:".into(),
            (Carrier::Plivo, "caller") => "hangup:rejected".into(),
            (Carrier::Plivo, _) => "hangup:busy".into(),
            (Carrier::Telnyx, "busy") => "reject:USER_BUSY".into(),
            (Carrier::Telnyx, _) => "reject:CALL_REJECTED".into(),
        }
    };
    assert_eq!(
        refusal(&stack, c, CALLER, "+15550009999").await,
        expect("unknown")
    );
    assert_eq!(
        refusal(&stack, c, "+15551112222", c.number()).await,
        expect("caller")
    );
    assert!(stack.dg.record().connections.is_empty());
    let (_id, _sim) = stack.call_via(c).await;
    assert_eq!(refusal(&stack, c, CALLER, c.number()).await, expect("busy"));
    stack.server.app.start_drain();
    assert_eq!(refusal(&stack, c, CALLER, c.number()).await, expect("busy"));
}

async fn malformed_frames_do_not_end_the_call(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    let (call_id, sim) = stack.call_via(c).await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    sim.send_raw("this is not json");
    sim.send_raw(r#"{"event":"media","media":{"payload":"!!!not base64"}}"#);
    sim.send_raw(r#"{"event":"surprise"}"#);
    sim.send_raw(r#"{"event":"dtmf","dtmf":{"digit":"xyz"}}"#);
    sim.send_raw(r#"{"event":"start","start":7}"#);
    speak(&sim, 600);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    assert!(!sim.state().is_closed(), "{c:?}");
    sim.hang_up().await;
    stack.finished(&call_id).await;
    let bad = stack
        .server
        .app
        .metrics
        .media_frames_bad
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(bad, 5, "{c:?}");
}

#[tokio::test]
async fn unconfigured_telnyx_and_plivo_answer_503() {
    let text = config_text(
        &Opts::default(),
        "ws://127.0.0.1:9",
        "http://127.0.0.1:9",
        "http://127.0.0.1:9/v1",
        "http://127.0.0.1:9",
        "",
    );
    let loaded = patterd::config::load_str_with_vars(&text, "test.toml", &[]).expect("loads");
    let server = patterd::server::bind(loaded.config).await.expect("binds");
    let base = format!("http://{}", server.local_addr);
    let client = reqwest::Client::new();
    for (method, path) in [
        ("POST", "/telnyx/webhook"),
        ("GET", "/telnyx/media/abc"),
        ("POST", "/plivo/answer"),
        ("POST", "/plivo/hangup"),
        ("GET", "/plivo/media/abc?t=x"),
    ] {
        let req = match method {
            "POST" => client.post(format!("{base}{path}")).body("{}"),
            _ => client.get(format!("{base}{path}")),
        };
        let r = req.send().await.expect("request");
        assert_eq!(r.status().as_u16(), 503, "{method} {path}");
    }
}

#[tokio::test]
async fn a_replayed_telnyx_webhook_is_handled_once() {
    let stack = Stack::start(Opts::default()).await;
    let body = stack
        .telnyx
        .initiated("v3:replayed-call", CALLER, TELNYX_NUMBER);
    for _ in 0..3 {
        let r = stack.telnyx.post(&body).await.expect("post");
        assert_eq!(r.status, 200);
    }
    // Admission (and so whether an answer is sent) is decided before each webhook is
    // answered: after three 200s, one call was accepted and only it spawned an answer.
    let accepted = stack
        .server
        .app
        .metrics
        .calls_accepted
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(accepted, 1);
    assert_eq!(stack.server.app.calls.len(), 1);
    stack
        .telnyx_rest
        .wait_until("answer", |r| !r.ok("answer").is_empty())
        .await;
    assert_eq!(stack.telnyx_rest.record().commands.len(), 1);
}
