//! The ending rules: each class that holds a turn, the complete sentences that must not be
//! held, numbers read in groups against their shapes, spelled addresses.

use super::*;

fn us() -> NumberShapes {
    NumberShapes::default()
}

fn judge(text: &str) -> Ending {
    ending(text, &us())
}

#[test]
fn modal_and_auxiliary_verbs_without_their_verb_hold() {
    for held in [
        "I was wondering if you could",
        "I was wondering if you would",
        "would you",
        "could you",
        "can I",
        "and could we",
        "do you",
        "so maybe tomorrow we could",
        "the doctor said she would",
        "I want to",
        "I would like",
        "I'd like",
        "I really need",
        "I was wondering",
    ] {
        assert_eq!(judge(held), Ending::Unfinished, "{held}");
    }
}

#[test]
fn prepositions_articles_conjunctions_and_clause_openers_hold() {
    for held in [
        "I need to",
        "a table for",
        "the one with the",
        "salmon and",
        "I called because",
        "I was thinking that",
        "I need it so that",
        "I called yesterday so",
        "I'm not sure whether",
        "unless",
        "it was about",
        "something between",
        "as soon as",
        "and then",
        "even though",
        "I was thinking um",
    ] {
        assert_eq!(judge(held), Ending::Unfinished, "{held}");
    }
}

#[test]
fn possessives_and_contractions_hold() {
    for held in [
        "it's for my",
        "can I speak to your",
        "it's under their",
        "it's for my husband's",
        "I'm",
        "and it's",
        "we're",
        "that's",
        "let's",
        "I'll",
    ] {
        assert_eq!(judge(held), Ending::Unfinished, "{held}");
    }
}

#[test]
fn complete_sentences_are_not_held() {
    for done in [
        "can you repeat that",
        "turn it on",
        "I think so",
        "I don't think so",
        "if so",
        "what are you looking at",
        "come in",
        "move it to the afternoon.",
        "yes",
        "yes I can",
        "I will",
        "no we couldn't",
        "call me back if you could",
        "as soon as you can",
        "I would like a table for two at seven.",
        "which days are you open on?",
        "yes, that is right.",
        "I want to cancel",
        "I'd like that",
        "if you want",
        "I was just wondering",
        "how are you",
        "it's at the doctor's",
        "a table for four",
        "party of twelve",
        "at seven thirty",
        "I was born in nineteen eighty",
        "what's that",
        "I like it",
        "see you then",
        "it's nice though",
        "question number 0",
        "option number two",
        "we are a party of 12",
    ] {
        assert_eq!(judge(done), Ending::Complete, "{done}");
    }
}

#[test]
fn a_phone_number_read_in_groups_holds_until_it_is_whole() {
    assert_eq!(judge("my number is four one five"), Ending::Digits);
    assert_eq!(
        judge("my number is four one five five five five"),
        Ending::Digits
    );
    assert_eq!(
        judge("my number is four one five five five five zero one zero zero"),
        Ending::Complete
    );
    // Numerals, with or without the recogniser's dashes.
    assert_eq!(judge("my phone number is 415"), Ending::Digits);
    assert_eq!(judge("my phone number is 415-555"), Ending::Digits);
    assert_eq!(judge("my phone number is 415-555-0100"), Ending::Complete);
    // With the leading 1, NANP has 11 digits: ten of them are not yet whole.
    assert_eq!(
        judge("call me on one four one five five five five zero one zero"),
        Ending::Digits
    );
    assert_eq!(
        judge("call me on one four one five five five five zero one zero zero"),
        Ending::Complete
    );
    // "double" and "oh" are digits too.
    assert_eq!(
        judge("my cell is four one five double five"),
        Ending::Digits
    );
    assert_eq!(
        judge("my cell is four one five double five five oh one oh oh"),
        Ending::Complete
    );
}

#[test]
fn other_shapes_cards_zips_dates_pins() {
    let card = "my card number is 4111 1111 1111";
    assert_eq!(judge(card), Ending::Digits);
    assert_eq!(judge(&format!("{card} 1111")), Ending::Complete);
    assert_eq!(judge("the zip is nine four one"), Ending::Digits);
    assert_eq!(
        judge("the zip is nine four one zero seven"),
        Ending::Complete
    );
    assert_eq!(judge("my date of birth is oh four twelve"), Ending::Digits);
    assert_eq!(
        judge("my date of birth is oh four twelve nineteen eighty"),
        Ending::Complete
    );
    assert_eq!(judge("my pin is one two"), Ending::Digits);
    assert_eq!(judge("my pin is one two three four"), Ending::Complete);
}

#[test]
fn a_run_of_digits_without_a_cue_holds_short_of_every_shape() {
    assert_eq!(judge("it is four one five"), Ending::Digits);
    assert_eq!(judge("it is nine four one zero seven"), Ending::Complete);
    // Longer than every shape: not one of ours, let it end.
    assert_eq!(
        judge("one two three four five six seven eight nine one two three four five six seven"),
        Ending::Complete
    );
}

#[test]
fn order_numbers_take_the_agents_lengths() {
    let shapes = NumberShapes::new(None, &[8], "");
    assert_eq!(
        ending("my order number is one two three four", &shapes),
        Ending::Digits
    );
    assert_eq!(
        ending(
            "my order number is one two three four five six seven eight",
            &shapes
        ),
        Ending::Complete
    );
    // Named in the system prompt instead.
    let shapes = NumberShapes::new(None, &[], "Booking references are 6-digit numbers.");
    assert_eq!(
        ending("the booking reference is one two three", &shapes),
        Ending::Digits
    );
    assert_eq!(
        ending(
            "the booking reference is one two three four five six",
            &shapes
        ),
        Ending::Complete
    );
    let shapes = NumberShapes::new(None, &[], "Ask for the seven digit account number.");
    assert_eq!(shapes.order, [7].into());
    // With no length named, an order number may have any: not held.
    assert_eq!(judge("the order number is four seven"), Ending::Complete);
}

#[test]
fn the_agents_country_decides_the_phone_lengths() {
    let gb = NumberShapes::new(Some("GB"), &[], "");
    // A UK number with its trunk 0: 11 digits.
    let head = "my number is oh seven seven double oh nine double oh";
    assert_eq!(ending(head, &gb), Ending::Digits);
    assert_eq!(
        ending(&format!("{head} one two three"), &gb),
        Ending::Complete
    );
    // The same 10 digits are a whole US number.
    assert_eq!(
        ending(
            "my number is oh seven seven double oh nine double oh nine one",
            &us()
        ),
        Ending::Complete
    );
}

#[test]
fn a_spelled_address_holds_until_its_domain() {
    assert_eq!(judge("my email is j o h n"), Ending::Address);
    assert_eq!(judge("my e-mail is j o h n at"), Ending::Address);
    assert_eq!(
        judge("my email address is j o h n at example"),
        Ending::Address
    );
    assert_eq!(judge("my email is j o h n at example dot"), Ending::Address);
    assert_eq!(
        judge("my email is j o h n at example dot com"),
        Ending::Complete
    );
    assert_eq!(judge("it's j o h n at example"), Ending::Address);
    assert_eq!(judge("j o h n at example dot org"), Ending::Complete);
    assert_eq!(judge("my email is john@example.com"), Ending::Complete);
    assert_eq!(judge("my email is john@example"), Ending::Address);
    // An e-mail mentioned is not an address being read.
    assert_eq!(judge("I sent you an email yesterday"), Ending::Complete);
    assert_eq!(judge("meet me at noon"), Ending::Complete);
}
