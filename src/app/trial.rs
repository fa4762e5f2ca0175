//! `patterd try`: one call through the whole pipeline — admission, the call actor, the
//! configured STT, brain and TTS, the store — with no carrier: the call's media is an
//! in-memory line (`call::driver::MemoryLeg`) on the real clock, whose REST side is
//! unreachable (transfer and DTMF fail). The caller's audio (synthesised by the agent's own
//! TTS, or given as μ-law) goes down the line in real-time 20 ms frames after the greeting has
//! played; the line plays the agent's audio in real time and echoes its marks; the caller
//! hangs up once the agent has answered and been quiet for a moment. Returns the call's record
//! (transcript and timeline, for per-stage timings) and all the agent's audio the line played.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::App;
use crate::call::driver::{MemoryLeg, Rest};
use crate::call::{CallHandle, CallRecord, EventKind};
use crate::carrier::CarrierKind;
use crate::carrier::port::{Direct, Refusal};
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
    .await
    .map_err(TrialError::Refused)?;
    let handle = app.calls.get(&call_id).ok_or(TrialError::Ended)?;
    let leg = MemoryLeg::attach(
        &handle,
        &call_id,
        Rest::Unreachable("patterd try has no carrier"),
    )
    .map_err(|_| TrialError::Ended)?;
    let greeting = !config.first_message.trim().is_empty();
    let deadline = Instant::now() + limit;
    let talk = converse(&handle, &leg, greeting, &speech);
    if tokio::time::timeout_at(deadline, talk).await.is_err() {
        let _ = handle.hang_up("patterd try: timed out");
        return Err(TrialError::Timeout(limit));
    }
    leg.hang_up();
    let record = tokio::time::timeout(Duration::from_secs(10), app.calls.wait_finished(&call_id))
        .await
        .ok()
        .flatten()
        .ok_or(TrialError::Ended)?;
    Ok(Trial {
        record,
        agent_audio: leg.heard_audio(),
        caller_audio_ms: (speech.len() as u64) / 8,
    })
}

/// The caller's side of the trial call: speaks after the greeting (if any) has played, then
/// waits until the agent has answered (or failed to) and the line has been quiet for `QUIET`
/// since the agent's last audio. Returns early when the call ends.
async fn converse(handle: &CallHandle, leg: &MemoryLeg, greeting: bool, speech: &[u8]) {
    if greeting {
        let s = leg
            .until(|s| !s.marks.is_empty() || s.closed.is_some())
            .await;
        if s.closed.is_some() {
            return;
        }
    }
    if !speech.is_empty() {
        leg.say(speech);
    }
    let mut changes = handle.changes();
    loop {
        match handle.snapshot().await {
            Ok(rec) if answered(&rec) => break,
            Ok(_) => {}
            Err(_) => return,
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
    let quiet = QUIET.as_millis() as u64;
    loop {
        let s = leg.state();
        if s.closed.is_some() {
            return;
        }
        let caller_done = speech.is_empty() || s.caller_done.is_some();
        let wait = match s.agent_quiet_since() {
            Some(since) if caller_done => {
                let quiet_for = leg.now_ms().saturating_sub(since);
                if quiet_for >= quiet {
                    return;
                }
                quiet - quiet_for
            }
            _ => quiet,
        };
        leg.next_change(Duration::from_millis(wait)).await;
    }
}

/// True once the brain has answered the caller's turn, or failed to.
fn answered(rec: &CallRecord) -> bool {
    rec.events_of(EventKind::LlmDone).next().is_some()
        || rec.events_of(EventKind::LlmError).next().is_some()
}
