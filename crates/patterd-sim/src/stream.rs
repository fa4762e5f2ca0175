//! One simulated carrier media stream ([`SimCall`]), in the dialect of Twilio, Telnyx or Plivo
//! ([`Dialect`]). The carrier's side of the bidirectional stream: it opens the WebSocket (Plivo:
//! offering the `audio.drachtio.org` subprotocol and insisting it is selected), sends the
//! opening frames (`connected` + `start`; Plivo only `start`), then streams one 20 ms `media`
//! frame every 20 ms (queued caller audio, else silence — carriers never pause; Plivo L16 as
//! little-endian PCM; Telnyx optionally swapping frame pairs, as it does not guarantee order).
//! Agent audio the app sends is appended to a playback queue drained at 8 bytes/ms; marks are
//! acknowledged once everything queued before them has played (at once on an empty queue):
//! Twilio/Telnyx echo `mark`, Plivo sends `playedStream` for a `checkpoint`. A clear drops the
//! queue: Twilio/Telnyx echo the pending marks, Plivo answers `clearedAudio` and never
//! acknowledges the cleared checkpoints. Hanging up is `stop` + close (Plivo: close only).
//! Every frame the app sends is validated against the dialect; violations are recorded as
//! protocol errors. Tests observe the call through [`SimCall::wait_for`].

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::{Frame, OpCode, Payload};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

use patterd::audio::g711::{SILENCE_ULAW, ulaw_energy, ulaw_silence, ulaw_tone};
use patterd::carrier::{FRAME_BYTES, FRAME_MS};
use patterd::net::ws_client::{WsConnectError, connect};
use patterd::util::TaskGuard;

use crate::twilio::{TwimlAnswer, new_sid, sign_request};
use crate::ws::{WsFrame, WsWrite, spawn_reader};

/// Most timeline entries kept (older ones are not dropped; new ones stop being added).
const TIMELINE_CAP: usize = 20_000;

/// Which carrier's media protocol the simulator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    #[default]
    Twilio,
    Telnyx,
    /// Plivo, streaming μ-law 8 kHz.
    PlivoMulaw,
    /// Plivo, streaming little-endian L16 8 kHz.
    PlivoL16,
}

impl Dialect {
    fn is_plivo(self) -> bool {
        matches!(self, Dialect::PlivoMulaw | Dialect::PlivoL16)
    }

    /// The name of the frame that flushes playback in this dialect.
    pub fn clear_event(self) -> &'static str {
        match self {
            Dialect::Twilio | Dialect::Telnyx => "clear",
            Dialect::PlivoMulaw | Dialect::PlivoL16 => "clearAudio",
        }
    }
}

/// A random UUID-shaped id (Telnyx and Plivo stream ids, Plivo call UUIDs).
pub fn new_uuid() -> String {
    let h = new_sid("");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// How a simulated stream is opened.
#[derive(Debug, Clone)]
pub struct SimCallConfig {
    /// The carrier protocol spoken.
    pub dialect: Dialect,
    /// Telnyx: send every tenth pair of media frames swapped.
    pub reorder_media: bool,
    /// Where patterd's media socket really listens, e.g. `ws://127.0.0.1:4321`. The path of
    /// the TwiML `<Stream url>` is appended to it.
    pub ws_base: String,
    pub account_sid: String,
    pub call_sid: String,
    /// If set, the handshake carries `X-Twilio-Signature` over the `<Stream url>` as written.
    pub auth_token: Option<String>,
    pub connect_timeout: Duration,
}

impl SimCallConfig {
    pub fn new(ws_base: &str, account_sid: &str, call_sid: &str) -> Self {
        Self {
            dialect: Dialect::Twilio,
            reorder_media: false,
            ws_base: ws_base.trim_end_matches('/').to_string(),
            account_sid: account_sid.to_string(),
            call_sid: call_sid.to_string(),
            auth_token: None,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// The same, speaking `dialect`.
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }
}

/// Who ended the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedBy {
    /// patterd sent a close frame.
    Server,
    /// The simulator hung up (`stop` + close 1000).
    Client,
    /// The connection dropped without a close frame.
    Transport,
}

/// How the socket ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseInfo {
    pub at_ms: u64,
    pub by: ClosedBy,
    /// Close code from the close frame (1000, 1008, ...), if there was one.
    pub code: Option<u16>,
    pub reason: String,
}

/// One agent reply as heard by the caller: media received from the first frame after a
/// `start`/`mark`/`clear` up to the next `mark` or `clear`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Utterance {
    /// When its first media frame arrived (ms since `start`).
    pub start_ms: u64,
    /// When its last media frame arrived.
    pub last_ms: u64,
    pub bytes: u64,
    /// Mean absolute PCM over the whole utterance.
    pub mean_energy: u32,
    /// The mark that ended it, if any.
    pub mark: Option<String>,
    /// A `clear` arrived before all of its audio had played.
    pub cleared: bool,
    #[doc(hidden)]
    pub energy_sum: u64,
    /// Playback-queue position just after its last byte.
    #[doc(hidden)]
    pub end_pos: u64,
}

/// Something that happened on the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimelineEvent {
    SentStart,
    /// First frame of a run of queued (non-filler) caller audio.
    SentSpeechStart,
    /// Queued caller audio ran out; filler silence follows.
    SentSpeechEnd,
    SentDtmf(char),
    SentRaw,
    SentStop,
    ReceivedMedia {
        bytes: usize,
    },
    ReceivedMark(String),
    ReceivedClear,
    EchoedMark(String),
    ProtocolError(String),
    Closed(Option<u16>),
}

/// A timestamped [`TimelineEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry {
    /// Milliseconds since `start` was sent.
    pub at_ms: u64,
    pub event: TimelineEvent,
}

/// Everything the simulator observed so far.
#[derive(Debug, Clone, Default)]
pub struct SimState {
    pub call_sid: String,
    pub stream_sid: String,
    /// `media` frames sent (speech and filler).
    pub frames_sent: u64,
    /// Queued caller-audio frames sent.
    pub speech_frames_sent: u64,
    /// Queued caller-audio frames not yet sent.
    pub speech_frames_queued: usize,
    /// When the last queued caller-audio frame went out (ms since `start`).
    pub last_speech_frame_ms: Option<u64>,
    pub agent_audio_bytes: u64,
    pub first_agent_audio_ms: Option<u64>,
    pub last_agent_audio_ms: Option<u64>,
    pub utterances: Vec<Utterance>,
    /// Marks received from the app, with arrival time.
    pub marks_received: Vec<(u64, String)>,
    /// Marks echoed back, with echo time.
    pub marks_echoed: Vec<(u64, String)>,
    /// Arrival times of `clear`s.
    pub clears: Vec<u64>,
    /// Agent audio played (or dropped by a clear) so far.
    pub played_bytes: u64,
    /// Agent audio queued but not played yet.
    pub playback_queued_bytes: u64,
    pub dtmf_sent: Vec<char>,
    pub protocol_errors: Vec<String>,
    pub closed: Option<CloseInfo>,
    pub timeline: Vec<TimelineEntry>,
}

impl SimState {
    /// Names of echoed marks, in order.
    pub fn echoed_mark_names(&self) -> Vec<&str> {
        self.marks_echoed.iter().map(|(_, n)| n.as_str()).collect()
    }

    /// Whether `name` has been echoed.
    pub fn mark_echoed(&self, name: &str) -> bool {
        self.marks_echoed.iter().any(|(_, n)| n == name)
    }

    /// True once the socket is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    fn push(&mut self, at_ms: u64, event: TimelineEvent) {
        if self.timeline.len() < TIMELINE_CAP {
            self.timeline.push(TimelineEntry { at_ms, event });
        }
    }
}

/// Why the simulator could not do something.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the answer document has no stream URL")]
    NoStream,
    #[error("bad stream URL `{0}`")]
    BadUrl(String),
    #[error("the server did not select the `{0}` subprotocol the carrier asked for")]
    Subprotocol(&'static str),
    #[error("could not open the media socket: {0}")]
    Connect(#[from] WsConnectError),
    #[error("could not send {what}: {message}")]
    Send { what: &'static str, message: String },
    #[error("timed out after {waited:?} waiting for {what}; simulator state: {state:#?}")]
    Timeout {
        what: String,
        waited: Duration,
        state: Box<SimState>,
    },
    #[error("the stream ended while waiting for {what}; simulator state: {state:#?}")]
    Ended { what: String, state: Box<SimState> },
}

enum Cmd {
    Audio(Vec<u8>, bool),
    Dtmf(char),
    Raw(String),
    HangUp(oneshot::Sender<()>),
}

enum Incoming {
    Text(String),
    Binary(usize),
    /// A frame fastwebsockets must send in reply (pong, close echo).
    Obligated(OpCode, Vec<u8>),
    Close(Option<u16>, String),
    Error(String),
}

/// A live simulated Twilio media stream. Dropping it tears the socket down without `stop`.
pub struct SimCall {
    pub call_sid: String,
    pub stream_sid: String,
    cmd: mpsc::UnboundedSender<Cmd>,
    state: watch::Receiver<SimState>,
    _driver: TaskGuard,
}

impl std::fmt::Debug for SimCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCall")
            .field("call_sid", &self.call_sid)
            .field("stream_sid", &self.stream_sid)
            .finish()
    }
}

/// Maps a TwiML `wss://host/path` onto `ws_base` + `/path` (query dropped, as Twilio does).
pub fn map_stream_url(stream_url: &str, ws_base: &str) -> Result<String, SimError> {
    map_url(stream_url, ws_base, false)
}

/// Maps `wss://host/path?query` onto `ws_base` + `/path`, keeping the query if asked.
fn map_url(stream_url: &str, ws_base: &str, keep_query: bool) -> Result<String, SimError> {
    let (_, rest) = stream_url
        .split_once("://")
        .ok_or_else(|| SimError::BadUrl(stream_url.to_string()))?;
    let path = rest.find('/').map_or("/", |i| &rest[i..]);
    let path = path.split('#').next().unwrap_or("/");
    let path = if keep_query {
        path
    } else {
        path.split('?').next().unwrap_or("/")
    };
    Ok(format!("{}{}", ws_base.trim_end_matches('/'), path))
}

impl SimCall {
    /// Opens the stream a TwiML answer asks for, with its `<Parameter>`s.
    pub async fn from_answer(answer: &TwimlAnswer, cfg: SimCallConfig) -> Result<Self, SimError> {
        let url = answer.stream_url.as_deref().ok_or(SimError::NoStream)?;
        Self::connect(url, &answer.parameters, cfg).await
    }

    /// Opens `stream_url` (as written in the TwiML) and sends `connected` + `start`.
    pub async fn connect(
        stream_url: &str,
        custom_parameters: &BTreeMap<String, String>,
        cfg: SimCallConfig,
    ) -> Result<Self, SimError> {
        let dialect = cfg.dialect;
        let url = map_url(stream_url, &cfg.ws_base, dialect != Dialect::Twilio)?;
        let sig = cfg
            .auth_token
            .as_deref()
            .filter(|_| dialect == Dialect::Twilio)
            .map(|t| sign_request(t, stream_url, &[]));
        let mut headers: Vec<(&str, &str)> = match dialect {
            Dialect::Twilio => vec![("User-Agent", "Twilio.TmeWs/1.0")],
            Dialect::Telnyx => vec![("User-Agent", "Telnyx-Media-Streaming/1.0")],
            Dialect::PlivoMulaw | Dialect::PlivoL16 => vec![
                ("User-Agent", "Plivo-Stream/1.0"),
                (
                    "Sec-WebSocket-Protocol",
                    patterd::carrier::plivo::SUBPROTOCOL,
                ),
            ],
        };
        if let Some(sig) = &sig {
            headers.push(("X-Twilio-Signature", sig));
        }
        let (ws, resp_headers) = connect(&url, &headers, cfg.connect_timeout).await?;
        if dialect.is_plivo() {
            let selected = resp_headers
                .get("sec-websocket-protocol")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() == patterd::carrier::plivo::SUBPROTOCOL);
            if !selected {
                return Err(SimError::Subprotocol(patterd::carrier::plivo::SUBPROTOCOL));
            }
        }
        let (rd, mut wr) = crate::ws::split(ws);

        let stream_sid = match dialect {
            Dialect::Twilio => new_sid("MZ"),
            _ => new_uuid(),
        };
        let send = |what: &'static str| {
            move |e: fastwebsockets::WebSocketError| SimError::Send {
                what,
                message: e.to_string(),
            }
        };
        let opening: Vec<Value> = match dialect {
            Dialect::Twilio => vec![
                json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
                json!({
                    "event": "start",
                    "sequenceNumber": "1",
                    "start": {
                        "accountSid": cfg.account_sid,
                        "streamSid": stream_sid,
                        "callSid": cfg.call_sid,
                        "tracks": ["inbound"],
                        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                        "customParameters": custom_parameters,
                    },
                    "streamSid": stream_sid,
                }),
            ],
            Dialect::Telnyx => vec![
                json!({"event": "connected", "version": "1.0.0"}),
                json!({
                    "event": "start",
                    "sequence_number": "1",
                    "stream_id": stream_sid,
                    "start": {
                        "user_id": cfg.account_sid,
                        "call_control_id": cfg.call_sid,
                        "call_session_id": new_uuid(),
                        "from": "", "to": "",
                        "tags": [],
                        "client_state": null,
                        "custom_parameters": custom_parameters,
                        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
                    },
                }),
            ],
            Dialect::PlivoMulaw | Dialect::PlivoL16 => vec![json!({
                "event": "start",
                "sequenceNumber": 1,
                "start": {
                    "callId": cfg.call_sid,
                    "streamId": stream_sid,
                    "accountId": cfg.account_sid,
                    "tracks": ["inbound"],
                    "mediaFormat": {
                        "encoding": if dialect == Dialect::PlivoL16 { "audio/x-l16" } else { "audio/x-mulaw" },
                        "sampleRate": 8000,
                    },
                },
                "extra_headers": serde_json::to_string(custom_parameters).unwrap_or_default(),
            })],
        };
        for frame in opening {
            write_text(&mut wr, frame.to_string())
                .await
                .map_err(send("start"))?;
        }
        let t0 = Instant::now();

        let mut initial = SimState {
            call_sid: cfg.call_sid.clone(),
            stream_sid: stream_sid.clone(),
            ..Default::default()
        };
        initial.push(0, TimelineEvent::SentStart);
        let (state_tx, state_rx) = watch::channel(initial);
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let reader = spawn_reader(rd, in_tx, |f| {
            Some(match f {
                WsFrame::Obligated(op, payload) => Incoming::Obligated(op, payload),
                WsFrame::Text(t) => Incoming::Text(String::from_utf8_lossy(t).into_owned()),
                WsFrame::Binary(b) => Incoming::Binary(b.len()),
                WsFrame::Close(code, reason) => Incoming::Close(code, reason),
                WsFrame::Error(e) => Incoming::Error(e),
            })
        });
        let driver = Driver {
            dialect,
            reorder: cfg.reorder_media && dialect == Dialect::Telnyx,
            held_frame: None,
            wr,
            state: state_tx,
            t0,
            stream_sid: stream_sid.clone(),
            account_sid: cfg.account_sid.clone(),
            call_sid: cfg.call_sid.clone(),
            seq: 1,
            chunk: 0,
            inbound: VecDeque::new(),
            in_speech: false,
            enqueued: 0,
            played: 0,
            pending_marks: VecDeque::new(),
            open_utterance: None,
            _reader: reader,
        };
        let task = tokio::spawn(driver.run(cmd_rx, in_rx));
        Ok(Self {
            call_sid: cfg.call_sid,
            stream_sid,
            cmd: cmd_tx,
            state: state_rx,
            _driver: TaskGuard::new(task),
        })
    }

    /// Queues caller audio (μ-law), sent as 20 ms frames in real time; the last frame is padded
    /// with silence.
    pub fn push_audio(&self, ulaw: &[u8]) {
        for chunk in ulaw.chunks(FRAME_BYTES) {
            let mut frame = chunk.to_vec();
            frame.resize(FRAME_BYTES, SILENCE_ULAW);
            let _ = self.cmd.send(Cmd::Audio(frame, true));
        }
    }

    /// Queues a caller "utterance": a sine tone.
    pub fn push_tone(&self, freq_hz: f64, ms: u64, amplitude: i16) {
        self.push_audio(&ulaw_tone(freq_hz, ms, amplitude));
    }

    /// Queues explicit silence (counted as queued audio, unlike the idle filler).
    pub fn push_silence(&self, ms: u64) {
        for chunk in ulaw_silence(ms).chunks(FRAME_BYTES) {
            let _ = self.cmd.send(Cmd::Audio(chunk.to_vec(), false));
        }
    }

    /// Sends a `dtmf` event (as Twilio does when the caller presses a key).
    pub fn send_dtmf(&self, digit: char) {
        let _ = self.cmd.send(Cmd::Dtmf(digit));
    }

    /// Sends an arbitrary text frame (malformed-input tests).
    pub fn send_raw(&self, text: &str) {
        let _ = self.cmd.send(Cmd::Raw(text.to_string()));
    }

    /// The caller hangs up: `stop`, then close 1000. Returns once the socket is closed.
    pub async fn hang_up(&self) {
        let (tx, rx) = oneshot::channel();
        if self.cmd.send(Cmd::HangUp(tx)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
        }
    }

    /// A snapshot of the current state.
    pub fn state(&self) -> SimState {
        self.state.borrow().clone()
    }

    /// Waits until `pred` holds for the state (checked on every change), up to `timeout`.
    /// `what` describes the condition for the error message.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&SimState) -> bool,
    ) -> Result<SimState, SimError> {
        let mut rx = self.state.clone();
        match tokio::time::timeout(timeout, rx.wait_for(|s| pred(s))).await {
            Ok(Ok(s)) => Ok(s.clone()),
            Ok(Err(_)) => Err(SimError::Ended {
                what: what.to_string(),
                state: Box::new(self.state()),
            }),
            Err(_) => Err(SimError::Timeout {
                what: what.to_string(),
                waited: timeout,
                state: Box::new(self.state()),
            }),
        }
    }

    /// Waits for the socket to close (by either side).
    pub async fn wait_closed(&self, timeout: Duration) -> Result<CloseInfo, SimError> {
        let s = self
            .wait_for("the socket to close", timeout, |s| s.closed.is_some())
            .await?;
        s.closed.ok_or_else(|| SimError::Ended {
            what: "close info".into(),
            state: Box::new(self.state()),
        })
    }
}

async fn write_text(wr: &mut WsWrite, text: String) -> Result<(), fastwebsockets::WebSocketError> {
    wr.write_frame(Frame::text(Payload::Owned(text.into_bytes())))
        .await
}

struct Driver {
    dialect: Dialect,
    /// Swap every tenth pair of media frames (Telnyx).
    reorder: bool,
    /// A media frame held back to be sent after the next one.
    held_frame: Option<Value>,
    wr: WsWrite,
    state: watch::Sender<SimState>,
    t0: Instant,
    stream_sid: String,
    account_sid: String,
    call_sid: String,
    /// Last `sequenceNumber` used.
    seq: u64,
    /// Last media `chunk` used.
    chunk: u64,
    inbound: VecDeque<(Vec<u8>, bool)>,
    in_speech: bool,
    /// Agent audio bytes ever queued for playback.
    enqueued: u64,
    /// Agent audio bytes played or dropped.
    played: u64,
    pending_marks: VecDeque<(String, u64)>,
    open_utterance: Option<usize>,
    _reader: TaskGuard,
}

impl Driver {
    fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// The next sequence number: a string for Twilio/Telnyx, a number for Plivo.
    fn next_seq(&mut self) -> Value {
        self.seq += 1;
        if self.dialect.is_plivo() {
            json!(self.seq)
        } else {
            json!(self.seq.to_string())
        }
    }

    async fn run(
        mut self,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
        mut incoming: mpsc::UnboundedReceiver<Incoming>,
    ) {
        let mut tick = tokio::time::interval_at(
            self.t0 + Duration::from_millis(FRAME_MS),
            Duration::from_millis(FRAME_MS),
        );
        tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
        loop {
            let keep_going = tokio::select! {
                biased;
                msg = incoming.recv() => match msg {
                    Some(m) => self.on_incoming(m).await,
                    None => {
                        self.set_closed(ClosedBy::Transport, None, "reader ended".into());
                        false
                    }
                },
                cmd = cmds.recv() => match cmd {
                    Some(c) => self.on_cmd(c).await,
                    None => false,
                },
                _ = tick.tick() => self.on_tick().await,
            };
            if !keep_going {
                // A write fails when patterd has already closed the socket: let its close
                // frame, which the reader may still be holding, be recorded first.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
                while self.state.borrow().closed.is_none() {
                    match tokio::time::timeout_at(deadline, incoming.recv()).await {
                        Ok(Some(m @ Incoming::Close(..))) => {
                            self.on_incoming(m).await;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
                self.set_closed(ClosedBy::Transport, None, "connection lost".into());
                return;
            }
        }
    }

    fn set_closed(&mut self, by: ClosedBy, code: Option<u16>, reason: String) {
        let at_ms = self.ms();
        self.state.send_modify(|s| {
            if s.closed.is_none() {
                s.closed = Some(CloseInfo {
                    at_ms,
                    by,
                    code,
                    reason,
                });
                s.push(at_ms, TimelineEvent::Closed(code));
            }
        });
    }

    /// Writes a frame; on failure records a transport close and returns false.
    async fn send(&mut self, v: Value) -> bool {
        match write_text(&mut self.wr, v.to_string()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "simulated Twilio: write failed");
                false
            }
        }
    }

    async fn on_tick(&mut self) -> bool {
        // Playback: 20 ms of agent audio.
        self.played = (self.played + FRAME_BYTES as u64).min(self.enqueued);
        if !self.echo_played_marks().await {
            return false;
        }
        // Caller audio: one frame, queued or filler silence.
        let (frame, speech) = self
            .inbound
            .pop_front()
            .unwrap_or_else(|| (vec![SILENCE_ULAW; FRAME_BYTES], false));
        self.chunk += 1;
        let at = self.ms();
        let seq = self.next_seq();
        let msg = match self.dialect {
            Dialect::Twilio => json!({
                "event": "media",
                "sequenceNumber": seq,
                "media": {
                    "track": "inbound",
                    "chunk": self.chunk.to_string(),
                    "timestamp": at.to_string(),
                    "payload": STANDARD.encode(&frame),
                },
                "streamSid": self.stream_sid,
            }),
            Dialect::Telnyx => json!({
                "event": "media",
                "sequence_number": seq,
                "media": {
                    "track": "inbound",
                    "chunk": self.chunk.to_string(),
                    "timestamp": at.to_string(),
                    "payload": STANDARD.encode(&frame),
                },
                "stream_id": self.stream_sid,
            }),
            Dialect::PlivoMulaw | Dialect::PlivoL16 => {
                let payload = if self.dialect == Dialect::PlivoL16 {
                    frame
                        .iter()
                        .flat_map(|&u| patterd::audio::g711::ulaw_to_linear(u).to_le_bytes())
                        .collect::<Vec<u8>>()
                } else {
                    frame.clone()
                };
                json!({
                    "event": "media",
                    "sequenceNumber": seq,
                    "streamId": self.stream_sid,
                    "media": {
                        "track": "inbound",
                        "timestamp": at.to_string(),
                        "chunk": self.chunk,
                        "payload": STANDARD.encode(payload),
                    },
                })
            }
        };
        if self.reorder && self.held_frame.is_none() && self.chunk % 10 == 5 {
            // Hold this frame back; it goes out after the next one.
            self.held_frame = Some(msg);
        } else {
            if !self.send(msg).await {
                return false;
            }
            if let Some(held) = self.held_frame.take()
                && !self.send(held).await
            {
                return false;
            }
        }
        let was_speech = self.in_speech;
        self.in_speech = speech;
        let (played, enqueued) = (self.played, self.enqueued);
        let queued = self.inbound.iter().filter(|(_, s)| *s).count();
        self.state.send_modify(|s| {
            s.frames_sent += 1;
            s.played_bytes = played;
            s.playback_queued_bytes = enqueued - played;
            s.speech_frames_queued = queued;
            if speech {
                s.speech_frames_sent += 1;
                s.last_speech_frame_ms = Some(at);
                if !was_speech {
                    s.push(at, TimelineEvent::SentSpeechStart);
                }
            } else if was_speech {
                s.push(at, TimelineEvent::SentSpeechEnd);
            }
        });
        true
    }

    /// Echoes pending marks whose audio has all played.
    async fn echo_played_marks(&mut self) -> bool {
        while let Some((_, pos)) = self.pending_marks.front() {
            if *pos > self.played {
                break;
            }
            let Some((name, _)) = self.pending_marks.pop_front() else {
                break;
            };
            if !self.echo_mark(name).await {
                return false;
            }
        }
        true
    }

    async fn echo_mark(&mut self, name: String) -> bool {
        let seq = self.next_seq();
        let msg = match self.dialect {
            Dialect::Twilio => json!({
                "event": "mark",
                "sequenceNumber": seq,
                "streamSid": self.stream_sid,
                "mark": {"name": name},
            }),
            Dialect::Telnyx => json!({
                "event": "mark",
                "sequence_number": seq,
                "stream_id": self.stream_sid,
                "mark": {"name": name},
            }),
            Dialect::PlivoMulaw | Dialect::PlivoL16 => json!({
                "event": "playedStream",
                "sequenceNumber": seq,
                "streamId": self.stream_sid,
                "name": name,
            }),
        };
        if !self.send(msg).await {
            return false;
        }
        let at = self.ms();
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::EchoedMark(name.clone()));
            s.marks_echoed.push((at, name));
        });
        true
    }

    async fn on_cmd(&mut self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Audio(frame, speech) => {
                self.inbound.push_back((frame, speech));
                let queued = self.inbound.iter().filter(|(_, s)| *s).count();
                self.state.send_modify(|s| s.speech_frames_queued = queued);
                true
            }
            Cmd::Dtmf(digit) => {
                let seq = self.next_seq();
                let msg = match self.dialect {
                    Dialect::Twilio => json!({
                        "event": "dtmf",
                        "streamSid": self.stream_sid,
                        "sequenceNumber": seq,
                        "dtmf": {"track": "inbound_track", "digit": digit.to_string()},
                    }),
                    Dialect::Telnyx => json!({
                        "event": "dtmf",
                        "stream_id": self.stream_sid,
                        "occurred_at": "2026-01-01T00:00:00.000000Z",
                        "sequence_number": seq,
                        "dtmf": {"digit": digit.to_string()},
                    }),
                    Dialect::PlivoMulaw | Dialect::PlivoL16 => json!({
                        "event": "dtmf",
                        "sequenceNumber": seq,
                        "streamId": self.stream_sid,
                        "dtmf": {"track": "inbound", "digit": digit.to_string(), "timestamp": self.ms().to_string()},
                    }),
                };
                let ok = self.send(msg).await;
                let at = self.ms();
                self.state.send_modify(|s| {
                    s.dtmf_sent.push(digit);
                    s.push(at, TimelineEvent::SentDtmf(digit));
                });
                ok
            }
            Cmd::Raw(text) => {
                let ok = write_text(&mut self.wr, text).await.is_ok();
                let at = self.ms();
                self.state
                    .send_modify(|s| s.push(at, TimelineEvent::SentRaw));
                ok
            }
            Cmd::HangUp(done) => {
                let seq = self.next_seq();
                let stop = match self.dialect {
                    Dialect::Twilio => Some(json!({
                        "event": "stop",
                        "sequenceNumber": seq,
                        "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
                        "streamSid": self.stream_sid,
                    })),
                    Dialect::Telnyx => Some(json!({
                        "event": "stop",
                        "sequence_number": seq,
                        "stream_id": self.stream_sid,
                        "stop": {"user_id": self.account_sid, "call_control_id": self.call_sid},
                    })),
                    // Plivo ends a stream by closing the socket.
                    Dialect::PlivoMulaw | Dialect::PlivoL16 => None,
                };
                if let Some(stop) = stop {
                    let _ = self.send(stop).await;
                    let at = self.ms();
                    self.state
                        .send_modify(|s| s.push(at, TimelineEvent::SentStop));
                }
                let _ = self
                    .wr
                    .write_frame(Frame::close(1000, b"caller hung up"))
                    .await;
                self.set_closed(ClosedBy::Client, Some(1000), "caller hung up".into());
                let _ = done.send(());
                false
            }
        }
    }

    async fn on_incoming(&mut self, msg: Incoming) -> bool {
        match msg {
            Incoming::Text(text) => self.on_text(&text).await,
            Incoming::Binary(n) => {
                self.protocol_error(format!(
                    "binary frame of {n} bytes (Twilio expects JSON text)"
                ));
                true
            }
            Incoming::Obligated(op, payload) => {
                let _ = self
                    .wr
                    .write_frame(Frame::new(true, op, None, Payload::Owned(payload)))
                    .await;
                true
            }
            Incoming::Close(code, reason) => {
                self.set_closed(ClosedBy::Server, code, reason);
                false
            }
            Incoming::Error(e) => {
                self.set_closed(ClosedBy::Transport, None, e);
                false
            }
        }
    }

    fn protocol_error(&mut self, err: String) {
        let at = self.ms();
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::ProtocolError(err.clone()));
            s.protocol_errors.push(err);
        });
    }

    async fn on_text(&mut self, text: &str) -> bool {
        let short: String = text.chars().take(120).collect();
        let v: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                self.protocol_error(format!("frame is not a JSON object: {short}"));
                return true;
            }
            Err(e) => {
                self.protocol_error(format!("invalid JSON ({e}): {short}"));
                return true;
            }
        };
        let event = v.get("event").and_then(Value::as_str).unwrap_or("");
        match self.dialect {
            Dialect::Twilio => self.on_twilio_frame(event, &v, &short).await,
            Dialect::Telnyx => self.on_telnyx_frame(event, &v, &short).await,
            Dialect::PlivoMulaw | Dialect::PlivoL16 => self.on_plivo_frame(event, &v, &short).await,
        }
    }

    /// Checks an id field: `required` ones must be present; present ones must be this stream's.
    fn check_stream_id(&mut self, event: &str, v: &Value, key: &str, required: bool) -> bool {
        match v.get(key).and_then(Value::as_str) {
            Some(sid) if sid == self.stream_sid => true,
            Some(sid) => {
                let msg = format!(
                    "{event}: {key} `{sid}` is not this stream's `{}`",
                    self.stream_sid
                );
                self.protocol_error(msg);
                false
            }
            None if required => {
                self.protocol_error(format!("{event}: missing {key}"));
                false
            }
            None => true,
        }
    }

    /// Decodes `media.payload`, recording what is wrong with it.
    fn payload(&mut self, event: &str, v: &Value) -> Option<Vec<u8>> {
        let payload = v
            .get("media")
            .and_then(|m| m.get("payload"))
            .and_then(Value::as_str);
        let Some(payload) = payload else {
            self.protocol_error(format!("{event}: missing media.payload string"));
            return None;
        };
        match STANDARD.decode(payload) {
            Ok(audio) if audio.starts_with(b"RIFF") => {
                self.protocol_error(format!(
                    "{event}: payload has a WAV header (played as noise)"
                ));
                None
            }
            Ok(audio) => Some(audio),
            Err(e) => {
                self.protocol_error(format!("{event}: payload is not base64 ({e})"));
                None
            }
        }
    }

    async fn on_twilio_frame(&mut self, event: &str, v: &Value, short: &str) -> bool {
        if !matches!(event, "media" | "mark" | "clear") {
            self.protocol_error(format!("unknown or missing event `{event}`: {short}"));
            return true;
        }
        if !self.check_stream_id(event, v, "streamSid", true) {
            return true;
        }
        match event {
            "media" => {
                if let Some(audio) = self.payload(event, v) {
                    self.on_agent_audio(&audio);
                }
                true
            }
            "mark" => self.on_mark_frame(v).await,
            _ => self.on_clear().await,
        }
    }

    /// A `mark` frame (Twilio, Telnyx): `{"mark": {"name": …}}`.
    async fn on_mark_frame(&mut self, v: &Value) -> bool {
        let name = v
            .get("mark")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str);
        let Some(name) = name else {
            self.protocol_error("mark: missing mark.name string".into());
            return true;
        };
        self.on_mark(name.to_string()).await
    }

    async fn on_telnyx_frame(&mut self, event: &str, v: &Value, short: &str) -> bool {
        if !matches!(event, "media" | "mark" | "clear") {
            self.protocol_error(format!("unknown or missing event `{event}`: {short}"));
            return true;
        }
        if !self.check_stream_id(event, v, "stream_id", false) {
            return true;
        }
        match event {
            "media" => {
                if let Some(audio) = self.payload(event, v) {
                    // RTP mode: each message carries 20 ms to 30 s of PCMU.
                    if audio.len() < FRAME_BYTES || audio.len() > 30 * 8000 {
                        self.protocol_error(format!(
                            "media: {} bytes is outside 20 ms..30 s of PCMU",
                            audio.len()
                        ));
                    } else {
                        self.on_agent_audio(&audio);
                    }
                }
                true
            }
            "mark" => self.on_mark_frame(v).await,
            _ => self.on_clear().await,
        }
    }

    async fn on_plivo_frame(&mut self, event: &str, v: &Value, short: &str) -> bool {
        match event {
            "playAudio" => {
                if !self.check_stream_id(event, v, "streamId", false) {
                    return true;
                }
                let media = v.get("media");
                let ct = media
                    .and_then(|m| m.get("contentType"))
                    .and_then(Value::as_str);
                let rate = media.and_then(|m| m.get("sampleRate")).and_then(|r| {
                    r.as_u64()
                        .or_else(|| r.as_str().and_then(|s| s.parse().ok()))
                });
                let want = if self.dialect == Dialect::PlivoL16 {
                    "audio/x-l16"
                } else {
                    "audio/x-mulaw"
                };
                if ct != Some(want) || rate != Some(8000) {
                    self.protocol_error(format!(
                        "playAudio: contentType {ct:?} / sampleRate {rate:?} does not match the stream ({want}, 8000)"
                    ));
                    return true;
                }
                if let Some(audio) = self.payload(event, v) {
                    if self.dialect == Dialect::PlivoL16 {
                        if audio.len() % 2 != 0 {
                            self.protocol_error("playAudio: odd L16 byte count".into());
                            return true;
                        }
                        let ulaw: Vec<u8> = audio
                            .chunks_exact(2)
                            .map(|b| {
                                patterd::audio::g711::linear_to_ulaw(i16::from_le_bytes([
                                    b[0], b[1],
                                ]))
                            })
                            .collect();
                        self.on_agent_audio(&ulaw);
                    } else {
                        self.on_agent_audio(&audio);
                    }
                }
                true
            }
            "checkpoint" => {
                if !self.check_stream_id(event, v, "streamId", true) {
                    return true;
                }
                let Some(name) = v.get("name").and_then(Value::as_str) else {
                    self.protocol_error("checkpoint: missing name string".into());
                    return true;
                };
                self.on_mark(name.to_string()).await
            }
            "clearAudio" => {
                if !self.check_stream_id(event, v, "streamId", true) {
                    return true;
                }
                self.on_clear().await
            }
            _ => {
                self.protocol_error(format!("unknown or missing event `{event}`: {short}"));
                true
            }
        }
    }

    fn on_agent_audio(&mut self, audio: &[u8]) {
        let at = self.ms();
        self.enqueued += audio.len() as u64;
        let end_pos = self.enqueued;
        let energy_sum = u64::from(ulaw_energy(audio)) * audio.len() as u64;
        let mut open = self.open_utterance;
        self.state.send_modify(|s| {
            s.agent_audio_bytes += audio.len() as u64;
            s.first_agent_audio_ms.get_or_insert(at);
            s.last_agent_audio_ms = Some(at);
            s.playback_queued_bytes = end_pos - s.played_bytes.min(end_pos);
            s.push(at, TimelineEvent::ReceivedMedia { bytes: audio.len() });
            let idx = match open {
                Some(i) if i < s.utterances.len() => i,
                _ => {
                    s.utterances.push(Utterance {
                        start_ms: at,
                        ..Default::default()
                    });
                    s.utterances.len() - 1
                }
            };
            let u = &mut s.utterances[idx];
            u.last_ms = at;
            u.bytes += audio.len() as u64;
            u.energy_sum += energy_sum;
            u.mean_energy = u.energy_sum.checked_div(u.bytes).unwrap_or(0) as u32;
            u.end_pos = end_pos;
            open = Some(idx);
        });
        self.open_utterance = open;
    }

    async fn on_mark(&mut self, name: String) -> bool {
        let at = self.ms();
        let open = self.open_utterance.take();
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::ReceivedMark(name.clone()));
            s.marks_received.push((at, name.clone()));
            if let Some(u) = open.and_then(|i| s.utterances.get_mut(i)) {
                u.mark = Some(name.clone());
            }
        });
        if self.played >= self.enqueued {
            // Nothing queued: flush anything due, then echo this one at once.
            if !self.echo_played_marks().await {
                return false;
            }
            self.echo_mark(name).await
        } else {
            self.pending_marks.push_back((name, self.enqueued));
            true
        }
    }

    async fn on_clear(&mut self) -> bool {
        let at = self.ms();
        let played_before = self.played;
        self.played = self.enqueued;
        self.open_utterance = None;
        let enqueued = self.enqueued;
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::ReceivedClear);
            s.clears.push(at);
            for u in s.utterances.iter_mut().rev() {
                if u.end_pos <= played_before {
                    break;
                }
                u.cleared = true;
            }
            s.played_bytes = enqueued;
            s.playback_queued_bytes = 0;
        });
        if self.dialect.is_plivo() {
            // Cleared checkpoints are never acknowledged; the clear itself is.
            self.pending_marks.clear();
            let seq = self.next_seq();
            return self
                .send(json!({"event": "clearedAudio", "sequenceNumber": seq, "streamId": self.stream_sid}))
                .await;
        }
        while let Some((name, _)) = self.pending_marks.pop_front() {
            if !self.echo_mark(name).await {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_stream_urls() {
        assert_eq!(
            map_url(
                "wss://gw.example.com/twilio/media/abc?x=1",
                "ws://127.0.0.1:9/",
                false
            )
            .ok(),
            Some("ws://127.0.0.1:9/twilio/media/abc".to_string())
        );
        assert_eq!(
            map_url("wss://gw.example.com", "ws://127.0.0.1:9", false).ok(),
            Some("ws://127.0.0.1:9/".to_string())
        );
        assert!(map_url("nonsense", "ws://x", true).is_err());
        assert_eq!(
            map_url("wss://h/plivo/media/c?t=1", "ws://127.0.0.1:9", true).ok(),
            Some("ws://127.0.0.1:9/plivo/media/c?t=1".to_string())
        );
    }
}
