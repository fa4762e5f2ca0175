//! Twilio integration tests: the shared vectors (G.711, signatures, answer documents, REST
//! requests, the media-stream session), the REST client against the fake API, and a self-check
//! of the simulator against a small WebSocket server written here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use fastwebsockets::{FragmentCollector, Frame, OpCode, Payload, WebSocket};
use http_body_util::{BodyExt, Empty, Full};
use hyper::upgrade::Upgraded;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::common::fixtures::{json as json_fixture, text as fixture};
use patterd::audio::g711;
use patterd::carrier::twilio::{self, TwilioCodec, TwilioRest};
use patterd::carrier::{CarrierError, MediaCodec, MediaCommand, MediaEvent};
use patterd_sim::twilio::{
    ClosedBy, FakeTwilioRest, SimCall, SimCallConfig, SimTwilio, parse_twiml, parse_xml,
};

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

// ------------------------------------------------------------------------------ simulator

const PUBLIC_URL: &str = "https://gw.example.com";

type ServerWs = WebSocket<TokioIo<Upgraded>>;

/// A minimal "patterd": validates the voice webhook, answers `<Connect><Stream>`, and hands each
/// accepted media socket (with its handshake headers) to the test.
struct TestServer {
    addr: std::net::SocketAddr,
    sockets: mpsc::UnboundedReceiver<(ServerWs, hyper::HeaderMap)>,
    _task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self._task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn text_response(status: u16, ct: &str, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
    r.headers_mut()
        .insert("content-type", ct.parse().expect("content type"));
    r
}

async fn test_handler(
    mut req: Request<hyper::body::Incoming>,
    tx: mpsc::UnboundedSender<(ServerWs, hyper::HeaderMap)>,
) -> Response<Body> {
    if fastwebsockets::upgrade::is_upgrade_request(&req) {
        let headers = req.headers().clone();
        let Ok((resp, fut)) = fastwebsockets::upgrade::upgrade(&mut req) else {
            return text_response(400, "text/plain", "bad upgrade".into());
        };
        tokio::spawn(async move {
            if let Ok(ws) = fut.await {
                let _ = tx.send((ws, headers));
            }
        });
        let (parts, _) = resp.into_parts();
        return Response::from_parts(parts, Empty::new().boxed());
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let sig = req
        .headers()
        .get(twilio::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return text_response(400, "text/plain", "body".into()),
    };
    let params = twilio::parse_form(&body);
    let url = twilio::public_request_url(PUBLIC_URL, &path, query.as_deref());
    if !twilio::validate_signature(AUTH_TOKEN, &url, &params, &sig, None) {
        return text_response(403, "text/plain", "bad signature".into());
    }
    let hook = match twilio::VoiceWebhook::from_params(&params) {
        Ok(h) => h,
        Err(e) => return text_response(400, "text/plain", e.to_string()),
    };
    if hook.to == "+15550000000" {
        return text_response(200, "text/xml", twilio::twiml_reject(Some("busy")));
    }
    let stream_url = twilio::public_ws_url(PUBLIC_URL, "/twilio/media");
    let token = format!("tok-{}", hook.call_sid);
    text_response(
        200,
        "text/xml",
        twilio::twiml_connect_stream(&stream_url, &[("token", &token)], None),
    )
}

async fn start_test_server() -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let tx = tx.clone();
                    async move { Ok::<_, std::convert::Infallible>(test_handler(req, tx).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    TestServer {
        addr,
        sockets: rx,
        _task: task,
    }
}

/// Server side of one media socket: decodes with the real codec, skipping caller audio unless
/// asked for it.
struct AppSide {
    ws: FragmentCollector<TokioIo<Upgraded>>,
    codec: TwilioCodec,
    audio_frames: Vec<Bytes>,
}

impl AppSide {
    /// Reads one frame: `Err(())` once the socket is closed, `Ok(None)` for frames that carry
    /// no event (audio is stored in `audio_frames`).
    async fn step(&mut self) -> Result<Option<MediaEvent>, ()> {
        let frame = tokio::time::timeout(Duration::from_secs(5), self.ws.read_frame())
            .await
            .expect("frame within 5 s")
            .map_err(|_| ())?;
        match frame.opcode {
            OpCode::Text => {
                let text = std::str::from_utf8(&frame.payload)
                    .expect("utf8")
                    .to_string();
                match self.codec.decode(&text).expect("simulator frames decode") {
                    Some(MediaEvent::Audio(a)) => {
                        self.audio_frames.push(a);
                        Ok(None)
                    }
                    ev => Ok(ev),
                }
            }
            OpCode::Close => Err(()),
            _ => Ok(None),
        }
    }

    /// The next non-audio event; `None` once the socket is closed.
    async fn next_event(&mut self) -> Option<MediaEvent> {
        loop {
            if let Some(ev) = self.step().await.ok()? {
                return Some(ev);
            }
        }
    }

    async fn send(&mut self, cmd: MediaCommand) {
        let text = self.codec.encode(&cmd).expect("encodable");
        self.send_raw(&text).await;
    }

    async fn send_raw(&mut self, text: &str) {
        self.ws
            .write_frame(Frame::text(Payload::Owned(text.as_bytes().to_vec())))
            .await
            .expect("write");
    }

    /// Reads until the audio-frame count reaches `n`.
    async fn collect_audio(&mut self, n: usize) {
        while self.audio_frames.len() < n {
            let ev = self.step().await.expect("socket open");
            assert_eq!(ev, None, "only audio expected");
        }
    }
}

async fn sim_call(server: &mut TestServer, to: &str) -> (SimCall, AppSide) {
    let sim = SimTwilio::new(
        &format!("http://{}", server.addr),
        PUBLIC_URL,
        ACCOUNT_SID,
        AUTH_TOKEN,
    );
    let (call_sid, resp) = sim
        .incoming_call("/twilio/voice", "+14155550199", to)
        .await
        .expect("webhook");
    assert_eq!(resp.status, 200, "{}", resp.body);
    let answer = parse_twiml(&resp.body).expect("twiml");
    assert!(answer.warnings.is_empty(), "{:?}", answer.warnings);
    assert_eq!(
        answer.stream_url.as_deref(),
        Some("wss://gw.example.com/twilio/media")
    );
    assert_eq!(
        answer.parameters.get("token"),
        Some(&format!("tok-{call_sid}"))
    );
    let mut cfg = SimCallConfig::new(&format!("ws://{}", server.addr), ACCOUNT_SID, &call_sid);
    cfg.auth_token = Some(AUTH_TOKEN.into());
    let call = SimCall::from_answer(&answer, cfg)
        .await
        .expect("media socket");
    let (ws, headers) = tokio::time::timeout(Duration::from_secs(5), server.sockets.recv())
        .await
        .expect("socket in time")
        .expect("socket");
    // The handshake is signed over the <Stream url> as written.
    let sig = headers
        .get(twilio::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .expect("signature header");
    assert!(twilio::validate_signature(
        AUTH_TOKEN,
        "wss://gw.example.com/twilio/media",
        &[],
        sig,
        None
    ));
    let mut app = AppSide {
        ws: FragmentCollector::new(ws),
        codec: TwilioCodec::new(),
        audio_frames: Vec::new(),
    };
    match app.next_event().await {
        Some(MediaEvent::Start(st)) => {
            assert_eq!(st.call_id, call_sid);
            assert_eq!(st.stream_id, call.stream_sid);
            assert_eq!(
                st.custom_parameters.get("token"),
                Some(&format!("tok-{call_sid}"))
            );
        }
        other => panic!("expected start, got {other:?}"),
    }
    (call, app)
}

#[tokio::test]
async fn webhook_rejections() {
    let server = start_test_server().await;
    let sim = SimTwilio::new(
        &format!("http://{}", server.addr),
        PUBLIC_URL,
        ACCOUNT_SID,
        AUTH_TOKEN,
    );
    let (_, resp) = sim
        .incoming_call("/twilio/voice", "+14155550199", "+15550000000")
        .await
        .expect("webhook");
    assert_eq!(
        parse_twiml(&resp.body).expect("twiml").reject.as_deref(),
        Some("busy")
    );
    let params = patterd_sim::twilio::voice_webhook_params(ACCOUNT_SID, "CA1", "+1", "+2");
    let resp = sim
        .post_form_with_signature("/twilio/voice", &params, "AAAA")
        .await
        .expect("post");
    assert_eq!(resp.status, 403);
    let resp = sim
        .post_form("/twilio/voice?x=1", &[("From".into(), "+1".into())])
        .await
        .expect("post");
    assert_eq!(resp.status, 400);
    assert!(resp.body.contains("CallSid"), "{}", resp.body);
}

#[tokio::test]
async fn simulator_streams_and_models_playback() {
    let mut server = start_test_server().await;
    let (call, mut app) = sim_call(&mut server, "+14155550100").await;

    // Caller audio: filler silence, then a queued tone, in real time.
    call.push_tone(440.0, 100, 8000);
    let t = Instant::now();
    app.collect_audio(12).await;
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "paced in real time"
    );
    let loud: Vec<_> = app
        .audio_frames
        .iter()
        .filter(|f| g711::ulaw_energy(f) > 1000)
        .collect();
    assert_eq!(loud.len(), 5, "100 ms of tone = 5 loud frames");
    assert!(app.audio_frames.iter().all(|f| f.len() == 160));

    // 400 ms of agent audio, then a mark: echoed once it has played.
    app.send(MediaCommand::Audio(Bytes::from(g711::ulaw_tone(
        330.0, 400, 6000,
    ))))
    .await;
    app.send(MediaCommand::Mark("m1".into())).await;
    let t = Instant::now();
    assert_eq!(
        app.next_event().await,
        Some(MediaEvent::MarkPlayed("m1".into()))
    );
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(360) && el < Duration::from_millis(900),
        "m1 after {el:?}"
    );

    // A mark on an empty queue comes back at once.
    app.send(MediaCommand::Mark("m2".into())).await;
    let t = Instant::now();
    assert_eq!(
        app.next_event().await,
        Some(MediaEvent::MarkPlayed("m2".into()))
    );
    assert!(t.elapsed() < Duration::from_millis(150));

    // Barge-in: clear drops queued audio and echoes pending marks in order, immediately.
    app.send(MediaCommand::Audio(Bytes::from(g711::ulaw_tone(
        330.0, 1000, 6000,
    ))))
    .await;
    app.send(MediaCommand::Mark("m3".into())).await;
    app.send(MediaCommand::Audio(Bytes::from(g711::ulaw_tone(
        330.0, 200, 6000,
    ))))
    .await;
    app.send(MediaCommand::Mark("m4".into())).await;
    call.wait_for("agent audio queued", Duration::from_secs(2), |s| {
        s.marks_received.len() == 4
    })
    .await
    .expect("marks arrive");
    tokio::time::sleep(Duration::from_millis(100)).await;
    app.send(MediaCommand::Clear).await;
    let t = Instant::now();
    assert_eq!(
        app.next_event().await,
        Some(MediaEvent::MarkPlayed("m3".into()))
    );
    assert_eq!(
        app.next_event().await,
        Some(MediaEvent::MarkPlayed("m4".into()))
    );
    assert!(t.elapsed() < Duration::from_millis(200));

    // DTMF reaches the app.
    call.send_dtmf('5');
    assert_eq!(app.next_event().await, Some(MediaEvent::Dtmf('5')));

    let st = call
        .wait_for("clear recorded", Duration::from_secs(1), |s| {
            !s.clears.is_empty()
        })
        .await
        .expect("state");
    assert!(st.protocol_errors.is_empty(), "{:?}", st.protocol_errors);
    assert_eq!(st.echoed_mark_names(), ["m1", "m2", "m3", "m4"]);
    assert_eq!(st.utterances.len(), 3, "{:#?}", st.utterances);
    assert_eq!(st.utterances[0].bytes, 3200);
    assert_eq!(st.utterances[0].mark.as_deref(), Some("m1"));
    assert!(!st.utterances[0].cleared);
    assert!(st.utterances[0].mean_energy > 2000);
    assert!(st.utterances[1].cleared && st.utterances[2].cleared);
    assert_eq!(st.agent_audio_bytes, 3200 + 8000 + 1600);
    assert_eq!(st.playback_queued_bytes, 0);
    assert!(st.first_agent_audio_ms.is_some());
    assert_eq!(st.speech_frames_sent, 5);
    assert_eq!(st.dtmf_sent, vec!['5']);

    // Strict validation: everything wrong is recorded.
    app.send_raw("not json").await;
    app.send_raw(r#"{"event":"media","streamSid":"MZwrong","media":{"payload":"/w=="}}"#)
        .await;
    app.send_raw(&format!(
        r#"{{"event":"media","streamSid":"{}","media":{{"payload":"***"}}}}"#,
        call.stream_sid
    ))
    .await;
    app.send_raw(&format!(
        r#"{{"event":"dance","streamSid":"{}"}}"#,
        call.stream_sid
    ))
    .await;
    let st = call
        .wait_for("4 protocol errors", Duration::from_secs(2), |s| {
            s.protocol_errors.len() == 4
        })
        .await
        .expect("errors recorded");
    assert!(
        st.protocol_errors[1].contains("streamSid"),
        "{:?}",
        st.protocol_errors
    );

    // The server closes with 1008: recorded.
    app.ws
        .write_frame(Frame::close(1008, b"policy"))
        .await
        .expect("close");
    let closed = call
        .wait_closed(Duration::from_secs(2))
        .await
        .expect("closed");
    assert_eq!(closed.by, ClosedBy::Server);
    assert_eq!(closed.code, Some(1008));
}

#[tokio::test]
async fn simulator_hang_up_sends_stop_then_closes() {
    let mut server = start_test_server().await;
    let (call, mut app) = sim_call(&mut server, "+14155550100").await;
    call.hang_up().await;
    assert_eq!(app.next_event().await, Some(MediaEvent::Stop));
    assert_eq!(app.next_event().await, None, "then a close frame");
    let st = call.state();
    assert_eq!(st.closed.as_ref().map(|c| c.by), Some(ClosedBy::Client));
    assert!(
        call.wait_for("never", Duration::from_millis(50), |_| false)
            .await
            .is_err()
    );
}
