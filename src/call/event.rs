//! The typed contract of a call's timeline: every kind of event the actor records
//! ([`EventKind`]), what an event says where something reads it ([`EventDetail`]) and every
//! way a call can end ([`EndReason`]). The store, the REST API and the
//! MCP server see these types, never free-form strings; their serialised forms (snake_case
//! event names, the human-readable end reasons) are what the store and the API have always
//! carried, so stored rows and served JSON did not change when they became types.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::provider::fallback_stt::SttSwitchReason;

/// The one list of event kinds: each line is a variant and its stored (and served) name, so
/// `EventKind`, its serde names, [`EventKind::as_str`] and [`EventKind::ALL`] cannot disagree.
/// A new kind is one line here.
macro_rules! event_kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// One kind of decision or observation on a call's timeline.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
        pub enum EventKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl EventKind {
            /// Every kind, for documentation and exhaustive tests.
            pub const ALL: [EventKind; [$(EventKind::$variant),*].len()] =
                [$(EventKind::$variant),*];

            /// The stored and served name (snake_case).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EventKind::$variant => $name,)*
                }
            }
        }
    };
}

event_kinds! {
    /// The carrier's media stream started (detail: its stream id).
    MediaStart = "media_start",
    /// The carrier's machine detection says a machine answered the call we placed (detail:
    /// `greeting` while it plays, `greeting_ended` when the carrier heard it end): the
    /// conversation stops and the voicemail message waits for the greeting's end.
    MachineDetected = "machine_detected",
    /// A machine's beep ended (detail: `freq_hz=… length_ms=…`), heard in the caller's audio.
    Beep = "beep",
    /// The voicemail message started (detail: `cue=beep|carrier|silence|no_greeting|timeout
    /// waited_ms=…`, what let it go and how long after the machine was detected).
    VoicemailMessage = "voicemail_message",
    /// The caller pressed a key (detail: the key).
    Dtmf = "dtmf",
    /// Caller keys over the keypad's rate limit were not acted on (detail: how many so far;
    /// noted at 1, 10, 100, …).
    DtmfDropped = "dtmf_dropped",
    /// The carrier said the stream stopped.
    CarrierStop = "carrier_stop",
    /// The carrier played everything up to a mark (detail: the mark name).
    MarkPlayed = "mark_played",
    /// A mark that was withdrawn because its audio was cleared before it played.
    MarkWithdrawn = "mark_withdrawn",
    /// A mark whose audio the carrier dropped on `clear`.
    MarkCleared = "mark_cleared",
    /// The caller sent audio faster than real time: the media pump dropped frames beyond the
    /// pace (detail: `frames_dropped=N`, the socket's total so far; noted at the first, at
    /// powers of two from 1,024 and when a sustained flood ends the call).
    CallerAudioPaced = "caller_audio_paced",
    /// The speech-to-text session is open.
    SttConnected = "stt_connected",
    /// The speech-to-text session failed (detail: why).
    SttError = "stt_error",
    /// The speech-to-text session was reopened after a failure.
    SttReopen = "stt_reopen",
    /// Our voice activity detector heard the caller start speaking.
    SpeechStart = "speech_start",
    /// Our voice activity detector heard the caller stop speaking.
    SpeechEnd = "speech_end",
    /// The agent was stopped by caller speech (carrier `clear`, pacer paused).
    BargeInStop = "barge_in_stop",
    /// The barge-in was confirmed: the agent's turn is over.
    BargeInCommit = "barge_in_commit",
    /// The barge-in was not confirmed: the agent resumed from the last heard sentence.
    BargeInResume = "barge_in_resume",
    /// `Finalize` was sent to the STT because our detector was sure the caller stopped.
    FinalizeSent = "finalize_sent",
    /// The caller's turn ended (detail: how we knew and the silence observed).
    TurnEnd = "turn_end",
    /// A caller turn waits for the agent to finish (`barge_in = false`).
    TurnHeld = "turn_held",
    /// A transcript that matched what the agent was saying was dropped as echo.
    EchoIgnored = "echo_ignored",
    /// The caller's audio carries an echo of the agent's: its path was found or lost
    /// (detail: `delay_ms=… gain_db=…`, or `lost`). Echoed audio does not stop the agent.
    EchoPath = "echo_path",
    /// A short acknowledgement over the agent ("mm-hmm") was dropped.
    BackchannelIgnored = "backchannel_ignored",
    /// A turn was sent to the brain (detail: the turn number).
    LlmRequest = "llm_request",
    /// The brain finished its reply.
    LlmDone = "llm_done",
    /// A fallback chain switched provider (detail: `llm FROM -> TO: why`).
    ProviderSwitch = "provider_switch",
    /// The speech-to-text's eager end of turn started the brain speculatively (detail: the
    /// text); its reply is held back until the turn really ends.
    SpeculationStart = "speculation_start",
    /// The speculative reply was cancelled (detail: `turn_resumed` or `text_changed`); none
    /// of it was spoken.
    SpeculationCancelled = "speculation_cancelled",
    /// The turn ended as speculated: the speculative reply is the answer.
    SpeculationUsed = "speculation_used",
    /// The brain failed (detail: why); the caller hears `llm_error_message`.
    LlmError = "llm_error",
    /// The brain was unavailable before any of the reply (no connection, a cut stream,
    /// 429/502/503): the turn is asked again (detail: `attempt=N in_ms=WAIT: why`).
    LlmRetry = "llm_retry",
    /// The brain has answered nothing for `brain_down_hangup_s`: the call ends with
    /// `brain_down_message` (detail: `down_ms=…`).
    BrainDown = "brain_down",
    /// The brain reported tool progress (detail: the tool's label).
    ToolProgress = "tool_progress",
    /// The in-call model called a tool (detail: JSON `turn`, `id`, `name`, `arguments`).
    ToolCall = "tool_call",
    /// A tool finished (detail: JSON `turn`, `id`, `name`, `ok`, `content` — what the model
    /// was told).
    ToolResult = "tool_result",
    /// The first frame of the reply after a tool result went out (detail: µs since the
    /// model's tool call arrived).
    ToolReplyFirstFrame = "tool_reply_first_frame",
    /// A sentence of the agent's reply was heard by the caller (detail: the sentence).
    Heard = "heard",
    /// The agent's reply was cut short (detail: `clear` when audio had to be dropped).
    Interrupted = "interrupted",
    /// The filler was spoken while the brain was slow (detail: why).
    Filler = "filler",
    /// Text-to-speech failed (detail: why).
    TtsError = "tts_error",
    /// A sentence's first audio byte arrived (detail: the `[tts.NAME]` and µs since its
    /// request): the "TTS request → first audio byte" stage.
    TtsFirstByte = "tts_first_byte",
    /// The TTS chain gave a sentence to its next TTS (detail: `from -> to: why`).
    TtsFallback = "tts_fallback",
    /// The first frame of the greeting went out (detail: µs since the stream started).
    GreetingFirstFrame = "greeting_first_frame",
    /// The first frame of a reply went out (detail: µs since the caller's turn ended).
    ReplyFirstFrame = "reply_first_frame",
    /// The first frame of a filler or apology went out before any reply (detail: µs).
    FirstFrameOfTurn = "first_frame_of_turn",
    /// The caller was silent; a nudge was spoken (detail: the nudge's number).
    IdleNudge = "idle_nudge",
    /// The caller stayed silent; the goodbye was spoken.
    IdleGoodbye = "idle_goodbye",
    /// The goodbye ended; the call is hung up.
    IdleHangUp = "idle_hang_up",
    /// The agent, an operator or the daemon hung the call up (detail: why).
    HangUp = "hang_up",
    /// The call ended (detail: the [`EndReason`]).
    CallEnd = "call_end",
    /// The agent asked to end the call (detail: its reason); the current sentence finishes.
    EndCall = "end_call",
    /// A transfer was allowed: the handoff line plays, then the carrier is asked (detail: the
    /// destination, masked).
    TransferStart = "transfer_start",
    /// The carrier accepted the transfer (detail: the destination, masked).
    Transferred = "transferred",
    /// The carrier refused or failed the transfer (detail: why); the call goes on.
    TransferFailed = "transfer_failed",
    /// The agent sent DTMF (detail: the digits and how: `command`, `in_band` or `failed`).
    DtmfOut = "dtmf_out",
    /// An action was refused by policy before reaching the carrier (detail: action: why).
    ActionRefused = "action_refused",
    // -- Stage latencies (metrics and the timeline page): detail µs.
    /// The brain's first token of a turn arrived (detail: µs since the request).
    LlmFirstToken = "llm_first_token",
    /// A synthesis' first audio arrived (detail: µs since the TTS request).
    TtsFirstAudio = "tts_first_audio",
    /// The STT chain moved the call to its next STT (detail: `reason: from -> to: why`, the
    /// reason `open_failed`, `open_timeout` or `dropped`).
    SttSwitched = "stt_switched",
    /// The end-of-turn model judged a pause (detail: `complete p=0.912 pause=3 infer_us=27000`,
    /// `incomplete …`, `unavailable queue_full …`, `timeout pause=3`; ` ignored` when the
    /// answer came after the caller went on).
    TurnModel = "turn_model",
    /// Caller speech over the agent reached `barge_in_hold_ms`: no new agent audio is sent
    /// (no `clear`; the carrier plays on what it has) until the stop or the end of the burst.
    BargeInHold = "barge_in_hold",
    /// The hold ended without a stop (detail: `burst_ended`, `backchannel`, `too_long` or
    /// `agent_done`, and `after_ms=`): the agent's audio is sent on, the caller heard no cut.
    BargeInHoldReleased = "barge_in_hold_released",
}

impl EventKind {
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

/// What an event says: typed where something reads it (the metrics), free text otherwise.
/// Its [`Display`](fmt::Display) is the text the timeline stores and serves
/// ([`CallEvent::detail`](super::transcript::CallEvent::detail)), so readers take the typed
/// payload and never parse the text back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventDetail {
    /// Free text (often empty).
    Text(String),
    /// A stage latency in µs (`llm_first_token`, `tts_first_audio`, the first-frame kinds);
    /// stored as the decimal number.
    Micros(u64),
    /// The STT chain moved the call on (`stt_switched`); stored as `reason: from -> to: why`.
    SttSwitched {
        reason: SttSwitchReason,
        /// The `[stt.NAME]` left.
        from: String,
        /// The `[stt.NAME]` now serving.
        to: String,
        /// Why `from` was left.
        message: String,
    },
}

impl EventDetail {
    /// The stored and served text.
    pub(crate) fn to_text(&self) -> String {
        self.to_string()
    }

    /// The latency, for a [`EventDetail::Micros`].
    pub fn micros(&self) -> Option<u64> {
        match self {
            EventDetail::Micros(us) => Some(*us),
            _ => None,
        }
    }
}

impl fmt::Display for EventDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventDetail::Text(t) => f.write_str(t),
            EventDetail::Micros(us) => write!(f, "{us}"),
            EventDetail::SttSwitched {
                reason,
                from,
                to,
                message,
            } => write!(f, "{reason}: {from} -> {to}: {message}"),
        }
    }
}

impl From<String> for EventDetail {
    fn from(t: String) -> Self {
        EventDetail::Text(t)
    }
}

impl From<&str> for EventDetail {
    fn from(t: &str) -> Self {
        EventDetail::Text(t.to_string())
    }
}

impl From<std::borrow::Cow<'_, str>> for EventDetail {
    fn from(t: std::borrow::Cow<'_, str>) -> Self {
        EventDetail::Text(t.into_owned())
    }
}

impl From<&String> for EventDetail {
    fn from(t: &String) -> Self {
        EventDetail::Text(t.clone())
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
    /// The brain answered nothing for `brain_down_hangup_s`; the agent said goodbye.
    BrainDown,
    /// A machine answered the call we placed and the voicemail message was left.
    VoicemailLeft,
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
            EndReason::BrainDown => "the brain was unavailable",
            EndReason::VoicemailLeft => "voicemail left",
            EndReason::HungUp(why) => return Cow::Owned(format!("hung up: {why}")),
            EndReason::Transferred(to) => return Cow::Owned(format!("transferred to {to}")),
        })
    }

    /// The text for a log line: like [`EndReason::text`] with phone numbers masked.
    pub(crate) fn log_text(&self) -> std::borrow::Cow<'static, str> {
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

    /// Each stored name is its variant's name in snake_case (a typo in the list fails here).
    #[test]
    fn every_name_is_its_variant_in_snake_case() {
        for k in EventKind::ALL {
            let mut snake = String::new();
            for (i, c) in format!("{k:?}").chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(c.to_ascii_lowercase());
            }
            assert_eq!(k.as_str(), snake);
        }
    }

    #[test]
    fn typed_details_keep_their_stored_text() {
        assert_eq!(EventDetail::Micros(2_000_000).to_text(), "2000000");
        assert_eq!(EventDetail::from("slow").to_text(), "slow");
        assert_eq!(EventDetail::from("").to_text(), "");
        let switched = EventDetail::SttSwitched {
            reason: SttSwitchReason::OpenTimeout,
            from: "a".into(),
            to: "b".into(),
            message: "no answer in 200 ms".into(),
        };
        assert_eq!(
            switched.to_text(),
            "open_timeout: a -> b: no answer in 200 ms"
        );
        assert_eq!(switched.micros(), None);
        assert_eq!(EventDetail::Micros(7).micros(), Some(7));
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
