//! The call actor, the I/O shell around the conversation [`Policy`]: one tokio task per call
//! owning its channels and provider streams, one `select!` loop over handle messages, carrier
//! media, speech-to-text, the brain's stream, TTS audio, the pacer and timers. What arrives
//! becomes policy [`Input`]s; the [`Action`]s returned are carried out here. It also owns what
//! the policy does not judge: the [`Vad`] on caller audio, the STT session (and its one
//! reopen), the pacer, call timeouts and the final record. It never blocks: every wait is a
//! branch of the select, every send to a peer a `try_send` on a bounded channel. Caller audio
//! does not pass through it: the media pump runs the call's [`CallerIngress`] (detector,
//! recording, Smart Turn ring, STT writes) and the actor hears [`CallerNote`]s, what
//! turn-taking needs; it builds that stage when media attaches and swaps the STT sender in
//! the shared [`SttFeed`] when it opens or reopens the session.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, debug, info, info_span, warn};

use super::ActionOutcome;
use super::echo::EchoReference;
use super::eot::{CallerRing, TurnModelAnswer, TurnModelWorker, Unavailable, Verdict};
use super::event::{EndReason, EventKind};
use super::ingress::{
    BargeWatch, CallerIngress, CallerNote, Inbound, STT_ENDPOINT_MARGIN_MS, STT_UNBATCHED_TAIL_MS,
    SttFeed,
};
use super::log::{Dropped, Usage};
use super::policy::{Action, Input, Policy};
use super::recording::Recorder;
use super::registry::InsertError;
use super::speech::{Pumped, Speech, TtsNote};
use super::transcript::{CallEvent, CallRecord};
use super::{CallHandle, CallMsg, CallRegistry, CallSetup, MediaAttach};
use crate::audio::vad::{Vad, VadConfig, VadEngine};
use crate::carrier::{ActionResult, MediaCommand, MediaEvent, TransferRequest};
use crate::config::VadEngineName;
use crate::provider::{
    ChatTurn, LlmEvent, LlmStream, SttContext, SttEvent, SttInput, SttStream, TokenUsage, TtsEvent,
};
use crate::security::mask_number;

mod stt;

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
    let (changes, changes_rx) = watch::channel(0);
    let handle = CallHandle::new(&setup.call_id, &setup.carrier_account, tx, changes_rx);
    registry.insert(handle.clone(), max_calls)?;
    let span = info_span!("call", call_id = %setup.call_id, carrier = setup.carrier.as_str());
    let actor = Actor::new(setup, rx, registry, changes);
    tokio::spawn(actor.run().instrument(span));
    Ok(handle)
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
    media_rx: Option<mpsc::Receiver<Inbound>>,
    stt: Option<SttStream>,
    stt_reopened: bool,
    /// The call's one writer to its STT session (shared with the caller-audio stage).
    stt_feed: SttFeed,
    /// How long after the last voiced frame audio still goes to the STT unbatched.
    stt_tail_ms: u64,
    /// The caller-audio stage when no media pump took it (`patterd try` sends raw frames).
    ingress: Option<CallerIngress>,
    /// Times the select loop woke (logged at the end: issue 16's wake-up count).
    wakes: u64,
    /// Tells the caller-audio stage whether barge-in could act on speech now.
    barge: BargeWatch,
    /// The levels of the agent audio sent, for the caller-audio stage's echo check
    /// (`barge_in_echo_check`).
    echo: Option<EchoReference>,
    llm: Option<LlmStream>,
    /// The agent's mouth: lent to the policy on every step, pumped here.
    speech: Speech,
    /// What the last pump sent (its vectors reused from pump to pump).
    pumped: Pumped,
    policy: Policy,
    /// The detector until media attaches (it then moves into the caller-audio stage).
    vad: Option<Vad>,
    events: Vec<CallEvent>,
    frames_dropped: u64,
    stt_frames_dropped: u64,
    /// Who asked for each agent action in progress (by the policy's action id).
    replies: HashMap<u64, oneshot::Sender<ActionOutcome>>,
    next_act: u64,
    /// Policy inputs produced while carrying out actions, fed in before the next event.
    deferred: Vec<Input>,
    /// Stage timing and usage (issue 14): when the open brain stream was requested (until its
    /// first token), synthesis requests waiting for their first audio, and what was used.
    llm_requested: Option<Instant>,
    tts_requested: Vec<(u64, Instant)>,
    usage: Usage,
    /// The open brain turn's latest `usage` report (replaced, not added, until the turn ends).
    turn_tokens: TokenUsage,
    /// The call's recording, from the media stream's start (`record = true` agents only).
    recorder: Option<Recorder>,
    /// The end-of-turn model's link (agents with `turn_model` only).
    turn_model: Option<TurnModelLink>,
}

/// A call's side of the shared end-of-turn model worker: the caller's last 8 s and the
/// channel its answers come back on.
struct TurnModelLink {
    worker: TurnModelWorker,
    ring: Arc<std::sync::Mutex<CallerRing>>,
    reply: mpsc::Sender<TurnModelAnswer>,
    answers: mpsc::Receiver<TurnModelAnswer>,
}

impl TurnModelLink {
    fn new(worker: TurnModelWorker) -> Self {
        let (reply, answers) = mpsc::channel(4);
        Self {
            worker,
            ring: Arc::new(std::sync::Mutex::new(CallerRing::new())),
            reply,
            answers,
        }
    }

    /// Queues a judgement of the caller's last 8 s; `Err` is the answer when it cannot be.
    fn ask(&self, pause: u64) -> Result<(), TurnModelAnswer> {
        let snapshot = self
            .ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot();
        self.worker.submit(pause, snapshot, &self.reply)
    }
}

/// Microseconds from `at` to now.
fn micros_since(at: Instant) -> u64 {
    at.elapsed().as_micros() as u64
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
        let echo = setup
            .agent
            .barge_in_echo_check
            .then(|| EchoReference::new(now));
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
            stt_feed: SttFeed::new(setup.log.clone(), &setup.call_id),
            ingress: None,
            wakes: 0,
            barge: BargeWatch::default(),
            stt_tail_ms: setup.providers.stt.endpointing_ms().saturating_add(
                if setup.providers.stt.ends_turns() {
                    STT_UNBATCHED_TAIL_MS
                } else {
                    STT_ENDPOINT_MARGIN_MS
                },
            ),
            llm: None,
            speech: match &echo {
                Some(e) => Speech::new().with_echo_reference(e.clone()),
                None => Speech::new(),
            },
            echo,
            pumped: Pumped::default(),
            policy: Policy::new(
                setup.agent.clone(),
                setup.providers.stt.endpointing_ms(),
                setup.providers.llm.keeps_history(),
                now,
            )
            .with_stt_turns(setup.providers.stt.ends_turns())
            .with_turn_model(setup.turn_model.as_ref().map(|w| w.timing())),
            vad: Some(Vad::new(VadConfig {
                engine: match setup.agent.vad_engine {
                    VadEngineName::Earshot => VadEngine::Earshot,
                    VadEngineName::Silero => VadEngine::Silero,
                },
                threshold: setup.agent.vad_threshold as f32,
                stop_ms: setup.agent.vad_stop_ms,
                ..VadConfig::default()
            })),
            events: Vec::new(),
            frames_dropped: 0,
            stt_frames_dropped: 0,
            replies: HashMap::new(),
            next_act: 0,
            deferred: Vec::new(),
            llm_requested: None,
            tts_requested: Vec::new(),
            usage: Usage::default(),
            turn_tokens: TokenUsage::default(),
            recorder: None,
            turn_model: setup.turn_model.clone().map(TurnModelLink::new),
            setup,
        }
    }

    fn event(&mut self, kind: EventKind, detail: impl Into<String>) {
        let detail = detail.into();
        debug!(event = kind.as_str(), %detail, "call event");
        let t_ms = Instant::now()
            .saturating_duration_since(self.created)
            .as_millis() as u64;
        self.events.push(CallEvent { t_ms, kind, detail });
        if let (Some(store), Some(e)) = (&self.setup.log, self.events.last()) {
            store.event(&self.setup.call_id, e);
        }
        let n = self.events.len() as u64;
        self.changes.send_replace(n);
    }

    /// Persists transcript entry `i` (a turn is durable once it ends). Never waits.
    fn persist(&self, i: usize) {
        if let (Some(store), Some(e)) = (&self.setup.log, self.policy.transcript().get(i)) {
            store.turn(&self.setup.call_id, i, e);
        }
    }

    fn record(&self, reason: &EndReason) -> CallRecord {
        CallRecord {
            call_id: self.setup.call_id.clone(),
            carrier: self.setup.carrier.as_str().to_string(),
            agent: self.setup.agent_name.clone(),
            from_masked: mask_number(&self.setup.from),
            to_masked: mask_number(&self.setup.to),
            ended_reason: reason.clone(),
            transcript: self.policy.transcript().to_vec(),
            events: self.events.clone(),
        }
    }

    /// Feeds the policy one input and carries out what it decides. Returns a reason to end
    /// the call when the policy hung up.
    fn step(&mut self, input: Input) -> Option<EndReason> {
        let mut end = self.step_one(input);
        // Inputs that carrying out the actions produced (a carrier action that failed at once).
        while end.is_none() && !self.deferred.is_empty() {
            let input = self.deferred.remove(0);
            end = self.step_one(input);
        }
        end
    }

    fn step_one(&mut self, input: Input) -> Option<EndReason> {
        let actions = self.policy.handle(input, Instant::now(), &mut self.speech);
        let mut end = None;
        for action in actions {
            match action {
                Action::Clear => self.send(MediaCommand::Clear),
                Action::Speak { .. } => {
                    self.start_tts();
                    self.pump();
                }
                Action::Resume => self.pump(),
                Action::Finalize => {
                    self.stt_feed.send(SttInput::Finalize);
                }
                Action::StartBrain { history } => {
                    self.end_brain_turn();
                    self.llm_requested = Some(Instant::now());
                    self.llm = Some(self.setup.providers.llm.stream(ChatTurn {
                        call_id: self.setup.call_id.clone(),
                        caller: Some(self.setup.remote_party().to_string()),
                        system_prompt: self.setup.system_prompt(),
                        history,
                        tools: self.setup.tools.clone(),
                    }));
                }
                Action::CancelBrain => {
                    self.end_brain_turn();
                    self.llm = None;
                }
                Action::Event(kind, detail) => self.event(kind, detail),
                Action::Persist(i) => self.persist(i),
                Action::ReplyLatency(us) => {
                    if let Some(store) = &self.setup.log {
                        store.reply_latency(&self.setup.call_id, us);
                    }
                }
                Action::HangUp(reason) => {
                    self.send(MediaCommand::HangUp);
                    end = Some(reason);
                }
                Action::End(reason) => end = Some(reason),
                Action::Reply { id, outcome } => {
                    if let Some(reply) = self.replies.remove(&id) {
                        let _ = reply.send(outcome);
                    }
                }
                Action::Transfer { id, to } => {
                    info!(to = %mask_number(&to), "asking the carrier to transfer the call");
                    let request = TransferRequest {
                        to,
                        caller_id: self.our_number().to_string(),
                        public_url: String::new(),
                    };
                    self.carrier_action(id, MediaCommand::Transfer { id, request });
                }
                Action::SendDtmf { id, digits } => {
                    self.carrier_action(id, MediaCommand::SendDtmf { id, digits });
                }
                Action::AskTurnModel { pause } => {
                    let refused = match &self.turn_model {
                        Some(link) => link.ask(pause).err(),
                        None => Some(TurnModelAnswer {
                            pause,
                            verdict: Verdict::Unavailable(Unavailable::Stopped),
                            micros: 0,
                        }),
                    };
                    self.deferred.extend(refused.map(Input::TurnModel));
                }
            }
        }
        end
    }

    async fn run(mut self) {
        info!(
            from = %mask_number(&self.setup.from),
            to = %mask_number(&self.setup.to),
            agent = %self.setup.agent_name,
            "call created; waiting for media"
        );
        let stt = self.open_stt();
        self.set_stt(Some(stt));
        self.step(Input::Start);

        let reason = loop {
            let now = Instant::now();
            let pace_at = if self.media_tx.is_some() {
                self.speech.next_deadline(now)
            } else {
                None
            };
            let talk_at = self.policy.deadline(&self.speech);
            let deadline = self.deadline();
            self.wakes += 1;
            // A superset of when the policy's barge-in is eligible (the agent may be heard).
            self.barge.set(
                self.setup.agent.barge_in
                    && (self.speech.is_speaking()
                        || self.speech.is_playing(now)
                        || self.speech.is_held()),
            );
            let ended = tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.on_msg(msg),
                    None => Some(EndReason::HandlesDropped),
                },
                ev = recv_opt(self.media_rx.as_mut()) => match ev {
                    Some(Inbound::Media(ev)) => self.on_media(ev),
                    Some(Inbound::Caller(note)) => self.on_caller(note),
                    None => Some(EndReason::MediaStreamClosed),
                },
                ev = recv_opt(self.stt.as_mut().map(|s| &mut s.events)) => self.on_stt(ev),
                ev = recv_opt(self.llm.as_mut().map(|l| &mut l.events)) => {
                    let ev = ev.unwrap_or_else(|| {
                        LlmEvent::Error("the reply stream ended early".into())
                    });
                    if let LlmEvent::Error(message) = &ev {
                        warn!(%message, "the brain failed this turn");
                    }
                    if let LlmEvent::Usage(u) = ev {
                        self.turn_tokens = u;
                        None
                    } else {
                        if let (LlmEvent::Delta(_), Some(at)) = (&ev, self.llm_requested) {
                            self.llm_requested = None;
                            self.event(EventKind::LlmFirstToken, micros_since(at).to_string());
                        }
                        self.step(Input::Llm(ev))
                    }
                }
                (id, ev) = self.speech.next_tts() => {
                    self.tts_progress(id, &ev);
                    match self.speech.on_tts(id, ev) {
                        Some(TtsNote::Failed(kind, err)) => {
                            warn!(error = %err, ?kind, "speech synthesis failed");
                            self.event(EventKind::TtsError, err);
                        }
                        Some(TtsNote::FirstByte { provider, after }) => self.event(
                            EventKind::TtsFirstByte,
                            format!("{provider} {}", after.as_micros()),
                        ),
                        Some(TtsNote::Switched { from, to, reason }) => self.event(
                            EventKind::TtsFallback,
                            format!("{from} -> {to}: {reason}"),
                        ),
                        None => {}
                    }
                    self.start_tts();
                    self.pump();
                    None
                }
                _ = sleep_opt(pace_at) => {
                    self.pump();
                    None
                }
                _ = sleep_opt(talk_at) => self.step(Input::Timer),
                Some(answer) = recv_opt(self.turn_model.as_mut().map(|t| &mut t.answers)) => {
                    self.step(Input::TurnModel(answer))
                }
                (r, hang_up) = deadline => {
                    if hang_up {
                        self.send(MediaCommand::HangUp);
                    }
                    break r;
                }
            };
            if let Some(r) = ended {
                break r;
            }
            if let Some(r) = self.step(Input::Settle) {
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

    /// Our number on this call (the one the caller dialled, or the one we call from).
    fn our_number(&self) -> &str {
        if self.setup.outbound {
            &self.setup.from
        } else {
            &self.setup.to
        }
    }

    /// Hands an action to the media pump; a command that cannot be queued fails at once.
    fn carrier_action(&mut self, id: u64, cmd: MediaCommand) {
        let queued = self
            .media_tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(cmd).is_ok());
        if !queued {
            self.deferred.push(Input::ActionDone {
                id,
                result: ActionResult::Failed("the call's media stream is not available".into()),
            });
        }
    }

    fn send(&mut self, cmd: MediaCommand) {
        let Some(tx) = &self.media_tx else {
            return;
        };
        // What the recording hears of it, known before the command is handed over.
        let heard = match &cmd {
            MediaCommand::Audio(frame) => Some(Some(frame.clone())),
            MediaCommand::Clear => Some(None),
            _ => None,
        };
        if tx.try_send(cmd).is_err() {
            self.frames_dropped += 1;
            if let Some(log) = &self.setup.log {
                log.frame_dropped(&self.setup.call_id, Dropped::ToCarrier);
            }
            return;
        }
        // Only audio the carrier accepted is recorded; a clear withdraws what it flushes.
        let recorded = match (&self.recorder, heard) {
            (Some(rec), Some(Some(frame))) => rec.agent(frame),
            (Some(rec), Some(None)) => rec.clear(),
            _ => true,
        };
        if !recorded {
            self.recording_dropped();
        }
    }

    fn recording_dropped(&self) {
        if let Some(log) = &self.setup.log {
            log.frame_dropped(&self.setup.call_id, Dropped::ToRecording);
        }
    }

    /// Adds the open brain turn's tokens to the call's usage.
    fn end_brain_turn(&mut self) {
        let t = std::mem::take(&mut self.turn_tokens);
        self.usage.llm_prompt_tokens += t.prompt_tokens;
        self.usage.llm_completion_tokens += t.completion_tokens;
        self.llm_requested = None;
    }

    /// Notes a synthesis' first audio (the `tts_first_audio` stage) and forgets finished ones.
    fn tts_progress(&mut self, id: u64, ev: &Option<TtsEvent>) {
        // A chain's notes come before the audio they announce.
        if matches!(
            ev,
            Some(TtsEvent::FirstByte { .. } | TtsEvent::Switched { .. } | TtsEvent::Words(_))
        ) {
            return;
        }
        let Some(i) = self.tts_requested.iter().position(|(r, _)| *r == id) else {
            return;
        };
        let (_, at) = self.tts_requested.swap_remove(i);
        if let Some(TtsEvent::Audio(_)) = ev {
            self.event(EventKind::TtsFirstAudio, micros_since(at).to_string());
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
            CallMsg::Say(text) => return self.step(Input::Say(text)),
            CallMsg::Snapshot(tx) => {
                let _ = tx.send(self.record(&EndReason::InProgress));
            }
            CallMsg::Act { action, reply } => {
                if self.media_tx.is_none() {
                    let _ = reply.send(ActionOutcome::Refused {
                        reason: "the call has not been answered yet".into(),
                    });
                    return None;
                }
                self.next_act += 1;
                let id = self.next_act;
                self.replies.insert(id, reply);
                return self.step(Input::Act { id, action });
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
        self.recorder = self.setup.recording.clone().map(Recorder::start);
        // The caller-audio stage goes to the media pump; kept here when nobody asked for it.
        if let Some(vad) = self.vad.take() {
            let mut ingress = CallerIngress::new(vad, self.stt_feed.clone(), self.stt_tail_ms)
                .with_recorder(self.recorder.as_ref().map(Recorder::caller_track))
                .with_ring(self.turn_model.as_ref().map(|t| t.ring.clone()))
                .with_log(self.setup.log.clone(), &self.setup.call_id)
                .with_barge_watch(self.barge.clone());
            if let Some(echo) = &self.echo {
                ingress = ingress.with_echo_reference(echo.clone());
            }
            self.ingress = match m.ingress {
                Some(to_pump) => to_pump.send(ingress).err().map(CallerIngress::every_frame),
                None => Some(ingress.every_frame()),
            };
        }
        self.step(Input::Answered);
        self.event(EventKind::MediaStart, m.start.stream_id.clone());
        if let Some(store) = &self.setup.log {
            store.answered(&self.setup.call_id);
        }
        info!(stream_id = %m.start.stream_id, "media stream started");
        self.pump();
    }

    fn on_media(&mut self, ev: MediaEvent) -> Option<EndReason> {
        self.last_media = Instant::now();
        match ev {
            MediaEvent::Start(_) => None,
            MediaEvent::Audio(frame) => {
                let note = self.ingress.as_mut()?.frame(frame)?;
                self.on_caller(note)
            }
            MediaEvent::Dtmf(d) => self.step(Input::Dtmf(d)),
            MediaEvent::ActionDone { id, result } => self.step(Input::ActionDone { id, result }),
            MediaEvent::MarkPlayed(name) => self.step(Input::Mark(name)),
            MediaEvent::Stop => {
                self.event(EventKind::CarrierStop, "");
                // A transfer ends the stream (Twilio, Plivo) before or after its REST answer.
                self.step(Input::StreamStopped)
                    .or(Some(EndReason::CallerHungUp))
            }
        }
    }

    /// What the caller-audio stage took in since its last note: the detector's events, then
    /// the voiced run (barge-in), as each frame used to be.
    fn on_caller(&mut self, note: CallerNote) -> Option<EndReason> {
        self.last_media = Instant::now();
        let mut ended = None;
        for (event, audio_ms) in note.vad {
            ended = ended.or(self.step(Input::Vad { event, audio_ms }));
        }
        if let Some(path) = note.echo_path {
            let detail = match path {
                Some(p) => format!(
                    "delay_ms={} gain_db={:.1} spread_db={:.1}",
                    p.delay_ms, p.gain_db, p.spread_db
                ),
                None => "lost".to_string(),
            };
            self.event(EventKind::EchoPath, detail);
        }
        ended.or(self.step(Input::CallerAudio {
            speech_run_ms: note.speech_run_ms,
            span_ms: note.speech_span_ms,
            pitched_ms: note.pitched_ms,
            echo_ms: note.echo_ms,
        }))
    }

    fn start_tts(&mut self) {
        for (id, text) in self.speech.wants_tts() {
            self.usage.tts_characters += text.chars().count() as u64;
            // Requests whose streams were dropped unheard are forgotten past a bound.
            if self.tts_requested.len() >= 64 {
                self.tts_requested.remove(0);
            }
            self.tts_requested.push((id, Instant::now()));
            let stream = self.setup.providers.tts.synthesize(&text);
            self.speech.set_tts(id, stream);
        }
    }

    /// Sends what the pacer allows; the policy hears which utterances started.
    fn pump(&mut self) {
        if self.media_tx.is_none() {
            return;
        }
        let mut out = std::mem::take(&mut self.pumped);
        self.speech.pump_into(Instant::now(), &mut out);
        if !out.started.is_empty() {
            self.step(Input::Started(std::mem::take(&mut out.started)));
        }
        for cmd in out.commands.drain(..) {
            self.send(cmd);
        }
        self.pumped = out;
    }

    fn finish(mut self, reason: EndReason) {
        self.llm = None;
        let _ = self.speech.clear(Instant::now());
        // What is batched goes first; then nothing more reaches the session.
        self.stt_feed.send(SttInput::Close);
        self.stt_feed.set_input(None);
        (self.usage.stt_audio_ms, self.stt_frames_dropped) = self.stt_feed.totals();
        if let Some(stt) = self.stt.take() {
            // Let the session close gracefully, but never for long.
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
        // Dropping the recorder lets its writer finish the file.
        self.recorder = None;
        if self.answered.is_some() {
            (0..self.policy.transcript().len()).for_each(|i| self.persist(i));
        }
        self.end_brain_turn();
        self.usage.carrier_ms = self.answered.map_or(0, |a| a.elapsed().as_millis() as u64);
        self.event(EventKind::CallEnd, reason.log_text());
        if let Some(store) = &self.setup.log {
            store.usage(&self.setup.call_id, &self.usage);
            store.ended(&self.setup.call_id, &reason);
        }
        let duration = self
            .answered
            .map(|a| a.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        info!(
            from = %mask_number(&self.setup.from),
            to = %mask_number(&self.setup.to),
            reason = %reason.log_text(),
            duration_s = format!("{duration:.1}"),
            turns = self.policy.turns(),
            transcript_entries = self.policy.transcript().len(),
            frames_dropped = self.frames_dropped,
            stt_frames_dropped = self.stt_frames_dropped,
            wakes = self.wakes,
            "call ended"
        );
        let record = self.record(&reason);
        self.registry.finish(record);
    }
}
