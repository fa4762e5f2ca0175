//! A word track: the ground truth of which words the caller's audio carries and when, shared
//! by a simulated media stream ([`crate::stream::SimCall::push_words`]) and the fake Deepgram
//! ([`crate::deepgram::FakeDeepgramConfig::words`]). The stream writes each word's start and
//! end in stream audio time (ms since its first media frame) as it queues the clip; a fake
//! Deepgram with a track transcribes from it like a real recogniser on the mixed audio: words
//! appear in interim results once they have been said, a final comes after `endpointing` ms
//! with no word, and noise, coughs or laughs (audio with no words in the track) give nothing.

use std::sync::Mutex;

/// One word of caller speech, in stream audio time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedWord {
    pub start_ms: u64,
    pub end_ms: u64,
    pub word: String,
}

/// The words of one call, in the order they are said (shared with [`std::sync::Arc`]).
#[derive(Debug, Default)]
pub struct WordTrack {
    words: Mutex<Vec<TimedWord>>,
}

impl WordTrack {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds words (absolute stream times); kept sorted by start.
    pub fn add(&self, words: impl IntoIterator<Item = TimedWord>) {
        if let Ok(mut w) = self.words.lock() {
            w.extend(words);
            w.sort_by_key(|w| w.start_ms);
        }
    }

    /// Every word so far.
    pub fn snapshot(&self) -> Vec<TimedWord> {
        self.words.lock().map(|w| w.clone()).unwrap_or_default()
    }
}

/// Spreads `text`'s words over the voiced spans of a clip, in proportion to their length:
/// `spans` are `(start_ms, end_ms)` within the clip (see [`voiced_spans`]). Times are relative
/// to the clip's first sample.
pub fn spread_words(text: &str, spans: &[(u64, u64)]) -> Vec<TimedWord> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let total_chars: u64 = words.iter().map(|w| w.len() as u64 + 1).sum();
    let voiced: u64 = spans.iter().map(|(a, b)| b - a).sum();
    if words.is_empty() || voiced == 0 {
        return Vec::new();
    }
    // Maps a position along the voiced time (0..voiced) to clip time.
    let at = |mut t: u64| {
        for (a, b) in spans {
            if t <= b - a {
                return a + t;
            }
            t -= b - a;
        }
        spans.last().map_or(0, |(_, b)| *b)
    };
    let mut out = Vec::new();
    let mut done = 0u64;
    for w in words {
        let from = done * voiced / total_chars;
        done += w.len() as u64 + 1;
        let to = done * voiced / total_chars;
        out.push(TimedWord {
            start_ms: at(from),
            end_ms: at(to).max(at(from) + 1),
            word: w.to_string(),
        });
    }
    out
}

/// The voiced spans of a μ-law clip in ms: 20 ms blocks whose mean level is at least
/// `level`, joined across gaps shorter than 200 ms.
pub fn voiced_spans(ulaw: &[u8], level: u32) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (i, block) in ulaw.chunks(160).enumerate() {
        if patterd::audio::g711::ulaw_energy(block) < level {
            continue;
        }
        let (a, b) = (i as u64 * 20, i as u64 * 20 + block.len() as u64 / 8);
        match spans.last_mut() {
            Some(last) if a.saturating_sub(last.1) < 200 => last.1 = b,
            _ => spans.push((a, b)),
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_spread_over_voiced_time_only() {
        let w = spread_words("aa bbbbb", &[(0, 300), (800, 1100)]);
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].start_ms, w[0].word.as_str()), (0, "aa"));
        // "aa " is 3 of 9 characters: a third of the 600 ms voiced.
        assert_eq!(w[0].end_ms, 200);
        assert_eq!(w[1].start_ms, 200);
        assert_eq!(w[1].end_ms, 1100);
        assert!(spread_words("", &[(0, 10)]).is_empty());
        assert!(spread_words("x", &[]).is_empty());
    }

    #[test]
    fn voiced_spans_bridge_short_gaps() {
        let loud = patterd::audio::g711::ulaw_tone(440.0, 200, 8000);
        let quiet = patterd::audio::g711::ulaw_silence(100);
        let long_quiet = patterd::audio::g711::ulaw_silence(400);
        let clip = [loud.clone(), quiet, loud.clone(), long_quiet, loud].concat();
        assert_eq!(voiced_spans(&clip, 500), vec![(0, 500), (900, 1100)]);
    }

    #[test]
    fn a_track_keeps_words_in_order() {
        let t = WordTrack::new();
        let w = |s, word: &str| TimedWord {
            start_ms: s,
            end_ms: s + 10,
            word: word.into(),
        };
        t.add([w(50, "b")]);
        t.add([w(10, "a")]);
        assert_eq!(t.snapshot(), vec![w(10, "a"), w(50, "b")]);
    }
}
