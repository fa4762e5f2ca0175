//! Whether the caller's words so far can end an utterance, for the [`Endpointer`]: a pure
//! judgement of the text's last words. Words that cannot end a sentence (an article, a
//! preposition that needs its object, a conjunction or clause opener, a possessive, a modal or
//! auxiliary without its verb, a contracted "I'm"/"it's") make the pause wait
//! `unfinished_hold_ms`; a number being read in groups that does not yet have a whole number
//! of digits of a known shape (a phone number of the agent's country, a card, a ZIP code or
//! postcode, a date, an order number of a length the agent names) and a spelled e-mail
//! address without its top-level domain wait up to `max_endpointing_ms`. Everything else
//! (complete sentences, and endings that are often complete: "that", "on", "so" in "I think
//! so") ends at the normal silence.
//!
//! [`Endpointer`]: super::Endpointer

use std::collections::BTreeSet;

use super::words;

/// How the caller's words so far end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// They can end here: the normal silence decides.
    Complete,
    /// The last word cannot end a sentence ("to", "the", "if", "could", "my"):
    /// `unfinished_hold_ms`.
    Unfinished,
    /// A number being read in groups, short of a whole number of a known shape:
    /// up to `max_endpointing_ms`.
    Digits,
    /// A spelled e-mail address without its top-level domain yet: up to `max_endpointing_ms`.
    Address,
}

impl Ending {
    /// Whether the turn should wait longer than the normal silence.
    pub(crate) fn holds(self) -> bool {
        self != Ending::Complete
    }

    /// The name in a `turn_held` event.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ending::Complete => "complete",
            Ending::Unfinished => "unfinished",
            Ending::Digits => "digits",
            Ending::Address => "address",
        }
    }
}

/// The lengths (in digits) a number read to the agent may have: the whole numbers it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NumberShapes {
    /// National significant number lengths of the agent's country's phone numbers.
    national: &'static [usize],
    /// The country's calling code ("1" for NANP), for a number read with it.
    calling_code: &'static str,
    /// The country dials national numbers with a trunk "0" ("07700 900123").
    trunk: bool,
    /// Order, account, reference and booking numbers: the lengths the agent names.
    order: BTreeSet<usize>,
}

impl Default for NumberShapes {
    fn default() -> Self {
        Self::new(None, &[], "")
    }
}

impl NumberShapes {
    /// The shapes of an agent in `country` (none: NANP) that names `order_lengths`, plus the
    /// lengths its system prompt names ("a 6-digit booking reference", "8 digits").
    pub(crate) fn new(country: Option<&str>, order_lengths: &[u64], prompt: &str) -> Self {
        let (_, calling_code, national, trunk) = crate::util::phone::COUNTRIES
            .iter()
            .find(|(c, ..)| country.is_some_and(|x| c.eq_ignore_ascii_case(x)))
            .copied()
            .unwrap_or(crate::util::phone::COUNTRIES[0]);
        let mut order: BTreeSet<usize> = order_lengths
            .iter()
            .filter_map(|n| usize::try_from(*n).ok())
            .filter(|n| (1..=32).contains(n))
            .collect();
        order.extend(lengths_named(prompt));
        Self {
            national,
            calling_code,
            trunk,
            order,
        }
    }

    /// Whole phone numbers for a number whose first digits are `leading`: with the trunk 0,
    /// with the calling code, or national. NANP numbers never start with 1 nationally, so
    /// one read with a leading 1 needs its 11 digits.
    fn phone(&self, leading: &str) -> BTreeSet<usize> {
        let code = self.calling_code;
        let national = self.national.iter().copied();
        if code == "1" {
            let n = if leading.starts_with('1') { 1 } else { 0 };
            return national.map(|x| x + n).collect();
        }
        if self.trunk && leading.starts_with('0') {
            return national.map(|x| x + 1).collect();
        }
        if leading.starts_with(code) || code.starts_with(leading) && !leading.is_empty() {
            // Read with the calling code ("four four seven seven…"), or too short to tell.
            let mut s: BTreeSet<usize> = national.clone().map(|x| x + code.len()).collect();
            if !self.trunk {
                s.extend(national);
            }
            return s;
        }
        national.collect()
    }
}

/// Digit counts a text names: "6-digit", "8 digits", "eight digit".
fn lengths_named(text: &str) -> Vec<usize> {
    let lower = text.to_lowercase();
    let tokens: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || c == '-')
        .filter(|t| !t.is_empty())
        .collect();
    let mut out = Vec::new();
    for pair in tokens.windows(2) {
        if !pair[1].starts_with("digit") {
            continue;
        }
        let n = pair[0]
            .parse::<usize>()
            .ok()
            .or_else(|| NUMBER_WORDS.iter().position(|w| *w == pair[0]));
        if let Some(n) = n.filter(|n| (3..=32).contains(n)) {
            out.push(n);
        }
    }
    out
}

const NUMBER_WORDS: &[&str] = &[
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
];

/// Words after which a sentence cannot end: articles, prepositions that need an object,
/// conjunctions, clause openers, possessives, copulas, hesitations. Words that often end a
/// sentence too ("that", "on", "in", "at", "so", "it", "since", "her", "before") are judged
/// by [`unfinished_in_context`] or not at all.
const UNFINISHED: &[&str] = &[
    // articles and determiners that need a noun
    "the",
    "a",
    "an",
    "every",
    "each", // conjunctions
    "and",
    "or",
    "but",
    "nor", // clause openers
    "if",
    "whether",
    "unless",
    "because",
    "although",
    "cos",
    "cause", // prepositions
    "to",
    "of",
    "for",
    "with",
    "from",
    "into",
    "onto",
    "about",
    "than",
    "between",
    "during",
    "towards",
    "toward",
    "upon",
    "until",
    "till",
    "via",
    "regarding",
    "including",
    "concerning",
    "as", // possessives
    "my",
    "your",
    "our",
    "their",
    "his",
    "its",
    "whose", // copulas
    "is",
    "are",
    "was",
    "were",
    "am",
    "be",
    "been", // hesitations
    "um",
    "uh",
    "er",
    "erm",
    "uhm",
];

/// Modal verbs: without their verb ("if you could…", "would you…") a sentence is unfinished.
const MODALS: &[&str] = &[
    "could", "would", "can", "will", "shall", "should", "might", "must", "may",
];

/// Subject pronouns (a modal or "do" before one asks a question whose verb is still to come).
const PRONOUNS: &[&str] = &["i", "you", "we", "they", "he", "she", "it", "someone"];

/// Words that start a short answer ("yes I can", "sure we could").
const ANSWERS: &[&str] = &[
    "yes", "yeah", "yep", "no", "nope", "sure", "okay", "ok", "well", "maybe", "probably",
];

/// Verbs after which "if" or "whether" opens a question whose verb is to come: "I was
/// wondering if you could…". After others ("call me back if you could") the modal ends it.
const ASKING: &[&str] = &[
    "wondering",
    "wonder",
    "wondered",
    "asking",
    "ask",
    "asked",
    "check",
    "checking",
    "see",
    "curious",
    "hoping",
];

/// Words before "that" that make it open a clause ("I think that…", "so that…", "the
/// thing that…"), not point at something ("can you repeat that").
const THAT_OPENERS: &[&str] = &[
    "said",
    "says",
    "saying",
    "think",
    "thinking",
    "thought",
    "hope",
    "hoping",
    "believe",
    "guess",
    "noticed",
    "realized",
    "realised",
    "wish",
    "worried",
    "afraid",
    "sure",
    "seems",
    "seemed",
    "so",
    "such",
    "now",
    "except",
    "given",
    "assuming",
    "provided",
    "means",
    "suggest",
    "feel",
    "felt",
    "one",
    "thing",
    "something",
    "anything",
    "everything",
    "nothing",
    "someone",
    "anyone",
    "place",
    "reason",
    "problem",
    "issue",
    "fact",
];

/// Words before "so" after which it ends the sentence ("I think so", "if so").
const SO_ENDS: &[&str] = &[
    "think", "hope", "guess", "believe", "suppose", "expect", "say", "said", "told", "if", "not",
    "even", "why", "more", "really", "just", "do", "did", "is", "so", "and", "imagine", "afraid",
    "thought", "seems", "appears", "or",
];

/// True when `text` ends on words that usually continue ("I need to…"): [`Ending::Unfinished`]
/// alone (numbers and addresses are judged with their shapes, [`ending`]).
#[cfg(test)]
pub(crate) fn looks_unfinished(text: &str) -> bool {
    let w = words(text);
    unfinished_in_context(&w)
}

/// How the caller's `text` so far ends, given the number shapes the agent knows.
pub(crate) fn ending(text: &str, shapes: &NumberShapes) -> Ending {
    let w = words(text);
    if w.is_empty() {
        return Ending::Complete;
    }
    if address_open(text, &w) {
        return Ending::Address;
    }
    if let Some(e) = digits_open(&w, shapes) {
        return e;
    }
    if unfinished_in_context(&w) {
        return Ending::Unfinished;
    }
    Ending::Complete
}

/// The word-class rules on the lower-case words `w`.
fn unfinished_in_context(w: &[String]) -> bool {
    let Some(last) = w.last().map(String::as_str) else {
        return false;
    };
    let prev = |k: usize| -> &str { w.len().checked_sub(k + 1).map_or("", |i| w[i].as_str()) };
    if UNFINISHED.contains(&last) {
        return true;
    }
    // A contracted auxiliary never ends a clause ("yes it is", never "yes it's").
    if let Some((stem, tail)) = last.rsplit_once('\'') {
        return match tail {
            "m" | "re" | "ve" | "ll" | "d" => true,
            "s" if PRONOUNS.contains(&stem)
                || matches!(
                    stem,
                    "that" | "there" | "here" | "what" | "who" | "where" | "let" | "how"
                ) =>
            {
                true
            }
            // A possessive noun ("my wife's…"), unless it names a place ("at the doctor's")
            // or an owner ("it is John's").
            "s" => !(1..=2).any(|k| {
                matches!(
                    prev(k),
                    "at" | "to" | "from" | "is" | "it's" | "that's" | "was" | "s"
                )
            }),
            _ => false,
        };
    }
    if MODALS.contains(&last) {
        return modal_unfinished(w);
    }
    if PRONOUNS.contains(&last) {
        // "would you", "can I", "do you": the question's verb is to come ("do it" is done).
        let p = prev(1);
        return MODALS.contains(&p)
            || matches!(p, "do" | "does" | "did") && !matches!(last, "it" | "someone");
    }
    match last {
        "that" => THAT_OPENERS.contains(&prev(1)),
        "so" => w.len() > 1 && !SO_ENDS.contains(&prev(1)),
        "then" => matches!(prev(1), "and" | "but" | "or"),
        "though" => prev(1) == "even",
        "like" => matches!(
            prev(1),
            "would" | "i'd" | "we'd" | "you'd" | "something" | "looks" | "sounds" | "feels"
        ),
        "want" | "need" => {
            matches!(prev(1), "i" | "we" | "they" | "really" | "just")
                && !matches!(prev(2), "if" | "as" | "what" | "whatever")
        }
        "wondering" => prev(1) != "just",
        _ => false,
    }
}

/// A modal at the end (`w`'s last word): unfinished unless it ends a short answer ("yes, I
/// can"), a request's condition ("call me back if you could", "as soon as you can") or a
/// comparison.
fn modal_unfinished(w: &[String]) -> bool {
    let n = w.len();
    let subject = n >= 2 && PRONOUNS.contains(&w[n - 2].as_str());
    if !subject {
        // "in May", "a can": not the verb; "the doctor could…" is rare enough to let go.
        return false;
    }
    let before = if n >= 3 { w[n - 3].as_str() } else { "" };
    match before {
        "if" | "whether" => {
            // "I was wondering if you could…" (or a question opening with "if") continues;
            // "call me back if you could" is a whole request.
            n < 4 || ASKING.contains(&w[n - 4].as_str())
        }
        "when" | "whenever" | "as" | "than" | "where" | "wherever" | "what" | "how" => false,
        _ => {
            let short_answer = n <= 4 || ANSWERS.contains(&w[0].as_str());
            !short_answer
        }
    }
}

/// Words that introduce a number and decide its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cue {
    Phone,
    Card,
    Zip,
    Date,
    Order,
    Pin,
    Security,
    Ssn,
}

fn cue_of(word: &str, before: &str) -> Option<Cue> {
    Some(match word {
        "phone" | "cell" | "mobile" | "telephone" | "callback" | "call" | "reach" | "text"
        | "fax" => Cue::Phone,
        "card" | "visa" | "mastercard" | "amex" => Cue::Card,
        "zip" | "zipcode" | "postal" => Cue::Zip,
        "date" | "birth" | "born" | "dob" | "birthday" => Cue::Date,
        "order" | "account" | "reference" | "confirmation" | "booking" | "reservation"
        | "ticket" | "tracking" | "member" | "membership" | "policy" | "invoice" | "customer"
        | "case" | "claim" | "id" => Cue::Order,
        "pin" => Cue::Pin,
        "cvv" | "cvc" | "security" => Cue::Security,
        "ssn" | "social" => Cue::Ssn,
        // "number" names its kind by the word before it ("order number"); "my number",
        // "the best number" is a phone's; "question number one" is no number being read.
        "number" => match cue_of(before, "") {
            Some(c) => c,
            None if matches!(
                before,
                "my" | "the"
                    | "your"
                    | "our"
                    | "his"
                    | "her"
                    | "their"
                    | "a"
                    | "best"
                    | "contact"
                    | "home"
                    | "work"
                    | "direct"
            ) =>
            {
                Cue::Phone
            }
            None => return None,
        },
        _ => return None,
    })
}

/// Digits one spoken token stands for: `Some(n)` for a number word or a numeral, `None` for
/// anything else. "double"/"triple" count as 0 here (they repeat the next digit).
fn token_digits(t: &str) -> Option<(usize, Token)> {
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        return Some((t.len(), Token::Numeral));
    }
    let digit = [
        "zero", "oh", "o", "one", "two", "three", "four", "five", "six", "seven",
    ];
    if digit.contains(&t) || matches!(t, "eight" | "nine" | "nought") {
        return Some((1, Token::Digit));
    }
    if NUMBER_WORDS[10..20].contains(&t) {
        return Some((2, Token::Teen));
    }
    if matches!(
        t,
        "twenty" | "thirty" | "forty" | "fifty" | "sixty" | "seventy" | "eighty" | "ninety"
    ) {
        return Some((2, Token::Tens));
    }
    match t {
        "hundred" => Some((2, Token::Hundred)),
        "thousand" => Some((3, Token::Thousand)),
        "double" | "triple" => Some((0, Token::Repeat(if t == "double" { 2 } else { 3 }))),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Digit,
    Numeral,
    Teen,
    Tens,
    Hundred,
    Thousand,
    Repeat(usize),
}

/// The number being read at the end of `w`, if there is one and it is short of a whole
/// number: [`Ending::Digits`]; `Some(Complete)` when it is whole; `None` when the text does
/// not end on a number being read.
fn digits_open(w: &[String], shapes: &NumberShapes) -> Option<Ending> {
    // Raw tokens with punctuation kept apart ("415-555" is one numeral group per part).
    let mut start = w.len();
    while start > 0 && is_number_token(&w[start - 1], start - 1, w) {
        start -= 1;
    }
    if start == w.len() {
        return None;
    }
    let run = &w[start..];
    let mut digits = 0usize;
    let mut single = 0usize;
    let mut repeat = 1usize;
    let mut prev: Option<Token> = None;
    let mut leading = String::new();
    let year_like = run.first().is_some_and(|t| {
        matches!(t.as_str(), "nineteen" | "twenty" | "two")
            || t.len() == 4 && (t.starts_with("19") || t.starts_with("20"))
    });
    for t in run {
        let t = t.replace('\'', "");
        let (n, kind) = token_digits(&t)?;
        match kind {
            Token::Repeat(k) => {
                repeat = k;
                prev = Some(kind);
                continue;
            }
            // "forty two": the digit takes the tens' place.
            Token::Digit if prev == Some(Token::Tens) => {}
            Token::Digit => {
                digits += repeat;
                single += repeat;
            }
            Token::Numeral => {
                digits += n;
                if n >= 3 {
                    single += n;
                }
            }
            _ => digits += n,
        }
        if leading.len() < 3 {
            leading.push_str(&match kind {
                Token::Numeral => t.clone(),
                Token::Digit => digit_char(&t).to_string().repeat(repeat),
                _ => "x".into(),
            });
        }
        repeat = 1;
        prev = Some(kind);
    }
    // The cue: the nearest word before the run that names a kind of number.
    let cue = (0..start)
        .rev()
        .take(6)
        .find_map(|i| cue_of(&w[i], if i > 0 { &w[i - 1] } else { "" }));
    if (cue.is_none() && single < 3) || digits < 2 {
        // "a table for two at seven", "at seven thirty", "my pin is four": a quantity, a
        // time or a first digit, not a number being read in groups.
        return None;
    }
    let whole: BTreeSet<usize> = match cue {
        Some(Cue::Phone) => shapes.phone(&leading),
        Some(Cue::Card) => [15, 16].into(),
        Some(Cue::Zip) => [5, 9].into(),
        // "oh four twelve" is not yet a date of birth; "nineteen eighty" is a year.
        Some(Cue::Date) if year_like => [4, 6, 8].into(),
        Some(Cue::Date) => [6, 8].into(),
        Some(Cue::Pin) => [4, 6].into(),
        Some(Cue::Security) => [3, 4].into(),
        Some(Cue::Ssn) => [9].into(),
        Some(Cue::Order) if !shapes.order.is_empty() => shapes.order.clone(),
        // An order number of a length nobody named: any length may be whole.
        Some(Cue::Order) => return None,
        None => {
            let mut s = shapes.phone(&leading);
            s.extend([5, 9, 15, 16]);
            s.extend(shapes.order.iter().copied());
            s
        }
    };
    let longest = whole.iter().max().copied().unwrap_or(0);
    Some(if whole.contains(&digits) || digits > longest {
        // Whole, or longer than any shape (a misheard digit, or not one of ours).
        Ending::Complete
    } else {
        Ending::Digits
    })
}

fn digit_char(t: &str) -> char {
    match t {
        "zero" | "oh" | "o" | "nought" => '0',
        "one" => '1',
        "two" => '2',
        "three" => '3',
        "four" => '4',
        "five" => '5',
        "six" => '6',
        "seven" => '7',
        "eight" => '8',
        "nine" => '9',
        _ => 'x',
    }
}

/// Whether `w[i]` can be part of a number being read ("oh" and "o" only between digits).
fn is_number_token(t: &str, i: usize, w: &[String]) -> bool {
    let t = t.replace('\'', "");
    match t.as_str() {
        "oh" | "o" => {
            let next_digit = w
                .get(i + 1)
                .is_some_and(|n| token_digits(n).is_some_and(|(_, k)| k == Token::Digit));
            let prev_number = i > 0 && token_digits(&w[i - 1].replace('\'', "")).is_some();
            prev_number || next_digit
        }
        _ => token_digits(&t).is_some(),
    }
}

/// Top-level domains an address read aloud usually ends with.
const TLDS: &[&str] = &[
    "com", "org", "net", "edu", "gov", "io", "co", "uk", "us", "ca", "de", "fr", "info", "biz",
    "me", "ai", "au", "ie", "nl", "es", "it", "in",
];

/// A spelled e-mail address under way: after "my e-mail (address) is", or spelled letters
/// and "at" (or an "@"), until a top-level domain ends it ("… dot com", "gmail.com").
fn address_open(text: &str, w: &[String]) -> bool {
    let lower = text.to_lowercase();
    // "my e-mail is …" ("e-mail" is two words here) or "my email address is …".
    let cue = (0..w.len()).rev().find_map(|i| {
        let named = w[i] == "email" || (w[i] == "mail" && i > 0 && w[i - 1] == "e");
        if !named {
            return None;
        }
        let mut j = i + 1;
        if w.get(j).is_some_and(|x| x == "address") {
            j += 1;
        }
        matches!(w.get(j).map(String::as_str), Some("is" | "it's" | "its")).then_some(j + 1)
    });
    let at = w
        .iter()
        .rposition(|x| x == "at")
        .filter(|&i| i >= 2 && spelled(&w[i - 1]) && spelled(&w[i - 2]));
    let start = match (cue, at) {
        (Some(j), _) => j,
        (None, Some(i)) => i - 2,
        (None, None) if lower.contains('@') => 0,
        (None, None) => return false,
    };
    let Some(tail) = w.get(start..).filter(|t| !t.is_empty()) else {
        // "my e-mail is" and nothing yet: the copula holds it.
        return false;
    };
    // Done once a domain ends it: "dot com", or a raw "gmail.com".
    let last = tail.last().map(String::as_str).unwrap_or("");
    let spoken_tld = TLDS.contains(&last) && tail.len() >= 2 && tail[tail.len() - 2] == "dot";
    let raw_last = lower
        .split_whitespace()
        .last()
        .unwrap_or("")
        .trim_end_matches(['.', '?', '!', ',']);
    let written_tld = raw_last
        .rsplit_once('.')
        .is_some_and(|(name, tld)| !name.is_empty() && TLDS.contains(&tld));
    // An address is a few dozen letters at most: a longer tail is not one.
    !(spoken_tld || written_tld) && tail.len() <= 40
}

/// A token of a spelled address: a letter, a digit, or the words that join them.
fn spelled(t: &str) -> bool {
    t.chars().count() == 1 || token_digits(t).is_some()
}

#[cfg(test)]
mod tests;
