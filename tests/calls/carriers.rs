//! The conversation scenarios run over all three carriers with the same assertions: each
//! carrier's simulator signs its own webhooks, speaks its own media dialect (Twilio Media
//! Streams, Telnyx Call Control streaming with frames out of order, Plivo audio streams with
//! `audio.drachtio.org`), and patterd behind them talks to the same fake Deepgram, ElevenLabs
//! and Hermes. A scenario is an `async fn(Carrier)`; `carrier_tests!` makes one test per
//! carrier of it.

use std::collections::BTreeMap;

use crate::common::carrier::{Carrier, Carriers};
use crate::common::*;
use patterd::call::Speaker;
use patterd_sim::hermes::{HermesReply, HermesStep};
use patterd_sim::plivo::PlivoAnswer;
use patterd_sim::stream::{ClosedBy, Dialect, SimCall, SimCallConfig, TimelineEvent};
use patterd_sim::twilio::WebhookResponse;
use patterd_sim::twilio::xml::parse_twiml;
use patterd_sim::vonage::{SimVonage, VonageAnswer};

macro_rules! carrier_tests {
    ($($name:ident),* $(,)?) => {
        mod twilio { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Twilio).await } )* }
        mod telnyx { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Telnyx).await } )* }
        mod plivo { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Plivo).await } )* }
        mod vonage { $( #[tokio::test] async fn $name() { super::$name(super::Carrier::Vonage).await } )* }
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
    if c == Carrier::Twilio {
        // The hang-up is the first (and only) request to Twilio's REST API.
        let reqs = stack.rest.requests();
        assert_eq!(reqs[0].call_sid(), Some(call_id.as_str()));
        assert!(
            reqs[0]
                .form()
                .contains(&("Status".to_string(), "completed".to_string()))
        );
    }
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
    assert!(s.first_agent_audio_ms.is_some(), "{c:?}");
    assert!(
        s.protocol_errors.is_empty(),
        "{c:?}: {:?}",
        s.protocol_errors
    );
    assert_eq!(stack.spoken()[0], GREETING);

    // Turn 1.
    speak(&sim, 700);
    let rec = stack
        .hermes
        .wait_until("first turn", |r| r.requests.len() == 1)
        .await;
    let r1 = &rec.requests[0];
    // Hermes' charset keeps `[A-Za-z0-9._-]`: Telnyx's `v3:…` becomes `patter-call-v3-…`.
    let session = patterd::provider::openai::session_id(&call_id);
    assert!(session.starts_with("patter-call-"));
    if c == Carrier::Twilio {
        assert_eq!(session, format!("patter-call-{call_id}"));
    }
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
    assert_eq!(r1.body["user"], session.as_str());
    assert_eq!(r1.body["stream"], true);
    assert_eq!(
        r1.messages(),
        vec![
            ("system".to_string(), SYSTEM_PROMPT.to_string()),
            ("user".to_string(), "I would like a table".to_string()),
        ]
    );
    // The reply is spoken: two sentences, each followed by a mark that comes back.
    sim.wait_for("reply marks", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .expect("reply audio and marks");

    // Turn 2: same session, only the new caller message.
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
    assert_eq!(
        r2.messages(),
        vec![
            ("system".to_string(), SYSTEM_PROMPT.to_string()),
            ("user".to_string(), "for two people".to_string()),
        ]
    );
    sim.wait_for("second reply mark", WAIT, |s| s.marks_echoed.len() >= 4)
        .await
        .expect("second reply");

    let spoken = stack.spoken();
    assert!(spoken.contains(&"Sure.".to_string()), "{spoken:?}");
    assert!(
        spoken.contains(&"What day works for you?".to_string()),
        "{spoken:?}"
    );
    assert!(
        spoken.contains(&"Great, two people it is.".to_string()),
        "{spoken:?}"
    );
    let el = stack.el.record();
    assert!(el.requests.iter().all(|r| {
        r.query
            .iter()
            .any(|(k, v)| k == "output_format" && v == "ulaw_8000")
    }));

    // Deepgram got μ-law 8 kHz straight through.
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
    assert!(!record.from_masked.contains("7654321") || record.from_masked.ends_with("4321"));
    assert_eq!(record.from_masked, "+1555***4321");
    // The caller hung up: patterd must not also hang up through the REST API.
    assert!(
        stack.rest_hang_ups(c).is_empty(),
        "{c:?}: caller hung up, not us"
    );
    assert!(
        sim.state().protocol_errors.is_empty(),
        "{:?}",
        sim.state().protocol_errors
    );
    // Nothing left running for the call: Deepgram got CloseStream.
    stack
        .dg
        .wait_until("deepgram closed", |r| {
            r.connections
                .iter()
                .all(|c| c.close_streams > 0 || c.closed.is_some())
        })
        .await;
    let first_frame_us: u64 = record
        .events_of("greeting_first_frame")
        .next()
        .expect("greeting first frame event")
        .detail
        .parse()
        .expect("micros");
    assert!(
        first_frame_us < 1_000_000,
        "{c:?}: greeting took {first_frame_us} µs"
    );
    // Reported, not asserted:
    // `cargo test --release --test calls greeting_then_two_turns -- --nocapture`.
    let replies: Vec<&str> = record
        .events_of("reply_first_frame")
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(replies.len(), 2, "{c:?}: one first reply frame per turn");
    eprintln!(
        "{c:?}: start → greeting first frame: {first_frame_us} µs; STT final → first reply frame: {replies:?} µs"
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
            let params = patterd_sim::twilio::voice_webhook_params(
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
                patterd_sim::twilio::SimTwilio::new(&stack.base, PUBLIC_URL, ACCOUNT_SID, "wrong");
            refused.push((
                "wrong key",
                wrong.post_form("/twilio/voice", &params).await.unwrap(),
            ));
            // Signed over another URL (public_url mismatch).
            let other = patterd_sim::twilio::SimTwilio::new(
                &stack.base,
                "https://attacker.example",
                ACCOUNT_SID,
                AUTH_TOKEN,
            );
            refused.push((
                "other url",
                other.post_form("/twilio/voice", &params).await.unwrap(),
            ));
            // Tampered parameters after signing.
            let sig = patterd_sim::twilio::sign_request(
                AUTH_TOKEN,
                &format!("{PUBLIC_URL}/twilio/voice"),
                &params,
            );
            let mut tampered = params.clone();
            for (k, v) in tampered.iter_mut() {
                if k == "From" {
                    *v = "+15550009999".into();
                }
            }
            refused.push((
                "tampered",
                stack
                    .twilio
                    .post_form_with_signature("/twilio/voice", &tampered, &sig)
                    .await
                    .unwrap(),
            ));
            // Status callbacks are signed too (refused; the body is not checked).
            let r = stack
                .twilio
                .post_form_with_signature("/twilio/status", &params, "forged")
                .await
                .unwrap();
            assert_eq!(r.status, 403, "status callback");
        }
        Carrier::Telnyx => {
            let body = stack.telnyx.initiated("v3:forged", CALLER, TELNYX_NUMBER);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let sign = |seed: &[u8; 32], ts: u64, b: &str| {
                patterd_sim::telnyx::sign_webhook(seed, ts, b.as_bytes()).unwrap()
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
            let params = patterd_sim::plivo::answer_params(
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
            let wrong = patterd_sim::plivo::SimPlivo::new(&stack.base, PUBLIC_URL, "wrong");
            refused.push((
                "wrong key",
                wrong.post("/plivo/answer", &params).await.unwrap(),
            ));
            let other = patterd_sim::plivo::SimPlivo::new(
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
        Carrier::Vonage => vonage_forgeries(&stack, &mut refused).await,
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
    assert!(stack.vonage_rest.record().requests.is_empty());
    // A correctly signed one goes through.
    let (_, r) = stack.ring_via(c, CALLER, c.number()).await;
    assert_eq!(r.status, 200, "{c:?}: {r:?}");
    if c == Carrier::Twilio {
        assert!(r.body.contains("<Connect><Stream"), "{}", r.body);
    }
}

async fn media_socket_with_bad_token_is_closed_before_any_provider(c: Carrier) {
    let stack = Stack::start(Opts::default()).await;
    let tokens = &stack.server.app.tokens;
    let call = match c {
        Carrier::Twilio => "CA22222222222222222222222222222222",
        Carrier::Telnyx => "v3:bad-token-call",
        Carrier::Plivo => "5b9a3a5e-0000-4000-8000-000000002222",
        Carrier::Vonage => "63f61863-0000-4000-8000-000000002222",
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
    let (call_id, sim, twiml) = if c == Carrier::Twilio {
        let (call_sid, resp) = stack.ring_from(CALLER).await;
        let answer = parse_twiml(&resp.body).expect("TwiML parses");
        let sim = stack.open(&call_sid, &answer).await;
        (call_sid, sim, Some(answer))
    } else {
        let (call_id, sim) = stack.call_via(c).await;
        (call_id, sim, None)
    };
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
    if let Some(answer) = &twiml {
        // The very TwiML answer the real call used (its token redeemed), opened again.
        let again = stack.open(&call_id, answer).await;
        let close = again.wait_closed(WAIT).await.expect("reused token closed");
        assert_eq!(close.code, Some(1008));
    }
    assert_eq!(
        stack.dg.record().connections.len(),
        1,
        "only the real call's STT"
    );
    // The real call is unaffected.
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
            Carrier::Vonage => {
                // Vonage has no busy or reject answer: an empty NCCO ends the call.
                let a = VonageAnswer::parse(&r.body).expect("ncco");
                assert!(a.websocket_uri.is_none());
                format!("hangup:{}", a.actions.join(","))
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
            (Carrier::Vonage, _) => "hangup:".into(),
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
    // Draining: busy as well, and /readyz goes 503.
    stack.server.app.start_drain();
    let ready = reqwest::get(format!("{}/readyz", stack.base))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
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
    let mut expected_bad = 5;
    if c == Carrier::Twilio {
        // Twilio-shaped frames that are still wrong: a bad payload or no payload on a frame
        // with a streamSid, an unknown event, and a payload far over any frame's size.
        sim.send_raw(r#"{"event":"media","streamSid":"MZ1","media":{"payload":"!!!not base64"}}"#);
        sim.send_raw(r#"{"event":"surprise","streamSid":"MZ1"}"#);
        sim.send_raw(r#"{"event":"media"}"#);
        sim.send_raw(&format!(
            r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
            "A".repeat(70_000)
        ));
        expected_bad += 4;
    }
    speak(&sim, 600);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    assert!(!sim.state().is_closed(), "{c:?}");
    sim.hang_up().await;
    stack.finished(&call_id).await;
    let bad = stack.metric(|m| &m.media_frames_bad);
    assert_eq!(bad, expected_bad, "{c:?}");
}

/// Vonage webhooks that must be refused: no token, a token signed with another secret, a
/// body changed under its `payload_hash`, a stale `iat`, a replayed `jti`, and a forged event.
async fn vonage_forgeries(stack: &Stack, refused: &mut Vec<(&'static str, WebhookResponse)>) {
    use patterd_sim::vonage::{sign_webhook, webhook_claims};
    let body = SimVonage::answer_body(
        "63f61863-0000-4000-8000-00000000f0f0",
        CALLER,
        VONAGE_NUMBER,
    )
    .to_string();
    let post = |raw: String, auth: Option<String>| async move {
        stack
            .vonage
            .post_with("/vonage/answer", &raw, auth.as_deref())
            .await
            .unwrap()
    };
    let bearer = |secret: &str, claims: &serde_json::Value| {
        format!("Bearer {}", sign_webhook(secret, claims))
    };
    refused.push(("missing", post(body.clone(), None).await));
    refused.push((
        "forged",
        post(body.clone(), Some("Bearer not.a.jwt".into())).await,
    ));
    let claims = webhook_claims(body.as_bytes());
    refused.push((
        "wrong key",
        post(body.clone(), Some(bearer("wrong", &claims))).await,
    ));
    let tampered = body.replace(&CALLER[1..], "15550009999");
    refused.push((
        "tampered",
        post(tampered, Some(bearer(VONAGE_SIGNATURE_SECRET, &claims))).await,
    ));
    let mut stale = claims.clone();
    stale["iat"] = serde_json::json!(stale["iat"].as_u64().unwrap_or(0) - 3600);
    refused.push((
        "stale",
        post(body.clone(), Some(bearer(VONAGE_SIGNATURE_SECRET, &stale))).await,
    ));
    // A good event webhook once; the same token again is a replay.
    let event =
        serde_json::json!({"uuid": "63f61863-0000-4000-8000-00000000f0f1", "status": "ringing"})
            .to_string();
    let token = bearer(VONAGE_SIGNATURE_SECRET, &webhook_claims(event.as_bytes()));
    let first = stack
        .vonage
        .post_with("/vonage/event", &event, Some(&token))
        .await
        .unwrap();
    assert_eq!(first.status, 204, "{first:?}");
    refused.push((
        "replayed",
        stack
            .vonage
            .post_with("/vonage/event", &event, Some(&token))
            .await
            .unwrap(),
    ));
    refused.push((
        "event forged",
        stack
            .vonage
            .post_with("/vonage/event", &event, None)
            .await
            .unwrap(),
    ));
}
