//! Helpers every carrier's routes share: reading form fields and headers, and the decision
//! on a call we placed when the carrier says it was answered (a machine gets the voicemail
//! message and the call ends, a person gets the media stream), with the outcome recorded.

use tracing::info;

use super::outbound::{OutboundCall, Outcome, StatusUpdate};
use super::port::Host;

/// The non-empty, trimmed value of form field `name`.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The value of form field `name`, or `""`.
pub fn field_or_empty<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// A request header as a string.
pub fn header(headers: &hyper::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What to answer a carrier that says a call we placed was picked up.
pub enum Answer {
    /// Not a live outbound call of ours: hang up.
    NotOurs,
    /// A machine, with machine detection asked for: speak the message (if any) and hang up.
    Voicemail(Option<String>),
    /// Connect the media stream with this token.
    Connect(String),
}

/// Decides on an answered outbound call and records the outcome. `machine` is the carrier's
/// verdict; `answered_by(machine, call)` what to record as who answered.
pub fn answer_outbound(
    host: &dyn Host,
    call_id: &str,
    machine: bool,
    answered_by: impl FnOnce(bool, &OutboundCall) -> Option<String>,
) -> Answer {
    let (Some(_), Some(call)) = (
        host.live_call_account(call_id),
        host.outbound().live(call_id),
    ) else {
        return Answer::NotOurs;
    };
    if machine && call.machine_detection {
        info!(call_id, "outbound call reached a machine");
        host.report(StatusUpdate::outcome(
            call_id,
            Outcome::Voicemail,
            answered_by(true, &call),
        ));
        host.end_call(call_id, "voicemail");
        return Answer::Voicemail(call.voicemail_message);
    }
    host.report(StatusUpdate::outcome(
        call_id,
        Outcome::Answered,
        answered_by(false, &call),
    ));
    host.outbound()
        .set_phase(call_id, super::outbound::Phase::Connected);
    Answer::Connect(host.mint_token(call_id))
}
