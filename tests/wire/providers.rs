//! Drives each real provider client against its in-repo fake: Deepgram (audio in, transcripts
//! out, Finalize, KeepAlive, close codes, auth), ElevenLabs (audio, errors, cancellation) and
//! Hermes / OpenAI-compatible chat (headers, bodies, tool progress, errors, deadlines,
//! cancellation). Every test binds port 0 and waits on events, never on sleeps.

use std::time::Duration;

use bytes::Bytes;
use patterd::config::schema::{Config, LlmConfig, SttConfig, TtsConfig};
use patterd::provider::deepgram::DeepgramStt;
use patterd::provider::elevenlabs::ElevenLabsTts;
use patterd::provider::openai::{OpenAiChat, caller_key};
use patterd::provider::{
    ChatMessage, ChatTurn, LlmEvent, LlmProvider, Role, SttContext, SttEvent, SttInput,
    SttProvider, SttStream, TokenUsage, TtsEvent, TtsProvider, build_providers,
};
use patterd_sim::deepgram::{DeepgramFailure, FakeDeepgram, FakeDeepgramConfig};
use patterd_sim::elevenlabs::FakeElevenLabs;
use patterd_sim::hermes::{FakeHermes, HermesReply, HermesStep};
use patterd_sim::tone::{mulaw_silence, mulaw_tone};
use tokio::sync::mpsc;

const LIMIT: Duration = Duration::from_secs(10);
/// The Hermes brain's `session_key_secret` in these tests.
const MEMORY_SECRET: &str = "wire-test-memory-secret-0123456789abcdef";

async fn next<T: std::fmt::Debug>(rx: &mut mpsc::Receiver<T>) -> T {
    match tokio::time::timeout(LIMIT, rx.recv()).await {
        Ok(Some(t)) => t,
        Ok(None) => panic!("channel closed"),
        Err(_) => panic!("timed out waiting for an event"),
    }
}

/// Reads events until `pred` matches one; returns everything read, the match last.
async fn until<T: std::fmt::Debug>(
    rx: &mut mpsc::Receiver<T>,
    pred: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut seen = Vec::new();
    loop {
        let ev = next(rx).await;
        let hit = pred(&ev);
        seen.push(ev);
        if hit {
            return seen;
        }
    }
}

/// Reads events until the channel closes.
async fn drain<T: std::fmt::Debug>(rx: &mut mpsc::Receiver<T>) -> Vec<T> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(LIMIT, rx.recv()).await {
            Ok(Some(t)) => seen.push(t),
            Ok(None) => return seen,
            Err(_) => panic!("timed out; so far: {seen:?}"),
        }
    }
}

// ------------------------------------------------------------------ Deepgram

fn stt_cfg(base: &str, key: &str) -> SttConfig {
    let mut c: SttConfig = toml::from_str(r#"kind = "deepgram""#).expect("stt config");
    c.base_url = base.into();
    c.api_key = patterd::config::schema::Secret::new(key);
    c
}

async fn send_audio(s: &SttStream, audio: &[u8]) {
    for frame in audio.chunks(160) {
        s.input
            .send(SttInput::Audio(Bytes::copy_from_slice(frame)))
            .await
            .expect("input open");
    }
}

fn is_final(e: &SttEvent) -> bool {
    matches!(e, SttEvent::Final { .. })
}

#[tokio::test]
async fn deepgram_audio_in_transcripts_out() {
    let fake = FakeDeepgram::start_with(FakeDeepgramConfig {
        api_key: "dg-key".into(),
        transcripts: vec!["hello there".into(), "what time is it".into()],
        ..Default::default()
    })
    .await
    .expect("fake");
    let mut cfg = stt_cfg(&fake.base_url(), "dg-key");
    cfg.keyterms = vec!["Patter".into(), "Acme".into()];
    let stt = DeepgramStt::new(&cfg).expect("stt");
    let mut s = stt.open(&SttContext {
        call_id: "CA1".into(),
        ..Default::default()
    });
    // Audio queued before the handshake completes.
    send_audio(&s, &mulaw_tone(700)).await;
    send_audio(&s, &mulaw_silence(400)).await;
    let evs = until(&mut s.events, is_final).await;
    assert_eq!(evs[0], SttEvent::Connected, "{evs:?}");
    assert!(evs.contains(&SttEvent::SpeechStarted), "{evs:?}");
    assert!(
        evs.iter()
            .any(|e| matches!(e, SttEvent::Interim(t) if "hello there".starts_with(t.as_str()))),
        "{evs:?}"
    );
    assert_eq!(
        evs.last(),
        Some(&SttEvent::Final {
            text: "hello there".into(),
            speech_final: true,
            from_finalize: false
        })
    );
    send_audio(&s, &mulaw_silence(700)).await;
    until(&mut s.events, |e| *e == SttEvent::UtteranceEnd).await;

    send_audio(&s, &mulaw_tone(500)).await;
    send_audio(&s, &mulaw_silence(400)).await;
    let evs = until(&mut s.events, is_final).await;
    assert_eq!(
        evs.last(),
        Some(&SttEvent::Final {
            text: "what time is it".into(),
            speech_final: true,
            from_finalize: false
        })
    );

    // Empty audio is never sent as a frame (Deepgram would treat it as end of stream).
    s.input
        .send(SttInput::Audio(Bytes::new()))
        .await
        .expect("input");
    s.input.send(SttInput::Close).await.expect("input");
    let rest = drain(&mut s.events).await;
    assert_eq!(rest.last(), Some(&SttEvent::Closed), "{rest:?}");
    assert!(
        !rest.iter().any(|e| matches!(e, SttEvent::Error { .. })),
        "{rest:?}"
    );

    let rec = fake
        .wait_until("the session is closed", |r| {
            r.connections.first().is_some_and(|c| c.closed.is_some())
        })
        .await;
    let c = &rec.connections[0];
    assert_eq!(c.header("authorization"), Some("Token dg-key"));
    assert_eq!(c.param("model"), Some("nova-3"));
    assert_eq!(c.param("encoding"), Some("mulaw"));
    assert_eq!(c.param("sample_rate"), Some("8000"));
    assert_eq!(c.param("endpointing"), Some("300"));
    assert_eq!(c.param("utterance_end_ms"), Some("1000"));
    assert_eq!(c.param("vad_events"), Some("true"));
    assert_eq!(c.params("keyterm"), vec!["Patter", "Acme"]);
    assert_eq!(c.audio_bytes, (700 + 400 + 700 + 500 + 400) * 8);
    assert_eq!(c.close_streams, 1);
    let closed = c.closed.clone().expect("closed");
    assert_eq!((closed.code, closed.by_client), (1000, false));
}

#[tokio::test]
async fn deepgram_finalize_flushes_a_final() {
    let fake = FakeDeepgram::start("k").await.expect("fake");
    fake.push_transcript("book a table");
    let mut cfg = stt_cfg(&fake.base_url(), "k");
    cfg.endpointing_ms = 5000; // the endpointer will not fire; Finalize must
    let mut s = DeepgramStt::new(&cfg)
        .expect("stt")
        .open(&SttContext::default());
    send_audio(&s, &mulaw_tone(400)).await;
    s.input.send(SttInput::Finalize).await.expect("input");
    let evs = until(&mut s.events, is_final).await;
    assert_eq!(
        evs.last(),
        Some(&SttEvent::Final {
            text: "book a table".into(),
            speech_final: false,
            from_finalize: true
        }),
        "{evs:?}"
    );
    let rec = fake.record();
    assert_eq!(rec.connections[0].finalizes, 1);
    assert!(
        rec.connections[0]
            .messages
            .contains(&r#"{"type":"Finalize"}"#.to_string())
    );
}

#[tokio::test]
async fn deepgram_keepalive_while_idle() {
    let fake = FakeDeepgram::start_with(FakeDeepgramConfig {
        api_key: "k".into(),
        idle_timeout: Duration::from_millis(400),
        ..Default::default()
    })
    .await
    .expect("fake");
    let mut cfg = stt_cfg(&fake.base_url(), "k");
    cfg.keepalive_ms = 100;
    let mut s = DeepgramStt::new(&cfg)
        .expect("stt")
        .open(&SttContext::default());
    assert_eq!(next(&mut s.events).await, SttEvent::Connected);
    // Well past the fake's idle timeout, the session is alive thanks to KeepAlive.
    let rec = fake
        .wait_until("8 keepalives", |r| {
            r.connections.first().is_some_and(|c| c.keepalives >= 8)
        })
        .await;
    assert!(rec.connections[0].closed.is_none(), "{rec:?}");
    assert!(
        rec.connections[0]
            .messages
            .iter()
            .all(|m| m == r#"{"type":"KeepAlive"}"#)
    );
    assert!(s.events.try_recv().is_err(), "no events while idle");
}

#[tokio::test]
async fn deepgram_idle_close_is_reported_with_its_reason() {
    let fake = FakeDeepgram::start_with(FakeDeepgramConfig {
        api_key: "k".into(),
        idle_timeout: Duration::from_millis(200),
        ..Default::default()
    })
    .await
    .expect("fake");
    let mut cfg = stt_cfg(&fake.base_url(), "k");
    cfg.keepalive_ms = 60_000;
    let mut s = DeepgramStt::new(&cfg)
        .expect("stt")
        .open(&SttContext::default());
    let evs = drain(&mut s.events).await;
    assert_eq!(evs.first(), Some(&SttEvent::Connected));
    assert!(
        evs.iter().any(|e| matches!(e, SttEvent::Error { message, fatal: true } if message.contains("1011") && message.contains("NET-0001") && message.contains("dg-request-id"))),
        "{evs:?}"
    );
    assert_eq!(evs.last(), Some(&SttEvent::Closed));
}

#[tokio::test]
async fn deepgram_auth_failure_is_fatal_and_explains() {
    let fake = FakeDeepgram::start("right").await.expect("fake");
    let mut s = DeepgramStt::new(&stt_cfg(&fake.base_url(), "wrong"))
        .expect("stt")
        .open(&SttContext::default());
    let evs = drain(&mut s.events).await;
    assert_eq!(evs.len(), 2, "{evs:?}");
    match &evs[0] {
        SttEvent::Error {
            message,
            fatal: true,
        } => {
            assert!(
                message.contains("401") && message.contains("api_key"),
                "{message}"
            )
        }
        other => panic!("expected a fatal error, got {other:?}"),
    }
    assert_eq!(evs[1], SttEvent::Closed);
    assert_eq!(fake.record().rejected.len(), 1);
    assert!(fake.record().connections.is_empty());
}

#[tokio::test]
async fn deepgram_refused_or_dropped_connection_is_fatal() {
    let fake = FakeDeepgram::start("k").await.expect("fake");
    fake.set_failure(Some(DeepgramFailure::RefuseHandshake(429)));
    let stt = DeepgramStt::new(&stt_cfg(&fake.base_url(), "k")).expect("stt");
    let evs = drain(&mut stt.open(&SttContext::default()).events).await;
    assert!(
        matches!(&evs[0], SttEvent::Error { message, fatal: true } if message.contains("429")),
        "{evs:?}"
    );

    fake.set_failure(Some(DeepgramFailure::DropAfterAudioBytes(1600)));
    let mut s = stt.open(&SttContext::default());
    send_audio(&s, &mulaw_tone(400)).await;
    let evs = drain(&mut s.events).await;
    assert_eq!(evs.first(), Some(&SttEvent::Connected));
    assert!(
        evs.iter()
            .any(|e| matches!(e, SttEvent::Error { fatal: true, .. })),
        "{evs:?}"
    );
    assert_eq!(evs.last(), Some(&SttEvent::Closed));
}

#[tokio::test]
async fn deepgram_drop_closes_the_socket() {
    let fake = FakeDeepgram::start("k").await.expect("fake");
    let mut s = DeepgramStt::new(&stt_cfg(&fake.base_url(), "k"))
        .expect("stt")
        .open(&SttContext::default());
    assert_eq!(next(&mut s.events).await, SttEvent::Connected);
    drop(s);
    let rec = fake
        .wait_until("the client went away", |r| {
            r.connections.first().is_some_and(|c| c.closed.is_some())
        })
        .await;
    assert!(
        rec.connections[0]
            .closed
            .as_ref()
            .is_some_and(|c| c.by_client)
    );
}

// ------------------------------------------------------------------ ElevenLabs

fn tts_cfg(base: &str, key: &str) -> TtsConfig {
    let mut c: TtsConfig = toml::from_str(r#"kind = "elevenlabs""#).expect("tts config");
    c.fill_kind_defaults();
    c.base_url = base.into();
    c.api_key = patterd::config::schema::Secret::new(key);
    c
}

#[tokio::test]
async fn elevenlabs_streams_mulaw() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let mut cfg = tts_cfg(&fake.base_url(), "el");
    cfg.speed = Some(1.1);
    cfg.optimize_streaming_latency = Some(3);
    let tts = ElevenLabsTts::new(&cfg).expect("tts");
    let text = "Hello there, how can I help you today?";
    let evs = drain(&mut tts.synthesize(text).events).await;
    assert_eq!(evs.last(), Some(&TtsEvent::Done));
    let audio: usize = evs
        .iter()
        .map(|e| {
            if let TtsEvent::Audio(b) = e {
                b.len()
            } else {
                0
            }
        })
        .sum();
    assert_eq!(audio, fake.expected_bytes(text));
    assert!(
        evs.iter()
            .filter(|e| matches!(e, TtsEvent::Audio(_)))
            .count()
            >= 2
    );
    let r = &fake.record().requests[0];
    assert_eq!(r.text, text);
    assert_eq!(r.model_id, "eleven_flash_v2_5");
    assert_eq!(r.voice_id, "EXAVITQu4vr4xnSDxMaL");
    assert!(
        r.query
            .contains(&("output_format".into(), "ulaw_8000".into()))
    );
    assert!(
        r.query
            .contains(&("optimize_streaming_latency".into(), "3".into()))
    );
    assert!(r.headers.contains(&("xi-api-key".into(), "el".into())));
    let speed = r
        .body
        .pointer("/voice_settings/speed")
        .and_then(|v| v.as_f64())
        .expect("speed");
    assert!((speed - 1.1).abs() < 1e-6);
}

#[tokio::test]
async fn elevenlabs_errors_are_mapped() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let bad = ElevenLabsTts::new(&tts_cfg(&fake.base_url(), "nope")).expect("tts");
    let evs = drain(&mut bad.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Error(e)] if e.contains("401") && e.contains("Invalid API key")),
        "{evs:?}"
    );

    let good = ElevenLabsTts::new(&tts_cfg(&fake.base_url(), "el")).expect("tts");
    fake.configure(|c| c.fail_status = Some(500));
    let evs = drain(&mut good.synthesize("Hi there").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Unavailable(e)] if e.contains("500") && e.contains("internal error")),
        "{evs:?}"
    );

    fake.configure(|c| c.fail_status = None);
    let evs = drain(&mut good.synthesize("   ").events).await;
    assert!(
        matches!(&evs[..], [TtsEvent::Error(e)] if e.contains("422")),
        "{evs:?}"
    );
}

#[tokio::test]
async fn elevenlabs_drop_cancels_the_request() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    fake.configure(|c| c.chunk_interval = Duration::from_millis(50));
    let tts = ElevenLabsTts::new(&tts_cfg(&fake.base_url(), "el")).expect("tts");
    let mut s = tts.synthesize(&"A long sentence to speak. ".repeat(20));
    assert!(matches!(next(&mut s.events).await, TtsEvent::Audio(_)));
    drop(s);
    let rec = fake
        .wait_until("the request is cancelled", |r| {
            r.requests.first().is_some_and(|q| q.cancelled)
        })
        .await;
    assert!(!rec.requests[0].completed);
}

// ------------------------------------------------------------------ Hermes / OpenAI

fn llm_cfg(kind: &str, base: &str, key: &str) -> LlmConfig {
    let mut c: LlmConfig = toml::from_str(&format!("kind = \"{kind}\"")).expect("llm config");
    c.base_url = base.into();
    c.api_key = patterd::config::schema::Secret::new(key);
    if c.effective_model().is_empty() {
        // openai_compatible has no default model.
        c.model = "compat-model".into();
    }
    c.resolved()
}

fn turn() -> ChatTurn {
    let m = |role, content: &str| ChatMessage {
        role,
        content: content.into(),
    };
    ChatTurn {
        call_id: "CA123".into(),
        caller: Some("+15551234567".into()),
        system_prompt: "You are on the phone.".into(),
        history: vec![
            m(Role::User, "Hi"),
            m(Role::Assistant, "Hello! How can I help?"),
            m(Role::User, "What time is it?"),
        ],
        history_limits: Default::default(),
        tools: None,
        call_token: None,
        trace: None,
    }
}

fn deltas(evs: &[LlmEvent]) -> String {
    evs.iter()
        .filter_map(|e| {
            if let LlmEvent::Delta(d) = e {
                Some(d.as_str())
            } else {
                None
            }
        })
        .collect()
}

#[tokio::test]
async fn hermes_headers_and_only_the_last_message() {
    let fake = FakeHermes::start("hermes-key-0123456789")
        .await
        .expect("fake");
    fake.push(HermesReply::text("It is ten past three. Anything else?"));
    let mut cfg = llm_cfg("hermes", &fake.base_url(), "hermes-key-0123456789");
    cfg.session_key_from = Some(patterd::config::schema::SessionKeyFrom::CallerHash);
    cfg.session_key_secret = patterd::config::schema::Secret::new(MEMORY_SECRET);
    let llm = OpenAiChat::new(&cfg).expect("llm");
    let evs = drain(&mut llm.stream(turn()).events).await;
    assert_eq!(deltas(&evs), "It is ten past three. Anything else?");
    assert_eq!(evs.last(), Some(&LlmEvent::Done));
    let r = &fake.record().requests[0];
    assert_eq!(
        r.header("authorization"),
        Some("Bearer hermes-key-0123456789")
    );
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    assert_eq!(r.header("x-hermes-session-id"), Some("patter-call-CA123"));
    assert_eq!(
        r.header("x-hermes-session-key").map(str::to_string),
        caller_key(MEMORY_SECRET, "+15551234567")
    );
    assert_eq!(r.body["user"], "patter-call-CA123");
    assert_eq!(r.body["stream"], true);
    assert_eq!(r.body["model"], "hermes-agent");
    assert_eq!(
        r.messages(),
        vec![
            ("system".into(), "You are on the phone.".into()),
            ("user".into(), "What time is it?".into())
        ]
    );

    // A fixed session key wins over the caller hash.
    cfg.session_key = Some("team-alpha".into());
    cfg.session_key_from = None;
    let evs = drain(&mut OpenAiChat::new(&cfg).expect("llm").stream(turn()).events).await;
    assert_eq!(evs.last(), Some(&LlmEvent::Done));
    assert_eq!(
        fake.record().requests[1].header("x-hermes-session-key"),
        Some("team-alpha")
    );
}

#[tokio::test]
async fn openai_compatible_sends_the_whole_history() {
    let fake = FakeHermes::start("sk-test").await.expect("fake");
    let mut cfg = llm_cfg("openai_compatible", &fake.base_url(), "sk-test");
    cfg.model = "gpt-4o-mini".into();
    cfg.max_tokens = Some(200);
    let evs = drain(&mut OpenAiChat::new(&cfg).expect("llm").stream(turn()).events).await;
    assert_eq!(deltas(&evs), "You said: What time is it?");
    let r = &fake.record().requests[0];
    assert_eq!(r.messages().len(), 4);
    assert_eq!(r.messages()[0].0, "system");
    assert_eq!(
        r.messages()[2],
        ("assistant".into(), "Hello! How can I help?".into())
    );
    assert_eq!(r.header("x-hermes-session-id"), None);
    assert_eq!(r.header("x-hermes-session-key"), None);
    assert!(r.body.get("user").is_none());
    assert_eq!(r.body["model"], "gpt-4o-mini");
    assert_eq!(r.body["max_tokens"], 200);
    assert_eq!(r.body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn hermes_tool_progress_keepalives_and_post_tool_whitespace() {
    let fake = FakeHermes::start("k").await.expect("fake");
    fake.push(HermesReply::Stream(vec![
        HermesStep::Text("Let me check.".into()),
        HermesStep::ToolStarted {
            tool: "web_search".into(),
            label: "Searching the web".into(),
        },
        HermesStep::KeepAlive,
        HermesStep::NamedEvent {
            event: "approval.request".into(),
            data: r#"{"x":1}"#.into(),
        },
        HermesStep::ToolCompleted {
            tool: "web_search".into(),
        },
        HermesStep::Text("\n\n".into()),
        HermesStep::Text("  It is <think>hmm</think>ten.".into()),
    ]));
    let llm = OpenAiChat::new(&llm_cfg("hermes", &fake.base_url(), "k")).expect("llm");
    let evs = drain(&mut llm.stream(turn()).events).await;
    assert_eq!(
        evs,
        vec![
            LlmEvent::Delta("Let me check.".into()),
            LlmEvent::ToolProgress("Searching the web".into()),
            LlmEvent::Delta("It is ten.".into()),
            LlmEvent::Usage(TokenUsage {
                prompt_tokens: patterd_sim::hermes::PROMPT_TOKENS,
                completion_tokens: 3,
            }),
            LlmEvent::Done,
        ]
    );
}

#[tokio::test]
async fn hermes_error_finish_is_an_error_never_a_delta() {
    let fake = FakeHermes::start("k").await.expect("fake");
    let secret = "API call failed after 3 retries: Connection error.";
    fake.push(HermesReply::Stream(vec![HermesStep::FinishError(
        secret.into(),
    )]));
    fake.push(HermesReply::Stream(vec![
        HermesStep::Text("Partial".into()),
        HermesStep::StreamError("boom".into()),
    ]));
    let llm = OpenAiChat::new(&llm_cfg("hermes", &fake.base_url(), "k")).expect("llm");

    let evs = drain(&mut llm.stream(turn()).events).await;
    assert!(matches!(evs.last(), Some(LlmEvent::Error(_))), "{evs:?}");
    assert!(
        !evs.iter()
            .any(|e| matches!(e, LlmEvent::Delta(d) if d.contains("API call failed"))),
        "{evs:?}"
    );
    assert!(!evs.contains(&LlmEvent::Done));

    let evs = drain(&mut llm.stream(turn()).events).await;
    assert!(
        matches!(evs.last(), Some(LlmEvent::Error(e)) if e.contains("boom")),
        "{evs:?}"
    );
    assert!(
        !evs.iter()
            .any(|e| matches!(e, LlmEvent::Delta(d) if d.contains("boom")))
    );
}

#[tokio::test]
async fn hermes_http_errors_and_truncation() {
    let fake = FakeHermes::start("k").await.expect("fake");
    fake.push(HermesReply::http(500, "Internal server error"));
    fake.push(HermesReply::Stream(vec![
        HermesStep::Text("Half a".into()),
        HermesStep::Cut,
    ]));
    let llm = OpenAiChat::new(&llm_cfg("hermes", &fake.base_url(), "k")).expect("llm");
    let evs = drain(&mut llm.stream(turn()).events).await;
    assert!(
        matches!(&evs[..], [LlmEvent::Error(e)] if e.contains("500") && e.contains("Internal server error")),
        "{evs:?}"
    );
    // A cut stream may be a restart: the call decides whether to ask again (it does not
    // here, since text had come).
    let evs = drain(&mut llm.stream(turn()).events).await;
    assert!(
        matches!(evs.last(), Some(LlmEvent::Unavailable { message, .. }) if message.contains("truncated")),
        "{evs:?}"
    );

    let bad = OpenAiChat::new(&llm_cfg("hermes", &fake.base_url(), "wrong")).expect("llm");
    let evs = drain(&mut bad.stream(turn()).events).await;
    assert!(
        matches!(&evs[..], [LlmEvent::Error(e)] if e.contains("401") && e.contains("Invalid API key")),
        "{evs:?}"
    );
    assert_eq!(fake.record().unauthorized, 1);
}

/// 429 and 503 (with the fake's `Retry-After: 2`) may pass: the call gets the server's hint.
#[tokio::test]
async fn hermes_429_and_503_are_unavailable_with_their_retry_after() {
    let fake = FakeHermes::start("k").await.expect("fake");
    fake.push(HermesReply::http(429, "slow down"));
    fake.push(HermesReply::http(503, "overloaded"));
    let llm = OpenAiChat::new(&llm_cfg("hermes", &fake.base_url(), "k")).expect("llm");
    for status in ["429", "503"] {
        let evs = drain(&mut llm.stream(turn()).events).await;
        assert!(
            matches!(&evs[..], [LlmEvent::Unavailable { message, retry_after }]
                if message.contains(status) && *retry_after == Some(Duration::from_secs(2))),
            "{evs:?}"
        );
    }
}

#[tokio::test]
async fn chat_connection_refused_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let llm = OpenAiChat::new(&llm_cfg(
        "openai_compatible",
        &format!("http://127.0.0.1:{port}/v1"),
        "k",
    ))
    .expect("llm");
    let evs = drain(&mut llm.stream(turn()).events).await;
    assert!(
        matches!(&evs[..], [LlmEvent::Unavailable { message, retry_after: None }] if message.contains("request failed")),
        "{evs:?}"
    );
}

#[tokio::test]
async fn hermes_first_token_timeout() {
    let fake = FakeHermes::start("k").await.expect("fake");
    fake.push(HermesReply::Stream(vec![
        HermesStep::Delay(Duration::from_secs(30)),
        HermesStep::Text("late".into()),
    ]));
    let mut cfg = llm_cfg("hermes", &fake.base_url(), "k");
    cfg.first_token_timeout_s = 1;
    let evs = drain(&mut OpenAiChat::new(&cfg).expect("llm").stream(turn()).events).await;
    assert!(
        matches!(&evs[..], [LlmEvent::Error(e)] if e.contains("first token")),
        "{evs:?}"
    );
    fake.wait_until("the fake sees the client leave", |r| {
        r.requests.first().is_some_and(|q| q.disconnected)
    })
    .await;
}

#[tokio::test]
async fn hermes_drop_cancels_the_turn() {
    let fake = FakeHermes::start("k").await.expect("fake");
    fake.push(HermesReply::Stream(vec![
        HermesStep::Text("One moment.".into()),
        HermesStep::Delay(Duration::from_secs(30)),
        HermesStep::Text("Never sent.".into()),
    ]));
    let llm = OpenAiChat::new(&llm_cfg("hermes", &fake.base_url(), "k")).expect("llm");
    let mut s = llm.stream(turn());
    assert_eq!(
        next(&mut s.events).await,
        LlmEvent::Delta("One moment.".into())
    );
    drop(s);
    let rec = fake
        .wait_until("the fake sees the client leave", |r| {
            r.requests.first().is_some_and(|q| q.disconnected)
        })
        .await;
    assert!(!rec.requests[0].completed);
}

#[tokio::test]
async fn hermes_health_is_open() {
    let fake = FakeHermes::start("k").await.expect("fake");
    patterd::util::init_tls();
    let url = fake.base_url().replace("/v1", "/health");
    let v: serde_json::Value = reqwest::get(&url)
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(v["status"], "ok");
    assert_eq!(fake.record().health_checks, 1);
}

// ------------------------------------------------------------------ wiring

#[test]
fn build_providers_resolves_agents() {
    let cfg: Config = toml::from_str(
        r#"
        [llm.brain]
        kind = "hermes"
        [llm.claw]
        kind = "openclaw"
        [stt.ears]
        kind = "deepgram"
        [tts.voice]
        kind = "elevenlabs"
        [agents.front]
        llm = "brain"
        stt = "ears"
        tts = "voice"
        [agents.broken]
        llm = "missing"
        stt = "ears"
        tts = "voice"
        "#,
    )
    .expect("config");
    let p = build_providers(&cfg).expect("providers");
    assert_eq!(p.llm.len(), 2);
    assert!(p.for_agent(&cfg.agents["front"]).is_some());
    assert!(p.for_agent(&cfg.agents["broken"]).is_none());

    let mut bad = cfg.clone();
    if let Some(s) = bad.stt.get_mut("ears") {
        s.base_url = "ftp://x".into();
    }
    assert!(
        build_providers(&bad)
            .err()
            .is_some_and(|e| e.to_string().contains("[stt.ears]"))
    );
}

// ------------------------------------------------------------------ ElevenLabs WebSocket

fn ws_cfg(base: &str, key: &str) -> TtsConfig {
    let mut c = tts_cfg(base, key);
    c.transport = patterd::config::schema::TtsTransport::Websocket;
    c
}

#[tokio::test]
async fn elevenlabs_websocket_carries_every_sentence_of_a_call_on_one_socket() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let tts = ElevenLabsTts::new(&ws_cfg(&fake.base_url(), "el")).expect("tts");
    let call = tts.for_call().expect("a per-call session");
    let texts = ["Hello there.", "How are you?", "Goodbye now."];
    let mut streams: Vec<_> = texts.iter().map(|t| call.synthesize(t)).collect();
    for (s, t) in streams.iter_mut().zip(texts) {
        let evs = drain(&mut s.events).await;
        assert_eq!(evs.last(), Some(&TtsEvent::Done), "{t}: {evs:?}");
        let audio: usize = evs
            .iter()
            .map(|e| match e {
                TtsEvent::Audio(a) => a.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(audio, fake.expected_bytes(t), "{t}");
    }
    let rec = fake.record();
    assert_eq!(rec.ws_sockets.len(), 1, "one socket per call");
    assert!(rec.requests.is_empty(), "no HTTP requests");
    let q = &rec.ws_sockets[0];
    assert!(
        q.contains(&("output_format".into(), "ulaw_8000".into())),
        "{q:?}"
    );
    assert!(
        q.contains(&("inactivity_timeout".into(), "180".into())),
        "{q:?}"
    );
    assert_eq!(rec.ws_contexts.len(), 3);
    for (c, t) in rec.ws_contexts.iter().zip(texts) {
        assert_eq!(c.text.trim(), t);
        assert!(c.closed && c.final_sent, "{c:?}");
        assert_eq!(c.init["text"], " ");
    }
    // Dropping the call's session closes the socket politely.
    drop(call);
    fake.wait_until("close_socket", |r| r.ws_close_socket == 1)
        .await;
}

#[tokio::test]
async fn elevenlabs_websocket_bad_key_is_a_clear_error() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let tts = ElevenLabsTts::new(&ws_cfg(&fake.base_url(), "wrong")).expect("tts");
    let call = tts.for_call().expect("session");
    let evs = drain(&mut call.synthesize("Hello.").events).await;
    match evs.last() {
        Some(TtsEvent::Error(e)) => {
            assert!(e.contains("Invalid API key"), "{e}");
            assert!(e.contains("check [tts] api_key"), "{e}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(
        fake.record().ws_errors,
        vec![("invalid_api_key".to_string(), 1008)]
    );
}

#[tokio::test]
async fn elevenlabs_websocket_more_sentences_than_contexts_wait_their_turn() {
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let tts = ElevenLabsTts::new(&ws_cfg(&fake.base_url(), "el")).expect("tts");
    let call = tts.for_call().expect("session");
    let mut streams: Vec<_> = (0..8)
        .map(|i| call.synthesize(&format!("Sentence number {i}.")))
        .collect();
    for s in &mut streams {
        let evs = drain(&mut s.events).await;
        assert_eq!(evs.last(), Some(&TtsEvent::Done), "{evs:?}");
    }
    let rec = fake.record();
    assert_eq!(rec.ws_sockets.len(), 1);
    assert!(rec.ws_errors.is_empty(), "{:?}", rec.ws_errors);
    assert_eq!(rec.ws_contexts.len(), 8);
}

#[tokio::test]
async fn fake_elevenlabs_websocket_refuses_a_sixth_context_and_late_voice_settings() {
    use patterd::net::ws_pump::{self, WsIn};
    let fake = FakeElevenLabs::start("el").await.expect("fake");
    let url = patterd::provider::elevenlabs_ws::socket_url(&ws_cfg(&fake.base_url(), "el"));
    let open = || async {
        let (ws, _) = patterd::net::ws_client::connect(&url, &[("xi-api-key", "el")], LIMIT)
            .await
            .expect("connect");
        ws_pump::split(ws)
    };
    async fn closed_with(rx: &mut mpsc::Receiver<WsIn>) -> (String, Option<u16>) {
        let mut error = String::new();
        loop {
            match next(rx).await {
                WsIn::Text(t) if t.contains("\"error\"") => error = t,
                WsIn::Text(_) => {}
                WsIn::Close { code, .. } => return (error, code),
                other => panic!("{other:?}"),
            }
        }
    }
    // Six contexts at once: the sixth is refused and the socket closes 1008.
    let (mut rx, tx, _g) = open().await;
    for i in 0..6 {
        tx.text(&format!(r#"{{"text":" ","context_id":"c{i}"}}"#))
            .await
            .expect("send");
    }
    let (error, code) = closed_with(&mut rx).await;
    assert!(error.contains("max_active_conversations"), "{error}");
    assert_eq!(code, Some(1008));
    // voice_settings after a context's init is refused the same way.
    let (mut rx, tx, _g) = open().await;
    tx.text(r#"{"text":" ","context_id":"a"}"#)
        .await
        .expect("send");
    tx.text(r#"{"text":"Hi ","context_id":"a","voice_settings":{"speed":1.0}}"#)
        .await
        .expect("send");
    let (error, code) = closed_with(&mut rx).await;
    assert!(
        error.contains("only accepted in a context's init"),
        "{error}"
    );
    assert_eq!(code, Some(1008));
    // Text before a context's init is out of order.
    let (mut rx, tx, _g) = open().await;
    tx.text(r#"{"text":"Hi ","context_id":"b"}"#)
        .await
        .expect("send");
    let (error, code) = closed_with(&mut rx).await;
    assert!(error.contains("invalid_message_order"), "{error}");
    assert_eq!(code, Some(1008));
}
