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

mod driver;
mod echo;
use driver::{Driver, write_text};
pub use echo::{EchoConfig, EchoPath};

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
    /// Vonage's media WebSocket: a `websocket:connected` text message, then binary L16 16 kHz
    /// both ways; control as text (`notify` → `websocket:notify`, `clear` →
    /// `websocket:cleared`).
    Vonage,
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
            Dialect::Vonage => "clear",
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
    /// At each start of queued caller speech: when (ms since `start`) and how much agent audio
    /// had played by then (a position in `received_audio`; what the caller had heard).
    pub speech_start_played: Vec<(u64, u64)>,
    pub dtmf_sent: Vec<char>,
    /// DTMF digits heard in the agent audio (in-band tones, decoded by [`crate::dtmf`]).
    pub dtmf_heard: String,
    pub protocol_errors: Vec<String>,
    pub closed: Option<CloseInfo>,
    pub timeline: Vec<TimelineEntry>,
    /// Every caller frame sent (speech and filler), in order (μ-law).
    pub sent_audio: Vec<u8>,
    /// Every byte of agent audio received, in order (μ-law; cleared audio included).
    pub received_audio: Vec<u8>,
    /// For each `clear`: the playback position (bytes of agent audio) reached when it
    /// arrived; audio before it was heard, audio after it was dropped.
    pub cleared_at_pos: Vec<u64>,
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
    /// Words of the audio queued next, relative to its first sample, for a word track.
    Words(
        std::sync::Arc<crate::words::WordTrack>,
        Vec<crate::words::TimedWord>,
    ),
    /// Background noise (linear PCM, looped) mixed into every frame sent; `None` stops it.
    Background(Option<Vec<i16>>),
    /// A live echo of the played agent audio in the caller's frames; `None` stops it.
    Echo(Option<EchoConfig>),
    Dtmf(char),
    Raw(String),
    HangUp(oneshot::Sender<()>),
}

enum Incoming {
    Text(String),
    Binary(Vec<u8>),
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
            Dialect::Vonage => vec![("User-Agent", "Vonage-Websocket/1.0")],
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
            Dialect::Vonage => {
                let mut first = serde_json::Map::new();
                for (k, v) in custom_parameters {
                    first.insert(k.clone(), json!(v));
                }
                first.insert("event".into(), json!("websocket:connected"));
                first.insert("content-type".into(), json!("audio/l16;rate=16000"));
                vec![Value::Object(first)]
            }
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
                WsFrame::Binary(b) => Incoming::Binary(b.to_vec()),
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
            dtmf: crate::dtmf::DtmfReceiver::new(),
            background: None,
            echo: None,
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

    /// Queues caller speech whose words (times relative to the clip's start) go into `track`
    /// at the stream time the clip will be sent: the ground truth a fake Deepgram with the
    /// same track transcribes from.
    pub fn push_words(
        &self,
        ulaw: &[u8],
        words: Vec<crate::words::TimedWord>,
        track: &std::sync::Arc<crate::words::WordTrack>,
    ) {
        let _ = self.cmd.send(Cmd::Words(track.clone(), words));
        self.push_audio(ulaw);
    }

    /// Mixes `pcm` (8 kHz linear, looped) into every caller frame from now on, queued speech
    /// and idle filler alike: background noise on the line. `None` stops it.
    pub fn set_background(&self, pcm: Option<Vec<i16>>) {
        let _ = self
            .cmd
            .send(Cmd::Background(pcm.filter(|p| !p.is_empty())));
    }

    /// From now on the agent audio the carrier plays comes back in the caller's frames
    /// (`cfg`: delay and level; see [`EchoPath`]), mixed on top of queued speech, filler and
    /// background: a live line echo. Audio queued before this call does not echo. `None` stops it.
    pub fn set_echo(&self, cfg: Option<EchoConfig>) {
        let _ = self.cmd.send(Cmd::Echo(cfg));
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
