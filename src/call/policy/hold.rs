//! The barge-in hold: the short pause before stopping the agent that filters coughs, clicks,
//! laughs and backchannels without an audible cut. At `barge_in_hold_ms` of voiced caller audio
//! over agent audio the mouth stops sending new frames (no `clear`: the carrier plays on the up
//! to one second it already has, so the caller hears nothing different); at
//! `barge_in_min_speech_ms` with voiced audio dominating the run the agent is stopped as before
//! (carrier `clear`, mouth paused). A burst that ends first, a backchannel final or a hold that
//! lasts too long without enough voicing releases the hold: sending goes on, nothing was cut.
//! The speech-to-text's words, when they come during the run ([`Heard`]), decide before the
//! duration does: a word that is neither a backchannel nor the agent's own words stops the
//! agent at once; backchannels or echo so far keep the hold (no stop on duration) until the
//! burst ends or the hold lasts too long.
//! A run with no pitch in it (`audio::pitch`: a cough, a click, breath) never stops the agent
//! on its duration; its words still can. Voiced audio the agent's own echo explains
//! (`audio::echo`) does not count towards the duration either.
//! Pure: [`Burst::judge`] turns the voiced run, its pitch, the words and the time into a
//! [`Verdict`].

use std::time::Duration;

use tokio::time::Instant;

use crate::call::turn::{Words, words};

/// Longest hold without a stop before sending goes on (the carrier's buffer is about a second;
/// `hold_max_ms` may make it shorter).
pub(crate) const HOLD_MAX: Duration = Duration::from_millis(600);

/// Share of the run's audio time (percent) that must be voiced for the stop: a laugh or a
/// string of clicks accumulates voiced audio with gaps between. Audio time, not wall time:
/// caller audio that reaches the actor late on a busy machine must not look gappy.
pub(crate) const VOICED_SHARE_PCT: u64 = 60;

/// Pitched audio (`audio::pitch`) a run needs before its duration can stop the agent: a
/// cough, a click or a breath is noise-like and has none; a spoken word's vowels have it
/// from its first syllable.
pub(crate) const PITCHED_MIN_MS: u64 = 40;

/// What to do about the current voiced run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing to do.
    Nothing,
    /// Start holding (stop sending new agent audio).
    Hold,
    /// Go on holding.
    Keep,
    /// Release the hold: send on (why).
    Release(&'static str),
    /// Stop the agent (carrier `clear`, mouth paused).
    Stop,
}

/// What the speech-to-text has recognised of the caller during the current run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Heard {
    /// No words yet: the voiced duration decides.
    #[default]
    Nothing,
    /// Only backchannels ("mm hmm", "yeah"): not a reason to stop.
    Backchannel,
    /// The agent's own words coming back: not a reason to stop.
    Echo,
    /// A word that is neither: the caller is saying something.
    Words,
}

impl Heard {
    /// Classifies the caller's text `caller` against what the agent is saying (`agent`): echo
    /// by [`Words::is_echo`] (two words or more); a single word the agent's text has too is
    /// not evidence either way ([`Heard::Nothing`]).
    pub(super) fn of(classes: &Words, caller: &str, agent: &str) -> Heard {
        let heard = words(caller);
        if heard.is_empty() {
            return Heard::Nothing;
        }
        if classes.content_words(caller) == 0 {
            return Heard::Backchannel;
        }
        if heard.len() < 2 {
            // One word the agent is saying too ("hello" over "Hello, how can I help?") may be
            // either: the duration decides.
            let said = words(agent);
            if heard.iter().all(|w| said.contains(w)) {
                return Heard::Nothing;
            }
            return Heard::Words;
        }
        if classes.is_echo(caller, agent) {
            Heard::Echo
        } else {
            Heard::Words
        }
    }
}

/// The caller's current speech run as the detector measured it, in audio time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Run {
    /// Voiced audio in the run (0: not speaking).
    pub(crate) voiced_ms: u64,
    /// Audio since the run's onset, voiced and gaps.
    pub(crate) span_ms: u64,
    /// Voiced audio with a pitch (`audio::pitch`), not counting echo.
    pub(crate) pitched_ms: u64,
    /// Voiced audio the agent's own echo explains (`audio::echo`): not the caller's.
    pub(crate) echo_ms: u64,
}

impl Run {
    /// The caller's own voiced audio: the run's, less what the agent's echo explains.
    pub(crate) fn own_ms(&self) -> u64 {
        self.voiced_ms.saturating_sub(self.echo_ms)
    }
}

/// The current voiced run of caller audio over agent audio, as the hold sees it.
#[derive(Debug, Default)]
pub(super) struct Burst {
    /// When the run started (its first report less its voiced audio).
    run_start: Option<Instant>,
    /// When the hold started.
    held_at: Option<Instant>,
    /// This run released a hold for good (a backchannel, too long): no hold or stop until it ends.
    spent: bool,
    /// The speech-to-text's words during this run.
    heard: Heard,
}

impl Burst {
    /// True while holding.
    pub(crate) fn held_at(&self) -> Option<Instant> {
        self.held_at
    }

    /// Wall time since the run started (0 without a run).
    pub(crate) fn run_ms(&self, now: Instant) -> u64 {
        self.run_start
            .map(|t| now.saturating_duration_since(t).as_millis() as u64)
            .unwrap_or(0)
    }

    /// The speech-to-text's words changed; kept only during a run (words that come between
    /// runs belong to the one that ended).
    pub(crate) fn set_heard(&mut self, heard: Heard) {
        if self.run_start.is_some() {
            self.heard = heard;
        }
    }

    /// True when this run released a hold for good (backchannels, or too long).
    pub(crate) fn is_spent(&self) -> bool {
        self.spent
    }

    /// What the speech-to-text said during the run.
    pub(super) fn heard(&self) -> Heard {
        self.heard
    }

    /// The hold was released (`spent`: for the rest of this run) or became a stop.
    pub(crate) fn end_hold(&mut self, spent: bool) {
        self.held_at = None;
        self.spent |= spent;
    }

    /// The agent resumed after a stop this run caused: its duration has been judged, so it
    /// does not hold or stop the agent again (a detector that never turns off would stop it
    /// every `barge_in_confirm_ms`); a real word in it still does. Nothing when no run is
    /// going on.
    pub(crate) fn spend_run(&mut self) {
        if self.run_start.is_some() {
            self.spent = true;
        }
    }

    /// When the hold in progress must be released at the latest.
    pub(crate) fn release_at(&self, limit: Duration) -> Option<Instant> {
        self.held_at.map(|at| at + limit)
    }

    /// Judges the speech run `run` at `now`; `hold_ms` starts the hold (0: no hold, the
    /// duration alone stops), `stop_ms` stops the agent, `limit` is the longest hold.
    pub(super) fn judge(
        &mut self,
        run: Run,
        now: Instant,
        (hold_ms, stop_ms): (u64, u64),
        limit: Duration,
    ) -> Verdict {
        let run_ms = run.voiced_ms;
        if run_ms == 0 {
            if self.run_start.take().is_some() {
                self.heard = Heard::Nothing;
            }
            self.spent = false;
            return match self.held_at {
                Some(_) => Verdict::Release("burst_ended"),
                None => Verdict::Nothing,
            };
        }
        self.run_start.get_or_insert_with(|| {
            now.checked_sub(Duration::from_millis(run_ms))
                .unwrap_or(now)
        });
        if self.spent {
            return Verdict::Nothing;
        }
        // Echo is not the caller: the duration rules count the caller's own voice only.
        let own_ms = run.own_ms();
        if hold_ms == 0 || hold_ms >= stop_ms {
            // No hold: the stop as it always was.
            return if own_ms >= stop_ms {
                Verdict::Stop
            } else {
                Verdict::Nothing
            };
        }
        let stop = match self.heard {
            // Words decide once the caller's own voice is long enough to hold.
            Heard::Words => own_ms >= hold_ms,
            // No words yet: the duration, with voiced audio dominating the run and a pitch in
            // it (a voice, not a cough).
            Heard::Nothing => {
                own_ms >= stop_ms
                    && run_ms * 100 >= VOICED_SHARE_PCT * run.span_ms
                    && run.pitched_ms >= PITCHED_MIN_MS
            }
            // Backchannels or echo so far: hold until the burst ends or lasts too long.
            Heard::Backchannel | Heard::Echo => false,
        };
        if stop {
            // The stop ends the hold (`end_hold`), knowing when it began.
            return Verdict::Stop;
        }
        match self.held_at {
            Some(at) if now.saturating_duration_since(at) >= limit => Verdict::Release("too_long"),
            Some(_) => Verdict::Keep,
            None if own_ms >= hold_ms => {
                self.held_at = Some(now);
                Verdict::Hold
            }
            None => Verdict::Nothing,
        }
    }
}
