//! Issue 11's holes, each proved against the daemon on 127.0.0.1: the control plane behind a
//! proxy and from web pages, `/metrics` with a token, replayed webhooks and second media
//! streams, and the media socket's `start` deadline.

use std::time::{Duration, Instant};

use crate::common::*;
use fastwebsockets::OpCode;
use patterd_sim::twilio::new_sid;
use patterd_sim::twilio::voice_webhook_params;
use patterd_sim::twilio::xml::parse_twiml;
use serde_json::json;

/// A daemon bound on port 0 from `server` lines (plus a data dir); no carriers.
async fn daemon(server: &str) -> (tempfile::TempDir, patterd::server::Running, String) {
    patterd::util::init_tls();
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = {:?}\n{server}",
        dir.path().display().to_string()
    );
    let loaded = patterd::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
    let running = patterd::server::bind(loaded.config).await.expect("bind");
    let base = format!("http://{}", running.local_addr);
    (dir, running, base)
}

/// Token-less local mode (both `listen` and `public_url` loopback): a request that came
/// through a proxy is refused on `/v1` and `/mcp`, whatever its `Host` says.
#[tokio::test]
async fn tokenless_api_refuses_proxied_requests() {
    let (_dir, _d, base) = daemon("public_url = \"http://127.0.0.1:8080\"\n").await;
    let c = reqwest::Client::new();
    let r = c.get(format!("{base}/v1/calls")).send().await.unwrap();
    assert_eq!(r.status(), 200, "local request");
    for (h, v) in [
        ("X-Forwarded-For", "203.0.113.7"),
        ("X-Forwarded-Proto", "https"),
        ("Forwarded", "for=203.0.113.7"),
        ("Via", "1.1 nginx"),
    ] {
        let r = c
            .get(format!("{base}/v1/calls"))
            .header(h, v)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{h}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "proxied_request", "{h}");
        let r = c
            .post(format!("{base}/mcp"))
            .header(h, v.to_string())
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "/mcp {h}");
    }
}

/// A web page cannot drive the API: JSON posted as `text/plain` (a no-cors fetch) and any
/// request from another `Origin` are refused, and nothing changes.
#[tokio::test]
async fn cross_site_requests_are_refused() {
    let (_dir, _d, base) = daemon("public_url = \"http://127.0.0.1:8080\"\n").await;
    let c = reqwest::Client::new();
    let body = json!({"enabled": false}).to_string();
    let r = c
        .put(format!("{base}/v1/inbound"))
        .header("Content-Type", "text/plain;charset=UTF-8")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = c
        .post(format!("{base}/v1/calls"))
        .body(json!({"to": "+15557654321"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415, "POST without a content type");
    let r = c
        .put(format!("{base}/v1/inbound"))
        .header("Content-Type", "application/json")
        .header("Origin", "https://evil.example")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "forbidden_origin");
    let r = c
        .get(format!("{base}/v1/calls"))
        .header("Origin", "http://localhost:3000")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "another local origin is another origin");
    // Nothing was changed by the refused requests.
    let v: serde_json::Value = c
        .get(format!("{base}/v1/inbound"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v, json!({"overrides": {}}));
    // Our own origin with JSON is fine.
    let r = c
        .put(format!("{base}/v1/inbound"))
        .header("Content-Type", "application/json")
        .header("Origin", "http://127.0.0.1:8080")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// With a token set, `/metrics` needs it too, unless `metrics_public = true`.
#[tokio::test]
async fn metrics_need_the_token_unless_public() {
    let (_dir, _d, base) =
        daemon("public_url = \"https://voice.example.test\"\napi_token = \"sekret-0123456789abcdefghijklmnop\"\n").await;
    let r = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(r.status(), 401);
    let r = api_client("sekret-0123456789abcdefghijklmnop")
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("patterd_calls_active"));

    let (_dir, _d, base) = daemon(
        "public_url = \"https://voice.example.test\"\napi_token = \"sekret-0123456789abcdefghijklmnop\"\nmetrics_public = true\n",
    )
    .await;
    let r = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(r.status(), 200);
}

/// Starts a stack and one Twilio call through a webhook the test keeps (to replay it).
async fn live_call() -> (
    Stack,
    String,
    Vec<(String, String)>,
    patterd_sim::twilio::xml::TwimlAnswer,
    patterd_sim::twilio::call::SimCall,
) {
    let stack = Stack::start(Opts {
        transcripts: vec!["what are your hours".into()],
        ..Opts::default()
    })
    .await;
    stack
        .hermes
        .push(patterd_sim::hermes::HermesReply::text("We open at nine."));
    let call_sid = new_sid("CA");
    let params = voice_webhook_params(ACCOUNT_SID, &call_sid, CALLER, OUR_NUMBER);
    let first = stack
        .twilio
        .post_form("/twilio/voice", &params)
        .await
        .unwrap();
    let answer = parse_twiml(&first.body).expect("TwiML");
    let sim = stack.open(&call_sid, &answer).await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    (stack, call_sid, params, answer, sim)
}

/// Posts a replayed voice webhook, whose TwiML must start no stream; returns the TwiML read
/// and as sent.
async fn replay_voice_webhook(
    stack: &Stack,
    params: &[(String, String)],
) -> (patterd_sim::twilio::xml::TwimlAnswer, String) {
    let replay = stack
        .twilio
        .post_form("/twilio/voice", params)
        .await
        .unwrap();
    let r = parse_twiml(&replay.body).expect("TwiML");
    assert!(r.stream_url.is_none(), "{}", replay.body);
    (r, replay.body)
}

/// A captured voice webhook replayed while the call is live gets no second media token;
/// replayed after the call ended, or for a call only in the store, it starts nothing.
#[tokio::test]
async fn replayed_voice_webhooks_are_refused() {
    let (stack, call_sid, params, _answer, sim) = live_call().await;

    // Replayed while live: refused, no stream, no token.
    let (r, body) = replay_voice_webhook(&stack, &params).await;
    assert!(!r.parameters.contains_key("token"), "{body}");
    assert!(!sim.state().is_closed());
    sim.hang_up().await;
    stack.finished(&call_sid).await;

    // Replayed after the call ended: no new call.
    replay_voice_webhook(&stack, &params).await;
    assert!(stack.server.app.calls.get(&call_sid).is_none());

    // A call id known only to the store (a previous run): refused too.
    let old = new_sid("CA");
    stack
        .server
        .app
        .store
        .tx
        .send(patterd::store::Write::Call(patterd::store::NewCall {
            call_id: old.clone(),
            carrier: "twilio".into(),
            carrier_account: "twilio".into(),
            direction: "inbound",
            from: CALLER.into(),
            to: OUR_NUMBER.into(),
            agent: "front-desk".into(),
            status: "completed".into(),
        }));
    stack.server.app.store.tx.flush().await.unwrap();
    let params = voice_webhook_params(ACCOUNT_SID, &old, CALLER, OUR_NUMBER);
    replay_voice_webhook(&stack, &params).await;
    assert!(stack.server.app.calls.get(&old).is_none());
    let replayed = stack.metric(|m| &m.webhooks_replayed);
    assert_eq!(replayed, 3);
}

/// A second media stream for a live call — with a second valid token, as a replayed webhook
/// used to hand out — is refused without touching the live call (it used to be hung up at the
/// carrier when the actor refused the stream).
#[tokio::test]
async fn a_second_stream_never_touches_the_live_call() {
    let (stack, call_sid, _params, answer, sim) = live_call().await;
    let second_token = stack
        .server
        .app
        .tokens
        .mint_with_expiry(&call_sid, unix_now() + 60);
    let mut with_token = answer.clone();
    with_token
        .parameters
        .insert("token".to_string(), second_token);
    let second = stack.open(&call_sid, &with_token).await;
    let close = second
        .wait_closed(WAIT)
        .await
        .expect("second stream closed");
    // The live call goes on: a whole turn, and nobody hung it up at the carrier.
    speak(&sim, 700);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    assert!(!sim.state().is_closed());
    assert!(
        !stack.rest.hung_up().contains(&call_sid),
        "the refused stream hung up the real call"
    );
    // Refused by the token check (policy close), not attached and dropped by the actor.
    assert_eq!(close.code, Some(1008));
    sim.hang_up().await;
    stack.finished(&call_sid).await;
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A media socket that never sends `start` is closed after the short start deadline (5 s).
#[tokio::test]
async fn idle_media_socket_is_closed_at_the_start_deadline() {
    let stack = Stack::start(Opts::default()).await;
    let url = format!("{}/twilio/media", stack.ws_base());
    let opened = Instant::now();
    let (mut ws, _) = patterd::net::ws_client::connect(&url, &[], Duration::from_secs(5))
        .await
        .expect("socket opens");
    let closed = tokio::time::timeout(Duration::from_secs(8), async {
        loop {
            match ws.read_frame().await {
                Ok(f) if f.opcode == OpCode::Close => return,
                Ok(_) => {}
                Err(_) => return,
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "still open after {:?} without start",
        opened.elapsed()
    );
}

/// Before `start` has authenticated a media socket, a frame over the media message cap
/// (64 KiB) closes it at once: its payload is never read into memory, and the socket does not
/// stay open to the start deadline.
#[tokio::test]
async fn an_oversized_frame_before_start_closes_the_socket() {
    use fastwebsockets::{Frame, Payload};
    let stack = Stack::start(Opts::default()).await;
    let url = format!("{}/twilio/media", stack.ws_base());
    let (mut ws, _) = patterd::net::ws_client::connect(&url, &[], Duration::from_secs(5))
        .await
        .expect("socket opens");
    let opened = Instant::now();
    let big = vec![b'a'; patterd::carrier::MAX_MEDIA_MESSAGE + 1];
    let _ = ws.write_frame(Frame::text(Payload::Owned(big))).await;
    let closed = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match ws.read_frame().await {
                Ok(f) if f.opcode == OpCode::Close => return,
                Ok(_) => {}
                Err(_) => return,
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "an oversized frame before start left the socket open for {:?}",
        opened.elapsed()
    );
}

/// A Telnyx or Plivo media URL with a token this daemon never minted gets 401/403 and is
/// never upgraded.
#[tokio::test]
async fn url_tokens_are_checked_before_the_upgrade() {
    let stack = Stack::start(Opts::default()).await;
    let c = reqwest::Client::new();
    let addr = stack.server.local_addr;
    let foreign = patterd::security::token::MediaTokens::new(Duration::from_secs(60)).mint("x");
    for (path, want) in [
        (format!("/telnyx/media/{foreign}"), 403),
        ("/telnyx/media/garbage".to_string(), 401),
        (format!("/plivo/media/abc?t={foreign}"), 403),
        ("/plivo/media/abc".to_string(), 401),
    ] {
        let r = c
            .get(format!("http://{addr}{path}"))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{path}");
    }
    let m = stack.metric(|m| &m.media_rejected);
    assert_eq!(m, 4);
}

/// Upgraded media sockets leave the listener's connection count, so they have their own
/// bound (`2 × max_calls + 16`): beyond it a media socket is refused with 503 before the
/// upgrade, and the refusal is counted.
#[tokio::test]
async fn media_sockets_are_bounded() {
    let stack = Stack::start(Opts {
        max_calls: 1,
        ..Opts::default()
    })
    .await;
    let limit = patterd::app::media_socket_limit(&stack.server.app.config());
    assert_eq!(limit, 18);
    let url = format!("{}/twilio/media", stack.ws_base());
    let mut open = Vec::new();
    for i in 0..limit {
        let (ws, _) = patterd::net::ws_client::connect(&url, &[], Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("socket {i} opens: {e}"));
        open.push(ws);
    }
    let refused = patterd::net::ws_client::connect(&url, &[], Duration::from_secs(5)).await;
    let e = refused.err().expect("one socket over the bound is refused");
    assert!(e.to_string().contains("503"), "{e}");
    drop(open);
}

/// Every MCP tool that names a call reaches a live Telnyx call (`v3:` ids, which the tools
/// percent-encode and the API decodes): listing, transcript, metrics, and hanging it up.
#[tokio::test]
async fn mcp_tools_reach_a_live_telnyx_call() {
    use patterd::mcp::{Local, PatterMcp};
    let stack = Stack::start(Opts::default()).await;
    let (call_id, sim) = stack
        .telnyx
        .place_call(&stack.telnyx_rest, &stack.ws_base(), CALLER, TELNYX_NUMBER)
        .await
        .expect("telnyx call");
    assert!(call_id.starts_with("v3:"), "{call_id}");
    sim.wait_for("greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .unwrap();
    stack.server.app.store.tx.flush().await.unwrap();
    let mcp = PatterMcp::new(std::sync::Arc::new(Local(std::sync::Arc::downgrade(
        &stack.server.app,
    ))));
    let args = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let list = mcp
        .run_tool("get_calls", serde_json::Map::new())
        .await
        .expect("get_calls");
    assert!(list.contains(&call_id), "{list}");
    let t = mcp
        .run_tool("get_transcript", args(json!({"callId": call_id})))
        .await
        .expect("get_transcript");
    assert!(t.contains(&call_id), "{t}");
    mcp.run_tool("get_metrics", args(json!({"callId": call_id})))
        .await
        .expect("get_metrics");
    let ended = mcp
        .run_tool("end_call", args(json!({"callId": call_id})))
        .await
        .expect("end_call");
    assert!(ended.contains("ended"), "{ended}");
    stack
        .telnyx_rest
        .wait_until("REST hang-up", |r| {
            r.hung_up().iter().any(|i| i == &call_id)
        })
        .await;
}

/// Fields an unauthenticated peer controls reach the log cut to 64 characters: a forged
/// webhook with a 5,000-character `CallSid` (the daemon as a child process, its JSON log read
/// line by line).
#[test]
fn forged_webhook_fields_are_truncated_in_the_log() {
    patterd::util::init_tls();
    let nowhere = "http://127.0.0.1:9";
    let text = config_text(&Opts::default(), nowhere, nowhere, nowhere, nowhere, "");
    let d = crate::common::daemon::Daemon::start(&text);
    let long = format!("CA{}", "x".repeat(5000));
    let params = voice_webhook_params(ACCOUNT_SID, &long, CALLER, OUR_NUMBER);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let status = rt.block_on(async {
        patterd_sim::twilio::SimTwilio::new(
            &format!("http://{}", d.addr),
            PUBLIC_URL,
            ACCOUNT_SID,
            AUTH_TOKEN,
        )
        .post_form_with_signature("/twilio/voice", &params, "forged")
        .await
        .expect("webhook")
        .status
    });
    assert_eq!(status, 403);
    let line = d
        .wait_line("twilio webhook refused", WAIT)
        .expect("the refusal is logged");
    assert!(line.contains(&"x".repeat(60)), "{line}");
    assert!(
        !line.contains(&"x".repeat(65)),
        "untruncated: {} bytes",
        line.len()
    );
}
