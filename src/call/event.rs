//! The typed contract of a call's timeline: every kind of event the actor records
//! ([`EventKind`]) and every way a call can end ([`EndReason`]). The store, the REST API and the
//! MCP server see these types, never free-form strings; their serialised forms (snake_case
//! event names, the human-readable end reasons) are what the store and the API have always
//! carried, so stored rows and served JSON did not change when they became types.

use std::fmt;

use serde::{Serialize, Serializer};

/// One kind of decision or observation on a call's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The carrier's media stream started (detail: its stream id).
    MediaStart,
    /// The caller pressed a key (detail: the key).
    Dtmf,
    /// The carrier said the stream stopped.
    CarrierStop,
    /// The carrier played everything up to a mark (detail: the mark name).
    MarkPlayed,
    /// A mark that was withdrawn because its audio was cleared before it played.
    MarkWithdrawn,
    /// A mark whose audio the carrier dropped on `clear`.
    MarkCleared,
    /// The speech-to-text session is open.
    SttConnected,
    /// The speech-to-text session failed (detail: why).
    SttError,
    /// The speech-to-text session was reopened after a failure.
    SttReopen,
    /// Our voice activity detector heard the caller start speaking.
    SpeechStart,
    /// Our voice activity detector heard the caller stop speaking.
    SpeechEnd,
    /// The agent was stopped by caller speech (carrier `clear`, pacer paused).
    BargeInStop,
    /// The barge-in was confirmed: the agent's turn is over.
    BargeInCommit,
    /// The barge-in was not confirmed: the agent resumed from the last heard sentence.
    BargeInResume,
    /// `Finalize` was sent to the STT because our detector was sure the caller stopped.
    FinalizeSent,
    /// The caller's turn ended (detail: how we knew and the silence observed).
    TurnEnd,
    /// A caller turn waits for the agent to finish (`barge_in = false`).
    TurnHeld,
    /// A transcript that matched what the agent was saying was dropped as echo.
    EchoIgnored,
    /// The caller's audio carries an echo of the agent's: its path was found or lost
    /// (detail: `delay_ms=… gain_db=…`, or `lost`). Echoed audio does not stop the agent.
    EchoPath,
    /// A short acknowledgement over the agent ("mm-hmm") was dropped.
    BackchannelIgnored,
    /// A turn was sent to the brain (detail: the turn number).
    LlmRequest,
    /// The brain finished its reply.
    LlmDone,
    /// A fallback chain switched provider (detail: `llm FROM -> TO: why`).
    ProviderSwitch,
    /// The speech-to-text's eager end of turn started the brain speculatively (detail: the
    /// text); its reply is held back until the turn really ends.
    SpeculationStart,
    /// The speculative reply was cancelled (detail: `turn_resumed` or `text_changed`); none
    /// of it was spoken.
    SpeculationCancelled,
    /// The turn ended as speculated: the speculative reply is the answer.
    SpeculationUsed,
    /// The brain failed (detail: why); the caller hears `llm_error_message`.
    LlmError,
    /// The brain reported tool progress (detail: the tool's label).
    ToolProgress,
    /// The in-call model called a tool (detail: JSON `turn`, `id`, `name`, `arguments`).
    ToolCall,
    /// A tool finished (detail: JSON `turn`, `id`, `name`, `ok`, `content` — what the model
    /// was told).
    ToolResult,
    /// The first frame of the reply after a tool result went out (detail: µs since the
    /// model's tool call arrived).
    ToolReplyFirstFrame,
    /// A sentence of the agent's reply was heard by the caller (detail: the sentence).
    Heard,
    /// The agent's reply was cut short (detail: `clear` when audio had to be dropped).
    Interrupted,
    /// The filler was spoken while the brain was slow (detail: why).
    Filler,
    /// Text-to-speech failed (detail: why).
    TtsError,
    /// A sentence's first audio byte arrived (detail: the `[tts.NAME]` and µs since its
    /// request): the "TTS request → first audio byte" stage.
    TtsFirstByte,
    /// The TTS chain gave a sentence to its next TTS (detail: `from -> to: why`).
    TtsFallback,
    /// The first frame of the greeting went out (detail: µs since the stream started).
    GreetingFirstFrame,
    /// The first frame of a reply went out (detail: µs since the caller's turn ended).
    ReplyFirstFrame,
    /// The first frame of a filler or apology went out before any reply (detail: µs).
    FirstFrameOfTurn,
    /// The caller was silent; a nudge was spoken (detail: the nudge's number).
    IdleNudge,
    /// The caller stayed silent; the goodbye was spoken.
    IdleGoodbye,
    /// The goodbye ended; the call is hung up.
    IdleHangUp,
    /// The agent, an operator or the daemon hung the call up (detail: why).
    HangUp,
    /// The call ended (detail: the [`EndReason`]).
    CallEnd,
    /// The agent asked to end the call (detail: its reason); the current sentence finishes.
    EndCall,
    /// A transfer was allowed: the handoff line plays, then the carrier is asked (detail: the
    /// destination, masked).
    TransferStart,
    /// The carrier accepted the transfer (detail: the destination, masked).
    Transferred,
    /// The carrier refused or failed the transfer (detail: why); the call goes on.
    TransferFailed,
    /// The agent sent DTMF (detail: the digits and how: `command`, `in_band` or `failed`).
    DtmfOut,
    /// An action was refused by policy before reaching the carrier (detail: action: why).
    ActionRefused,
    // -- Stage latencies (issue 14, metrics and the timeline page): detail µs.
    /// The brain's first token of a turn arrived (detail: µs since the request).
    LlmFirstToken,
    /// A synthesis' first audio arrived (detail: µs since the TTS request).
    TtsFirstAudio,
    /// The STT chain moved the call to its next STT (detail: `reason: from -> to: why`, the
    /// reason `open_failed`, `open_timeout` or `dropped`).
    SttSwitched,
    /// The end-of-turn model judged a pause (detail: `complete p=0.912 pause=3 infer_us=27000`,
    /// `incomplete …`, `unavailable queue_full …`, `timeout pause=3`; ` ignored` when the
    /// answer came after the caller went on).
    TurnModel,
    /// Caller speech over the agent reached `barge_in_hold_ms`: no new agent audio is sent
    /// (no `clear`; the carrier plays on what it has) until the stop or the end of the burst.
    BargeInHold,
    /// The hold ended without a stop (detail: `burst_ended`, `backchannel`, `too_long` or
    /// `agent_done`, and `after_ms=`): the agent's audio is sent on, the caller heard no cut.
    BargeInHoldReleased,
}

impl EventKind {
    /// Every kind, for documentation and exhaustive tests.
    pub const ALL: [EventKind; 57] = [
        EventKind::MediaStart,
        EventKind::Dtmf,
        EventKind::CarrierStop,
        EventKind::MarkPlayed,
        EventKind::MarkWithdrawn,
        EventKind::MarkCleared,
        EventKind::SttConnected,
        EventKind::SttError,
        EventKind::SttReopen,
        EventKind::SpeechStart,
        EventKind::SpeechEnd,
        EventKind::BargeInStop,
        EventKind::BargeInCommit,
        EventKind::BargeInResume,
        EventKind::FinalizeSent,
        EventKind::TurnEnd,
        EventKind::TurnHeld,
        EventKind::EchoIgnored,
        EventKind::EchoPath,
        EventKind::BackchannelIgnored,
        EventKind::LlmRequest,
        EventKind::LlmDone,
        EventKind::ProviderSwitch,
        EventKind::SpeculationStart,
        EventKind::SpeculationCancelled,
        EventKind::SpeculationUsed,
        EventKind::LlmError,
        EventKind::ToolProgress,
        EventKind::ToolCall,
        EventKind::ToolResult,
        EventKind::ToolReplyFirstFrame,
        EventKind::Heard,
        EventKind::Interrupted,
        EventKind::Filler,
        EventKind::TtsError,
        EventKind::TtsFirstByte,
        EventKind::TtsFallback,
        EventKind::GreetingFirstFrame,
        EventKind::ReplyFirstFrame,
        EventKind::FirstFrameOfTurn,
        EventKind::IdleNudge,
        EventKind::IdleGoodbye,
        EventKind::IdleHangUp,
        EventKind::HangUp,
        EventKind::CallEnd,
        EventKind::EndCall,
        EventKind::TransferStart,
        EventKind::Transferred,
        EventKind::TransferFailed,
        EventKind::DtmfOut,
        EventKind::ActionRefused,
        EventKind::LlmFirstToken,
        EventKind::TtsFirstAudio,
        EventKind::SttSwitched,
        EventKind::TurnModel,
        EventKind::BargeInHold,
        EventKind::BargeInHoldReleased,
    ];

    /// The stored and served name (snake_case).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::MediaStart => "media_start",
            EventKind::Dtmf => "dtmf",
            EventKind::CarrierStop => "carrier_stop",
            EventKind::MarkPlayed => "mark_played",
            EventKind::MarkWithdrawn => "mark_withdrawn",
            EventKind::MarkCleared => "mark_cleared",
            EventKind::SttConnected => "stt_connected",
            EventKind::SttError => "stt_error",
            EventKind::SttReopen => "stt_reopen",
            EventKind::SpeechStart => "speech_start",
            EventKind::SpeechEnd => "speech_end",
            EventKind::BargeInStop => "barge_in_stop",
            EventKind::BargeInCommit => "barge_in_commit",
            EventKind::BargeInResume => "barge_in_resume",
            EventKind::FinalizeSent => "finalize_sent",
            EventKind::TurnEnd => "turn_end",
            EventKind::TurnHeld => "turn_held",
            EventKind::EchoIgnored => "echo_ignored",
            EventKind::EchoPath => "echo_path",
            EventKind::BackchannelIgnored => "backchannel_ignored",
            EventKind::LlmRequest => "llm_request",
            EventKind::LlmDone => "llm_done",
            EventKind::ProviderSwitch => "provider_switch",
            EventKind::SpeculationStart => "speculation_start",
            EventKind::SpeculationCancelled => "speculation_cancelled",
            EventKind::SpeculationUsed => "speculation_used",
            EventKind::LlmError => "llm_error",
            EventKind::ToolProgress => "tool_progress",
            EventKind::ToolCall => "tool_call",
            EventKind::ToolResult => "tool_result",
            EventKind::ToolReplyFirstFrame => "tool_reply_first_frame",
            EventKind::Heard => "heard",
            EventKind::Interrupted => "interrupted",
            EventKind::Filler => "filler",
            EventKind::TtsError => "tts_error",
            EventKind::TtsFirstByte => "tts_first_byte",
            EventKind::TtsFallback => "tts_fallback",
            EventKind::GreetingFirstFrame => "greeting_first_frame",
            EventKind::ReplyFirstFrame => "reply_first_frame",
            EventKind::FirstFrameOfTurn => "first_frame_of_turn",
            EventKind::IdleNudge => "idle_nudge",
            EventKind::IdleGoodbye => "idle_goodbye",
            EventKind::IdleHangUp => "idle_hang_up",
            EventKind::HangUp => "hang_up",
            EventKind::CallEnd => "call_end",
            EventKind::EndCall => "end_call",
            EventKind::TransferStart => "transfer_start",
            EventKind::Transferred => "transferred",
            EventKind::TransferFailed => "transfer_failed",
            EventKind::DtmfOut => "dtmf_out",
            EventKind::ActionRefused => "action_refused",
            EventKind::LlmFirstToken => "llm_first_token",
            EventKind::TtsFirstAudio => "tts_first_audio",
            EventKind::SttSwitched => "stt_switched",
            EventKind::TurnModel => "turn_model",
            EventKind::BargeInHold => "barge_in_hold",
            EventKind::BargeInHoldReleased => "barge_in_hold_released",
        }
    }

    /// The kind stored under `name`, if any.
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for EventKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Why a call ended. Displayed (and stored, and served) as a short sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// Still going (a snapshot of a live call).
    InProgress,
    /// The carrier said the stream stopped: the caller hung up.
    CallerHungUp,
    /// The media socket closed without a stop.
    MediaStreamClosed,
    /// The carrier never opened the media stream.
    MediaNeverConnected,
    /// The carrier sent no media for `media_timeout`.
    NoMedia,
    /// `max_duration_s` passed.
    MaxDuration,
    /// The caller stayed silent through the nudges and the goodbye.
    CallerSilent,
    /// The agent, an operator or the daemon hung up, with their reason.
    HungUp(String),
    /// Every handle to the call was dropped (the daemon is going away).
    HandlesDropped,
    /// The agent transferred the caller to this number (E.164) and the carrier accepted it.
    Transferred(String),
}

impl EndReason {
    /// The stored and served text.
    pub fn text(&self) -> std::borrow::Cow<'static, str> {
        use std::borrow::Cow;
        Cow::Borrowed(match self {
            EndReason::InProgress => "in progress",
            EndReason::CallerHungUp => "caller hung up",
            EndReason::MediaStreamClosed => "media stream closed",
            EndReason::MediaNeverConnected => "media stream never connected",
            EndReason::NoMedia => "no media from the carrier",
            EndReason::MaxDuration => "maximum call duration reached",
            EndReason::CallerSilent => "caller silent",
            EndReason::HandlesDropped => "handles dropped",
            EndReason::HungUp(why) => return Cow::Owned(format!("hung up: {why}")),
            EndReason::Transferred(to) => return Cow::Owned(format!("transferred to {to}")),
        })
    }

    /// The text for a log line: like [`EndReason::text`] with phone numbers masked.
    pub fn log_text(&self) -> std::borrow::Cow<'static, str> {
        match self {
            EndReason::Transferred(to) => {
                format!("transferred to {}", crate::security::mask_number(to)).into()
            }
            other => other.text(),
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl Serialize for EndReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl PartialEq<str> for EndReason {
    fn eq(&self, other: &str) -> bool {
        self.text() == other
    }
}

impl PartialEq<&str> for EndReason {
    fn eq(&self, other: &&str) -> bool {
        self.text() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_name_and_serde() {
        let mut names = std::collections::HashSet::new();
        for k in EventKind::ALL {
            assert!(names.insert(k.as_str()), "duplicate name {k}");
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
            let json = serde_json::to_string(&k).expect("serialise");
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            let back: EventKind = serde_json::from_str(&json).expect("deserialise");
            assert_eq!(back, k);
        }
        assert_eq!(EventKind::parse("no_such_event"), None);
    }

    #[test]
    fn end_reasons_keep_their_stored_text() {
        assert_eq!(EndReason::CallerHungUp, "caller hung up");
        assert_eq!(EndReason::HungUp("operator".into()), "hung up: operator");
        assert_eq!(
            serde_json::to_string(&EndReason::MaxDuration).expect("json"),
            "\"maximum call duration reached\""
        );
    }
}
