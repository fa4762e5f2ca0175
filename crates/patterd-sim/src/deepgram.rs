//! `FakeDeepgram`: a Deepgram live-transcription server (`/v1/listen`, as Deepgram documents it) as
//! strict as the real one. The handshake needs `Authorization: Token <key>` (else 401 JSON),
//! `model`, and `encoding=mulaw` with `sample_rate=8000` or `encoding=linear16` with
//! `sample_rate=16000` (else 400). After the upgrade it ends turns
//! from the audio it receives: per connection, 20 ms blocks of μ-law whose mean level is above
//! a threshold count as speech; speech emits `SpeechStarted` (with `vad_events`) and interim
//! `Results`, then `endpointing` ms of silence emits a final `Results` (`is_final` +
//! `speech_final`) carrying the next scripted transcript, then `utterance_end_ms` of silence
//! emits `UtteranceEnd`. `Finalize` flushes a final with `from_finalize:true`; `CloseStream`
//! flushes, sends `Metadata` and closes 1000. An empty binary frame is a protocol error (close
//! 1002), and with no frame at all for the idle timeout (10 s, configurable) it closes
//! 1011 `NET-0001`. Failure modes: refuse the handshake with a status, or drop the TCP
//! connection after some audio. Everything is recorded in a [`DeepgramRecord`], including when
//! each `speech_final` left the fake and the first bytes of audio (the load generator tags its
//! calls there); a load run turns off the verbatim frame log with `record_frames: false`.
//!
//! With a [`WordTrack`] (`words`), the fake transcribes from the track instead of the level and
//! the queue: `SpeechStarted` at a word's start, an interim each time a word has been said
//! (`word_lag_ms` later: a real recogniser's lag), a `speech_final` once `endpointing` ms
//! passed after the last word's end and every word is due (with per-word timings),
//! `UtteranceEnd` after `utterance_end_ms`; audio without words gives nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fastwebsockets::upgrade;
use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::http::{self, Body, Recorder, Tasks};
use super::tone::mulaw_level;
use super::words::{TimedWord, WordTrack};
use super::ws_conn::WsConn;
use patterd::net::ws_pump::WsIn;

/// Mean absolute PCM level above which a 20 ms block counts as speech.
const SPEECH_LEVEL: f64 = 1000.0;
/// An interim result per this much speech.
const INTERIM_EVERY_MS: u64 = 300;

/// How the fake misbehaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeepgramFailure {
    /// Answer the handshake with this HTTP status instead of upgrading.
    RefuseHandshake(u16),
    /// Drop the TCP connection (no close frame) once this many audio bytes arrived on it
    /// (checked on every frame, also on connections opened before the failure was set).
    DropAfterAudioBytes(usize),
}

/// Settings of a [`FakeDeepgram`].
#[derive(Debug, Clone)]
pub struct FakeDeepgramConfig {
    pub api_key: String,
    /// Transcripts handed out in order, one per detected utterance.
    pub transcripts: Vec<String>,
    /// Used when the queue is empty.
    pub default_transcript: String,
    /// Close 1011 `NET-0001` after this long with no frame from the client.
    pub idle_timeout: Duration,
    pub failure: Option<DeepgramFailure>,
    /// Keep every text frame received and sent verbatim (tests); a load run turns it off.
    pub record_frames: bool,
    /// Transcribe from this word track (the scenario suite) instead of the level and queue.
    pub words: Option<Arc<WordTrack>>,
    /// Word-track mode: a word reaches results this long after it has been said (a real
    /// recogniser's lag; 0: the moment it ends). `SpeechStarted` and a client's `Finalize`
    /// are not delayed; a final waits until every word said is due.
    pub word_lag_ms: u64,
}

impl Default for FakeDeepgramConfig {
    fn default() -> Self {
        Self {
            api_key: "dg-test-key".into(),
            transcripts: Vec::new(),
            default_transcript: "hello there".into(),
            idle_timeout: Duration::from_secs(10),
            failure: None,
            record_frames: true,
            words: None,
            word_lag_ms: 0,
        }
    }
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DgClose {
    pub code: u16,
    pub reason: String,
    /// True when the client closed (or vanished), false when the fake closed.
    pub by_client: bool,
}

/// One accepted WebSocket session.
#[derive(Debug, Clone, Default)]
pub struct DgConnection {
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub audio_bytes: usize,
    pub audio_frames: usize,
    /// Every text frame received, verbatim.
    pub messages: Vec<String>,
    pub keepalives: usize,
    pub finalizes: usize,
    pub close_streams: usize,
    /// Every text frame the fake sent, verbatim.
    pub sent: Vec<String>,
    /// When each `speech_final` result was handed to the socket.
    pub finals_at: Vec<Instant>,
    /// How much speech (ms above the level threshold) each `speech_final` covered.
    pub finals_speech_ms: Vec<u64>,
    /// The first bytes (up to 16) of the first audio frame.
    pub first_audio: Vec<u8>,
    /// When the WebSocket handshake was accepted.
    pub opened_at: Option<Instant>,
    pub closed: Option<DgClose>,
}

impl DgConnection {
    /// The first value of a query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    /// Every value of a repeated query parameter.
    pub fn params(&self, name: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Everything the fake saw.
#[derive(Debug, Clone, Default)]
pub struct DeepgramRecord {
    pub connections: Vec<DgConnection>,
    /// Handshakes answered with an error: (status, reason).
    pub rejected: Vec<(u16, String)>,
}

struct Shared {
    cfg: Mutex<FakeDeepgramConfig>,
    queue: Mutex<VecDeque<String>>,
    record: Recorder<DeepgramRecord>,
    tasks: Tasks,
}

/// A running fake; dropping it stops the server and its sessions.
pub struct FakeDeepgram(http::Server<Shared>);

impl http::FakeState for Shared {
    fn tasks(&self) -> &Tasks {
        &self.tasks
    }
}

impl FakeDeepgram {
    /// Starts a fake accepting `api_key`, with default settings.
    pub async fn start(api_key: &str) -> std::io::Result<Self> {
        Self::start_with(FakeDeepgramConfig {
            api_key: api_key.into(),
            ..Default::default()
        })
        .await
    }

    pub async fn start_with(cfg: FakeDeepgramConfig) -> std::io::Result<Self> {
        let shared = Shared {
            queue: Mutex::new(cfg.transcripts.iter().cloned().collect()),
            cfg: Mutex::new(cfg),
            record: Recorder::default(),
            tasks: Tasks::default(),
        };
        Ok(Self(http::Server::start(shared, handle).await?))
    }

    /// `ws://127.0.0.1:PORT`, the `base_url` to configure.
    pub fn base_url(&self) -> String {
        format!("ws://{}", self.0.addr)
    }

    /// Queues a transcript for a later utterance.
    pub fn push_transcript(&self, text: &str) {
        if let Ok(mut q) = self.0.shared.queue.lock() {
            q.push_back(text.into());
        }
    }

    /// Sets (or clears) the failure mode for new connections.
    pub fn set_failure(&self, failure: Option<DeepgramFailure>) {
        if let Ok(mut c) = self.0.shared.cfg.lock() {
            c.failure = failure;
        }
    }

    pub fn record(&self) -> DeepgramRecord {
        self.0.shared.record.snapshot()
    }

    /// Waits (up to 10 s, then panics) until `pred` holds; returns that record.
    pub async fn wait_until(
        &self,
        what: &str,
        pred: impl FnMut(&DeepgramRecord) -> bool,
    ) -> DeepgramRecord {
        self.0.shared.record.wait_until(what, pred).await
    }
}

async fn handle(s: Arc<Shared>, mut req: Request<Incoming>) -> hyper::Response<Body> {
    let cfg = match s.cfg.lock() {
        Ok(c) => c.clone(),
        Err(_) => return http::plain(500, "poisoned"),
    };
    let request_id = format!("{:032x}", rand_u128());
    let reject = |status: u16, code: &str, msg: &str| {
        s.record
            .modify(|r| r.rejected.push((status, format!("{code}: {msg}"))));
        let mut resp = http::json(
            status,
            &json!({"err_code": code, "err_msg": msg, "request_id": request_id}),
        );
        if let Ok(v) = hyper::header::HeaderValue::from_str(&request_id) {
            resp.headers_mut().insert("dg-request-id", v.clone());
        }
        if let Ok(v) = hyper::header::HeaderValue::from_str(msg) {
            resp.headers_mut().insert("dg-error", v);
        }
        resp
    };
    if req.uri().path() == "/v1/projects" && req.method() == hyper::Method::GET {
        // The credential check.
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if auth != Some(format!("Token {}", cfg.api_key).as_str()) {
            return reject(401, "INVALID_AUTH", "Invalid credentials.");
        }
        return http::json(
            200,
            &json!({"projects": [{"project_id": "00000000-0000-0000-0000-000000000001", "name": "sim"}]}),
        );
    }
    if req.uri().path() != "/v1/listen" {
        return reject(404, "NOT_FOUND", "unknown path");
    }
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Token {}", cfg.api_key) {
        return reject(401, "INVALID_AUTH", "Invalid credentials.");
    }
    if let Some(DeepgramFailure::RefuseHandshake(status)) = cfg.failure {
        return reject(status, "REFUSED", "refused by test configuration");
    }
    let query = http::query_pairs(&req);
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if get("model").is_none_or(str::is_empty) {
        return reject(400, "Bad Request", "model is required");
    }
    // μ-law at 8 kHz (what patterd sends) or 16-bit little-endian PCM at 16 kHz (what
    // Patter's pipeline sends after decoding and resampling the carrier's μ-law).
    let linear16 = match (get("encoding"), get("sample_rate")) {
        (Some("mulaw"), Some("8000")) => false,
        (Some("linear16"), Some("16000")) => true,
        (Some("mulaw" | "linear16"), _) => {
            return reject(
                400,
                "Bad Request",
                "sample_rate must be 8000 (mulaw) or 16000 (linear16)",
            );
        }
        _ => return reject(400, "Bad Request", "encoding must be mulaw or linear16"),
    };
    if !upgrade::is_upgrade_request(&req) {
        return reject(426, "Bad Request", "WebSocket upgrade required");
    }
    let params = Params {
        endpointing_ms: match get("endpointing") {
            Some("false") => None,
            Some(v) => Some(v.parse().unwrap_or(10)),
            None => Some(10),
        },
        utterance_end_ms: get("utterance_end_ms").and_then(|v| v.parse().ok()),
        vad_events: get("vad_events") == Some("true"),
        interim: get("interim_results") == Some("true"),
        request_id: request_id.clone(),
        linear16,
    };
    let conn = DgConnection {
        query: query.clone(),
        headers: http::header_pairs(&req),
        opened_at: Some(Instant::now()),
        ..Default::default()
    };
    let (resp, fut) = match upgrade::upgrade(&mut req) {
        Ok(x) => x,
        Err(_) => return reject(400, "Bad Request", "bad WebSocket handshake"),
    };
    let mut idx = 0;
    s.record.modify(|r| {
        idx = r.connections.len();
        r.connections.push(conn);
    });
    let s2 = s.clone();
    s.tasks.spawn(async move {
        match fut.await {
            Ok(ws) => session(s2, idx, cfg, params, ws).await,
            Err(e) => s2.record.modify(|r| {
                r.connections[idx].closed = Some(DgClose {
                    code: 1006,
                    reason: format!("upgrade failed: {e}"),
                    by_client: true,
                })
            }),
        }
    });
    let mut resp = resp.map(http_body_util::BodyExt::boxed);
    if let Ok(v) = hyper::header::HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("dg-request-id", v);
    }
    resp
}

fn dg_close(code: u16, reason: &str, by_client: bool) -> DgClose {
    DgClose {
        code,
        reason: reason.into(),
        by_client,
    }
}

fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u128::from_le_bytes(b)
}

struct Params {
    endpointing_ms: Option<u64>,
    utterance_end_ms: Option<u64>,
    vad_events: bool,
    interim: bool,
    request_id: String,
    /// 16-bit PCM at 16 kHz (32 bytes per ms) instead of μ-law at 8 kHz (8 bytes per ms).
    linear16: bool,
}

impl Params {
    fn bytes_per_ms(&self) -> u64 {
        if self.linear16 { 32 } else { 8 }
    }
}

/// Mean absolute level of 16-bit little-endian PCM.
fn pcm16_level(b: &[u8]) -> f64 {
    let n = b.len() / 2;
    if n == 0 {
        return 0.0;
    }
    b.chunks_exact(2)
        .map(|s| f64::from(i16::from_le_bytes([s[0], s[1]])).abs())
        .sum::<f64>()
        / n as f64
}

/// Per-connection speech detector and transcript state.
#[derive(Default)]
struct Ears {
    audio_ms: u64,
    in_speech: bool,
    /// Speech heard since the last final.
    heard: bool,
    speech_ms: u64,
    silence_ms: u64,
    utterance_end_due: bool,
    current: Option<String>,
    utterance_start_ms: u64,
    /// Word-track mode: index of the first word not yet in a final.
    next_word: usize,
    /// Word-track mode: words in the last interim.
    interim_words: usize,
    /// Word-track mode: when the last word heard ended.
    last_word_end: u64,
    /// Word-track mode: how long after its end a word is reported.
    lag_ms: u64,
}

async fn session(
    s: Arc<Shared>,
    idx: usize,
    cfg: FakeDeepgramConfig,
    p: Params,
    ws: fastwebsockets::WebSocket<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
) {
    let mut conn = WsConn::new(ws, cfg.idle_timeout);
    let mut ears = Ears {
        lag_ms: cfg.word_lag_ms,
        ..Ears::default()
    };
    let rec =
        |f: &mut dyn FnMut(&mut DgConnection)| s.record.modify(|r| f(&mut r.connections[idx]));
    // Sends text frames; returns false when the socket is gone.
    macro_rules! send_all {
        ($msgs:expr) => {{
            let mut ok = true;
            for m in $msgs {
                let text = m.to_string();
                if conn.text(&text).await.is_err() {
                    ok = false;
                    break;
                }
                let at = Instant::now();
                let speech_final = m.get("speech_final").and_then(Value::as_bool) == Some(true);
                let heard_ms = ears.speech_ms;
                rec(&mut |c| {
                    if speech_final {
                        c.finals_at.push(at);
                        c.finals_speech_ms.push(heard_ms);
                    }
                    if cfg.record_frames {
                        c.sent.push(text.clone());
                    }
                });
            }
            ok
        }};
    }
    // The fake closes: sends the close frame, returns how the connection ended.
    macro_rules! close {
        ($code:expr, $reason:expr) => {{
            let _ = conn.close($code, $reason).await;
            dg_close($code, $reason, false)
        }};
    }
    let ended: DgClose = loop {
        match conn.recv().await {
            None => {
                break close!(1011, "NET-0001");
            }
            Some(WsIn::Binary(b)) => {
                if b.is_empty() {
                    break close!(1002, "empty binary frame");
                }
                let mut total = 0;
                rec(&mut |c| {
                    if c.audio_frames == 0 {
                        c.first_audio = b[..b.len().min(16)].to_vec();
                    }
                    c.audio_bytes += b.len();
                    c.audio_frames += 1;
                    total = c.audio_bytes;
                });
                // Read live, so a test can drop a connection that is already open.
                let failure = s.cfg.lock().ok().and_then(|c| c.failure.clone());
                if let Some(DeepgramFailure::DropAfterAudioBytes(n)) = failure
                    && total >= n
                {
                    break dg_close(1006, "dropped by test configuration", false);
                }
                let mut out = Vec::new();
                for block in b.chunks(20 * p.bytes_per_ms() as usize) {
                    match &cfg.words {
                        Some(track) => ears.step_words(&p, track, block, &mut out),
                        None => ears.step(&s, &cfg, &p, block, &mut out),
                    }
                }
                if !send_all!(out) {
                    break dg_close(1006, "send failed", true);
                }
            }
            Some(WsIn::Text(t)) => {
                if cfg.record_frames {
                    rec(&mut |c| c.messages.push(t.clone()));
                }
                let v: Value = match serde_json::from_str(&t) {
                    Ok(v) => v,
                    Err(_) => {
                        break close!(1008, "DATA-0000");
                    }
                };
                match v.get("type").and_then(Value::as_str) {
                    Some("KeepAlive") => rec(&mut |c| c.keepalives += 1),
                    Some("Finalize") => {
                        rec(&mut |c| c.finalizes += 1);
                        let out = match &cfg.words {
                            // Finalize flushes: every word said by now, lag or not.
                            Some(track) => vec![ears.words_final(&p, track, false, true, 0)],
                            None => vec![ears.final_result(&s, &cfg, &p, false, true)],
                        };
                        if !send_all!(out) {
                            break dg_close(1006, "send failed", true);
                        }
                    }
                    Some("CloseStream") => {
                        rec(&mut |c| c.close_streams += 1);
                        let mut out = Vec::new();
                        if let Some(track) = &cfg.words {
                            if ears.heard {
                                out.push(ears.words_final(&p, track, false, false, 0));
                            }
                        } else if ears.heard {
                            out.push(ears.final_result(&s, &cfg, &p, false, false));
                        }
                        out.push(json!({
                                "type": "Metadata", "transaction_key": "deprecated",
                                "request_id": p.request_id, "sha256": "0", "created": "2026-01-01T00:00:00.000Z",
                                "duration": ears.audio_ms as f64 / 1000.0, "channels": 1
                            }));
                        send_all!(out);
                        break close!(1000, "");
                    }
                    _ => {} // unknown control messages are ignored
                }
            }
            Some(WsIn::Close { code, reason }) => {
                break DgClose {
                    code: code.unwrap_or(1005),
                    reason,
                    by_client: true,
                };
            }
            Some(WsIn::Failed(e)) => {
                break DgClose {
                    code: 1006,
                    reason: e,
                    by_client: true,
                };
            }
        }
    };
    if !ended.by_client && ended.code != 1006 {
        // Give the client a moment to answer the close frame.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while !matches!(conn.recv_any().await, WsIn::Close { .. } | WsIn::Failed(_)) {}
        })
        .await;
    }
    s.record.modify(|r| r.connections[idx].closed = Some(ended));
}

impl Ears {
    fn step(
        &mut self,
        s: &Shared,
        cfg: &FakeDeepgramConfig,
        p: &Params,
        block: &[u8],
        out: &mut Vec<Value>,
    ) {
        let ms = (block.len() as u64).div_ceil(p.bytes_per_ms());
        let start_ms = self.audio_ms;
        self.audio_ms += ms;
        let level = if p.linear16 {
            pcm16_level(block)
        } else {
            mulaw_level(block)
        };
        if level > SPEECH_LEVEL {
            if !self.in_speech {
                self.in_speech = true;
                if !self.heard {
                    self.utterance_start_ms = start_ms;
                    self.speech_ms = 0;
                }
                if p.vad_events {
                    out.push(json!({"type": "SpeechStarted", "channel": [0, 1], "timestamp": start_ms as f64 / 1000.0}));
                }
            }
            if self.current.is_none() {
                self.current = Some(next_transcript(s, cfg));
            }
            self.heard = true;
            self.utterance_end_due = true;
            self.silence_ms = 0;
            let before = self.speech_ms / INTERIM_EVERY_MS;
            self.speech_ms += ms;
            if p.interim && self.speech_ms / INTERIM_EVERY_MS > before {
                let words: Vec<&str> = self
                    .current
                    .as_deref()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                let n = ((self.speech_ms / INTERIM_EVERY_MS) as usize).min(words.len());
                out.push(self.results(p, &words[..n].join(" "), false, false, false));
            }
        } else {
            self.silence_ms += ms;
            self.in_speech = false;
            if self.heard
                && let Some(e) = p.endpointing_ms
                && self.silence_ms >= e
            {
                out.push(self.final_result(s, cfg, p, true, false));
            }
            if self.utterance_end_due
                && let Some(u) = p.utterance_end_ms
                && self.silence_ms >= u
            {
                self.utterance_end_due = false;
                out.push(json!({"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": (self.audio_ms - self.silence_ms) as f64 / 1000.0}));
            }
        }
    }

    /// One 20 ms block in word-track mode: what a recogniser would say once it has heard the
    /// audio up to the end of the block.
    fn step_words(&mut self, p: &Params, track: &WordTrack, block: &[u8], out: &mut Vec<Value>) {
        let ms = (block.len() as u64).div_ceil(p.bytes_per_ms());
        let start_ms = self.audio_ms;
        self.audio_ms += ms;
        let now = self.audio_ms;
        let words = track.snapshot();
        let pending = words.get(self.next_word..).unwrap_or_default();
        let started: Vec<&TimedWord> = pending.iter().filter(|w| w.start_ms < now).collect();
        if let Some(first) = started.first()
            && !self.in_speech
        {
            self.in_speech = true;
            self.heard = true;
            self.utterance_start_ms = first.start_ms;
            if p.vad_events {
                out.push(json!({"type": "SpeechStarted", "channel": [0, 1], "timestamp": first.start_ms.max(start_ms) as f64 / 1000.0}));
            }
        }
        if !started.is_empty() {
            self.utterance_end_due = true;
            self.last_word_end = started.iter().map(|w| w.end_ms).max().unwrap_or(0);
        }
        // Words reported so far: said, and their lag over.
        let said = started
            .iter()
            .filter(|w| w.end_ms + self.lag_ms <= now)
            .count();
        let speaking = started.iter().any(|w| w.end_ms + self.lag_ms > now);
        let last_end = self.last_word_end;
        self.speech_ms = started
            .iter()
            .map(|w| w.end_ms.min(now) - w.start_ms.min(now))
            .sum();
        if p.interim && said > self.interim_words {
            self.interim_words = said;
            let text = join(&started[..said]);
            let timed = timings(&started[..said]);
            out.push(self.results_words(p, &text, timed, false, false, false));
        }
        if !started.is_empty()
            && !speaking
            && let Some(e) = p.endpointing_ms
            && now.saturating_sub(last_end) >= e
        {
            out.push(self.words_final(p, track, true, false, self.lag_ms));
        }
        if !speaking
            && self.utterance_end_due
            && let Some(u) = p.utterance_end_ms
            && now.saturating_sub(last_end) >= u
        {
            self.utterance_end_due = false;
            out.push(json!({"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": last_end as f64 / 1000.0}));
        }
    }

    /// A final in word-track mode: every pending word said by now, `lag_ms` ago at the
    /// latest (words still being said, or said since, wait for the next result).
    fn words_final(
        &mut self,
        p: &Params,
        track: &WordTrack,
        speech_final: bool,
        from_finalize: bool,
        lag_ms: u64,
    ) -> Value {
        let now = self.audio_ms;
        let words = track.snapshot();
        let pending = words.get(self.next_word..).unwrap_or_default();
        let said: Vec<&TimedWord> = pending
            .iter()
            .take_while(|w| w.end_ms + lag_ms <= now)
            .collect();
        self.next_word += said.len();
        let still = words
            .get(self.next_word..)
            .unwrap_or_default()
            .iter()
            .any(|w| w.start_ms < now);
        self.in_speech = still;
        self.heard = still;
        self.interim_words = 0;
        let text = join(&said);
        self.results_words(p, &text, timings(&said), true, speech_final, from_finalize)
    }

    fn results_words(
        &self,
        p: &Params,
        text: &str,
        words: Vec<Value>,
        is_final: bool,
        speech_final: bool,
        from_finalize: bool,
    ) -> Value {
        let mut v = self.results(p, text, is_final, speech_final, from_finalize);
        v["channel"]["alternatives"][0]["words"] = Value::Array(words);
        v
    }

    /// A final for what was heard (empty when nothing was).
    fn final_result(
        &mut self,
        _s: &Shared,
        _cfg: &FakeDeepgramConfig,
        p: &Params,
        speech_final: bool,
        from_finalize: bool,
    ) -> Value {
        let text = if self.heard {
            self.current.take().unwrap_or_default()
        } else {
            String::new()
        };
        self.heard = false;
        self.in_speech = false;
        self.results(p, &text, true, speech_final, from_finalize)
    }

    fn results(
        &self,
        p: &Params,
        text: &str,
        is_final: bool,
        speech_final: bool,
        from_finalize: bool,
    ) -> Value {
        let start = self.utterance_start_ms as f64 / 1000.0;
        let duration = (self.audio_ms.saturating_sub(self.utterance_start_ms)) as f64 / 1000.0;
        json!({
            "type": "Results", "channel_index": [0, 1], "duration": duration, "start": start,
            "is_final": is_final, "speech_final": speech_final, "from_finalize": from_finalize,
            "channel": {"alternatives": [{"transcript": text, "confidence": 0.98, "words": []}]},
            "metadata": {"request_id": p.request_id, "model_uuid": "fake",
                         "model_info": {"name": "fake-nova-3", "version": "0", "arch": "nova-3"}}
        })
    }
}

fn join(words: &[&TimedWord]) -> String {
    words
        .iter()
        .map(|w| w.word.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Deepgram's per-word entries (seconds).
fn timings(words: &[&TimedWord]) -> Vec<Value> {
    words
        .iter()
        .map(|w| {
            json!({"word": w.word.to_lowercase(), "punctuated_word": w.word,
                   "start": w.start_ms as f64 / 1000.0, "end": w.end_ms as f64 / 1000.0,
                   "confidence": 0.97})
        })
        .collect()
}

fn next_transcript(s: &Shared, cfg: &FakeDeepgramConfig) -> String {
    s.queue
        .lock()
        .ok()
        .and_then(|mut q| q.pop_front())
        .unwrap_or_else(|| cfg.default_transcript.clone())
}

#[cfg(test)]
#[path = "deepgram_tests.rs"]
mod tests;
