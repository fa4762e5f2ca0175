//! What the text-to-speech engines that run on this machine share (`piper`, `flite`): a
//! sentence cut into clauses at `,` `;` `:` and grouped into pieces of a few words, each
//! synthesised on its own so the first audio waits for the first clause only ([`pieces`]);
//! each piece's word timings estimated over the voiced part of its audio ([`spread`]: these
//! engines report no alignment, so a word's share of the piece is its weight — phonemes for
//! Piper, letters for flite); and the engines' PCM resampled to 8 kHz by
//! [`crate::audio::resample`] and μ-law encoded ([`UlawOut`]). Pure functions and a resampler;
//! no I/O.

use super::alignment::WordTiming;
use crate::audio::g711::encode_ulaw;
use crate::audio::resample::{ResampleError, Resampler};

/// A piece is closed at the first clause end once it has this many words: "Well, I can do
/// that, sure." is "Well, I can do that," then "sure.".
pub(crate) const MIN_PIECE_WORDS: usize = 3;

/// A clause longer than this (bytes) is cut at its last space before it, so one engine run and
/// one `espeak-ng` input line stay bounded (the sentence chunker already caps a sentence at
/// 600 bytes).
pub(crate) const MAX_CLAUSE_BYTES: usize = 300;

/// One clause of a sentence: its text (punctuation kept, control characters gone) and the
/// punctuation that ends it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Clause {
    pub(crate) text: String,
    /// `.` `?` `!` `,` `;` or `:` closing the clause (behind any closing quote or bracket).
    pub(crate) terminator: Option<char>,
}

impl Clause {
    /// The clause's words as the caller hears them (split on whitespace, punctuation kept).
    pub(crate) fn words(&self) -> impl Iterator<Item = &str> {
        self.text.split_whitespace()
    }
}

/// Clauses synthesised together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) clauses: Vec<Clause>,
}

impl Piece {
    pub(crate) fn text(&self) -> String {
        let texts: Vec<&str> = self.clauses.iter().map(|c| c.text.as_str()).collect();
        texts.join(" ")
    }

    pub(crate) fn word_count(&self) -> usize {
        self.clauses.iter().map(|c| c.words().count()).sum()
    }
}

fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | ')' | ']' | '”' | '’' | '»')
}

/// The punctuation ending `text`, looking through closing quotes and brackets.
fn terminator(text: &str) -> Option<char> {
    text.trim_end()
        .chars()
        .rev()
        .find(|&c| !is_closer(c))
        .filter(|c| matches!(c, '.' | '?' | '!' | ',' | ';' | ':'))
}

/// `text` with control characters (newlines, tabs) as spaces and runs of whitespace as one.
fn clean(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The clauses of `text`: cut after `,` `;` `:` that a space follows (not `3,5` or `10:30`),
/// and within a clause over [`MAX_CLAUSE_BYTES`] at its last space before the cap.
pub(crate) fn clauses(text: &str) -> Vec<Clause> {
    let text = clean(text);
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for (i, c) in text.char_indices() {
        let end = i + c.len_utf8();
        if matches!(c, ',' | ';' | ':') && bytes.get(end).is_none_or(|b| *b == b' ') {
            push_clause(&mut out, &text[start..end]);
            start = end;
        }
    }
    push_clause(&mut out, &text[start..]);
    out
}

fn push_clause(out: &mut Vec<Clause>, mut text: &str) {
    text = text.trim();
    while text.len() > MAX_CLAUSE_BYTES {
        let mut cut = MAX_CLAUSE_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let cut = text[..cut].rfind(' ').filter(|&i| i > 0).unwrap_or(cut);
        let (head, rest) = text.split_at(cut);
        out.push(Clause {
            text: head.trim().to_string(),
            terminator: None,
        });
        text = rest.trim();
    }
    if !text.is_empty() {
        out.push(Clause {
            text: text.to_string(),
            terminator: terminator(text),
        });
    }
}

/// `text` as the pieces to synthesise in order: clauses grouped until a piece has
/// [`MIN_PIECE_WORDS`] words (whatever is left at the end is a piece of its own).
pub(crate) fn pieces(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut current = Piece {
        clauses: Vec::new(),
    };
    for clause in clauses(text) {
        current.clauses.push(clause);
        if current.word_count() >= MIN_PIECE_WORDS {
            out.push(std::mem::replace(
                &mut current,
                Piece {
                    clauses: Vec::new(),
                },
            ));
        }
    }
    if !current.clauses.is_empty() {
        out.push(current);
    }
    out
}

/// A word's weight for [`spread`] when nothing better is known: its letters and digits (at
/// least 1).
pub(crate) fn letter_weight(word: &str) -> f32 {
    word.chars().filter(|c| c.is_alphanumeric()).count().max(1) as f32
}

/// Where the voice speaks in a piece's audio (ms from its start): from the first to the last
/// sample at least 5 % of the piece's peak, so the engine's own lead-in and tail silence hold
/// no word. The whole piece when it is silent.
pub(crate) fn voiced_span(samples: &[f32], rate: u32) -> (f64, f64) {
    let ms = |i: usize| i as f64 * 1000.0 / f64::from(rate);
    let peak = samples.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    let floor = peak * 0.05;
    let first = samples.iter().position(|s| s.abs() >= floor && peak > 0.0);
    let last = samples.iter().rposition(|s| s.abs() >= floor && peak > 0.0);
    match (first, last) {
        (Some(a), Some(b)) if b > a => (ms(a), ms(b + 1)),
        _ => (0.0, ms(samples.len())),
    }
}

/// Timings of `words` (each with its weight) spread over `span` (ms within the piece), each
/// word's share of it proportional to its weight, shifted by `offset_ms` (where the piece
/// starts in the utterance's audio).
pub(crate) fn spread(words: &[(String, f32)], span: (f64, f64), offset_ms: f64) -> Vec<WordTiming> {
    let total: f64 = words.iter().map(|(_, w)| f64::from(w.max(0.0))).sum();
    let (from, to) = span;
    let length = (to - from).max(0.0);
    let mut at = from;
    let to_ms = |t: f64| (offset_ms + t).round().clamp(0.0, f64::from(u32::MAX)) as u32;
    words
        .iter()
        .map(|(word, weight)| {
            let share = if total > 0.0 {
                length * f64::from(weight.max(0.0)) / total
            } else {
                length / words.len() as f64
            };
            let start = at;
            at += share;
            WordTiming {
                word: word.clone(),
                start_ms: to_ms(start),
                end_ms: to_ms(at),
            }
        })
        .collect()
}

/// An engine's PCM on its way to the carrier: resampled to 8 kHz (band-limited, state kept
/// across pieces so they join without a seam) and μ-law encoded.
pub(crate) struct UlawOut {
    resampler: Resampler,
    pcm: Vec<i16>,
    #[cfg_attr(not(feature = "piper"), allow(dead_code))]
    scratch: Vec<i16>,
}

impl UlawOut {
    pub(crate) fn new(rate: u32) -> Result<Self, ResampleError> {
        Ok(Self {
            resampler: Resampler::new(rate, 8000)?,
            pcm: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// Float samples (−1…1) times `gain`, clipped; returns the μ-law ready so far.
    #[cfg_attr(not(feature = "piper"), allow(dead_code))]
    pub(crate) fn push_f32(&mut self, samples: &[f32], gain: f32) -> Vec<u8> {
        self.scratch.clear();
        self.scratch.extend(
            samples
                .iter()
                .map(|&s| (s * gain * 32767.0).round().clamp(-32768.0, 32767.0) as i16),
        );
        self.pcm.clear();
        self.resampler.push(&self.scratch, &mut self.pcm);
        encode_ulaw(&self.pcm)
    }

    /// 16-bit samples; returns the μ-law ready so far.
    pub(crate) fn push_i16(&mut self, samples: &[i16]) -> Vec<u8> {
        self.pcm.clear();
        self.resampler.push(samples, &mut self.pcm);
        encode_ulaw(&self.pcm)
    }

    /// The rest (the resampler's last block and delay line).
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        self.pcm.clear();
        self.resampler.finish(&mut self.pcm);
        encode_ulaw(&self.pcm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(ps: &[Piece]) -> Vec<String> {
        ps.iter().map(Piece::text).collect()
    }

    #[test]
    fn sentences_are_cut_at_clause_punctuation_once_a_piece_has_three_words() {
        assert_eq!(
            texts(&pieces(
                "Sure, I can book that for Tuesday, and I will send you a text; anything else?"
            )),
            [
                "Sure, I can book that for Tuesday,",
                "and I will send you a text;",
                "anything else?"
            ]
        );
        // Numbers and times are not clause ends; a short tail is its own piece.
        assert_eq!(
            texts(&pieces("It costs 3,50 at 10:30 exactly, thanks.")),
            ["It costs 3,50 at 10:30 exactly,", "thanks."]
        );
        assert_eq!(texts(&pieces("Yes.")), ["Yes."]);
        assert!(pieces("  \n ").is_empty());
        let ps = pieces("Well, yes: it is.");
        assert_eq!(texts(&ps), ["Well, yes: it is."]);
        assert_eq!(
            ps[0]
                .clauses
                .iter()
                .map(|c| c.terminator)
                .collect::<Vec<_>>(),
            [Some(','), Some(':'), Some('.')]
        );
    }

    #[test]
    fn clause_text_is_cleaned_and_bounded() {
        let c = clauses("He said \"no.\"\nThen\tleft");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].text, "He said \"no.\" Then left");
        assert_eq!(c[0].terminator, None);
        assert_eq!(clauses("He said \"no.\"")[0].terminator, Some('.'));
        let long = "word ".repeat(200) + "end.";
        let c = clauses(&long);
        assert!(c.len() >= 3, "{}", c.len());
        assert!(c.iter().all(|c| c.text.len() <= MAX_CLAUSE_BYTES));
        assert_eq!(
            c.iter().map(|c| c.words().count()).sum::<usize>(),
            201,
            "no word lost or split"
        );
        assert_eq!(c.last().and_then(|c| c.terminator), Some('.'));
        // A clause of one long multi-byte word is cut on a character boundary.
        let wide = "é".repeat(400);
        assert!(
            clauses(&wide)
                .iter()
                .all(|c| c.text.len() <= MAX_CLAUSE_BYTES)
        );
    }

    #[test]
    fn words_are_spread_by_weight_over_the_voiced_span() {
        let words = vec![("Hi".to_string(), 1.0), ("there.".to_string(), 3.0)];
        let t = spread(&words, (100.0, 500.0), 1000.0);
        assert_eq!((t[0].start_ms, t[0].end_ms), (1100, 1200));
        assert_eq!((t[1].start_ms, t[1].end_ms), (1200, 1500));
        assert_eq!(t[1].word, "there.");
        // No weights: equal shares.
        let zero = vec![("a".to_string(), 0.0), ("b".to_string(), 0.0)];
        let t = spread(&zero, (0.0, 100.0), 0.0);
        assert_eq!((t[0].end_ms, t[1].end_ms), (50, 100));
        assert_eq!(letter_weight("don't,"), 4.0);
        assert_eq!(letter_weight("—"), 1.0);
    }

    #[test]
    fn the_voiced_span_skips_lead_in_and_tail_silence() {
        let mut s = vec![0.001f32; 22_050];
        for x in &mut s[2205..19_845] {
            *x = 0.5;
        }
        let (a, b) = voiced_span(&s, 22_050);
        assert!(
            (a - 100.0).abs() < 0.1 && (b - 900.0).abs() < 0.1,
            "{a} {b}"
        );
        assert_eq!(voiced_span(&[0.0; 800], 8000), (0.0, 100.0));
    }

    #[test]
    fn piper_rate_audio_comes_out_as_ulaw_8k_of_the_same_length() {
        // 1.5 s of a 440 Hz tone at 22.05 kHz in three uneven pieces.
        let tone: Vec<f32> = (0..33_075)
            .map(|i| 0.5 * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / 22_050.0).sin())
            .collect();
        let mut out = UlawOut::new(22_050).expect("resampler");
        let mut ulaw = out.push_f32(&tone[..1000], 1.0);
        ulaw.extend(out.push_f32(&tone[1000..20_000], 1.0));
        ulaw.extend(out.push_f32(&tone[20_000..], 1.0));
        ulaw.extend(out.finish());
        assert_eq!(ulaw.len(), 12_000, "1.5 s at 8 kHz");
        let pcm = crate::audio::g711::decode_ulaw(&ulaw);
        let mean = pcm[400..11_600]
            .iter()
            .map(|s| f64::from(s.unsigned_abs()))
            .sum::<f64>()
            / 11_200.0;
        // A sine of amplitude 0.5 full scale has a mean |x| of 0.5 · 2/π · 32767 ≈ 10430.
        assert!((mean - 10_430.0).abs() < 600.0, "{mean}");
        // flite's 16 kHz 16-bit path: 0.5 s in, 0.5 s out.
        let mut out = UlawOut::new(16_000).expect("resampler");
        let mut n = out.push_i16(&[1000; 8000]).len();
        n += out.finish().len();
        assert_eq!(n, 4000);
    }
}
