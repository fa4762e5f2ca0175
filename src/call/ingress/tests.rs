use super::*;
use crate::audio::vad::VadConfig;

fn tone_frame(n: usize) -> Bytes {
    // 440 Hz at about -12 dBFS, continuing phase across frames.
    let pcm: Vec<i16> = (0..FRAME_BYTES)
        .map(|i| {
            let t = (n * FRAME_BYTES + i) as f32 / 8000.0;
            (8000.0 * (2.0 * std::f32::consts::PI * 440.0 * t).sin()) as i16
        })
        .collect();
    Bytes::from(crate::audio::g711::encode_ulaw(&pcm))
}

fn silence() -> Bytes {
    Bytes::from(vec![0xFFu8; FRAME_BYTES])
}

fn ingress(tail_ms: u64) -> (CallerIngress, mpsc::Receiver<SttInput>, SttFeed) {
    let (tx, rx) = mpsc::channel(1024);
    let feed = SttFeed::new(None, "CA1");
    feed.set_input(Some(tx));
    let vad = Vad::new(VadConfig::default());
    (CallerIngress::new(vad, feed.clone(), tail_ms), rx, feed)
}

fn drain(rx: &mut mpsc::Receiver<SttInput>) -> Vec<SttInput> {
    let mut out = Vec::new();
    while let Ok(x) = rx.try_recv() {
        out.push(x);
    }
    out
}

fn audio_bytes(inputs: &[SttInput]) -> Vec<u8> {
    inputs
        .iter()
        .flat_map(|i| match i {
            SttInput::Audio(b) => b.to_vec(),
            _ => Vec::new(),
        })
        .collect()
}

/// One second of silence: the actor hears 10 notes (not 50), each covering 5 frames, and
/// the STT gets the audio in 60 ms writes (past the unbatched tail), all of it, in order.
#[test]
fn silence_is_noted_every_100_ms_and_batched_for_the_stt() {
    let (mut ing, mut rx, _feed) = ingress(0);
    let mut notes = Vec::new();
    let mut sent = Vec::new();
    for _ in 0..50 {
        let f = silence();
        sent.extend_from_slice(&f);
        notes.extend(ing.frame(f, Instant::now()));
    }
    assert_eq!(notes.len(), 10, "{notes:?}");
    assert!(notes.iter().all(|n| n.frames == QUIET_NOTE_FRAMES));
    assert!(
        notes
            .iter()
            .all(|n| n.vad.is_empty() && n.speech_run_ms == 0)
    );
    let inputs = drain(&mut rx);
    // 50 frames: 16 writes of 3 frames, 2 frames still batched.
    assert_eq!(inputs.len(), 16);
    assert!(
        inputs
            .iter()
            .all(|i| matches!(i, SttInput::Audio(b) if b.len() == STT_BATCH_BYTES))
    );
    assert_eq!(audio_bytes(&inputs)[..], sent[..48 * FRAME_BYTES]);
}

/// Speech: a note for the frame with the detector's start (with its audio time), then one
/// per frame while speaking; its first voiced frame goes to the STT at once with what was
/// batched before, then 40 ms writes while speaking and single frames in the tail after
/// it; the end comes in a note of its own and the next quiet note covers 5.
#[test]
fn speech_is_noted_every_frame_and_written_at_once() {
    // Deepgram's tail: its 300 ms endpointing plus the margin.
    let (mut ing, mut rx, _feed) = ingress(300 + STT_ENDPOINT_MARGIN_MS);
    let mut sent = Vec::new();
    for _ in 0..4 {
        let f = silence();
        sent.extend_from_slice(&f);
        assert!(ing.frame(f, Instant::now()).is_none());
    }
    let mut notes = Vec::new();
    for n in 0..40 {
        let f = tone_frame(n);
        sent.extend_from_slice(&f);
        notes.extend(ing.frame(f, Instant::now()));
    }
    let start = notes
        .iter()
        .position(|n| {
            n.vad
                .iter()
                .any(|(e, _)| matches!(e, VadEvent::SpeechStart { .. }))
        })
        .expect("speech start noted");
    // The start's note covers the quiet frames before it; every frame after it is noted
    // on its own, the run growing.
    assert!(notes[start].frames <= QUIET_NOTE_FRAMES);
    assert!(notes[start + 1..].iter().all(|n| n.frames == 1));
    assert!(notes.len() - start > 20, "{notes:?}");
    assert!(notes[start..].iter().all(|n| n.speech_run_ms > 0));
    assert!(
        notes[start..]
            .windows(2)
            .all(|w| w[1].speech_run_ms >= w[0].speech_run_ms)
    );
    let (_, audio_ms) = notes[start].vad[0];
    assert!(audio_ms > 0);
    // Silence ends the run: a note with the end and run 0, then quiet notes of 5 frames.
    let mut after = Vec::new();
    for _ in 0..100 {
        let f = silence();
        sent.extend_from_slice(&f);
        after.extend(ing.frame(f, Instant::now()));
    }
    let end = after
        .iter()
        .position(|n| {
            n.vad
                .iter()
                .any(|(e, _)| matches!(e, VadEvent::SpeechEnd { .. }))
        })
        .expect("speech end noted");
    assert_eq!(after[end].speech_run_ms, 0);
    assert!(
        after[end + 1..]
            .iter()
            .all(|n| n.frames == QUIET_NOTE_FRAMES && n.vad.is_empty())
    );
    // The STT got everything in order: the 4 quiet frames and the first voiced one in one
    // write, 40 ms writes while speaking, single frames in the tail after the end, then
    // 60 ms writes again.
    let inputs = drain(&mut rx);
    let got = audio_bytes(&inputs);
    assert_eq!(got[..], sent[..got.len()]);
    assert!(sent.len() - got.len() < STT_BATCH_BYTES);
    let sizes: Vec<usize> = inputs
        .iter()
        .filter_map(|i| match i {
            SttInput::Audio(b) => Some(b.len() / FRAME_BYTES),
            _ => None,
        })
        .collect();
    // Runs of equal write sizes: the long run of 40 ms writes is the speech.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &n in &sizes {
        match runs.last_mut() {
            Some((m, k)) if *m == n => *k += 1,
            _ => runs.push((n, 1)),
        }
    }
    let speech = runs
        .iter()
        .position(|&(n, k)| n == 2 && k > 12)
        .unwrap_or_else(|| panic!("40 ms writes while speaking: {sizes:?}"));
    // Before it: one 60 ms write, then the first voiced frame at once with the quiet
    // batched before it, and single frames until the detector calls it speech.
    assert!(speech <= 3, "{sizes:?}");
    let first_pair: usize = runs[..speech].iter().map(|r| r.1).sum();
    let pairs = runs[speech].1;
    let tail = sizes[first_pair + pairs..]
        .iter()
        .take_while(|&&n| n == 1)
        .count();
    // The tail: from the detector's end of speech (160 ms after the last voiced frame) to
    // 600 ms after it, ~22 frames; then 60 ms writes again.
    assert!((18..=25).contains(&tail), "{sizes:?}");
    assert!(
        sizes[first_pair + pairs + tail..].iter().all(|&n| n == 3),
        "{sizes:?}"
    );
}

/// A `Finalize` the actor sends goes after the audio batched before it; a session swapped
/// in (reopen) gets the audio from then on, and audio with no session is dropped uncounted.
#[test]
fn finalize_flushes_first_and_a_new_session_takes_over() {
    let (mut ing, mut rx, feed) = ingress(0);
    ing.frame(silence(), Instant::now());
    ing.frame(silence(), Instant::now());
    assert!(drain(&mut rx).is_empty());
    assert!(feed.send(SttInput::Finalize));
    let inputs = drain(&mut rx);
    assert_eq!(inputs.len(), 2);
    assert!(matches!(&inputs[0], SttInput::Audio(b) if b.len() == 2 * FRAME_BYTES));
    assert!(matches!(inputs[1], SttInput::Finalize));

    let (tx2, mut rx2) = mpsc::channel(16);
    feed.set_input(Some(tx2));
    for _ in 0..3 {
        ing.frame(silence(), Instant::now());
    }
    assert!(drain(&mut rx).is_empty());
    assert_eq!(drain(&mut rx2).len(), 1);
    feed.set_input(None);
    for _ in 0..3 {
        ing.frame(silence(), Instant::now());
    }
    assert_eq!(feed.totals(), (2 * 20 + 3 * 20, 0));
}

/// A session whose queue is full refuses the write: its frames are counted as dropped.
#[test]
fn a_full_stt_queue_counts_dropped_frames() {
    let (tx, _rx) = mpsc::channel(1);
    let feed = SttFeed::new(None, "CA1");
    feed.set_input(Some(tx));
    let mut ing = CallerIngress::new(Vad::new(VadConfig::default()), feed.clone(), 0);
    for _ in 0..6 {
        ing.frame(silence(), Instant::now());
    }
    // Two writes of 3 frames: the first queued, the second refused.
    assert_eq!(feed.totals(), (60, 3));
}

/// While barge-in could not act (the agent is quiet) a speech run is noted every 5 frames
/// after its start; once armed, from the next frame on, every frame.
#[test]
fn speech_to_a_quiet_agent_is_noted_like_silence() {
    let (ing, _rx, _feed) = ingress(0);
    let barge = BargeWatch::default();
    barge.set(false);
    let mut ing = ing.with_barge_watch(barge.clone());
    for _ in 0..4 {
        ing.frame(silence(), Instant::now());
    }
    let mut notes = Vec::new();
    for n in 0..28 {
        notes.extend(ing.frame(tone_frame(n), Instant::now()));
    }
    let start = notes
        .iter()
        .position(|n| !n.vad.is_empty())
        .expect("speech start noted");
    let after = &notes[start + 1..];
    assert!(after.len() >= 2, "{notes:?}");
    assert!(after.iter().all(|n| n.frames == QUIET_NOTE_FRAMES));
    assert!(after.iter().all(|n| n.speech_run_ms > 0));
    barge.set(true);
    for n in 28..33 {
        let note = ing
            .frame(tone_frame(n), Instant::now())
            .expect("a note per frame once armed");
        assert!(note.speech_run_ms > 0);
    }
}

/// Run by the actor itself, the stage notes every frame.
#[test]
fn every_frame_mode_notes_each_frame() {
    let (ing, _rx, _feed) = ingress(0);
    let mut ing = ing.every_frame();
    for _ in 0..7 {
        let n = ing
            .frame(silence(), Instant::now())
            .expect("a note per frame");
        assert_eq!(n.frames, 1);
    }
}
