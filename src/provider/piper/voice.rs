//! A Piper voice's settings file (`<voice>.onnx.json`): its output rate, the espeak-ng voice
//! that phonemizes for it, the inference scales, and the map from phonemes (Unicode code
//! points, NFD as Piper decomposes them) to the model's input ids; and a piece's phonemes
//! turned into those ids the way Piper's training did: `^` (begin), `_` (pad) after it and
//! after every phoneme, `$` (end); phonemes the map lacks are dropped. A clause's terminator
//! goes in as its punctuation phoneme (`,` `:` `;` followed by a space). Pure data; no I/O.

use std::collections::HashMap;

use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

/// The voice file's fields patterd reads (the rest is ignored).
#[derive(Debug, Deserialize)]
struct VoiceFile {
    audio: Audio,
    #[serde(default)]
    espeak: Option<EspeakSection>,
    #[serde(default)]
    inference: Option<Inference>,
    #[serde(default = "espeak_type")]
    phoneme_type: String,
    #[serde(default)]
    phoneme_map: HashMap<String, Vec<String>>,
    phoneme_id_map: HashMap<String, Vec<i64>>,
    #[serde(default = "one")]
    num_speakers: u32,
}

#[derive(Debug, Deserialize)]
struct Audio {
    sample_rate: u32,
}

#[derive(Debug, Deserialize)]
struct EspeakSection {
    voice: String,
}

#[derive(Debug, Deserialize)]
struct Inference {
    #[serde(default = "noise_scale")]
    noise_scale: f32,
    #[serde(default = "length_scale")]
    length_scale: f32,
    #[serde(default = "noise_w")]
    noise_w: f32,
}

fn espeak_type() -> String {
    "espeak".into()
}
fn one() -> u32 {
    1
}
// Piper's defaults when a voice file leaves them out.
fn noise_scale() -> f32 {
    0.667
}
fn length_scale() -> f32 {
    1.0
}
fn noise_w() -> f32 {
    0.8
}

/// One Piper voice's settings.
#[derive(Debug, Clone)]
pub(crate) struct Voice {
    /// The rate of the model's output.
    pub(crate) sample_rate: u32,
    /// The espeak-ng voice (`-v`) that phonemizes for this model.
    pub(crate) espeak_voice: String,
    pub(crate) noise_scale: f32,
    pub(crate) length_scale: f32,
    pub(crate) noise_w: f32,
    ids: HashMap<char, Vec<i64>>,
    substitutions: HashMap<char, Vec<char>>,
    pad: Vec<i64>,
    bos: Vec<i64>,
    eos: Vec<i64>,
}

/// Why a voice file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VoiceError {
    #[error("not a Piper voice file: {0}")]
    Json(String),
    #[error(
        "its phoneme_type is {0:?}; patterd phonemizes with espeak-ng, so only \"espeak\" voices work"
    )]
    PhonemeType(String),
    #[error("it has {0} speakers; patterd runs single-speaker voices only")]
    Speakers(u32),
    #[error("its phoneme_id_map has no {0:?} (Piper's pad, begin and end symbols are _ ^ $)")]
    Missing(char),
    #[error("its phoneme_id_map key {0:?} is not one character")]
    Key(String),
}

fn single(key: &str) -> Result<char, VoiceError> {
    let mut cs = key.chars();
    match (cs.next(), cs.next()) {
        (Some(c), None) => Ok(c),
        _ => Err(VoiceError::Key(key.to_string())),
    }
}

impl Voice {
    pub(crate) fn parse(json: &str) -> Result<Self, VoiceError> {
        let file: VoiceFile =
            serde_json::from_str(json).map_err(|e| VoiceError::Json(e.to_string()))?;
        if file.phoneme_type != "espeak" {
            return Err(VoiceError::PhonemeType(file.phoneme_type));
        }
        if file.num_speakers != 1 {
            return Err(VoiceError::Speakers(file.num_speakers));
        }
        let mut ids = HashMap::new();
        for (k, v) in file.phoneme_id_map {
            ids.insert(single(&k)?, v);
        }
        let mut substitutions = HashMap::new();
        for (k, v) in file.phoneme_map {
            let to = v.iter().map(|s| single(s)).collect::<Result<Vec<_>, _>>()?;
            substitutions.insert(single(&k)?, to);
        }
        let get = |c: char| ids.get(&c).cloned().ok_or(VoiceError::Missing(c));
        let (pad, bos, eos) = (get('_')?, get('^')?, get('$')?);
        let inference = file.inference.unwrap_or(Inference {
            noise_scale: noise_scale(),
            length_scale: length_scale(),
            noise_w: noise_w(),
        });
        Ok(Self {
            sample_rate: file.audio.sample_rate,
            espeak_voice: file
                .espeak
                .map(|e| e.voice)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "en-us".into()),
            noise_scale: inference.noise_scale,
            length_scale: inference.length_scale,
            noise_w: inference.noise_w,
            ids,
            substitutions,
            pad,
            bos,
            eos,
        })
    }

    /// Whether the model has an id for this phoneme.
    pub(crate) fn knows(&self, c: char) -> bool {
        self.ids.contains_key(&c)
    }

    /// The model's input for `phonemes` (begin, pad, each known phoneme and a pad, end) and
    /// how many phonemes the map lacked (dropped).
    pub(crate) fn ids(&self, phonemes: &str) -> (Vec<i64>, usize) {
        let mut out = Vec::with_capacity(phonemes.len() * 2 + 4);
        out.extend_from_slice(&self.bos);
        out.extend_from_slice(&self.pad);
        let mut missing = 0;
        for c in phonemes.chars() {
            let one = [c];
            let mapped: &[char] = self.substitutions.get(&c).map_or(&one, Vec::as_slice);
            for p in mapped {
                match self.ids.get(p) {
                    Some(ids) => {
                        out.extend_from_slice(ids);
                        out.extend_from_slice(&self.pad);
                    }
                    None => missing += 1,
                }
            }
        }
        out.extend_from_slice(&self.eos);
        (out, missing)
    }

    /// Whether `ids` (from [`Voice::ids`]) hold any phoneme beyond begin, pads and end.
    pub(crate) fn has_phonemes(&self, ids: &[i64]) -> bool {
        ids.len() > self.bos.len() + self.pad.len() + self.eos.len()
    }
}

/// A clause's espeak-ng output as Piper's phonemes: NFD, without espeak's `(en)` language
/// switch flags, its lines joined by spaces, then its terminator (`.` `?` `!` as is; `,` `:`
/// `;` with a space after; none: a space).
pub(crate) fn clause_phonemes(espeak_lines: &[String], terminator: Option<char>) -> String {
    let joined = espeak_lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = String::with_capacity(joined.len() + 2);
    let mut in_flag = false;
    for c in joined.nfd() {
        match c {
            '(' => in_flag = true,
            ')' if in_flag => in_flag = false,
            _ if in_flag => {}
            _ => out.push(c),
        }
    }
    match terminator {
        Some(t @ ('.' | '?' | '!')) => out.push(t),
        Some(t @ (',' | ':' | ';')) => {
            out.push(t);
            out.push(' ');
        }
        _ => out.push(' '),
    }
    out
}

/// The weight of each of a clause's `words` for the timing estimate: the phonemes (stress
/// marks aside) of the word espeak-ng said for it when espeak-ng's words line up one to one
/// with the text's; otherwise the text word's letters.
pub(crate) fn word_weights(voice: &Voice, words: &[&str], phonemes: &str) -> Vec<f32> {
    let spoken: Vec<&str> = phonemes
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ':' | ';' | '.' | '?' | '!'))
        .filter(|w| !w.is_empty())
        .collect();
    if spoken.len() == words.len() {
        spoken
            .iter()
            .map(|w| {
                w.chars()
                    .filter(|&c| voice.knows(c) && !matches!(c, 'ˈ' | 'ˌ'))
                    .count()
                    .max(1) as f32
            })
            .collect()
    } else {
        words
            .iter()
            .map(|w| super::super::local_tts::letter_weight(w))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of a real voice file (en_US-joe-medium.onnx.json), with the ids it gives
    /// these phonemes.
    pub(crate) const VOICE: &str = r#"{
        "audio": {"sample_rate": 22050, "quality": "medium"},
        "espeak": {"voice": "en-us"},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": {
            "_": [0], "^": [1], "$": [2], " ": [3], "!": [4], ",": [8], ".": [10], "?": [13],
            "a": [14], "b": [15], "c": [16], "d": [17], "e": [18], "h": [20], "l": [24],
            "s": [31], "t": [32], "w": [35], "z": [38], "ç": [41],
            "ð": [41], "ɑ": [51], "ə": [59], "ɚ": [60], "ɛ": [61], "ɜ": [62], "ɪ": [74],
            "ɹ": [88], "ʊ": [100], "ˈ": [120], "ˌ": [121], "ː": [122], "̧": [140], "o": [27]
        },
        "num_symbols": 256,
        "num_speakers": 1,
        "speaker_id_map": {}
    }"#;

    #[test]
    fn a_voice_file_is_read() {
        let v = Voice::parse(VOICE).expect("voice");
        assert_eq!(v.sample_rate, 22_050);
        assert_eq!(v.espeak_voice, "en-us");
        assert_eq!(
            (v.noise_scale, v.length_scale, v.noise_w),
            (0.667, 1.0, 0.8)
        );
    }

    #[test]
    fn phonemes_become_ids_with_begin_pads_and_end() {
        let v = Voice::parse(VOICE).expect("voice");
        // "həlˈoʊ wˈɜːld." as Piper feeds it.
        let (ids, missing) = v.ids("həlˈoʊ wˈɜːld.");
        assert_eq!(
            ids,
            [
                1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 3, 0, 35, 0, 120, 0, 62, 0, 122,
                0, 24, 0, 17, 0, 10, 0, 2
            ]
        );
        assert_eq!(missing, 0);
        assert!(v.has_phonemes(&ids));
        // Unknown phonemes are dropped and counted; nothing left is only begin, pad, end.
        let (ids, missing) = v.ids("☃");
        assert_eq!((ids.as_slice(), missing), (&[1, 0, 2][..], 1));
        assert!(!v.has_phonemes(&ids));
    }

    #[test]
    fn espeak_lines_become_a_clause_as_piper_phonemizes_it() {
        let lines = vec!["dˈɑːktɚ".to_string(), " smˈɪθ (en)ɪz(xx) hˈɪɹ ".to_string()];
        assert_eq!(
            clause_phonemes(&lines, Some(',')),
            "dˈɑːktɚ smˈɪθ ɪz hˈɪɹ, "
        );
        assert_eq!(clause_phonemes(&lines[..1], Some('?')), "dˈɑːktɚ?");
        assert_eq!(clause_phonemes(&lines[..1], None), "dˈɑːktɚ ");
        // NFD: a precomposed ç becomes c and the combining cedilla, as in Piper's map.
        assert_eq!(clause_phonemes(&["ç".to_string()], Some('.')), "c\u{327}.");
        let v = Voice::parse(VOICE).expect("voice");
        assert_eq!(v.ids("c\u{327}").0, [1, 0, 16, 0, 140, 0, 2]);
    }

    #[test]
    fn a_phoneme_map_substitutes_before_the_ids() {
        let json = VOICE.replace(
            r#""phoneme_map": {}"#,
            r#""phoneme_map": {"c": ["s", "t"]}"#,
        );
        let v = Voice::parse(&json).expect("voice");
        assert_eq!(v.ids("c").0, [1, 0, 31, 0, 32, 0, 2]);
    }

    #[test]
    fn unusable_voice_files_say_why() {
        assert!(matches!(Voice::parse("{}"), Err(VoiceError::Json(_))));
        let text = VOICE.replace(r#""phoneme_type": "espeak""#, r#""phoneme_type": "text""#);
        assert_eq!(
            Voice::parse(&text).unwrap_err(),
            VoiceError::PhonemeType("text".into())
        );
        let many = VOICE.replace(r#""num_speakers": 1"#, r#""num_speakers": 4"#);
        assert_eq!(Voice::parse(&many).unwrap_err(), VoiceError::Speakers(4));
        let no_pad = VOICE.replace(r#""_": [0], "#, "");
        assert_eq!(Voice::parse(&no_pad).unwrap_err(), VoiceError::Missing('_'));
        let long = VOICE.replace(r#""a": [14]"#, r#""ab": [14]"#);
        assert_eq!(
            Voice::parse(&long).unwrap_err(),
            VoiceError::Key("ab".into())
        );
    }

    #[test]
    fn words_weigh_their_phonemes_when_espeak_says_one_word_for_each() {
        let v = Voice::parse(VOICE).expect("voice");
        // "Hello, world." → "həlˈoʊ, wˈɜːld.": 5 known phonemes each, stress aside.
        assert_eq!(
            word_weights(&v, &["Hello,", "world."], "həlˈoʊ, wˈɜːld."),
            [5.0, 5.0]
        );
        // "3.5 dollars" said as four words: the letters and digits instead.
        assert_eq!(
            word_weights(&v, &["3.5", "dollars"], "θɹˈiː pɔɪnt fˈaɪv dˈɑːlɚz"),
            [2.0, 7.0]
        );
    }
}
