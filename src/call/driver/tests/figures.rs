//! The conversation figures of docs/conversation.md, in virtual time: real interruptions,
//! backchannels, noises and the agent's own echo (at -20 dB) played over the agent's reply.
//! The test asserts behaviour (real interruptions stop the agent and take the turn; false
//! alarms never take it and the reply is heard to its end) and prints the figures
//! (`cargo test --lib conversation_figures -- --nocapture`).

use super::*;

const BOOKING: &str = "I would like to book a table for four people on Tuesday evening.";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Interruption,
    Backchannel,
    Noise,
    Echo,
}

#[derive(Debug, Default)]
struct Outcome {
    onset_to_clear_ms: Option<u64>,
    committed: bool,
    resumed_and_finished: bool,
    heard_exact: Option<bool>,
    eot_ms: Vec<u64>,
}

/// Plays `overlay` over the agent's reply (the recogniser transcribes it as `transcript`)
/// and reports what happened.
async fn scenario(kind: Kind, overlay: &'static str, transcript: &'static str) -> Outcome {
    let kit = call(
        // The recogniser hands out one transcript per burst of speech it hears; a clip it
        // hears as two bursts gets nothing for the second.
        &[BOOKING, transcript, "", ""],
        vec![Answer::text(&reply()), Answer::text("Sure, no problem.")],
        "idle_nudge_after_s = 0",
    );
    kit.reach_reply().await;
    let leg = &kit.call.leg;
    let pushed_at = leg.now_ms();
    leg.say(&clip(overlay));
    let mut out = Outcome::default();
    let record = if kind == Kind::Interruption {
        kit.brain.wait_turns(2).await;
        out.committed = true;
        kit.call
            .wait_record("the second reply", LIMIT, |r| {
                r.events_of(EventKind::LlmRequest).count() >= 2
            })
            .await
    } else {
        // A false alarm: the reply must still be heard to its end.
        let r = kit
            .call
            .wait_record("the whole reply heard", LIMIT, |r| {
                agent_reply(r).is_some_and(|e| e.heard_text == reply())
            })
            .await;
        out.resumed_and_finished = true;
        out.committed = kit.brain.turns().len() >= 2;
        r
    };
    let state = leg.state();
    // The caller's onset: the clip's first voiced frame.
    let onset = state
        .caller_clips
        .iter()
        .copied()
        .find(|t| *t >= pushed_at)
        .map(|t| t + lead_in_ms(&clip(overlay)));
    let clear = state.clears.iter().copied().find(|c| *c >= pushed_at);
    if let (Some(o), Some(c)) = (onset, clear) {
        out.onset_to_clear_ms = Some(c.saturating_sub(o));
    }
    if kind == Kind::Interruption {
        interruption_checks(&kit, &record, &state, clear, transcript, &mut out);
    }
    out.eot_ms = record
        .events_of(EventKind::TurnEnd)
        .filter_map(|e| e.detail.split("silence_ms=").nth(1)?.parse().ok())
        .collect();
    leg.hang_up();
    let _ = kit.call.finished().await;
    out
}

/// An interruption cut the reply: what was heard is a prefix of it (sentences whose marks
/// came back before the clear, then words of the cut one), and the brain is sent the reply
/// as heard, then the caller's words.
fn interruption_checks(
    kit: &Kit,
    record: &CallRecord,
    state: &LegState,
    clear: Option<u64>,
    transcript: &str,
    out: &mut Outcome,
) {
    let entry = agent_reply(record).expect("reply entry");
    assert!(entry.interrupted, "{entry:?}");
    let clear = clear.expect("an interruption sends clear");
    let k = state
        .marks
        .iter()
        .filter(|(t, n)| *t < clear && n != "u1")
        .count();
    let expected = [S1, S2, S3, S4][..k.min(4)].join(" ");
    assert!(
        reply().starts_with(&entry.heard_text),
        "heard text is a prefix"
    );
    out.heard_exact = Some(
        entry.heard_text.starts_with(&expected)
            && entry.heard_text[expected.len()..]
                .matches(['.', '?'])
                .count()
                <= 1,
    );
    let turns = kit.brain.turns();
    let history = turns.get(1).expect("a second turn");
    let n = history.len();
    assert_eq!(history[n - 1].content, transcript.trim());
    assert_eq!(history[n - 2].role, crate::provider::Role::Assistant);
    assert_eq!(
        history[n - 2].content,
        format!("{} [interrupted by the caller]", entry.heard_text)
    );
}

/// Ms of leading silence in a caller clip (before its first voiced frame).
fn lead_in_ms(ulaw: &[u8]) -> u64 {
    let frames = ulaw
        .chunks(crate::carrier::FRAME_BYTES)
        .take_while(|f| crate::audio::g711::ulaw_energy(f) < 300)
        .count();
    frames as u64 * crate::carrier::FRAME_MS
}

fn pct(v: &mut [u64], p: f64) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    format!("{} ms", v[i])
}

#[tokio::test(start_paused = true)]
async fn conversation_figures() {
    use Kind::*;
    let set: Vec<(Kind, &'static str, &'static str)> = vec![
        (Interruption, "wait_stop", "wait, stop"),
        (Interruption, "no_tuesday", "no, I meant Tuesday"),
        (
            Interruption,
            "change_booking",
            "Could you change my booking to Friday instead?",
        ),
        (Backchannel, "mm_hmm", "mm-hmm"),
        (Backchannel, "yeah", "yeah"),
        (Backchannel, "uh_huh", "uh-huh"),
        (Noise, "cough", ""),
        (Noise, "click", ""),
        (Echo, "agent_echo", S2),
    ];
    let runs: Vec<_> = set
        .iter()
        .map(|(k, o, t)| tokio::spawn(scenario(*k, o, t)))
        .collect();
    let mut results = Vec::new();
    for ((kind, overlay, _), run) in set.iter().zip(runs) {
        let out = run.await.expect("scenario ran");
        println!("{kind:?} {overlay}: {out:?}");
        results.push((*kind, out));
    }
    let real = |k: &Kind| *k == Interruption;
    let mut clear_ms: Vec<u64> = results
        .iter()
        .filter(|(k, _)| real(k))
        .filter_map(|(_, o)| o.onset_to_clear_ms)
        .collect();
    let false_set: Vec<&Outcome> = results
        .iter()
        .filter(|(k, _)| !real(k))
        .map(|(_, o)| o)
        .collect();
    let false_stops = false_set
        .iter()
        .filter(|o| o.onset_to_clear_ms.is_some())
        .count();
    let false_commits = false_set.iter().filter(|o| o.committed).count();
    let resumed = false_set.iter().filter(|o| o.resumed_and_finished).count();
    let real_n = results.iter().filter(|(k, _)| real(k)).count();
    let missed = results
        .iter()
        .filter(|(k, o)| real(k) && (!o.committed || o.onset_to_clear_ms.is_none()))
        .count();
    let heard: Vec<bool> = results.iter().filter_map(|(_, o)| o.heard_exact).collect();
    let mut eot: Vec<u64> = results.iter().flat_map(|(_, o)| o.eot_ms.clone()).collect();
    println!("== conversation figures ==");
    println!(
        "barge-in onset -> clear: p50 {} / p90 {} (n={})",
        pct(&mut clear_ms, 0.5),
        pct(&mut clear_ms, 0.9),
        clear_ms.len()
    );
    println!(
        "false set (backchannel/noise/echo): {} runs, {false_stops} stopped, \
         {false_commits} committed, {resumed} resumed and finished",
        false_set.len()
    );
    println!("missed real interruptions: {missed} of {real_n}");
    println!(
        "heard text = confirmed sentences + words of the cut one: {} of {}",
        heard.iter().filter(|h| **h).count(),
        heard.len()
    );
    println!(
        "end of speech -> turn committed: p50 {} / p90 {} (n={})",
        pct(&mut eot, 0.5),
        pct(&mut eot, 0.9),
        eot.len()
    );
    // Behaviour, not timing: real interruptions stop and take the turn; false alarms never
    // take the turn and the agent always finishes.
    assert_eq!(missed, 0);
    assert_eq!(false_commits, 0);
    assert_eq!(resumed, false_set.len());
}
