//! `patterd try`: one call through the whole pipeline — admission, the call actor, the
//! configured STT, brain and TTS, the store — with no carrier. The caller's audio (synthesised
//! by the agent's own TTS, or given as μ-law) is fed to the actor in real-time 20 ms frames
//! after the greeting; marks are acknowledged as they arrive (what was sent counts as played);
//! the call is hung up once the agent has answered and gone quiet. Returns the call's record
//! (transcript and timeline, for per-stage timings) and all the agent's audio.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::App;
use crate::call::{CallRecord, EventKind, MediaAttach};
use crate::carrier::port::{Direct, Refusal};
use crate::carrier::{
    CarrierKind, FRAME_BYTES, FRAME_MS, Leg, MediaCommand, MediaEvent, StreamStart,
};
use crate::provider::TtsEvent;

/// What the caller says.
pub enum CallerAudio {
    /// Text, spoken by the agent's TTS.
    Say(String),
    /// μ-law 8 kHz.
    Ulaw(Vec<u8>),
}

/// Why the trial call failed.
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error("no agent named {0:?} in the configuration")]
    UnknownAgent(String),
    #[error("the configuration has no [agents.*]")]
    NoAgent,
    #[error("the agent's providers are not available (check its llm, stt and tts names)")]
    Unavailable,
    #[error("the call was refused: {0:?}")]
    Refused(Refusal),
    #[error("the TTS could not speak the caller's text: {0}")]
    CallerTts(String),
    #[error("the call ended before it could start")]
    Ended,
    #[error("no answer from the agent within {0:?}")]
    Timeout(Duration),
}

/// The outcome of a trial call.
pub struct Trial {
    pub record: CallRecord,
    /// Everything the agent sent (greeting and reply), μ-law 8 kHz.
    pub agent_audio: Vec<u8>,
    /// The caller's audio that was sent, μ-law 8 kHz.
    pub caller_audio_ms: u64,
}

/// Quiet after the agent's reply that ends the call.
const QUIET: Duration = Duration::from_millis(1500);

/// Hands the call its stand-in media stream (no carrier: actions on the leg fail).
fn attach(
    handle: &crate::call::CallHandle,
    call_id: &str,
    events: mpsc::Receiver<crate::call::ingress::MediaInput>,
    commands: mpsc::Sender<MediaCommand>,
) -> Result<(), TrialError> {
    let start = StreamStart {
        call_id: call_id.to_string(),
        stream_id: call_id.to_string(),
        custom_parameters: Default::default(),
    };
    handle
        .attach(MediaAttach {
            start,
            events,
            commands,
            leg: Leg::unreachable("patterd try has no carrier"),
            ingress: None,
        })
        .map_err(|_| TrialError::Ended)
}

/// The agent named, or the first one configured.
fn agent_name(app: &App, agent: Option<&str>) -> Result<String, TrialError> {
    match agent {
        Some(a) => Ok(a.to_string()),
        None => app
            .config()
            .agents
            .keys()
            .next()
            .cloned()
            .ok_or(TrialError::NoAgent),
    }
}

/// The caller's audio: as given, or the agent's own TTS speaking the caller's text.
async fn caller_speech(
    providers: &crate::provider::AgentProviders,
    caller: CallerAudio,
) -> Result<Vec<u8>, TrialError> {
    Ok(match caller {
        CallerAudio::Ulaw(a) => a,
        CallerAudio::Say(text) => {
            let mut s = providers.tts.synthesize(&text);
            let mut audio = Vec::new();
            loop {
                match s.events.recv().await {
                    Some(TtsEvent::Audio(a)) => audio.extend_from_slice(&a),
                    Some(TtsEvent::Done) | None => break,
                    Some(TtsEvent::Error(e) | TtsEvent::Unavailable(e)) => {
                        return Err(TrialError::CallerTts(e));
                    }
                    Some(
                        TtsEvent::FirstByte { .. } | TtsEvent::Switched { .. } | TtsEvent::Words(_),
                    ) => {}
                }
            }
            audio
        }
    })
}

/// Runs one trial call to `agent` (or the first agent), giving up after `limit`.
pub async fn run(
    app: &Arc<App>,
    agent: Option<&str>,
    caller: CallerAudio,
    limit: Duration,
) -> Result<Trial, TrialError> {
    let name = agent_name(app, agent)?;
    let all = app.config();
    let config = all
        .agents
        .get(&name)
        .ok_or_else(|| TrialError::UnknownAgent(name.clone()))?;
    let providers = app
        .providers()
        .for_agent(config)
        .ok_or(TrialError::Unavailable)?;
    let speech = caller_speech(&providers, caller).await?;
    let call_id = crate::security::link::PhoneLinks::new_call_id().replacen("web-", "try-", 1);
    super::admission::admit_direct(
        app,
        Direct {
            carrier: CarrierKind::Web,
            account: "try",
            call_id: &call_id,
            from: "try",
            agent: Some(&name),
        },
    )
    .map_err(TrialError::Refused)?;
    let handle = app.calls.get(&call_id).ok_or(TrialError::Ended)?;
    let (ev_tx, ev_rx) = mpsc::channel(64);
    let (cmd_tx, mut cmd_rx) = mpsc::channel(512);
    attach(&handle, &call_id, ev_rx, cmd_tx)?;
    let start = StreamStart {
        call_id: call_id.clone(),
        stream_id: call_id.clone(),
        custom_parameters: Default::default(),
    };
    let _ = ev_tx.send(MediaEvent::Start(start).into()).await;

    let greeting = !config.first_message.trim().is_empty();
    let mut agent_audio = Vec::new();
    let mut marks = 0usize;
    let mut last_audio: Option<Instant> = None;
    let mut sent = 0usize;
    let mut frames = tokio::time::interval(Duration::from_millis(FRAME_MS));
    let deadline = Instant::now() + limit;
    let silence = [0xFFu8; FRAME_BYTES];
    let mut changes = handle.changes();
    let mut answered = false;
    loop {
        if Instant::now() > deadline {
            let _ = handle.hang_up("patterd try: timed out");
            return Err(TrialError::Timeout(limit));
        }
        let speaking = !greeting || marks >= 1;
        let done_speaking = sent >= speech.len();
        if answered && done_speaking && last_audio.is_some_and(|t| t.elapsed() > QUIET) {
            break;
        }
        tokio::select! {
            _ = frames.tick() => {
                let frame = if speaking && !done_speaking {
                    let end = (sent + FRAME_BYTES).min(speech.len());
                    let mut f = speech[sent..end].to_vec();
                    f.resize(FRAME_BYTES, 0xFF);
                    sent = end;
                    f
                } else {
                    silence.to_vec()
                };
                if ev_tx.send(MediaEvent::Audio(Bytes::from(frame)).into()).await.is_err() {
                    return Err(TrialError::Ended);
                }
            }
            cmd = cmd_rx.recv() => match cmd {
                Some(MediaCommand::Audio(a)) => {
                    agent_audio.extend_from_slice(&a);
                    last_audio = Some(Instant::now());
                }
                Some(MediaCommand::Mark(m)) => {
                    marks += 1;
                    let _ = ev_tx.send(MediaEvent::MarkPlayed(m).into()).await;
                }
                Some(MediaCommand::Clear) => {}
                None => break,
            },
            r = changes.changed() => {
                if r.is_err() {
                    break;
                }
                if let Ok(rec) = handle.snapshot().await {
                    answered = rec.events_of(EventKind::LlmDone).next().is_some()
                        || rec.events_of(EventKind::LlmError).next().is_some();
                }
            }
        }
    }
    let _ = ev_tx.send(MediaEvent::Stop.into()).await;
    let record = tokio::time::timeout(Duration::from_secs(10), app.calls.wait_finished(&call_id))
        .await
        .ok()
        .flatten()
        .ok_or(TrialError::Ended)?;
    Ok(Trial {
        record,
        agent_audio,
        caller_audio_ms: (speech.len() as u64) / 8,
    })
}
