//! A Plivo stream in `audio/x-l16` at 8 kHz (Plivo may stream L16 whatever the answer asked
//! for), end to end through the Plivo simulator: caller audio arrives as L16 and is converted
//! to μ-law on the codec's allocation-free path, the agent's audio leaves as L16 `playAudio`
//! that the simulator (strict about `contentType`, `sampleRate` and whole samples) accepts.

use crate::common::carrier::{Carrier, Carriers};
use crate::common::*;
use patterd_sim::hermes::HermesReply;
use patterd_sim::plivo::PlivoAnswer;
use patterd_sim::stream::Dialect;

#[tokio::test]
async fn a_plivo_l16_stream_round_trips_through_the_simulator() {
    let stack = Stack::start(Opts {
        transcripts: vec!["I would like a table".into()],
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Sure. What day?"));
    let (uuid, r) = stack.ring_via(Carrier::Plivo, CALLER, PLIVO_NUMBER).await;
    assert_eq!(r.status, 200, "{r:?}");
    let answer = PlivoAnswer::parse(&r.body).expect("plivo xml");
    let sim = stack
        .plivo
        .open_stream_as(&answer, &stack.ws_base(), &uuid, Dialect::PlivoL16)
        .await
        .expect("plivo L16 stream opens");
    let s = sim
        .wait_for("greeting audio and its checkpoint", WAIT, |s| {
            s.agent_audio_bytes > 0 && !s.marks_echoed.is_empty()
        })
        .await
        .expect("greeting");
    assert!(s.protocol_errors.is_empty(), "{:?}", s.protocol_errors);

    // 700 ms of tone as L16: the STT hears about that much speech (garbled conversion would
    // be heard as noise or silence), and the turn reaches the brain.
    speak(&sim, 700);
    stack
        .hermes
        .wait_until("the caller's turn", |r| r.requests.len() == 1)
        .await;
    let dg = stack.dg.record();
    let heard = dg.connections[0].finals_speech_ms.first().copied();
    assert!(
        heard.is_some_and(|ms| (500..=900).contains(&ms)),
        "speech the STT heard: {heard:?} ms"
    );
    let s = sim
        .wait_for("the reply and its checkpoints", WAIT, |s| {
            s.marks_echoed.len() >= 2
        })
        .await
        .expect("reply");
    assert!(s.protocol_errors.is_empty(), "{:?}", s.protocol_errors);
}
