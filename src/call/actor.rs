//! The call actor: one tokio task per call that owns every piece of the call's state and runs
//! one `select!` loop over carrier media events, speech-to-text events, the LLM stream, TTS
//! audio, the pacer, timers and messages from its [`CallHandle`]. It never blocks and never
//! waits on one stream while another starves: every wait is a branch of the select, and every
//! send to a peer is a `try_send` on a bounded channel.
//!
//! Conversation basics live here: the greeting (synthesised while the phone rings, played at
//! `start`), one brain turn in flight, the reply chunked into sentences and spoken as it
//! streams, a filler when the brain is slow, a spoken apology when it fails, DTMF as text, and
//! clean endings. Turn-taking runs on our own voice-activity detector ([`Vad`]) plus the STT:
//! the [`Endpointer`] ends caller turns; barge-in stops the agent fast (carrier `clear`, pacer
//! paused with its audio kept), then either commits (enough real words) or resumes from the
//! last sentence heard; backchannels and echo never cut the agent; history keeps what the
//! caller heard; idle callers are nudged, then said goodbye to. Every decision is an event.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, debug, info, info_span, warn};

use super::event::{EndReason, EventKind};
use super::registry::InsertError;
use super::speech::{Speech, UttKind};
use super::transcript::{CallEvent, CallRecord, Speaker, TranscriptEntry};
use super::turn::{Decision, Endpointer, Words};
use super::{CallHandle, CallMsg, CallRegistry, CallSetup, MediaAttach};
use crate::audio::vad::{Vad, VadConfig, VadEvent};
use crate::carrier::{MediaCommand, MediaEvent};
use crate::provider::chunker::{SentenceChunker, speakable};
use crate::provider::{
    ChatMessage, ChatTurn, LlmEvent, LlmStream, Role, SttContext, SttEvent, SttInput, SttStream,
};
use crate::security::mask_number;

/// Capacity of a call's handle channel.
const HANDLE_QUEUE: usize = 32;
/// Longest wait for the idle goodbye to play before hanging up anyway.
const GOODBYE_GRACE: Duration = Duration::from_secs(15);

/// The agent was stopped by caller speech and we are deciding whether it was real.
struct BargeIn {
    /// When `clear` went out.
    at: Instant,
    /// Resume unless confirmed by then.
    deadline: Instant,
}

/// Registers a new call and spawns its actor. The actor pre-opens the speech-to-text session
/// and starts synthesising the greeting at once, while the phone rings.
pub fn start(
    setup: CallSetup,
    registry: Arc<CallRegistry>,
    max_calls: usize,
) -> Result<CallHandle, InsertError> {
    let (tx, rx) = mpsc::channel(HANDLE_QUEUE);
    let (changes, changes_rx) = watch::channel(0);
    let handle = CallHandle::new(&setup.call_id, &setup.carrier_account, tx, changes_rx);
    registry.insert(handle.clone(), max_calls)?;
    let span = info_span!("call", call_id = %setup.call_id, carrier = setup.carrier.as_str());
    let actor = Actor::new(setup, rx, registry, changes);
    tokio::spawn(actor.run().instrument(span));
    Ok(handle)
}

/// The reply to one caller turn.
struct Turn {
    id: u64,
    /// When the caller's turn ended (the STT's end of utterance).
    ended_at: Instant,
    /// Some reply (or filler) audio has gone out for this turn.
    audio_started: bool,
    filler_done: bool,
    /// Transcript entry of the agent's reply, created with its first sentence.
    entry: Option<usize>,
    reply_text: String,
}

/// How to treat a caller turn that ends while the agent is busy.
enum Overlap {
    /// Nothing to cut: take the turn.
    Free,
    /// Cut the agent and take the turn.
    Cut,
    /// Take the turn without cutting (the uninterruptible greeting plays on; the reply follows).
    Queue,
    /// Keep the turn until the agent is done (`barge_in = false`).
    Hold,
}

struct Actor {
    setup: CallSetup,
    rx: mpsc::Receiver<CallMsg>,
    registry: Arc<CallRegistry>,
    /// Bumped with every event so that watchers of the handle wake (never blocks).
    changes: watch::Sender<u64>,
    created: Instant,
    answered: Option<Instant>,
    last_media: Instant,
    media_tx: Option<mpsc::Sender<MediaCommand>>,
    media_rx: Option<mpsc::Receiver<MediaEvent>>,
    stt: Option<SttStream>,
    stt_reopened: bool,
    llm: Option<LlmStream>,
    chunker: SentenceChunker,
    speech: Speech,
    turn: Option<Turn>,
    turns: u64,
    history: Vec<ChatMessage>,
    transcript: Vec<TranscriptEntry>,
    events: Vec<CallEvent>,
    greeting_sent: bool,
    frames_dropped: u64,
    stt_frames_dropped: u64,
    vad: Vad,
    endpointer: Endpointer,
    eot_at: Option<Instant>,
    words: Words,
    barge: Option<BargeIn>,
    /// For a brain that keeps its own history: what to tell it about the last interruption.
    brain_note: Option<String>,
    /// A caller turn waiting for the agent to finish (`barge_in = false`).
    held_turn: Option<(String, &'static str)>,
    /// Last time either side made a sound (for idle nudges).
    last_activity: Instant,
    nudges: u64,
    /// The idle goodbye is playing; hang up when it is done or at this time.
    goodbye_until: Option<Instant>,
}

/// Receives from an optional channel; pending forever when there is none.
async fn recv_opt<T>(rx: Option<&mut mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; pending forever for `None`.
async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Actor {
    fn new(
        setup: CallSetup,
        rx: mpsc::Receiver<CallMsg>,
        registry: Arc<CallRegistry>,
        changes: watch::Sender<u64>,
    ) -> Self {
        let now = Instant::now();
        Self {
            rx,
            registry,
            changes,
            created: now,
            answered: None,
            last_media: now,
            media_tx: None,
            media_rx: None,
            stt: None,
            stt_reopened: false,
            llm: None,
            chunker: SentenceChunker::new(),
            speech: Speech::new(),
            turn: None,
            turns: 0,
            history: Vec::new(),
            transcript: Vec::new(),
            events: Vec::new(),
            greeting_sent: false,
            frames_dropped: 0,
            stt_frames_dropped: 0,
            vad: Vad::new(VadConfig {
                threshold: setup.agent.vad_threshold as f32,
                stop_ms: setup.agent.vad_stop_ms,
                ..VadConfig::default()
            }),
            endpointer: Endpointer::new(
                setup.agent.min_endpointing_ms,
                setup.agent.max_endpointing_ms,
            )
            .with_stt_endpointing(setup.providers.stt.endpointing_ms()),
            eot_at: None,
            words: Words::new(&setup.agent.backchannel_words),
            barge: None,
            brain_note: None,
            held_turn: None,
            last_activity: now,
            nudges: 0,
            goodbye_until: None,
            setup,
        }
    }

    fn ms_since(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.created).as_millis() as u64
    }

    fn event(&mut self, kind: EventKind, detail: impl Into<String>) {
        let detail = detail.into();
        debug!(event = kind.as_str(), %detail, "call event");
        self.events.push(CallEvent {
            t_ms: self.ms_since(Instant::now()),
            kind,
            detail,
        });
        if let (Some(store), Some(e)) = (&self.setup.store, self.events.last()) {
            store.event(&self.setup.call_id, e);
        }
        let n = self.events.len() as u64;
        self.changes.send_replace(n);
    }

    /// Persists transcript entry `i` (a turn is durable once it ends). Never waits.
    fn persist(&self, i: usize) {
        if let (Some(store), Some(e)) = (&self.setup.store, self.transcript.get(i)) {
            store.turn(&self.setup.call_id, i, e);
        }
    }

    fn answered_ms(&self, t: Instant) -> u64 {
        self.answered
            .map(|a| t.saturating_duration_since(a).as_millis() as u64)
            .unwrap_or(0)
    }

    fn record(&self, reason: &EndReason) -> CallRecord {
        CallRecord {
            call_id: self.setup.call_id.clone(),
            carrier: self.setup.carrier.as_str().to_string(),
            agent: self.setup.agent_name.clone(),
            from_masked: mask_number(&self.setup.from),
            to_masked: mask_number(&self.setup.to),
            ended_reason: reason.clone(),
            transcript: self.transcript.clone(),
            events: self.events.clone(),
        }
    }

    async fn run(mut self) {
        info!(
            from = %mask_number(&self.setup.from),
            to = %mask_number(&self.setup.to),
            agent = %self.setup.agent_name,
            "call created; waiting for media"
        );
        self.stt = Some(self.setup.providers.stt.open(&SttContext {
            call_id: self.setup.call_id.clone(),
        }));
        let greeting = self.setup.agent.first_message.trim().to_string();
        if !greeting.is_empty() {
            self.enqueue(UttKind::Greeting, &greeting);
        }

        let reason = loop {
            let now = Instant::now();
            let pace_at = if self.media_tx.is_some() {
                self.speech.next_deadline(now)
            } else {
                None
            };
            let filler_at = self.filler_deadline();
            let talk_at = self.conversation_deadline();
            let deadline = self.deadline();
            tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(msg) => if let Some(r) = self.on_msg(msg) { break r },
                    None => break EndReason::HandlesDropped,
                },
                ev = recv_opt(self.media_rx.as_mut()) => match ev {
                    Some(ev) => if let Some(r) = self.on_media(ev) { break r },
                    None => break EndReason::MediaStreamClosed,
                },
                ev = recv_opt(self.stt.as_mut().map(|s| &mut s.events)) => self.on_stt(ev),
                ev = recv_opt(self.llm.as_mut().map(|l| &mut l.events)) => self.on_llm(ev),
                (id, ev) = self.speech.next_tts() => self.on_tts(id, ev),
                _ = sleep_opt(pace_at) => self.pump(),
                _ = sleep_opt(filler_at) => self.filler("slow"),
                _ = sleep_opt(talk_at) => self.on_conversation_timer(),
                (r, hang_up) = deadline => {
                    if hang_up {
                        self.send(MediaCommand::HangUp);
                    }
                    break r;
                }
            }
            if let Some(r) = self.after_event() {
                self.send(MediaCommand::HangUp);
                break r;
            }
        };
        self.finish(reason);
    }

    /// The earliest call-ending timer: media never attached, maximum duration, or no media.
    fn deadline(&self) -> impl Future<Output = (EndReason, bool)> + use<> {
        let (at, reason, hang_up) = match self.answered {
            None => (
                self.created + self.setup.attach_timeout,
                EndReason::MediaNeverConnected,
                false,
            ),
            Some(answered) => {
                let max = answered + Duration::from_secs(self.setup.agent.max_duration_s);
                let silent = self.last_media + self.setup.media_timeout;
                if max <= silent {
                    (max, EndReason::MaxDuration, true)
                } else {
                    (silent, EndReason::NoMedia, true)
                }
            }
        };
        async move {
            sleep_until(at).await;
            (reason, hang_up)
        }
    }

    fn filler_deadline(&self) -> Option<Instant> {
        let turn = self.turn.as_ref()?;
        if turn.filler_done || turn.audio_started || self.setup.agent.long_turn_message.is_empty() {
            return None;
        }
        if self.llm.is_none() && !self.speech.is_speaking() {
            return None;
        }
        let after = Duration::from_secs_f64(self.setup.agent.long_turn_message_after_s.max(0.0));
        Some(turn.ended_at + after)
    }

    fn send(&mut self, cmd: MediaCommand) {
        if let Some(tx) = &self.media_tx
            && tx.try_send(cmd).is_err()
        {
            self.frames_dropped += 1;
        }
    }

    fn on_msg(&mut self, msg: CallMsg) -> Option<EndReason> {
        match msg {
            CallMsg::Attach(m) => self.attach(m),
            CallMsg::HangUp { reason } => {
                self.event(EventKind::HangUp, reason.as_str());
                self.send(MediaCommand::HangUp);
                return Some(EndReason::HungUp(reason));
            }
            CallMsg::Say(text) => {
                self.enqueue(UttKind::Say, &text);
            }
            CallMsg::Snapshot(tx) => {
                let _ = tx.send(self.record(&EndReason::InProgress));
            }
        }
        None
    }

    fn attach(&mut self, m: MediaAttach) {
        if self.media_tx.is_some() {
            warn!("a second media stream for this call was refused");
            return;
        }
        let now = Instant::now();
        self.answered = Some(now);
        self.last_media = now;
        self.media_tx = Some(m.commands);
        self.media_rx = Some(m.events);
        self.event(EventKind::MediaStart, m.start.stream_id.clone());
        if let Some(store) = &self.setup.store {
            store.answered(&self.setup.call_id);
        }
        info!(stream_id = %m.start.stream_id, "media stream started");
        self.pump();
    }

    fn on_media(&mut self, ev: MediaEvent) -> Option<EndReason> {
        self.last_media = Instant::now();
        match ev {
            MediaEvent::Start(_) => {}
            MediaEvent::Audio(frame) => {
                for ev in self.vad.push_ulaw(&frame) {
                    self.on_vad(ev);
                }
                self.check_barge_in();
                if let Some(stt) = &self.stt
                    && stt.input.try_send(SttInput::Audio(frame)).is_err()
                {
                    self.stt_frames_dropped += 1;
                }
            }
            MediaEvent::Dtmf(d) => {
                self.event(EventKind::Dtmf, d.to_string());
                self.caller_turn(format!("The caller pressed {d}."), "dtmf");
            }
            MediaEvent::MarkPlayed(name) => self.on_mark(&name),
            MediaEvent::Stop => {
                self.event(EventKind::CarrierStop, "");
                return Some(EndReason::CallerHungUp);
            }
        }
        None
    }

    fn on_mark(&mut self, name: &str) {
        let Some(sent) = self.speech.on_mark(name) else {
            return;
        };
        self.last_activity = Instant::now();
        let end = self.answered_ms(Instant::now());
        if let Some(e) = self.transcript.get_mut(sent.entry) {
            if !e.heard_text.is_empty() {
                e.heard_text.push(' ');
            }
            e.heard_text.push_str(&sent.text);
            e.end_ms = end;
        }
        self.persist(sent.entry);
        self.event(EventKind::MarkPlayed, name);
    }

    fn on_stt(&mut self, ev: Option<SttEvent>) {
        let Some(ev) = ev else {
            self.stt = None;
            return;
        };
        match ev {
            SttEvent::Connected => self.event(EventKind::SttConnected, ""),
            SttEvent::SpeechStarted => {}
            SttEvent::Interim(text) => {
                self.endpointer.on_interim(&text, Instant::now());
                self.on_caller_words();
            }
            SttEvent::Final {
                text,
                speech_final,
                from_finalize,
            } => {
                self.endpointer
                    .on_final(&text, speech_final, from_finalize, Instant::now());
                self.on_caller_words();
            }
            SttEvent::UtteranceEnd => {
                self.endpointer.on_utterance_end();
                self.check_end_of_turn();
            }
            SttEvent::Error { message, fatal } => {
                warn!(%message, fatal, "speech-to-text error");
                self.event(EventKind::SttError, message);
                if fatal {
                    self.stt = None;
                    self.reopen_stt();
                }
            }
            SttEvent::Closed => {
                self.stt = None;
                if self.answered.is_some() {
                    self.reopen_stt();
                }
            }
        }
    }

    /// A speech-to-text session that dies mid-call is reopened once; after that the caller is
    /// told and the call ends when they hang up or the media times out.
    fn reopen_stt(&mut self) {
        if self.stt_reopened {
            return;
        }
        self.stt_reopened = true;
        self.event(EventKind::SttReopen, "");
        self.stt = Some(self.setup.providers.stt.open(&SttContext {
            call_id: self.setup.call_id.clone(),
        }));
    }

    /// Our detector heard the caller start or stop speaking.
    fn on_vad(&mut self, ev: VadEvent) {
        let now = Instant::now();
        self.last_activity = now;
        match ev {
            VadEvent::SpeechStart { onset_ms } => {
                let lag = self.vad.audio_ms().saturating_sub(onset_ms);
                let onset = now.checked_sub(Duration::from_millis(lag)).unwrap_or(now);
                self.endpointer.on_speech_start(onset);
                self.eot_at = None;
                self.event(EventKind::SpeechStart, format!("audio_ms={onset_ms}"));
            }
            VadEvent::SpeechEnd {
                onset_ms,
                last_voiced_ms,
            } => {
                let lag = self.vad.audio_ms().saturating_sub(last_voiced_ms);
                let end = now.checked_sub(Duration::from_millis(lag)).unwrap_or(now);
                self.endpointer.on_speech_end(end);
                self.event(
                    EventKind::SpeechEnd,
                    format!(
                        "audio_ms={last_voiced_ms} length_ms={}",
                        last_voiced_ms - onset_ms
                    ),
                );
                self.check_end_of_turn();
            }
        }
    }

    /// Stage one of barge-in: enough caller speech over agent audio stops the agent at once
    /// (carrier `clear`, pacer paused) while keeping everything unheard for a resume.
    fn check_barge_in(&mut self) {
        let agent = &self.setup.agent;
        if !agent.barge_in || self.barge.is_some() || self.goodbye_until.is_some() {
            return;
        }
        let run = self.vad.speech_run_ms();
        if run < agent.barge_in_min_speech_ms {
            return;
        }
        let now = Instant::now();
        if !self.speech.is_playing(now) {
            return;
        }
        if self.speech.current_kind() == Some(UttKind::Greeting) && !agent.greeting_interruptible {
            return;
        }
        let confirm = Duration::from_millis(agent.barge_in_confirm_ms);
        let paused = self.speech.pause();
        if paused.need_clear {
            self.send(MediaCommand::Clear);
        }
        for mark in paused.withdrawn {
            self.event(EventKind::MarkWithdrawn, mark);
        }
        self.barge = Some(BargeIn {
            at: now,
            deadline: now + confirm,
        });
        self.event(EventKind::BargeInStop, format!("speech_ms={run}"));
        // Words may already be in (the STT can be faster than our detector).
        self.on_caller_words();
    }

    /// The caller's words changed: confirm a pending barge-in, then look for the end of turn.
    fn on_caller_words(&mut self) {
        if self.endpointer.has_text() {
            self.last_activity = Instant::now();
        }
        if let Some(b) = &self.barge {
            let text = self.endpointer.text();
            let agent_now = self.speech.current_text();
            let words = self.words.content_words(&text);
            if self.words.is_echo(&text, &agent_now) {
                // The agent's own voice: not an interruption; the deadline resumes it.
            } else if words >= self.setup.agent.barge_in_min_words as usize {
                let ms = b.at.elapsed().as_millis();
                self.event(
                    EventKind::BargeInCommit,
                    format!("words={words} after_ms={ms}"),
                );
                self.interrupt();
            }
        }
        self.check_end_of_turn();
    }

    fn check_end_of_turn(&mut self) {
        match self.endpointer.decide(Instant::now()) {
            Decision::Wait(at) => self.eot_at = at,
            Decision::Finalize => {
                self.eot_at = None;
                if let Some(stt) = &self.stt {
                    let _ = stt.input.try_send(SttInput::Finalize);
                }
                self.event(EventKind::FinalizeSent, "");
                // The answer to Finalize (or the maximum) decides.
                if let Decision::Wait(at) = self.endpointer.decide(Instant::now()) {
                    self.eot_at = at;
                }
            }
            Decision::Commit {
                text,
                reason,
                silence_ms,
            } => {
                self.eot_at = None;
                self.event(
                    EventKind::TurnEnd,
                    format!("{reason} silence_ms={silence_ms}"),
                );
                self.caller_turn(text, reason);
            }
        }
    }

    /// The earliest conversation timer: end of turn, barge-in decision, idle nudge, goodbye.
    fn conversation_deadline(&self) -> Option<Instant> {
        [
            self.eot_at,
            self.barge.as_ref().map(|b| b.deadline),
            self.idle_deadline(),
            self.goodbye_until,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn on_conversation_timer(&mut self) {
        let now = Instant::now();
        if self.eot_at.is_some_and(|t| t <= now) {
            self.eot_at = None;
            self.check_end_of_turn();
        }
        if self.barge.as_ref().is_some_and(|b| b.deadline <= now) {
            self.resume("no_words");
        }
        if self.idle_deadline().is_some_and(|t| t <= now) {
            self.idle();
        }
    }

    /// Stage two of barge-in, false alarm: play on from the last sentence the caller heard.
    fn resume(&mut self, why: &str) {
        if let Some(b) = self.barge.take() {
            self.speech.resume();
            let ms = b.at.elapsed().as_millis();
            self.event(EventKind::BargeInResume, format!("{why} after_ms={ms}"));
            self.pump();
        }
    }

    /// Checks made after every event: a held turn whose time has come, the end of the
    /// goodbye. Returns a reason to end the call.
    fn after_event(&mut self) -> Option<EndReason> {
        if self.held_turn.is_some()
            && self.llm.is_none()
            && !self.speech.is_speaking()
            && let Some((text, reason)) = self.held_turn.take()
        {
            self.caller_turn(text, reason);
        }
        let until = self.goodbye_until?;
        if !self.speech.is_speaking() || Instant::now() >= until {
            self.event(EventKind::IdleHangUp, "");
            return Some(EndReason::CallerSilent);
        }
        None
    }

    fn idle_deadline(&self) -> Option<Instant> {
        let after = self.setup.agent.idle_nudge_after_s;
        if after <= 0.0
            || self.answered.is_none()
            || self.goodbye_until.is_some()
            || self.speech.is_speaking()
            || self.llm.is_some()
            || self.barge.is_some()
            || self.held_turn.is_some()
            || self.vad.is_speaking()
            || self.endpointer.has_text()
        {
            return None;
        }
        Some(self.last_activity + Duration::from_secs_f64(after))
    }

    /// The caller has been silent too long: nudge, or say goodbye.
    fn idle(&mut self) {
        self.last_activity = Instant::now();
        let agent = self.setup.agent.clone();
        if self.nudges < agent.idle_max_nudges {
            self.nudges += 1;
            self.event(EventKind::IdleNudge, self.nudges.to_string());
            self.enqueue(UttKind::Idle, &agent.idle_nudge_message);
            self.history.push(ChatMessage {
                role: Role::Assistant,
                content: agent.idle_nudge_message.clone(),
            });
        } else {
            self.event(EventKind::IdleGoodbye, "");
            self.goodbye_until = Some(Instant::now() + GOODBYE_GRACE);
            self.enqueue(UttKind::Idle, &agent.idle_goodbye_message);
        }
    }

    /// How a caller turn relates to what the agent is doing.
    fn overlap(&self) -> Overlap {
        let agent = &self.setup.agent;
        let replying = self.llm.is_some()
            || self
                .speech
                .any_audio_for(|k| !matches!(k, UttKind::Greeting))
            || self
                .speech
                .queued()
                .any(|u| !matches!(u.kind, UttKind::Greeting));
        let greeting = self.speech.is_speaking() && !replying;
        if !replying && !greeting {
            return Overlap::Free;
        }
        if !agent.barge_in {
            return if replying {
                Overlap::Hold
            } else {
                Overlap::Queue
            };
        }
        if greeting && !agent.greeting_interruptible {
            return Overlap::Queue;
        }
        Overlap::Cut
    }

    /// The caller finished a turn (`reason` says how we knew). Backchannels and echo over a
    /// busy agent are dropped; otherwise the agent is cut (if allowed) and the brain asked.
    fn caller_turn(&mut self, text: String, reason: &'static str) {
        let now = Instant::now();
        let dtmf = reason == "dtmf";
        let overlap = self.overlap();
        let busy = !matches!(overlap, Overlap::Free) || self.barge.is_some();
        if busy && !dtmf {
            let agent_now = self.speech.current_text();
            let ignored = if self.words.is_echo(&text, &agent_now) {
                Some(EventKind::EchoIgnored)
            } else if self.words.content_words(&text) < self.setup.agent.barge_in_min_words as usize
            {
                Some(EventKind::BackchannelIgnored)
            } else {
                None
            };
            if let Some(kind) = ignored {
                self.event(kind, text);
                self.resume(kind.as_str());
                return;
            }
        }
        match overlap {
            Overlap::Hold if !dtmf => {
                self.event(EventKind::TurnHeld, "");
                self.held_turn = Some((text, reason));
                return;
            }
            Overlap::Cut | Overlap::Hold => {
                if self.barge.is_some() {
                    self.event(EventKind::BargeInCommit, "turn_end");
                }
                self.interrupt();
            }
            Overlap::Queue | Overlap::Free => {
                if self.barge.is_some() {
                    self.interrupt();
                }
            }
        }
        self.settle_turn();
        self.nudges = 0;
        self.last_activity = now;
        let start = self.endpointer.started().unwrap_or(now);
        self.transcript.push(TranscriptEntry {
            speaker: Speaker::Caller,
            text: text.clone(),
            heard_text: text.clone(),
            interrupted: false,
            start_ms: self.answered_ms(start.min(now)),
            end_ms: self.answered_ms(now),
        });
        self.persist(self.transcript.len() - 1);
        self.turns += 1;
        let content = match self.brain_note.take() {
            Some(note) => format!("{note} {text}"),
            None => text,
        };
        self.history.push(ChatMessage {
            role: Role::User,
            content,
        });
        let mut history = Vec::with_capacity(self.history.len());
        history.extend(self.history.iter().cloned());
        self.llm = Some(self.setup.providers.llm.stream(ChatTurn {
            call_id: self.setup.call_id.clone(),
            caller: Some(self.setup.remote_party().to_string()),
            system_prompt: self.setup.agent.system_prompt.clone(),
            history,
        }));
        self.chunker = SentenceChunker::new();
        self.turn = Some(Turn {
            id: self.turns,
            ended_at: now,
            audio_started: false,
            filler_done: false,
            entry: None,
            reply_text: String::new(),
        });
        self.event(EventKind::LlmRequest, self.turns.to_string());
    }

    /// The previous reply was not interrupted: it goes into history whole.
    fn settle_turn(&mut self) {
        if let Some(turn) = self.turn.take()
            && !turn.reply_text.trim().is_empty()
        {
            self.history.push(ChatMessage {
                role: Role::Assistant,
                content: turn.reply_text,
            });
        }
    }

    /// Stops the agent for good: clear the carrier's queue, cancel the brain and the
    /// synthesis, and keep in history only what the caller heard.
    fn interrupt(&mut self) {
        self.llm = None;
        self.barge = None;
        let cleared = self.speech.clear();
        let need_clear = cleared.need_clear;
        if need_clear {
            self.send(MediaCommand::Clear);
        }
        for sent in cleared.unheard {
            self.event(EventKind::MarkCleared, sent.mark);
        }
        if let Some(turn) = self.turn.take() {
            let heard = match turn.entry.and_then(|i| self.transcript.get_mut(i)) {
                Some(e) => {
                    e.interrupted = true;
                    Some(e.heard_text.clone())
                }
                None => None,
            };
            if let Some(i) = turn.entry {
                self.persist(i);
            }
            if let Some(heard) = heard {
                self.event(EventKind::Heard, heard.clone());
                if self.setup.providers.llm.keeps_history() {
                    // The brain remembers its whole reply: tell it what actually got through.
                    self.brain_note = Some(if heard.is_empty() {
                        "[The caller interrupted you before hearing any of your last reply.]"
                            .to_string()
                    } else {
                        format!(
                            "[The caller interrupted you; of your last reply they heard only: \"{heard}\"]"
                        )
                    });
                }
                if !heard.is_empty() {
                    self.history.push(ChatMessage {
                        role: Role::Assistant,
                        content: format!("{heard} [interrupted by the caller]"),
                    });
                }
            }
        }
        self.event(
            EventKind::Interrupted,
            if need_clear { "clear" } else { "" },
        );
    }

    fn on_llm(&mut self, ev: Option<LlmEvent>) {
        let ev = ev.unwrap_or_else(|| LlmEvent::Error("the reply stream ended early".into()));
        match ev {
            LlmEvent::Delta(text) => {
                if let Some(t) = self.turn.as_mut() {
                    t.reply_text.push_str(&text);
                }
                for sentence in self.chunker.push(&text) {
                    self.reply_sentence(&sentence);
                }
            }
            LlmEvent::ToolProgress(label) => {
                self.event(EventKind::ToolProgress, label);
                self.filler("tool");
            }
            LlmEvent::Done => {
                self.llm = None;
                if let Some(rest) = self.chunker.finish() {
                    self.reply_sentence(&rest);
                }
                // The reply joins history when the next caller turn settles it (whole), or
                // when it is interrupted (what was heard).
                self.event(EventKind::LlmDone, "");
            }
            LlmEvent::Error(message) => {
                self.llm = None;
                warn!(%message, "the brain failed this turn");
                self.event(EventKind::LlmError, message);
                let Some(turn) = self.turn.as_ref() else {
                    return;
                };
                let turn_id = turn.id;
                let any_reply = turn.entry.is_some();
                if !any_reply && !turn.audio_started {
                    self.speech
                        .drop_unstarted(|k| matches!(k, UttKind::Filler { .. }));
                    let msg = self.setup.agent.llm_error_message.clone();
                    if !msg.trim().is_empty() {
                        self.enqueue(UttKind::Error { turn: turn_id }, &msg);
                        self.history.push(ChatMessage {
                            role: Role::Assistant,
                            content: msg,
                        });
                    }
                } else if let Some(rest) = self.chunker.finish() {
                    self.reply_sentence(&rest);
                }
            }
        }
    }

    fn reply_sentence(&mut self, sentence: &str) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let turn_id = turn.id;
        let text = speakable(sentence);
        if text.is_empty() {
            return;
        }
        let entry = match turn.entry {
            Some(i) => {
                if let Some(e) = self.transcript.get_mut(i) {
                    e.text.push(' ');
                    e.text.push_str(&text);
                }
                i
            }
            None => {
                let now = self.answered_ms(Instant::now());
                self.transcript.push(TranscriptEntry {
                    speaker: Speaker::Agent,
                    text: text.clone(),
                    heard_text: String::new(),
                    interrupted: false,
                    start_ms: now,
                    end_ms: now,
                });
                let i = self.transcript.len() - 1;
                if let Some(t) = self.turn.as_mut() {
                    t.entry = Some(i);
                }
                i
            }
        };
        self.speech
            .push(UttKind::Reply { turn: turn_id }, text, entry, None);
        self.start_tts();
        self.pump();
    }

    /// Speaks `text` as its own transcript entry.
    fn enqueue(&mut self, kind: UttKind, text: &str) {
        let text = speakable(text);
        if text.is_empty() {
            return;
        }
        let now = self.answered_ms(Instant::now());
        self.transcript.push(TranscriptEntry {
            speaker: Speaker::Agent,
            text: text.clone(),
            heard_text: String::new(),
            interrupted: false,
            start_ms: now,
            end_ms: now,
        });
        let entry = self.transcript.len() - 1;
        if matches!(kind, UttKind::Filler { .. }) {
            self.speech.push_front_unstarted(kind, text, entry, None);
        } else {
            self.speech.push(kind, text, entry, None);
        }
        self.start_tts();
        self.pump();
    }

    fn start_tts(&mut self) {
        for (id, text) in self.speech.wants_tts() {
            let stream = self.setup.providers.tts.synthesize(&text);
            self.speech.set_tts(id, stream);
        }
    }

    /// Speaks the long-turn filler once per turn, if no reply audio has gone out yet.
    fn filler(&mut self, why: &str) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.filler_done || turn.audio_started {
            return;
        }
        turn.filler_done = true;
        let turn_id = turn.id;
        let msg = self.setup.agent.long_turn_message.clone();
        if msg.trim().is_empty() {
            return;
        }
        self.event(EventKind::Filler, why);
        self.enqueue(UttKind::Filler { turn: turn_id }, &msg);
    }

    fn on_tts(&mut self, id: u64, ev: Option<crate::provider::TtsEvent>) {
        if let Some((kind, err)) = self.speech.on_tts(id, ev) {
            warn!(error = %err, ?kind, "speech synthesis failed");
            self.event(EventKind::TtsError, err);
        }
        self.start_tts();
        self.pump();
    }

    fn pump(&mut self) {
        if self.media_tx.is_none() {
            return;
        }
        let now = Instant::now();
        let out = self.speech.pump(now);
        for (_, kind) in &out.started {
            match kind {
                UttKind::Greeting if !self.greeting_sent => {
                    self.greeting_sent = true;
                    let ms = self.answered.map(|a| now.saturating_duration_since(a));
                    let us = ms.map(|d| d.as_micros()).unwrap_or(0);
                    self.event(EventKind::GreetingFirstFrame, us.to_string());
                }
                UttKind::Reply { turn } | UttKind::Filler { turn } | UttKind::Error { turn } => {
                    let turn_id = *turn;
                    let is_reply = matches!(kind, UttKind::Reply { .. });
                    if let Some(t) = self.turn.as_mut().filter(|t| t.id == turn_id)
                        && !t.audio_started
                    {
                        t.audio_started = true;
                        let us = now.saturating_duration_since(t.ended_at).as_micros();
                        let kind = if is_reply {
                            EventKind::ReplyFirstFrame
                        } else {
                            EventKind::FirstFrameOfTurn
                        };
                        self.event(kind, us.to_string());
                        if let Some(store) = &self.setup.store {
                            store.reply_latency(&self.setup.call_id, us as u64);
                        }
                    }
                }
                _ => {}
            }
        }
        for cmd in out.commands {
            self.send(cmd);
        }
    }

    fn finish(mut self, reason: EndReason) {
        self.llm = None;
        let _ = self.speech.clear();
        if let Some(stt) = self.stt.take() {
            // Let the session close gracefully, but never for long.
            let _ = stt.input.try_send(SttInput::Close);
            tokio::spawn(async move {
                let SttStream {
                    input,
                    mut events,
                    guard,
                } = stt;
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while events.recv().await.is_some() {}
                })
                .await;
                drop((input, guard));
            });
        }
        self.media_tx = None;
        self.media_rx = None;
        if self.answered.is_some() {
            (0..self.transcript.len()).for_each(|i| self.persist(i));
        }
        self.event(EventKind::CallEnd, reason.to_string());
        if let Some(store) = &self.setup.store {
            store.ended(&self.setup.call_id, &reason);
        }
        let duration = self
            .answered
            .map(|a| a.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        info!(
            from = %mask_number(&self.setup.from),
            to = %mask_number(&self.setup.to),
            reason = %reason,
            duration_s = format!("{duration:.1}"),
            turns = self.turns,
            transcript_entries = self.transcript.len(),
            frames_dropped = self.frames_dropped,
            stt_frames_dropped = self.stt_frames_dropped,
            "call ended"
        );
        let record = self.record(&reason);
        self.registry.finish(record);
    }
}
