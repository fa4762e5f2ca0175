//! Unit tests of the fake Deepgram's transcription (level mode and word-track mode).

use super::*;

#[test]
fn linear16_level_tells_speech_from_silence() {
    let pcm = |v: i16| v.to_le_bytes().repeat(320);
    assert_eq!(pcm16_level(&pcm(0)), 0.0);
    assert!(pcm16_level(&pcm(-4000)) > SPEECH_LEVEL);
    assert!(pcm16_level(&pcm(120)) < SPEECH_LEVEL);
    // 16-bit silence read as μ-law would be full scale: the reason linear16 is separate.
    assert!(mulaw_level(&pcm(0)) > SPEECH_LEVEL);
}

/// Feeds 20 ms μ-law blocks to word-track ears with `lag_ms` until `until_ms` and returns each
/// result with the audio time it was sent at.
fn transcribe(lag_ms: u64, until_ms: u64) -> Vec<(u64, Value)> {
    let track = WordTrack::new();
    let word = |w: &str, start_ms, end_ms| TimedWord {
        start_ms,
        end_ms,
        word: w.into(),
    };
    track.add([word("wait", 100, 400), word("stop", 500, 800)]);
    let p = Params {
        endpointing_ms: Some(300),
        utterance_end_ms: None,
        vad_events: true,
        interim: true,
        request_id: "req".into(),
        linear16: false,
    };
    let mut ears = Ears {
        lag_ms,
        ..Ears::default()
    };
    let block = [0xFFu8; 160];
    let mut got = Vec::new();
    while ears.audio_ms < until_ms {
        let mut out = Vec::new();
        ears.step_words(&p, &track, &block, &mut out);
        got.extend(out.into_iter().map(|v| (ears.audio_ms, v)));
    }
    got
}

/// When each transcript (interim or final) was sent, with its text.
fn transcripts(got: &[(u64, Value)]) -> Vec<(u64, bool, String)> {
    got.iter()
        .filter(|(_, v)| v["type"] == "Results")
        .map(|(at, v)| {
            let text = v["channel"]["alternatives"][0]["transcript"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (*at, v["is_final"] == true, text)
        })
        .collect()
}

#[test]
fn word_track_reports_each_word_after_the_recognisers_lag() {
    let started = |got: &[(u64, Value)]| {
        got.iter()
            .find(|(_, v)| v["type"] == "SpeechStarted")
            .map(|(at, _)| *at)
    };
    // No lag: each word the moment it has been said; the final 300 ms after the last word.
    let now = transcribe(0, 1500);
    assert_eq!(started(&now), Some(120));
    assert_eq!(
        transcripts(&now),
        vec![
            (400, false, "wait".into()),
            (800, false, "wait stop".into()),
            (1100, true, "wait stop".into()),
        ]
    );
    // 250 ms of lag: the interims come 250 ms later, the speech start does not move, and the
    // final (300 ms after the last word) still waits for every word to be due.
    let lagged = transcribe(250, 1500);
    assert_eq!(started(&lagged), Some(120));
    assert_eq!(
        transcripts(&lagged),
        vec![
            (660, false, "wait".into()),
            (1060, false, "wait stop".into()),
            (1100, true, "wait stop".into()),
        ]
    );
    // A lag longer than the endpointing delays the final as well.
    let slow = transcribe(450, 1500);
    assert_eq!(
        transcripts(&slow).last(),
        Some(&(1260, true, "wait stop".into()))
    );
}
