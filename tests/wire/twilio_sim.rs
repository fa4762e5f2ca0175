//! A self-check of the Twilio simulator against a small WebSocket server written here: the
//! simulator must validate webhooks, stream in real time and model playback as Twilio does,
//! since every call test trusts it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use fastwebsockets::{FragmentCollector, Frame, OpCode, Payload, WebSocket};
use http_body_util::{BodyExt, Empty, Full};
use hyper::upgrade::Upgraded;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use patterd::audio::g711;
use patterd::carrier::twilio::{self, TwilioCodec};
use patterd::carrier::{MediaCodec, MediaCommand, MediaEvent};
use patterd_sim::twilio::{ClosedBy, SimCall, SimCallConfig, SimTwilio, parse_twiml};

const ACCOUNT_SID: &str = "AC00000000000000000000000000000001";
const AUTH_TOKEN: &str = "0123456789abcdef0123456789abcdef";

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
