//! Whole calls through the real wire protocols on 127.0.0.1: the Twilio simulator signs the
//! webhook and speaks Media Streams; patterd talks to fake Deepgram, ElevenLabs and Hermes.


use crate::common::*;
use patterd::call::Speaker;
use patterd_sim::hermes::{HermesReply, HermesStep};

#[tokio::test]
async fn greeting_then_two_turns_with_one_hermes_session() {
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

    let (call_sid, sim) = stack.call().await;

    // The greeting plays at start and its mark comes back.
    let s = sim
        .wait_for("greeting audio and its mark", WAIT, |s| {
            s.agent_audio_bytes > 0 && !s.marks_echoed.is_empty()
        })
        .await
        .expect("greeting");
    assert!(s.first_agent_audio_ms.is_some());
    assert!(s.protocol_errors.is_empty(), "{:?}", s.protocol_errors);
    assert_eq!(stack.spoken()[0], GREETING);

    // Turn 1.
    speak(&sim, 700);
    let rec = stack
        .hermes
        .wait_until("first turn", |r| r.requests.len() == 1)
        .await;
    let r1 = &rec.requests[0];
    let session = format!("patter-call-{call_sid}");
    assert_eq!(r1.header("X-Hermes-Session-Id"), Some(session.as_str()));
    assert_eq!(
        r1.header("Authorization"),
        Some(format!("Bearer {HERMES_KEY}").as_str())
    );
    assert!(
        r1.header("X-Hermes-Session-Key")
            .is_some_and(|k| k.starts_with("patter-caller-") && k.len() == 14 + 16)
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
    let record = stack.finished(&call_sid).await;
    assert_eq!(record.ended_reason, "caller hung up");
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
    assert!(stack.rest.hung_up().is_empty());
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
        "greeting took {first_frame_us} µs"
    );
    // Reported, not asserted: `cargo test --release --test calls twilio::greeting -- --nocapture`.
    let replies: Vec<&str> = record
        .events_of("reply_first_frame")
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(replies.len(), 2, "one first reply frame per turn");
    eprintln!(
        "start → greeting first frame: {first_frame_us} µs; STT final → first reply frame: {replies:?} µs"
    );
}

#[tokio::test]
async fn forged_missing_and_wrong_key_signatures_get_403_and_nothing_else() {
    let stack = Stack::start(Opts::default()).await;
    let params = patterd_sim::twilio::voice_webhook_params(
        ACCOUNT_SID,
        "CA11111111111111111111111111111111",
        CALLER,
        OUR_NUMBER,
    );
    // Missing signature.
    let r = stack
        .twilio
        .post_form_with_signature("/twilio/voice", &params, "")
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, ""));
    // Forged signature.
    let r = stack
        .twilio
        .post_form_with_signature("/twilio/voice", &params, "bm90IGEgc2lnbmF0dXJl")
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, ""));
    // Signed with the wrong auth token.
    let wrong = patterd_sim::twilio::SimTwilio::new(&stack.base, PUBLIC_URL, ACCOUNT_SID, "wrong");
    let r = wrong.post_form("/twilio/voice", &params).await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, ""));
    // Signed over another URL (public_url mismatch).
    let other = patterd_sim::twilio::SimTwilio::new(
        &stack.base,
        "https://attacker.example",
        ACCOUNT_SID,
        AUTH_TOKEN,
    );
    let r = other.post_form("/twilio/voice", &params).await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, ""));
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
    let r = stack
        .twilio
        .post_form_with_signature("/twilio/voice", &tampered, &sig)
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (403, ""));
    // Status callbacks are signed too.
    let r = stack
        .twilio
        .post_form_with_signature("/twilio/status", &params, "forged")
        .await
        .unwrap();
    assert_eq!(r.status, 403);

    // Nothing happened: no call, no provider connection.
    assert!(stack.server.app.calls.is_empty());
    assert!(stack.dg.record().connections.is_empty());
    assert!(stack.el.record().requests.is_empty());
    assert!(stack.hermes.record().requests.is_empty());
    // And a correctly signed one goes through.
    let r = stack
        .twilio
        .post_form("/twilio/voice", &params)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.contains("<Connect><Stream"), "{}", r.body);
}

#[tokio::test]
async fn media_socket_with_bad_token_is_closed_before_any_provider() {
    use patterd_sim::twilio::call::{ClosedBy, SimCall, SimCallConfig};
    use std::collections::BTreeMap;
    let stack = Stack::start(Opts::default()).await;
    let url = "wss://voice.example.test/twilio/media".to_string();
    let open = |call_sid: &str, token: Option<String>| {
        let mut params = BTreeMap::new();
        if let Some(t) = token {
            params.insert("token".to_string(), t);
        }
        let cfg = SimCallConfig::new(&stack.ws_base(), ACCOUNT_SID, call_sid);
        let url = url.clone();
        async move {
            SimCall::connect(&url, &params, cfg)
                .await
                .expect("socket opens")
        }
    };
    let tokens = &stack.server.app.tokens;
    let cases = vec![
        ("missing", None),
        (
            "forged",
            Some(
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                    .to_string(),
            ),
        ),
        (
            "other call",
            Some(tokens.mint("CA99999999999999999999999999999999")),
        ),
        (
            "expired",
            Some(tokens.mint_with_expiry("CA22222222222222222222222222222222", 1)),
        ),
    ];
    for (what, token) in cases {
        let sim = open("CA22222222222222222222222222222222", token).await;
        let close = sim.wait_closed(WAIT).await.expect(what);
        assert_eq!(close.by, ClosedBy::Server, "{what}");
        assert_eq!(close.code, Some(1008), "{what}");
    }
    assert!(stack.dg.record().connections.is_empty());
    assert!(stack.el.record().requests.is_empty());

    // Reuse: a real call redeems its token; the same token again is refused.
    let (call_sid, resp) = stack.ring_from(CALLER).await;
    let answer = patterd_sim::twilio::xml::parse_twiml(&resp.body).unwrap();
    let sim = stack.open(&call_sid, &answer).await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    let again = stack.open(&call_sid, &answer).await;
    let close = again.wait_closed(WAIT).await.expect("reused token closed");
    assert_eq!(close.code, Some(1008));
    assert_eq!(
        stack.dg.record().connections.len(),
        1,
        "only the real call's STT"
    );
    // The real call is unaffected.
    assert!(!sim.state().is_closed());
}

#[tokio::test]
async fn slow_hermes_gets_one_filler_then_the_reply() {
    let stack = Stack::start(Opts {
        long_turn_after_s: 0.3,
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::Stream(vec![
        HermesStep::KeepAlive,
        HermesStep::Delay(std::time::Duration::from_millis(700)),
        HermesStep::KeepAlive,
        HermesStep::Delay(std::time::Duration::from_millis(700)),
        HermesStep::Text("Here is your answer.".into()),
    ]));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("filler and reply marks", WAIT, |s| {
        s.marks_echoed.len() >= 3
    })
    .await
    .unwrap();
    let spoken = stack.spoken();
    assert_eq!(
        spoken,
        vec![
            GREETING.to_string(),
            FILLER.to_string(),
            "Here is your answer.".to_string()
        ]
    );
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.events_of("filler").count(), 1);
}

#[tokio::test]
async fn tool_progress_triggers_the_filler_early_and_only_once() {
    let stack = Stack::start(Opts {
        long_turn_after_s: 30.0,
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::Stream(vec![
        HermesStep::ToolStarted {
            tool: "calendar".into(),
            label: "Checking the calendar".into(),
        },
        HermesStep::Delay(std::time::Duration::from_millis(300)),
        HermesStep::ToolStarted {
            tool: "calendar".into(),
            label: "Still checking".into(),
        },
        HermesStep::ToolCompleted {
            tool: "calendar".into(),
        },
        HermesStep::Delay(std::time::Duration::from_millis(300)),
        HermesStep::Text("\n\nYou are booked.".into()),
    ]));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("filler and reply", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .unwrap();
    assert_eq!(
        stack.spoken(),
        vec![
            GREETING.to_string(),
            FILLER.to_string(),
            "You are booked.".to_string()
        ]
    );
    sim.hang_up().await;
    stack.finished(&call_sid).await;
}

async fn brain_failure_is_apologised_for(reply: Option<HermesReply>, llm_base_url: Option<String>) {
    let stack = Stack::start(Opts {
        llm_base_url,
        ..Opts::default()
    })
    .await;
    if let Some(r) = reply {
        stack.hermes.push(r);
    }
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("apology mark", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    let spoken = stack.spoken();
    assert_eq!(spoken, vec![GREETING.to_string(), LLM_ERROR.to_string()]);
    for t in &spoken {
        assert!(!t.to_lowercase().contains("boom"), "error text spoken: {t}");
    }
    // The call goes on: the next turn works (when the brain is reachable at all).
    assert!(!sim.state().is_closed());
    if stack.hermes.record().requests.len() == 1 {
        speak(&sim, 600);
        sim.wait_for("second reply", WAIT, |s| s.marks_echoed.len() >= 3)
            .await
            .unwrap();
        assert!(
            stack.spoken()[2].starts_with("You said"),
            "{:?}",
            stack.spoken()
        );
    }
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.events_of("llm_error").count(), 1);
}

#[tokio::test]
async fn hermes_500_speaks_the_error_message() {
    brain_failure_is_apologised_for(Some(HermesReply::http(500, "boom: internal error")), None)
        .await;
}

#[tokio::test]
async fn hermes_error_finish_speaks_the_error_message_not_the_error() {
    brain_failure_is_apologised_for(
        Some(HermesReply::Stream(vec![HermesStep::FinishError(
            "boom: the model provider failed".into(),
        )])),
        None,
    )
    .await;
}

#[tokio::test]
async fn hermes_in_stream_error_speaks_the_error_message() {
    brain_failure_is_apologised_for(
        Some(HermesReply::Stream(vec![HermesStep::StreamError(
            "boom".into(),
        )])),
        None,
    )
    .await;
}

#[tokio::test]
async fn hermes_down_speaks_the_error_message() {
    // A port nothing listens on: bind, note the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    brain_failure_is_apologised_for(None, Some(format!("http://127.0.0.1:{port}/v1"))).await;
}

#[tokio::test]
async fn caller_hanging_up_mid_reply_cancels_everything() {
    let stack = Stack::start(Opts::default()).await;
    stack.hermes.push(HermesReply::Stream(vec![
        HermesStep::Text("This is a long answer. ".into()),
        HermesStep::Delay(std::time::Duration::from_secs(20)),
        HermesStep::Text("It never gets here.".into()),
    ]));
    let (call_sid, sim) = stack.call().await;
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
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.ended_reason, "caller hung up");
    // Hermes saw the client go away mid-stream.
    stack
        .hermes
        .wait_until("hermes request cancelled", |r| {
            r.requests.len() == 1 && r.requests[0].disconnected
        })
        .await;
    assert!(stack.server.app.calls.is_empty());
    assert!(stack.rest.hung_up().is_empty());
    stack
        .dg
        .wait_until("deepgram closed", |r| {
            r.connections.iter().all(|c| c.closed.is_some())
        })
        .await;
}

#[tokio::test]
async fn malformed_frames_do_not_end_the_call() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    sim.send_raw("this is not json");
    sim.send_raw(r#"{"event":"media","streamSid":"MZ1","media":{"payload":"!!!not base64"}}"#);
    sim.send_raw(r#"{"event":"surprise","streamSid":"MZ1"}"#);
    sim.send_raw(r#"{"event":"media"}"#);
    sim.send_raw(&format!(
        r#"{{"event":"media","media":{{"payload":"{}"}}}}"#,
        "A".repeat(70_000)
    ));
    speak(&sim, 600);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    assert!(!sim.state().is_closed());
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    let m = stack
        .server
        .app
        .metrics
        .media_frames_bad
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(m, 5);
}

#[tokio::test]
async fn a_flood_of_garbage_ends_that_call_only() {
    let stack = Stack::start(Opts::default()).await;
    let (good_sid, good) = stack.call().await;
    let (bad_sid, bad) = stack.call().await;
    for _ in 0..200 {
        bad.send_raw("garbage");
    }
    let close = bad.wait_closed(WAIT).await.expect("garbage call closed");
    assert_eq!(close.code, Some(1008));
    let rec = stack.finished(&bad_sid).await;
    assert_eq!(rec.ended_reason, "media stream closed");
    // The carrier's leg of the broken call is hung up too, through its REST API.
    let reqs = stack
        .rest
        .wait_for_requests(1, WAIT)
        .await
        .expect("REST hang-up");
    assert_eq!(reqs[0].call_sid(), Some(bad_sid.as_str()));
    // The other call carries on.
    good.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&good, 600);
    good.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    assert!(stack.server.app.calls.get(&good_sid).is_some());
}

#[tokio::test]
async fn dtmf_reaches_the_brain_as_text() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call().await;
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
    stack.finished(&call_sid).await;
}

#[tokio::test]
async fn agent_hang_up_ends_the_call_through_the_rest_api() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    let handle = stack.server.app.calls.get(&call_sid).expect("live call");
    handle.hang_up("operator").unwrap();
    let close = sim.wait_closed(WAIT).await.unwrap();
    assert_eq!(close.code, Some(1000));
    let reqs = stack
        .rest
        .wait_for_requests(1, WAIT)
        .await
        .expect("REST hang-up");
    assert_eq!(reqs[0].call_sid(), Some(call_sid.as_str()));
    assert!(
        reqs[0]
            .form()
            .contains(&("Status".to_string(), "completed".to_string()))
    );
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.ended_reason, "hung up: operator");
}

#[tokio::test]
async fn routing_rejects_unknown_numbers_disallowed_callers_and_busy() {
    let stack = Stack::start(Opts {
        allowed_callers: vec![CALLER.to_string()],
        max_calls: 1,
        ..Opts::default()
    })
    .await;
    // Unknown number.
    let (_, r) = stack
        .twilio
        .incoming_call("/twilio/voice", CALLER, "+15550009999")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.body.contains("<Reject/>") || r.body.contains("<Reject />"),
        "{}",
        r.body
    );
    // Caller not allowed.
    let (_, r) = stack.ring_from("+15551112222").await;
    assert!(
        r.body.contains(r#"<Reject reason="rejected""#),
        "{}",
        r.body
    );
    assert!(stack.dg.record().connections.is_empty());
    // One call fills max_calls; the next is busy.
    let (_sid, _sim) = stack.call().await;
    let (_, r) = stack.ring_from(CALLER).await;
    assert!(r.body.contains(r#"<Reject reason="busy""#), "{}", r.body);
    // Draining: busy as well, and /readyz goes 503.
    stack.server.app.start_drain();
    let ready = reqwest::get(format!("{}/readyz", stack.base))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let (_, r) = stack.ring_from(CALLER).await;
    assert!(r.body.contains(r#"<Reject reason="busy""#), "{}", r.body);
}

#[tokio::test]
async fn twiml_answer_carries_a_tokenized_stream() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, r) = stack.ring_from(CALLER).await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.as_deref().is_some_and(|c| c.contains("xml")));
    let answer = patterd_sim::twilio::xml::parse_twiml(&r.body).unwrap();
    assert_eq!(
        answer.stream_url.as_deref(),
        Some("wss://voice.example.test/twilio/media")
    );
    let token = answer.parameters.get("token").expect("token parameter");
    // The token is bound to this call: it does not redeem for another one, but does for this.
    let tokens = &stack.server.app.tokens;
    assert!(
        tokens
            .redeem("CA00000000000000000000000000000000", Some(token))
            .is_err()
    );
    assert!(tokens.redeem(&call_sid, Some(token)).is_ok());
    // The STT socket was opened while the phone rang.
    stack
        .dg
        .wait_until("pre-opened deepgram", |r| r.connections.len() == 1)
        .await;
    // A call whose media never connects is torn down (here: by the carrier's status callback).
    let params = vec![
        ("CallSid".to_string(), call_sid.clone()),
        ("AccountSid".to_string(), ACCOUNT_SID.to_string()),
        ("CallStatus".to_string(), "canceled".to_string()),
    ];
    let r = stack
        .twilio
        .post_form("/twilio/status", &params)
        .await
        .unwrap();
    assert!(r.status < 300);
    stack.finished(&call_sid).await;
}

#[tokio::test]
async fn a_call_ends_at_its_maximum_duration() {
    let stack = Stack::start(Opts {
        max_duration_s: 1,
        ..Opts::default()
    })
    .await;
    let (call_sid, sim) = stack.call().await;
    let close = sim.wait_closed(WAIT).await.expect("closed by patterd");
    assert_eq!(close.code, Some(1000));
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.ended_reason, "maximum call duration reached");
    let reqs = stack
        .rest
        .wait_for_requests(1, WAIT)
        .await
        .expect("REST hang-up");
    assert_eq!(reqs[0].call_sid(), Some(call_sid.as_str()));
}

#[tokio::test]
async fn a_media_socket_that_drops_without_stop_gets_the_call_hung_up() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    drop(sim); // the TCP connection goes away: no `stop`, no close frame
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.ended_reason, "media stream closed");
    let reqs = stack
        .rest
        .wait_for_requests(1, WAIT)
        .await
        .expect("REST hang-up");
    assert_eq!(reqs[0].call_sid(), Some(call_sid.as_str()));
    assert!(
        reqs[0]
            .form()
            .contains(&("Status".to_string(), "completed".to_string()))
    );
}
