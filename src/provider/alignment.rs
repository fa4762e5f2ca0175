//! Word timings from a text-to-speech service's alignment: the [`WordTiming`] type the call
//! uses to know which words of an utterance the caller heard when it was interrupted, and the
//! conversion of ElevenLabs' per-character alignment (HTTP `…/stream/with-timestamps`:
//! `characters`, `character_start_times_seconds`, `character_end_times_seconds`, times from the
//! start of the request's audio; WebSocket: `chars`, `charStartTimesMs`, `charDurationsMs`,
//! times from the start of the frame's audio chunk) into words, split on
//! whitespace. Timing is in milliseconds of the utterance's audio, which resampling or the
//! output format does not change. Pure functions over parsed JSON; no I/O.

use serde_json::Value;

/// One word of an utterance and where it falls in that utterance's audio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WordTiming {
    pub word: String,
    /// Milliseconds from the utterance's first audio byte.
    pub start_ms: u32,
    pub end_ms: u32,
}

/// Joins characters arriving in pieces (a word may straddle two chunks) into words.
#[derive(Debug, Default)]
pub(crate) struct CharWords {
    current: String,
    start_ms: u32,
    end_ms: u32,
}

impl CharWords {
    /// Feeds one character spoken from `start_ms` to `end_ms`; returns the word it completed
    /// (whitespace ends a word).
    pub(crate) fn push(&mut self, c: &str, start_ms: u32, end_ms: u32) -> Option<WordTiming> {
        if c.trim().is_empty() {
            return self.finish();
        }
        if self.current.is_empty() {
            self.start_ms = start_ms;
            self.end_ms = end_ms.max(start_ms);
        }
        self.current.push_str(c);
        self.end_ms = self.end_ms.max(end_ms).max(start_ms);
        None
    }

    /// The word still open at the end of the text, if any.
    pub(crate) fn finish(&mut self) -> Option<WordTiming> {
        if self.current.is_empty() {
            return None;
        }
        Some(WordTiming {
            word: std::mem::take(&mut self.current),
            start_ms: self.start_ms,
            end_ms: self.end_ms,
        })
    }
}

/// Seconds (as the vendor sends them) to whole milliseconds; anything not a finite positive
/// number is 0.
fn secs_to_ms(s: f64) -> u32 {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0).round().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

fn ms(v: &Value) -> u32 {
    v.as_f64()
        .filter(|x| x.is_finite() && *x > 0.0)
        .map_or(0, |x| x.round().min(f64::from(u32::MAX)) as u32)
}

/// The alignment object of a frame: the original text's (`alignment`) when present, else the
/// normalized one (`normalized_key`). `null` counts as absent.
fn pick<'a>(frame: &'a Value, normalized_key: &str) -> Option<&'a Value> {
    frame
        .get("alignment")
        .filter(|a| a.is_object())
        .or_else(|| frame.get(normalized_key).filter(|a| a.is_object()))
}

/// The characters of an alignment object under `key`, as strings.
fn chars<'a>(a: &'a Value, key: &str) -> Option<Vec<&'a str>> {
    a.get(key)?
        .as_array()?
        .iter()
        .map(Value::as_str)
        .collect::<Option<Vec<_>>>()
}

/// Feeds the characters of one ElevenLabs HTTP `with-timestamps` line (times in seconds from
/// the start of the request's audio) and returns the words they completed. A line without
/// alignment, or with arrays of different lengths, adds nothing.
pub(crate) fn http_words(line: &Value, words: &mut CharWords) -> Vec<WordTiming> {
    let mut out = Vec::new();
    let Some(a) = pick(line, "normalized_alignment") else {
        return out;
    };
    let (Some(cs), Some(starts), Some(ends)) = (
        chars(a, "characters"),
        a.get("character_start_times_seconds")
            .and_then(Value::as_array),
        a.get("character_end_times_seconds")
            .and_then(Value::as_array),
    ) else {
        return out;
    };
    if cs.len() != starts.len() || cs.len() != ends.len() {
        return out;
    }
    for ((c, s), e) in cs.iter().zip(starts).zip(ends) {
        let s = secs_to_ms(s.as_f64().unwrap_or(0.0));
        let e = secs_to_ms(e.as_f64().unwrap_or(0.0));
        out.extend(words.push(c, s, e));
    }
    out
}

/// Feeds the characters of one ElevenLabs WebSocket audio frame (times in ms from the start of
/// that frame's audio, which begins `offset_ms` into the utterance) and returns the words they
/// completed. `charsStartTimesMs` (an older spelling) is accepted too.
pub(crate) fn ws_words(frame: &Value, offset_ms: u32, words: &mut CharWords) -> Vec<WordTiming> {
    let mut out = Vec::new();
    let Some(a) = pick(frame, "normalizedAlignment") else {
        return out;
    };
    let (Some(cs), Some(starts), Some(durs)) = (
        chars(a, "chars"),
        a.get("charStartTimesMs")
            .or_else(|| a.get("charsStartTimesMs"))
            .and_then(Value::as_array),
        a.get("charDurationsMs")
            .or_else(|| a.get("charsDurationsMs"))
            .and_then(Value::as_array),
    ) else {
        return out;
    };
    if cs.len() != starts.len() || cs.len() != durs.len() {
        return out;
    }
    for ((c, s), d) in cs.iter().zip(starts).zip(durs) {
        let s = offset_ms.saturating_add(ms(s));
        out.extend(words.push(c, s, s.saturating_add(ms(d))));
    }
    out
}

/// Cartesia's `word_timestamps` (`words`, `start`, `end` in seconds from the start of the
/// context's audio) as word timings; `None` when the arrays are missing or
/// of different lengths.
pub(crate) fn cartesia_words(ts: &Value) -> Option<Vec<WordTiming>> {
    let words = chars(ts, "words")?;
    let starts = ts.get("start")?.as_array()?;
    let ends = ts.get("end")?.as_array()?;
    if words.len() != starts.len() || words.len() != ends.len() {
        return None;
    }
    Some(
        words
            .iter()
            .zip(starts)
            .zip(ends)
            .filter(|((w, _), _)| !w.trim().is_empty())
            .map(|((w, s), e)| {
                let start_ms = secs_to_ms(s.as_f64().unwrap_or(0.0));
                WordTiming {
                    word: w.trim().to_string(),
                    start_ms,
                    end_ms: secs_to_ms(e.as_f64().unwrap_or(0.0)).max(start_ms),
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn w(word: &str, start_ms: u32, end_ms: u32) -> WordTiming {
        WordTiming {
            word: word.into(),
            start_ms,
            end_ms,
        }
    }

    #[test]
    fn http_characters_become_words_across_lines() {
        let mut cw = CharWords::default();
        let first = json!({
            "audio_base64": "",
            "alignment": {
                "characters": [" ", "H", "i", " ", "t", "h"],
                "character_start_times_seconds": [0.0, 0.05, 0.1, 0.2, 0.25, 0.3],
                "character_end_times_seconds": [0.05, 0.1, 0.2, 0.25, 0.3, 0.35],
            },
            "normalized_alignment": null,
        });
        assert_eq!(http_words(&first, &mut cw), vec![w("Hi", 50, 200)]);
        // The second line finishes "there." (times are from the start of the request).
        let second = json!({
            "audio_base64": "",
            "alignment": null,
            "normalized_alignment": {
                "characters": ["e", "r", "e", "."],
                "character_start_times_seconds": [0.35, 0.4, 0.45, 0.5],
                "character_end_times_seconds": [0.4, 0.45, 0.5, 0.55],
            },
        });
        assert!(http_words(&second, &mut cw).is_empty());
        assert_eq!(cw.finish(), Some(w("there.", 250, 550)));
        assert_eq!(cw.finish(), None);
    }

    #[test]
    fn websocket_times_are_offset_by_the_chunk_position() {
        let mut cw = CharWords::default();
        let frame = json!({
            "audio": "",
            "alignment": {"chars": ["a", "b", " ", "c"], "charStartTimesMs": [0, 10, 20, 30], "charDurationsMs": [10, 10, 10, 10]},
        });
        assert_eq!(ws_words(&frame, 1000, &mut cw), vec![w("ab", 1000, 1020)]);
        assert_eq!(cw.finish(), Some(w("c", 1030, 1040)));
        // Older spelling; mismatched arrays add nothing.
        let old = json!({"alignment": {"chars": ["x"], "charsStartTimesMs": [5], "charDurationsMs": [5]}});
        ws_words(&old, 0, &mut cw);
        assert_eq!(cw.finish(), Some(w("x", 5, 10)));
        let bad = json!({"alignment": {"chars": ["x", "y"], "charStartTimesMs": [5], "charDurationsMs": [5]}});
        assert!(ws_words(&bad, 0, &mut cw).is_empty());
        assert_eq!(cw.finish(), None);
    }

    #[test]
    fn cartesia_word_timestamps() {
        let ts = json!({"words": ["Hello,", "world"], "start": [0.0, 0.4], "end": [0.35, 0.9]});
        assert_eq!(
            cartesia_words(&ts),
            Some(vec![w("Hello,", 0, 350), w("world", 400, 900)])
        );
        assert_eq!(
            cartesia_words(&json!({"words": ["a"], "start": [], "end": []})),
            None
        );
        // Nonsense times are clamped rather than trusted.
        let odd = json!({"words": ["a"], "start": [-1.0], "end": [-2.0]});
        assert_eq!(cartesia_words(&odd), Some(vec![w("a", 0, 0)]));
    }
}
