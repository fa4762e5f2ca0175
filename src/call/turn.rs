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
    pub fn content_words(&self, text: &str) -> usize {
        words(text)
            .iter()
            .filter(|w| !self.backchannel.contains(w.as_str()))
            .count()
    }

    /// True when `caller` looks like the agent's own words (`agent`, what it is saying now)
    /// coming back through the phone: at least two words, and at least 70 % of them in the
    /// agent's text.
    pub fn is_echo(&self, caller: &str, agent: &str) -> bool {
        let heard = words(caller);
        if heard.len() < 2 {
            return false;
        }
        let said: HashSet<String> = words(agent).into_iter().collect();
        let matching = heard.iter().filter(|w| said.contains(w.as_str())).count();
        matching * 10 >= heard.len() * 7
    }
}

/// Words after which a sentence is rarely over: a pause there waits up to the maximum.
const UNFINISHED: &[&str] = &[
    "and", "or", "but", "to", "the", "a", "an", "of", "for", "with", "so", "because", "um", "uh",
    "my", "is", "are", "was", "that", "in", "on", "at", "i",
];

/// True when `text` ends on a word that usually continues ("I need to…").
pub fn looks_unfinished(text: &str) -> bool {
    words(text)
        .last()
        .is_some_and(|w| UNFINISHED.contains(&w.as_str()))
}

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
    /// The speech-to-text's own turn model said the turn ended (Deepgram Flux `EndOfTurn`).
    SttEndOfTurn,
    /// The caller pressed a key: a turn of its own, never an interruption to judge.
    Dtmf,
    /// The end-of-turn model said the turn is complete and the speech-to-text's end signal
    /// did not come within the grace ([`super::eot`]).
    TurnModel,
}

impl TurnEnd {
    /// The name stored in `turn_end` event details.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEnd::SpeechFinal => "speech_final",
            TurnEnd::UtteranceEnd => "utterance_end",
            TurnEnd::Finalize => "finalize",
            TurnEnd::MaxEndpointing => "max_endpointing",
            TurnEnd::SttEndOfTurn => "end_of_turn",
            TurnEnd::Dtmf => "dtmf",
            TurnEnd::TurnModel => "turn_model",
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
pub enum Decision {
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

/// End-of-turn state for the caller's current turn.
pub struct Endpointer {
    min: Duration,
    max: Duration,
    /// Silence the speech-to-text has already waited for when it says `speech_final`.
    stt_endpointing: Duration,
    finals: String,
    interim: String,
    /// The speech-to-text said the utterance ended (and how: `SpeechFinal`, `UtteranceEnd`
    /// or `Finalize`).
    stt_done: Option<TurnEnd>,
    finalize_sent: bool,
    speaking: bool,
    /// When the caller's speech last ended (our detector), or when text last arrived.
    quiet_since: Option<Instant>,
    /// When this turn's speech began.
    started: Option<Instant>,
}

impl Endpointer {
    pub fn new(min_ms: u64, max_ms: u64) -> Self {
        Self {
            min: Duration::from_millis(min_ms),
            max: Duration::from_millis(max_ms.max(min_ms)),
            stt_endpointing: Duration::ZERO,
            finals: String::new(),
            interim: String::new(),
            stt_done: None,
            finalize_sent: false,
            speaking: false,
            quiet_since: None,
            started: None,
        }
    }

    /// The speech-to-text's own endpointing silence: a `speech_final` proves at least that
    /// much silence, even when our detector saw the speech end later.
    pub fn with_stt_endpointing(mut self, ms: u64) -> Self {
        self.stt_endpointing = Duration::from_millis(ms);
        self
    }

    pub fn on_speech_start(&mut self, at: Instant) {
        self.speaking = true;
        self.started.get_or_insert(at);
        // Whatever the speech-to-text concluded before, the caller is talking again.
        self.stt_done = None;
        self.finalize_sent = false;
    }

    pub fn on_speech_end(&mut self, last_voiced: Instant) {
        self.speaking = false;
        self.quiet_since = Some(last_voiced);
    }

    pub fn on_interim(&mut self, text: &str, now: Instant) {
        let text = text.trim();
        if !text.is_empty() {
            self.started.get_or_insert(now);
            if !self.speaking && self.quiet_since.is_none() {
                self.quiet_since = Some(now);
            }
        }
        self.interim = text.to_string();
    }

    pub fn on_final(&mut self, text: &str, speech_final: bool, from_finalize: bool, now: Instant) {
        let text = text.trim();
        if !text.is_empty() {
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
            self.stt_done = Some(TurnEnd::Finalize);
        } else if speech_final {
            self.stt_done = Some(TurnEnd::SpeechFinal);
        }
    }

    pub fn on_utterance_end(&mut self) {
        if self.stt_done.is_none() {
            self.stt_done = Some(TurnEnd::UtteranceEnd);
        }
    }

    /// Everything the caller has said this turn (finals, then the newest interim).
    pub fn text(&self) -> String {
        match (self.finals.is_empty(), self.interim.is_empty()) {
            (_, true) => self.finals.clone(),
            (true, false) => self.interim.clone(),
            (false, false) => format!("{} {}", self.finals, self.interim),
        }
    }

    pub fn has_text(&self) -> bool {
        !self.finals.is_empty() || !self.interim.is_empty()
    }

    /// When this turn's speech began.
    pub fn started(&self) -> Option<Instant> {
        self.started
    }

    /// Forgets the turn (after a commit, or when it was only a backchannel).
    pub fn reset(&mut self) {
        let speaking = self.speaking;
        let stt_endpointing = self.stt_endpointing;
        *self = Self::new(self.min.as_millis() as u64, self.max.as_millis() as u64);
        self.speaking = speaking;
        self.stt_endpointing = stt_endpointing;
    }

    pub fn decide(&mut self, now: Instant) -> Decision {
        if !self.has_text() {
            self.stt_done = None;
            return Decision::Wait(None);
        }
        if self.speaking {
            return Decision::Wait(None);
        }
        let quiet = self.quiet_since.unwrap_or(now);
        let mut silence = now.saturating_duration_since(quiet);
        if self.stt_done == Some(TurnEnd::SpeechFinal) {
            silence = silence.max(self.stt_endpointing);
        }
        let commit = |s: &mut Self, reason| {
            let text = s.text();
            s.reset();
            Decision::Commit {
                text,
                reason,
                silence_ms: silence.as_millis() as u64,
            }
        };
        if silence >= self.max {
            return commit(self, TurnEnd::MaxEndpointing);
        }
        let hold = looks_unfinished(&self.text());
        if let Some(reason) = self.stt_done
            && silence >= self.min
            && !hold
        {
            return commit(self, reason);
        }
        if silence >= self.min && !self.finalize_sent && !hold && self.stt_done.is_none() {
            self.finalize_sent = true;
            return Decision::Finalize;
        }
        let next = if silence < self.min && !hold {
            quiet + self.min
        } else {
            quiet + self.max
        };
        Decision::Wait(Some(next))
    }
}

/// Hooks for the end-of-turn model gate (`policy/eot.rs`), which decides around
/// [`Endpointer::decide`] while a model judges the pause.
impl Endpointer {
    pub fn is_speaking(&self) -> bool {
        self.speaking
    }

    /// When the caller's speech last ended (or text last arrived in silence).
    pub fn quiet_since(&self) -> Option<Instant> {
        self.quiet_since
    }

    /// How the speech-to-text ended the utterance, if it did.
    pub fn stt_done(&self) -> Option<TurnEnd> {
        self.stt_done
    }

    /// Whether a `Finalize` should be sent now (none sent yet and the speech-to-text has not
    /// ended the utterance); marks it sent.
    pub fn take_finalize(&mut self) -> bool {
        if self.finalize_sent || self.stt_done.is_some() {
            return false;
        }
        self.finalize_sent = true;
        true
    }

    /// Commits the turn now: the model judged it complete. The reason is the speech-to-text's
    /// end signal if it came, else [`TurnEnd::TurnModel`].
    pub fn commit_now(&mut self, now: Instant) -> Decision {
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
mod tests {
    use super::*;

    /// The caller speaks from `t0` until `end_ms`, then the STT's final `text`
    /// (`speech_final` as given) arrives at `final_ms`.
    fn spoke(
        e: &mut Endpointer,
        t0: Instant,
        end_ms: u64,
        text: &str,
        speech_final: bool,
        final_ms: u64,
    ) {
        e.on_speech_start(t0);
        e.on_speech_end(t0 + Duration::from_millis(end_ms));
        e.on_final(
            text,
            speech_final,
            false,
            t0 + Duration::from_millis(final_ms),
        );
    }

    fn bc() -> Words {
        Words::new(&crate::config::schema::default_backchannel_words())
    }

    #[test]
    fn backchannels_are_not_content() {
        let w = bc();
        assert_eq!(w.content_words("Mm-hmm."), 0);
        assert_eq!(w.content_words("mm hmm, yeah okay"), 0);
        assert_eq!(w.content_words("uh-huh"), 0);
        assert_eq!(w.content_words("wait, stop"), 2);
        assert_eq!(w.content_words("No, I meant Tuesday."), 4);
    }

    #[test]
    fn echo_matches_the_agents_current_words() {
        let w = bc();
        let agent = "We are open every day from noon until ten in the evening.";
        assert!(w.is_echo("open every day from noon", agent));
        assert!(!w.is_echo("no I meant Tuesday", agent));
        assert!(!w.is_echo("noon", agent), "one word is not enough");
    }

    #[test]
    fn unfinished_sentences_are_spotted() {
        assert!(looks_unfinished("I need to"));
        assert!(!looks_unfinished("move it to the afternoon."));
    }

    #[test]
    fn commits_on_speech_final_after_min_silence() {
        let t0 = Instant::now();
        let mut e = Endpointer::new(300, 3000);
        spoke(&mut e, t0, 1000, "book a table", true, 1100);
        assert_eq!(
            e.decide(t0 + Duration::from_millis(1100)),
            Decision::Wait(Some(t0 + Duration::from_millis(1300)))
        );
        match e.decide(t0 + Duration::from_millis(1300)) {
            Decision::Commit { text, reason, .. } => {
                assert_eq!(text, "book a table");
                assert_eq!(reason, TurnEnd::SpeechFinal);
            }
            d => panic!("{d:?}"),
        }
        assert!(!e.has_text());
    }

    #[test]
    fn speech_final_counts_the_stts_own_endpointing_silence() {
        let t0 = Instant::now();
        // Deepgram waited 300 ms of silence; our detector saw the speech end later.
        let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
        spoke(&mut e, t0, 1150, "book a table", true, 1300);
        match e.decide(t0 + Duration::from_millis(1300)) {
            Decision::Commit { reason, .. } => assert_eq!(reason, TurnEnd::SpeechFinal),
            d => panic!("{d:?}"),
        }
        // It survives the reset that follows a commit.
        e.on_speech_start(t0 + Duration::from_millis(2000));
        e.on_speech_end(t0 + Duration::from_millis(2150));
        e.on_final("again", true, false, t0 + Duration::from_millis(2300));
        assert!(matches!(
            e.decide(t0 + Duration::from_millis(2300)),
            Decision::Commit { .. }
        ));
        // A short provider endpointing does not lift the floor.
        let mut e = Endpointer::new(300, 3000).with_stt_endpointing(10);
        spoke(&mut e, t0, 1000, "book a table", true, 1020);
        assert!(matches!(
            e.decide(t0 + Duration::from_millis(1020)),
            Decision::Wait(Some(_))
        ));
        // Nor does it count for an utterance end, which proves no particular silence.
        let mut e = Endpointer::new(300, 3000).with_stt_endpointing(300);
        spoke(&mut e, t0, 1000, "book a table", false, 1010);
        e.on_utterance_end();
        assert!(matches!(
            e.decide(t0 + Duration::from_millis(1050)),
            Decision::Wait(Some(_))
        ));
    }

    #[test]
    fn finalizes_when_our_detector_is_sure_then_commits_on_the_answer() {
        let t0 = Instant::now();
        let mut e = Endpointer::new(300, 3000);
        e.on_speech_start(t0);
        e.on_interim("change the booking", t0 + Duration::from_millis(500));
        e.on_speech_end(t0 + Duration::from_millis(900));
        assert_eq!(
            e.decide(t0 + Duration::from_millis(1200)),
            Decision::Finalize
        );
        e.on_final(
            "change my booking",
            false,
            true,
            t0 + Duration::from_millis(1250),
        );
        assert!(matches!(
            e.decide(t0 + Duration::from_millis(1250)),
            Decision::Commit {
                reason: TurnEnd::Finalize,
                ..
            }
        ));
    }

    #[test]
    fn a_pause_after_an_unfinished_phrase_waits_and_speech_resumes_the_turn() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut e = Endpointer::new(300, 3000);
        e.on_speech_start(t0);
        e.on_speech_end(ms(600));
        e.on_final("I need to", true, false, ms(700));
        assert_eq!(e.decide(ms(1000)), Decision::Wait(Some(ms(3600))));
        e.on_speech_start(ms(1800));
        e.on_speech_end(ms(3000));
        e.on_final("move it to the afternoon", true, false, ms(3100));
        match e.decide(ms(3300)) {
            Decision::Commit { text, .. } => {
                assert_eq!(text, "I need to move it to the afternoon")
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn max_endpointing_commits_whatever_there_is() {
        let t0 = Instant::now();
        let mut e = Endpointer::new(300, 3000);
        e.on_interim("so I was", t0);
        assert!(matches!(
            e.decide(t0 + Duration::from_millis(3000)),
            Decision::Commit {
                reason: TurnEnd::MaxEndpointing,
                ..
            }
        ));
    }
}
