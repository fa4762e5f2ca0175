//! Unit tests of the utterance queue and the mouth: queueing, marks, pause, resume, clear.

use super::*;

/// Queues `text` and plays the actor's part for its synthesis at once: the stream is asked for
/// and its chunks of `audio` (then `Done`, when `done`) come back.
fn push_synth(
    s: &mut Mouth,
    kind: UttKind,
    text: &str,
    entry: usize,
    audio: &[usize],
    done: bool,
) -> u64 {
    let id = s.push(kind, text.into(), entry);
    if let Some(u) = s.queue.iter_mut().find(|u| u.id == id) {
        u.started = true;
    }
    for n in audio {
        s.on_tts(id, Some(TtsEvent::Audio(Bytes::from(vec![0x55u8; *n]))));
    }
    if done {
        s.on_tts(id, Some(TtsEvent::Done));
    }
    id
}

/// A `Mouth` with one `Say` queued for each `(text, audio chunk sizes, synthesis done)`,
/// entries in order from 0, and their synthesized audio taken in.
async fn says(utts: &[(&str, &[usize], bool)]) -> Mouth {
    let mut s = Mouth::new();
    for (entry, (text, audio, done)) in utts.iter().enumerate() {
        push_synth(&mut s, UttKind::Say, text, entry, audio, *done);
    }
    s
}

fn audio_frames(p: &Pumped) -> usize {
    p.commands
        .iter()
        .filter(|c| matches!(c, MediaCommand::Audio(b) if b.len() == FRAME_BYTES))
        .count()
}

#[tokio::test]
async fn pacer_stays_one_second_ahead_and_marks_each_utterance() {
    let mut s = Mouth::new();
    // 3 s of audio in one utterance, then a short one.
    push_synth(&mut s, UttKind::Greeting, "a", 0, &[24_000], true);
    push_synth(&mut s, UttKind::Say, "b", 1, &[100], true);
    let t0 = Instant::now();
    let first = s.pump(t0);
    // 1 s of lead = 50 frames, no more.
    assert_eq!(audio_frames(&first), 50);
    assert_eq!(first.started, vec![(1, UttKind::Greeting)]);
    // Nothing more until real time moves on.
    assert_eq!(audio_frames(&s.pump(t0)), 0);
    let next = s.next_deadline(t0).expect("deadline");
    assert!(next > t0);
    // Each second of real time lets one more second of audio out.
    assert_eq!(audio_frames(&s.pump(t0 + Duration::from_secs(1))), 50);
    let later = s.pump(t0 + Duration::from_secs(2));
    assert_eq!(
        audio_frames(&later),
        50,
        "the greeting's last second, then its mark"
    );
    // The short utterance (padded to one frame) waits for lead, then gets its mark.
    let last = s.pump(t0 + Duration::from_secs(3));
    assert_eq!(audio_frames(&last), 1);
    let marks: Vec<_> = later
        .commands
        .iter()
        .chain(last.commands.iter())
        .filter_map(|c| match c {
            MediaCommand::Mark(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(marks, vec!["u1".to_string(), "u2".to_string()]);
    assert!(s.is_speaking());
    assert_eq!(s.on_mark("u1").map(|x| x.text), Some("a".to_string()));
    assert_eq!(s.on_mark("u2").map(|x| x.entry), Some(1));
    assert!(!s.is_speaking());
    assert!(s.on_mark("u2").is_none());
}

#[tokio::test]
async fn clear_settles_unacknowledged_marks_as_unheard() {
    let mut s = says(&[("one", &[160], true), ("two", &[320], false)]).await;
    let t0 = Instant::now();
    let p = s.pump(t0);
    assert_eq!(audio_frames(&p), 3);
    let cleared = s.clear(t0);
    assert!(cleared.need_clear);
    assert_eq!(cleared.unheard.len(), 1);
    assert_eq!(cleared.unheard[0].text, "one");
    assert_eq!(cleared.dropped.len(), 1);
    assert_eq!(cleared.dropped[0].text, "two");
    assert!(!s.is_speaking());
    // A late echo of the cleared mark is ignored.
    assert!(s.on_mark("u1").is_none());
}

#[tokio::test]
async fn pause_keeps_unconfirmed_audio_and_resume_resends_it() {
    let mut s = says(&[
        ("one", &[320], true),
        ("two", &[320], true),
        ("three", &[480], false),
    ])
    .await;
    let t0 = Instant::now();
    let p = s.pump(t0);
    // one (2 frames) + mark, two (2 frames) + mark, three (3 frames, synthesis still open).
    assert_eq!(audio_frames(&p), 7);
    assert_eq!(s.on_mark("u1").map(|x| x.text), Some("one".into()));
    assert!(s.is_playing(t0));
    let paused = s.pause(t0);
    assert!(paused.need_clear);
    assert_eq!(paused.withdrawn, vec!["u2".to_string()]);
    assert!(!s.is_playing(t0));
    assert_eq!(
        audio_frames(&s.pump(t0)),
        0,
        "nothing goes out while paused"
    );
    assert!(s.next_deadline(t0).is_none());
    // The stale echo of the withdrawn mark is ignored.
    assert!(s.on_mark("u2").is_none());
    s.resume();
    let later = t0 + Duration::from_secs(5);
    let again = s.pump(later);
    // "two" in full, then the 3 frames of "three" already sent before the pause.
    assert_eq!(audio_frames(&again), 5);
    let marks: Vec<_> = again
        .commands
        .iter()
        .filter_map(|c| match c {
            MediaCommand::Mark(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(marks, vec!["u2.1".to_string()]);
    assert_eq!(s.on_mark("u2.1").map(|x| x.text), Some("two".into()));
}

#[tokio::test]
async fn filler_goes_before_unstarted_replies() {
    let mut s = Mouth::new();
    s.push(UttKind::Reply { turn: 1 }, "reply".into(), 0);
    s.push_front_unstarted(UttKind::Filler { turn: 1 }, "wait".into(), 1);
    let order: Vec<_> = s.queued().map(|u| u.text.clone()).collect();
    assert_eq!(order, vec!["wait".to_string(), "reply".to_string()]);
    let wants: Vec<_> = s.wants_tts().into_iter().map(|(_, t)| t).collect();
    assert_eq!(wants, vec!["wait".to_string(), "reply".to_string()]);
}

/// Utterances dropped while their synthesis runs are reported for cancelling, once; finished
/// or never-asked-for ones are not.
#[test]
fn dropped_utterances_with_synthesis_running_are_reported_for_cancelling() {
    let mut s = Mouth::new();
    let done = push_synth(&mut s, UttKind::Say, "done", 0, &[160], true);
    let running = s.push(UttKind::Reply { turn: 1 }, "running".into(), 1);
    let later = s.push(UttKind::Reply { turn: 1 }, "later".into(), 2);
    let asked: Vec<u64> = s.take_synthesis().into_iter().map(|(id, _)| id).collect();
    assert_eq!(asked, vec![running, later]);
    assert!(s.take_synthesis().is_empty(), "asked for once");
    let unasked = s.push(UttKind::Filler { turn: 1 }, "filler".into(), 3);
    s.keep_current();
    assert_eq!(s.take_cancelled(), vec![running, later]);
    assert!(s.take_cancelled().is_empty());
    assert!(s.queued().any(|u| u.id == done));
    assert!(!s.queued().any(|u| u.id == unasked));
    let id = s.push(UttKind::Filler { turn: 2 }, "wait".into(), 4);
    assert_eq!(s.take_synthesis().len(), 1);
    s.drop_unstarted(|k| matches!(k, UttKind::Filler { .. }));
    assert_eq!(s.take_cancelled(), vec![id]);
    let id = s.push(UttKind::Say, "more".into(), 5);
    s.take_synthesis();
    let _ = s.clear(Instant::now());
    assert_eq!(s.take_cancelled(), vec![id]);
}
