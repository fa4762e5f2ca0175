//! Micro-benchmarks of the per-frame hot path: parse a Twilio `media` frame, decode
//! its μ-law, measure its energy (a cheap level as a baseline; patterd's voice detector,
//! `audio::vad`, is not measured here), forward it to the STT input channel; encode an outgoing
//! agent frame; the SSE parser on a Hermes stream; the sentence chunker on a streamed reply;
//! one second of TTS PCM resampled to μ-law 8 kHz (`resample`); the recording writer's work
//! for one minute of call (`recording`). Issue 16's round on the hot path adds the voice
//! detector per frame (`vad_push_ulaw_20ms`), a whole inbound frame as the server handles it
//! (`inbound_frame_decode+vad+stt_batch`), the outgoing frame built into a reused buffer
//! (`twilio_encode_agent_frame_into`) and the pacer's top-up (`pacer_topup_100ms`).
//! The voice detector per packet on speech, silence and a call that is ~60 % silence, with and
//! without its energy gate (`vad`). The caller-audio stage the media pump runs per frame
//! (`call::ingress`: ring, detector, STT writes, the actor's notes) on silence and on speech
//! (`caller_ingress`).
//! Each carrier's media frame decoded and an agent frame encoded, Twilio, Telnyx and Plivo
//! (`carrier_media`). The echo check per frame (`echo_check`).
//! Run with `cargo bench --bench hot_path`; allocations per frame: `cargo bench --bench alloc`.

use std::hint::black_box;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use patterd::audio::g711::{decode_ulaw, ulaw_energy, ulaw_tone};
use patterd::carrier::twilio::TwilioCodec;
use patterd::carrier::{MediaCodec, MediaCommand, MediaEvent};
use patterd::provider::chunker::SentenceChunker;
use patterd::provider::sse::SseParser;

const STREAM_SID: &str = "MZ00000000000000000000000000000001";

fn started_codec() -> TwilioCodec {
    let mut codec = TwilioCodec::new();
    let start = format!(
        r#"{{"event":"start","sequenceNumber":"1","start":{{"accountSid":"AC1","streamSid":"{STREAM_SID}","callSid":"CA1","tracks":["inbound"],"mediaFormat":{{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}},"customParameters":{{"token":"t"}}}},"streamSid":"{STREAM_SID}"}}"#
    );
    codec.decode(&start).expect("start decodes");
    codec
}

fn media_frame() -> String {
    let audio = ulaw_tone(440.0, 20, 8000);
    format!(
        r#"{{"event":"media","sequenceNumber":"42","media":{{"track":"inbound","chunk":"41","timestamp":"820","payload":"{}"}},"streamSid":"{STREAM_SID}"}}"#,
        STANDARD.encode(&audio)
    )
}

fn carrier_frames(c: &mut Criterion) {
    let frame = media_frame();
    let mut codec = started_codec();
    c.bench_function("twilio_decode_media_frame", |b| {
        b.iter(|| codec.decode(black_box(&frame)))
    });
    c.bench_function("decode_frame+ulaw_to_pcm+energy", |b| {
        b.iter(|| {
            if let Ok(Some(MediaEvent::Audio(a))) = codec.decode(black_box(&frame)) {
                let pcm = decode_ulaw(&a);
                black_box((pcm, ulaw_energy(&a)));
            }
        })
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    c.bench_function("decode_frame+forward_to_stt_channel", |b| {
        b.iter(|| {
            if let Ok(Some(MediaEvent::Audio(a))) = codec.decode(black_box(&frame)) {
                let _ = tx.try_send(a);
            }
            black_box(rx.try_recv().ok());
        })
    });
    let audio = Bytes::from(ulaw_tone(440.0, 20, 8000));
    c.bench_function("twilio_encode_agent_frame", |b| {
        b.iter(|| codec.encode(black_box(&MediaCommand::Audio(audio.clone()))))
    });
}

/// The caller-audio stage as the media pump runs it on a decoded frame, its STT writes and
/// notes taken off their channels (what the STT writer and the actor would read).
fn caller_ingress(c: &mut Criterion) {
    use patterd::audio::vad::{Vad, VadConfig};
    use patterd::call::ingress::{CallerIngress, MediaInput, SttFeed};
    use patterd::provider::SttInput;
    let frame = media_frame();
    let mut codec = started_codec();
    let silence = format!(
        r#"{{"event":"media","sequenceNumber":"42","media":{{"track":"inbound","chunk":"41","timestamp":"820","payload":"{}"}},"streamSid":"{STREAM_SID}"}}"#,
        STANDARD.encode([0xFFu8; 160])
    );
    for (label, wire) in [("silence", &silence), ("speech", &frame)] {
        let (stt_tx, mut stt_rx) = tokio::sync::mpsc::channel::<SttInput>(64);
        let (note_tx, mut note_rx) = tokio::sync::mpsc::channel::<MediaInput>(64);
        let feed = SttFeed::new(None, "CA1");
        feed.set_input(Some(stt_tx));
        let mut stage = CallerIngress::new(Vad::new(VadConfig::default()), feed, 1300);
        c.bench_function(&format!("caller_ingress_frame_{label}"), |b| {
            b.iter(|| {
                if let Ok(Some(MediaEvent::Audio(a))) = codec.decode(black_box(wire))
                    && let Some(note) = stage.frame(a, tokio::time::Instant::now())
                {
                    let _ = note_tx.try_send(MediaInput::Caller(note));
                }
                black_box(stt_rx.try_recv().ok());
                black_box(note_rx.try_recv().ok());
            })
        });
    }
}

/// The echo check's cost: the level of a frame the pacer sends written to the
/// call's reference, then, for a caller frame, the levels played 0–800 ms before read back
/// and the estimate updated (what the caller-audio stage does per frame while the agent was
/// heard in the last 800 ms; the agent's voice and its echo at -6 dB, so the path is locked).
fn echo_check(c: &mut Criterion) {
    use patterd::audio::echo::{EchoEstimator, LAGS, ulaw_db};
    use patterd::call::echo::EchoReference;
    use std::time::Duration;
    use tokio::time::Instant;
    let voice = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/speech/agent_voice.ulaw"
    ))
    .expect("agent_voice fixture");
    let frames: Vec<&[u8]> = voice.chunks_exact(160).collect();
    let echo: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let pcm: Vec<i16> = decode_ulaw(f).into_iter().map(|s| s / 2).collect();
            patterd::audio::g711::encode_ulaw(&pcm)
        })
        .collect();
    let base = Instant::now();
    let reference = EchoReference::new(base);
    let mut estimate = EchoEstimator::default();
    let mut played = [0.0f32; LAGS];
    let mut n = 0usize;
    c.bench_function("echo_check_per_frame (played + levels + estimate)", |b| {
        b.iter(|| {
            let at = base + Duration::from_millis(20 * n as u64);
            reference.played(at, frames[n % frames.len()]);
            let caller = &echo[(n + frames.len() - 6) % frames.len()];
            // The caller frame heard now carries the echo of the frame played 120 ms ago.
            let explained =
                reference.levels(at, &mut played) && estimate.push(ulaw_db(caller), -70.0, &played);
            n += 1;
            black_box(explained)
        })
    });
    let tone = ulaw_tone(440.0, 20, 8000);
    c.bench_function("echo_reference_played_20ms", |b| {
        let mut n = 0u64;
        b.iter(|| {
            reference.played(base + Duration::from_millis(20 * n), black_box(&tone));
            n += 1;
        })
    });
}

/// The per-frame path: the detector, a whole inbound frame, the reused
/// outgoing buffer and the pacer.
fn hot_path_round2(c: &mut Criterion) {
    use patterd::audio::vad::{Vad, VadConfig};
    use patterd::call::mouth::{Mouth, UttKind};
    let frame = media_frame();
    let mut codec = started_codec();
    let mut vad = Vad::new(VadConfig::default());
    let tone = ulaw_tone(440.0, 20, 8000);
    c.bench_function("vad_push_ulaw_20ms", |b| {
        b.iter(|| black_box(vad.push_ulaw(black_box(&tone))))
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let mut batch = bytes::BytesMut::with_capacity(16 * 1024);
    let mut n = 0u32;
    c.bench_function("inbound_frame_decode+vad+stt_batch", |b| {
        b.iter(|| {
            if let Ok(Some(MediaEvent::Audio(a))) = codec.decode(black_box(&frame)) {
                black_box(vad.push_ulaw(&a));
                batch.extend_from_slice(&a);
                n += 1;
                if n.is_multiple_of(3) {
                    let _ = tx.try_send(batch.split().freeze());
                    if batch.capacity() < 480 {
                        batch.reserve(16 * 1024);
                    }
                }
            }
            black_box(rx.try_recv().ok());
        })
    });
    let audio = Bytes::from(ulaw_tone(440.0, 20, 8000));
    let mut out = Vec::with_capacity(1024);
    c.bench_function("twilio_encode_agent_frame_into", |b| {
        b.iter(|| codec.encode_into(black_box(&MediaCommand::Audio(audio.clone())), &mut out))
    });
    // The pacer topping up 100 ms (5 frames) of a long utterance, per top-up.
    let long = ulaw_tone(330.0, 600_000, 8000);
    let mut speech = Mouth::new();
    speech.push_audio(UttKind::Say, "long".into(), 0, &long);
    let t0 = tokio::time::Instant::now();
    let mut now = t0;
    black_box(speech.pump(now));
    c.bench_function("pacer_topup_100ms", |b| {
        b.iter(|| {
            now += std::time::Duration::from_millis(100);
            let p = speech.pump(now);
            for cmd in &p.commands {
                if let MediaCommand::Mark(m) = cmd {
                    // The carrier played it; start another utterance.
                    black_box(speech.on_mark(m));
                    speech.push_audio(UttKind::Say, "long".into(), 0, &long);
                }
            }
            black_box(p.commands.len())
        })
    });
}

fn hermes_stream() -> Vec<u8> {
    let mut s = String::from(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
    );
    for w in "Sure, I can book a table for two tomorrow evening. What time works for you?"
        .split_inclusive(' ')
    {
        s.push_str(&format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}}}}]}}\n\n",
            serde_json::to_string(w).unwrap_or_default()
        ));
    }
    s.push_str(
        ": keepalive\n\nevent: hermes.tool.progress\ndata: {\"tool\":\"x\"}\n\ndata: [DONE]\n\n",
    );
    s.into_bytes()
}

fn providers(c: &mut Criterion) {
    let stream = hermes_stream();
    c.bench_function("sse_parse_hermes_reply_64B_chunks", |b| {
        b.iter(|| {
            let mut p = SseParser::new();
            let mut n = 0;
            for chunk in stream.chunks(64) {
                n += p.push(black_box(chunk)).len();
            }
            n
        })
    });
    let deltas: Vec<&str> =
        "Sure, I can book a table for two tomorrow evening. What time works for you? We open at five."
            .split_inclusive(' ')
            .collect();
    c.bench_function("chunker_reply_word_deltas", |b| {
        b.iter(|| {
            let mut ch = SentenceChunker::new();
            let mut n = 0;
            for d in &deltas {
                n += ch.push(black_box(d)).len();
            }
            n + usize::from(ch.finish().is_some())
        })
    });
}

/// One second of 24 kHz (and 16/22.05/44.1/48 kHz) PCM16 resampled to 8 kHz and μ-law encoded,
/// fed as a TTS body arrives (4801-byte chunks, so samples straddle chunks): the cost per
/// second of synthesised audio on the `openai` / `openai_compatible` TTS path.
fn resample(c: &mut Criterion) {
    use patterd::audio::g711::encode_ulaw;
    use patterd::audio::resample::Resampler;
    for rate in [24_000u32, 16_000, 22_050, 44_100, 48_000] {
        let pcm: Vec<u8> = (0..rate)
            .flat_map(|i| {
                let t = f64::from(i) / f64::from(rate);
                (((2.0 * std::f64::consts::PI * 440.0 * t).sin() * 8000.0) as i16).to_le_bytes()
            })
            .collect();
        let mut r = Resampler::new(rate, 8000).expect("resampler");
        let mut out = Vec::with_capacity(9000);
        c.bench_function(&format!("resample_1s_{rate}_to_8000_ulaw"), |b| {
            b.iter(|| {
                out.clear();
                let mut bytes = 0;
                for chunk in pcm.chunks(4801) {
                    r.push_le_bytes(black_box(chunk), &mut out);
                }
                r.finish(&mut out);
                bytes += encode_ulaw(&out).len();
                black_box(bytes)
            })
        });
    }
}

/// The recording writer's whole work for one minute of a two-way call (both channels full):
/// decode, interleave, write and finalise the WAV (`call::recording`).
fn recording(c: &mut Criterion) {
    let minute = ulaw_tone(440.0, 60_000, 8000);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("recordings").join("CA1.wav");
    c.bench_function("recording_1min_stereo_wav", |b| {
        b.iter(|| {
            patterd::call::recording::write_call(&path, black_box(&minute), black_box(&minute))
                .expect("writes");
        })
    });
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("recording of one minute: {bytes} bytes");
}

/// A call's caller audio as 20 ms packets: `speech` (the speech fixtures back to back),
/// `silence` (digital silence) or `call` (each clip followed by silence so ~60 % of the time
/// is silence, as on a call where the caller mostly listens).
fn vad_audio(kind: &str) -> Vec<u8> {
    use patterd::audio::g711::ulaw_silence;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/speech");
    let clips = ["book_table", "change_booking", "no_tuesday", "yes_please"];
    let mut out = Vec::new();
    for name in clips {
        let clip = std::fs::read(format!("{dir}/{name}.ulaw")).expect("speech fixture");
        match kind {
            "speech" => out.extend(&clip),
            "silence" => out.extend(ulaw_silence(clip.len() as u64 / 8)),
            _ => {
                let silent_ms = clip.len() as u64 / 8 * 3 / 2;
                out.extend(&clip);
                out.extend(ulaw_silence(silent_ms));
            }
        }
    }
    out.truncate(out.len() / 160 * 160);
    out
}

/// The per-call voice detector (`audio::vad`) per 20 ms packet, with and without the energy
/// gate that skips scoring frames too quiet to be speech. Criterion reports the time
/// for the whole clip set; divide by the packet count printed.
fn vad(c: &mut Criterion) {
    use patterd::audio::vad::{Vad, VadConfig};
    for kind in ["speech", "silence", "call"] {
        let audio = vad_audio(kind);
        println!("vad_{kind}: {} packets of 20 ms", audio.len() / 160);
        for (label, gate) in [("gated", true), ("ungated", false)] {
            let cfg = VadConfig {
                gate,
                ..VadConfig::default()
            };
            c.bench_function(&format!("vad_{kind}_{label}"), |b| {
                b.iter(|| {
                    let mut v = Vad::new(cfg);
                    let mut n = 0;
                    for packet in audio.chunks(160) {
                        n += v.push_ulaw(black_box(packet)).len();
                    }
                    (n, v.frames_scored())
                })
            });
        }
    } // The barge-in hold's pitch measure (`audio::pitch`), per packet of real speech: scored only
    // while a caller speaks over the agent.
    let speech = vad_audio("speech");
    c.bench_function("pitch_speech_per_packet", |b| {
        let mut p = patterd::audio::pitch::Periodicity::default();
        let mut packets = speech.chunks(160).cycle();
        b.iter(|| black_box(p.push_ulaw(black_box(packets.next().unwrap_or(&[])))))
    });
}

/// Issue 16, round 3: each carrier's media frame decoded and an agent frame encoded into a
/// reused buffer (Twilio, Telnyx, Plivo μ-law and L16 8 kHz), all on the allocation-free paths.
fn carrier_media_codecs(c: &mut Criterion) {
    use patterd::carrier::SharedCodec;
    use patterd::carrier::plivo::PlivoCodec;
    use patterd::carrier::telnyx::TelnyxCodec;
    let tone = ulaw_tone(440.0, 20, 8000);
    let b64 = STANDARD.encode(&tone);
    let l16: Vec<u8> = tone
        .iter()
        .flat_map(|&u| patterd::audio::g711::ulaw_to_linear(u).to_le_bytes())
        .collect();
    let plivo_start = |encoding: &str| {
        format!(
            r#"{{"event":"start","sequenceNumber":1,"start":{{"callId":"12345678-1234-1234-1234-123456789abc","streamId":"87654321-4321-4321-4321-cba987654321","accountId":"MAXXXXXXXXXXXXXXXXXX","tracks":["inbound"],"mediaFormat":{{"encoding":"{encoding}","sampleRate":8000}}}},"extra_headers":"token=t"}}"#
        )
    };
    let plivo_media = |payload: &str| {
        format!(
            r#"{{"event":"media","sequenceNumber":42,"streamId":"87654321-4321-4321-4321-cba987654321","media":{{"track":"inbound","timestamp":"1705312200000","chunk":41,"payload":"{payload}"}},"extra_headers":"token=t"}}"#
        )
    };
    let cases: [(&str, Box<dyn SharedCodec>, String, String); 4] = [
        ("twilio", Box::new(TwilioCodec::new()), String::new(), media_frame()),
        (
            "telnyx",
            Box::new(TelnyxCodec::new()),
            r#"{"event":"start","sequence_number":"1","stream_id":"5A1F0C2E-0000-4000-8000-00000000AB01","start":{"call_control_id":"v3:example-call-control-id","media_format":{"encoding":"PCMU","sample_rate":8000,"channels":1}}}"#.into(),
            // No `chunk`: every iteration is delivered, none held by the jitter buffer.
            format!(
                r#"{{"event":"media","sequence_number":"4","media":{{"track":"inbound","timestamp":"820","payload":"{b64}"}},"stream_id":"5A1F0C2E-0000-4000-8000-00000000AB01"}}"#
            ),
        ),
        (
            "plivo_mulaw",
            Box::new(PlivoCodec::new()),
            plivo_start("audio/x-mulaw"),
            plivo_media(&b64),
        ),
        (
            "plivo_l16",
            Box::new(PlivoCodec::new()),
            plivo_start("audio/x-l16"),
            plivo_media(&STANDARD.encode(&l16)),
        ),
    ];
    let agent = Bytes::from(tone.clone());
    let mut out = Vec::with_capacity(1024);
    let mut group = c.benchmark_group("carrier_media");
    for (name, codec, start, frame) in cases {
        let mut codec = if name == "twilio" {
            Box::new(started_codec())
        } else {
            let mut codec = codec;
            codec.decode(&start).expect("start decodes");
            codec
        };
        group.bench_function(format!("{name}_decode_media_frame"), |b| {
            b.iter(|| codec.decode(black_box(&frame)))
        });
        group.bench_function(format!("{name}_encode_agent_frame_into"), |b| {
            b.iter(|| codec.encode_into(black_box(&MediaCommand::Audio(agent.clone())), &mut out))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = carrier_frames, hot_path_round2, caller_ingress, providers, resample, recording, vad,
        carrier_media_codecs, echo_check
}
criterion_main!(benches);
