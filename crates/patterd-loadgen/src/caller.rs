//! One simulated Twilio caller for the load generator: a lean cousin of
//! [`patterd_sim::twilio::SimCall`] that keeps only what a load run measures. [`connect_call`]
//! posts the signed voice webhook, opens the Media Streams socket from the TwiML answer and
//! sends `connected` + `start`; from then on the call is a [`Driver`] owned by a shard
//! ([`crate::shard`]), which drives hundreds of callers from one task and one timer. On each of
//! its 20 ms ticks the caller sends one `media` frame (a pre-encoded speech clip while it
//! speaks, otherwise near-silence carrying the call's tag so the fake Deepgram can tell calls
//! apart), built into a reused buffer from precomputed base64 (no allocation per frame). It
//! models Twilio's playback queue (8 bytes/ms) to echo `mark`s when their audio has played and
//! to notice underruns, and it timestamps every agent message on arrival (in the socket's
//! reader task): per turn it keeps when the caller's speech ended and when the reply's first
//! frame arrived, and per utterance the gaps between frames. Every agent message is checked
//! against Twilio's protocol (JSON, a known event, this stream's `streamSid`, valid base64);
//! the others are counted as malformed and ignored. Turns repeat (greeting, pause, speech,
//! reply, pause, ...) until the call's end time, then it hangs up with `stop`. With barge-in,
//! the second turn's caller speaks again 300 ms into the reply and expects a `clear`.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::{Frame, OpCode, Payload};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use patterd::audio::g711::{SILENCE_ULAW, ulaw_tone};
use patterd::carrier::FRAME_BYTES;
use patterd::net::ws_client::connect;
use patterd::util::TaskGuard;
use patterd_sim::twilio::call::map_stream_url;
use patterd_sim::twilio::{SimTwilio, new_sid, parse_twiml};
use patterd_sim::ws::{WsFrame, WsWrite, spawn_reader};

use crate::shard::ShardMsg;

/// One media frame's worth of audio.
pub const FRAME: Duration = Duration::from_millis(20);
/// A gap between two agent frames of one utterance above this counts as late.
pub const LATE_GAP: Duration = Duration::from_millis(40);

/// The caller's speech, pre-encoded as base64 payloads of 20 ms frames.
pub struct SpeechClip {
    pub frames: Vec<String>,
}

impl SpeechClip {
    /// A 440 Hz tone at -12 dBFS lasting `ms` (speech to the fake Deepgram).
    pub fn tone(ms: u64) -> Self {
        let audio = ulaw_tone(440.0, ms, 8000);
        let frames = audio
            .chunks(FRAME_BYTES)
            .map(|c| {
                let mut f = c.to_vec();
                f.resize(FRAME_BYTES, SILENCE_ULAW);
                STANDARD.encode(&f)
            })
            .collect();
        Self { frames }
    }
}

/// The silence frame of call `idx`: its first 8 bytes are `0xF0 | nibble` of `idx + 1`
/// (quieter than any speech threshold), the rest μ-law silence.
pub fn tag_frame(idx: u32) -> Vec<u8> {
    let mut f = vec![SILENCE_ULAW; FRAME_BYTES];
    let tag = idx + 1;
    for (i, b) in f.iter_mut().take(8).enumerate() {
        *b = 0xF0 | ((tag >> (28 - 4 * i)) & 0xF) as u8;
    }
    f
}

/// Reads the call index back from the first audio bytes the fake Deepgram saw.
pub fn read_tag(bytes: &[u8]) -> Option<u32> {
    if bytes.len() < 8 || bytes[..8].iter().any(|b| b & 0xF0 != 0xF0) {
        return None;
    }
    let tag = bytes[..8]
        .iter()
        .fold(0u32, |acc, b| (acc << 4) | u32::from(b & 0x0F));
    // All 0xFF is plain silence, not a tag.
    if tag == u32::MAX {
        None
    } else {
        tag.checked_sub(1)
    }
}

/// Shared by every caller of a run.
pub struct CallCtx {
    pub twilio: SimTwilio,
    /// `ws://127.0.0.1:PORT` where the server's media socket listens.
    pub ws_base: String,
    pub to: String,
    /// The voice webhook's path.
    pub voice_path: String,
    pub speech: SpeechClip,
    pub pause: Duration,
    pub reply_timeout: Duration,
    pub barge_in: bool,
}

/// When a call starts and when it stops taking new turns.
#[derive(Debug, Clone, Copy)]
pub struct CallPlan {
    pub idx: u32,
    pub start_at: Instant,
    pub end_at: Instant,
}

/// One caller turn as the caller saw it.
#[derive(Debug, Clone)]
pub struct TurnTimes {
    /// When the last frame of the caller's speech went out.
    pub speech_end: Instant,
    /// When the reply's first frame arrived (None: no reply in time).
    pub first_frame: Option<Instant>,
    /// The caller started this turn while the agent was still speaking.
    pub barge_in: bool,
    /// Agent audio was still queued when this turn's speech ended: a `clear` must come first.
    pub needs_clear: bool,
    /// For a barge-in: when the `clear` arrived after the speech ended (see `needs_clear`).
    pub clear_at: Option<Instant>,
    /// For a barge-in: when the first frame of the interrupting speech went out.
    pub onset: Option<Instant>,
    /// For a barge-in: the first `clear` that arrived after `onset`.
    pub onset_clear: Option<Instant>,
}

/// What one call measured.
#[derive(Debug, Clone, Default)]
pub struct CallResult {
    pub idx: u32,
    pub error: Option<String>,
    pub webhook: Option<Duration>,
    /// When the media stream's `start` went out (maps untagged STT sessions to calls).
    pub started_at: Option<Instant>,
    /// `start` sent → first greeting frame.
    pub greeting: Option<Duration>,
    pub turns: Vec<TurnTimes>,
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Agent messages that broke Twilio's protocol (bad JSON, unknown event, another
    /// stream's `streamSid`, invalid base64); they were ignored.
    pub malformed: u64,
    /// Gaps over [`LATE_GAP`] between frames of one utterance that the caller heard: the
    /// audio queued before the frame had finished playing when it arrived.
    pub late_gaps: u64,
    /// When each late gap ended (splits them into before / during a flood).
    pub late_at: Vec<Instant>,
    pub max_gap: Duration,
    /// The modelled playback queue ran dry (by more than a frame) inside an utterance.
    pub underruns: u64,
    pub clears: u64,
    /// Ticks this simulator itself ran more than a frame late (load generator overload).
    pub own_lag_ticks: u64,
    pub own_max_lag: Duration,
}

/// One agent message as the driver needs it (timestamped on arrival by the reader task).
#[derive(Debug)]
pub enum In {
    Media {
        bytes: usize,
        at: Instant,
    },
    Mark {
        name: String,
        at: Instant,
    },
    Clear {
        at: Instant,
    },
    Obligated(OpCode, Vec<u8>),
    /// A message that broke the protocol.
    Malformed,
    Closed,
}

#[derive(Deserialize)]
struct OutFrame<'a> {
    event: &'a str,
    #[serde(rename = "streamSid")]
    stream_sid: Option<&'a str>,
    #[serde(borrow)]
    media: Option<MediaPayload<'a>>,
    mark: Option<MarkName>,
}

#[derive(Deserialize)]
struct MediaPayload<'a> {
    payload: &'a str,
}

#[derive(Deserialize)]
struct MarkName {
    name: String,
}

/// Decoded length of standard, padded base64, or None when `s` is not valid base64 (checked
/// without decoding: length, alphabet, padding).
pub fn b64_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return None;
    }
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    let body_ok = b[..b.len() - pad]
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/');
    (pad <= 2 && body_ok).then(|| b.len() / 4 * 3 - pad)
}

/// Checks one text message from the server against Twilio's protocol (borrowed parse: nothing
/// is allocated for `media`, the payload is validated but never decoded).
pub fn parse_agent_message(text: &[u8], stream_sid: &str, at: Instant) -> In {
    let Ok(f) = serde_json::from_slice::<OutFrame<'_>>(text) else {
        return In::Malformed;
    };
    if f.stream_sid != Some(stream_sid) {
        return In::Malformed;
    }
    match f {
        OutFrame {
            event: "media",
            media: Some(m),
            ..
        } => match b64_len(m.payload) {
            Some(bytes) => In::Media { bytes, at },
            None => In::Malformed,
        },
        OutFrame {
            event: "mark",
            mark: Some(m),
            ..
        } => In::Mark { name: m.name, at },
        OutFrame { event: "clear", .. } => In::Clear { at },
        _ => In::Malformed,
    }
}

/// What the driver needs of one frame from the server.
fn incoming(f: WsFrame<'_>, stream_sid: &str) -> Option<In> {
    let at = Instant::now();
    match f {
        WsFrame::Obligated(op, payload) => Some(In::Obligated(op, payload)),
        WsFrame::Text(t) => Some(parse_agent_message(t, stream_sid, at)),
        // Twilio's stream takes JSON text frames only.
        WsFrame::Binary(_) => Some(In::Malformed),
        WsFrame::Close(..) | WsFrame::Error(_) => Some(In::Closed),
    }
}

/// Writes one inbound `media` message into `buf` (cleared first): the only parts that vary
/// per frame are the sequence number, chunk and timestamp; the payload is precomputed base64.
pub fn media_frame(
    buf: &mut Vec<u8>,
    seq: u64,
    chunk: u64,
    ts_ms: u64,
    payload: &str,
    stream_sid: &str,
) {
    buf.clear();
    // Writing into a Vec cannot fail.
    let _ = write!(
        buf,
        r#"{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound","chunk":"{chunk}","timestamp":"{ts_ms}","payload":"{payload}"}},"streamSid":"{stream_sid}"}}"#
    );
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Greeting { since: Instant },
    Pause { until: Instant },
    Speaking { next: usize },
    AwaitReply { deadline: Instant },
    Replying { deadline: Instant },
    BargeWait { at: Instant },
}

/// One connected call, driven by its shard: [`Driver::on_tick`] every 20 ms,
/// [`Driver::handle`] for each agent message.
pub struct Driver {
    ctx: Arc<CallCtx>,
    wr: WsWrite,
    /// The socket's reader task (set once it runs).
    pub(crate) reader: Option<TaskGuard>,
    stream_sid: String,
    call_sid: String,
    seq: u64,
    chunk: u64,
    pub(crate) t0: Instant,
    end_at: Instant,
    hard_stop: Instant,
    tag_b64: String,
    /// The media message being sent (reused; masked in place by the write).
    buf: Vec<u8>,
    pub(crate) res: CallResult,
    phase: Phase,
    turn_idx: usize,
    /// When the queued agent audio finishes playing.
    queued_until: Instant,
    pending_marks: std::collections::VecDeque<(String, Instant)>,
    in_utt: bool,
    /// The caller's current speech started over the agent's.
    barging: bool,
    onset: Option<Instant>,
    onset_clear: Option<Instant>,
    last_media: Instant,
    last_activity: Instant,
}

impl Driver {
    async fn write(&mut self, text: String) -> bool {
        self.wr
            .write_frame(Frame::text(Payload::Owned(text.into_bytes())))
            .await
            .is_ok()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    async fn send_media(&mut self, payload: Option<usize>, ts_ms: u64) -> bool {
        self.chunk += 1;
        let seq = self.next_seq();
        let payload = match payload {
            Some(i) => &self.ctx.speech.frames[i],
            None => &self.tag_b64,
        };
        media_frame(
            &mut self.buf,
            seq,
            self.chunk,
            ts_ms,
            payload,
            &self.stream_sid,
        );
        self.res.frames_sent += 1;
        self.wr
            .write_frame(Frame::text(Payload::BorrowedMut(&mut self.buf)))
            .await
            .is_ok()
    }

    async fn echo_due_marks(&mut self, now: Instant, all: bool) -> bool {
        while let Some((_, due)) = self.pending_marks.front() {
            if !all && *due > now {
                break;
            }
            let Some((name, _)) = self.pending_marks.pop_front() else {
                break;
            };
            let seq = self.next_seq();
            let name = serde_json::to_string(&name).unwrap_or_else(|_| "\"\"".into());
            let text = format!(
                r#"{{"event":"mark","sequenceNumber":"{seq}","streamSid":"{}","mark":{{"name":{name}}}}}"#,
                self.stream_sid
            );
            if !self.write(text).await {
                return false;
            }
            self.last_activity = now;
        }
        true
    }

    fn on_media(&mut self, bytes: usize, at: Instant) {
        self.res.frames_received += 1;
        self.last_activity = at;
        if self.in_utt {
            let gap = at.saturating_duration_since(self.last_media);
            // A gap is late only when the caller would hear it: the audio queued before it
            // had finished playing. A server that sends ahead of real time in bursts (patterd
            // tops the carrier's buffer up every 100 ms) leaves long arrival gaps that nobody
            // hears; those are not late.
            if gap > LATE_GAP && at > self.queued_until {
                self.res.late_gaps += 1;
                self.res.late_at.push(at);
            }
            self.res.max_gap = self.res.max_gap.max(gap);
            if at > self.queued_until + FRAME {
                self.res.underruns += 1;
            }
        }
        self.in_utt = true;
        self.last_media = at;
        self.queued_until = self.queued_until.max(at) + Duration::from_micros(bytes as u64 * 125);
        match self.phase {
            Phase::Greeting { .. } => {
                self.res
                    .greeting
                    .get_or_insert(at.saturating_duration_since(self.t0));
            }
            Phase::AwaitReply { deadline } => {
                let Some(turn) = self.res.turns.last_mut() else {
                    return;
                };
                if at <= turn.speech_end || (turn.needs_clear && turn.clear_at.is_none()) {
                    return; // still the interrupted reply's audio
                }
                turn.first_frame = Some(at);
                self.phase = if self.ctx.barge_in && self.turn_idx == 1 {
                    Phase::BargeWait {
                        at: at + Duration::from_millis(300),
                    }
                } else {
                    Phase::Replying { deadline }
                };
            }
            _ => {}
        }
    }

    fn on_clear(&mut self, at: Instant) {
        self.res.clears += 1;
        self.queued_until = at;
        self.in_utt = false;
        self.last_activity = at;
        if let Some(onset) = self.onset
            && self.onset_clear.is_none()
            && at >= onset
        {
            // Still speaking over the agent: the clear answers this barge-in.
            self.onset_clear = Some(at);
        }
        if let Some(t) = self.res.turns.last_mut() {
            if t.needs_clear && t.clear_at.is_none() && at > t.speech_end {
                t.clear_at = Some(at);
            }
            if let Some(onset) = t.onset
                && t.onset_clear.is_none()
                && at >= onset
            {
                t.onset_clear = Some(at);
            }
        }
    }

    /// The agent is quiet: nothing queued, nothing pending, no frame for 200 ms.
    fn agent_quiet(&self, now: Instant) -> bool {
        self.pending_marks.is_empty()
            && now >= self.queued_until
            && now.saturating_duration_since(self.last_activity) >= Duration::from_millis(200)
    }

    /// One 20 ms tick scheduled for `at`; false to hang up.
    async fn tick(&mut self, now: Instant, at: Instant) -> bool {
        if !self.echo_due_marks(now, false).await {
            return false;
        }
        let mut speech = None;
        match self.phase {
            Phase::Greeting { since } => {
                let done = self.res.greeting.is_some() && self.agent_quiet(now);
                if done || now.saturating_duration_since(since) > self.ctx.reply_timeout {
                    self.phase = Phase::Pause {
                        until: now + self.ctx.pause,
                    };
                }
            }
            Phase::Pause { until } => {
                if now >= self.end_at {
                    return false;
                }
                if now >= until {
                    // The agent has been quiet for the whole pause: whatever it says next is
                    // a new utterance, even if the server sent no mark after the last one
                    // (Patter marks only some of its audio), so the silence in between is
                    // not a late frame.
                    self.in_utt = false;
                    self.phase = Phase::Speaking { next: 0 };
                }
            }
            Phase::AwaitReply { deadline } | Phase::Replying { deadline } => {
                let replying = matches!(self.phase, Phase::Replying { .. });
                if now >= deadline || (replying && self.agent_quiet(now)) {
                    self.turn_idx += 1;
                    self.phase = Phase::Pause {
                        until: now + self.ctx.pause,
                    };
                }
            }
            Phase::BargeWait { at } => {
                if now >= at {
                    self.turn_idx += 1;
                    self.barging = true;
                    self.phase = Phase::Speaking { next: 0 };
                }
            }
            Phase::Speaking { .. } => {}
        }
        if let Phase::Speaking { next } = self.phase {
            speech = Some(next);
        }
        // The stream's timestamp: ms since `start`, on the tick's schedule.
        let ts_ms = at.saturating_duration_since(self.t0).as_millis() as u64;
        if !self.send_media(speech, ts_ms).await {
            return false;
        }
        if speech == Some(0) && self.barging {
            self.onset = Some(Instant::now());
            self.onset_clear = None;
        }
        if let Some(next) = speech {
            if next + 1 < self.ctx.speech.frames.len() {
                self.phase = Phase::Speaking { next: next + 1 };
            } else {
                let end = Instant::now();
                let needs_clear = !self.in_utt_quiet(end);
                self.res.turns.push(TurnTimes {
                    speech_end: end,
                    first_frame: None,
                    barge_in: std::mem::take(&mut self.barging),
                    needs_clear,
                    clear_at: None,
                    onset: self.onset.take(),
                    onset_clear: self.onset_clear.take(),
                });
                self.phase = Phase::AwaitReply {
                    deadline: end + self.ctx.reply_timeout,
                };
            }
        }
        true
    }

    /// True when no agent audio is still queued for playback.
    fn in_utt_quiet(&self, now: Instant) -> bool {
        self.pending_marks.is_empty() && now >= self.queued_until
    }

    async fn hang_up(&mut self) {
        let seq = self.next_seq();
        let text = format!(
            r#"{{"event":"stop","sequenceNumber":"{seq}","stop":{{"accountSid":"{}","callSid":"{}"}},"streamSid":"{}"}}"#,
            self.ctx.twilio.account_sid, self.call_sid, self.stream_sid
        );
        let _ = self.write(text).await;
        let _ = self
            .wr
            .write_frame(Frame::close(1000, b"caller hung up"))
            .await;
    }

    /// The tick scheduled for `at` (the shard calls it every 20 ms); false once the call is
    /// over (it has hung up).
    pub async fn on_tick(&mut self, at: Instant) -> bool {
        let now = Instant::now();
        let lag = now.saturating_duration_since(at);
        if lag > FRAME {
            self.res.own_lag_ticks += 1;
        }
        self.res.own_max_lag = self.res.own_max_lag.max(lag);
        if now >= self.hard_stop || !self.tick(now, at).await {
            self.hang_up().await;
            return false;
        }
        true
    }

    /// One message from the server; false once the call is over.
    pub async fn handle(&mut self, msg: In) -> bool {
        match msg {
            In::Media { bytes, at } => self.on_media(bytes, at),
            In::Mark { name, at } => {
                self.in_utt = false;
                self.last_activity = at;
                let due = self.queued_until.max(at);
                self.pending_marks.push_back((name, due));
            }
            In::Clear { at } => {
                self.on_clear(at);
                if !self.echo_due_marks(at, true).await {
                    return false;
                }
            }
            In::Obligated(op, payload) => {
                let _ = self
                    .wr
                    .write_frame(Frame::new(true, op, None, Payload::Owned(payload)))
                    .await;
            }
            In::Malformed => self.res.malformed += 1,
            In::Closed => {
                self.res
                    .error
                    .get_or_insert_with(|| "server closed the media socket".into());
                return false;
            }
        }
        true
    }
}

/// Sets up one call at its start time (webhook, media socket, `connected` + `start`) and
/// hands it to its shard as `slot`: first the [`Driver`], then the reader task, whose
/// messages come after the driver on the same channel. A call that failed to connect goes to
/// the shard as its result.
pub async fn connect_call(
    ctx: Arc<CallCtx>,
    plan: CallPlan,
    slot: u32,
    shard: mpsc::UnboundedSender<ShardMsg>,
) {
    tokio::time::sleep_until(plan.start_at).await;
    let msg = match setup(ctx, plan, slot, &shard).await {
        Ok(()) => return,
        Err(res) => ShardMsg::Failed(res),
    };
    let _ = shard.send(msg);
}

async fn setup(
    ctx: Arc<CallCtx>,
    plan: CallPlan,
    slot: u32,
    shard: &mpsc::UnboundedSender<ShardMsg>,
) -> Result<(), CallResult> {
    let mut res = CallResult {
        idx: plan.idx,
        ..Default::default()
    };
    let from = format!("+1555{:07}", plan.idx);
    let t = Instant::now();
    let (call_sid, resp) = match ctx
        .twilio
        .incoming_call(&ctx.voice_path, &from, &ctx.to)
        .await
    {
        Ok(x) => x,
        Err(e) => {
            res.error = Some(format!("webhook: {e}"));
            return Err(res);
        }
    };
    res.webhook = Some(t.elapsed());
    if resp.status != 200 {
        res.error = Some(format!("webhook answered {}", resp.status));
        return Err(res);
    }
    let Some(answer) = parse_twiml(&resp.body).ok() else {
        res.error = Some("TwiML without <Stream url>".into());
        return Err(res);
    };
    let Some(stream_url) = answer.stream_url else {
        res.error = Some("TwiML without <Stream url>".into());
        return Err(res);
    };
    let url = match map_stream_url(&stream_url, &ctx.ws_base) {
        Ok(u) => u,
        Err(e) => {
            res.error = Some(e.to_string());
            return Err(res);
        }
    };
    let ws = match connect(
        &url,
        &[("User-Agent", "Twilio.TmeWs/1.0")],
        Duration::from_secs(10),
    )
    .await
    {
        Ok((ws, _)) => ws,
        Err(e) => {
            res.error = Some(format!("media socket: {e}"));
            return Err(res);
        }
    };
    let (rd, mut wr) = patterd_sim::ws::split(ws);
    let stream_sid = new_sid("MZ");
    let connected = r#"{"event":"connected","protocol":"Call","version":"1.0.0"}"#;
    let start = serde_json::json!({
        "event": "start", "sequenceNumber": "1",
        "start": {
            "accountSid": ctx.twilio.account_sid, "streamSid": stream_sid, "callSid": call_sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": answer.parameters,
        },
        "streamSid": stream_sid,
    });
    for text in [connected.to_string(), start.to_string()] {
        if wr
            .write_frame(Frame::text(Payload::Owned(text.into_bytes())))
            .await
            .is_err()
        {
            res.error = Some("media socket closed at start".into());
            return Err(res);
        }
    }
    let t0 = Instant::now();
    res.started_at = Some(t0);
    let sid = stream_sid.clone();
    let d = Driver {
        ctx: ctx.clone(),
        wr,
        reader: None,
        stream_sid,
        call_sid,
        seq: 1,
        chunk: 0,
        t0,
        end_at: plan.end_at,
        hard_stop: plan.end_at + Duration::from_secs(15),
        tag_b64: STANDARD.encode(tag_frame(plan.idx)),
        buf: Vec::with_capacity(512),
        res,
        phase: Phase::Greeting { since: t0 },
        turn_idx: 0,
        queued_until: t0,
        pending_marks: Default::default(),
        in_utt: false,
        barging: false,
        onset: None,
        onset_clear: None,
        last_media: t0,
        last_activity: t0,
    };
    if shard.send(ShardMsg::Join(slot, Box::new(d))).is_err() {
        return Ok(()); // the run is over
    }
    let reader = spawn_reader(rd, shard.clone(), move |f| {
        incoming(f, &sid).map(|m| ShardMsg::In(slot, m))
    });
    let _ = shard.send(ShardMsg::Reader(slot, reader));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_stay_quiet() {
        for idx in [0, 1, 7, 1999, 65_535, 1 << 27] {
            let f = tag_frame(idx);
            assert_eq!(read_tag(&f), Some(idx));
            assert!(patterd::audio::g711::ulaw_energy(&f) < 200);
        }
        assert_eq!(read_tag(&[SILENCE_ULAW; 16][..]), None);
        assert_eq!(read_tag(&[0x10; 16][..]), None);
    }

    #[test]
    fn base64_lengths_and_validity() {
        for n in [1, 2, 3, 160] {
            assert_eq!(b64_len(&STANDARD.encode(vec![0xA5u8; n])), Some(n));
        }
        for bad in ["", "abc", "ab=c", "a===", "ab$d", "/w==x"] {
            assert_eq!(b64_len(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn media_frame_is_the_json_twilio_sends() {
        let mut buf = Vec::new();
        let payload = STANDARD.encode(tag_frame(3));
        media_frame(&mut buf, 42, 41, 820, &payload, "MZ1");
        let v: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        assert_eq!(
            v,
            serde_json::json!({"event": "media", "sequenceNumber": "42", "streamSid": "MZ1",
                "media": {"track": "inbound", "chunk": "41", "timestamp": "820", "payload": payload}})
        );
        // The buffer is rebuilt, not appended to.
        media_frame(&mut buf, 43, 42, 840, &payload, "MZ1");
        let v: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        assert_eq!(v["sequenceNumber"], "43");
    }

    #[test]
    fn agent_messages_are_checked() {
        let at = Instant::now();
        let p = |s: &str| parse_agent_message(s.as_bytes(), "MZ1", at);
        assert!(matches!(
            p(r#"{"event":"media","streamSid":"MZ1","media":{"payload":"/w=="}}"#),
            In::Media { bytes: 1, .. }
        ));
        assert!(matches!(
            p(r#"{"event":"mark","streamSid":"MZ1","mark":{"name":"u1"}}"#),
            In::Mark { ref name, .. } if name == "u1"
        ));
        assert!(matches!(
            p(r#"{"event":"clear","streamSid":"MZ1"}"#),
            In::Clear { .. }
        ));
        for bad in [
            "not json",
            r#"{"event":"media","streamSid":"MZ2","media":{"payload":"/w=="}}"#,
            r#"{"event":"media","media":{"payload":"/w=="}}"#,
            r#"{"event":"media","streamSid":"MZ1","media":{"payload":"@@@@"}}"#,
            r#"{"event":"media","streamSid":"MZ1"}"#,
            r#"{"event":"mark","streamSid":"MZ1","mark":{}}"#,
            r#"{"event":"dance","streamSid":"MZ1"}"#,
        ] {
            assert!(matches!(p(bad), In::Malformed), "{bad}");
        }
    }
}
