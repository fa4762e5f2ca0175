//! A whole call's media path without a socket, on tokio's paused clock: a carrier's real codec
//! (Twilio's JSON, Vonage's binary L16 with text control), the pump's real stages
//! ([`super::serve`]: start, token, attach, read and write loops, the caller-audio stage) and
//! the real call actor with `provider::memory`'s speech-to-text, brain and voice, over a
//! [`MemoryTransport`] whose peer plays the carrier: it sends the caller's audio one 20 ms
//! frame every 20 ms, plays the agent's audio in real time and echoes each mark when the audio
//! before it has played.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use tokio::time::Instant;

use super::serve;
use crate::app::App;
use crate::call::{CallRecord, EndReason, actor, driver};
use crate::carrier::port::TokenSource;
use crate::carrier::transport::memory::{MemoryMessage, MemoryPeer, MemoryTransport};
use crate::carrier::twilio::TwilioCodec;
use crate::carrier::vonage::VonageCodec;
use crate::carrier::{CarrierKind, FRAME_BYTES, FRAME_MS, MediaCodec, MediaCommand, SharedCodec};
use crate::config::AgentConfig;
use crate::provider::AgentProviders;
use crate::provider::memory::{Answer, MeteredTts, ScriptedBrain, ScriptedStt};

const GREETING: &str = "Hello, how can I help?";
const CALLER: &str = "I would like to book a table";
const REPLY: &str = "Certainly.";
const STREAM: &str = "MZmemory";
/// Longest virtual wait for anything in these calls.
const LIMIT: Duration = Duration::from_secs(60);

/// An `App` with one Twilio account, its data in a fresh temporary directory.
fn test_app() -> (tempfile::TempDir, Arc<App>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[server]\ndata_dir = {:?}\n\n[carriers.tw]\nkind = \"twilio\"\n",
        dir.path().display().to_string()
    );
    let loaded = crate::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
    (dir, App::new(loaded.config).expect("app"))
}

/// A speech clip, `tests/fixtures/speech/<name>.ulaw` (μ-law 8 kHz).
fn clip(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/speech")
        .join(format!("{name}.ulaw"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// What the agent's side sent, as the peer understood it.
#[derive(Debug, PartialEq)]
enum Heard {
    /// A frame of agent audio, in μ-law bytes.
    Audio(usize),
    Mark(String),
    Close(u16, Vec<u8>),
    Other(String),
}

/// One carrier's side of the media stream, in its wire format.
struct Dialect {
    codec: fn(call_id: &str) -> Box<dyn SharedCodec>,
    token: fn(token: &str) -> TokenSource,
    /// What the carrier sends first (its `start`, with the token where it carries one).
    opening: fn(call_id: &str, token: &str) -> Vec<MemoryMessage>,
    /// One 20 ms frame of caller audio (μ-law 8 kHz).
    caller_frame: fn(ulaw: &[u8]) -> MemoryMessage,
    heard: fn(MemoryMessage) -> Heard,
    mark_played: fn(name: &str) -> MemoryMessage,
    hang_up: fn() -> MemoryMessage,
}

fn json(message: &MemoryMessage) -> Value {
    match message {
        MemoryMessage::Text(t) => serde_json::from_str(t).expect("JSON text"),
        other => panic!("expected text, got {other:?}"),
    }
}

const TWILIO: Dialect = Dialect {
    codec: |_| Box::new(TwilioCodec::new()),
    token: |_| TokenSource::StartParameter,
    opening: |call_id, token| {
        let start = serde_json::json!({
            "event": "start", "sequenceNumber": "1", "streamSid": STREAM,
            "start": {
                "accountSid": "ACmemory", "callSid": call_id, "streamSid": STREAM,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": {"token": token},
            },
        });
        vec![
            MemoryMessage::Text(
                r#"{"event":"connected","protocol":"Call","version":"1.0.0"}"#.into(),
            ),
            MemoryMessage::Text(start.to_string()),
        ]
    },
    caller_frame: |ulaw| {
        MemoryMessage::Text(format!(
            r#"{{"event":"media","sequenceNumber":"2","media":{{"track":"inbound","chunk":"1","timestamp":"0","payload":"{}"}},"streamSid":"{STREAM}"}}"#,
            STANDARD.encode(ulaw)
        ))
    },
    heard: |message| {
        let v = match message {
            MemoryMessage::Close(code, reason) => return Heard::Close(code, reason),
            text => json(&text),
        };
        assert_eq!(v["streamSid"], STREAM, "{v}");
        match v["event"].as_str() {
            Some("media") => {
                let payload = v["media"]["payload"].as_str().expect("payload");
                Heard::Audio(STANDARD.decode(payload).expect("base64").len())
            }
            Some("mark") => Heard::Mark(v["mark"]["name"].as_str().expect("name").into()),
            _ => Heard::Other(v.to_string()),
        }
    },
    mark_played: |name| {
        let v = serde_json::json!({"event": "mark", "streamSid": STREAM, "mark": {"name": name}});
        MemoryMessage::Text(v.to_string())
    },
    hang_up: || {
        MemoryMessage::Text(format!(
            r#"{{"event":"stop","sequenceNumber":"9","streamSid":"{STREAM}","stop":{{"accountSid":"ACmemory","callSid":"CA"}}}}"#
        ))
    },
};

const VONAGE: Dialect = Dialect {
    codec: |call_id| Box::new(VonageCodec::new(call_id)),
    token: |token| TokenSource::Url(Some(token.to_string())),
    opening: |_, _| {
        vec![MemoryMessage::Text(
            r#"{"event":"websocket:connected","content-type":"audio/l16;rate=16000"}"#.into(),
        )]
    },
    // L16 at 16 kHz, as the codec writes it the other way.
    caller_frame: |ulaw| {
        let mut pcm = Vec::new();
        let audio = MediaCommand::Audio(bytes::Bytes::copy_from_slice(ulaw));
        assert!(VonageCodec::new("caller").encode_into(&audio, &mut pcm));
        MemoryMessage::Binary(pcm)
    },
    heard: |message| match message {
        // L16 at 16 kHz: two samples (four bytes) per μ-law sample.
        MemoryMessage::Binary(pcm) => {
            assert_eq!(
                pcm.len() % 4,
                0,
                "L16 16 kHz frames hold whole sample pairs"
            );
            Heard::Audio(pcm.len() / 4)
        }
        MemoryMessage::Close(code, reason) => Heard::Close(code, reason),
        text => {
            let v = json(&text);
            match v["action"].as_str() {
                Some("notify") => Heard::Mark(v["payload"]["mark"].as_str().expect("mark").into()),
                _ => Heard::Other(v.to_string()),
            }
        }
    },
    mark_played: |name| {
        let v = serde_json::json!({"event": "websocket:notify", "payload": {"mark": name}});
        MemoryMessage::Text(v.to_string())
    },
    // Vonage ends the stream by closing the socket.
    hang_up: || MemoryMessage::Close(1000, Vec::new()),
};

/// A live call to an agent that greets, hears [`CALLER`] in the caller's first burst and
/// answers [`REPLY`]; its media not attached yet.
struct Kit {
    app: Arc<App>,
    _dir: tempfile::TempDir,
    call_id: String,
    brain: ScriptedBrain,
    tts: MeteredTts,
}

fn start_call(call_id: &str) -> Kit {
    let (_dir, app) = test_app();
    let text = format!(
        "llm = \"brain\"\nstt = \"ears\"\ntts = \"voice\"\nfirst_message = \"{GREETING}\"\n\
         long_turn_message_after_s = 20.0\n"
    );
    let agent: Arc<AgentConfig> = Arc::new(toml::from_str(&text).expect("agent config"));
    let brain = ScriptedBrain::new(vec![Answer::text(REPLY)]);
    let tts = MeteredTts::new(clip("agent_voice"), 60, Duration::from_millis(100));
    let providers = AgentProviders {
        stt: Arc::new(ScriptedStt::new(&[CALLER], 300)),
        tts: Arc::new(tts.clone()),
        llm: Arc::new(brain.clone()),
    };
    let setup = driver::memory_setup(call_id, "tw", agent, providers);
    actor::start(setup, app.calls.clone(), 4).expect("the call starts");
    Kit {
        app,
        _dir,
        call_id: call_id.to_string(),
        brain,
        tts,
    }
}

impl Kit {
    /// Serves the call's media over a new in-memory transport in `dialect`; the peer, after
    /// the carrier's opening messages with `token`.
    async fn connect(
        &self,
        dialect: &Dialect,
        token: &str,
    ) -> (MemoryPeer, tokio::task::JoinHandle<()>) {
        let (transport, peer) = MemoryTransport::pair(64);
        let carrier = self
            .app
            .carriers
            .get(CarrierKind::Twilio)
            .expect("twilio")
            .clone();
        let pump = tokio::spawn(serve(
            self.app.clone(),
            transport,
            carrier,
            (dialect.codec)(&self.call_id),
            (dialect.token)(token),
        ));
        for m in (dialect.opening)(&self.call_id, token) {
            assert!(peer.send(m).await, "the pump is gone");
        }
        (peer, pump)
    }
}

/// What the peer heard and when (ms since it connected).
#[derive(Debug, Default)]
struct Line {
    /// Agent audio frames before the first mark, each's length in μ-law bytes.
    greeting_frames: Vec<usize>,
    audio_frames: usize,
    marks: Vec<(u64, String)>,
    other: Vec<String>,
}

/// Plays the carrier until the caller has said [`CALLER`] after the greeting and the reply's
/// mark came back: caller audio every 20 ms (silence, then the clip once the greeting
/// played), agent audio played in real time, each mark echoed when the audio before it played.
async fn converse(dialect: &Dialect, peer: MemoryPeer) -> (Line, MemoryPeer) {
    let started = Instant::now();
    let ms = || started.elapsed().as_millis() as u64;
    let (to_pump, mut from_pump) = peer.into_parts();
    let mut line = Line::default();
    let mut caller: VecDeque<u8> = VecDeque::new();
    let mut said = false;
    // When the agent audio queued so far ends, and the marks waiting for it.
    let mut played_until = Instant::now();
    let mut marks: VecDeque<(Instant, String)> = VecDeque::new();
    let mut tick = tokio::time::interval(Duration::from_millis(FRAME_MS));
    while line.marks.len() < 2 {
        tokio::select! {
            message = from_pump.recv() => match (dialect.heard)(message.expect("the pump is gone")) {
                Heard::Audio(n) => {
                    if line.marks.is_empty() && marks.is_empty() {
                        line.greeting_frames.push(n);
                    }
                    line.audio_frames += 1;
                    played_until = played_until.max(Instant::now()) + Duration::from_millis(FRAME_MS);
                }
                Heard::Mark(name) => marks.push_back((played_until.max(Instant::now()), name)),
                Heard::Close(code, reason) => panic!("closed: {code} {reason:?}"),
                Heard::Other(text) => line.other.push(text),
            },
            _ = tick.tick() => {
                while marks.front().is_some_and(|(due, _)| *due <= Instant::now()) {
                    let (_, name) = marks.pop_front().expect("a mark");
                    line.marks.push((ms(), name.clone()));
                    assert!(to_pump.send((dialect.mark_played)(&name)).await.is_ok());
                }
                if !said && !line.marks.is_empty() {
                    said = true;
                    caller.extend(clip("book_table"));
                }
                let mut frame: Vec<u8> = caller.drain(..caller.len().min(FRAME_BYTES)).collect();
                frame.resize(FRAME_BYTES, 0xFF);
                assert!(to_pump.send((dialect.caller_frame)(&frame)).await.is_ok());
            }
        }
    }
    (line, MemoryPeer::from_parts(to_pump, from_pump))
}

/// The whole call in `dialect`: the greeting reaches the caller as whole 20 ms frames in the
/// carrier's wire format and then its mark, the caller's audio reaches the speech-to-text
/// through the caller-audio stage and the brain hears the caller's words, the reply plays,
/// and the carrier's hang-up ends the stream and the call.
async fn a_whole_call(dialect: &Dialect, call_id: &str) -> CallRecord {
    let kit = start_call(call_id);
    let token = kit.app.tokens.mint(call_id);
    let (peer, pump) = kit.connect(dialect, &token).await;
    let (line, mut peer) = tokio::time::timeout(LIMIT, converse(dialect, peer))
        .await
        .expect("the call went on to the reply's mark");

    let greeting = kit.tts.duration_ms(GREETING) / FRAME_MS;
    assert_eq!(line.greeting_frames.len() as u64, greeting, "{line:?}");
    assert!(
        line.greeting_frames.iter().all(|n| *n == FRAME_BYTES),
        "{line:?}"
    );
    assert!(line.other.is_empty(), "{line:?}");
    assert_eq!(kit.brain.last_messages(), vec![CALLER]);
    assert_eq!(kit.tts.spoken(), vec![GREETING, REPLY]);
    let reply = kit.tts.duration_ms(REPLY) / FRAME_MS;
    assert_eq!(line.audio_frames as u64, greeting + reply, "{line:?}");

    assert!(peer.send((dialect.hang_up)()).await);
    tokio::time::timeout(LIMIT, pump)
        .await
        .expect("the pump ended")
        .expect("no panic");
    let record = tokio::time::timeout(LIMIT, kit.app.calls.wait_finished(call_id))
        .await
        .expect("the call ended")
        .expect("its record");
    // The stream ended with a normal close (after the echo of Vonage's own).
    let mut last = None;
    while let Some(m) = peer.try_recv() {
        last = Some(m);
    }
    assert!(
        matches!(last, Some(MemoryMessage::Close(1000, _))),
        "{last:?}"
    );
    record
}

#[tokio::test(start_paused = true)]
async fn a_twilio_call_over_a_memory_transport() {
    let record = a_whole_call(&TWILIO, "CAtransport").await;
    assert_eq!(record.ended_reason, EndReason::CallerHungUp);
}

#[tokio::test(start_paused = true)]
async fn a_vonage_call_over_a_memory_transport_in_binary_frames() {
    let record = a_whole_call(&VONAGE, "vonage-transport").await;
    assert_eq!(record.ended_reason, EndReason::CallerHungUp);
}

/// A wrong token is refused with the close the socket gets (1008, "invalid media token"),
/// before anything reaches the call, which stays live and unattached.
#[tokio::test(start_paused = true)]
async fn a_bad_token_is_refused_with_a_policy_close() {
    for (dialect, call_id) in [(&TWILIO, "CAbadtoken"), (&VONAGE, "vonage-badtoken")] {
        let kit = start_call(call_id);
        let _ = kit.app.tokens.mint(call_id);
        let (mut peer, pump) = kit.connect(dialect, "v1.forged.token").await;
        let answer = tokio::time::timeout(LIMIT, peer.recv())
            .await
            .expect("an answer");
        assert_eq!(
            answer,
            Some(MemoryMessage::Close(1008, b"invalid media token".to_vec())),
            "{call_id}"
        );
        tokio::time::timeout(LIMIT, pump)
            .await
            .expect("the pump ended")
            .expect("no panic");
        assert!(kit.app.calls.get(call_id).is_some(), "{call_id}");
    }
}

/// A stream that sends no `start` is closed after the start timeout with the socket's close.
#[tokio::test(start_paused = true)]
async fn no_start_is_refused_after_the_timeout() {
    let kit = start_call("CAnostart");
    let (transport, mut peer) = MemoryTransport::pair(8);
    let carrier = kit
        .app
        .carriers
        .get(CarrierKind::Twilio)
        .expect("twilio")
        .clone();
    let pump = tokio::spawn(serve(
        kit.app.clone(),
        transport,
        carrier,
        Box::new(TwilioCodec::new()),
        TokenSource::StartParameter,
    ));
    assert!(peer.send_text(r#"{"event":"connected"}"#).await);
    let before = Instant::now();
    let answer = peer.recv().await;
    assert_eq!(
        answer,
        Some(MemoryMessage::Close(1008, b"expected start".to_vec()))
    );
    let waited = before.elapsed();
    assert!(
        waited >= super::START_TIMEOUT && waited < super::START_TIMEOUT + Duration::from_secs(1),
        "{waited:?}"
    );
    pump.await.expect("no panic");
}

/// A caller sending audio at 10× real time from the start, over Twilio's JSON and Vonage's
/// binary L16: the pump drops what runs past 1.2× (plus the 200 ms burst), counts it, and
/// after six seconds of flood closes the stream with 1008 and hangs the call up.
#[tokio::test(start_paused = true)]
async fn a_caller_flooding_audio_is_paced_then_closed() {
    for (dialect, call_id) in [(&TWILIO, "CAflood"), (&VONAGE, "vonage-flood")] {
        let kit = start_call(call_id);
        let token = kit.app.tokens.mint(call_id);
        let (peer, pump) = kit.connect(dialect, &token).await;
        let (to_pump, mut from_pump) = peer.into_parts();
        let started = Instant::now();
        let flood = async {
            let mut tick = tokio::time::interval(Duration::from_millis(FRAME_MS));
            let mut sent = 0u64;
            loop {
                tick.tick().await;
                for _ in 0..10 {
                    if to_pump
                        .send((dialect.caller_frame)(&[0xFF; FRAME_BYTES]))
                        .await
                        .is_err()
                    {
                        return sent;
                    }
                    sent += 1;
                }
            }
        };
        let close = async {
            loop {
                match from_pump.recv().await {
                    Some(MemoryMessage::Close(code, reason)) => return (code, reason),
                    Some(_) => {}
                    None => panic!("no close"),
                }
            }
        };
        let close = tokio::time::timeout(LIMIT, async {
            tokio::select! {
                close = close => close,
                sent = flood => panic!("the pump stopped reading after {sent} frames"),
            }
        })
        .await
        .expect("the flood is closed");
        let closed_after = started.elapsed();
        assert_eq!(
            close,
            (1008, b"audio faster than real time".to_vec()),
            "{call_id}"
        );
        assert!(
            (Duration::from_secs(6)..Duration::from_millis(6200)).contains(&closed_after),
            "{call_id}: closed after {closed_after:?}"
        );
        let dropped = crate::app::Metrics::get(&kit.app.metrics.media_frames_paced);
        // Ten frames sent per 20 ms (the last burst maybe in part); 1.2 per 20 ms passed.
        let sent = closed_after.as_millis() as u64 / FRAME_MS * 10;
        let passed = sent.saturating_sub(dropped);
        let allowed = closed_after.as_millis() as u64 * 6 / 5 / FRAME_MS + 10;
        assert!(
            passed <= allowed + 10 && dropped > sent * 8 / 10,
            "{call_id}: {passed} frames passed of {sent}, {dropped} dropped"
        );
        assert_eq!(crate::app::Metrics::get(&kit.app.metrics.media_floods), 1);
        tokio::time::timeout(LIMIT, pump)
            .await
            .expect("the pump ended")
            .expect("no panic");
        let record = tokio::time::timeout(LIMIT, kit.app.calls.wait_finished(call_id))
            .await
            .expect("the call ended")
            .expect("its record");
        assert_eq!(
            record.ended_reason,
            EndReason::HungUp(crate::call::ingress::FLOOD_REASON.into()),
            "{call_id}"
        );
        // The call's timeline says so: at the first dropped frame, and with the total.
        let paced: Vec<&str> = record
            .events_of(crate::call::EventKind::CallerAudioPaced)
            .map(|e| e.detail.as_str())
            .collect();
        assert_eq!(paced.first(), Some(&"frames_dropped=1"), "{call_id}");
        assert!(paced.len() >= 2, "{call_id}: {paced:?}");
    }
}

mod voicemail;
