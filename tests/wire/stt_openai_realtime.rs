//! The `openai_realtime` STT client against `FakeOpenAiRealtime`, and the fake's own
//! strictness (what the real service refuses, it refuses): a bad key, malformed appends, a
//! session.update of the wrong shape, the legacy beta event, manual commits, a server error
//! mid-session.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use patterd::config::SttConfig;
use patterd::net::ws_client;
use patterd::net::ws_pump::{self, WsIn};
use patterd::provider::openai_realtime::OpenAiRealtimeStt;
use patterd::provider::{SttContext, SttEvent, SttInput, SttProvider, SttStream};
use patterd_sim::openai_realtime::{FakeOpenAiRealtime, FakeOpenAiRealtimeConfig, RealtimeFailure};
use patterd_sim::tone::{mulaw_silence, mulaw_tone};
use serde_json::{Value, json};

const KEY: &str = "sk-realtime-test";
const LIMIT: Duration = Duration::from_secs(10);

async fn fake(failure: Option<RealtimeFailure>) -> FakeOpenAiRealtime {
    FakeOpenAiRealtime::start_with(FakeOpenAiRealtimeConfig {
        api_key: KEY.into(),
        utterances: vec!["book a table".into()],
        failure,
        ..Default::default()
    })
    .await
    .expect("fake")
}

fn client(fake: &FakeOpenAiRealtime, key: &str, extra: &str) -> OpenAiRealtimeStt {
    let cfg: SttConfig = toml::from_str(&format!(
        "kind = \"openai_realtime\"\nbase_url = \"{}\"\napi_key = \"{key}\"\n{extra}",
        fake.base_url()
    ))
    .expect("config");
    OpenAiRealtimeStt::new(&cfg).expect("client")
}

/// The next event, within the limit.
async fn next(s: &mut SttStream) -> Option<SttEvent> {
    tokio::time::timeout(LIMIT, s.events.recv())
        .await
        .expect("an event in time")
}

/// Events until `pred` matches one (returned last).
async fn until(s: &mut SttStream, pred: impl Fn(&SttEvent) -> bool) -> Vec<SttEvent> {
    let mut v = Vec::new();
    while let Some(e) = next(s).await {
        let done = pred(&e);
        v.push(e);
        if done {
            return v;
        }
    }
    panic!("the stream ended first: {v:?}");
}

fn frames(s: &SttStream, audio: &[u8]) {
    for f in audio.chunks(160) {
        s.input
            .try_send(SttInput::Audio(Bytes::copy_from_slice(f)))
            .expect("queued");
    }
}

#[tokio::test]
async fn a_bad_key_is_a_fatal_error_before_the_session_opens() {
    let f = fake(None).await;
    let mut s = client(&f, "sk-wrong", "").open(&SttContext::default());
    let evs = until(&mut s, |e| matches!(e, SttEvent::Error { .. })).await;
    assert!(!evs.contains(&SttEvent::Connected), "{evs:?}");
    let Some(SttEvent::Error { message, fatal }) = evs.last() else {
        panic!("{evs:?}");
    };
    assert!(fatal);
    assert!(
        message.contains("invalid_request_error.invalid_api_key")
            && message.contains("check [stt] api_key"),
        "{message}"
    );
    assert_eq!(next(&mut s).await, Some(SttEvent::Closed));
    let r = f.record();
    assert_eq!(
        r.connections[0]
            .closed
            .as_ref()
            .map(|c| (c.0, c.1.as_str())),
        Some((3000, "invalid_request_error.invalid_api_key"))
    );
    assert!(r.connections[0].session_updates.is_empty());
}

#[tokio::test]
async fn manual_commits_answer_finalize_with_the_final_transcript() {
    let f = fake(None).await;
    let mut s = client(&f, KEY, "endpointing_ms = 0").open(&SttContext::default());
    assert_eq!(
        until(&mut s, |e| *e == SttEvent::Connected).await.last(),
        Some(&SttEvent::Connected)
    );
    // Under 100 ms buffered: no commit is sent (the service would refuse it).
    frames(&s, &mulaw_tone(60));
    s.input.try_send(SttInput::Finalize).expect("queued");
    frames(&s, &mulaw_tone(400));
    frames(&s, &mulaw_silence(200));
    s.input.try_send(SttInput::Finalize).expect("queued");
    let evs = until(&mut s, |e| matches!(e, SttEvent::Final { .. })).await;
    assert_eq!(
        evs.last(),
        Some(&SttEvent::Final {
            text: "book a table".into(),
            speech_final: true,
            from_finalize: true
        })
    );
    assert!(
        evs.contains(&SttEvent::Interim("book a".into())),
        "deltas accumulate: {evs:?}"
    );
    s.input.try_send(SttInput::Close).expect("queued");
    assert_eq!(until(&mut s, |e| *e == SttEvent::Closed).await.len(), 1);
    let r = f
        .wait_until("closed", |r| r.connections[0].closed.is_some())
        .await;
    let c = &r.connections[0];
    assert_eq!(c.commits, 1);
    assert!(c.session_updates[0]["audio"]["input"]["turn_detection"].is_null());
    assert!(c.errors().is_empty(), "{:?}", c.errors());
    assert_eq!(c.audio_bytes, (60 + 400 + 200) * 8);
    assert_eq!(c.closed.as_ref().map(|x| (x.0, x.2)), Some((1000, true)));
}

#[tokio::test]
async fn a_server_error_mid_session_is_fatal_and_names_the_code() {
    let f = fake(Some(RealtimeFailure::ErrorAfterAudioBytes(1600))).await;
    let mut s = client(&f, KEY, "").open(&SttContext::default());
    until(&mut s, |e| *e == SttEvent::Connected).await;
    frames(&s, &mulaw_tone(400));
    let evs = until(&mut s, |e| matches!(e, SttEvent::Error { fatal: true, .. })).await;
    let Some(SttEvent::Error { message, .. }) = evs.last() else {
        unreachable!()
    };
    // The close (1011) or, when it raced our own sending, the lost connection.
    assert!(
        (message.contains("1011 server_error") && message.contains("try again"))
            || message.contains("OpenAI Realtime connection lost"),
        "{message}"
    );
    // The error event before the close is reported too (not fatal by itself).
    assert!(
        evs.iter().any(|e| matches!(e, SttEvent::Error { fatal: false, message } if message.contains("server_error.server_error"))),
        "{evs:?}"
    );
}

#[tokio::test]
async fn a_refused_handshake_names_the_status() {
    let f = fake(Some(RealtimeFailure::RefuseHandshake(503))).await;
    let mut s = client(&f, KEY, "").open(&SttContext::default());
    let Some(SttEvent::Error { message, fatal }) = next(&mut s).await else {
        panic!("error");
    };
    assert!(
        fatal && message.contains("OpenAI had a server error"),
        "{message}"
    );
}

/// A raw socket to the fake: its `session.created`, then the events it answers.
struct Raw {
    rx: tokio::sync::mpsc::Receiver<WsIn>,
    tx: ws_pump::WsSender<tokio::io::WriteHalf<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>>,
    _g: patterd::util::TaskGuard,
}

impl Raw {
    async fn open(f: &FakeOpenAiRealtime) -> Raw {
        let url = format!("{}/realtime?intent=transcription", f.base_url());
        let auth = format!("Bearer {KEY}");
        let (ws, _) = ws_client::connect(&url, &[("Authorization", &auth)], LIMIT)
            .await
            .expect("connect");
        let (rx, tx, g) = ws_pump::split(ws);
        let mut r = Raw { rx, tx, _g: g };
        assert_eq!(r.recv().await["type"], "session.created");
        r
    }

    async fn send(&self, v: Value) {
        self.tx.text(&v.to_string()).await.expect("send");
    }

    async fn recv(&mut self) -> Value {
        match tokio::time::timeout(LIMIT, self.rx.recv()).await {
            Ok(Some(WsIn::Text(t))) => serde_json::from_str(&t).expect("json"),
            other => panic!("expected an event, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_fake_refuses_malformed_events_with_the_documented_error_event() {
    let f = fake(None).await;
    let mut r = Raw::open(&f).await;
    let good_update = json!({"type": "session.update", "session": {
        "type": "transcription",
        "audio": {"input": {"format": {"type": "audio/pcmu"},
            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
            "turn_detection": null}}}});

    // Not base64, missing, empty: each an `invalid_value` on `audio`, echoing the event id.
    for (i, audio) in [json!("not base64!"), Value::Null, json!("")]
        .into_iter()
        .enumerate()
    {
        let id = format!("evt_{i}");
        let mut m = json!({"type": "input_audio_buffer.append", "event_id": id});
        if !audio.is_null() {
            m["audio"] = audio;
        }
        r.send(m).await;
        let e = r.recv().await;
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["code"], "invalid_value");
        assert_eq!(e["error"]["param"], "audio");
        assert_eq!(e["error"]["event_id"], id.as_str());
        assert!(e["event_id"].is_string());
    }
    // The session shape, field by field.
    let mut pcm_no_rate = good_update.clone();
    pcm_no_rate["session"]["audio"]["input"]["format"] = json!({"type": "audio/pcm"});
    let mut unknown = good_update.clone();
    unknown["session"]["audio"]["input"]["sample_rate"] = json!(8000);
    let mut realtime = good_update.clone();
    realtime["session"]["type"] = json!("realtime");
    let mut model = good_update.clone();
    model["session"]["audio"]["input"]["transcription"]["model"] = json!("nova-3");
    for (bad, code, param) in [
        (
            pcm_no_rate,
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            unknown,
            "unknown_parameter",
            "session.audio.input.sample_rate",
        ),
        (realtime, "invalid_value", "session.type"),
        (
            model,
            "invalid_value",
            "session.audio.input.transcription.model",
        ),
    ] {
        r.send(bad).await;
        let e = r.recv().await;
        assert_eq!(
            (
                e["type"].as_str(),
                e["error"]["code"].as_str(),
                e["error"]["param"].as_str()
            ),
            (Some("error"), Some(code), Some(param)),
            "{e}"
        );
    }
    // The legacy beta event is refused on `type`.
    r.send(json!({"type": "transcription_session.update", "session": {}}))
        .await;
    let e = r.recv().await;
    assert_eq!(e["error"]["param"], "type");
    // A commit under 100 ms.
    r.send(json!({"type": "input_audio_buffer.commit"})).await;
    assert_eq!(
        r.recv().await["error"]["code"],
        "input_audio_buffer_commit_empty"
    );
    // None of that closed the session: a good update is still answered.
    r.send(good_update).await;
    assert_eq!(r.recv().await["type"], "session.updated");
    r.send(json!({"type": "input_audio_buffer.append", "audio": STANDARD.encode(mulaw_tone(20))}))
        .await;
    r.send(json!({"type": "input_audio_buffer.clear"})).await;
    assert_eq!(r.recv().await["type"], "input_audio_buffer.cleared");
    let rec = f.record();
    let c = &rec.connections[0];
    assert_eq!(c.appends, 1);
    assert_eq!(c.appends_before_update, 0);
    assert!(c.closed.is_none());
}
