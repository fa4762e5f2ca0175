//! Twilio integration tests: the shared vectors (G.711, signatures, answer documents, REST
//! requests, the media-stream session) and the REST client against the fake API. The
//! simulator's self-check is in `twilio_sim.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::Value;

use crate::common::fixtures::{json as json_fixture, text as fixture};
use patterd::audio::g711;
use patterd::carrier::twilio::{self, TwilioCodec, TwilioRest};
use patterd::carrier::{CarrierError, MediaCodec, MediaCommand, MediaEvent};
use patterd_sim::twilio::{FakeTwilioRest, parse_twiml, parse_xml};

const ACCOUNT_SID: &str = "AC00000000000000000000000000000001";
const AUTH_TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn s(v: &Value) -> &str {
    v.as_str().expect("string")
}

// ------------------------------------------------------------------------------ G.711

#[test]
fn mulaw_decode_table_matches_audioop() {
    let v = json_fixture("mulaw_decode_table.json");
    let table = v["table"].as_array().expect("table");
    assert_eq!(table.len(), 256);
    for (i, want) in table.iter().enumerate() {
        let want = want.as_i64().expect("int") as i16;
        assert_eq!(g711::ulaw_to_linear(i as u8), want, "byte {i:#04x}");
    }
    assert_eq!(
        v["silence_byte"].as_u64(),
        Some(u64::from(g711::SILENCE_ULAW))
    );
}

#[test]
fn mulaw_encode_pairs_match_audioop() {
    let v = json_fixture("mulaw_encode_pairs.json");
    let pairs = v["pairs"].as_array().expect("pairs");
    assert!(pairs.len() >= 90);
    for p in pairs {
        let pcm = p["pcm16"].as_i64().expect("pcm16") as i16;
        let want = p["ulaw"].as_u64().expect("ulaw") as u8;
        assert_eq!(g711::linear_to_ulaw(pcm), want, "pcm {pcm}");
        let dec = p["decodes_to"].as_i64().expect("decodes_to") as i16;
        assert_eq!(g711::ulaw_to_linear(want), dec);
    }
}

#[test]
fn alaw_tables_match_audioop() {
    let v = json_fixture("alaw_tables.json");
    for (i, want) in v["decode_table"]
        .as_array()
        .expect("table")
        .iter()
        .enumerate()
    {
        assert_eq!(
            i64::from(g711::alaw_to_linear(i as u8)),
            want.as_i64().expect("int")
        );
    }
    for p in v["encode_pairs"].as_array().expect("pairs") {
        let pcm = p["pcm16"].as_i64().expect("pcm16") as i16;
        assert_eq!(
            u64::from(g711::linear_to_alaw(pcm)),
            p["alaw"].as_u64().expect("alaw"),
            "pcm {pcm}"
        );
    }
    assert_eq!(
        v["silence_byte"].as_u64(),
        Some(u64::from(g711::SILENCE_ALAW))
    );
}

// ------------------------------------------------------------------------------ signatures

#[test]
fn signature_vectors() {
    let v = json_fixture("twilio_signature.json");
    let cases = v["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 17);
    for c in cases {
        let name = s(&c["name"]);
        let headers = &c["headers"];
        let sig = s(&headers["X-Twilio-Signature"]);
        let settings = headers
            .get("X-Twilio-Webhooks-Signature-Settings")
            .and_then(Value::as_str);
        let url = s(&c["url"]);
        let key = s(&c["auth_token"]);
        let got = if let Some(body) = c.get("body").and_then(Value::as_str) {
            twilio::validate_signature_json(key, url, body.as_bytes(), sig, settings)
        } else {
            let params: Vec<(String, String)> = if let Some(pairs) = c.get("params_pairs") {
                pairs
                    .as_array()
                    .expect("pairs")
                    .iter()
                    .map(|p| (s(&p[0]).to_string(), s(&p[1]).to_string()))
                    .collect()
            } else {
                c["params"]
                    .as_object()
                    .expect("params")
                    .iter()
                    .map(|(k, v)| (k.clone(), s(v).to_string()))
                    .collect()
            };
            if let Some(sts) = c.get("string_to_sign").and_then(Value::as_str)
                && c["valid"] == true
                && url == s(&c["signed_url"])
            {
                assert_eq!(twilio::string_to_sign(url, &params), sts, "{name}");
            }
            twilio::validate_signature(key, url, &params, sig, settings)
        };
        assert_eq!(got, c["valid"].as_bool().expect("valid"), "case {name}");
    }
}

// ------------------------------------------------------------------------------ TwiML

#[test]
fn twiml_matches_sdk_documents_structurally() {
    let docs = json_fixture("answer_documents.json");
    let ours = twilio::twiml_connect_stream(
        "wss://gw.example.com/twilio/media",
        &[("callToken", "t0k3n-abc"), ("tenant", "acme")],
        Some("https://gw.example.com/twilio/stream-status"),
    );
    assert!(ours.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
    let sdk = parse_xml(s(&docs["twilio_connect_stream"]["xml"])).expect("sdk xml");
    assert_eq!(
        parse_xml(&ours).expect("our xml").canonical(),
        sdk.canonical()
    );

    let ours = twilio::twiml_say_hangup("This number is not authorised.");
    let sdk = parse_xml(s(&docs["twilio_reject"]["xml"])).expect("sdk xml");
    assert_eq!(
        parse_xml(&ours).expect("our xml").canonical(),
        sdk.canonical()
    );

    let a = parse_twiml(&twilio::twiml_reject(Some("busy"))).expect("reject");
    assert_eq!(a.reject.as_deref(), Some("busy"));
    let a = parse_twiml(&twilio::twiml_hangup()).expect("hangup");
    assert!(a.hangup);
}

// ------------------------------------------------------------------------------ codec

/// The JSON shape: objects keep their keys, leaves become their type, `event` keeps its value.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let leaf = if k == "event" { v.clone() } else { shape(v) };
                    (k.clone(), leaf)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::String(_) => Value::from("string"),
        Value::Number(_) => Value::from("number"),
        Value::Bool(_) => Value::from("bool"),
        Value::Null => Value::Null,
    }
}

#[test]
fn codec_replays_session() {
    let text = fixture("twilio_session.jsonl");
    let mut codec = TwilioCodec::new();
    let mut seen = BTreeMap::<String, usize>::new();
    for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let rec: Value = serde_json::from_str(line).expect("jsonl line");
        let msg = &rec["msg"];
        let event = s(&msg["event"]).to_string();
        *seen
            .entry(format!("{}:{event}", s(&rec["dir"])))
            .or_default() += 1;
        match s(&rec["dir"]) {
            "carrier->app" => {
                let got = codec.decode(&msg.to_string()).expect("decodes");
                let want = match event.as_str() {
                    "connected" => None,
                    "start" => {
                        let st = &msg["start"];
                        Some(MediaEvent::Start(patterd::carrier::StreamStart {
                            call_id: s(&st["callSid"]).into(),
                            stream_id: s(&st["streamSid"]).into(),
                            custom_parameters: st["customParameters"]
                                .as_object()
                                .expect("params")
                                .iter()
                                .map(|(k, v)| (k.clone(), s(v).to_string()))
                                .collect(),
                        }))
                    }
                    "media" => {
                        let audio = STANDARD.decode(s(&msg["media"]["payload"])).expect("b64");
                        assert_eq!(audio.len(), 160);
                        Some(MediaEvent::Audio(Bytes::from(audio)))
                    }
                    "dtmf" => Some(MediaEvent::Dtmf(
                        s(&msg["dtmf"]["digit"]).chars().next().expect("digit"),
                    )),
                    "mark" => Some(MediaEvent::MarkPlayed(s(&msg["mark"]["name"]).into())),
                    "stop" => Some(MediaEvent::Stop),
                    other => panic!("unexpected event {other}"),
                };
                assert_eq!(got, want, "line {line}");
            }
            "app->carrier" => {
                let cmd = match event.as_str() {
                    "media" => MediaCommand::Audio(Bytes::from(
                        STANDARD.decode(s(&msg["media"]["payload"])).expect("b64"),
                    )),
                    "mark" => MediaCommand::Mark(s(&msg["mark"]["name"]).into()),
                    "clear" => MediaCommand::Clear,
                    other => panic!("unexpected event {other}"),
                };
                let ours: Value =
                    serde_json::from_str(&codec.encode(&cmd).expect("encodes")).expect("json");
                assert_eq!(shape(&ours), shape(msg), "shape of {event}");
                assert_eq!(ours, *msg, "content of {event}");
            }
            other => panic!("bad dir {other}"),
        }
    }
    assert_eq!(
        codec.stream_sid(),
        Some("MZ00000000000000000000000000000001")
    );
    for k in [
        "carrier->app:connected",
        "carrier->app:start",
        "carrier->app:media",
        "carrier->app:dtmf",
        "carrier->app:mark",
        "carrier->app:stop",
        "app->carrier:media",
        "app->carrier:mark",
        "app->carrier:clear",
    ] {
        assert!(seen.contains_key(k), "session covers {k}");
    }
}

// ------------------------------------------------------------------------------ REST

fn rest_vector(op_prefix: &str) -> Value {
    let v = json_fixture("rest_requests.json");
    v["twilio"]
        .as_array()
        .expect("twilio")
        .iter()
        .find(|r| s(&r["op"]).starts_with(op_prefix))
        .cloned()
        .expect("vector")
}

fn assert_matches_vector(got: &patterd_sim::twilio::RecordedRequest, want: &Value) {
    assert_eq!(got.method, s(&want["method"]));
    assert_eq!(
        got.path,
        s(&want["url"]).trim_start_matches("https://api.twilio.com")
    );
    for (k, v) in want["headers"].as_object().expect("headers") {
        assert_eq!(got.header(k), Some(s(v)), "header {k}");
    }
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        s(&want["body"]),
        "body byte-for-byte"
    );
}

#[tokio::test]
async fn rest_hang_up_matches_sdk_request() {
    let fake = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN)
        .await
        .expect("fake");
    let rest = TwilioRest::new(&fake.base_url, ACCOUNT_SID, AUTH_TOKEN).expect("client");
    rest.hang_up("CA00000000000000000000000000000009")
        .await
        .expect("hang up");
    let reqs = fake
        .wait_for_requests(1, Duration::from_secs(2))
        .await
        .expect("request");
    assert_matches_vector(&reqs[0], &rest_vector("calls(sid).update(status"));
    assert_eq!(fake.hung_up(), vec!["CA00000000000000000000000000000009"]);
}

#[tokio::test]
async fn rest_create_call_matches_sdk_requests() {
    let fake = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN)
        .await
        .expect("fake");
    let rest = TwilioRest::new(&fake.base_url, ACCOUNT_SID, AUTH_TOKEN).expect("client");
    let twiml_vec = rest_vector("calls.create(twiml");
    let twiml = twiml_vec["form_fields"]
        .as_array()
        .expect("fields")
        .iter()
        .find(|p| p[0] == "Twiml")
        .map(|p| s(&p[1]).to_string());
    let sid = rest
        .create_call(&twilio::rest::CreateCall {
            to: "+14155550123".into(),
            from: "+14155550100".into(),
            twiml,
            status_callback: Some("https://gw.example.com/twilio/status".into()),
            status_callback_events: ["initiated", "ringing", "answered", "completed"]
                .map(String::from)
                .to_vec(),
            timeout_s: Some(30),
            machine_detection: Some("Enable".into()),
            async_amd_status_callback: Some("https://gw.example.com/twilio/amd".into()),
            ..Default::default()
        })
        .await
        .expect("create");
    assert!(sid.starts_with("CA"));
    rest.create_call(&twilio::rest::CreateCall {
        to: "+14155550123".into(),
        from: "+14155550100".into(),
        url: Some("https://gw.example.com/twilio/voice".into()),
        ..Default::default()
    })
    .await
    .expect("create with url");
    let reqs = fake.requests();
    assert_matches_vector(&reqs[0], &twiml_vec);
    assert_matches_vector(&reqs[1], &rest_vector("calls.create(url"));
}

#[tokio::test]
async fn rest_errors_say_what_to_check() {
    let fake = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN)
        .await
        .expect("fake");
    let wrong = TwilioRest::new(&fake.base_url, ACCOUNT_SID, "wrong").expect("client");
    let err = wrong
        .hang_up("CA00000000000000000000000000000009")
        .await
        .expect_err("401");
    assert!(matches!(
        err,
        CarrierError::Unauthorized { status: 401, .. }
    ));
    assert!(err.to_string().contains("account_sid"), "{err}");
    assert_eq!(fake.requests()[0].status, 401);

    let rest = TwilioRest::new(&fake.base_url, ACCOUNT_SID, AUTH_TOKEN).expect("client");
    let err = rest.hang_up("CAnope").await.expect_err("404");
    assert!(matches!(err, CarrierError::NotFound { .. }), "{err}");
    let err = rest.hang_up("../../etc").await.expect_err("bad sid");
    assert!(matches!(err, CarrierError::NotFound { .. }), "{err}");

    fake.fail_with(Some(503));
    let err = rest
        .hang_up("CA00000000000000000000000000000009")
        .await
        .expect_err("503");
    assert!(
        matches!(&err, CarrierError::Http { status: 503, message, .. } if message.contains("20500")),
        "{err}"
    );
    fake.fail_with(None);

    fake.set_delay(Duration::from_millis(800));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("client");
    let slow = TwilioRest::with_client(client, &fake.base_url, ACCOUNT_SID, AUTH_TOKEN);
    let err = slow
        .hang_up("CA00000000000000000000000000000009")
        .await
        .expect_err("timeout");
    assert!(matches!(err, CarrierError::Timeout { .. }), "{err}");

    let unreachable = TwilioRest::new("http://127.0.0.1:1", ACCOUNT_SID, AUTH_TOKEN).expect("c");
    let err = unreachable
        .hang_up("CA00000000000000000000000000000009")
        .await
        .expect_err("refused");
    assert!(matches!(err, CarrierError::Network { .. }), "{err}");
}
