//! Caller audio's way in without a hop through the call actor. The media pump owns
//! a call's [`CallerIngress`] and runs it inline on every inbound frame: it feeds the Smart
//! Turn ring and the recording, runs the voice detector and writes the audio to the STT
//! through the call's shared [`SttFeed`] ([`SttPace`]: 60 ms writes in silence, the first voiced
//! frame at once, 40 ms writes while the caller speaks, frame by frame from the end of speech
//! until past the STT's endpointing). The actor hears only what turn-taking needs, as a
//! [`CallerNote`] on its media channel ([`MediaInput::Caller`]): at once for a frame with a
//! detector event, and for every frame while the caller speaks over an agent that may be heard
//! ([`BargeWatch`]: barge-in judges every frame of such a run); otherwise once per
//! [`QUIET_NOTE_FRAMES`] frames (it keeps the media timeout fed). In silence, or while the
//! caller talks to a quiet agent, the actor so wakes 10 times a second instead of 50.
//!
//! The [`SttFeed`] is the one writer of a call's STT input: the actor swaps its sender when it
//! opens or reopens the session, and sends `Finalize` / `Close` through it, which first
//! flushes the batch, so audio and control stay in order.
//!
//! The stage runs on the media pump's task, the actor on its own: what the two share is one
//! handle, [`CallerShared`], which the actor owns and clones into the stage it builds when
//! media attaches ([`CallerShared::stage`]). It holds exactly five pieces, each written by one
//! side and read by the other, none of them waited on: the [`SttFeed`] (the stage writes
//! audio, the actor swaps the session and sends control; one mutex, held for a `try_send`),
//! the [`BargeWatch`] and the [`BeepWatch`] (written by the actor on every wake, read by the
//! stage on every frame; the second runs the answering machine's beep detector while a call
//! a machine answered waits for its greeting to end),
//! the [`EchoReference`] (written by the actor's pacer with the levels of the agent audio it
//! sends, read by the stage's echo check) and the end-of-turn model's [`CallerRing`] (written
//! by the stage with every frame, snapshotted by the actor when the policy asks the model). The
//! stage is handed each frame's arrival time ([`CallerIngress::frame`]); it never reads the
//! clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::echo::{CallerClock, EchoReference};
use super::eot::CallerRing;
use super::log::{CallLog, Dropped};
use super::recording::CallerTrack;
use crate::audio::beep::{Beep, BeepDetector};
use crate::audio::echo::{EchoEstimator, EchoPath, LAGS, ulaw_db};
use crate::audio::pitch::Periodicity;
use crate::audio::vad::{Vad, VadEvent};
use crate::carrier::{FRAME_BYTES, FRAME_MS, MediaEvent};
use crate::provider::SttInput;

/// While the caller is silent their audio goes to the STT in writes of this much (60 ms):
/// a third of the channel sends, STT-writer wake-ups and socket writes.
pub(crate) const STT_BATCH_BYTES: usize = 3 * FRAME_BYTES;
/// While the caller speaks their audio goes in writes of this much (40 ms): the STT's interim
/// words come at most a frame later, and its end-of-speech timing runs on the unbatched tail.
pub(crate) const STT_SPEECH_BATCH_BYTES: usize = 2 * FRAME_BYTES;
/// Audio goes frame by frame (unbatched) after speech until this long past the STT's own
/// endpointing silence, so its end of speech (Deepgram's `speech_final`) is as without
/// batching even when it hears the speech end a little later than our detector.
pub(crate) const STT_ENDPOINT_MARGIN_MS: u64 = 300;
/// The same tail for an STT that decides the end of each turn itself (Flux, AssemblyAI): its
/// timing is its own, so the tail is longer.
pub(crate) const STT_UNBATCHED_TAIL_MS: u64 = 1000;

/// How a caller frame goes to the STT ([`SttFeed::audio`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SttPace {
    /// Now, with anything batched before it.
    AtOnce,
    /// In 40 ms writes ([`STT_SPEECH_BATCH_BYTES`]): the caller is speaking.
    Speech,
    /// In 60 ms writes ([`STT_BATCH_BYTES`]): the caller is quiet.
    Quiet,
}

impl SttPace {
    fn bytes(self) -> usize {
        match self {
            SttPace::AtOnce => 0,
            SttPace::Speech => STT_SPEECH_BATCH_BYTES,
            SttPace::Quiet => STT_BATCH_BYTES,
        }
    }
}

/// Bytes the STT batch buffer reserves at a time (batches are carved out of it, and it is
/// reused once the STT writer dropped them): four 60 ms batches, small because every live
/// call holds one.
const STT_POOL_BYTES: usize = 2 * 1024;
/// In silence without detector events the actor hears of caller audio once per this many
/// frames (100 ms): its media timeout only needs to know that audio still flows.
pub(crate) const QUIET_NOTE_FRAMES: u32 = 5;
/// A pitched frame counts for barge-in only this far above the tracked background (dB): the
/// voices of a café or an engine's hum behind a cough are pitched too, but at the room's level.
const PITCH_OVER_FLOOR_DB: f32 = 6.0;

/// While the agent's echo may be heard (an echo path is known and what was played at its
/// delay stands over the background), the detector's speech start reaches turn-taking only
/// after this much voiced audio the echo does not explain (net of the frames it does), or as
/// soon as nothing that could be echo is left, with its onset where the caller's own voice
/// began: the agent's own echo must not look like the caller taking a turn.
pub(crate) const ECHO_START_OWN_MS: u64 = 100;

/// What reaches the call actor on its media channel.
#[derive(Debug)]
pub enum MediaInput {
    /// A carrier event (caller audio only when no pump runs the ingress, e.g. `patterd try`).
    Media(MediaEvent),
    /// What turn-taking needs of the caller audio the pump's ingress took in.
    Caller(CallerNote),
    /// Caller frames the pump dropped because they came faster than real time (the socket's
    /// total so far): a timeline event.
    Paced {
        /// Frames dropped on this socket so far.
        dropped: u64,
    },
    /// The caller kept sending audio faster than real time: the pump closes the socket and
    /// the call ends ([`FLOOD_REASON`]). Sent before the media channel closes, so the call
    /// always ends for this reason.
    Flooded {
        /// Frames dropped on this socket.
        dropped: u64,
    },
}

/// Why a call whose media socket kept sending audio faster than real time was hung up.
pub const FLOOD_REASON: &str = "the caller sent audio faster than real time";

impl From<MediaEvent> for MediaInput {
    fn from(ev: MediaEvent) -> Self {
        Self::Media(ev)
    }
}

/// What turn-taking needs to know of `frames` caller frames the ingress took in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallerNote {
    /// The detector's events, in order, each with the audio time judged when it came.
    pub vad: Vec<(VadEvent, u64)>,
    /// Voiced audio in the current run after the last frame (0 when not speaking).
    pub(crate) speech_run_ms: u64,
    /// Audio time since the current run's onset, voiced and gaps (0 when not speaking).
    pub(crate) speech_span_ms: u64,
    /// Pitched audio ([`Periodicity`]) in the current run, counted while barge-in watches
    /// (0 when not speaking): a run without any is noise-like (a cough), not a voice.
    pub(crate) pitched_ms: u64,
    /// Voiced audio in the current run the agent's echo explains ([`crate::audio::echo`]),
    /// counted while barge-in watches (0 when not speaking): not the caller's own voice.
    pub(crate) echo_ms: u64,
    /// The echo path was found (`Some(Some(path))`) or lost (`Some(None)`) since the last note.
    pub(crate) echo_path: Option<Option<EchoPath>>,
    /// A machine's beep ended in the audio since the last note (while [`BeepWatch`] listened).
    pub(crate) beep: Option<Beep>,
    /// Frames covered.
    pub frames: u32,
}

/// Whether barge-in could act on the caller's speech now (the agent may be heard, or is held):
/// set by the actor on every wake, read by the stage on every frame. While it is clear a
/// speech run's frames are noted like quiet ones (the policy does nothing with them); a run
/// in progress when it is set is noted from the next frame on. Set until the actor says
/// otherwise.
#[derive(Clone)]
pub(crate) struct BargeWatch(Arc<AtomicBool>);

impl Default for BargeWatch {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl BargeWatch {
    pub(crate) fn set(&self, armed: bool) {
        self.0.store(armed, Ordering::Relaxed);
    }

    pub(crate) fn armed(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Whether the caller-audio stage listens for an answering machine's beep: set by the actor on
/// every wake while a call a machine answered waits for the greeting to end, read by the stage
/// on every frame. Clear by default.
#[derive(Clone, Default)]
pub(crate) struct BeepWatch(Arc<AtomicBool>);

impl BeepWatch {
    pub(crate) fn set(&self, listen: bool) {
        self.0.store(listen, Ordering::Relaxed);
    }

    pub(crate) fn listening(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The call's writer to its STT session, shared by the media pump's ingress (audio) and the
/// actor (the session's sender, `Finalize`, `Close`). Never waits: every send is a `try_send`.
#[derive(Clone)]
pub struct SttFeed(Arc<Mutex<SttWriter>>);

struct SttWriter {
    input: Option<mpsc::Sender<SttInput>>,
    /// Caller audio waiting to go in one write (see [`STT_BATCH_BYTES`]).
    batch: BytesMut,
    /// Audio the session accepted (ms), and frames it refused (its queue was full).
    audio_ms: u64,
    dropped: u64,
    log: Option<Arc<dyn CallLog>>,
    call_id: String,
}

impl SttFeed {
    pub fn new(log: Option<Arc<dyn CallLog>>, call_id: &str) -> Self {
        Self(Arc::new(Mutex::new(SttWriter {
            input: None,
            batch: BytesMut::new(),
            audio_ms: 0,
            dropped: 0,
            log,
            call_id: call_id.to_string(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, SttWriter> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session audio goes to from now on (`None`: none; audio is dropped uncounted). What
    /// is batched stays batched for the next session.
    pub fn set_input(&self, input: Option<mpsc::Sender<SttInput>>) {
        self.lock().input = input;
    }

    /// Hands a caller frame to the STT: into the batch, which goes once it holds what `pace`
    /// asks (at once: now, with anything batched before it).
    pub fn audio(&self, frame: Bytes, pace: SttPace) {
        let mut w = self.lock();
        let goes = pace.bytes();
        let audio = if w.batch.is_empty() && frame.len() >= goes {
            frame
        } else {
            if w.batch.capacity() - w.batch.len() < frame.len() {
                w.batch.reserve(STT_POOL_BYTES);
            }
            w.batch.extend_from_slice(&frame);
            if w.batch.len() < goes {
                return;
            }
            w.batch.split().freeze()
        };
        w.write(audio);
    }

    /// Sends what is batched, then `input` (`Finalize`, `Close`); false when the session
    /// refused it (its queue is full).
    pub fn send(&self, input: SttInput) -> bool {
        let mut w = self.lock();
        w.flush();
        w.input.as_ref().is_none_or(|s| s.try_send(input).is_ok())
    }

    /// Audio the sessions accepted (ms) and frames they refused.
    pub fn totals(&self) -> (u64, u64) {
        let w = self.lock();
        (w.audio_ms, w.dropped)
    }
}

impl SttWriter {
    fn flush(&mut self) {
        if !self.batch.is_empty() {
            let audio = self.batch.split().freeze();
            self.write(audio);
        }
    }

    fn write(&mut self, audio: Bytes) {
        let n = audio.len() as u64;
        let Some(input) = &self.input else {
            return;
        };
        if input.try_send(SttInput::Audio(audio)).is_ok() {
            self.audio_ms += n / 8;
            return;
        }
        for _ in 0..n.div_ceil(FRAME_BYTES as u64) {
            self.dropped += 1;
            if let Some(log) = &self.log {
                log.frame_dropped(&self.call_id, Dropped::ToStt);
            }
        }
    }
}

/// The echo check of a call's caller audio (see [`super::echo`]).
struct EchoCheck {
    reference: EchoReference,
    clock: CallerClock,
    estimate: EchoEstimator,
    played: [f32; LAGS],
    /// The path last noted.
    path: Option<EchoPath>,
}

impl EchoCheck {
    /// Checks this caller frame, arriving now, against the agent audio played before it.
    /// Returns whether the frame could hold an echo (a path is known and what was played
    /// at its delay would be heard) and whether the frame is explained by the echo.
    fn check(&mut self, frame: &[u8], floor_db: f32, now: Instant) -> (bool, bool) {
        let captured = self.clock.capture(now);
        let level = ulaw_db(frame);
        // A frame at the background level has nothing to explain (and cannot start a run).
        if !EchoEstimator::heard(level, floor_db)
            || !self.reference.levels(captured, &mut self.played)
        {
            return (false, false);
        }
        let explained = self.estimate.push(level, floor_db, &self.played);
        (self.estimate.could_echo(floor_db, &self.played), explained)
    }
}

/// Everything a call's actor shares with its caller-audio stage (see the module docs): the
/// actor holds this one handle and clones it into the stage it builds.
#[derive(Clone)]
pub(crate) struct CallerShared {
    /// The call's one writer to its STT session.
    pub stt: SttFeed,
    /// Whether barge-in could act on caller speech now.
    pub barge: BargeWatch,
    /// Whether to listen for an answering machine's beep now.
    pub beep: BeepWatch,
    /// The levels of the agent audio sent (agents with `barge_in_echo_check` only).
    pub echo: Option<EchoReference>,
    /// The caller's last 8 s for the end-of-turn model (agents with `turn_model` only).
    pub ring: Option<Arc<Mutex<CallerRing>>>,
}

impl CallerShared {
    /// The caller-audio stage on this shared state, with detector `vad` (see
    /// [`CallerIngress::new`] for `stt_tail_ms`).
    pub(crate) fn stage(&self, vad: Vad, stt_tail_ms: u64) -> CallerIngress {
        let stage = CallerIngress::new(vad, self.stt.clone(), stt_tail_ms)
            .with_ring(self.ring.clone())
            .with_barge_watch(self.barge.clone())
            .with_beep_watch(self.beep.clone());
        match &self.echo {
            Some(echo) => stage.with_echo_reference(echo.clone()),
            None => stage,
        }
    }
}

/// A call's caller-audio stage: run on each inbound frame by whoever reads the media socket.
pub struct CallerIngress {
    vad: Vad,
    stt: SttFeed,
    /// How long after the last voiced frame audio still goes to the STT unbatched.
    stt_tail_ms: u64,
    /// The last frame was voiced or in the unbatched tail (the next voiced frame after quiet
    /// goes at once).
    stt_live: bool,
    recorder: Option<CallerTrack>,
    ring: Option<Arc<Mutex<CallerRing>>>,
    log: Option<Arc<dyn CallLog>>,
    call_id: String,
    /// A note for every frame (the actor runs the ingress itself).
    every_frame: bool,
    barge: BargeWatch,
    /// Pitch of the frames barge-in judges, and the pitched audio in the current run.
    pitch: Periodicity,
    pitched_ms: u64,
    /// The agent's echo in the caller's audio, when the pacer writes a reference.
    echo: Option<EchoCheck>,
    echo_ms: u64,
    /// A speech start held back while the agent may be echoing, and the voiced audio since
    /// that the echo does not explain (see [`ECHO_START_OWN_MS`]).
    held_start: Option<VadEvent>,
    held_own_ms: u64,
    /// When to listen for a machine's beep, and the detector while it listens.
    beep_watch: BeepWatch,
    beep: Option<BeepDetector>,
    /// The note being gathered.
    note: CallerNote,
}

impl CallerIngress {
    /// `stt_tail_ms`: how long after the last voiced frame audio goes to the STT unbatched.
    pub fn new(vad: Vad, stt: SttFeed, stt_tail_ms: u64) -> Self {
        Self {
            vad,
            stt,
            stt_tail_ms,
            stt_live: false,
            recorder: None,
            ring: None,
            log: None,
            call_id: String::new(),
            every_frame: false,
            barge: BargeWatch::default(),
            pitch: Periodicity::default(),
            pitched_ms: 0,
            echo: None,
            echo_ms: 0,
            held_start: None,
            held_own_ms: 0,
            beep_watch: BeepWatch::default(),
            beep: None,
            note: CallerNote::default(),
        }
    }

    /// Compares the caller's audio with the agent audio the pacer wrote to `reference`.
    pub(crate) fn with_echo_reference(mut self, reference: EchoReference) -> Self {
        self.echo = Some(EchoCheck {
            reference,
            clock: CallerClock::default(),
            estimate: EchoEstimator::default(),
            played: [0.0; LAGS],
            path: None,
        });
        self
    }

    /// The caller's side of the recording.
    pub(crate) fn with_recorder(mut self, track: Option<CallerTrack>) -> Self {
        self.recorder = track;
        self
    }

    /// The end-of-turn model's ring of the caller's last seconds.
    pub(crate) fn with_ring(mut self, ring: Option<Arc<Mutex<CallerRing>>>) -> Self {
        self.ring = ring;
        self
    }

    /// Where dropped recording frames are reported.
    pub(crate) fn with_log(mut self, log: Option<Arc<dyn CallLog>>, call_id: &str) -> Self {
        self.log = log;
        self.call_id = call_id.to_string();
        self
    }

    /// Whether speech runs are noted frame by frame (see [`BargeWatch`]; always without one).
    pub(crate) fn with_barge_watch(mut self, barge: BargeWatch) -> Self {
        self.barge = barge;
        self
    }

    /// Listens for a machine's beep while `watch` says so.
    pub(crate) fn with_beep_watch(mut self, watch: BeepWatch) -> Self {
        self.beep_watch = watch;
        self
    }

    /// A note after every frame (as the actor hears frames when it runs the stage itself).
    pub(crate) fn every_frame(mut self) -> Self {
        self.every_frame = true;
        self
    }

    /// Takes in one caller frame (μ-law) that arrived at `now`; returns a note when the actor
    /// must hear now.
    pub fn frame(&mut self, frame: Bytes, now: Instant) -> Option<CallerNote> {
        if let Some(ring) = &self.ring {
            ring.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_ulaw(&frame);
        }
        if let Some(rec) = &self.recorder
            && !rec.caller(frame.clone())
            && let Some(log) = &self.log
        {
            log.frame_dropped(&self.call_id, Dropped::ToRecording);
        }
        let mut event = self.listen_for_beep(&frame);
        let floor = self.vad.floor_db();
        let (echoing, echoed) = match &mut self.echo {
            Some(e) => {
                let (echoing, echoed) = e.check(&frame, floor, now);
                if e.path.map(|p| p.delay_ms) != e.estimate.path().map(|p| p.delay_ms) {
                    if e.path.is_none() {
                        // Locked on during a held run: what was heard of it was the echo.
                        self.held_own_ms = 0;
                    }
                    e.path = e.estimate.path();
                    self.note.echo_path = Some(e.path);
                    event = true;
                }
                (echoing, echoed)
            }
            None => (false, false),
        };
        for ev in self.vad.push_ulaw(&frame) {
            match ev {
                // While the agent's echo may be heard, a run starts for turn-taking only once
                // it has some voice the echo does not explain.
                VadEvent::SpeechStart { .. } if echoing => {
                    self.held_start = Some(ev);
                    self.held_own_ms = 0;
                }
                // An echo-only run: never started, never ends.
                VadEvent::SpeechEnd { .. } if self.held_start.take().is_some() => {}
                _ => {
                    self.note.vad.push((ev, self.vad.audio_ms()));
                    event = true;
                }
            }
        }
        let speaking = self.vad.is_speaking();
        let judged = speaking && self.barge.armed();
        if self.held_start.is_some() {
            if speaking && !echoed {
                if self.held_own_ms == 0 {
                    // The caller's own voice starts with this frame.
                    let frame_start = self.vad.audio_ms().saturating_sub(FRAME_MS);
                    self.held_start = Some(VadEvent::SpeechStart {
                        onset_ms: frame_start,
                    });
                }
                self.held_own_ms += FRAME_MS;
            } else if echoed {
                // Stray unexplained frames in a long echo do not add up to a voice.
                self.held_own_ms = self.held_own_ms.saturating_sub(FRAME_MS);
            }
            // Nothing left that could be echo: whatever is voiced now is the caller.
            let released = self.held_own_ms >= ECHO_START_OWN_MS || (speaking && !echoing);
            if released && let Some(start) = self.held_start.take() {
                self.note.vad.push((start, self.vad.audio_ms()));
                event = true;
            }
        }
        // Pitch only for the frames barge-in judges (a copy of the frame otherwise).
        if !speaking {
            self.pitched_ms = 0;
            self.echo_ms = 0;
        }
        if judged && echoed {
            // The agent's own voice: neither voiced nor pitched audio of the caller's.
            self.echo_ms += FRAME_MS;
            self.pitch.remember(&frame);
        } else if judged {
            if self
                .pitch
                .push_ulaw(&frame)
                .voiced_over(self.vad.floor_db(), PITCH_OVER_FLOOR_DB)
            {
                self.pitched_ms += FRAME_MS;
            }
        } else {
            self.pitch.remember(&frame);
        }
        let live = speaking || (self.vad.heard_voice() && self.vad.silence_ms() < self.stt_tail_ms);
        let pace = if live && !self.stt_live {
            // The first voiced frame after quiet, with the quiet batched before it.
            SttPace::AtOnce
        } else if speaking {
            SttPace::Speech
        } else if live {
            SttPace::AtOnce
        } else {
            SttPace::Quiet
        };
        self.stt_live = live;
        self.stt.audio(frame, pace);
        self.note.frames += 1;
        self.note.speech_run_ms = self.vad.speech_run_ms();
        self.note.speech_span_ms = self.vad.speech_span_ms();
        self.note.pitched_ms = self.pitched_ms;
        self.note.echo_ms = self.echo_ms;
        if self.every_frame || event || judged || self.note.frames >= QUIET_NOTE_FRAMES {
            Some(std::mem::take(&mut self.note))
        } else {
            None
        }
    }
}

impl CallerIngress {
    /// Runs the beep detector on `frame` while the watch says so (a fresh one each time it
    /// starts listening); true when a beep ended in it (noted).
    fn listen_for_beep(&mut self, frame: &[u8]) -> bool {
        if !self.beep_watch.listening() {
            self.beep = None;
            return false;
        }
        let found = self
            .beep
            .get_or_insert_with(BeepDetector::new)
            .push_ulaw(frame);
        if found.is_some() {
            self.note.beep = found;
        }
        found.is_some()
    }
}

#[cfg(test)]
mod tests;
