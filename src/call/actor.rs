//! The call actor: one tokio task per call that owns every piece of the call's state and runs
//! one `select!` loop over carrier media events, speech-to-text events, the LLM stream, TTS
//! audio, the pacer, timers and messages from its [`CallHandle`]. It never blocks and never
//! waits on one stream while another starves: every wait is a branch of the select, and every
//! send to a peer is a `try_send` on a bounded channel.
//!
//! Conversation basics live here: the greeting (synthesised while the phone rings, played at
//! `start`), a caller turn ending on the STT's end of utterance, one brain turn in flight, the
//! reply chunked into sentences and spoken as it streams, a filler when the brain is slow, a
//! spoken apology when it fails, DTMF as text, and clean endings.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, debug, info, info_span, warn};

use super::registry::InsertError;
use super::speech::{Speech, UttKind};
use super::transcript::{CallEvent, CallRecord, Speaker, TranscriptEntry};
use super::{CallHandle, CallMsg, CallRegistry, CallSetup, MediaAttach};
use crate::carrier::{MediaCommand, MediaEvent};
use crate::provider::chunker::{SentenceChunker, speakable};
use crate::provider::{
    ChatMessage, ChatTurn, LlmEvent, LlmStream, Role, SttContext, SttEvent, SttInput, SttStream,
};
use crate::security::mask_number;

/// Capacity of a call's handle channel.
const HANDLE_QUEUE: usize = 32;

/// Registers a new call and spawns its actor. The actor pre-opens the speech-to-text session
/// and starts synthesising the greeting at once, while the phone rings.
pub fn start(
    setup: CallSetup,
    registry: Arc<CallRegistry>,
    max_calls: usize,
) -> Result<CallHandle, InsertError> {
    let (tx, rx) = mpsc::channel(HANDLE_QUEUE);
    let handle = CallHandle::new(&setup.call_id, &setup.carrier_account, tx);
    registry.insert(handle.clone(), max_calls)?;
    let span = info_span!("call", call_id = %setup.call_id, carrier = setup.carrier.as_str());
    let actor = Actor::new(setup, rx, registry);
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

struct Actor {
    setup: CallSetup,
    rx: mpsc::Receiver<CallMsg>,
    registry: Arc<CallRegistry>,
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
    caller_text: String,
    caller_started: Option<Instant>,
    history: Vec<ChatMessage>,
    transcript: Vec<TranscriptEntry>,
    events: Vec<CallEvent>,
    greeting_sent: bool,
    frames_dropped: u64,
    stt_frames_dropped: u64,
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
    fn new(setup: CallSetup, rx: mpsc::Receiver<CallMsg>, registry: Arc<CallRegistry>) -> Self {
        let now = Instant::now();
        Self {
            setup,
            rx,
            registry,
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
            caller_text: String::new(),
            caller_started: None,
            history: Vec::new(),
            transcript: Vec::new(),
            events: Vec::new(),
            greeting_sent: false,
            frames_dropped: 0,
            stt_frames_dropped: 0,
        }
    }

    fn ms_since(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.created).as_millis() as u64
    }

    fn event(&mut self, kind: &str, detail: impl Into<String>) {
        let detail = detail.into();
        debug!(event = kind, %detail, "call event");
        self.events.push(CallEvent {
            t_ms: self.ms_since(Instant::now()),
            kind: kind.to_string(),
            detail,
        });
        if let (Some(store), Some(e)) = (&self.setup.store, self.events.last()) {
            store.event(&self.setup.call_id, e);
        }
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

    fn record(&self, reason: &str) -> CallRecord {
        CallRecord {
            call_id: self.setup.call_id.clone(),
            carrier: self.setup.carrier.as_str().to_string(),
            agent: self.setup.agent_name.clone(),
            from_masked: mask_number(&self.setup.from),
            to_masked: mask_number(&self.setup.to),
            ended_reason: reason.to_string(),
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
            let deadline = self.deadline();
            tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(msg) => if let Some(r) = self.on_msg(msg) { break r },
                    None => break "handles dropped".to_string(),
                },
                ev = recv_opt(self.media_rx.as_mut()) => match ev {
                    Some(ev) => if let Some(r) = self.on_media(ev) { break r },
                    None => break "media stream closed".to_string(),
                },
                ev = recv_opt(self.stt.as_mut().map(|s| &mut s.events)) => self.on_stt(ev),
                ev = recv_opt(self.llm.as_mut().map(|l| &mut l.events)) => self.on_llm(ev),
                (id, ev) = self.speech.next_tts() => self.on_tts(id, ev),
                _ = sleep_opt(pace_at) => self.pump(),
                _ = sleep_opt(filler_at) => self.filler("slow"),
                (r, hang_up) = deadline => {
                    if hang_up {
                        self.send(MediaCommand::HangUp);
                    }
                    break r.to_string();
                }
            }
        };
        self.finish(&reason);
    }

    /// The earliest call-ending timer: media never attached, maximum duration, or no media.
    fn deadline(&self) -> impl Future<Output = (&'static str, bool)> + use<> {
        let (at, reason, hang_up) = match self.answered {
            None => (
                self.created + self.setup.attach_timeout,
                "media stream never connected",
                false,
            ),
            Some(answered) => {
                let max = answered + Duration::from_secs(self.setup.agent.max_duration_s);
                let silent = self.last_media + self.setup.media_timeout;
                if max <= silent {
                    (max, "maximum call duration reached", true)
                } else {
                    (silent, "no media from the carrier", true)
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

    fn on_msg(&mut self, msg: CallMsg) -> Option<String> {
        match msg {
            CallMsg::Attach(m) => self.attach(m),
            CallMsg::HangUp { reason } => {
                self.event("hang_up", reason.clone());
                self.send(MediaCommand::HangUp);
                return Some(format!("hung up: {reason}"));
            }
            CallMsg::Say(text) => {
                self.enqueue(UttKind::Say, &text);
            }
            CallMsg::Snapshot(tx) => {
                let _ = tx.send(self.record("in progress"));
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
        self.event("media_start", m.start.stream_id.clone());
        info!(stream_id = %m.start.stream_id, "media stream started");
        self.pump();
    }

    fn on_media(&mut self, ev: MediaEvent) -> Option<String> {
        self.last_media = Instant::now();
        match ev {
            MediaEvent::Start(_) => {}
            MediaEvent::Audio(frame) => {
                if let Some(stt) = &self.stt
                    && stt.input.try_send(SttInput::Audio(frame)).is_err()
                {
                    self.stt_frames_dropped += 1;
                }
            }
            MediaEvent::Dtmf(d) => {
                self.event("dtmf", d.to_string());
                self.caller_turn(format!("The caller pressed {d}."), true);
            }
            MediaEvent::MarkPlayed(name) => self.on_mark(&name),
            MediaEvent::Stop => {
                self.event("carrier_stop", "");
                return Some("caller hung up".into());
            }
        }
        None
    }

    fn on_mark(&mut self, name: &str) {
        let Some(sent) = self.speech.on_mark(name) else {
            return;
        };
        let end = self.answered_ms(Instant::now());
        if let Some(e) = self.transcript.get_mut(sent.entry) {
            if !e.heard_text.is_empty() {
                e.heard_text.push(' ');
            }
            e.heard_text.push_str(&sent.text);
            e.end_ms = end;
        }
        self.persist(sent.entry);
        self.event("mark_played", name);
    }

    fn on_stt(&mut self, ev: Option<SttEvent>) {
        let Some(ev) = ev else {
            self.stt = None;
            return;
        };
        match ev {
            SttEvent::Connected => self.event("stt_connected", ""),
            SttEvent::SpeechStarted => {
                self.caller_started.get_or_insert_with(Instant::now);
            }
            SttEvent::Interim(text) => {
                if !text.trim().is_empty() {
                    self.caller_started.get_or_insert_with(Instant::now);
                }
            }
            SttEvent::Final {
                text, speech_final, ..
            } => {
                let text = text.trim();
                if !text.is_empty() {
                    self.caller_started.get_or_insert_with(Instant::now);
                    if !self.caller_text.is_empty() {
                        self.caller_text.push(' ');
                    }
                    self.caller_text.push_str(text);
                }
                if speech_final && !self.caller_text.is_empty() {
                    let t = std::mem::take(&mut self.caller_text);
                    self.event("turn_end", "speech_final");
                    self.caller_turn(t, false);
                }
            }
            SttEvent::UtteranceEnd => {
                if !self.caller_text.is_empty() {
                    let t = std::mem::take(&mut self.caller_text);
                    self.event("turn_end", "utterance_end");
                    self.caller_turn(t, false);
                }
            }
            SttEvent::Error { message, fatal } => {
                warn!(%message, fatal, "speech-to-text error");
                self.event("stt_error", message);
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
        self.event("stt_reopen", "");
        self.stt = Some(self.setup.providers.stt.open(&SttContext {
            call_id: self.setup.call_id.clone(),
        }));
    }

    /// The caller finished a turn: interrupt whatever the agent was doing and ask the brain.
    fn caller_turn(&mut self, text: String, dtmf: bool) {
        let now = Instant::now();
        let start = self.caller_started.take().unwrap_or(now);
        self.transcript.push(TranscriptEntry {
            speaker: Speaker::Caller,
            text: text.clone(),
            heard_text: text.clone(),
            interrupted: false,
            start_ms: self.answered_ms(start),
            end_ms: self.answered_ms(now),
        });
        self.persist(self.transcript.len() - 1);
        if self.llm.is_some()
            || self
                .speech
                .any_audio_for(|k| !matches!(k, UttKind::Greeting))
            || self.speech.queued().next().is_some()
        {
            self.interrupt();
        }
        let _ = dtmf;
        self.turns += 1;
        self.history.push(ChatMessage {
            role: Role::User,
            content: text,
        });
        let mut history = Vec::with_capacity(self.history.len());
        history.extend(self.history.iter().cloned());
        self.llm = Some(self.setup.providers.llm.stream(ChatTurn {
            call_id: self.setup.call_id.clone(),
            caller: Some(self.setup.from.clone()),
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
        self.event("llm_request", self.turns.to_string());
    }

    /// Stops the agent: clear the carrier's queue, cancel the brain and the synthesis.
    fn interrupt(&mut self) {
        self.llm = None;
        let cleared = self.speech.clear();
        let need_clear = cleared.need_clear;
        if need_clear {
            self.send(MediaCommand::Clear);
        }
        for sent in cleared.unheard {
            self.event("mark_cleared", sent.mark);
        }
        if let Some(turn) = self.turn.take() {
            if let Some(e) = turn.entry.and_then(|i| self.transcript.get_mut(i)) {
                e.interrupted = true;
            }
            if let Some(i) = turn.entry {
                self.persist(i);
            }
            if !turn.reply_text.is_empty() {
                self.history.push(ChatMessage {
                    role: Role::Assistant,
                    content: turn.reply_text,
                });
            }
        }
        self.event("interrupted", if need_clear { "clear" } else { "" });
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
                self.event("tool_progress", label);
                self.filler("tool");
            }
            LlmEvent::Done => {
                self.llm = None;
                if let Some(rest) = self.chunker.finish() {
                    self.reply_sentence(&rest);
                }
                let text = self
                    .turn
                    .as_mut()
                    .map(|t| std::mem::take(&mut t.reply_text))
                    .unwrap_or_default();
                self.event("llm_done", "");
                if !text.trim().is_empty() {
                    self.history.push(ChatMessage {
                        role: Role::Assistant,
                        content: text,
                    });
                }
            }
            LlmEvent::Error(message) => {
                self.llm = None;
                warn!(%message, "the brain failed this turn");
                self.event("llm_error", message);
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
        self.event("filler", why);
        self.enqueue(UttKind::Filler { turn: turn_id }, &msg);
    }

    fn on_tts(&mut self, id: u64, ev: Option<crate::provider::TtsEvent>) {
        if let Some((kind, err)) = self.speech.on_tts(id, ev) {
            warn!(error = %err, ?kind, "speech synthesis failed");
            self.event("tts_error", err);
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
                    self.event("greeting_first_frame", us.to_string());
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
                            "reply_first_frame"
                        } else {
                            "first_frame_of_turn"
                        };
                        self.event(kind, us.to_string());
                    }
                }
                _ => {}
            }
        }
        for cmd in out.commands {
            self.send(cmd);
        }
    }

    fn finish(mut self, reason: &str) {
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
        self.event("call_end", reason);
        let duration = self
            .answered
            .map(|a| a.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        info!(
            from = %mask_number(&self.setup.from),
            to = %mask_number(&self.setup.to),
            reason,
            duration_s = format!("{duration:.1}"),
            turns = self.turns,
            transcript_entries = self.transcript.len(),
            frames_dropped = self.frames_dropped,
            stt_frames_dropped = self.stt_frames_dropped,
            "call ended"
        );
        let record = self.record(reason);
        self.registry.finish(record);
    }
}
