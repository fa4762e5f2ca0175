//! The alignment the simulated TTS services send with their audio: every character of the
//! text (spaces included) gets an equal share of the clip, in order, so the timings always
//! match the audio the fake sends. [`word_times`] gives the words (split on whitespace, from
//! the first character's start to the last one's end) exactly as a client rebuilds them from
//! those characters, which is what a test needs to know which words had played by a moment.

/// One character or word and its place in the clip, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub text: String,
    pub start_ms: u32,
    pub end_ms: u32,
}

/// Every character of `text` spread evenly over `total_ms`.
pub fn char_times(text: &str, total_ms: u32) -> Vec<Timed> {
    let n = text.chars().count().max(1) as u64;
    let total = u64::from(total_ms);
    text.chars()
        .enumerate()
        .map(|(i, c)| Timed {
            text: c.to_string(),
            start_ms: (i as u64 * total / n) as u32,
            end_ms: ((i as u64 + 1) * total / n) as u32,
        })
        .collect()
}

/// The words of `text` with the times of their characters from [`char_times`].
pub fn word_times(text: &str, total_ms: u32) -> Vec<Timed> {
    let mut out: Vec<Timed> = Vec::new();
    let mut open = false;
    for c in char_times(text, total_ms) {
        if c.text.trim().is_empty() {
            open = false;
            continue;
        }
        match out.last_mut() {
            Some(w) if open => {
                w.text.push_str(&c.text);
                w.end_ms = c.end_ms;
            }
            _ => {
                out.push(c);
                open = true;
            }
        }
    }
    out
}

/// The words of `text` heard once `played_ms` of its `total_ms` clip had played: those at
/// least half played (the rule patterd applies), counted up to the first that is not.
pub fn words_played(text: &str, total_ms: u32, played_ms: u32) -> usize {
    word_times(text, total_ms)
        .iter()
        .take_while(|w| {
            played_ms >= w.start_ms + (w.end_ms - w.start_ms) / 2 && played_ms > w.start_ms
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_cover_their_characters() {
        // 10 characters over 1000 ms: 100 ms each.
        let w = word_times("ab cd  efg", 1000);
        let got: Vec<_> = w
            .iter()
            .map(|w| (w.text.as_str(), w.start_ms, w.end_ms))
            .collect();
        assert_eq!(
            got,
            vec![("ab", 0, 200), ("cd", 300, 500), ("efg", 700, 1000)]
        );
        assert_eq!(words_played("ab cd  efg", 1000, 99), 0);
        assert_eq!(words_played("ab cd  efg", 1000, 100), 1);
        assert_eq!(words_played("ab cd  efg", 1000, 400), 2);
    }
}
