//! One simulated Twilio caller for the load generator: a lean cousin of
//! [`patterd_sim::twilio::SimCall`] that keeps only what a load run measures. It posts the
//! signed voice webhook, opens the Media Streams socket from the TwiML answer, and then, on a
//! 20 ms tick, sends one `media` frame (a pre-encoded speech clip while it speaks, otherwise
//! near-silence carrying the call's tag so the fake Deepgram can tell calls apart). It models
//! Twilio's playback queue (8 bytes/ms) to echo `mark`s when their audio has played and to
//! notice underruns, and it timestamps every agent frame on arrival: per turn it keeps when the
//! caller's speech ended and when the reply's first frame arrived, and per utterance the gaps
//! between frames. Turns repeat (greeting, pause, speech, reply, pause, ...) until the call's
//! end time, then it hangs up with `stop`. With barge-in, the second turn's caller speaks again
//! 300 ms into the reply and expects a `clear`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::{Frame, OpCode, Payload};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use patterd::audio::g711::{SILENCE_ULAW, ulaw_tone};
use patterd::carrier::FRAME_BYTES;
use patterd::net::ws_client::connect;
use patterd_sim::twilio::call::map_stream_url;
use patterd_sim::twilio::{SimTwilio, new_sid, parse_twiml};
use patterd_sim::ws::{WsFrame, WsWrite, spawn_reader};

const FRAME: Duration = Duration::from_millis(20);
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
    /// For a barge-in: when the `clear` arrived.
    pub clear_at: Option<Instant>,
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
    pub frames_received: u64,
    /// Gaps over [`LATE_GAP`] between frames of one utterance.
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

enum In {
    Media { bytes: usize, at: Instant },
    Mark { name: String, at: Instant },
    Clear { at: Instant },
    Obligated(OpCode, Vec<u8>),
    Closed,
}

#[derive(Deserialize)]
struct OutFrame<'a> {
    event: &'a str,
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

fn b64_len(s: &str) -> usize {
    let pad = s.bytes().rev().take_while(|&b| b == b'=').count();
    (s.len() / 4 * 3).saturating_sub(pad)
}

/// What the driver needs of one frame from patterd; everything else is dropped in the reader
/// task (media is only counted, never decoded).
fn incoming(f: WsFrame<'_>) -> Option<In> {
    let at = Instant::now();
    match f {
        WsFrame::Obligated(op, payload) => Some(In::Obligated(op, payload)),
        WsFrame::Text(t) => match serde_json::from_slice::<OutFrame<'_>>(t).ok()? {
            OutFrame {
                event: "media",
                media: Some(m),
                ..
            } => Some(In::Media {
                bytes: b64_len(m.payload),
                at,
            }),
            OutFrame {
                event: "mark",
                mark: Some(m),
                ..
            } => Some(In::Mark { name: m.name, at }),
            OutFrame { event: "clear", .. } => Some(In::Clear { at }),
            _ => None,
        },
        WsFrame::Binary(_) => None,
        WsFrame::Close(..) | WsFrame::Error(_) => Some(In::Closed),
    }
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

struct Driver<'a> {
    ctx: &'a CallCtx,
    wr: WsWrite,
    stream_sid: String,
    call_sid: String,
    seq: u64,
    chunk: u64,
    t0: Instant,
    tag_b64: String,
    res: CallResult,
    phase: Phase,
    turn_idx: usize,
    /// When the queued agent audio finishes playing.
    queued_until: Instant,
    pending_marks: std::collections::VecDeque<(String, Instant)>,
    in_utt: bool,
    /// The caller's current speech started over the agent's.
    barging: bool,
    last_media: Instant,
    last_activity: Instant,
}

impl Driver<'_> {
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

    async fn send_media(&mut self, payload: Option<usize>) -> bool {
        self.chunk += 1;
        let seq = self.next_seq();
        let ts = self.t0.elapsed().as_millis();
        let payload = match payload {
            Some(i) => &self.ctx.speech.frames[i],
            None => &self.tag_b64,
        };
        let text = format!(
            r#"{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound","chunk":"{}","timestamp":"{ts}","payload":"{payload}"}},"streamSid":"{}"}}"#,
            self.chunk, self.stream_sid
        );
        self.write(text).await
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
            if gap > LATE_GAP {
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
        if let Some(t) = self.res.turns.last_mut()
            && t.needs_clear
            && t.clear_at.is_none()
            && at > t.speech_end
        {
            t.clear_at = Some(at);
        }
    }

    /// The agent is quiet: nothing queued, nothing pending, no frame for 200 ms.
    fn agent_quiet(&self, now: Instant) -> bool {
        self.pending_marks.is_empty()
            && now >= self.queued_until
            && now.saturating_duration_since(self.last_activity) >= Duration::from_millis(200)
    }

    /// One 20 ms tick; false to hang up.
    async fn tick(&mut self, now: Instant, end_at: Instant) -> bool {
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
                if now >= end_at {
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
        if !self.send_media(speech).await {
            return false;
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
}

/// Runs one whole call and returns what it measured.
pub async fn run_call(ctx: Arc<CallCtx>, plan: CallPlan) -> CallResult {
    tokio::time::sleep_until(plan.start_at).await;
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
            return res;
        }
    };
    res.webhook = Some(t.elapsed());
    if resp.status != 200 {
        res.error = Some(format!("webhook answered {}", resp.status));
        return res;
    }
    let Some(stream_url) = parse_twiml(&resp.body).ok().and_then(|a| a.stream_url) else {
        res.error = Some("TwiML without <Stream url>".into());
        return res;
    };
    let answer = parse_twiml(&resp.body).ok();
    let params = answer.map(|a| a.parameters).unwrap_or_default();
    let url = match map_stream_url(&stream_url, &ctx.ws_base) {
        Ok(u) => u,
        Err(e) => {
            res.error = Some(e.to_string());
            return res;
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
            return res;
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
            "customParameters": params,
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
            return res;
        }
    }
    let t0 = Instant::now();
    res.started_at = Some(t0);
    let (in_tx, mut in_rx) = mpsc::unbounded_channel();
    let reader = spawn_reader(rd, in_tx, incoming);
    let mut d = Driver {
        ctx: &ctx,
        wr,
        stream_sid,
        call_sid,
        seq: 1,
        chunk: 0,
        t0,
        tag_b64: STANDARD.encode(tag_frame(plan.idx)),
        res,
        phase: Phase::Greeting { since: t0 },
        turn_idx: 0,
        queued_until: t0,
        pending_marks: Default::default(),
        in_utt: false,
        barging: false,
        last_media: t0,
        last_activity: t0,
    };
    let mut tick = tokio::time::interval_at(t0 + FRAME, FRAME);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let hard_stop = plan.end_at + Duration::from_secs(15);
    loop {
        tokio::select! {
            biased;
            msg = in_rx.recv() => match msg {
                Some(In::Media { bytes, at }) => d.on_media(bytes, at),
                Some(In::Mark { name, at }) => {
                    d.in_utt = false;
                    d.last_activity = at;
                    let due = d.queued_until.max(at);
                    d.pending_marks.push_back((name, due));
                }
                Some(In::Clear { at }) => {
                    d.on_clear(at);
                    if !d.echo_due_marks(at, true).await {
                        break;
                    }
                }
                Some(In::Obligated(op, payload)) => {
                    let _ = d.wr.write_frame(Frame::new(true, op, None, Payload::Owned(payload))).await;
                }
                Some(In::Closed) | None => {
                    d.res.error.get_or_insert_with(|| "server closed the media socket".into());
                    break;
                }
            },
            at = tick.tick() => {
                let now = Instant::now();
                let lag = now.saturating_duration_since(at);
                if lag > FRAME {
                    d.res.own_lag_ticks += 1;
                }
                d.res.own_max_lag = d.res.own_max_lag.max(lag);
                if now >= hard_stop || !d.tick(now, plan.end_at).await {
                    d.hang_up().await;
                    break;
                }
            }
        }
    }
    drop(reader);
    d.res
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
    fn base64_lengths() {
        for n in [0, 1, 2, 3, 160] {
            assert_eq!(b64_len(&STANDARD.encode(vec![0u8; n])), n);
        }
    }
}
