//! What the agent says, for the [`Policy`]: the brain's reply streamed into sentences (each a
//! mouth utterance and part of one transcript entry), the apology when the brain fails, the
//! long-turn filler (slow brain or tool progress), idle nudges and the goodbye, the settled
//! reply joining history, and the first-frame latencies when the pacer starts an utterance.

use std::time::Duration;

use tokio::time::Instant;

use super::{Action, GOODBYE_GRACE, Phase, Policy};
use crate::call::event::{EventDetail, EventKind};
use crate::call::mouth::{Mouth, TtsNote, UttKind};
use crate::call::transcript::{Speaker, TranscriptEntry};
use crate::provider::chunker::speakable;
use crate::provider::{ChatMessage, LlmEvent, Role, TtsEvent};

impl Policy {
    pub(super) fn filler_deadline(&self, mouth: &Mouth) -> Option<Instant> {
        let turn = self.turn.as_ref()?;
        if turn.filler_done || turn.audio_started || self.agent.long_turn_message.is_empty() {
            return None;
        }
        if !self.brain && !mouth.is_speaking() {
            return None;
        }
        let after = Duration::from_secs_f64(self.agent.long_turn_message_after_s.max(0.0));
        Some(turn.ended_at + after)
    }

    /// The caller has been silent too long: nudge, or say goodbye.
    pub(super) fn idle(&mut self, now: Instant, mouth: &mut Mouth) {
        self.last_activity = now;
        let agent = self.agent.clone();
        if self.nudges < agent.idle_max_nudges {
            self.nudges += 1;
            self.event(EventKind::IdleNudge, self.nudges.to_string());
            self.enqueue(UttKind::Idle, &agent.idle_nudge_message, now, mouth);
            self.history.push(ChatMessage {
                role: Role::Assistant,
                content: agent.idle_nudge_message.clone(),
            });
        } else {
            self.event(EventKind::IdleGoodbye, "");
            self.phase = Phase::Goodbye {
                until: now + GOODBYE_GRACE,
            };
            self.enqueue(UttKind::Idle, &agent.idle_goodbye_message, now, mouth);
        }
    }

    /// The previous reply was not interrupted: it goes into history whole.
    pub(super) fn settle_turn(&mut self) {
        if let Some(turn) = self.turn.take()
            && !turn.reply_text.trim().is_empty()
        {
            self.history.push(ChatMessage {
                role: Role::Assistant,
                content: turn.reply_text,
            });
        }
    }

    pub(super) fn on_llm(&mut self, ev: LlmEvent, now: Instant, mouth: &mut Mouth) {
        match ev {
            LlmEvent::Delta(text) => {
                self.brain_answered();
                self.reply_streamed();
                if let Some(t) = self.turn.as_mut() {
                    t.reply_text.push_str(&text);
                }
                for sentence in self.chunker.push(&text) {
                    self.reply_sentence(&sentence, now, mouth);
                }
            }
            LlmEvent::Switched { from, to, reason } => {
                self.event(
                    EventKind::ProviderSwitch,
                    format!("llm {from} -> {to}: {reason}"),
                );
            }
            // Counted by the actor (the call's usage), not a conversational input.
            LlmEvent::Usage(_) => {}
            LlmEvent::ToolProgress(label) => {
                self.brain_answered();
                self.reply_streamed();
                self.event(EventKind::ToolProgress, label);
                self.filler("tool", now, mouth);
            }
            LlmEvent::ToolCall(call) => {
                self.brain_answered();
                self.reply_streamed();
                self.flush_reply(now, mouth);
                let turn_no = self.turn.as_ref().map_or(0, |t| t.id);
                if let Some(t) = self.turn.as_mut() {
                    t.tools.called_at = Some(now);
                }
                let detail = serde_json::json!({
                    "turn": turn_no, "id": call.id, "name": call.name, "arguments": call.arguments,
                });
                self.event(EventKind::ToolCall, detail.to_string());
                // Text the model said before the call already covers the wait.
                if self.turn.as_ref().is_some_and(|t| t.entry.is_none()) {
                    self.filler("tool", now, mouth);
                }
            }
            LlmEvent::ToolResult {
                id,
                name,
                ok,
                content,
            } => {
                self.reply_streamed();
                let turn_no = self.turn.as_ref().map_or(0, |t| t.id);
                if let Some(t) = self.turn.as_mut() {
                    t.tools.result_in = true;
                }
                let detail = serde_json::json!({
                    "turn": turn_no, "id": id, "name": name, "ok": ok, "content": content,
                });
                self.event(EventKind::ToolResult, detail.to_string());
            }
            LlmEvent::Say(text) => {
                self.reply_streamed();
                self.flush_reply(now, mouth);
                if let Some(t) = self.turn.as_mut() {
                    // A spoken announcement stands in for the long-turn filler.
                    t.filler_done = true;
                    if !t.reply_text.is_empty() {
                        t.reply_text.push(' ');
                    }
                    t.reply_text.push_str(&text);
                }
                self.reply_sentence(&text, now, mouth);
            }
            LlmEvent::Done => {
                self.brain_answered();
                self.brain = false;
                self.out.push(Action::CancelBrain);
                if let Some(rest) = self.chunker.finish() {
                    self.reply_sentence(&rest, now, mouth);
                }
                // The reply joins history when the next caller turn settles it (whole), or
                // when it is interrupted (what was heard).
                self.event(EventKind::LlmDone, "");
            }
            LlmEvent::Error(message) => self.brain_failed(message, now, mouth),
            LlmEvent::Unavailable {
                message,
                retry_after,
            } => self.brain_unavailable(message, retry_after, now, mouth),
        }
    }

    /// The brain failed the turn for good: the apology (after what it had said), or, when it
    /// has been down for `brain_down_hangup_s`, the polite end of the call.
    pub(super) fn brain_failed(&mut self, message: String, now: Instant, mouth: &mut Mouth) {
        self.brain = false;
        self.out.push(Action::CancelBrain);
        self.event(EventKind::LlmError, message);
        if self.brain_down_ends_call(now, mouth) {
            return;
        }
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let turn_id = turn.id;
        if turn.entry.is_none() && !turn.audio_started {
            mouth.drop_unstarted(|k| matches!(k, UttKind::Filler { .. }));
            let msg = self.agent.llm_error_message.clone();
            if !msg.trim().is_empty() {
                self.enqueue(UttKind::Error { turn: turn_id }, &msg, now, mouth);
                self.history.push(ChatMessage {
                    role: Role::Assistant,
                    content: msg,
                });
            }
        } else {
            // The brain failed mid-reply: say what it had said, then the apology, so
            // the caller is not left in silence after half a sentence.
            if let Some(rest) = self.chunker.finish() {
                self.reply_sentence(&rest, now, mouth);
            }
            let msg = self.agent.llm_error_message.clone();
            if !msg.trim().is_empty() {
                self.enqueue(UttKind::Error { turn: turn_id }, &msg, now, mouth);
                if let Some(t) = self.turn.as_mut() {
                    t.reply_text.push(' ');
                    t.reply_text.push_str(&msg);
                }
            }
        }
    }

    /// Speaks what the chunker holds (text the model streamed before a tool call).
    fn flush_reply(&mut self, now: Instant, mouth: &mut Mouth) {
        if let Some(rest) = self.chunker.finish() {
            self.reply_sentence(&rest, now, mouth);
        }
    }

    pub(super) fn reply_sentence(&mut self, sentence: &str, now: Instant, mouth: &mut Mouth) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let turn_id = turn.id;
        let text = speakable(sentence);
        if text.is_empty() {
            return;
        }
        let entry = match turn.entry {
            Some(i) => {
                if let Some(e) = self.transcript.get_mut(i) {
                    e.text.push(' ');
                    e.text.push_str(&text);
                }
                i
            }
            None => {
                let i = self.agent_entry(&text, now);
                if let Some(t) = self.turn.as_mut() {
                    t.entry = Some(i);
                }
                i
            }
        };
        let kind = UttKind::Reply { turn: turn_id };
        let utt = mouth.push(kind, text.clone(), entry);
        if let Some(t) = self.turn.as_mut()
            && t.tools.result_in
        {
            t.tools.result_in = false;
            t.tools.reply_utt = Some(utt);
        }
        self.speak(kind, text, mouth);
    }

    /// Starts a transcript entry for something the agent is about to say (nothing heard yet);
    /// returns its index.
    pub(super) fn agent_entry(&mut self, text: &str, now: Instant) -> usize {
        let at = self.answered_ms(now);
        self.transcript.push(TranscriptEntry {
            speaker: Speaker::Agent,
            text: text.to_string(),
            heard_text: String::new(),
            interrupted: false,
            start_ms: at,
            end_ms: at,
        });
        self.transcript.len() - 1
    }

    /// Speaks `text` as its own transcript entry (a filler goes before unstarted replies).
    pub(super) fn enqueue(&mut self, kind: UttKind, text: &str, now: Instant, mouth: &mut Mouth) {
        let text = speakable(text);
        if text.is_empty() {
            return;
        }
        let entry = self.agent_entry(&text, now);
        if matches!(kind, UttKind::Filler { .. }) {
            mouth.push_front_unstarted(kind, text.clone(), entry);
        } else {
            mouth.push(kind, text.clone(), entry);
        }
        self.speak(kind, text, mouth);
    }

    /// Speaks the long-turn filler once per turn, if no reply audio has gone out yet.
    pub(super) fn filler(&mut self, why: &str, now: Instant, mouth: &mut Mouth) {
        let Some(turn) = self.turn.as_mut() else {
            return;
        };
        if turn.filler_done || turn.audio_started {
            return;
        }
        turn.filler_done = true;
        let turn_id = turn.id;
        let msg = self.agent.long_turn_message.clone();
        if msg.trim().is_empty() {
            return;
        }
        self.event(EventKind::Filler, why);
        self.enqueue(UttKind::Filler { turn: turn_id }, &msg, now, mouth);
    }

    /// The pacer started sending these utterances: first-frame latencies.
    pub(super) fn on_started(&mut self, started: &[(u64, UttKind)], now: Instant) {
        for (id, _) in started {
            let Some(t) = self.turn.as_mut() else { break };
            if t.tools.reply_utt == Some(*id) {
                t.tools.reply_utt = None;
                let us = t
                    .tools
                    .called_at
                    .map_or(0, |c| now.saturating_duration_since(c).as_micros());
                self.event(
                    EventKind::ToolReplyFirstFrame,
                    EventDetail::Micros(us as u64),
                );
            }
        }
        for (_, kind) in started {
            match *kind {
                UttKind::Greeting if !self.greeting_sent => {
                    self.greeting_sent = true;
                    let us = self
                        .answered
                        .map(|a| now.saturating_duration_since(a).as_micros())
                        .unwrap_or(0);
                    self.event(
                        EventKind::GreetingFirstFrame,
                        EventDetail::Micros(us as u64),
                    );
                }
                UttKind::Reply { turn } | UttKind::Filler { turn } | UttKind::Error { turn } => {
                    let is_reply = matches!(kind, UttKind::Reply { .. });
                    if let Some(t) = self.turn.as_mut().filter(|t| t.id == turn)
                        && !t.audio_started
                    {
                        t.audio_started = true;
                        let us = now.saturating_duration_since(t.ended_at).as_micros();
                        let kind = if is_reply {
                            EventKind::ReplyFirstFrame
                        } else {
                            EventKind::FirstFrameOfTurn
                        };
                        self.event(kind, EventDetail::Micros(us as u64));
                        self.out.push(Action::ReplyLatency(us as u64));
                    }
                }
                _ => {}
            }
        }
    }

    /// A synthesis event: into the mouth, its note on the timeline, and the next synthesis
    /// the mouth wants asked for.
    pub(super) fn on_synthesis(&mut self, id: u64, event: Option<TtsEvent>, mouth: &mut Mouth) {
        match mouth.on_tts(id, event) {
            Some(TtsNote::Failed(_, err)) => self.event(EventKind::TtsError, err),
            Some(TtsNote::FirstByte { provider, after }) => self.event(
                EventKind::TtsFirstByte,
                format!("{provider} {}", after.as_micros()),
            ),
            Some(TtsNote::Switched { from, to, reason }) => {
                self.event(EventKind::TtsFallback, format!("{from} -> {to}: {reason}"))
            }
            None => {}
        }
        self.synthesize(mouth);
    }

    /// Asks for the synthesis the mouth wants now (bounded concurrency).
    fn synthesize(&mut self, mouth: &mut Mouth) {
        for (id, text) in mouth.take_synthesis() {
            self.out.push(Action::Synthesize { id, text });
        }
    }

    /// Queues [`Action::Speak`] for an utterance just queued on the mouth, after asking for
    /// the synthesis it wants.
    pub(super) fn speak(&mut self, kind: UttKind, text: String, mouth: &mut Mouth) {
        self.synthesize(mouth);
        self.out.push(Action::Speak { kind, text });
    }
}
