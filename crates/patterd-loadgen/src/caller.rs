//! One simulated Twilio caller for the load generator: a lean cousin of
//! [`patterd_sim::twilio::SimCall`] that keeps only what a load run measures. [`connect_call`]
//! posts the signed voice webhook, opens the Media Streams socket from the TwiML answer and
//! sends `connected` + `start`; from then on the call is a [`Driver`] owned by a shard
//! ([`crate::shard`]), which drives hundreds of callers from one task and one timer. On each of
//! its 20 ms ticks the caller sends one `media` frame (a pre-encoded speech clip while it
//! speaks, otherwise the line's quiet: its first frames carry the call's tag so the fake Deepgram can
//! tell calls apart, the rest are a loop of steady line noise at −65 dBFS), built into a reused buffer from precomputed base64 (no allocation per frame). It
//! models Twilio's playback queue (8 bytes/ms) to echo `mark`s when their audio has played and
//! to notice underruns, and it timestamps every agent message on arrival (in the socket's
//! reader task): per turn it keeps when the caller's speech ended and when the reply's first
//! frame arrived, and per utterance the gaps between frames. Every agent message is checked
//! against Twilio's protocol (JSON, a known event, this stream's `streamSid`, valid base64);
//! the others are counted as malformed and ignored. Turns repeat (greeting, pause, speech,
//! reply, pause, ...) until the call's end time, then it hangs up with `stop`. With barge-in,
//! the second turn's caller speaks again 300 ms into the reply and expects a `clear`.
//! This file holds the call's state machine ([`Driver`]) and what it measures; the frames and
//! the protocol check are in `caller/wire.rs`, the call's setup in `caller/connect.rs`.

mod connect;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::{Frame, Payload};
use tokio::time::Instant;

use patterd::util::TaskGuard;
use patterd_sim::twilio::SimTwilio;
use patterd_sim::ws::WsWrite;

pub use connect::connect_call;
pub use wire::{
    In, SpeechClip, TAGGED_FRAMES, b64_len, line_noise, media_frame, parse_agent_message, read_tag,
    tag_frame,
};

/// One media frame's worth of audio.
pub const FRAME: Duration = Duration::from_millis(20);
/// A gap between two agent frames of one utterance above this counts as late.
pub const LATE_GAP: Duration = Duration::from_millis(40);
/// An utterance's first frames, for [`CallResult::late_early`] (the fake ElevenLabs sends
/// 100 ms, five frames, per chunk).
pub const EARLY_FRAMES: u32 = 10;

/// Shared by every caller of a run.
pub struct CallCtx {
    pub twilio: SimTwilio,
    /// `ws://127.0.0.1:PORT` where the server's media socket listens; empty: wherever the
    /// TwiML's stream URL says (a cluster: the owner's advertise URL).
    pub ws_base: String,
    pub to: String,
    /// The voice webhook's path.
    pub voice_path: String,
    pub speech: SpeechClip,
    /// The line's noise while the caller is quiet, looped ([`line_noise`]); empty: the
    /// call's tag in every quiet frame instead (digital silence otherwise).
    pub line_noise: Vec<String>,
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
    /// `host:port` the media socket went to (in a cluster: the call's owner).
    pub media_host: Option<String>,
    /// The call's id (`CallSid`).
    pub call_sid: Option<String>,
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
    /// Of the late gaps, those within an utterance's first [`EARLY_FRAMES`] frames: the
    /// audio after its first synthesis chunk came late (the rest: a stall mid-utterance).
    pub late_early: u64,
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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Greeting { since: Instant },
    Pause { until: Instant },
    Speaking { next: usize },
    AwaitReply { deadline: Instant },
    Replying { deadline: Instant },
    BargeWait { at: Instant },
}

/// Whether a frame of an utterance that arrived `gap` after the previous one, at `at`, with
/// the caller's queued audio playing until `queued_until` and `frames` of the utterance before
/// it, is a late gap the caller hears (`Some(early)`: `early` when it came within the first
/// [`EARLY_FRAMES`]). A gap is late only when the audio queued before it had finished
/// playing: a server that sends ahead of real time in bursts (patterd tops the carrier's
/// buffer up every 100 ms) leaves long arrival gaps that nobody hears; those are not late.
fn late_gap(gap: Duration, at: Instant, queued_until: Instant, frames: u32) -> Option<bool> {
    (gap > LATE_GAP && at > queued_until).then_some(frames < EARLY_FRAMES)
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
    /// Frames of the current agent utterance received so far (0: none is playing; a mark,
    /// a `clear` or a whole quiet pause ends one).
    utt_frames: u32,
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
            None if self.chunk <= TAGGED_FRAMES || self.ctx.line_noise.is_empty() => &self.tag_b64,
            None => &self.ctx.line_noise[self.chunk as usize % self.ctx.line_noise.len()],
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
        if self.utt_frames > 0 {
            let gap = at.saturating_duration_since(self.last_media);
            if let Some(early) = late_gap(gap, at, self.queued_until, self.utt_frames) {
                self.res.late_gaps += 1;
                self.res.late_early += u64::from(early);
                self.res.late_at.push(at);
            }
            self.res.max_gap = self.res.max_gap.max(gap);
            if at > self.queued_until + FRAME {
                self.res.underruns += 1;
            }
        }
        self.utt_frames += 1;
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
        self.utt_frames = 0;
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
                    self.utt_frames = 0;
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
                self.utt_frames = 0;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_late_only_once_the_queued_audio_has_played_and_early_ones_are_told_apart() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // The first chunk (5 frames, 100 ms) arrived at t0; the next frame 120 ms later.
        assert_eq!(late_gap(ms(120), t0 + ms(120), t0 + ms(100), 5), Some(true));
        // 60 ms later the caller is still hearing the first chunk: not late.
        assert_eq!(late_gap(ms(60), t0 + ms(60), t0 + ms(100), 5), None);
        // A short gap is never late, even on an empty queue.
        assert_eq!(late_gap(ms(30), t0 + ms(130), t0 + ms(100), 5), None);
        // A stall deep into the utterance.
        assert_eq!(
            late_gap(ms(150), t0 + ms(900), t0 + ms(850), 40),
            Some(false)
        );
    }
}
