//! Parsers under random input (docs/ROBUSTNESS.md): every carrier media codec's `decode`
//! (Twilio, Telnyx, Plivo), the webhook parsers and signature checks of the three carriers,
//! Plivo's nonce memory, the SSE parser, the Deepgram message parser, the sentence chunker and
//! the configuration loader get arbitrary input and structured garbage (JSON built from the
//! protocols' own field names with random values, TOML built from the schema's own keys).
//! Properties: no panic, output bounded by the input (audio never longer than the frame that
//! carried it, pieces and events under their caps), and no forged signature is ever accepted.
//!
//! The normal `cargo test` runs a fixed seed and a few hundred cases per target (a few
//! thousand in all). The long run (random seed unless `PROPTEST_RNG_SEED` is set):
//!
//! ```text
//! PROPTEST_CASES=200000 cargo test --release --test wire parsers::
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use serde_json::{Map, Value, json};

use patterd::carrier::plivo::{self, Nonces, PlivoCodec};
use patterd::carrier::telnyx::{self, TelnyxCodec, WebhookEnvelope};
use patterd::carrier::twilio::{self, TwilioCodec, VoiceWebhook};
use patterd::carrier::{MediaCodec, MediaEvent};
use patterd::provider::chunker::{MAX_PIECE_BYTES, SentenceChunker};
use patterd::provider::deepgram::map_message;
use patterd::provider::sse::{MAX_EVENT_BYTES, SseParser};

/// The seed of the fixed run (any `u64`; changing it explores other cases).
const SEED: u64 = 0x7061_7474_6572_6411;

/// `cases` per target with the fixed seed, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say
/// otherwise (the long run).
fn config(cases: u32) -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: env("PROPTEST_CASES").map_or(cases, |c| c as u32),
        rng_seed: match env("PROPTEST_RNG_SEED") {
            Some(s) => RngSeed::Fixed(s),
            None if env("PROPTEST_CASES").is_some() => RngSeed::Random,
            None => RngSeed::Fixed(SEED),
        },
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

/// Field names of every protocol under test, so random JSON reaches past "unknown event".
const KEYS: &[&str] = &[
    "event",
    "media",
    "payload",
    "start",
    "stop",
    "streamSid",
    "stream_id",
    "streamId",
    "callSid",
    "call_control_id",
    "callId",
    "customParameters",
    "custom_parameters",
    "mark",
    "name",
    "dtmf",
    "digit",
    "chunk",
    "timestamp",
    "track",
    "sequenceNumber",
    "sequence_number",
    "contentType",
    "sampleRate",
    "mediaFormat",
    "media_format",
    "encoding",
    "extra_headers",
    "accountSid",
    "data",
    "event_type",
    "id",
    "occurred_at",
    "payload",
    "client_state",
    "from",
    "to",
    "direction",
    "type",
    "channel",
    "alternatives",
    "transcript",
    "is_final",
    "speech_final",
    "from_finalize",
    "start",
    "duration",
    "description",
    "message",
];

const EVENTS: &[&str] = &[
    "connected",
    "start",
    "media",
    "mark",
    "stop",
    "dtmf",
    "clear",
    "playedStream",
    "clearedAudio",
    "playAudio",
    "checkpoint",
    "error",
    "Results",
    "UtteranceEnd",
    "SpeechStarted",
    "Metadata",
    "call.initiated",
    "call.answered",
    "call.hangup",
    "streaming.started",
    "call.machine.detection.ended",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => "[a-zA-Z_]{0,10}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        proptest::sample::select(EVENTS).prop_map(Value::from),
        ".{0,24}".prop_map(Value::from),
        // base64-looking payloads, valid or not, up to a few frames long
        "[A-Za-z0-9+/=]{0,400}".prop_map(Value::from),
        "[0-9a-f-]{0,40}".prop_map(Value::from),
    ]
}

/// Arbitrary JSON over the protocols' own keys.
fn protocol_json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(key(), inner, 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A frame: random text, protocol-shaped JSON, or JSON with a known event and random body.
fn frame() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => any::<String>(),
        1 => ".{0,64}",
        3 => protocol_json().prop_map(|v| v.to_string()),
        4 => (
            proptest::sample::select(EVENTS),
            btree_map(key(), protocol_json(), 0..6)
        )
            .prop_map(|(event, rest)| {
                let mut m: Map<String, Value> = rest.into_iter().collect();
                m.insert("event".into(), Value::from(event));
                Value::Object(m).to_string()
            }),
    ]
}

/// Decodes `frames` after an optional valid `start`, checking that no audio event is longer
/// than the frame that brought it (bounded output) and nothing panics.
fn run_codec(codec: &mut dyn MediaCodec, start: Option<&str>, frames: &[String]) {
    let longest = frames.iter().map(String::len).max().unwrap_or(0);
    if let Some(s) = start {
        let _ = codec.decode(s);
    }
    let mut events = 0usize;
    for f in frames {
        if let Ok(Some(ev)) = codec.decode(f) {
            events += 1;
            match ev {
                MediaEvent::Audio(a) => assert!(
                    a.len() <= longest,
                    "{} bytes of audio out of frames of at most {longest}",
                    a.len()
                ),
                MediaEvent::MarkPlayed(m) => assert!(m.len() <= longest),
                MediaEvent::Start(s) => assert!(s.call_id.len() <= longest),
                _ => {}
            }
        }
    }
    assert!(events <= frames.len() + 1);
}

const TWILIO_START: &str = r#"{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ1","callSid":"CA1","tracks":["inbound"],"customParameters":{"token":"t"},"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}},"streamSid":"MZ1"}"#;
const TELNYX_START: &str = r#"{"event":"start","sequence_number":"1","start":{"user_id":"u","call_control_id":"v3:abc","call_session_id":"s","from":"+15550001","to":"+15550002","media_format":{"encoding":"PCMU","sample_rate":8000,"channels":1}},"stream_id":"st1"}"#;
const PLIVO_START: &str = r#"{"event":"start","sequenceNumber":1,"start":{"callId":"c1","streamId":"s1","accountId":"MA1","tracks":["inbound"],"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000}},"extra_headers":"{}"}"#;

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn twilio_codec_decode(start in any::<bool>(), frames in vec(frame(), 1..8)) {
        run_codec(&mut TwilioCodec::new(), start.then_some(TWILIO_START), &frames);
    }

    #[test]
    fn telnyx_codec_decode(start in any::<bool>(), frames in vec(frame(), 1..8)) {
        run_codec(&mut TelnyxCodec::new(), start.then_some(TELNYX_START), &frames);
    }

    #[test]
    fn plivo_codec_decode(start in any::<bool>(), frames in vec(frame(), 1..8)) {
        run_codec(&mut PlivoCodec::new(), start.then_some(PLIVO_START), &frames);
    }

    /// Telnyx media frames with random `chunk` counters and timestamps (the reorder buffer).
    #[test]
    fn telnyx_reorder_buffer(chunks in vec((prop_oneof![
        any::<u64>(),
        0u64..64,
        (u64::MAX - 64)..=u64::MAX,
    ], "[A-Za-z0-9+/]{0,220}"), 1..24)) {
        let mut codec = TelnyxCodec::new();
        let _ = codec.decode(TELNYX_START);
        for (chunk, payload) in &chunks {
            let f = json!({"event": "media", "sequence_number": "2", "stream_id": "st1",
                "media": {"track": "inbound", "chunk": chunk.to_string(),
                          "timestamp": chunk.wrapping_mul(20).to_string(), "payload": payload}})
                .to_string();
            if let Ok(Some(MediaEvent::Audio(a))) = codec.decode(&f) {
                // At most the held frames and this one, each at most 165 bytes.
                prop_assert!(a.len() <= (telnyx::codec::MAX_HELD + 1) * 165, "{}", a.len());
            }
        }
    }

    #[test]
    fn twilio_webhook_form(body in vec(any::<u8>(), 0..600), text in ".{0,300}") {
        let _ = VoiceWebhook::from_form(&body);
        let _ = VoiceWebhook::from_form(text.as_bytes());
        let fields = twilio::parse_form(&body);
        prop_assert!(fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() <= body.len() * 3);
    }

    /// No random signature validates, whatever the URL, fields and settings header.
    #[test]
    fn twilio_signatures_refuse_forgeries(
        url in ".{0,120}",
        params in vec((".{0,12}", ".{0,24}"), 0..8),
        sig in ".{0,60}",
        settings in proptest::option::of(".{0,40}"),
        body in vec(any::<u8>(), 0..200),
    ) {
        prop_assert!(!twilio::validate_signature("auth-token", &url, &params, &sig, settings.as_deref()));
        prop_assert!(!twilio::validate_signature_json("auth-token", &url, &body, &sig, settings.as_deref()));
        let s = twilio::signature::string_to_sign(&url, &params);
        prop_assert!(s.len() <= url.len() + params.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
    }

    #[test]
    fn telnyx_webhook_envelope(body in vec(any::<u8>(), 0..600), v in protocol_json()) {
        let _ = WebhookEnvelope::parse(&body);
        let _ = WebhookEnvelope::parse(v.to_string().as_bytes());
        let wrapped = json!({"data": {"event_type": "call.initiated", "id": "e1", "payload": v}});
        let _ = WebhookEnvelope::parse(wrapped.to_string().as_bytes());
    }

    /// No random Ed25519 signature verifies, with any timestamp header.
    #[test]
    fn telnyx_signatures_refuse_forgeries(
        sig in proptest::option::of(prop_oneof![".{0,100}", "[A-Za-z0-9+/]{86}=="]),
        ts in proptest::option::of(prop_oneof![".{0,24}", (0u64..2_000_000_000).prop_map(|t| t.to_string())]),
        body in vec(any::<u8>(), 0..300),
        key in prop_oneof![Just("9oVA42nmp6zkNZrZB8wuF6s6NkF0KtvUNRePpkjadWY=".to_string()), ".{0,60}"],
        now in any::<u64>(),
    ) {
        prop_assert!(telnyx::verify_webhook(&key, sig.as_deref(), ts.as_deref(), &body, now).is_err());
    }

    /// No random header set validates a Plivo request; V3 strings to sign stay bounded.
    #[test]
    fn plivo_signatures_refuse_forgeries(
        method in prop_oneof![Just("POST".to_string()), Just("GET".to_string()), ".{0,6}"],
        url in ".{0,120}",
        params in vec((".{0,12}", ".{0,24}"), 0..8),
        headers in btree_map(
            prop_oneof![
                Just("X-Plivo-Signature-V3".to_string()),
                Just("X-Plivo-Signature-Ma-V3".to_string()),
                Just("X-Plivo-Signature-V3-Nonce".to_string()),
                Just("X-Plivo-Signature-V2".to_string()),
                Just("X-Plivo-Signature-V2-Nonce".to_string()),
            ],
            ".{0,60}",
            0..5,
        ),
    ) {
        let h: BTreeMap<String, String> = headers;
        prop_assert!(!plivo::validate_request("auth-token", &method, &url, &params, |n| h.get(n).cloned()));
        let s = plivo::string_to_sign_v3(&method, &url, &params);
        let input = url.len() + params.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        // Percent-decoding only shrinks; separators add at most two bytes per query pair.
        prop_assert!(s.len() <= 3 * input + 2, "{} > {}", s.len(), input);
    }

    /// The nonce memory stays under its capacity and refuses any repeat.
    #[test]
    fn plivo_nonces(ops in vec(("[0-9]{0,4}", 0u64..200), 1..200)) {
        let n = Nonces::new(Duration::from_secs(100), 64);
        let t0 = Instant::now();
        let mut t = 0u64;
        let mut last_seen: BTreeMap<String, u64> = BTreeMap::new();
        for (nonce, step) in &ops {
            t += step;
            let fresh = n.first_use_at(nonce, t0 + Duration::from_secs(t));
            if let (true, Some(prev)) = (fresh, last_seen.get(nonce)) {
                // Accepted again only once the window passed or the set evicted it.
                prop_assert!(t - prev >= 100 || n.len() == 64 || ops.len() > 64);
            }
            if fresh {
                last_seen.insert(nonce.clone(), t);
            }
            prop_assert!(n.len() <= 64);
        }
    }

    /// The SSE parser: arbitrary bytes in arbitrary chunks; no event over its cap.
    #[test]
    fn sse_parser(chunks in vec(prop_oneof![
        vec(any::<u8>(), 0..200),
        vec(proptest::sample::select(b"data: x{}[]\r\n:event id DONE".to_vec()), 0..200),
    ], 0..20)) {
        let mut p = SseParser::new();
        let total: usize = chunks.iter().map(Vec::len).sum();
        let mut out = 0usize;
        for c in &chunks {
            for e in p.push(c) {
                prop_assert!(e.data.len() <= MAX_EVENT_BYTES);
                out += e.data.len();
            }
        }
        if let Some(e) = p.finish() {
            out += e.data.len();
        }
        // Data lines are joined with "\n", which replaces at least one byte of line ending.
        prop_assert!(out <= total, "{out} bytes of data from {total} bytes in");
    }

    #[test]
    fn deepgram_messages(text in ".{0,200}", v in protocol_json(), t in proptest::sample::select(EVENTS)) {
        let _ = map_message(&text);
        let _ = map_message(&v.to_string());
        let shaped = json!({"type": t, "is_final": true, "speech_final": true,
            "channel": {"alternatives": [{"transcript": v}]}});
        let _ = map_message(&shaped.to_string());
    }

    /// The sentence chunker: every piece under the cap; nothing invented.
    #[test]
    fn sentence_chunker(deltas in vec(prop_oneof![
        ".{0,40}",
        "[a-z .,!?:;\n]{0,80}",
        "[a-z]{0,300}",
    ], 0..24)) {
        let mut c = SentenceChunker::new();
        let input: usize = deltas.iter().map(|d| d.chars().count()).sum();
        let mut out = 0usize;
        for d in &deltas {
            for piece in c.push(d) {
                prop_assert!(piece.len() <= MAX_PIECE_BYTES, "{} bytes", piece.len());
                out += piece.chars().count();
            }
        }
        if let Some(rest) = c.finish() {
            out += rest.chars().count();
        }
        prop_assert!(out <= input);
    }
}

/// Configuration lines from the schema's own sections and keys, with random values.
fn config_text() -> impl Strategy<Value = String> {
    let section = proptest::sample::select(vec![
        "[server]",
        "[outbound]",
        "[log]",
        "[store]",
        "[llm.hermes]",
        "[stt.deepgram]",
        "[tts.elevenlabs]",
        "[carriers.twilio]",
        "[carriers.telnyx]",
        "[carriers.plivo]",
        "[agents.front-desk]",
        "[[numbers]]",
        "[inbound]",
    ])
    .prop_map(str::to_string);
    let k = proptest::sample::select(vec![
        "listen",
        "public_url",
        "api_token",
        "max_calls",
        "data_dir",
        "kind",
        "base_url",
        "api_key",
        "auth_token",
        "account_sid",
        "public_key",
        "auth_id",
        "model",
        "voice_id",
        "number",
        "carrier",
        "agent",
        "llm",
        "stt",
        "tts",
        "allowed_callers",
        "allowed_destinations",
        "max_concurrent",
        "max_per_day",
        "system_prompt",
        "first_message",
        "max_duration_s",
        "retention_days",
        "queue",
        "format",
        "level",
    ]);
    let value = prop_oneof![
        any::<i64>().prop_map(|i| i.to_string()),
        "\"[ -~]{0,30}\"",
        "\"\\$\\{[A-Z_]{0,8}(:-[a-z]{0,5})?\\}\"",
        Just("\"twilio\"".to_string()),
        Just("\"telnyx\"".to_string()),
        Just("\"plivo\"".to_string()),
        Just("\"hermes\"".to_string()),
        Just("[\"+1555\"]".to_string()),
        Just("true".to_string()),
        ".{0,20}",
    ];
    let line = prop_oneof![
        1 => section,
        4 => (k, value).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => ".{0,40}",
    ];
    vec(line, 0..30).prop_map(|l| l.join("\n"))
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn config_loader(text in config_text(), raw in ".{0,200}") {
        let _ = patterd::config::load_str_with_vars(&text, "fuzz.toml", &[("PATTERD_API_TOKEN", "x")]);
        let _ = patterd::config::load_str_with_vars(&raw, "fuzz.toml", &[]);
    }
}
