//! Word-precise heard history: which words of the agent's unconfirmed utterances the caller
//! heard when it was stopped. The cut is placed where playback stopped: at the moment the
//! carrier is sent `clear` (it drops what it still had queued then), or where its buffer ran
//! out if that was earlier. The mouth ([`super::mouth::Mouth::played_at`]) says how much of
//! each utterance whose mark has not come back had played at that moment: the audio sent, less
//! what the pacer reckons the carrier still had queued, shifted by the carrier's lag learned
//! from the last mark it echoed (its round trip included, so the estimate errs by a few tens of
//! ms towards "not heard"). The TTS's word timings ([`WordTiming`]) say where each word falls
//! in that audio. The rule, shared with the simulator's ground truth
//! (`patterd_sim::alignment::words_played`): a word counts as heard when **at least half of
//! it** had played at the stop (a word cut in its first half is not understood; one cut in its
//! second half usually is), and counting stops at the first word not heard, so what is kept is
//! always a prefix of what was meant. An utterance that had played to its end counts whole,
//! with or without timings; one without timings (a TTS that gives no alignment, or a sentence
//! whose alignment never came) that was cut stops the walk: there only marks and whole
//! sentences decide (sentence precision). Pure functions; the policy applies the result to the
//! transcript and the brain's history.

use crate::provider::WordTiming;

/// How much of one unconfirmed utterance had played at a moment (from the mouth).
#[derive(Debug, Clone, PartialEq)]
pub struct Played {
    /// Transcript entry the utterance belongs to.
    pub entry: usize,
    pub text: String,
    /// Its word timings (empty: the TTS gave none).
    pub words: Vec<WordTiming>,
    /// Length of its audio sent so far.
    pub audio_ms: u32,
    /// All of its audio was sent (false: the carrier can run out of it mid-sentence).
    pub(crate) sent_all: bool,
    /// How much of that audio had played.
    pub played_ms: u32,
}

/// Whether alignment or marks decided where the heard text ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Word timings placed the cut inside (or at the end of) an utterance.
    Word,
    /// Marks only: the cut falls on a sentence boundary.
    #[default]
    Sentence,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Word => "word",
            Precision::Sentence => "sentence",
        }
    }
}

/// Text the caller heard beyond the confirmed sentences, for one transcript entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub entry: usize,
    pub text: String,
    pub words: usize,
}

/// What an interruption adds to the heard text of the entries it cut.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cut {
    /// In playing order; each extends its entry's heard text.
    pub parts: Vec<Part>,
    pub precision: Precision,
}

/// How many of `words` (in order) were heard once `played_ms` of their audio had played: each
/// word needs at least half of it played; the count stops at the first word that does not.
pub(crate) fn words_heard(words: &[WordTiming], played_ms: u32) -> usize {
    words
        .iter()
        .take_while(|w| {
            let end = w.end_ms.max(w.start_ms);
            let mid = w.start_ms + (end - w.start_ms) / 2;
            played_ms >= mid && played_ms > w.start_ms
        })
        .count()
}

/// The first `n` of the aligned `words` as `text`'s own words (keeping its punctuation and
/// spelling; the TTS may normalise what it aligns). When the two count words differently the
/// share of the text heard is the share of aligned words heard.
pub fn prefix(text: &str, words: &[WordTiming], n: usize) -> String {
    let own: Vec<&str> = text.split_whitespace().collect();
    let k = if words.is_empty() || own.len() == words.len() {
        n
    } else if n >= words.len() {
        own.len()
    } else {
        ((n * own.len()) as f64 / words.len() as f64).round() as usize
    };
    own[..k.min(own.len())].join(" ")
}

/// What the caller heard of `played` (the unconfirmed utterances, in playing order).
pub fn cut(played: &[Played]) -> Cut {
    let mut out = Cut::default();
    for p in played {
        let whole = p.sent_all && p.played_ms >= p.audio_ms && p.audio_ms > 0;
        if p.words.is_empty() {
            // No timings: a sentence heard to its end counts whole; one cut is not heard
            // (sentence precision).
            out.precision = Precision::Sentence;
            if !whole {
                return out;
            }
        } else {
            out.precision = Precision::Word;
        }
        let n = if whole {
            p.words.len()
        } else {
            words_heard(&p.words, p.played_ms)
        };
        let text = if whole {
            p.text.split_whitespace().collect::<Vec<_>>().join(" ")
        } else {
            prefix(&p.text, &p.words, n)
        };
        if !text.is_empty() {
            let words = text.split_whitespace().count();
            out.parts.push(Part {
                entry: p.entry,
                text,
                words,
            });
        }
        if !whole {
            break;
        }
    }
    out
}

/// `text`'s words spread evenly over `ms` of audio, as the simulated TTS aligns them (tests).
#[cfg(test)]
pub(crate) fn even(text: &str, ms: u32) -> Vec<WordTiming> {
    let n = text.split_whitespace().count() as u32;
    text.split_whitespace()
        .enumerate()
        .map(|(i, w)| WordTiming {
            word: w.to_string(),
            start_ms: i as u32 * ms / n,
            end_ms: (i as u32 + 1) * ms / n,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn played(entry: usize, text: &str, aligned: bool, audio_ms: u32, played_ms: u32) -> Played {
        Played {
            entry,
            text: text.into(),
            words: if aligned {
                even(text, audio_ms)
            } else {
                Vec::new()
            },
            audio_ms,
            sent_all: true,
            played_ms,
        }
    }

    const S: &str = "We are open every day from noon.";

    #[test]
    fn a_word_counts_once_half_of_it_played() {
        // Seven words of 100 ms each.
        let w = even(S, 700);
        assert_eq!(words_heard(&w, 0), 0, "cut before the first word");
        assert_eq!(words_heard(&w, 49), 0, "first word under half played");
        assert_eq!(words_heard(&w, 50), 1, "first word half played");
        assert_eq!(words_heard(&w, 349), 3);
        assert_eq!(words_heard(&w, 350), 4);
        assert_eq!(words_heard(&w, 700), 7);
        assert_eq!(words_heard(&w, 10_000), 7);
        assert_eq!(prefix(S, &w, 4), "We are open every");
        assert_eq!(prefix(S, &w, 7), S);
    }

    #[test]
    fn the_cut_sentence_keeps_its_heard_words() {
        let c = cut(&[played(3, S, true, 700, 320)]);
        assert_eq!(c.precision, Precision::Word);
        assert_eq!(
            c.parts,
            vec![Part {
                entry: 3,
                text: "We are open".into(),
                words: 3
            }]
        );
        // Cut before its first word: nothing of it.
        let c = cut(&[played(3, S, true, 700, 0), played(3, "Next.", true, 200, 0)]);
        assert_eq!(c.parts, vec![]);
        assert_eq!(c.precision, Precision::Word);
    }

    #[test]
    fn sentences_played_to_the_end_count_whole_before_the_cut_one() {
        let c = cut(&[
            played(1, "Hello there.", true, 400, 400),
            played(1, S, true, 700, 110),
            played(1, "Never heard.", true, 300, 0),
        ]);
        let texts: Vec<_> = c.parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, vec!["Hello there.", "We"]);
        assert_eq!(c.parts[1].words, 1);
    }

    #[test]
    fn a_sentence_without_alignment_falls_back_to_marks() {
        // The sentence playing has no timings: nothing beyond the confirmed sentences.
        let c = cut(&[played(1, S, false, 700, 500)]);
        assert_eq!(c, Cut::default());
        assert_eq!(c.precision, Precision::Sentence);
        // An aligned sentence that played whole counts; the unaligned one after it stops
        // the walk even though its audio was playing.
        let c = cut(&[
            played(1, "Hello there.", true, 400, 400),
            played(1, S, false, 700, 300),
            played(1, "Aligned again.", true, 300, 0),
        ]);
        let texts: Vec<_> = c.parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, vec!["Hello there."]);
        assert_eq!(c.precision, Precision::Sentence);
        // An unaligned sentence that had played to its end before the stop was heard whole
        // (its mark was still on its way); the aligned one after it places the cut.
        let c = cut(&[
            played(1, S, false, 700, 700),
            played(1, "Aligned again.", true, 300, 200),
        ]);
        let texts: Vec<_> = c.parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, vec![S, "Aligned"]);
        assert_eq!(c.precision, Precision::Word);
        // Played to its end and nothing after: whole, at sentence precision.
        let c = cut(&[played(1, S, false, 700, 700)]);
        assert_eq!(c.parts.len(), 1);
        assert_eq!(c.precision, Precision::Sentence);
    }

    #[test]
    fn the_text_keeps_its_own_words_when_the_alignment_counts_differently() {
        // The TTS aligned "10" as "ten o'clock" (3 words vs the text's 2 for that span).
        let text = "Open at 10 daily";
        let words = even("Open at ten o'clock daily", 500);
        assert_eq!(prefix(text, &words, 5), text);
        assert_eq!(prefix(text, &words, 2), "Open at");
        assert_eq!(prefix(text, &words, 0), "");
        // Broken timings (end before start) still give an ordered count.
        let odd = vec![WordTiming {
            word: "x".into(),
            start_ms: 100,
            end_ms: 50,
        }];
        assert_eq!(words_heard(&odd, 100), 0);
        assert_eq!(words_heard(&odd, 101), 1);
    }

    #[test]
    fn the_play_position_follows_the_pacer_less_the_carriers_lag() {
        use crate::call::mouth::{Mouth, UttKind};
        use crate::provider::TtsEvent;
        use std::time::Duration;
        use tokio::time::Instant;

        let mut s = Mouth::new();
        for text in ["one two three four", "five six"] {
            // One second of audio each, words spread evenly.
            let id = s.push_audio(UttKind::Say, text.into(), 0, &[0x55; 8000]);
            s.on_tts(id, Some(TtsEvent::Words(even(text, 1000))));
        }
        let t0 = Instant::now();
        s.pump(t0);
        // Half a second in: two of the first four words (each 250 ms) are at least half played.
        let c = cut(&s.played_at(t0 + Duration::from_millis(500)));
        assert_eq!(c.parts[0].text, "one two");
        assert_eq!(c.precision, Precision::Word);
        // The second utterance goes out; the first one's mark comes back 200 ms late, so the
        // carrier plays 200 ms behind the pacer.
        let t1 = t0 + Duration::from_secs(1);
        s.pump(t1);
        assert!(
            s.mark_returned("u1", t1 + Duration::from_millis(200))
                .is_some()
        );
        // At 1.5 s the pacer says 500 ms of "five six" played; the carrier, 300 ms.
        let c = cut(&s.played_at(t0 + Duration::from_millis(1500)));
        let texts: Vec<_> = c.parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, vec!["five"]);
        // Long after its end, all of it was heard even though its mark is not back.
        let c = cut(&s.played_at(t0 + Duration::from_secs(5)));
        assert_eq!(c.parts[0].text, "five six");
        // One echo handled late (900 ms: a busy moment) does not move the play position: the
        // smallest delay of the last marks is the carrier's lag.
        let id = s.push_audio(UttKind::Say, "seven eight".into(), 0, &[0x55; 8000]);
        s.on_tts(id, Some(TtsEvent::Words(even("seven eight", 1000))));
        s.pump(t0 + Duration::from_secs(2));
        assert!(
            s.mark_returned("u2", t0 + Duration::from_millis(2900))
                .is_some()
        );
        // At 2.5 s: 300 ms of "seven eight" played at the carrier (not -400 ms).
        let c = cut(&s.played_at(t0 + Duration::from_millis(2500)));
        let texts: Vec<_> = c.parts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, vec!["seven"]);
    }

    /// The cut is placed where playback stopped: a hold (no new audio sent, no `clear`) lets
    /// the carrier play on, so the words played between the caller's onset and the stop were
    /// heard; a hold longer than what the carrier had queued stops at the end of that audio.
    #[test]
    fn the_cut_falls_where_playback_stopped() {
        use crate::call::mouth::{Mouth, UttKind};
        use crate::provider::TtsEvent;
        use std::time::Duration;
        use tokio::time::Instant;

        let text = "one two three four five six seven eight";
        let mut s = Mouth::new();
        // Two seconds of audio, 250 ms a word.
        let id = s.push_audio(UttKind::Say, text.into(), 0, &[0x55; 16_000]);
        s.on_tts(id, Some(TtsEvent::Words(even(text, 2000))));
        let t0 = Instant::now();
        s.pump(t0); // one second (LEAD) at the carrier
        let at = |ms| t0 + Duration::from_millis(ms);
        // The caller begins at 300 ms: "one" is heard, "two" (250–500) is not yet half played.
        assert_eq!(cut(&s.played_at(at(300))).parts[0].text, "one");
        // The hold at 400 ms sends nothing more but the carrier plays on; the `clear` at
        // 700 ms stops it: "three" (500–750) is past its middle.
        s.hold();
        assert!(s.pump(at(400)).commands.is_empty());
        assert_eq!(cut(&s.played_at(at(700))).parts[0].text, "one two three");
        // A stop 1.5 s in: the carrier had run out of audio at 1 s, so four words.
        let c = cut(&s.played_at(at(1500)));
        assert_eq!(c.parts[0].text, "one two three four");
        assert_eq!(c.parts[0].words, 4);
        assert_eq!(c.precision, Precision::Word);
    }
}
