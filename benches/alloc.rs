//! Heap allocations per 20 ms frame on the media hot path, counted by a counting
//! global allocator, for each carrier's media codec (Twilio, Telnyx, Plivo μ-law and Plivo
//! L16 8 kHz): a `media` frame read off a WebSocket (masked, as the carrier sends it) → decoded
//! → the voice detector → the STT input channel → written to the STT's WebSocket; and the pacer
//! → the carrier command channel → encoded → written to the carrier's socket.
//! Only the server's side is counted (the simulated peers' writes and reads are not); the
//! call actor's own step (policy, timers) is not in it. The STT batching mirrors
//! `call::actor`; the carrier's socket is the media pump's own `WebSocketTransport` (messages
//! capped while read, writes buffered and flushed per burst, as `app::media` runs it). Also a
//! stable workload for `valgrind --tool=callgrind` (instructions per frame, see
//! docs/BENCHMARKS.md). Run with `cargo bench --bench alloc` (`FRAMES=N` to change the count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::BytesMut;
use fastwebsockets::{Frame, Payload, Role, WebSocket};
use patterd::app::media::WebSocketTransport;
use patterd::audio::g711::ulaw_tone;
use patterd::audio::vad::{Vad, VadConfig};
use patterd::call::mouth::{Mouth, Pumped, UttKind};
use patterd::carrier::plivo::PlivoCodec;
use patterd::carrier::telnyx::TelnyxCodec;
use patterd::carrier::transport::{MediaReceiver, MediaSender, MediaTransport, Received};
use patterd::carrier::twilio::TwilioCodec;
use patterd::carrier::{MediaCommand, MediaEvent, MediaMessage, MessageKind, SharedCodec};
use patterd::provider::SttInput;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations and bytes counted while the server's side of one section ran.
#[derive(Default, Clone, Copy)]
struct Tally {
    allocs: u64,
    bytes: u64,
}

impl Tally {
    fn measure<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (a, b) = (
            ALLOCS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        let out = f();
        self.allocs += ALLOCS.load(Ordering::Relaxed) - a;
        self.bytes += BYTES.load(Ordering::Relaxed) - b;
        out
    }

    async fn measure_async<T>(&mut self, f: impl std::future::Future<Output = T>) -> T {
        let (a, b) = (
            ALLOCS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        let out = f.await;
        self.allocs += ALLOCS.load(Ordering::Relaxed) - a;
        self.bytes += BYTES.load(Ordering::Relaxed) - b;
        out
    }
}

const STREAM_SID: &str = "MZ00000000000000000000000000000001";
const TELNYX_STREAM: &str = "5A1F0C2E-0000-4000-8000-00000000AB01";
const PLIVO_STREAM: &str = "87654321-4321-4321-4321-cba987654321";

/// One carrier's media socket as the bench drives it: its codec after `start`, and how it
/// frames 20 ms of caller audio (μ-law) as the carrier sends it.
struct Case {
    name: &'static str,
    codec: Box<dyn SharedCodec>,
    media: fn(&[u8], u64) -> String,
}

fn started(mut codec: Box<dyn SharedCodec>, start: &str) -> Box<dyn SharedCodec> {
    match codec.decode(start) {
        Ok(Some(MediaEvent::Start(_))) => codec,
        other => panic!("start did not decode: {other:?}"),
    }
}

fn twilio() -> Case {
    let start = format!(
        r#"{{"event":"start","sequenceNumber":"1","start":{{"accountSid":"AC1","streamSid":"{STREAM_SID}","callSid":"CA1","tracks":["inbound"],"mediaFormat":{{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}},"customParameters":{{"token":"t"}}}},"streamSid":"{STREAM_SID}"}}"#
    );
    Case {
        name: "twilio",
        codec: started(Box::new(TwilioCodec::new()), &start),
        media: |audio, seq| {
            format!(
                r#"{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound","chunk":"{seq}","timestamp":"{}","payload":"{}"}},"streamSid":"{STREAM_SID}"}}"#,
                seq * 20,
                STANDARD.encode(audio)
            )
        },
    }
}

fn telnyx() -> Case {
    let start = format!(
        r#"{{"event":"start","sequence_number":"1","stream_id":"{TELNYX_STREAM}","start":{{"user_id":"7C0D9E11-0000-4000-8000-000000000001","call_control_id":"v3:example-call-control-id","call_session_id":"2dc1b3c8-f9e0-11ea-bc5a-02420a0f7768","from":"+14155550199","to":"+14155550100","tags":[],"client_state":null,"custom_parameters":{{"token":"t"}},"media_format":{{"encoding":"PCMU","sample_rate":8000,"channels":1}}}}}}"#
    );
    Case {
        name: "telnyx",
        codec: started(Box::new(TelnyxCodec::new()), &start),
        media: |audio, seq| {
            format!(
                r#"{{"event":"media","sequence_number":"{}","media":{{"track":"inbound","chunk":"{seq}","timestamp":"{}","payload":"{}"}},"stream_id":"{TELNYX_STREAM}"}}"#,
                seq + 1,
                seq * 20,
                STANDARD.encode(audio)
            )
        },
    }
}

fn plivo_start(encoding: &str) -> String {
    format!(
        r#"{{"event":"start","sequenceNumber":1,"start":{{"callId":"12345678-1234-1234-1234-123456789abc","streamId":"{PLIVO_STREAM}","accountId":"MAXXXXXXXXXXXXXXXXXX","tracks":["inbound"],"mediaFormat":{{"encoding":"{encoding}","sampleRate":8000}}}},"extra_headers":"token=t"}}"#
    )
}

fn plivo_media(payload: &[u8], seq: u64) -> String {
    format!(
        r#"{{"event":"media","sequenceNumber":{},"streamId":"{PLIVO_STREAM}","media":{{"track":"inbound","timestamp":"{}","chunk":{seq},"payload":"{}"}},"extra_headers":"token=t"}}"#,
        seq + 1,
        seq * 20,
        STANDARD.encode(payload)
    )
}

fn plivo_mulaw() -> Case {
    Case {
        name: "plivo (μ-law)",
        codec: started(Box::new(PlivoCodec::new()), &plivo_start("audio/x-mulaw")),
        media: plivo_media,
    }
}

fn plivo_l16() -> Case {
    Case {
        name: "plivo (L16 8 kHz)",
        codec: started(Box::new(PlivoCodec::new()), &plivo_start("audio/x-l16")),
        media: |audio, seq| {
            let pcm: Vec<u8> = audio
                .iter()
                .flat_map(|&u| patterd::audio::g711::ulaw_to_linear(u).to_le_bytes())
                .collect();
            plivo_media(&pcm, seq)
        },
    }
}

async fn run(case: Case, frames: u64, warmup: u64) -> (Tally, Tally, Tally) {
    // Caller → server media socket.
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = WebSocket::after_handshake(server_io, Role::Server);
    // The media pump's transport: messages capped while read, writes buffered and flushed
    // after each burst of commands.
    let (mut read, mut write) = WebSocketTransport::new(server).split();
    let mut client_io = client_io;
    let mut codec = case.codec;
    let mut encoder = codec.clone_box();

    // Server → STT socket (the Deepgram writer's path), its peer drained raw.
    let (stt_io, mut stt_peer) = tokio::io::duplex(1 << 20);
    let stt_ws = WebSocket::after_handshake(stt_io, Role::Client);
    let (_incoming, stt_sender, _guard) = patterd::net::ws_pump::split(stt_ws);
    let (stt_tx, mut stt_rx) = tokio::sync::mpsc::channel::<SttInput>(64);

    let mut vad = Vad::new(VadConfig::default());
    // The call actor's STT batching: 60 ms writes while the caller is silent (and was for
    // longer than the unbatched tail), frame by frame otherwise.
    let mut stt_batch = BytesMut::new();
    let mut out = Vec::with_capacity(1024);
    // Alternating 1 s of tone and 1 s of silence so the detector changes state.
    let tone = ulaw_tone(440.0, 1000, 8000);
    let silence = vec![0xFFu8; 8000];
    // The caller's frames, masked and framed as a client sends them.
    let wire: Vec<Vec<u8>> = (0..100)
        .map(|i| {
            let src = if (i / 50) % 2 == 0 { &tone } else { &silence };
            let off = (i % 50) * 160;
            let text = (case.media)(&src[off..off + 160], i as u64);
            let mut frame = Frame::text(Payload::Owned(text.into_bytes()));
            frame.mask();
            let mut buf = Vec::new();
            frame.write(&mut buf).to_vec()
        })
        .collect();

    // Pacer → carrier: one long utterance of ready audio.
    let mut speech = Mouth::new();
    let agent_audio = ulaw_tone(330.0, (frames + warmup + 100) * 20, 8000);
    speech.push_audio(UttKind::Say, "x".into(), 0, &agent_audio);
    let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::channel::<MediaCommand>(512);
    let t0 = Instant::now();
    let mut next_pace: Option<Instant> = None;
    let mut pumped = Pumped::default();

    let mut inbound = Tally::default();
    let mut stt = Tally::default();
    let mut outbound = Tally::default();
    let mut sink = vec![0u8; 1 << 16];
    for i in 0..(warmup + frames) {
        let counting = i >= warmup;
        let mut scratch_in = Tally::default();
        let mut scratch_stt = Tally::default();
        let mut scratch_out = Tally::default();
        // The caller sends a frame (not counted).
        client_io
            .write_all(&wire[(i % 100) as usize])
            .await
            .expect("client write");
        // Server: read, decode, detect, hand to the STT writer.
        let msg = scratch_in.measure_async(read.recv()).await.expect("read");
        let audio = scratch_in.measure(|| {
            let Received::Message(MediaMessage::Text(s)) = msg else {
                panic!("not a text message: {msg:?}")
            };
            match codec.decode(s) {
                Ok(Some(MediaEvent::Audio(a))) => a,
                other => panic!("not audio: {other:?}"),
            }
        });
        scratch_in.measure(|| {
            std::hint::black_box(vad.push_ulaw(&audio));
            let at_once = vad.is_speaking() || vad.silence_ms() < 1300;
            let audio = if at_once && stt_batch.is_empty() {
                Some(audio)
            } else {
                if stt_batch.capacity() - stt_batch.len() < audio.len() {
                    stt_batch.reserve(16 * 1024);
                }
                stt_batch.extend_from_slice(&audio);
                (at_once || stt_batch.len() >= 480).then(|| stt_batch.split().freeze())
            };
            if let Some(audio) = audio {
                let _ = stt_tx.try_send(SttInput::Audio(audio));
            }
        });
        // The STT writer takes it and writes it to its socket.
        let got = scratch_stt.measure(|| stt_rx.try_recv().ok());
        if let Some(SttInput::Audio(b)) = got {
            scratch_stt
                .measure_async(stt_sender.binary(&b))
                .await
                .expect("stt write");
        }
        drain(&mut stt_peer, &mut sink).await;
        // The pacer's tick, the media pump's write.
        // The actor pumps when the pacer's deadline comes (its timer's wake-up).
        let now = t0 + Duration::from_millis(20 * i);
        if next_pace.is_none_or(|at| now >= at) {
            scratch_out.measure(|| {
                speech.pump_into(now, &mut pumped);
                for cmd in pumped.commands.drain(..) {
                    let _ = cmd_tx.try_send(cmd);
                }
                next_pace = speech.next_deadline(now);
            });
        }
        let mut unflushed = false;
        while let Some(cmd) = scratch_out.measure(|| cmd_rx.try_recv().ok()) {
            if scratch_out.measure(|| encoder.encode_into(&cmd, &mut out)) {
                scratch_out
                    .measure_async(write.send(MessageKind::Text, &out))
                    .await
                    .expect("server write");
                unflushed = true;
            }
            scratch_out.measure(|| drop(cmd));
        }
        if unflushed {
            scratch_out
                .measure_async(write.flush())
                .await
                .expect("server flush");
        }
        // The carrier drains its socket (not counted).
        drain(&mut client_io, &mut sink).await;
        if counting {
            for (t, s) in [
                (&mut inbound, scratch_in),
                (&mut stt, scratch_stt),
                (&mut outbound, scratch_out),
            ] {
                t.allocs += s.allocs;
                t.bytes += s.bytes;
            }
        }
    }
    drop(_guard);
    (inbound, stt, outbound)
}

/// Reads whatever the server wrote to a peer's socket, without parsing it (the peers' reads
/// are not the server's cost).
async fn drain(io: &mut tokio::io::DuplexStream, sink: &mut [u8]) {
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::ZERO, io.read(sink)).await {
        if n == 0 {
            break;
        }
    }
}

fn main() {
    let frames: u64 = std::env::var("FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    // `CARRIER=twilio` (or telnyx, plivo) runs one carrier only (e.g. under callgrind).
    let only = std::env::var("CARRIER").unwrap_or_default();
    let warmup = 500;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let per = |t: Tally| {
        (
            t.allocs as f64 / frames as f64,
            t.bytes as f64 / frames as f64,
        )
    };
    println!("frames measured per carrier: {frames} (after {warmup} warm-up frames)");
    for case in [twilio(), telnyx(), plivo_mulaw(), plivo_l16()] {
        if !case.name.starts_with(only.as_str()) {
            continue;
        }
        let name = case.name;
        let (inbound, stt, outbound) = rt.block_on(run(case, frames, warmup));
        println!("{name}:");
        for (section, t) in [
            ("inbound: socket read → decode → VAD → STT channel", inbound),
            ("STT writer: channel → STT socket write", stt),
            (
                "outbound: pacer → command channel → encode → socket write",
                outbound,
            ),
        ] {
            let (a, b) = per(t);
            println!("  {section}: {a:.2} allocations / frame ({b:.0} bytes / frame)");
        }
    }
}
