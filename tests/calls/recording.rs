//! Call recordings: a `record = true` agent's call becomes a stereo WAV whose
//! left channel is what the caller (the simulator) sent and whose right channel is what it
//! received, aligned in time; an agent without `record` writes nothing; the recording endpoint
//! needs the API token.

use patterd::audio::g711::decode_ulaw;
use patterd_sim::stream::TimelineEvent;

use crate::common::*;

/// Fetches the recording once its writer has finished it (404 until then).
async fn recording(stack: &Stack, call_sid: &str) -> (Vec<i16>, Vec<i16>, Vec<u8>) {
    let url = format!("{}/v1/calls/{call_sid}/recording", stack.base);
    let client = stack.api_client();
    let deadline = tokio::time::Instant::now() + WAIT;
    let resp = loop {
        let resp = client.get(&url).send().await.expect("GET recording");
        if resp.status() == 200 {
            break resp;
        }
        assert_eq!(resp.status(), 404, "only 404 until the file is complete");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the recording never appeared"
        );
        // The writer finishes on its own thread after the call ends: poll the endpoint.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(resp.headers()["content-type"], "audio/wav");
    let wav = resp.bytes().await.expect("body").to_vec();
    assert_eq!(&wav[..4], b"RIFF");
    assert_eq!(&wav[8..16], b"WAVEfmt ");
    let u16_at = |i: usize| u16::from_le_bytes([wav[i], wav[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([wav[i], wav[i + 1], wav[i + 2], wav[i + 3]]);
    assert_eq!(
        (u16_at(20), u16_at(22), u32_at(24), u16_at(34)),
        (1, 2, 8000, 16)
    );
    assert_eq!(&wav[36..40], b"data");
    let data = u32_at(40) as usize;
    assert_eq!(data, wav.len() - 44, "data size finalised");
    assert_eq!(u32_at(4) as usize, wav.len() - 8, "RIFF size finalised");
    let (mut left, mut right) = (Vec::new(), Vec::new());
    for s in wav[44..].chunks_exact(4) {
        left.push(i16::from_le_bytes([s[0], s[1]]));
        right.push(i16::from_le_bytes([s[2], s[3]]));
    }
    (left, right, wav)
}

fn first_sound(samples: &[i16]) -> usize {
    samples.iter().position(|s| *s != 0).expect("some sound")
}

fn sound(samples: &[i16]) -> Vec<i16> {
    samples.iter().copied().filter(|s| *s != 0).collect()
}

#[tokio::test]
async fn a_recorded_call_holds_what_the_caller_sent_and_heard_aligned() {
    let stack = Stack::start(Opts {
        agent_extra: "record = true".into(),
        ..Default::default()
    })
    .await;
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    sim.hang_up().await;
    stack.finished(&call_sid).await;

    // The endpoint is authenticated like the rest of /v1.
    let url = format!("{}/v1/calls/{call_sid}/recording", stack.base);
    let anon = reqwest::Client::new().get(&url).send().await.expect("GET");
    assert_eq!(anon.status(), 401);

    let (left, right, wav) = recording(&stack, &call_sid).await;
    let path = stack
        .data
        .path()
        .join("recordings")
        .join(format!("{call_sid}.wav"));
    assert_eq!(std::fs::read(&path).expect("file on disk"), wav);

    let state = sim.state();
    // Left: the caller's audio as sent (decoded μ-law): its speech, contiguous.
    let sent = decode_ulaw(&state.sent_audio);
    let s0 = first_sound(&sent);
    let s1 = sent.len() - sent.iter().rev().position(|s| *s != 0).expect("sound");
    let l0 = first_sound(&left);
    assert_eq!(
        left[l0..l0 + (s1 - s0)],
        sent[s0..s1],
        "left channel = the caller's speech"
    );
    assert_eq!(sound(&left), sound(&sent), "nothing else on the left");
    // Right: everything the simulator received (greeting and reply; nothing was cleared).
    let received = decode_ulaw(&state.received_audio);
    assert!(state.clears.is_empty());
    assert_eq!(
        sound(&right),
        sound(&received),
        "right channel = agent audio"
    );
    let r0 = first_sound(&right);
    assert_eq!(
        right[r0..r0 + 160],
        received[first_sound(&received)..][..160]
    );

    // Aligned: the caller's speech starts as far after the greeting's first audio in the
    // file as it did at the simulator (within two frames).
    let speech_ms = state
        .timeline
        .iter()
        .find(|e| matches!(e.event, TimelineEvent::SentSpeechStart))
        .expect("speech sent")
        .at_ms;
    let greeting_ms = state.utterances[0].start_ms;
    let expected = (speech_ms as i64 - greeting_ms as i64) * 8;
    let got = l0 as i64 - r0 as i64;
    // The first sound of each is at most one sample past its frame's start.
    assert!(
        (got - expected).abs() <= 2 * 160 + 8,
        "caller speech {got} samples after the greeting in the file, {expected} at the simulator"
    );
    // The reply comes after the caller's speech on the right, as the simulator heard it.
    let reply_ms = state.utterances[1].start_ms;
    let reply_at = r0 + state.utterances[0].bytes as usize;
    let reply0 = reply_at + first_sound(&right[reply_at..]);
    let expected = (reply_ms as i64 - greeting_ms as i64) * 8;
    assert!(
        (reply0 as i64 - r0 as i64 - expected).abs() <= 2 * 160 + 8,
        "reply at {reply0} in the file, expected near {}",
        r0 as i64 + expected
    );
}

#[tokio::test]
async fn an_agent_without_record_writes_no_recording() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    let resp = stack
        .api_client()
        .get(format!("{}/v1/calls/{call_sid}/recording", stack.base))
        .send()
        .await
        .expect("GET");
    assert_eq!(resp.status(), 404);
    let body: serde_json::Value = resp.json().await.expect("JSON error");
    assert_eq!(body["error"]["code"], "no_recording");
    assert!(!stack.data.path().join("recordings").exists());
}
