//! The agent's mouth: a queue of utterances (greeting, reply sentences, fillers) each with its id,
//! text, buffered μ-law audio and word timings, and the pacer that feeds the carrier 20 ms frames
//! no more than [`LEAD`] ahead of real time, with a mark after each utterance so the actor knows
//! exactly what the caller has heard. Barge-in can [`Mouth::pause`] it: audio at the carrier whose
//! mark has not come back is taken back (each utterance keeps its sent-but-unconfirmed bytes) and
//! re-sent from the start of the first unheard utterance on [`Mouth::resume`]. Pure state, no
//! provider streams: the conversation policy ([`super::policy`]) queues, pauses, resumes and clears
//! it and asks for the synthesis it wants ([`Mouth::take_synthesis`]) and cancels what it dropped
//! ([`Mouth::take_cancelled`]); the actor owns the TTS streams, hands their events back
//! ([`Mouth::on_tts`], through the policy), pumps it and sends what it returns. Each utterance
//! keeps the word timings its TTS gave ([`TtsEvent::Words`]) and [`Mouth::played_at`] says how
//! much of each unconfirmed utterance had played at a moment, for word-precise heard history
//! ([`super::heard`]).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::echo::EchoReference;
use super::heard::Played;
use crate::carrier::{FRAME_BYTES, FRAME_MS, MediaCommand};
use crate::provider::{TtsEvent, WordTiming};

/// How far ahead of real time the pacer may queue audio at the carrier.
pub(crate) const LEAD: Duration = Duration::from_millis(1000);
/// Once an utterance is flowing, the pacer tops the carrier's buffer back up to [`LEAD`] when
/// it has drained by this much: five 20 ms frames (and any mark) per wake-up and socket write
/// instead of one. The carriers buffer what they receive and play it in real time.
pub(crate) const TOP_UP: Duration = Duration::from_millis(100);
/// Pacer deadlines fall on this process-wide grid, so the timers of all calls expire together
/// in one timer-wheel slot (one runtime wake-up for many calls) instead of one each.
pub const TICK: Duration = Duration::from_millis(FRAME_MS);
/// TTS requests in flight at once for one call (later sentences wait their turn).
const MAX_TTS_IN_FLIGHT: usize = 3;
const SILENCE: u8 = 0xFF;

/// What a synthesis event means for the call's timeline ([`Mouth::on_tts`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TtsNote {
    /// The utterance's synthesis failed (why).
    Failed(UttKind, String),
    /// The utterance's first audio byte arrived from `provider`, `after` its request.
    FirstByte {
        provider: String,
        after: std::time::Duration,
    },
    /// The TTS chain gave the utterance to its next TTS.
    Switched {
        from: String,
        to: String,
        reason: String,
    },
}

/// Why an utterance is being spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UttKind {
    Greeting,
    /// A sentence of the reply to caller turn `turn`.
    Reply {
        turn: u64,
    },
    Filler {
        turn: u64,
    },
    Error {
        turn: u64,
    },
    Say,
    /// An idle-caller nudge or the idle goodbye.
    Idle,
    /// In-band DTMF tones the agent sends (never interrupted by caller speech).
    Dtmf,
    /// The voicemail message left on a machine.
    Voicemail,
}

/// One piece of text on its way to the caller.
pub struct Utterance {
    pub id: u64,
    pub kind: UttKind,
    pub text: String,
    /// Index of the transcript entry this utterance belongs to.
    pub entry: usize,
    /// Its synthesis was asked for ([`Mouth::take_synthesis`]) or it needs none.
    started: bool,
    buf: BytesMut,
    synth_done: bool,
    pub failed: bool,
    sent_bytes: usize,
    /// Audio already sent, kept until the mark confirms it was played.
    sent_audio: BytesMut,
    /// Word timings of its audio, as the TTS gave them (empty: none).
    words: Vec<WordTiming>,
}

/// An utterance whose audio is all at the carrier, waiting for its mark to come back.
#[derive(Debug, Clone)]
pub struct Sent {
    pub id: u64,
    pub kind: UttKind,
    pub text: String,
    pub entry: usize,
    pub mark: String,
    /// All of its audio, kept to re-send it if playback is paused before the mark returns.
    audio: Bytes,
    words: Vec<WordTiming>,
    /// When the pacer reckoned the carrier would finish playing it.
    ends_at: Option<Instant>,
}

/// What [`Mouth::clear`] dropped.
pub struct Cleared {
    /// Utterances that had not finished going out (their synthesis is cancelled).
    pub dropped: Vec<Utterance>,
    /// Utterances fully sent whose mark had not come back: the caller may not have heard them.
    pub(crate) unheard: Vec<Sent>,
    /// Audio may be queued at the carrier: send it a `clear`.
    pub(crate) need_clear: bool,
}

/// What [`Mouth::pause`] did.
pub struct Paused {
    /// Audio may be queued at the carrier: send it a `clear`.
    pub(crate) need_clear: bool,
    /// Marks no longer expected (their utterances will be re-sent under new marks).
    pub(crate) withdrawn: Vec<String>,
}

/// What the pacer did on a pump.
#[derive(Default)]
pub struct Pumped {
    pub commands: Vec<MediaCommand>,
    /// Utterances that started sending audio on this pump.
    pub started: Vec<(u64, UttKind)>,
}

pub struct Mouth {
    queue: VecDeque<Utterance>,
    awaiting_mark: VecDeque<Sent>,
    next_id: u64,
    /// When the carrier will have played everything sent so far.
    play_until: Option<Instant>,
    /// Paused by a barge-in: nothing is sent until [`Mouth::resume`].
    paused: bool,
    /// Held at the onset of caller speech: nothing new is sent, nothing is withdrawn (the
    /// carrier plays on what it has) until [`Mouth::release`], a pause or a clear.
    held: bool,
    /// Pauses so far; part of mark names so a stale echo never matches a re-sent utterance.
    epoch: u32,
    /// How much later than the pacer reckoned the last marks came back (newest last, at most
    /// [`LAG_MARKS`]): the carrier's playback delay plus the network both ways, plus any delay
    /// in handling the echo (see [`Mouth::mark_returned`]).
    lags: VecDeque<Duration>,
    /// Where the levels of the frames sent are written for echo detection (see
    /// [`super::echo`]).
    echo: Option<EchoReference>,
    /// Utterances dropped while their synthesis was running: the actor cancels those.
    cancelled: Vec<u64>,
}

/// Marks whose delay is remembered; the smallest is taken as the carrier's lag, so one echo
/// handled late (a busy machine, a network hiccup) does not move the play position.
const LAG_MARKS: usize = 5;

impl Default for Mouth {
    fn default() -> Self {
        Self::new()
    }
}

impl Mouth {
    pub fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            awaiting_mark: VecDeque::new(),
            next_id: 1,
            play_until: None,
            paused: false,
            held: false,
            epoch: 0,
            lags: VecDeque::with_capacity(LAG_MARKS),
            echo: None,
            cancelled: Vec::new(),
        }
    }

    /// Writes the level of every frame sent, at the time it will play, to `echo`.
    pub(crate) fn with_echo_reference(mut self, echo: EchoReference) -> Self {
        self.echo = Some(echo);
        self
    }

    /// Queues `text`, its synthesis to be asked for (see [`Mouth::take_synthesis`]). Returns
    /// the utterance id.
    pub fn push(&mut self, kind: UttKind, text: String, entry: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Utterance {
            id,
            kind,
            text,
            entry,
            started: false,
            buf: BytesMut::new(),
            synth_done: false,
            failed: false,
            sent_bytes: 0,
            sent_audio: BytesMut::new(),
            words: Vec::new(),
        });
        id
    }

    /// Queues ready-made μ-law audio (no synthesis), e.g. DTMF tones. Returns the utterance id.
    pub fn push_audio(&mut self, kind: UttKind, text: String, entry: usize, audio: &[u8]) -> u64 {
        let id = self.push(kind, text, entry);
        if let Some(u) = self.queue.back_mut() {
            u.started = true;
            u.synth_done = true;
            u.buf.extend_from_slice(audio);
        }
        id
    }

    /// Keeps only what the caller is hearing now: the first utterance awaiting its mark, or
    /// when none is, the next one queued. Everything after it is dropped (synthesis
    /// cancelled); audio of it already at the carrier plays on until the call is hung up or
    /// the carrier is told to `clear`.
    pub(crate) fn keep_current(&mut self) {
        if self.awaiting_mark.is_empty() {
            self.drop_queued(1);
        } else {
            self.awaiting_mark.truncate(1);
            self.drop_queued(0);
        }
    }

    /// Drops the queue after its first `keep` utterances, noting the synthesis to cancel.
    fn drop_queued(&mut self, keep: usize) {
        for u in self.queue.iter().skip(keep) {
            note_cancel(&mut self.cancelled, u);
        }
        self.queue.truncate(keep);
    }

    /// Utterances dropped since the last call whose synthesis was still running: the caller
    /// cancels their streams.
    pub(crate) fn take_cancelled(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.cancelled)
    }

    /// Like [`Mouth::push`] but before everything that has not started playing yet.
    pub(crate) fn push_front_unstarted(
        &mut self,
        kind: UttKind,
        text: String,
        entry: usize,
    ) -> u64 {
        let id = self.push(kind, text, entry);
        if let Some(u) = self.queue.pop_back() {
            let pos = self
                .queue
                .iter()
                .position(|q| q.sent_bytes == 0)
                .unwrap_or(self.queue.len());
            self.queue.insert(pos, u);
        }
        id
    }

    /// Texts of queued utterances whose synthesis should start now (bounded concurrency),
    /// without asking for them (see [`Mouth::take_synthesis`]).
    pub(crate) fn wants_tts(&self) -> Vec<(u64, String)> {
        let in_flight = self
            .queue
            .iter()
            .filter(|u| u.started && !u.synth_done)
            .count();
        self.queue
            .iter()
            .filter(|u| !u.started)
            .take(MAX_TTS_IN_FLIGHT.saturating_sub(in_flight))
            .map(|u| (u.id, u.text.clone()))
            .collect()
    }

    /// [`Mouth::wants_tts`], noted as asked for: the caller starts each synthesis and hands
    /// its events to [`Mouth::on_tts`].
    pub(crate) fn take_synthesis(&mut self) -> Vec<(u64, String)> {
        let wanted = self.wants_tts();
        for (id, _) in &wanted {
            if let Some(u) = self.queue.iter_mut().find(|u| u.id == *id) {
                u.started = true;
            }
        }
        wanted
    }

    /// Applies a synthesis event. Returns what the call's timeline should note: a failed
    /// synthesis, a sentence's first audio byte, or a switch of the TTS chain.
    pub(crate) fn on_tts(&mut self, id: u64, ev: Option<TtsEvent>) -> Option<TtsNote> {
        let u = self.queue.iter_mut().find(|u| u.id == id)?;
        match ev {
            Some(TtsEvent::Audio(b)) => {
                u.buf.extend_from_slice(&b);
                None
            }
            Some(TtsEvent::Words(w)) => {
                u.words.extend(w);
                None
            }
            Some(TtsEvent::Done) => {
                u.synth_done = true;
                None
            }
            Some(TtsEvent::Error(e) | TtsEvent::Unavailable(e)) => {
                u.synth_done = true;
                u.failed = true;
                Some(TtsNote::Failed(u.kind, e))
            }
            Some(TtsEvent::FirstByte { provider, after }) => {
                Some(TtsNote::FirstByte { provider, after })
            }
            Some(TtsEvent::Switched { from, to, reason }) => {
                Some(TtsNote::Switched { from, to, reason })
            }
            None => {
                // The stream ended without Done: treat what we have as all there is.
                u.synth_done = true;
                u.failed = u.buf.is_empty() && u.sent_bytes == 0;
                if u.failed {
                    Some(TtsNote::Failed(
                        u.kind,
                        "synthesis ended without audio".into(),
                    ))
                } else {
                    None
                }
            }
        }
    }

    /// Sends as many frames as the lead allows. Call on every tick and after every TTS event.
    pub fn pump(&mut self, now: Instant) -> Pumped {
        let mut out = Pumped::default();
        self.pump_into(now, &mut out);
        out
    }

    /// [`Mouth::pump`] into `out`'s (emptied) vectors, which the caller reuses from pump to
    /// pump: the hot path allocates nothing.
    pub fn pump_into(&mut self, now: Instant, out: &mut Pumped) {
        out.commands.clear();
        out.started.clear();
        if self.paused || self.held {
            return;
        }
        while let Some(front) = self.queue.front_mut() {
            let play_until = self.play_until.filter(|t| *t > now).unwrap_or(now);
            if front.buf.len() >= FRAME_BYTES || (front.synth_done && !front.buf.is_empty()) {
                if play_until.duration_since(now) >= LEAD {
                    break;
                }
                let mut frame = front.buf.split_to(front.buf.len().min(FRAME_BYTES));
                if frame.len() < FRAME_BYTES {
                    frame.resize(FRAME_BYTES, SILENCE);
                }
                if front.sent_bytes == 0 {
                    out.started.push((front.id, front.kind));
                }
                front.sent_bytes += frame.len();
                front.sent_audio.extend_from_slice(&frame);
                if let Some(echo) = &self.echo {
                    echo.played(play_until, &frame);
                }
                out.commands.push(MediaCommand::Audio(Bytes::from(frame)));
                self.play_until = Some(play_until + Duration::from_millis(FRAME_MS));
                continue;
            }
            if front.synth_done {
                // Everything of this utterance is at the carrier: mark it and move on.
                let Some(u) = self.queue.pop_front() else {
                    break;
                };
                if u.sent_bytes > 0 {
                    let mark = if self.epoch == 0 {
                        format!("u{}", u.id)
                    } else {
                        format!("u{}.{}", u.id, self.epoch)
                    };
                    out.commands.push(MediaCommand::Mark(mark.clone()));
                    self.awaiting_mark.push_back(Sent {
                        id: u.id,
                        kind: u.kind,
                        text: u.text,
                        entry: u.entry,
                        mark,
                        audio: u.sent_audio.freeze(),
                        words: u.words,
                        ends_at: self.play_until,
                    });
                }
                continue;
            }
            break;
        }
    }

    /// When the pacer next needs to run (`None`: only a TTS event can make progress).
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        if self.paused || self.held {
            return None;
        }
        let front = self.queue.front()?;
        if front.buf.len() >= FRAME_BYTES || (front.synth_done && !front.buf.is_empty()) {
            let play_until = self.play_until.filter(|t| *t > now).unwrap_or(now);
            let at = play_until.checked_sub(LEAD - TOP_UP).unwrap_or(now);
            if at <= now {
                return Some(now);
            }
            return Some(on_tick(at));
        }
        if front.synth_done {
            return Some(now);
        }
        None
    }

    /// How much of what was sent the carrier has not played yet at `now` (0 when nothing is
    /// queued there): the caller has heard everything sent but this.
    #[cfg(test)]
    pub(crate) fn unplayed(&self, now: Instant) -> Duration {
        self.play_until
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// A mark came back: the caller heard that utterance. Marks of cleared utterances (which
    /// some carriers echo after a `clear`) are unknown here and return `None`.
    pub fn on_mark(&mut self, name: &str) -> Option<Sent> {
        let pos = self.awaiting_mark.iter().position(|s| s.mark == name)?;
        self.awaiting_mark.remove(pos)
    }

    /// [`Mouth::on_mark`] for a mark that came back at `now`; also learns how far behind the
    /// pacer's clock the carrier plays (the smallest delay of the last [`LAG_MARKS`] marks).
    pub(crate) fn mark_returned(&mut self, name: &str, now: Instant) -> Option<Sent> {
        let sent = self.on_mark(name)?;
        if let Some(end) = sent.ends_at {
            if self.lags.len() == LAG_MARKS {
                self.lags.pop_front();
            }
            self.lags
                .push_back(now.saturating_duration_since(end).min(LEAD));
        }
        Some(sent)
    }

    /// The carrier's lag behind the pacer's clock (0 before any mark came back).
    fn lag(&self) -> Duration {
        self.lags.iter().min().copied().unwrap_or_default()
    }

    /// How much of each utterance whose mark has not come back had played at `at` (at or before
    /// now), in playing order: the audio sent, less what the carrier still had queued then (up
    /// to the pacer's end of playback, shifted by the carrier's lag).
    pub(crate) fn played_at(&self, at: Instant) -> Vec<Played> {
        let ms = |bytes: usize| u32::try_from(bytes / 8).unwrap_or(u32::MAX);
        let mut out: Vec<Played> = self
            .awaiting_mark
            .iter()
            .map(|s| Played {
                entry: s.entry,
                text: s.text.clone(),
                words: s.words.clone(),
                audio_ms: ms(s.audio.len()),
                sent_all: true,
                played_ms: 0,
            })
            .collect();
        if let Some(u) = self.queue.front().filter(|u| u.sent_bytes > 0) {
            out.push(Played {
                entry: u.entry,
                text: u.text.clone(),
                words: u.words.clone(),
                audio_ms: ms(u.sent_bytes),
                sent_all: u.synth_done && u.buf.is_empty(),
                played_ms: 0,
            });
        }
        let ahead = self
            .play_until
            .map(|t| (t + self.lag()).saturating_duration_since(at))
            .unwrap_or_default();
        let total: u64 = out.iter().map(|p| u64::from(p.audio_ms)).sum();
        let mut left = total.saturating_sub(ahead.as_millis() as u64);
        for p in out.iter_mut() {
            let here = left.min(u64::from(p.audio_ms));
            p.played_ms = here as u32;
            left -= here;
        }
        out
    }

    /// Stops speaking: drops every queued utterance (cancelling their synthesis), settles every
    /// utterance still awaiting its mark as not heard (some carriers never acknowledge a mark
    /// whose audio was cleared, so nothing may wait on one), and forgets the pacing clock.
    pub fn clear(&mut self, now: Instant) -> Cleared {
        let need_clear = !self.awaiting_mark.is_empty()
            || self.queue.iter().any(|u| u.sent_bytes > 0)
            || self.play_until.is_some_and(|t| t > now);
        let dropped: Vec<Utterance> = self.queue.drain(..).collect();
        for u in &dropped {
            note_cancel(&mut self.cancelled, u);
        }
        let unheard: Vec<Sent> = self.awaiting_mark.drain(..).collect();
        self.play_until = None;
        if let Some(echo) = &self.echo {
            echo.cut(now);
        }
        self.paused = false;
        self.held = false;
        Cleared {
            dropped,
            unheard,
            need_clear,
        }
    }

    /// Stops sending without forgetting anything: every utterance whose mark has not come back
    /// goes back to the front of the queue with all of its audio (sentence precision: the
    /// caller will hear an unconfirmed sentence again from its start), synthesis carries on,
    /// and nothing is sent until [`Mouth::resume`]. The caller sends the carrier a `clear`
    /// when `need_clear` says so.
    pub fn pause(&mut self, now: Instant) -> Paused {
        let need_clear = !self.awaiting_mark.is_empty()
            || self.queue.iter().any(|u| u.sent_bytes > 0)
            || self.play_until.is_some_and(|t| t > now);
        if let Some(front) = self.queue.front_mut()
            && front.sent_bytes > 0
        {
            let mut audio = std::mem::take(&mut front.sent_audio);
            audio.extend_from_slice(&front.buf);
            front.buf = audio;
            front.sent_bytes = 0;
        }
        let mut withdrawn = Vec::new();
        while let Some(s) = self.awaiting_mark.pop_back() {
            withdrawn.push(s.mark);
            self.queue.push_front(Utterance {
                id: s.id,
                kind: s.kind,
                text: s.text,
                entry: s.entry,
                started: true,
                buf: BytesMut::from(&s.audio[..]),
                synth_done: true,
                failed: false,
                sent_bytes: 0,
                sent_audio: BytesMut::new(),
                words: s.words,
            });
        }
        withdrawn.reverse();
        self.play_until = None;
        if let Some(echo) = &self.echo {
            echo.cut(now);
        }
        self.paused = true;
        self.held = false;
        self.epoch += 1;
        Paused {
            need_clear,
            withdrawn,
        }
    }

    /// Sends again after a [`Mouth::pause`].
    pub fn resume(&mut self) {
        self.paused = false;
        self.held = false;
    }

    /// Stops sending new audio without a `clear` and without forgetting anything: the
    /// carrier plays on what it already has (up to [`LEAD`]). Undone by [`Mouth::release`].
    pub fn hold(&mut self) {
        self.held = true;
    }

    /// Sends again after a [`Mouth::hold`] (pump next).
    pub fn release(&mut self) {
        self.held = false;
    }

    /// True while held by [`Mouth::hold`].
    pub(crate) fn is_held(&self) -> bool {
        self.held
    }

    /// True while paused by [`Mouth::pause`] (until [`Mouth::resume`] or [`Mouth::clear`]).
    #[cfg(test)]
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// True while agent audio may be playing at the carrier (sent and not confirmed played,
    /// or still being sent).
    pub(crate) fn is_playing(&self, now: Instant) -> bool {
        !self.paused
            && (!self.awaiting_mark.is_empty()
                || self.queue.front().is_some_and(|u| u.sent_bytes > 0)
                || self.play_until.is_some_and(|t| t > now))
    }

    /// The kind of the utterance the caller is hearing (or would hear next).
    pub(crate) fn current_kind(&self) -> Option<UttKind> {
        self.awaiting_mark
            .front()
            .map(|s| s.kind)
            .or_else(|| self.queue.front().map(|u| u.kind))
    }

    /// Text of what the agent is saying now: unconfirmed utterances and the next queued ones.
    pub(crate) fn current_text(&self) -> String {
        let mut words: Vec<&str> = self.awaiting_mark.iter().map(|s| s.text.as_str()).collect();
        words.extend(self.queue.iter().take(2).map(|u| u.text.as_str()));
        words.join(" ")
    }

    /// Drops queued utterances matching `pred` that have not started playing.
    pub(crate) fn drop_unstarted(&mut self, pred: impl Fn(UttKind) -> bool) {
        let cancelled = &mut self.cancelled;
        self.queue.retain(|u| {
            let keep = u.sent_bytes > 0 || !pred(u.kind);
            if !keep {
                note_cancel(cancelled, u);
            }
            keep
        });
    }

    /// True while anything is queued, being sent, or not yet confirmed played.
    pub fn is_speaking(&self) -> bool {
        !self.queue.is_empty() || !self.awaiting_mark.is_empty()
    }

    /// True when any utterance of `kind` has started playing or is awaiting its mark.
    pub(crate) fn any_audio_for(&self, pred: impl Fn(UttKind) -> bool) -> bool {
        self.queue.iter().any(|u| u.sent_bytes > 0 && pred(u.kind))
            || self.awaiting_mark.iter().any(|s| pred(s.kind))
    }

    pub fn queued(&self) -> impl Iterator<Item = &Utterance> {
        self.queue.iter()
    }
}

/// Notes `u`'s synthesis for cancelling when it was asked for and has not finished.
fn note_cancel(cancelled: &mut Vec<u64>, u: &Utterance) {
    if u.started && !u.synth_done {
        cancelled.push(u.id);
    }
}

/// The first instant on the shared pacer grid ([`TICK`]) at or after `at`.
fn on_tick(at: Instant) -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    let Some(since) = at.checked_duration_since(origin) else {
        return at;
    };
    let tick = TICK.as_nanos();
    let rem = since.as_nanos() % tick;
    if rem == 0 {
        at
    } else {
        at + Duration::from_nanos((tick - rem) as u64)
    }
}

#[cfg(test)]
mod tests;

/// The pacer's batching: top-ups of [`TOP_UP`] on the shared [`TICK`] grid.
#[cfg(test)]
mod pacing_tests;
