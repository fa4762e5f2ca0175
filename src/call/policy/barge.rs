//! Barge-in and interruption, for the [`Policy`]: the hold at the onset of caller speech over
//! agent audio and the stop (stage one, judged by [`hold`](super::hold)), the caller's words
//! confirming or dismissing it (stage two), the resume after a false alarm, and the
//! interruption that ends the agent's turn for good, keeping in history only what the caller
//! heard (the cut at the `clear`, `call::heard`). A real word over the agent stops it wherever
//! it comes: during the hold, after a hold that gave up, once its short burst has ended, or as
//! a turn of fewer than `barge_in_min_words` words (kept for the rest of the interruption).
//! The agent's own words are judged against its reply so far, not only what is playing: a
//! recogniser's words come a delay after the audio, and the echo with them.

use tokio::time::Instant;

use super::*;

impl Policy {
    /// Stage one of barge-in: a short hold at the onset of caller speech over agent audio (no
    /// new audio sent, no `clear`; see `policy/hold.rs`), then, when the speech goes on, the
    /// stop (carrier `clear`, mouth paused) keeping everything unheard for a resume.
    pub(super) fn check_barge_in(&mut self, run: hold::Run, now: Instant, mouth: &mut Mouth) {
        let run_ms = run.voiced_ms;
        if self.burst.held_at().is_some() && !mouth.is_held() {
            // Stopped or cleared by something else meanwhile.
            self.burst.end_hold(false);
        }
        if !self.barge_in_eligible(now, mouth) {
            if self.burst.held_at().is_some() {
                self.release_hold("agent_done", now, mouth);
            }
            if run_ms == 0 {
                self.burst
                    .judge(hold::Run::default(), now, (0, 0), hold::HOLD_MAX);
            }
            return;
        }
        let (hold_ms, stop_ms) = (
            self.agent.barge_in_hold_ms,
            self.agent.barge_in_min_speech_ms,
        );
        match self
            .burst
            .judge(run, now, (hold_ms, stop_ms), self.hold_limit())
        {
            hold::Verdict::Nothing | hold::Verdict::Keep => {}
            hold::Verdict::Hold => {
                mouth.hold();
                self.event(EventKind::BargeInHold, format!("speech_ms={run_ms}"));
            }
            hold::Verdict::Release(why) => self.release_hold(why, now, mouth),
            hold::Verdict::Stop => self.stop_agent(format!("speech_ms={run_ms}"), now, mouth),
        }
    }

    /// A turn over the busy agent with real words, but fewer than `barge_in_min_words`
    /// ("wait," before a pause, then "stop"): the rest of the interruption may follow the
    /// pause. Kept for the next words, and the agent, if still talking (the word came after
    /// its burst ended, so the hold could not hear it), is stopped as a real word during the
    /// hold stops it; the barge-in deadline resumes it if no more words come. A single word
    /// the agent is saying too is no evidence (echo or not): false, the caller drops it.
    pub(super) fn short_interruption(
        &mut self,
        text: &str,
        barge: bool,
        now: Instant,
        mouth: &mut Mouth,
    ) -> bool {
        if barge {
            if self.words.content_words(text) == 0 {
                return false;
            }
            self.event(EventKind::TurnHeld, format!("barge_in {text}"));
            self.barge_words = text.to_string();
            return true;
        }
        let stoppable = self.barge_in_eligible(now, mouth)
            && hold::Heard::of(&self.words, text, &self.agent_said_lately(mouth))
                == hold::Heard::Words;
        if !stoppable {
            return false;
        }
        self.event(EventKind::TurnHeld, format!("barge_in {text}"));
        self.barge_words = text.to_string();
        self.stop_agent(format!("words={text}"), now, mouth);
        true
    }

    /// What the caller may hear of the agent's own voice coming back: what is playing or
    /// queued, and the agent's last two transcript entries (the reply so far, the greeting).
    /// The recogniser's words come a delay after the audio, so the echo of a sentence that
    /// has finished playing since is still echo.
    pub(super) fn agent_said_lately(&self, mouth: &Mouth) -> String {
        let mut said = mouth.current_text();
        for e in self
            .transcript
            .iter()
            .rev()
            .filter(|e| e.speaker == Speaker::Agent)
            .take(2)
        {
            said.push(' ');
            said.push_str(&e.text);
        }
        said
    }

    /// Whether caller speech may stop the agent now: barge-in on, agent audio playing (not
    /// a greeting that may not be interrupted, not DTMF), no barge-in or goodbye under way.
    fn barge_in_eligible(&self, now: Instant, mouth: &Mouth) -> bool {
        let agent = &self.agent;
        agent.barge_in
            && self.voicemail.is_none()
            && !matches!(self.phase, Phase::BargeIn { .. } | Phase::Goodbye { .. })
            && mouth.is_playing(now)
            && (agent.greeting_interruptible || mouth.current_kind() != Some(UttKind::Greeting))
            && mouth.current_kind() != Some(UttKind::Dtmf)
    }

    /// The longest the barge-in hold lasts without a stop: 600 ms, or less under a shorter
    /// `hold_max_ms`.
    pub(super) fn hold_limit(&self) -> Duration {
        hold::HOLD_MAX.min(Duration::from_millis(self.agent.hold_max_ms))
    }

    /// Ends a barge-in hold without a stop: the mouth sends on (pump).
    pub(super) fn release_hold(&mut self, why: &str, now: Instant, mouth: &mut Mouth) {
        let at = self.burst.held_at().unwrap_or(now);
        self.burst.end_hold(why != "burst_ended");
        mouth.release();
        let ms = now.saturating_duration_since(at).as_millis();
        self.event(
            EventKind::BargeInHoldReleased,
            format!("{why} after_ms={ms}"),
        );
        self.out.push(Action::Resume);
    }

    /// The stop: carrier `clear`, mouth paused with everything unheard kept, then the words
    /// decide (stage two).
    /// `why` is the event's detail (`speech_ms=…`, or the words that stopped it).
    pub(super) fn stop_agent(&mut self, why: String, now: Instant, mouth: &mut Mouth) {
        // The agent's audio has been held back since the hold began (or from now).
        let held_from = self
            .burst
            .held_at()
            .filter(|_| mouth.is_held())
            .unwrap_or(now);
        self.burst.end_hold(false);
        let agent = &self.agent;
        let confirm = Duration::from_millis(agent.barge_in_confirm_ms);
        let bound = held_from + Duration::from_millis(agent.hold_max_ms);
        // What was heard is what had played when the `clear` goes out (the carrier drops the
        // rest then): the caller hears the agent until playback stops, not until they start.
        self.heard_cut = Some(heard::cut(&mouth.played_at(now)));
        let paused = mouth.pause(now);
        if paused.need_clear {
            self.out.push(Action::Clear);
        }
        for mark in paused.withdrawn {
            self.event(EventKind::MarkWithdrawn, mark);
        }
        self.phase = Phase::BargeIn {
            at: now,
            deadline: (now + confirm).min(bound),
            bound,
        };
        self.event(EventKind::BargeInStop, why);
        // Words may already be in (the STT can be faster than our detector).
        self.on_caller_words(now, mouth);
    }

    /// The caller's words changed: confirm a pending barge-in, then look for the end of turn.
    pub(super) fn on_caller_words(&mut self, now: Instant, mouth: &mut Mouth) {
        if self.endpointer.has_text() {
            self.last_activity = now;
        }
        if self.burst.run_ms(now) > 0 {
            let heard = hold::Heard::of(
                &self.words,
                &self.endpointer.text(),
                &self.agent_said_lately(mouth),
            );
            self.burst.set_heard(heard);
        }
        let holding = self.burst.held_at().is_some() && mouth.is_held();
        // A hold that lasted too long without a stop was released for the rest of the run;
        // a real word later in the same run still stops the agent.
        let released = self.burst.is_spent()
            && self.burst.run_ms(now) > 0
            && self.barge_in_eligible(now, mouth);
        if (holding || released) && self.burst.heard() == hold::Heard::Words {
            // A real word during the run stops the agent before (or without) the duration.
            let run_ms = self.burst.run_ms(now);
            self.stop_agent(format!("speech_ms={run_ms}"), now, mouth);
            return;
        }
        let agent = &self.agent;
        let hold_on =
            agent.barge_in_hold_ms > 0 && agent.barge_in_hold_ms < agent.barge_in_min_speech_ms;
        if hold_on && self.burst.run_ms(now) == 0 && self.barge_in_eligible(now, mouth) {
            // A short word ("wait,") is reported when it has been said, which is when its
            // burst ends: the hold never hears it. A real word over the agent stops it all
            // the same, without waiting for the end of the caller's turn.
            let text = self.endpointer.text();
            let heard = hold::Heard::of(&self.words, &text, &self.agent_said_lately(mouth));
            if heard == hold::Heard::Words {
                self.stop_agent(format!("words={text}"), now, mouth);
                return;
            }
        }
        if let Phase::BargeIn { at, .. } = self.phase {
            let text = join_words(&self.barge_words, &self.endpointer.text());
            let words = self.words.content_words(&text);
            if self.words.is_echo(&text, &self.agent_said_lately(mouth)) {
                // The agent's own voice: not an interruption; the deadline resumes it.
            } else if words >= self.agent.barge_in_min_words as usize {
                let ms = now.saturating_duration_since(at).as_millis();
                self.event(
                    EventKind::BargeInCommit,
                    format!("words={words} after_ms={ms}"),
                );
                self.interrupt(now, mouth);
            }
        }
        self.check_end_of_turn(now, mouth);
    }

    /// Stage two of barge-in, false alarm: play on from the last sentence the caller heard.
    pub(super) fn resume(&mut self, why: &str, now: Instant, mouth: &mut Mouth) {
        if let Phase::BargeIn { at, .. } = self.phase {
            self.heard_cut = None;
            self.barge_words.clear();
            mouth.resume();
            self.phase = Phase::Idle;
            self.refresh(mouth);
            // The run that stopped the agent has been judged: its duration does not stop it
            // again (only a real word in it would).
            self.burst.spend_run();
            let ms = now.saturating_duration_since(at).as_millis();
            self.event(EventKind::BargeInResume, format!("{why} after_ms={ms}"));
            self.out.push(Action::Resume);
        }
    }

    /// `hold_max_ms` ran out while the caller's real words ("wait,") had the agent stopped
    /// and more were coming: the agent's turn ends and the caller's is taken with the words
    /// there are (the rest, if any, makes the next turn).
    pub(super) fn take_barge_turn(&mut self, now: Instant, mouth: &mut Mouth) {
        let Decision::Commit {
            text, silence_ms, ..
        } = self.endpointer.commit_forced(TurnEnd::HoldMax, now)
        else {
            return;
        };
        self.eot_at = None;
        let ms = match self.phase {
            Phase::BargeIn { at, .. } => now.saturating_duration_since(at).as_millis(),
            _ => 0,
        };
        self.event(EventKind::BargeInCommit, format!("hold_max after_ms={ms}"));
        self.interrupt(now, mouth);
        self.event(
            EventKind::TurnEnd,
            format!("{} silence_ms={silence_ms}", TurnEnd::HoldMax),
        );
        self.caller_turn(text, TurnEnd::HoldMax, now, mouth);
    }

    /// Stops the agent for good: clear the carrier's queue, cancel the brain and the
    /// synthesis, and keep in history only what the caller heard.
    pub(super) fn interrupt(&mut self, now: Instant, mouth: &mut Mouth) {
        self.out.push(Action::CancelBrain);
        self.brain = false;
        // Stopped by barge-in: what was heard when it stopped; else what has played by now.
        let stored = self.heard_cut.take();
        let cut = match stored {
            Some(c) if matches!(self.phase, Phase::BargeIn { .. }) => c,
            _ => heard::cut(&mouth.played_at(now)),
        };
        if matches!(self.phase, Phase::BargeIn { .. }) {
            self.phase = Phase::Idle;
        }
        let cleared = mouth.clear(now);
        let need_clear = cleared.need_clear;
        if need_clear {
            self.out.push(Action::Clear);
        }
        for sent in cleared.unheard {
            self.event(EventKind::MarkCleared, sent.mark);
        }
        self.apply_heard_cut(&cut);
        self.refresh(mouth);
        if let Some(turn) = self.turn.take() {
            let heard = match turn.entry.and_then(|i| self.transcript.get_mut(i)) {
                Some(e) => {
                    e.interrupted = true;
                    Some(e.heard_text.clone())
                }
                None => None,
            };
            if let Some(i) = turn.entry {
                self.persist(i);
            }
            if let Some(heard) = heard {
                let said = turn
                    .entry
                    .and_then(|i| self.transcript.get(i))
                    .map_or(0, |e| e.text.split_whitespace().count());
                let detail = serde_json::json!({
                    "words": heard.split_whitespace().count(),
                    "of": said,
                    "precision": cut.precision.as_str(),
                    "text": heard,
                });
                self.event(EventKind::Heard, detail.to_string());
                if self.brain_keeps_history {
                    // The brain remembers its whole reply: tell it what actually got through.
                    self.brain_note = Some(if heard.is_empty() {
                        "[The caller interrupted you before hearing any of your last reply.]"
                            .to_string()
                    } else {
                        format!(
                            "[The caller interrupted you; of your last reply they heard only: \"{heard}\"]"
                        )
                    });
                }
                if !heard.is_empty() {
                    self.history.push(ChatMessage {
                        role: Role::Assistant,
                        content: format!("{heard} [interrupted by the caller]"),
                    });
                }
            }
        }
        self.event(
            EventKind::Interrupted,
            if need_clear { "clear" } else { "" },
        );
    }

    /// Extends the heard text of the entries an interruption cut by what the caller heard of
    /// their unconfirmed utterances ([`heard::cut`]).
    pub(super) fn apply_heard_cut(&mut self, cut: &heard::Cut) {
        for part in &cut.parts {
            if let Some(e) = self.transcript.get_mut(part.entry) {
                if !e.heard_text.is_empty() {
                    e.heard_text.push(' ');
                }
                e.heard_text.push_str(&part.text);
                self.out.push(Action::Persist(part.entry));
            }
        }
    }
}
