//! The shards' pacing, end to end over real sockets: 40 simulated callers on two shards talk
//! to a recording Twilio-side stub (it answers the voice webhook with a `<Stream>` and reads
//! the media sockets, never speaking). Every call's messages must be Twilio's stream in
//! order: `connected`, `start`, `media` frames with consecutive sequence numbers and chunks
//! and timestamps on the call's own 20 ms grid, each 100 ms speech clip in one run of five
//! frames, then `stop`. Asserted on the messages' numbers, not on wall time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::OpCode;
use hyper::Response;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use patterd::util::TaskGuard;
use patterd_loadgen::caller::{CallCtx, SpeechClip, TAGGED_FRAMES, line_noise, tag_frame};
use patterd_sim::twilio::SimTwilio;

const TWIML: &str = r#"<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url="wss://voice.test/media"/></Connect></Response>"#;

type Log = Arc<Mutex<Vec<Vec<Value>>>>;

/// The stub: `/voice` answers TwiML, `/media` upgrades and records every text message of
/// each socket; `stops` counts the `stop` messages seen.
async fn stub(log: Log, stops: watch::Sender<usize>) -> (std::net::SocketAddr, TaskGuard) {
    let stops = Arc::new(stops);
    patterd_sim::http::serve(move |mut req| {
        let (log, stops) = (log.clone(), stops.clone());
        async move {
            if req.uri().path() != "/media" {
                return patterd_sim::http::full(200, "text/xml", TWIML);
            }
            let Ok((resp, fut)) = fastwebsockets::upgrade::upgrade(&mut req) else {
                return patterd_sim::http::plain(400, "not a WebSocket upgrade");
            };
            let idx = {
                let mut l = log.lock().expect("log");
                l.push(Vec::new());
                l.len() - 1
            };
            tokio::spawn(async move {
                let Ok(mut ws) = fut.await else { return };
                while let Ok(f) = ws.read_frame().await {
                    match f.opcode {
                        OpCode::Text => {
                            let v: Value = serde_json::from_slice(&f.payload).expect("JSON");
                            let stop = v["event"] == "stop";
                            log.lock().expect("log")[idx].push(v);
                            if stop {
                                stops.send_modify(|n| *n += 1);
                            }
                        }
                        OpCode::Close => break,
                        _ => {}
                    }
                }
            });
            let (parts, _) = resp.into_parts();
            Response::from_parts(parts, patterd_sim::http::plain(200, "").into_body())
        }
    })
    .await
    .expect("stub server")
}

fn num(v: &Value) -> u64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .expect("a number in a string")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_pace_forty_callers_on_their_own_20_ms_grid() {
    let log: Log = Arc::default();
    let (stops_tx, mut stops) = watch::channel(0usize);
    let (addr, _server) = stub(log.clone(), stops_tx).await;
    let ctx = Arc::new(CallCtx {
        twilio: SimTwilio::new(
            &format!("http://{addr}"),
            "https://voice.test",
            "AC00000000000000000000000000000001",
            "token",
        ),
        ws_base: format!("ws://{addr}"),
        to: "+15550001234".into(),
        voice_path: "/voice".into(),
        speech: SpeechClip::tone(100),
        line_noise: line_noise(-65.0, 7),
        pause: Duration::from_millis(60),
        reply_timeout: Duration::from_millis(100),
        barge_in: false,
    });
    let n = 40;
    let t0 = Instant::now() + Duration::from_millis(20);
    let end_at = t0 + Duration::from_millis(900);
    let results = patterd_loadgen::drive_calls(ctx, n, 2, t0, Duration::from_millis(2), end_at)
        .await
        .expect("calls ran");
    assert_eq!(results.len(), n);
    for r in &results {
        assert_eq!(r.error, None, "call {}", r.idx);
        assert!(
            r.frames_sent >= 10,
            "call {}: {} frames",
            r.idx,
            r.frames_sent
        );
    }
    // Every call hung up with `stop`: wait until the stub has read all of them.
    tokio::time::timeout(Duration::from_secs(30), stops.wait_for(|&s| s == n))
        .await
        .expect("every stop arrives")
        .expect("stub alive");

    let log = log.lock().expect("log").clone();
    assert_eq!(log.len(), n);
    let speech: Vec<String> = SpeechClip::tone(100).frames;
    let noise = line_noise(-65.0, 7);
    for msgs in &log {
        assert_eq!(msgs[0]["event"], "connected");
        assert_eq!(msgs[1]["event"], "start");
        let sid = msgs[1]["start"]["streamSid"].clone();
        let media: Vec<&Value> = msgs[2..msgs.len() - 1].iter().collect();
        let last = &msgs[msgs.len() - 1];
        assert_eq!(last["event"], "stop");
        let result = results
            .iter()
            .find(|r| media[0]["media"]["payload"] == STANDARD.encode(tag_frame(r.idx)).as_str())
            .expect("the call's tag in its silence");
        assert_eq!(media.len() as u64, result.frames_sent);
        let mut speech_run = 0;
        for (i, m) in media.iter().enumerate() {
            assert_eq!(m["event"], "media");
            assert_eq!(m["streamSid"], sid);
            assert_eq!(num(&m["sequenceNumber"]), i as u64 + 2);
            assert_eq!(num(&m["media"]["chunk"]), i as u64 + 1);
            if i > 0 {
                // On the call's own grid: a whole number of 20 ms frames later (one, unless
                // the shard fell a frame behind on this busy machine and skipped a tick).
                let step = num(&m["media"]["timestamp"]) - num(&media[i - 1]["media"]["timestamp"]);
                assert!(
                    step >= 20 && step.is_multiple_of(20),
                    "step {step} at frame {i}"
                );
            }
            let p = m["media"]["payload"].as_str().expect("payload");
            // The quiet: the call's tag in its first frames, then the looped line noise.
            let chunk = num(&m["media"]["chunk"]);
            let tag = STANDARD.encode(tag_frame(result.idx));
            if speech.iter().any(|s| s == p) {
            } else if chunk <= TAGGED_FRAMES {
                assert_eq!(p, tag, "frame {chunk} carries the tag");
            } else {
                assert_eq!(
                    p,
                    noise[chunk as usize % noise.len()],
                    "line noise at {chunk}"
                );
            }
            if let Some(k) = speech.iter().position(|s| s == p) {
                assert_eq!(k, speech_run, "speech frames in order");
                speech_run += 1;
            } else {
                assert!(
                    speech_run == 0 || speech_run == speech.len(),
                    "clip cut at {speech_run}"
                );
                speech_run = 0;
            }
        }
        assert_eq!(num(&last["sequenceNumber"]), media.len() as u64 + 2);
    }
    // The calls took turns: at least one whole clip per call.
    assert!(results.iter().all(|r| !r.turns.is_empty()));
}
