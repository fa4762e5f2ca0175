//! In-memory providers: a speech-to-text that transcribes each burst of caller speech with the
//! next line of a script, a brain that answers from a script, and a text-to-speech that speaks
//! at a fixed rate. They run on tokio's clock and talk to nobody, so a whole call runs on the
//! paused clock (`call::driver`), deterministic and independent of machine load. Each records
//! what it was asked. Never built from a configuration.
//!
//! The speech-to-text behaves as a streaming recogniser with server-side endpointing does
//! (Deepgram's shape): `SpeechStarted` at a burst's onset, an interim every 300 ms of speech
//! that grows word by word, a `speech_final` final after `endpointing_ms` of silence, an
//! `UtteranceEnd` after `utterance_end_ms`, and a final `from_finalize` when asked to flush.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{
    ChatMessage, ChatTurn, LlmEvent, LlmProvider, LlmStream, SttContext, SttEvent, SttInput,
    SttProvider, SttStream, TtsEvent, TtsProvider, TtsStream, WordTiming,
};
use crate::audio::g711::ulaw_to_linear;
use crate::util::TaskGuard;

/// Mean absolute sample above which a 20 ms frame counts as speech.
const SPEECH_LEVEL: f64 = 1000.0;
/// An interim result per this much speech.
const INTERIM_EVERY_MS: u64 = 300;
/// Capacity of every in-memory stream.
const QUEUE: usize = 256;

/// A shared list, locked briefly (a poisoned lock still holds good data).
#[derive(Debug, Default)]
struct Shared<T>(Mutex<T>);

impl<T> Shared<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

// ---------------------------------------------------------------- speech to text

/// A recogniser that hears bursts of speech by their level and transcribes each with the next
/// line of its script (empty when the script has run out).
#[derive(Debug, Clone)]
pub(crate) struct ScriptedStt {
    script: Arc<Shared<VecDeque<String>>>,
    sessions: Arc<Shared<u64>>,
    /// `speech_final` finals sent, over all sessions.
    finals: Arc<Shared<u64>>,
    endpointing_ms: u64,
    utterance_end_ms: u64,
}

impl ScriptedStt {
    /// A recogniser with `endpointing_ms` of server-side endpointing and a 1 s `UtteranceEnd`.
    pub(crate) fn new(script: &[&str], endpointing_ms: u64) -> Self {
        Self {
            script: Arc::new(Shared(Mutex::new(
                script.iter().map(|s| s.to_string()).collect(),
            ))),
            sessions: Arc::default(),
            finals: Arc::default(),
            endpointing_ms,
            utterance_end_ms: 1000,
        }
    }

    /// `speech_final` finals (segments ended by the recogniser's endpointing) sent so far.
    pub(crate) fn finals(&self) -> u64 {
        self.finals.with(|n| *n)
    }
}

impl SttProvider for ScriptedStt {
    fn open(&self, _ctx: &SttContext) -> SttStream {
        self.sessions.with(|n| *n += 1);
        let (input, mut audio) = mpsc::channel(QUEUE);
        let (events, rx) = mpsc::channel(QUEUE);
        let mut ears = Ears {
            script: self.script.clone(),
            finals: self.finals.clone(),
            endpointing_ms: self.endpointing_ms,
            utterance_end_ms: self.utterance_end_ms,
            ..Ears::default()
        };
        let task = tokio::spawn(async move {
            let mut out = vec![SttEvent::Connected];
            loop {
                for ev in out.drain(..) {
                    if events.send(ev).await.is_err() {
                        return;
                    }
                }
                match audio.recv().await {
                    Some(SttInput::Audio(frame)) => ears.hear(&frame, &mut out),
                    Some(SttInput::Finalize) => out.push(ears.finalize(false, true)),
                    Some(SttInput::Close) | None => {
                        if ears.heard {
                            let _ = events.send(ears.finalize(false, false)).await;
                        }
                        let _ = events.send(SttEvent::Closed).await;
                        return;
                    }
                }
            }
        });
        SttStream {
            input,
            events: rx,
            guard: TaskGuard::new(task),
        }
    }

    fn endpointing_ms(&self) -> u64 {
        self.endpointing_ms
    }
}

/// One session's speech detector and transcript state.
#[derive(Debug, Default)]
struct Ears {
    script: Arc<Shared<VecDeque<String>>>,
    finals: Arc<Shared<u64>>,
    endpointing_ms: u64,
    utterance_end_ms: u64,
    in_speech: bool,
    /// Speech heard since the last final.
    heard: bool,
    speech_ms: u64,
    silence_ms: u64,
    utterance_end_due: bool,
    current: Option<String>,
}

impl Ears {
    fn hear(&mut self, frame: &[u8], out: &mut Vec<SttEvent>) {
        let ms = frame.len() as u64 / 8;
        let level = if frame.is_empty() {
            0.0
        } else {
            frame
                .iter()
                .map(|&b| f64::from(ulaw_to_linear(b)).abs())
                .sum::<f64>()
                / frame.len() as f64
        };
        if level > SPEECH_LEVEL {
            if !self.in_speech {
                self.in_speech = true;
                if !self.heard {
                    self.speech_ms = 0;
                }
                out.push(SttEvent::SpeechStarted);
            }
            if self.current.is_none() {
                self.current = Some(self.script.with(|q| q.pop_front()).unwrap_or_default());
            }
            self.heard = true;
            self.utterance_end_due = true;
            self.silence_ms = 0;
            let before = self.speech_ms / INTERIM_EVERY_MS;
            self.speech_ms += ms;
            let now = self.speech_ms / INTERIM_EVERY_MS;
            if now > before {
                let words: Vec<&str> = self
                    .current
                    .as_deref()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                let n = (now as usize).min(words.len());
                out.push(SttEvent::Interim(words[..n].join(" ")));
            }
        } else {
            self.silence_ms += ms;
            self.in_speech = false;
            if self.heard && self.endpointing_ms > 0 && self.silence_ms >= self.endpointing_ms {
                self.finals.with(|n| *n += 1);
                out.push(self.finalize(true, false));
            }
            if self.utterance_end_due && self.silence_ms >= self.utterance_end_ms {
                self.utterance_end_due = false;
                out.push(SttEvent::UtteranceEnd);
            }
        }
    }

    /// The final for what was heard since the last one (empty when nothing was).
    fn finalize(&mut self, speech_final: bool, from_finalize: bool) -> SttEvent {
        let text = if self.heard {
            self.current.take().unwrap_or_default()
        } else {
            String::new()
        };
        self.heard = false;
        self.in_speech = false;
        SttEvent::Final {
            text,
            speech_final,
            from_finalize,
        }
    }
}

// ---------------------------------------------------------------- the brain

/// One scripted answer of the brain.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    /// Streams `text` word by word, the first word after `first_token`.
    Text { text: String, first_token: Duration },
    /// Fails the turn after `after` (nothing is spoken from the error).
    Fail { message: String, after: Duration },
}

impl Answer {
    /// `text`, its first word after 100 ms.
    pub(crate) fn text(text: &str) -> Self {
        Self::Text {
            text: text.to_string(),
            first_token: Duration::from_millis(100),
        }
    }

    /// `text`, its first word after `ms`.
    pub(crate) fn after(ms: u64, text: &str) -> Self {
        Self::Text {
            text: text.to_string(),
            first_token: Duration::from_millis(ms),
        }
    }
}

/// A brain that answers each turn with the next [`Answer`] of its script (`"OK."` when the
/// script has run out) and records the history of every turn it was sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScriptedBrain {
    script: Arc<Shared<VecDeque<Answer>>>,
    turns: Arc<Shared<Vec<Vec<ChatMessage>>>>,
    seen: Arc<tokio::sync::Notify>,
    /// Down (restarting) until then: every request is refused at once, as a closed port
    /// refuses a connection, and the script is not used.
    down_until: Arc<Shared<Option<tokio::time::Instant>>>,
    /// Requests refused while down.
    refused: Arc<Shared<u64>>,
}

impl ScriptedBrain {
    pub(crate) fn new(script: Vec<Answer>) -> Self {
        Self {
            script: Arc::new(Shared(Mutex::new(script.into()))),
            ..Self::default()
        }
    }

    /// The brain goes down now for `d` (a restart): requests until then are refused.
    pub(crate) fn down_for(&self, d: Duration) {
        let until = tokio::time::Instant::now() + d;
        self.down_until.with(|u| *u = Some(until));
    }

    /// Requests refused while the brain was down.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.with(|r| *r)
    }

    /// The history each turn carried, in order.
    pub(crate) fn turns(&self) -> Vec<Vec<ChatMessage>> {
        self.turns.with(|t| t.clone())
    }

    /// The newest message of each turn (the caller's words).
    pub(crate) fn last_messages(&self) -> Vec<String> {
        self.turns.with(|t| {
            t.iter()
                .filter_map(|h| h.last().map(|m| m.content.clone()))
                .collect()
        })
    }

    /// Waits until at least `n` turns have reached the brain.
    pub(crate) async fn wait_turns(&self, n: usize) {
        loop {
            let seen = self.seen.notified();
            if self.turns.with(|t| t.len()) >= n {
                return;
            }
            seen.await;
        }
    }
}

impl LlmProvider for ScriptedBrain {
    fn stream(&self, turn: ChatTurn) -> LlmStream {
        let down = self
            .down_until
            .with(|u| u.is_some_and(|t| tokio::time::Instant::now() < t));
        if down {
            self.refused.with(|r| *r += 1);
            let (tx, events) = mpsc::channel(QUEUE);
            let task = tokio::spawn(async move {
                let _ = tx
                    .send(LlmEvent::Unavailable {
                        message: "request failed: connection refused".into(),
                        retry_after: None,
                    })
                    .await;
            });
            return LlmStream {
                events,
                guard: TaskGuard::new(task),
            };
        }
        self.turns.with(|t| t.push(turn.history));
        self.seen.notify_waiters();
        let answer = self
            .script
            .with(|q| q.pop_front())
            .unwrap_or_else(|| Answer::after(0, "OK."));
        let (tx, events) = mpsc::channel(QUEUE);
        let task = tokio::spawn(async move {
            match answer {
                Answer::Text { text, first_token } => {
                    tokio::time::sleep(first_token).await;
                    for (i, word) in text.split_inclusive(' ').enumerate() {
                        if i > 0 {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if tx.send(LlmEvent::Delta(word.to_string())).await.is_err() {
                            return;
                        }
                    }
                    let _ = tx.send(LlmEvent::Done).await;
                }
                Answer::Fail { message, after } => {
                    tokio::time::sleep(after).await;
                    let _ = tx.send(LlmEvent::Error(message)).await;
                }
            }
        });
        LlmStream {
            events,
            guard: TaskGuard::new(task),
        }
    }
}

// ---------------------------------------------------------------- text to speech

/// A voice that speaks any text at `ms_per_char` (a loop of `voice`, μ-law 8 kHz), its first
/// audio after `first_audio`, in 100 ms chunks, with word timings; records what it was asked
/// to say.
#[derive(Debug, Clone)]
pub(crate) struct MeteredTts {
    voice: Bytes,
    ms_per_char: u64,
    first_audio: Duration,
    spoken: Arc<Shared<Vec<String>>>,
}

impl MeteredTts {
    pub(crate) fn new(voice: Vec<u8>, ms_per_char: u64, first_audio: Duration) -> Self {
        let voice = if voice.is_empty() {
            // A steady tone, loud enough for any detector, when no recording is given.
            (0..800u32)
                .map(|i| if i % 16 < 8 { 0x20 } else { 0xA0 })
                .collect()
        } else {
            voice
        };
        Self {
            voice: Bytes::from(voice),
            ms_per_char,
            first_audio,
            spoken: Arc::default(),
        }
    }

    /// Every text it was asked to speak, in order.
    pub(crate) fn spoken(&self) -> Vec<String> {
        self.spoken.with(|s| s.clone())
    }

    /// The length of `text`'s audio.
    pub(crate) fn duration_ms(&self, text: &str) -> u64 {
        (text.chars().count() as u64 * self.ms_per_char).max(20)
    }

    /// Each word's place in `text`'s audio, by its characters.
    fn words(&self, text: &str) -> Vec<WordTiming> {
        let mut out = Vec::new();
        let mut at = 0u64;
        for piece in text.split_inclusive(' ') {
            let len = piece.chars().count() as u64 * self.ms_per_char;
            let word = piece.trim();
            if !word.is_empty() {
                let end = at + word.chars().count() as u64 * self.ms_per_char;
                out.push(WordTiming {
                    word: word.to_string(),
                    start_ms: at as u32,
                    end_ms: end as u32,
                });
            }
            at += len;
        }
        out
    }
}

impl TtsProvider for MeteredTts {
    fn synthesize(&self, text: &str) -> TtsStream {
        self.spoken.with(|s| s.push(text.to_string()));
        let bytes = self.duration_ms(text) as usize * 8;
        let voice = self.voice.clone();
        let first = self.first_audio;
        let words = self.words(text);
        TtsStream::spawn(move |tx| async move {
            tokio::time::sleep(first).await;
            let mut sent = 0;
            let mut words = Some(words);
            while sent < bytes {
                let n = (bytes - sent).min(800);
                let chunk: Vec<u8> = (sent..sent + n).map(|i| voice[i % voice.len()]).collect();
                sent += n;
                if tx.send(TtsEvent::Audio(Bytes::from(chunk))).await.is_err() {
                    return Ok(());
                }
                if let Some(w) = words.take() {
                    let _ = tx.send(TtsEvent::Words(w)).await;
                }
            }
            let _ = tx.send(TtsEvent::Done).await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn speech(ms: usize) -> Bytes {
        // μ-law 0x10 decodes to a large negative sample: well above the speech level.
        Bytes::from(vec![0x10; ms * 8])
    }

    fn silence(ms: usize) -> Bytes {
        Bytes::from(vec![0xFF; ms * 8])
    }

    #[tokio::test(start_paused = true)]
    async fn each_burst_gets_the_next_line_and_ends_after_the_endpointing() {
        let stt = ScriptedStt::new(&["one two three", "four"], 300);
        let mut s = stt.open(&SttContext::default());
        assert_eq!(s.events.recv().await, Some(SttEvent::Connected));
        for _ in 0..35 {
            s.input.send(SttInput::Audio(speech(20))).await.unwrap();
        }
        for _ in 0..20 {
            s.input.send(SttInput::Audio(silence(20))).await.unwrap();
        }
        s.input.send(SttInput::Audio(speech(20))).await.unwrap();
        s.input.send(SttInput::Finalize).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 6 {
            got.push(s.events.recv().await.unwrap());
        }
        assert_eq!(
            got,
            vec![
                SttEvent::SpeechStarted,
                SttEvent::Interim("one".into()),
                SttEvent::Interim("one two".into()),
                SttEvent::Final {
                    text: "one two three".into(),
                    speech_final: true,
                    from_finalize: false
                },
                SttEvent::SpeechStarted,
                SttEvent::Final {
                    text: "four".into(),
                    speech_final: false,
                    from_finalize: true
                },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_brain_answers_in_order_and_records_each_turn() {
        let brain = ScriptedBrain::new(vec![Answer::after(500, "Hello there.")]);
        let turn = |text: &str| ChatTurn {
            call_id: "c".into(),
            caller: None,
            system_prompt: String::new(),
            history: vec![ChatMessage {
                role: super::super::Role::User,
                content: text.into(),
            }],
            history_limits: Default::default(),
            tools: None,
            call_token: None,
            trace: None,
        };
        let started = tokio::time::Instant::now();
        let mut a = brain.stream(turn("hi"));
        assert_eq!(
            a.events.recv().await,
            Some(LlmEvent::Delta("Hello ".into()))
        );
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(
            a.events.recv().await,
            Some(LlmEvent::Delta("there.".into()))
        );
        assert_eq!(a.events.recv().await, Some(LlmEvent::Done));
        let mut b = brain.stream(turn("again"));
        assert_eq!(b.events.recv().await, Some(LlmEvent::Delta("OK.".into())));
        assert_eq!(brain.last_messages(), vec!["hi", "again"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_voice_speaks_at_its_rate_with_word_timings() {
        let tts = MeteredTts::new(Vec::new(), 50, Duration::from_millis(200));
        let mut s = tts.synthesize("Hi you");
        let mut audio = 0;
        let mut words = None;
        while let Some(ev) = s.events.recv().await {
            match ev {
                TtsEvent::Audio(a) => audio += a.len(),
                TtsEvent::Words(w) => words = Some(w),
                TtsEvent::Done => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(audio, 6 * 50 * 8);
        let words = words.expect("word timings");
        assert_eq!(words.len(), 2);
        assert_eq!((words[1].start_ms, words[1].end_ms), (150, 300));
        assert_eq!(tts.spoken(), vec!["Hi you"]);
    }
}
