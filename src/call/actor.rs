//! The call actor, the I/O shell around the conversation [`Policy`]: one tokio task per call
//! owning its channels and provider streams, one `select!` loop over handle messages, carrier
//! media, speech-to-text, the brain's stream, TTS audio, the pacer and timers. What arrives
//! becomes policy [`Input`]s, fed by the driving rule (`handle`, then every `poll_action`
//! carried out; see [`super::policy`] and `actor/drive.rs`). It also owns what the policy does
//! not judge: the [`Vad`] on caller audio, the STT session (and its one reopen), the TTS
//! streams the policy asks for (`actor/tts.rs`), the pacer, call timeouts and the final record.
//! It never blocks: every wait is a branch of the select, every send to a peer a `try_send` on a
//! bounded channel. Caller audio does not pass through it: the media pump runs the call's
//! [`CallerIngress`] (detector, recording, Smart Turn ring, STT writes) and the actor hears
//! [`CallerNote`]s, what turn-taking needs; the two share one handle, [`CallerShared`], which
//! the actor owns and clones into the stage it builds when media attaches.

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
use super::event::{EndReason, EventDetail, EventKind};
use super::ingress::{
    BargeWatch, BeepWatch, CallerIngress, CallerNote, CallerShared, MediaInput,
    STT_ENDPOINT_MARGIN_MS, STT_UNBATCHED_TAIL_MS, SttFeed,
};
use super::log::{Dropped, Usage};
use super::mouth::{Mouth, Pumped};
use super::policy::{Action, Input, Policy};
use super::recording::Recorder;
use super::registry::InsertError;
use super::timeline::EventLog;
use super::trace::{CallFacts, CallTrace};
use super::transcript::{CallEvent, CallRecord};
use super::{CallHandle, CallMsg, CallRegistry, CallSetup, MediaAttach};
use crate::audio::vad::{Vad, VadConfig, VadEngine};
use crate::carrier::registry::BoxFuture;
use crate::carrier::{ActionResult, Leg, MediaCommand, MediaEvent};
use crate::config::VadEngineName;
use crate::provider::{
    ChatTurn, LlmEvent, LlmStream, SttContext, SttEvent, SttInput, SttStream, TokenUsage, TtsEvent,
};
use crate::security::mask_number;

mod drive;
mod finish;
mod media;
mod stt;
mod tts;

use drive::TurnModelLink;

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

/// A leg request's id and what the carrier made of it.
type LegDone = (u64, ActionResult);

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
    /// The call's leg at its carrier, from the moment media attached.
    leg: Option<Leg>,
    /// What the carrier made of the leg's transfer and DTMF requests (sent by their tasks).
    leg_done: (mpsc::Sender<LegDone>, mpsc::Receiver<LegDone>),
    media_rx: Option<mpsc::Receiver<MediaInput>>,
    stt: Option<SttStream>,
    stt_reopened: bool,
    /// What the caller-audio stage shares with the actor (the STT writer, the barge-in
    /// watch, the echo reference, the turn model's ring).
    caller: CallerShared,
    /// How long after the last voiced frame audio still goes to the STT unbatched.
    stt_tail_ms: u64,
    /// The caller-audio stage when no media pump took it (`patterd try` sends raw frames).
    ingress: Option<CallerIngress>,
    /// Times the select loop woke (logged at the end).
    wakes: u64,
    llm: Option<LlmStream>,
    /// The agent's mouth: lent to the policy on every step, pumped here.
    mouth: Mouth,
    /// The synthesis streams the policy asked for.
    tts: tts::Synthesis,
    /// What the last pump sent (its vectors reused from pump to pump).
    pumped: Pumped,
    policy: Policy,
    /// The detector until media attaches (it then moves into the caller-audio stage).
    vad: Option<Vad>,
    /// The newest events (all of them are in the store).
    events: EventLog,
    frames_dropped: u64,
    stt_frames_dropped: u64,
    /// Who asked for each agent action in progress (by the policy's action id).
    replies: HashMap<u64, oneshot::Sender<ActionOutcome>>,
    next_act: u64,
    /// Stage timing and usage: when the open brain stream was requested (until its first
    /// token), and what was used.
    llm_requested: Option<Instant>,
    usage: Usage,
    /// The open brain turn's latest `usage` report (replaced, not added, until the turn ends).
    turn_tokens: TokenUsage,
    /// The call's recording, from the media stream's start (`record = true` agents only).
    recorder: Option<Recorder>,
    /// The end-of-turn model's link (agents with `turn_model` only).
    turn_model: Option<TurnModelLink>,
    /// The call's spans (`[telemetry]` on only).
    trace: Option<Box<CallTrace>>,
}

/// Microseconds from `at` to now.
/// A random seed for the call's brain-retry jitter (the standard library's per-process
/// random hash keys, mixed with the time).
fn jitter_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

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

/// The agent's voice detector on caller audio.
fn vad(agent: &crate::config::AgentConfig) -> Vad {
    Vad::new(VadConfig {
        engine: match agent.vad_engine {
            VadEngineName::Earshot => VadEngine::Earshot,
            VadEngineName::Silero => VadEngine::Silero,
        },
        threshold: agent.vad_threshold as f32,
        stop_ms: agent.vad_stop_ms,
        ..VadConfig::default()
    })
}

impl Actor {
    fn new(
        setup: CallSetup,
        rx: mpsc::Receiver<CallMsg>,
        registry: Arc<CallRegistry>,
        changes: watch::Sender<u64>,
    ) -> Self {
        let now = Instant::now();
        let turn_model = setup.turn_model.clone().map(TurnModelLink::new);
        let caller = CallerShared {
            stt: SttFeed::new(setup.log.clone(), &setup.call_id),
            barge: BargeWatch::default(),
            beep: BeepWatch::default(),
            echo: setup
                .agent
                .barge_in_echo_check
                .then(|| EchoReference::new(now)),
            ring: turn_model.as_ref().map(|t| t.ring.clone()),
        };
        let stt = &setup.providers.stt;
        let tail = if stt.ends_turns() {
            STT_UNBATCHED_TAIL_MS
        } else {
            STT_ENDPOINT_MARGIN_MS
        };
        Self {
            rx,
            registry,
            changes,
            created: now,
            answered: None,
            last_media: now,
            media_tx: None,
            leg: None,
            leg_done: mpsc::channel(8),
            media_rx: None,
            stt: None,
            stt_reopened: false,
            stt_tail_ms: stt.endpointing_ms().saturating_add(tail),
            ingress: None,
            wakes: 0,
            llm: None,
            mouth: match &caller.echo {
                Some(e) => Mouth::new().with_echo_reference(e.clone()),
                None => Mouth::new(),
            },
            tts: tts::Synthesis::default(),
            caller,
            pumped: Pumped::default(),
            policy: Policy::new(
                setup.agent.clone(),
                stt.endpointing_ms(),
                setup.providers.llm.keeps_history(),
                now,
            )
            .with_stt_turns(stt.ends_turns())
            .with_turn_model(setup.turn_model.as_ref().map(|w| w.timing()))
            .with_jitter_seed(jitter_seed()),
            vad: Some(vad(&setup.agent)),
            events: EventLog::default(),
            frames_dropped: 0,
            stt_frames_dropped: 0,
            replies: HashMap::new(),
            next_act: 0,
            llm_requested: None,
            usage: Usage::default(),
            turn_tokens: TokenUsage::default(),
            recorder: None,
            turn_model,
            trace: setup.tracing.clone().map(|tracing| {
                let facts = CallFacts {
                    call_id: setup.call_id.clone(),
                    carrier: setup.carrier.as_str(),
                    agent: setup.agent_name.clone(),
                    outbound: setup.outbound,
                };
                Box::new(CallTrace::new(tracing, facts, now))
            }),
            setup,
        }
    }

    fn event(&mut self, kind: EventKind, detail: impl Into<EventDetail>) {
        let typed = detail.into();
        let detail = typed.to_text();
        debug!(event = kind.as_str(), %detail, "call event");
        let now = Instant::now();
        if let Some(trace) = self.trace.as_mut() {
            trace.on_event(kind, now, !self.mouth.is_speaking());
        }
        let t_ms = now.saturating_duration_since(self.created).as_millis() as u64;
        let n = self.events.push(CallEvent { t_ms, kind, detail });
        if let (Some(store), Some(e)) = (&self.setup.log, self.events.last()) {
            store.event(&self.setup.call_id, e, &typed);
        }
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
            events: self.events.to_vec(),
        }
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
                self.mouth.next_deadline(now)
            } else {
                None
            };
            let talk_at = self.policy.deadline(&self.mouth);
            let deadline = self.deadline();
            self.wakes += 1;
            // A superset of when the policy's barge-in is eligible (the agent may be heard).
            self.caller.beep.set(self.policy.awaits_beep());
            self.caller.barge.set(
                self.setup.agent.barge_in
                    && !self.policy.in_voicemail()
                    && (self.mouth.is_speaking()
                        || self.mouth.is_playing(now)
                        || self.mouth.is_held()),
            );
            let ended = tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.on_msg(msg),
                    None => Some(EndReason::HandlesDropped),
                },
                ev = recv_opt(self.media_rx.as_mut()) => match ev {
                    Some(MediaInput::Media(ev)) => self.on_media(ev),
                    Some(MediaInput::Caller(note)) => self.on_caller(note),
                    Some(MediaInput::Paced { dropped }) => {
                        self.event(EventKind::CallerAudioPaced, format!("frames_dropped={dropped}"));
                        None
                    }
                    Some(MediaInput::Flooded { dropped }) => {
                        self.event(EventKind::CallerAudioPaced, format!("frames_dropped={dropped}"));
                        self.on_msg(CallMsg::HangUp { reason: super::ingress::FLOOD_REASON.into() })
                    }
                    None => Some(EndReason::MediaStreamClosed),
                },
                ev = recv_opt(self.stt.as_mut().map(|s| &mut s.events)) => self.on_stt(ev),
                ev = recv_opt(self.llm.as_mut().map(|l| &mut l.events)) => self.on_llm(ev),
                (id, ev) = self.tts.next() => self.on_tts(id, ev),
                _ = sleep_opt(pace_at) => self.pump_step(),
                _ = sleep_opt(talk_at) => self.step(Input::Timer),
                Some((id, result)) = self.leg_done.1.recv() => {
                    self.step(Input::ActionDone { id, result })
                }
                Some(answer) = recv_opt(self.turn_model.as_mut().map(|t| &mut t.answers)) => {
                    self.step(Input::TurnModel(answer))
                }
                (r, hang_up) = deadline => {
                    if hang_up {
                        self.hang_up_leg();
                    }
                    break r;
                }
            };
            if let Some(r) = ended {
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

    /// An event of the brain's reply stream (one that ends early is an error).
    fn on_llm(&mut self, ev: Option<LlmEvent>) -> Option<EndReason> {
        let ev = ev.unwrap_or_else(|| LlmEvent::Error("the reply stream ended early".into()));
        if let LlmEvent::Error(message) | LlmEvent::Unavailable { message, .. } = &ev {
            warn!(%message, "the brain failed this turn");
        }
        if let LlmEvent::Usage(u) = ev {
            self.turn_tokens = u;
            return None;
        }
        if let Some(trace) = self.trace.as_mut() {
            match &ev {
                LlmEvent::ToolCall(call) => {
                    let kind = self
                        .setup
                        .tools
                        .as_ref()
                        .map_or("tool", |t| t.0.kind(&call.name));
                    trace.tool_call(call, kind, Instant::now());
                }
                LlmEvent::ToolResult { id, ok, .. } => trace.tool_result(id, *ok, Instant::now()),
                _ => {}
            }
        }
        if let (LlmEvent::Delta(_), Some(at)) = (&ev, self.llm_requested) {
            self.llm_requested = None;
            self.event(
                EventKind::LlmFirstToken,
                EventDetail::Micros(micros_since(at)),
            );
        }
        self.step(Input::Llm(ev))
    }

    /// An event of utterance `id`'s synthesis: its first audio on the timeline, then to the
    /// policy, then the pacer.
    fn on_tts(&mut self, id: u64, ev: Option<TtsEvent>) -> Option<EndReason> {
        if let Some(at) = self.tts.first_audio(id, &ev) {
            self.event(
                EventKind::TtsFirstAudio,
                EventDetail::Micros(micros_since(at)),
            );
        }
        if let Some(TtsEvent::Error(err) | TtsEvent::Unavailable(err)) = &ev {
            warn!(error = %err, "speech synthesis failed");
        }
        let end = self.step(Input::Synthesis { id, event: ev });
        end.or(self.pump_step())
    }

    /// Our number on this call (the one the caller dialled, or the one we call from).
    fn our_number(&self) -> &str {
        if self.setup.outbound {
            &self.setup.from
        } else {
            &self.setup.to
        }
    }
}
