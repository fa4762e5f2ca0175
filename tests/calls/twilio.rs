//! Twilio-only call scenarios (everything that runs the same over every carrier lives in the
//! carrier matrix, `carriers.rs`): the filler on Hermes' tool progress, the apology
//! when the brain fails, a flood of garbage frames, the tokenized TwiML answer, the maximum
//! call duration and a media socket that drops. The Twilio simulator signs the webhook and
//! speaks Media Streams; patterd talks to fake Deepgram, ElevenLabs and Hermes. (The filler for
//! a slow brain is timed on the paused clock: `src/call/driver/tests.rs`.)

use crate::common::*;
use patterd_sim::hermes::{HermesReply, HermesStep};

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
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
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

/// [`brain_failure_is_apologised_for`] a reply stream that is only `step`.
async fn brain_stream_fails_with(step: HermesStep) {
    brain_failure_is_apologised_for(Some(HermesReply::Stream(vec![step])), None).await;
}

#[tokio::test]
async fn hermes_500_speaks_the_error_message() {
    brain_failure_is_apologised_for(Some(HermesReply::http(500, "boom: internal error")), None)
        .await;
}

#[tokio::test]
async fn hermes_error_finish_speaks_the_error_message_not_the_error() {
    brain_stream_fails_with(HermesStep::FinishError(
        "boom: the model provider failed".into(),
    ))
    .await;
}

#[tokio::test]
async fn hermes_in_stream_error_speaks_the_error_message() {
    brain_stream_fails_with(HermesStep::StreamError("boom".into())).await;
}

#[tokio::test]
async fn hermes_down_speaks_the_error_message() {
    // A port nothing listens on: bind, note the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // It may be a restart: the turn is retried for brain_retry_s (2 s here) with the hold
    // line, and only then apologised for.
    let stack = Stack::start(Opts {
        llm_base_url: Some(format!("http://127.0.0.1:{port}/v1")),
        agent_extra: "brain_retry_s = 2".into(),
        ..Opts::default()
    })
    .await;
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("the apology", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .unwrap();
    assert_eq!(
        stack.spoken(),
        vec![
            GREETING.to_string(),
            FILLER.to_string(),
            LLM_ERROR.to_string()
        ]
    );
    assert!(!sim.state().is_closed(), "the call goes on");
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    assert_eq!(rec.events_of("llm_error").count(), 1);
    let retried: Vec<u64> = rec.events_of("llm_retry").map(|e| e.t_ms).collect();
    let apology = rec
        .events_of("llm_error")
        .map(|e| e.t_ms)
        .next()
        .unwrap_or(0);
    assert!(retried.len() >= 3, "{retried:?}");
    let spent = apology - retried[0];
    assert!(
        (2000..2600).contains(&spent),
        "apologised {spent} ms after the first failure"
    );
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
    // The carrier's leg of the broken call is hung up too, through its REST API.
    stack
        .ended_and_hung_up(&bad_sid, "media stream closed")
        .await;
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
    stack
        .ended_and_hung_up(&call_sid, "maximum call duration reached")
        .await;
}

#[tokio::test]
async fn a_media_socket_that_drops_without_stop_gets_the_call_hung_up() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    drop(sim); // the TCP connection goes away: no `stop`, no close frame
    let reqs = stack
        .ended_and_hung_up(&call_sid, "media stream closed")
        .await;
    assert!(
        reqs[0]
            .form()
            .contains(&("Status".to_string(), "completed".to_string()))
    );
}
