//! Turn-taking decisions, kept pure so they can be tested without a call: the [`Endpointer`]
//! decides when the caller's turn is over by combining our voice-activity detector's silence
//! with the speech-to-text's signals (`speech_final`, `UtteranceEnd`, the answer to our
//! `Finalize`) inside per-agent `min_endpointing_ms` / `max_endpointing_ms` bounds, and
//! [`Words`] tells real words from backchannels ("mm-hmm") and the agent's own voice coming
//! back as echo. The conversation policy ([`super::policy`]) feeds them events and acts on what
//! they return.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

/// Lower-case words of `text` without punctuation; hyphenated words are split ("mm-hmm" →
/// "mm", "hmm") so spellings of a backchannel compare equal.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == '-')
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric() || *c == '\'')
                .flat_map(char::to_lowercase)
                .collect::<String>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Word classes for barge-in.
pub struct Words {
    backchannel: HashSet<String>,
}

impl Words {
    pub fn new(backchannels: &[String]) -> Self {
        Self {
            backchannel: backchannels.iter().flat_map(|b| words(b)).collect(),
        }
    }

    /// Words of `text` that are not backchannels.
    pub(crate) fn content_words(&self, text: &str) -> usize {
        words(text)
            .iter()
            .filter(|w| !self.backchannel.contains(w.as_str()))
            .count()
    }

    /// True when `caller` looks like the agent's own words (`agent`, what it is saying now)
    /// coming back through the phone: at least two words, and at least 70 % of them in the
    /// agent's text.
    pub(crate) fn is_echo(&self, caller: &str, agent: &str) -> bool {
        let heard = words(caller);
        if heard.len() < 2 {
            return false;
        }
        let said: HashSet<String> = words(agent).into_iter().collect();
        let matching = heard.iter().filter(|w| said.contains(w.as_str())).count();
        matching * 10 >= heard.len() * 7
    }
}

mod ending;
#[cfg(test)]
pub(crate) use ending::looks_unfinished;
pub(crate) use ending::{Ending, NumberShapes};

/// How we knew the caller's turn was over. Its name is the first word of a `turn_end` event's
/// detail (`"speech_final silence_ms=300"`); `Dtmf` turns have no `turn_end` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// The speech-to-text said the utterance ended after its own endpointing silence.
    SpeechFinal,
    /// The speech-to-text's `UtteranceEnd` (a gap between words).
    UtteranceEnd,
    /// The answer to the `Finalize` we sent when our detector was sure.
    Finalize,
    /// `max_endpointing_ms` of silence passed: committed with whatever text there is.
    MaxEndpointing,
    /// The speech-to-text ended the utterance and heard no new words for
    /// `stt_eou_override_ms` while our detector still said speech (background talkers,
    /// noise): the speech-to-text's end wins.
    SttEouOverride,
    /// The speech-to-text's own turn model said the turn ended (Deepgram Flux `EndOfTurn`).
    SttEndOfTurn,
    /// The caller pressed a key: a turn of its own, never an interruption to judge.
    Dtmf,
    /// The end-of-turn model said the turn is complete and the speech-to-text's end signal
    /// did not come within the grace ([`super::eot`]).
    TurnModel,
    /// The caller's real words had stopped the agent and more were still coming when
    /// `hold_max_ms` ran out: the turn is taken rather than leave the agent silent.
    HoldMax,
}

impl TurnEnd {
    /// The name stored in `turn_end` event details.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEnd::SpeechFinal => "speech_final",
            TurnEnd::UtteranceEnd => "utterance_end",
            TurnEnd::Finalize => "finalize",
            TurnEnd::MaxEndpointing => "max_endpointing",
            TurnEnd::SttEouOverride => "stt_eou_override",
            TurnEnd::SttEndOfTurn => "end_of_turn",
            TurnEnd::Dtmf => "dtmf",
            TurnEnd::TurnModel => "turn_model",
            TurnEnd::HoldMax => "hold_max",
        }
    }
}

impl std::fmt::Display for TurnEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the endpointer wants.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Not yet; ask again at this time (or on the next event).
    Wait(Option<Instant>),
    /// Our detector is sure the caller stopped: ask the speech-to-text to finalize now.
    Finalize,
    /// The turn is over.
    Commit {
        text: String,
        reason: TurnEnd,
        /// Silence between the end of the caller's speech and this decision.
        silence_ms: u64,
    },
}

/// How long words of a committed interim are owed a final: a final that comes later is a new
/// segment's (the speech-to-text session was reopened, say).
const OWED_FOR: Duration = Duration::from_secs(5);
/// A turn's first words arriving this long after our detector went quiet were not in that
/// voice (a speech-to-text's words come well within it): the silence is counted from them.
const STALE_QUIET: Duration = Duration::from_millis(800);

/// End-of-turn state for the caller's current turn.
pub(crate) struct Endpointer {
    min: Duration,
    max: Duration,
    /// Silence after a phrase that looks unfinished before the turn may end (min..=max).
    unfinished_hold: Duration,
    /// The whole numbers a number read in groups may make (its shapes: [`ending::ending`]).
    shapes: NumberShapes,
    /// Our detector's speech this long after the speech-to-text's end of utterance (with no
    /// new words since) does not keep the turn open; `None`: no bound.
    stt_eou_override: Option<Duration>,
    /// Silence the speech-to-text has already waited for when it says `speech_final`.
    stt_endpointing: Duration,
    finals: String,
    interim: String,
    /// The speech-to-text said the utterance ended (and how: `SpeechFinal`, `UtteranceEnd`
    /// or `Finalize`), and when. New words or voice after it disarm it.
    stt_done: Option<TurnEnd>,
    stt_done_at: Option<Instant>,
    /// Words of an interim a committed turn took before their final came: the first that many
    /// words of the segment's next final (and of its interims) belong to that turn, not this
    /// one. Kept across resets, forgotten after [`OWED_FOR`].
    owed: usize,
    owed_at: Option<Instant>,
    finalize_sent: bool,
    speaking: bool,
    /// When the caller's speech last ended (our detector), or when text last arrived.
    quiet_since: Option<Instant>,
    /// When this turn's speech began.
    started: Option<Instant>,
}

impl Endpointer {
    pub(crate) fn new(min_ms: u64, max_ms: u64) -> Self {
        Self {
            min: Duration::from_millis(min_ms),
            max: Duration::from_millis(max_ms.max(min_ms)),
            unfinished_hold: Duration::from_millis(max_ms.max(min_ms)),
            shapes: NumberShapes::default(),
            stt_eou_override: None,
            stt_endpointing: Duration::ZERO,
            finals: String::new(),
            interim: String::new(),
            stt_done: None,
            stt_done_at: None,
            owed: 0,
            owed_at: None,
            finalize_sent: false,
            speaking: false,
            quiet_since: None,
            started: None,
        }
    }

    /// The speech-to-text's own endpointing silence: a `speech_final` proves at least that
    /// much silence, even when our detector saw the speech end later.
    pub(crate) fn with_stt_endpointing(mut self, ms: u64) -> Self {
        self.stt_endpointing = Duration::from_millis(ms);
        self
    }

    /// How long after the speech-to-text's end of utterance our detector's "still speaking"
    /// keeps the turn open (0: for as long as it says so).
    pub(crate) fn with_stt_eou_override(mut self, ms: u64) -> Self {
        self.stt_eou_override = (ms > 0).then(|| Duration::from_millis(ms));
        self
    }

    /// The silence that ends a turn whose text looks unfinished (kept within min..=max).
    pub(crate) fn with_unfinished_hold(mut self, ms: u64) -> Self {
        self.unfinished_hold = Duration::from_millis(ms).clamp(self.min, self.max);
        self
    }

    /// The whole numbers a number read to the agent may make (a number short of them holds
    /// the turn up to the maximum).
    pub(crate) fn with_number_shapes(mut self, shapes: NumberShapes) -> Self {
        self.shapes = shapes;
        self
    }

    /// How the caller's words so far end ([`ending::ending`]).
    pub(crate) fn ending(&self) -> Ending {
        ending::ending(&self.text(), &self.shapes)
    }

    /// How `text` ends, by this endpointer's number shapes.
    pub(crate) fn ending_of(&self, text: &str) -> Ending {
        ending::ending(text, &self.shapes)
    }

    /// The silence a pause ending so must last before the turn may end: the minimum, the
    /// unfinished-word hold, or (a number or an address under way) the maximum.
    pub(crate) fn hold_for(&self, ending: Ending) -> Duration {
        match ending {
            Ending::Complete => self.min,
            Ending::Unfinished => self.unfinished_hold,
            Ending::Digits | Ending::Address => self.max,
        }
    }

    /// Forgets the speech-to-text's end of utterance: the caller went on after it.
    fn disarm(&mut self) {
        self.stt_done = None;
        self.stt_done_at = None;
    }

    fn arm(&mut self, reason: TurnEnd, now: Instant) {
        self.stt_done = Some(reason);
        self.stt_done_at = Some(now);
    }

    /// `text` without the words a committed turn already took (see `owed`); `last` says the
    /// segment ends here (a final), after which nothing is owed.
    fn unowed(&mut self, text: &str, last: bool, now: Instant) -> String {
        if self
            .owed_at
            .is_some_and(|t| now.saturating_duration_since(t) > OWED_FOR)
        {
            self.owed = 0;
        }
        let skip = self.owed;
        if last {
            self.owed = 0;
            self.owed_at = None;
        }
        if skip == 0 {
            return text.trim().to_string();
        }
        text.split_whitespace()
            .skip(skip)
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(crate) fn on_speech_start(&mut self, at: Instant) {
        self.speaking = true;
        self.started.get_or_insert(at);
        // Whatever the speech-to-text concluded before, the caller is talking again.
        self.stt_done = None;
        self.finalize_sent = false;
    }

    pub(crate) fn on_speech_end(&mut self, last_voiced: Instant) {
        self.speaking = false;
        self.quiet_since = Some(last_voiced);
        // Voice after the speech-to-text's end of utterance (while our detector bridged the
        // pause): that end does not cover it, whatever the speech-to-text says next will.
        if self.stt_done_at.is_some_and(|t| last_voiced > t) {
            self.disarm();
        }
    }

    pub(crate) fn on_interim(&mut self, text: &str, now: Instant) {
        let text = self.unowed(text, false, now);
        let text = text.as_str();
        if !text.is_empty() {
            if !self.has_text()
                && !self.speaking
                && self
                    .quiet_since
                    .is_some_and(|q| now.saturating_duration_since(q) > STALE_QUIET)
            {
                // The turn's first words, long after our detector last heard voice (a cough,
                // the agent's echo, or a start it missed): that silence came before them.
                self.quiet_since = Some(now);
                self.started = Some(now);
            }
            self.started.get_or_insert(now);
            // New words after the speech-to-text's end of utterance: the caller went on.
            self.disarm();
            if !self.speaking && self.quiet_since.is_none() {
                self.quiet_since = Some(now);
            }
        }
        self.interim = text.to_string();
    }

    pub(crate) fn on_final(
        &mut self,
        text: &str,
        speech_final: bool,
        from_finalize: bool,
        now: Instant,
    ) {
        let owed = self.owed > 0;
        let text = self.unowed(text, true, now);
        let text = text.as_str();
        if owed && text.is_empty() {
            // The final of words a committed turn already took: nothing new, and its end of
            // utterance ended that turn, not this one.
            return;
        }
        if !text.is_empty() {
            if !speech_final && !from_finalize {
                // Words the speech-to-text has not seen the end of.
                self.disarm();
            }
            self.started.get_or_insert(now);
            if !self.finals.is_empty() {
                self.finals.push(' ');
            }
            self.finals.push_str(text);
            if !self.speaking && self.quiet_since.is_none() {
                self.quiet_since = Some(now);
            }
        }
        self.interim.clear();
        if from_finalize {
            self.arm(TurnEnd::Finalize, now);
        } else if speech_final {
            self.arm(TurnEnd::SpeechFinal, now);
        }
    }

    pub(crate) fn on_utterance_end(&mut self, now: Instant) {
        if self.stt_done.is_none() {
            self.arm(TurnEnd::UtteranceEnd, now);
        }
    }

    /// Everything the caller has said this turn (finals, then the newest interim).
    pub(crate) fn text(&self) -> String {
        match (self.finals.is_empty(), self.interim.is_empty()) {
            (_, true) => self.finals.clone(),
            (true, false) => self.interim.clone(),
            (false, false) => format!("{} {}", self.finals, self.interim),
        }
    }

    pub(crate) fn has_text(&self) -> bool {
        !self.finals.is_empty() || !self.interim.is_empty()
    }

    /// When this turn's speech began.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.started
    }

    /// Forgets the turn (after a commit, or when it was only a backchannel); the settings,
    /// whether the caller is speaking and the words owed to a committed turn stay.
    pub(crate) fn reset(&mut self) {
        self.finals.clear();
        self.interim.clear();
        self.disarm();
        self.finalize_sent = false;
        self.quiet_since = None;
        self.started = None;
    }

    /// Commits the turn's text: words still only an interim are owed to it (their final, when
    /// it comes, is not a new turn).
    fn commit(&mut self, reason: TurnEnd, silence: Duration, now: Instant) -> Decision {
        let text = self.text();
        let interim_words = self.interim.split_whitespace().count();
        self.reset();
        if interim_words > 0 {
            self.owed = interim_words;
            self.owed_at = Some(now);
        }
        Decision::Commit {
            text,
            reason,
            silence_ms: silence.as_millis() as u64,
        }
    }

    pub(crate) fn decide(&mut self, now: Instant) -> Decision {
        if !self.has_text() {
            self.disarm();
            return Decision::Wait(None);
        }
        if self.speaking {
            // Our detector says speech; the speech-to-text's end of utterance wins after the
            // bound (it heard no words since, or it would have been disarmed).
            return match (self.stt_done, self.stt_done_at, self.stt_eou_override) {
                (Some(_), Some(at), Some(bound)) => {
                    let since = now.saturating_duration_since(at);
                    if since >= bound {
                        self.commit(TurnEnd::SttEouOverride, since, now)
                    } else {
                        Decision::Wait(Some(at + bound))
                    }
                }
                _ => Decision::Wait(None),
            };
        }
        let quiet = self.quiet_since.unwrap_or(now);
        let mut silence = now.saturating_duration_since(quiet);
        if self.stt_done == Some(TurnEnd::SpeechFinal) {
            silence = silence.max(self.stt_endpointing);
        }
        if silence >= self.max {
            return self.commit(TurnEnd::MaxEndpointing, silence, now);
        }
        // A phrase that cannot end here needs a longer pause to end the turn: the
        // unfinished-word hold, or the maximum for a number or an address under way.
        let min = self.hold_for(self.ending());
        if let Some(reason) = self.stt_done
            && silence >= min
        {
            return self.commit(reason, silence, now);
        }
        if silence >= min && !self.finalize_sent && self.stt_done.is_none() {
            self.finalize_sent = true;
            return Decision::Finalize;
        }
        let next = if silence < min {
            quiet + min
        } else {
            quiet + self.max
        };
        Decision::Wait(Some(next))
    }
}

/// Hooks for the end-of-turn model gate (`policy/eot.rs`), which decides around
/// [`Endpointer::decide`] while a model judges the pause.
impl Endpointer {
    pub(crate) fn is_speaking(&self) -> bool {
        self.speaking
    }

    /// When the caller's speech last ended (or text last arrived in silence).
    pub(crate) fn quiet_since(&self) -> Option<Instant> {
        self.quiet_since
    }

    /// How the speech-to-text ended the utterance, if it did.
    pub(crate) fn stt_done(&self) -> Option<TurnEnd> {
        self.stt_done
    }

    /// Whether a `Finalize` should be sent now (none sent yet and the speech-to-text has not
    /// ended the utterance); marks it sent.
    pub(crate) fn take_finalize(&mut self) -> bool {
        if self.finalize_sent || self.stt_done.is_some() {
            return false;
        }
        self.finalize_sent = true;
        true
    }

    /// Commits the turn now whatever the silence (`reason` says why); words still only an
    /// interim are owed to it, as at any commit.
    pub(crate) fn commit_forced(&mut self, reason: TurnEnd, now: Instant) -> Decision {
        let silence = match (self.speaking, self.quiet_since) {
            (false, Some(q)) => now.saturating_duration_since(q),
            _ => Duration::ZERO,
        };
        self.commit(reason, silence, now)
    }

    /// Commits the turn now: the model judged it complete. The reason is the speech-to-text's
    /// end signal if it came, else [`TurnEnd::TurnModel`].
    pub(crate) fn commit_now(&mut self, now: Instant) -> Decision {
        let silence = self
            .quiet_since
            .map_or(Duration::ZERO, |q| now.saturating_duration_since(q));
        let reason = self.stt_done.unwrap_or(TurnEnd::TurnModel);
        let text = self.text();
        self.reset();
        Decision::Commit {
            text,
            reason,
            silence_ms: silence.as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests;
