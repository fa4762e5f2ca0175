//! The conversation scenario suite: scripted whole calls generated from the
//! clip × condition grid of `tests/fixtures/suite` (espeak-ng voices and rates, real human
//! speech, coughs, laughs; street, café and line-hiss noise at 20 and 10 dB SNR; the agent's
//! voice echoed at −20 and −6 dB), run through the Twilio simulator against the fakes, several
//! at a time, in real time. The fake Deepgram transcribes from a word track (the words each
//! clip carries and when the simulator played them), so it behaves like a recogniser on the
//! mixed audio: noise, coughs and laughs give no words. Each scenario knows its expected
//! outcome; the runner counts the misses per condition with 95 % Wilson intervals and prints
//! the markdown table of docs/conversation.md:
//!
//! `cargo test --release --test calls suite::conversation_suite -- --ignored --nocapture`
//!
//! Environment: `SUITE_AGENT_EXTRA` (extra `[agents.X]` lines, e.g. `turn_model =
//! "st"`), `SUITE_EXTRA_CONFIG` (top-level sections they name, e.g. `[turn_model.st]`),
//! `SUITE_LABEL`, `SUITE_FILTER` (substrings of scenario ids, comma-separated: any matches),
//! `SUITE_CONCURRENCY` (default 20), `SUITE_VERBOSE` (each call's events and transcript),
//! `SUITE_STT_LAG_MS` (the fake recogniser's lag: each word reported this long after it ends),
//! `SUITE_FIXED_ECHO` (the echo scenarios push a fixed 2.4 s clip of the agent's voice over
//! the reply, as before the echo check, instead of the simulator's live echo of everything
//! the carrier played, 120 ms late, from the greeting on; the recogniser's words are the
//! same).
//! `suite_machinery_on_five_scenarios` runs five of them in every `cargo test`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::fixtures::clip;
use crate::common::*;
use patterd::audio::g711::{decode_ulaw, encode_ulaw};
use patterd::call::{CallRecord, Speaker};
use patterd_sim::hermes::HermesReply;
use patterd_sim::twilio::call::{EchoConfig, SimCall, SimState, TimelineEvent};
use patterd_sim::words::{WordTrack, spread_words, voiced_spans};

mod grid;
mod report;

use grid::*;
use report::*;

/// What happened in one scenario.
#[derive(Debug, Default, Clone)]
struct Outcome {
    /// The agent was stopped (`clear`) after the caller's clip began.
    stopped: bool,
    /// The caller's overlay became a turn (a second brain request).
    took_turn: bool,
    /// The reply was heard to its end (false alarms: resumed).
    finished_reply: bool,
    onset_to_clear_ms: Option<u64>,
    /// Mid-thought: the head was committed on its own.
    cut: bool,
    /// Complete turns: the turn reached the brain whole (not split, not lost).
    whole_turn: bool,
    /// From the caller's last audio to the first frame of the agent's answer.
    dead_air_ms: Option<u64>,
    /// Words in the stored heard text minus words heard before playback stopped (the clear).
    heard_error_words: Option<i64>,
    /// The agent never got to speak: its greeting (or the reply the clip should play over)
    /// did not play within 30 s, e.g. because the VAD heard the noise as endless speech.
    stuck: Option<&'static str>,
    /// Something the runner could not establish (counted as a failure of the scenario).
    error: Option<String>,
}

/// Waits up to `limit` until the call's record satisfies `pred`; `None` if it never does.
async fn wait_rec(
    stack: &Stack,
    sid: &str,
    limit: Duration,
    pred: impl Fn(&CallRecord) -> bool,
) -> Option<CallRecord> {
    let calls = &stack.server.app.calls;
    let wait = async {
        let Some(h) = calls.get(sid) else {
            return calls.finished(sid);
        };
        let mut changes = h.changes();
        loop {
            match h.snapshot().await {
                Ok(r) if pred(&r) => return Some(r),
                Ok(_) => {}
                Err(_) => return calls.wait_finished(sid).await,
            }
            if changes.changed().await.is_err() {
                return calls.wait_finished(sid).await;
            }
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .ok()
        .flatten()
        .filter(|r| pred(r))
}

async fn snapshot(stack: &Stack, sid: &str) -> Option<CallRecord> {
    match stack.server.app.calls.get(sid) {
        Some(h) => h.snapshot().await.ok(),
        None => stack.server.app.calls.finished(sid),
    }
}

fn requests(r: &CallRecord) -> usize {
    r.events_of("llm_request").count()
}

fn agent_reply(r: &CallRecord) -> Option<&patterd::call::TranscriptEntry> {
    r.transcript
        .iter()
        .find(|e| e.speaker == Speaker::Agent && e.text.starts_with("We are open"))
}

/// The caller's turns as the brain got them (the last user message of each request).
fn brain_turns(stack: &Stack) -> Vec<String> {
    stack
        .hermes
        .record()
        .requests
        .iter()
        .filter_map(|r| r.messages().last().map(|(_, c)| c.clone()))
        .collect()
}

/// Words of `s` (lowercase, punctuation dropped).
fn words_of(s: &str) -> Vec<String> {
    s.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric() || *c == '\'')
                .collect::<String>()
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Queues a clip with its words into the call's track.
fn say(sim: &SimCall, track: &Arc<WordTrack>, name: &str) {
    let (audio, words) = clip_with_words(name);
    sim.push_words(&audio, words, track);
}

/// The stream time (ms) at which audio queued now starts: after what is already queued.
fn queue_end_ms(s: &SimState) -> u64 {
    (s.frames_sent + s.speech_frames_queued as u64) * 20
}

/// First agent audio received at or after `ms`.
fn first_agent_audio_after(s: &SimState, ms: u64) -> Option<u64> {
    s.timeline
        .iter()
        .find(|e| e.at_ms >= ms && matches!(e.event, TimelineEvent::ReceivedMedia { .. }))
        .map(|e| e.at_ms)
}

/// Words of the reply the caller heard when the carrier's playback stopped at position `pos`
/// (bytes; the final `clear`), from the simulator's own knowledge: what it played (its
/// utterances, split by marks and clears) and how the fake ElevenLabs aligned each sentence
/// (characters spread evenly over `clip_bytes(sentence)` of audio). The rule is the one
/// patterd applies (`patterd_sim::alignment::words_played`): sentences played to their end
/// count whole; in the sentence playing at the stop, the words at least half played, up to the
/// first that was not. An earlier `clear` (a stop the agent resumed from) means the sentence it
/// cut is sent again from its start, so it is not counted twice (nor is a greeting cut and
/// resumed taken for the reply).
fn words_played_before(s: &SimState, pos: u64, clip_bytes: impl Fn(&str) -> usize) -> Option<i64> {
    // The reply follows the greeting (one sentence), which ends with the first utterance played
    // to its mark: a stop the agent resumed from may have cut it before.
    let greeting = s
        .utterances
        .iter()
        .position(|u| u.mark.is_some() && !u.cleared)?;
    let mut n = 0i64;
    let mut k = 0;
    for u in &s.utterances[greeting + 1..] {
        let Some(sentence) = SENTENCES.get(k) else {
            break;
        };
        let start = u.end_pos - u.bytes;
        if pos <= start {
            break;
        }
        if pos >= u.end_pos {
            if !u.cleared {
                // Played to its end.
                n += words_of(sentence).len() as i64;
                k += 1;
            }
            // Cut by an earlier clear: the agent resumed, sending this sentence again.
            continue;
        }
        let total_ms = u32::try_from(clip_bytes(sentence) / 8).ok()?;
        let played_ms = u32::try_from((pos - start) / 8).ok()?;
        n += patterd_sim::alignment::words_played(sentence, total_ms, played_ms) as i64;
        break;
    }
    Some(n)
}

const LIMIT: Duration = Duration::from_secs(30);

/// The echo's round trip on the simulated line.
const ECHO_DELAY_MS: u64 = 120;

/// `SUITE_FIXED_ECHO`: the echo scenarios push a fixed clip of the agent's voice instead of
/// the line's live echo of what was played (the runs before the echo check).
fn fixed_echo() -> bool {
    std::env::var_os("SUITE_FIXED_ECHO").is_some()
}

/// `SUITE_STT_LAG_MS`: the fake recogniser reports each word this long after it was said
/// (default 0, the ideal recogniser of every figure before 2026-12-01).
fn stt_lag_ms() -> u64 {
    std::env::var("SUITE_STT_LAG_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn run(sc: &Scenario, agent_extra: &str, speech_rms: f64) -> Outcome {
    let track = Arc::new(WordTrack::new());
    let stack = Stack::start(Opts {
        agent_extra: format!("idle_nudge_after_s = 0\n{agent_extra}"),
        voice: Some((clip("agent_voice"), 60)),
        long_turn_after_s: 20.0,
        words: Some(track.clone()),
        word_lag_ms: stt_lag_ms(),
        // Top-level sections the agent lines refer to, e.g. a `[turn_model.NAME]`.
        extra_config: std::env::var("SUITE_EXTRA_CONFIG").unwrap_or_default(),
        ..Default::default()
    })
    .await;
    let mut out = Outcome::default();
    let long_reply = sc.kind.overlays_reply();
    let long = reply();
    stack.hermes.push(HermesReply::text(if long_reply {
        &long
    } else if sc.kind == Kind::FastTurn {
        "Sure."
    } else {
        "Okay."
    }));
    let (sid, sim) = stack.call().await;
    sim.set_background(noise_bed(sc.cond, speech_rms));
    if let Kind::Echo { db } = sc.kind
        && !fixed_echo()
    {
        // The line echoes everything the carrier plays, from the greeting on.
        sim.set_echo(Some(EchoConfig {
            delay_ms: ECHO_DELAY_MS,
            gain_db: f32::from(db),
        }));
    }
    if sim
        .wait_for("greeting mark", LIMIT, |s| !s.marks_echoed.is_empty())
        .await
        .is_err()
    {
        out.stuck = Some("the greeting never played");
        if std::env::var_os("SUITE_VERBOSE").is_some()
            && let Some(r) = snapshot(&stack, &sid).await
        {
            for e in &r.events {
                eprintln!("{:6} {} {}", e.t_ms, e.kind, e.detail);
            }
        }
        return out;
    }
    if long_reply {
        overlay(&stack, &sid, &sim, &track, sc, &mut out).await;
    } else {
        turns(&stack, &sid, &sim, &track, sc, &mut out).await;
    }
    let s = sim.state();
    if !s.protocol_errors.is_empty() && out.error.is_none() {
        out.error = Some(format!("protocol errors: {:?}", s.protocol_errors));
    }
    if std::env::var_os("SUITE_VERBOSE").is_some()
        && let Some(r) = snapshot(&stack, &sid).await
    {
        eprintln!("--- {} {out:?}", sc.id);
        for e in &r.events {
            eprintln!("{:6} {} {}", e.t_ms, e.kind, e.detail);
        }
        for t in &r.transcript {
            eprintln!("  {:?}: {}", t.speaker, t.text);
        }
    }
    sim.hang_up().await;
    let _ = tokio::time::timeout(LIMIT, stack.server.app.calls.wait_finished(&sid)).await;
    out
}

/// Interruption, backchannel, burst and echo: the caller's clip plays over the long reply
/// once its first sentence has been heard.
async fn overlay(
    stack: &Stack,
    sid: &str,
    sim: &SimCall,
    track: &Arc<WordTrack>,
    sc: &Scenario,
    out: &mut Outcome,
) {
    let booking = clip("book_table");
    let words = spread_words(BOOKING, &voiced_spans(&booking, VOICED_LEVEL));
    sim.push_words(&booking, words, track);
    if sim
        .wait_for("first reply sentence heard", LIMIT, |s| {
            s.marks_echoed.len() >= 2
        })
        .await
        .is_err()
    {
        out.stuck = Some("the reply never played");
        return;
    }
    stack.hermes.push(HermesReply::text("Sure, no problem."));
    let pushed_at = queue_end_ms(&sim.state());
    match sc.kind {
        Kind::Echo { .. } if !fixed_echo() => {
            // The line has echoed the agent since the greeting; a recogniser hears the
            // sentence being spoken for as long as the clip would last.
            let words = spread_words(SENTENCES[1], &[(0, 2400)]);
            sim.push_words(&vec![0xFF; 2400 * 8], words, track);
        }
        Kind::Echo { db } => {
            // The agent's voice coming back; a recogniser hears the sentence being spoken.
            let gain = 10f32.powf(f32::from(db) / 20.0);
            let voice = clip("agent_voice");
            let pcm: Vec<i16> = decode_ulaw(&voice[..2400 * 8])
                .into_iter()
                .map(|s| (f32::from(s) * gain) as i16)
                .collect();
            let audio = encode_ulaw(&pcm);
            let words = spread_words(SENTENCES[1], &[(0, 2400)]);
            sim.push_words(&audio, words, track);
        }
        _ => say(sim, track, &sc.clip),
    }
    let record = if sc.kind == Kind::Interruption {
        wait_rec(stack, sid, Duration::from_secs(10), |r| requests(r) >= 2).await
    } else {
        wait_rec(stack, sid, LIMIT, |r| {
            requests(r) >= 2 || agent_reply(r).is_some_and(|e| e.heard_text == reply())
        })
        .await
    };
    let record = match record {
        Some(r) => r,
        None => match snapshot(stack, sid).await {
            Some(r) => r,
            None => {
                out.error = Some("no call record".into());
                return;
            }
        },
    };
    let s = sim.state();
    out.took_turn = requests(&record) >= 2;
    out.finished_reply = agent_reply(&record).is_some_and(|e| e.heard_text == reply());
    let clear = s.clears.iter().position(|c| *c >= pushed_at);
    out.stopped = clear.is_some();
    let onset = s
        .timeline
        .iter()
        .find(|e| e.at_ms >= pushed_at && e.event == TimelineEvent::SentSpeechStart)
        .map(|e| e.at_ms);
    if let (Some(o), Some(i)) = (onset, clear) {
        out.onset_to_clear_ms = Some(s.clears[i].saturating_sub(o));
    }
    if sc.kind == Kind::Interruption
        && out.took_turn
        && let Some(i) = clear
        && let Some(entry) = agent_reply(&record)
    {
        // The last clear is the one that ended the reply (an earlier one was a stop resumed).
        let last = s.clears.len() - 1;
        debug_assert!(last >= i);
        let played =
            words_played_before(&s, s.cleared_at_pos[last], |t| stack.el.expected_bytes(t));
        out.heard_error_words = played.map(|p| words_of(&entry.heard_text).len() as i64 - p);
    }
}

/// Mid-thought pauses, complete turns and fast turn-taking: the caller speaks after the
/// greeting.
async fn turns(
    stack: &Stack,
    sid: &str,
    sim: &SimCall,
    track: &Arc<WordTrack>,
    sc: &Scenario,
    out: &mut Outcome,
) {
    let texts = clip_texts();
    let text = texts.get(&sc.clip).cloned().unwrap_or_default();
    let expect_turn = match &sc.kind {
        Kind::MidThought { tail, pause_ms, .. } => {
            stack.hermes.push(HermesReply::text("Okay."));
            say(sim, track, &sc.clip);
            sim.push_silence(*pause_ms);
            say(sim, track, tail);
            format!("{text} {}", texts.get(tail).cloned().unwrap_or_default())
        }
        Kind::FastTurn => {
            // A first turn and its short answer; the caller's next turn starts 100 ms after
            // the answer's last audio.
            stack.hermes.push(HermesReply::text("Okay."));
            say(sim, track, "done_yes_that_is_right_0");
            if sim
                .wait_for("the first answer", LIMIT, |s| s.marks_echoed.len() >= 2)
                .await
                .is_err()
            {
                out.stuck = Some("the first answer never played");
                return;
            }
            sim.push_silence(100);
            say(sim, track, &sc.clip);
            text.clone()
        }
        _ => {
            say(sim, track, &sc.clip);
            text.clone()
        }
    };
    let first = requests_before(stack, sid).await;
    let want = words_of(&expect_turn);
    let last_word = want.last().cloned().unwrap_or_default();
    // Wait until a turn carrying the last word reached the brain, and its answer played.
    let got = wait_rec(stack, sid, LIMIT, |r| requests(r) > first).await;
    if got.is_none() {
        // Never committed: the turn is lost (`whole_turn` stays false).
        return;
    }
    let done = sim
        .wait_for("the answer to the whole turn", LIMIT, |s| {
            s.speech_frames_queued == 0
                && s.last_speech_frame_ms
                    .is_some_and(|l| first_agent_audio_after(s, l).is_some())
        })
        .await;
    let turns = brain_turns(stack);
    let new_turns = &turns[first.min(turns.len())..];
    out.cut = new_turns.len() > 1
        || new_turns
            .first()
            .is_some_and(|t| words_of(t).last() != Some(&last_word));
    out.whole_turn = new_turns
        .first()
        .is_some_and(|t| words_of(t).ends_with(&want));
    // No answer after the caller's last words: no dead-air figure, and the turn is not whole
    // (counted there).
    if let Ok(s) = done {
        let last = s.last_speech_frame_ms.unwrap_or(0);
        out.dead_air_ms = first_agent_audio_after(&s, last).map(|a| a - last);
    }
}

/// Brain requests made before the scenario's caller turn (fast turn-taking has one).
async fn requests_before(stack: &Stack, sid: &str) -> usize {
    snapshot(stack, sid).await.map_or(0, |r| requests(&r))
}

/// Runs `set` `concurrency` at a time; returns the outcomes in order.
async fn run_all(set: &[Scenario], concurrency: usize, agent_extra: &str) -> Vec<Outcome> {
    let speech = speech_rms();
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let tasks: Vec<_> = set
        .iter()
        .cloned()
        .map(|sc| {
            let sem = sem.clone();
            let extra = agent_extra.to_string();
            tokio::spawn(async move {
                let _permit = sem.acquire_owned().await.expect("semaphore");
                let o = run(&sc, &extra, speech).await;
                if std::env::var_os("SUITE_VERBOSE").is_some() {
                    eprintln!("{} → {o:?}", sc.id);
                }
                o
            })
        })
        .collect();
    let mut outs = Vec::new();
    for t in tasks {
        outs.push(t.await.unwrap_or_else(|e| Outcome {
            error: Some(format!("scenario panicked: {e}")),
            ..Default::default()
        }));
    }
    outs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the whole suite takes minutes; run it on purpose (docs/conversation.md)"]
async fn conversation_suite() {
    let filter = std::env::var("SUITE_FILTER").unwrap_or_default();
    let set: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| filter.split(',').any(|f| s.id.contains(f)))
        .collect();
    let concurrency = std::env::var("SUITE_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let extra = std::env::var("SUITE_AGENT_EXTRA").unwrap_or_default();
    let label = std::env::var("SUITE_LABEL").unwrap_or_else(|_| "silence-only".into());
    let started = std::time::Instant::now();
    let outs = run_all(&set, concurrency, &extra).await;
    println!(
        "== conversation suite: {} scenarios, {label}, {} at a time, {:.0} s ==\n",
        set.len(),
        concurrency,
        started.elapsed().as_secs_f64()
    );
    println!("{}", report(&set, &outs));
    assert!(!set.is_empty(), "no scenario matches SUITE_FILTER={filter}");
}

#[test]
fn the_grid_has_a_hundred_scenarios_with_words_for_every_speech_clip() {
    let set = scenarios();
    assert!(set.len() >= 100, "{}", set.len());
    let texts = clip_texts();
    for s in &set {
        if !matches!(s.kind, Kind::Burst | Kind::Echo { .. }) {
            let (audio, words) = clip_with_words(&s.clip);
            assert!(texts.contains_key(&s.clip), "{}", s.id);
            assert!(!words.is_empty(), "{}", s.id);
            // Words lie within the clip.
            assert!(
                words
                    .last()
                    .is_some_and(|w| w.end_ms <= audio.len() as u64 / 8 + 20)
            );
        }
    }
    // A head is finished by its own tail, in the same voice: "I need to" by "move it to the
    // afternoon.", a real reading by the rest of the same reading.
    let texts_of = |n: &str| texts.get(n).cloned().unwrap_or_default();
    for s in &set {
        if let Kind::MidThought { tail, real, .. } = &s.kind {
            if *real {
                assert_eq!(s.clip.strip_prefix("rhead_"), tail.strip_prefix("rtail_"));
            } else {
                assert_eq!(
                    s.clip.rsplit('_').next(),
                    tail.rsplit('_').next(),
                    "{}",
                    s.id
                );
            }
        }
    }
    assert_eq!(texts_of("head_i_need_to_0"), "I need to");
    let need = set
        .iter()
        .find_map(|s| match &s.kind {
            Kind::MidThought { tail, .. } if s.clip == "head_i_need_to_0" => Some(tail.clone()),
            _ => None,
        })
        .expect("a pause after \"I need to\"");
    assert_eq!(texts_of(&need), "move it to the afternoon.");
    // Every condition has every family.
    for c in CONDITIONS {
        let fams: std::collections::BTreeSet<&str> = set
            .iter()
            .filter(|s| s.cond == c)
            .map(|s| s.kind.family())
            .collect();
        assert_eq!(fams.len(), 9, "{c:?}: {fams:?}");
    }
    assert_eq!(wilson(0, 10), "0/10 (0 %, 0–28)");
    assert_eq!(wilson(5, 10), "5/10 (50 %, 24–76)");
}

/// Five scenarios of the grid in every `cargo test`, with the outcomes that are clear-cut
/// today: a real interruption in clean audio stops the agent and takes the turn; a complete
/// turn in line hiss is answered whole; a short cough never takes the turn and the reply is
/// heard to its end; a pause after "I need to" is one turn; the line's echo of the agent at
/// -6 dB never stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_machinery_on_five_scenarios() {
    let all = scenarios();
    let find = |f: &dyn Fn(&Scenario) -> bool| all.iter().find(|s| f(s)).cloned().expect("in grid");
    let set = vec![
        find(&|s| s.kind == Kind::Interruption && s.cond.noise == Noise::Clean),
        find(&|s| {
            s.kind == Kind::Complete && s.cond.noise == Noise::Hiss && s.clip.starts_with("done_")
        }),
        find(&|s| s.kind == Kind::Burst && s.clip == "cough_short"),
        find(&|s| {
            matches!(&s.kind, Kind::MidThought { .. }) && s.clip.starts_with("head_i_need_to")
        }),
        find(&|s| s.kind == Kind::Echo { db: -6 } && s.cond.noise == Noise::Clean),
    ];
    let outs = run_all(&set, 4, "").await;
    for (s, o) in set.iter().zip(&outs) {
        assert!(o.error.is_none() && o.stuck.is_none(), "{}: {o:?}", s.id);
    }
    let (int, done, cough, mid, echo) = (&outs[0], &outs[1], &outs[2], &outs[3], &outs[4]);
    assert!(int.stopped && int.took_turn, "{int:?}");
    assert!(int.onset_to_clear_ms.is_some(), "{int:?}");
    assert!(int.heard_error_words.is_some(), "{int:?}");
    assert!(done.whole_turn && !done.cut, "{done:?}");
    assert!(done.dead_air_ms.is_some(), "{done:?}");
    assert!(!cough.took_turn && cough.finished_reply, "{cough:?}");
    assert!(!mid.cut && mid.whole_turn, "{mid:?}");
    if !fixed_echo() {
        // The line's echo of the agent at -6 dB, transcribed by the recogniser: the agent is
        // never stopped and says its whole reply.
        assert!(
            !echo.stopped && !echo.took_turn && echo.finished_reply,
            "{echo:?}"
        );
    }
}
