//! Actions an agent takes on its own call — hang up, transfer, send DTMF, say something — and
//! what came of them. Both the in-call brain's tools and the MCP / REST control surface ask for
//! them through [`super::CallHandle::act`]; the call's actor carries them out (it alone knows
//! what is being said and owns the media stream through which the carrier is reached), so the
//! same policies (allow-lists, digit checks) apply whoever asks.

/// One action on a live call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallAction {
    /// Finish the sentence being spoken, then hang up.
    EndCall { reason: String },
    /// Speak the agent's handoff line, then cold-transfer the caller to `to`.
    Transfer { to: String },
    /// Send these DTMF digits to the other party.
    SendDtmf { digits: String },
    /// Speak this text (queued after what is already being said).
    Say { text: String },
}

/// What came of a [`CallAction`]; its text is what the model (or API client) is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionOutcome {
    /// Done (or accepted and under way); `detail` says what happened.
    Done { detail: String },
    /// Refused by policy before anything reached the carrier; `reason` says why.
    Refused { reason: String },
    /// Allowed, but the carrier or the call could not do it.
    Failed { reason: String },
}

impl ActionOutcome {
    /// The sentence the model or API client is told.
    pub fn message(&self) -> &str {
        match self {
            Self::Done { detail } => detail,
            Self::Refused { reason } | Self::Failed { reason } => reason,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done { .. })
    }
}
