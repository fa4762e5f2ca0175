//! Whole calls where our detector and the speech-to-text disagree: the fake
//! Deepgram ends a segment on a quiet stretch our detector still hears as speech.

use super::*;

/// The agent's own voice at -20 dB: below the fake Deepgram's speech level, voiced to our
/// detector.
fn quiet_voice(ms: usize) -> Vec<u8> {
    echo_of_agent(ms, 0.1)
}

#[tokio::test]
async fn a_pause_our_detector_bridges_but_the_stt_ends_is_still_one_turn() {
    // "I would like to book…" then a quiet stretch the fake Deepgram ends the segment on
    // (speech_final) while our detector goes on hearing speech, then "move it to the
    // afternoon." One turn, both segments, asked once.
    let first = "I would like to book a table";
    let second = "move it to the afternoon.";
    let stack = stack(&[first, second, "", ""], "idle_nudge_after_s = 0").await;
    stack.hermes.push(HermesReply::text("Done."));
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    let mut audio = clip("book_table");
    audio.extend(quiet_voice(700));
    audio.extend(clip("move_it"));
    sim.push_audio(&audio);
    // A reply heard to its end (with the defect, the second turn cut the first reply and its
    // own reply was the one heard).
    let r = wait_record(&stack, &sid, "a reply heard", |r| {
        r.transcript.iter().any(|e| {
            e.speaker == Speaker::Agent
                && e.text != GREETING
                && !e.interrupted
                && e.heard_text == e.text
        })
    })
    .await;
    if std::env::var_os("CONVERSATION_DEBUG").is_some() {
        for e in &r.events {
            eprintln!("{:6} {} {}", e.t_ms, e.kind, e.detail);
        }
    }
    let dg = stack.dg.record();
    let finals = dg.connections[0].finals_at.len();
    assert!(finals >= 2, "the fake ended two segments ({finals})");
    let h = stack.hermes.record();
    let asked: Vec<String> = h
        .requests
        .iter()
        .filter_map(|q| q.messages().last().map(|(_, c)| c.clone()))
        .collect();
    assert_eq!(asked, vec![format!("{first} {second}")], "{:#?}", r.events);
    assert_eq!(r.events_of("llm_request").count(), 1);
    assert_eq!(r.events_of("interrupted").count(), 0);
    sim.hang_up().await;
    let _ = stack.finished(&sid).await;
}
