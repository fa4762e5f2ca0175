//! Cuts a streamed LLM reply into pieces worth sending to text-to-speech one at a time. The
//! first speakable clause goes out as soon as it exists (it may end at a comma, semicolon or
//! colon once it has about three words), so the caller hears something quickly; later pieces
//! end at sentence boundaries (`.`, `!`, `?` followed by whitespace) or newlines, which keeps
//! the voice's prosody natural. Abbreviations (`Mr.`, `e.g.`, `a.m.` …), decimals (`3.5`),
//! times (`10:30`), URLs, e-mail addresses, ellipses and list numbers never cause a cut.
//! [`speakable`] then removes what a voice must not read out: markdown, link targets, emoji.

/// Words after which a `.` does not end a sentence (compared lower-case, without the dot).
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "st", "sr", "jr", "prof", "vs", "etc", "e.g", "i.e", "a.m", "p.m",
    "approx", "dept", "inc", "ltd", "mt",
];

/// Characters that may close a sentence after its punctuation (`He said "no."`).
fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | ')' | ']' | '”' | '’' | '»')
}

/// The longest piece sent to text-to-speech, in bytes. A reply that runs on without a sentence
/// boundary (a brain listing a table, a model stuck repeating itself) is cut at the last space
/// before this length, so neither the buffer nor one synthesis request grows without bound.
pub const MAX_PIECE_BYTES: usize = 600;

/// Streams text in, sentences out.
#[derive(Debug, Default)]
pub struct SentenceChunker {
    buf: String,
    emitted: usize,
    /// Byte offset in `buf` before which no cut exists: each delta is scanned once, from here,
    /// so a long reply costs linear time, not a rescan of the whole buffer per delta.
    scan_from: usize,
}

impl SentenceChunker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a delta and returns the pieces that are now complete (trimmed, non-empty).
    pub fn push(&mut self, delta: &str) -> Vec<String> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        loop {
            let end = match self.find_cut() {
                Some(end) if end <= MAX_PIECE_BYTES => end,
                // A boundary past the cap (a long run-on sentence): cut inside it.
                Some(_) => self.forced_cut(),
                None if self.buf.len() >= MAX_PIECE_BYTES => self.forced_cut(),
                None => break,
            };
            let piece = self.buf[..end].trim().to_string();
            self.buf.replace_range(..end, "");
            self.scan_from = 0;
            if !piece.is_empty() {
                out.push(piece);
                self.emitted += 1;
            }
        }
        out
    }

    /// Ends the reply: whatever is left, if anything.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        self.scan_from = 0;
        let rest = rest.trim();
        if rest.is_empty() {
            None
        } else {
            self.emitted += 1;
            Some(rest.to_string())
        }
    }

    /// Where to cut a buffer of [`MAX_PIECE_BYTES`] or more that has no natural boundary: after
    /// the last whitespace before the limit, or at the limit (on a character boundary).
    fn forced_cut(&self) -> usize {
        let mut limit = MAX_PIECE_BYTES.min(self.buf.len());
        while !self.buf.is_char_boundary(limit) {
            limit -= 1;
        }
        // Past the whole whitespace character: it may be multi-byte (U+00A0, U+3000).
        let space = self.buf[..limit]
            .char_indices()
            .rev()
            .find(|(_, c)| c.is_whitespace());
        match space {
            Some((i, c)) if !self.buf[..i].trim().is_empty() => i + c.len_utf8(),
            _ => limit.max(self.buf.ceil_char_boundary(1)),
        }
    }

    /// The byte index just past the first cut point in the buffer, if there is one yet.
    /// Scanning starts at `scan_from`; it ends at the first position that cannot be judged
    /// until more text arrives, which is where the next scan resumes.
    fn find_cut(&mut self) -> Option<usize> {
        let s = self.buf.as_str();
        let mut it = s[self.scan_from..]
            .char_indices()
            .map(|(i, c)| (i + self.scan_from, c))
            .peekable();
        let mut prev: Option<char> = s[..self.scan_from].chars().next_back();
        let mut undecided = None;
        while let Some((i, c)) = it.next() {
            let before = prev;
            prev = Some(c);
            match c {
                '\n' if !s[..i].trim().is_empty() => return Some(i + 1),
                '.' | '!' | '?' => {
                    let rest = &s[i + c.len_utf8()..];
                    // Runs of punctuation ("?!", "...") are judged at their last character.
                    if rest.starts_with(['.', '!', '?']) {
                        continue;
                    }
                    if c == '.' && before == Some('.') {
                        continue; // ellipsis
                    }
                    // Skip closing quotes/brackets, then require whitespace.
                    let after = rest.trim_start_matches(is_closer);
                    let Some(next) = after.chars().next() else {
                        undecided = Some(i); // can't tell yet ("3." may become "3.5")
                        break;
                    };
                    if !next.is_whitespace() {
                        continue; // decimals, URLs, e-mail addresses, "e.g"
                    }
                    if c == '.' && self.dot_is_not_an_end(&s[..i]) {
                        continue;
                    }
                    return Some(s.len() - after.len());
                }
                ',' | ';' | ':' if self.emitted == 0 => {
                    let Some(&(_, next)) = it.peek() else {
                        undecided = Some(i);
                        break;
                    };
                    if next.is_whitespace() && s[..i].split_whitespace().count() >= 3 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        self.scan_from = undecided.unwrap_or(s.len());
        None
    }

    /// `before` is the text up to (not including) a `.` followed by whitespace.
    fn dot_is_not_an_end(&self, before: &str) -> bool {
        let word = before
            .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '"')
            .next()
            .unwrap_or("");
        let lower = word.to_lowercase();
        if ABBREVIATIONS.contains(&lower.as_str()) {
            return true;
        }
        // A single initial ("J. Smith").
        let mut cs = word.chars();
        if let (Some(c), None) = (cs.next(), cs.next())
            && c.is_alphabetic()
        {
            return true;
        }
        // A list number at the start of a line ("1. Bring your ID").
        let line = before.rsplit('\n').next().unwrap_or("");
        let line = line.trim();
        !line.is_empty() && line.len() <= 3 && line.chars().all(|c| c.is_ascii_digit())
    }
}

/// Text a voice can read: markdown markers, list bullets and heading marks removed, links
/// replaced by their text, emoji dropped, whitespace collapsed to single spaces.
pub(crate) fn speakable(text: &str) -> String {
    let mut lines = Vec::new();
    for line in text.lines() {
        let mut l = line.trim_start();
        loop {
            let before = l;
            for p in ["- ", "* ", "+ ", "• ", "> "] {
                if let Some(rest) = l.strip_prefix(p) {
                    l = rest.trim_start();
                }
            }
            if l.starts_with('#') {
                let rest = l.trim_start_matches('#');
                if rest.starts_with(' ') || rest.is_empty() {
                    l = rest.trim_start();
                }
            }
            if l == before {
                break;
            }
        }
        lines.push(l);
    }
    let joined = lines.join("\n");
    let delinked = strip_links(&joined);

    let chars: Vec<char> = delinked.chars().collect();
    let mut out = String::with_capacity(delinked.len());
    for (k, &c) in chars.iter().enumerate() {
        match c {
            '*' | '`' | '#' => continue,
            '_' => {
                let prev_word = k > 0 && chars[k - 1].is_alphanumeric();
                let next_word = chars.get(k + 1).is_some_and(|n| n.is_alphanumeric());
                if prev_word && next_word {
                    out.push('_'); // snake_case, user_name@example.com
                }
            }
            c if is_emoji(c) => {}
            c => out.push(c),
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `[text](target)` → `text`; bare `http(s)://` prefixes dropped.
fn strip_links(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        if let Some(close) = after.find(']')
            && after[close + 1..].starts_with('(')
            && let Some(paren) = after[close + 1..].find(')')
        {
            out.push_str(&rest[..open]);
            out.push_str(&after[..close]);
            rest = &after[close + 1 + paren + 1..];
            continue;
        }
        out.push_str(&rest[..open + 1]);
        rest = after;
    }
    out.push_str(rest);
    out.replace("https://", "").replace("http://", "")
}

fn is_emoji(c: char) -> bool {
    matches!(c as u32,
        0x1F000..=0x1FAFF   // pictographs, emoticons, transport, flags, skin tones
        | 0x2600..=0x27BF   // misc symbols, dingbats (☀ ✓ ✨)
        | 0x2B00..=0x2BFF   // arrows and stars (⭐)
        | 0x2300..=0x23FF   // ⌚ ⏰
        | 0xFE00..=0xFE0F   // variation selectors
        | 0x200D            // zero-width joiner
        | 0x20E3            // keycap
        | 0xE0020..=0xE007F // tag characters
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the parser property tests: a sentence boundary past the cap made a piece
    /// longer than [`MAX_PIECE_BYTES`].
    #[test]
    fn a_boundary_past_the_cap_still_cuts_at_the_cap() {
        let long = format!("{} {}. Next.", "word ".repeat(110), "x".repeat(80));
        let pieces = run(&[&long]);
        assert!(
            pieces.iter().all(|p| p.len() <= MAX_PIECE_BYTES),
            "{pieces:?}"
        );
        assert_eq!(pieces.concat().replace(' ', ""), long.replace(' ', ""));
    }

    /// Found by the parser property tests: a forced cut after a multi-byte space (U+00A0)
    /// sliced inside the character and panicked.
    #[test]
    fn a_forced_cut_after_a_multibyte_space_does_not_panic() {
        for pad in 590..600 {
            let text = format!("{}\u{a0}{}", "x".repeat(pad), "y".repeat(700));
            let pieces = run(&[&text]);
            assert!(pieces.iter().all(|p| p.len() <= MAX_PIECE_BYTES), "{pad}");
            assert_eq!(
                pieces.concat().len(),
                text.trim().len() - "\u{a0}".len(),
                "{pad}"
            );
        }
    }

    fn run(deltas: &[&str]) -> Vec<String> {
        let mut c = SentenceChunker::new();
        let mut out = Vec::new();
        for d in deltas {
            out.extend(c.push(d));
        }
        out.extend(c.finish());
        out
    }

    fn chars(s: &str) -> Vec<String> {
        // Feed one character at a time: the worst case for a streaming splitter.
        let parts: Vec<String> = s.chars().map(String::from).collect();
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        run(&refs)
    }

    #[test]
    fn sentences_split_at_terminators() {
        assert_eq!(
            chars("Hello there. How are you? Great!"),
            vec!["Hello there.", "How are you?", "Great!"]
        );
    }

    #[test]
    fn first_chunk_may_end_at_a_comma_after_three_words() {
        assert_eq!(
            chars("Sure thing, I can help with that, really. Then more, and more."),
            vec![
                "Sure thing, I can help with that,",
                "really.",
                "Then more, and more."
            ]
        );
        assert_eq!(
            chars("Well, let me see about that: it is fine."),
            vec!["Well, let me see about that:", "it is fine."]
        );
        assert_eq!(
            chars("Okay then; we are done here."),
            vec!["Okay then; we are done here."]
        );
        assert_eq!(
            chars("One two three; four."),
            vec!["One two three;", "four."]
        );
    }

    #[test]
    fn first_chunk_is_released_before_the_reply_ends() {
        let mut c = SentenceChunker::new();
        assert!(c.push("Let me check").is_empty());
        assert_eq!(
            c.push(" that for you, ok"),
            vec!["Let me check that for you,"]
        );
        assert!(c.push(" and then").is_empty());
        assert_eq!(c.push(" call back. Bye"), vec!["ok and then call back."]);
        assert_eq!(c.finish(), Some("Bye".into()));
        assert_eq!(c.finish(), None);
    }

    #[test]
    fn waits_for_the_character_after_the_dot() {
        let mut c = SentenceChunker::new();
        assert!(c.push("It costs 3.").is_empty());
        assert!(c.push("5 dollars").is_empty());
        assert_eq!(c.push(". Ok"), vec!["It costs 3.5 dollars."]);
    }

    #[test]
    fn abbreviations_do_not_split() {
        assert_eq!(
            chars("Mr. Smith and Dr. Jones met Mrs. Lee and Ms. Park on Main St. today. Next."),
            vec![
                "Mr. Smith and Dr. Jones met Mrs. Lee and Ms. Park on Main St. today.",
                "Next."
            ]
        );
        assert_eq!(
            chars("Bring things, e.g. an ID, i.e. a passport, etc. and more. Done."),
            vec![
                "Bring things, e.g. an ID,",
                "i.e. a passport, etc. and more.",
                "Done."
            ]
        );
        assert_eq!(
            chars("Open from 9 a.m. to 5 p.m. on weekdays. Thanks."),
            vec!["Open from 9 a.m. to 5 p.m. on weekdays.", "Thanks."]
        );
        assert_eq!(
            chars("Cats vs. dogs is a debate. Yes."),
            vec!["Cats vs. dogs is a debate.", "Yes."]
        );
        assert_eq!(
            chars("Ask J. Smith now. Ok."),
            vec!["Ask J. Smith now.", "Ok."]
        );
    }

    #[test]
    fn decimals_times_urls_emails_do_not_split() {
        assert_eq!(
            chars(
                "The rate is 3.5 percent at 10:30 today. Visit www.example.com/a.b or mail a.b@example.co.uk now. Bye."
            ),
            vec![
                "The rate is 3.5 percent at 10:30 today.",
                "Visit www.example.com/a.b or mail a.b@example.co.uk now.",
                "Bye."
            ]
        );
        assert_eq!(
            chars("See https://x.io/path?q=1. Then go."),
            vec!["See https://x.io/path?q=1.", "Then go."]
        );
    }

    #[test]
    fn ellipses_do_not_split() {
        assert_eq!(
            chars("Well... I think so. And … maybe. Hmm?! Yes."),
            vec!["Well... I think so.", "And … maybe.", "Hmm?!", "Yes."]
        );
    }

    #[test]
    fn newlines_split_and_list_numbers_do_not() {
        assert_eq!(
            chars("Options:\n1. First one\n2. Second one\n\nDone"),
            vec!["Options:", "1. First one", "2. Second one", "Done"]
        );
    }

    #[test]
    fn closing_quotes_stay_with_their_sentence() {
        assert_eq!(
            chars("He said \"no.\" Then left. (Really.) Ok."),
            vec!["He said \"no.\"", "Then left.", "(Really.)", "Ok."]
        );
    }

    #[test]
    fn whole_deltas_and_whitespace() {
        assert_eq!(
            run(&["  \n\n", "Hi. ", "  ", "There."]),
            vec!["Hi.", "There."]
        );
        assert_eq!(run(&[]), Vec::<String>::new());
        assert_eq!(run(&["   "]), Vec::<String>::new());
    }

    #[test]
    fn a_reply_without_boundaries_is_cut_at_a_bounded_length() {
        // 200 KB without a sentence end, streamed in small deltas: pieces stay bounded (the
        // buffer never holds the whole reply) and nothing is lost or duplicated.
        let word = "lorem ";
        let total: String = word.repeat(200_000 / word.len());
        let mut c = SentenceChunker::new();
        let mut pieces = Vec::new();
        for delta in total.as_bytes().chunks(7) {
            pieces.extend(c.push(std::str::from_utf8(delta).expect("ascii")));
            assert!(
                c.buf.len() < MAX_PIECE_BYTES + 7,
                "buffer grew to {}",
                c.buf.len()
            );
        }
        pieces.extend(c.finish());
        assert!(pieces.len() > 300, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| p.len() <= MAX_PIECE_BYTES));
        assert!(
            pieces
                .iter()
                .all(|p| !p.starts_with(' ') && p.ends_with("lorem"))
        );
        assert_eq!(pieces.join(" "), total.trim());
    }

    #[test]
    fn a_run_on_word_is_cut_on_a_character_boundary() {
        let long: String = "é".repeat(MAX_PIECE_BYTES);
        let mut c = SentenceChunker::new();
        let mut pieces = c.push(&long);
        pieces.extend(c.finish());
        assert!(pieces.iter().all(|p| p.len() <= MAX_PIECE_BYTES));
        assert_eq!(pieces.concat(), long);
    }

    #[test]
    fn a_cut_decided_late_is_found_after_a_resumed_scan() {
        let mut c = SentenceChunker::new();
        assert!(c.push("It costs 3").is_empty());
        assert!(c.push(".").is_empty());
        assert_eq!(c.push("5 dollars. And"), vec!["It costs 3.5 dollars."]);
        assert_eq!(c.finish().as_deref(), Some("And"));
        // An ellipsis split across deltas is still not a sentence end; the "?" after it is.
        let mut c = SentenceChunker::new();
        assert!(c.push("Wait.").is_empty());
        assert!(c.push(".").is_empty());
        assert!(c.push(". Yes").is_empty());
        assert_eq!(c.push("? No"), vec!["Wait... Yes?"]);
    }

    #[test]
    fn speakable_strips_markdown() {
        assert_eq!(
            speakable("**Bold** and *it* and `code`"),
            "Bold and it and code"
        );
        assert_eq!(speakable("# Title\n## Sub"), "Title Sub");
        assert_eq!(
            speakable("- one\n* two\n+ three\n• four"),
            "one two three four"
        );
        assert_eq!(speakable("> quoted"), "quoted");
        assert_eq!(
            speakable("__under__ _it_ snake_case"),
            "under it snake_case"
        );
        assert_eq!(
            speakable("See [our site](https://example.com/x) now"),
            "See our site now"
        );
        assert_eq!(speakable("a [b] c (d)"), "a [b] c (d)");
        assert_eq!(speakable("Go to https://example.com"), "Go to example.com");
        assert_eq!(speakable("C# is #1"), "C is 1");
    }

    #[test]
    fn speakable_strips_emoji_and_collapses_whitespace() {
        assert_eq!(speakable("Great 😀 job ✅ ⭐️ 👍🏽"), "Great job");
        assert_eq!(speakable("👨‍👩‍👧 family 🇺🇸"), "family");
        assert_eq!(speakable("  a \n\t b  "), "a b");
        assert_eq!(
            speakable("Café – naïve, 10:30, 3.5%"),
            "Café – naïve, 10:30, 3.5%"
        );
        assert_eq!(speakable(""), "");
    }
}
