//! The browser phone's edges without a browser: `/phone` and `/phone/socket` refuse a missing,
//! forged, expired, reused or other agent's phone link and a foreign `Origin`, accept the API
//! token; and a browser call spoken by a plain WebSocket client goes through the same
//! admission, call actor and store as a phone call, with the same turns.

use std::time::Duration;

use patterd::net::ws_client::{ClientSocket, connect};
use patterd::net::ws_pump::{self, WsIn};
use patterd::security::link::{PhoneLinks, unix_now};
use serde_json::{Value, json};

use crate::common::{API_TOKEN, Opts, PUBLIC_URL, Stack, WAIT};

fn link(stack: &Stack, agent: &str, expiry: u64) -> String {
    let links = stack
        .server
        .app
        .phone_links()
        .expect("a stack with an api_token has a link key");
    links.mint(agent, expiry).0
}

fn valid(stack: &Stack) -> String {
    link(stack, "front-desk", unix_now() + 60)
}

/// Opens `/phone/socket?query` with `headers`; the HTTP status of a refusal as `Err`.
async fn open(
    stack: &Stack,
    query: &str,
    headers: &[(&str, &str)],
) -> Result<ClientSocket, String> {
    let url = format!("{}/phone/socket?{query}", stack.ws_base());
    connect(&url, headers, WAIT)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| e.to_string())
}

fn refused_with(r: Result<ClientSocket, String>, status: u16) {
    match r {
        Ok(_) => panic!("the socket opened; expected HTTP {status}"),
        Err(e) => assert!(e.contains(&format!("Invalid status code: {status}")), "{e}"),
    }
}

#[tokio::test]
async fn the_socket_refuses_bad_links_and_foreign_origins() {
    let stack = Stack::start(Opts::default()).await;
    let own = format!("http://{}", stack.server.local_addr);

    refused_with(open(&stack, "", &[]).await, 401);
    let forged = PhoneLinks::from_secret("not-the-api-token")
        .expect("key")
        .mint("front-desk", unix_now() + 60)
        .0;
    refused_with(open(&stack, &format!("link={forged}"), &[]).await, 403);
    let expired = link(&stack, "front-desk", unix_now() - 1);
    refused_with(open(&stack, &format!("link={expired}"), &[]).await, 403);
    refused_with(open(&stack, "link=garbage", &[]).await, 403);

    // A valid link from another site's page is refused, and is not used up by it.
    let good = valid(&stack);
    let q = format!("link={good}");
    refused_with(
        open(&stack, &q, &[("Origin", "https://evil.example.com")]).await,
        403,
    );
    let ws = open(&stack, &q, &[("Origin", &own)]).await.expect("opens");
    // Used once: the second use is refused.
    refused_with(open(&stack, &q, &[("Origin", &own)]).await, 409);
    drop(ws);

    // A link bound to an agent cannot call another one.
    let bound = link(&stack, "front-desk", unix_now() + 60);
    refused_with(
        open(&stack, &format!("link={bound}&agent=other"), &[]).await,
        403,
    );
    // An unknown agent through the API token is a 404 naming the configured ones.
    let bearer = format!("Bearer {API_TOKEN}");
    refused_with(
        open(&stack, "agent=nobody", &[("Authorization", &bearer)]).await,
        404,
    );
    // The API token itself opens a call, also from public_url's own pages.
    let _ws = open(
        &stack,
        "",
        &[("Authorization", &bearer), ("Origin", PUBLIC_URL)],
    )
    .await
    .expect("the API token opens the browser phone");

    // The page: a link or the API token.
    let client = reqwest::Client::new();
    let page = |q: String| client.get(format!("{}/phone{q}", stack.base)).send();
    assert_eq!(page(String::new()).await.expect("GET").status(), 401);
    assert_eq!(
        page(format!("?link={expired}"))
            .await
            .expect("GET")
            .status(),
        403
    );
    let ok = page(format!("?link={}", valid(&stack))).await.expect("GET");
    assert_eq!(ok.status(), 200);
    let csp = ok.headers()["content-security-policy"]
        .to_str()
        .expect("csp")
        .to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let body = ok.text().await.expect("body");
    assert!(
        body.contains(r#"const AGENTS = ["front-desk"]"#),
        "agents listed"
    );
    let with_token = stack
        .api_client()
        .get(format!("{}/phone", stack.base))
        .send()
        .await
        .expect("GET");
    assert_eq!(with_token.status(), 200);
}

/// What a page does, minus the page: speaks `speech` (20 ms frames in real time, a 440 Hz
/// tone, then silence), acknowledges every mark as soon as it arrives (the audio before it
/// counts as played) and collects the call's progress; returns once the agent's reply to the
/// turn has been heard.
async fn speak_one_turn(ws: ClientSocket) -> Vec<Value> {
    let (mut rx, tx, _guard) = ws_pump::split(ws);
    tx.text(&json!({"event": "start"}).to_string())
        .await
        .expect("start");
    let mut progress = Vec::new();
    let mut marks = 0;
    let tone = patterd::audio::g711::ulaw_tone(440.0, 600, 8000);
    let silence = [0xFFu8; 160];
    let mut frames = tokio::time::interval(Duration::from_millis(20));
    let mut sent = 0usize;
    let deadline = tokio::time::Instant::now() + WAIT;
    let heard_reply = |p: &[Value]| {
        p.iter().any(|v| {
            v["type"] == "transcript"
                && v["speaker"] == "agent"
                && v["index"] == 2
                && v["heard"] != ""
        })
    };
    while !heard_reply(&progress) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reply heard: {progress:?}"
        );
        tokio::select! {
            _ = frames.tick() => {
                // The caller speaks once the greeting's mark came back.
                let frame = if marks >= 1 && sent * 160 < tone.len() {
                    sent += 1;
                    &tone[(sent - 1) * 160..sent * 160]
                } else {
                    &silence[..]
                };
                let payload = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, frame);
                let _ = tx.text(&json!({"event": "media", "payload": payload}).to_string()).await;
            }
            m = rx.recv() => match m {
                Some(WsIn::Text(t)) => {
                    let v: Value = serde_json::from_str(&t).expect("JSON frame");
                    match v["event"].as_str() {
                        Some("mark") => {
                            marks += 1;
                            let _ = tx.text(&json!({"event": "mark", "name": v["name"]}).to_string()).await;
                        }
                        Some("progress") => progress.push(v),
                        Some("media") | Some("clear") => {}
                        other => panic!("unexpected frame {other:?}"),
                    }
                }
                other => panic!("socket ended: {other:?}"),
            }
        }
    }
    let _ = tx.text(&json!({"event": "stop"}).to_string()).await;
    progress
}

#[tokio::test]
async fn a_browser_call_has_the_turns_of_a_phone_call() {
    let stack = Stack::start(Opts::default()).await;
    let links = stack.server.app.phone_links().expect("link key");
    let (good, claims) = links.mint("front-desk", unix_now() + 60);
    let ws = open(&stack, &format!("link={good}"), &[])
        .await
        .expect("opens");
    let progress = speak_one_turn(ws).await;
    let kinds: Vec<&str> = progress
        .iter()
        .filter(|v| v["type"] == "event")
        .filter_map(|v| v["kind"].as_str())
        .collect();
    for k in [
        "media_start",
        "turn_end",
        "llm_request",
        "reply_first_frame",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    // The call id is the link's.
    let web_call = claims.call_id;
    let web = stack.finished(&web_call).await;
    assert_eq!(web.carrier, "web");
    assert_eq!(web.agent, "front-desk");

    // The same conversation on the phone.
    let (call_sid, sim) = stack.call_and_one_answered_turn().await;
    sim.hang_up().await;
    let phone = stack.finished(&call_sid).await;
    let turns = |r: &patterd::call::CallRecord| {
        r.transcript
            .iter()
            .map(|e| {
                (
                    e.speaker,
                    e.text.clone(),
                    e.heard_text.clone(),
                    e.interrupted,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(turns(&web), turns(&phone));
    assert_eq!(
        turns(&web).len(),
        3,
        "greeting, caller, reply: {:?}",
        turns(&web)
    );

    // And the store has it as a call with carrier `web`.
    let stored: Value = stack
        .api_client()
        .get(format!("{}/v1/calls/{web_call}", stack.base))
        .send()
        .await
        .expect("GET call")
        .json()
        .await
        .expect("JSON");
    assert_eq!(stored["carrier"], "web", "{stored}");
}

#[tokio::test]
async fn phone_link_prints_a_link_the_daemon_accepts_once() {
    let exe = env!("CARGO_BIN_EXE_patterd");
    let config = format!("{}/config/patter.toml", env!("CARGO_MANIFEST_DIR"));
    let run = |token: &str, extra: &[&str]| {
        std::process::Command::new(exe)
            .args(["phone-link", "--config", &config])
            .args(extra)
            .env_clear()
            .env("PATTERD_API_TOKEN", token)
            .output()
            .expect("run patterd phone-link")
    };
    let out = run(API_TOKEN, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let link = url
        .strip_prefix("http://127.0.0.1:8080/phone?link=")
        .unwrap_or_else(|| panic!("unexpected URL {url}"));
    // A daemon with the same api_token accepts it, once; it is bound to the default agent,
    // resolved when it was minted.
    let stack = Stack::start(Opts::default()).await;
    let claims = stack
        .server
        .app
        .phone_links()
        .expect("link key")
        .verify(Some(link), unix_now())
        .expect("a valid link");
    assert_eq!(claims.agent, "front-desk");
    assert!(
        claims.expiry <= unix_now() + 600,
        "the default ttl is 600 s"
    );
    let q = format!("link={link}");
    let _ws = open(&stack, &q, &[]).await.expect("the printed link opens");
    refused_with(open(&stack, &q, &[]).await, 409);

    // No api_token: no links (the daemon is local-only), and an unknown agent is named.
    let none = run("", &[]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("local-only"));
    let unknown = run(API_TOKEN, &["--agent", "nobody"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no agent named \"nobody\""));
    // At most a day.
    let day = run(API_TOKEN, &["--ttl", "86400"]);
    assert!(
        day.status.success(),
        "{}",
        String::from_utf8_lossy(&day.stderr)
    );
    let long = run(API_TOKEN, &["--ttl", "86401"]);
    assert_eq!(long.status.code(), Some(1));
    let err = String::from_utf8_lossy(&long.stderr);
    assert!(err.contains("--ttl 86401") && err.contains("24 h"), "{err}");
}

/// A link opens only its own agent, and nothing a link opens names the configured agents:
/// the agent list and the 404 that names them need the control API's credentials.
#[tokio::test]
async fn a_link_shows_and_opens_only_its_own_agent() {
    let stack = Stack::start(Opts::default()).await;
    let client = reqwest::Client::new();
    let socket = |q: String, auth: Option<String>| {
        let mut r = client
            .get(format!("{}/phone/socket?{q}", stack.base))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        r.send()
    };
    // A correctly signed link to an agent that is not configured: 404, no agent names.
    let gone = link(&stack, "nobody", unix_now() + 60);
    let r = socket(format!("link={gone}"), None).await.expect("GET");
    assert_eq!(r.status(), 404);
    let body = r.text().await.expect("body");
    assert!(
        !body.contains("front-desk"),
        "a link listed the agents: {body}"
    );
    // The same with the API token names them.
    let r = socket("agent=nobody".into(), Some(format!("Bearer {API_TOKEN}")))
        .await
        .expect("GET");
    assert_eq!(r.status(), 404);
    assert!(r.text().await.expect("body").contains("front-desk"));
    // Another agent through a link is refused, before the link is used up.
    let own = valid(&stack);
    let r = socket(format!("link={own}&agent=other"), None)
        .await
        .expect("GET");
    assert_eq!(r.status(), 403);
    // The page of a link lists its agent only.
    let page = client
        .get(format!("{}/phone?link={gone}", stack.base))
        .send()
        .await
        .expect("GET");
    assert_eq!(page.status(), 200);
    let body = page.text().await.expect("body");
    assert!(body.contains(r#"const AGENTS = ["nobody"]"#), "{body}");
    assert!(
        !body.contains("front-desk"),
        "a link's page listed the agents"
    );
}

#[tokio::test]
async fn patterd_try_runs_one_call_through_the_fakes() {
    let fakes = crate::common::daemon::Fakes::start(Vec::new()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("patter.toml");
    std::fs::write(&config, fakes.config_text()).expect("write config");
    let out = dir.path().join("reply.wav");
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_patterd"))
        .args(["try", "--config"])
        .arg(&config)
        .args(["--say", "Hello, is anyone there?", "--out"])
        .arg(&out)
        .env_clear()
        .env("PATTERD_DATA_DIR", dir.path())
        .output()
        .await
        .expect("run patterd try");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // The fake STT heard the synthesised caller, the fake brain answered.
    assert!(stdout.contains("caller hello there"), "{stdout}");
    assert!(stdout.contains("reply first audio"), "{stdout}");
    assert!(stdout.contains("turn end"), "{stdout}");
    // The WAV holds exactly the agent's audio the fake TTS produced (the first synthesis is
    // the caller's own text), as 16-bit PCM.
    let tts = fakes.el.record();
    assert_eq!(tts.requests[0].text, "Hello, is anyone there?");
    // The pacer sends whole 20 ms frames, the last one of each utterance padded with silence.
    let agent_bytes: usize = tts.requests[1..]
        .iter()
        .map(|r| r.bytes_sent.div_ceil(160) * 160)
        .sum();
    let wav = std::fs::read(&out).expect("the WAV was written");
    let samples = patterd::audio::wav::read_ulaw_8k(&wav)
        .expect("8 kHz WAV")
        .len();
    assert_eq!(samples, agent_bytes, "WAV samples vs the TTS's audio");
}

/// The call list page's links open the timelines of a web call (`web-…`) and a Telnyx call
/// (`v3:…`): each link, resolved against the list's URL, answers 200 with that call's page.
#[tokio::test]
async fn the_call_list_links_open_web_and_telnyx_timelines() {
    let stack = Stack::start(Opts::default()).await;
    let bearer = format!("Bearer {API_TOKEN}");
    let _web = open(&stack, "", &[("Authorization", &bearer)])
        .await
        .expect("a browser call");
    let telnyx_id = "v3:list-link_call-0001";
    let body = stack.telnyx.initiated(
        telnyx_id,
        crate::common::CALLER,
        crate::common::TELNYX_NUMBER,
    );
    assert_eq!(stack.telnyx.post(&body).await.expect("post").status, 200);
    tokio::time::timeout(WAIT, async {
        while stack.server.app.calls.len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("both calls live");
    let api = stack.api_client();
    let list = format!("{}/v1/calls", stack.base);
    let page = api
        .get(&list)
        .header("Accept", "text/html")
        .send()
        .await
        .expect("the list");
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    let hrefs: Vec<String> = html
        .split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|h| h.ends_with("/timeline"))
        .map(str::to_string)
        .collect();
    let base = url::Url::parse(&list).expect("url");
    let mut opened = Vec::new();
    for href in &hrefs {
        let url = base.join(href).expect("a relative link");
        let r = api.get(url.clone()).send().await.expect("the timeline");
        assert_eq!(r.status(), 200, "{url}");
        let text = r.text().await.expect("html");
        opened.push((href.clone(), text));
    }
    let web = opened
        .iter()
        .find(|(h, _)| h.starts_with("calls/web-"))
        .unwrap_or_else(|| panic!("no web call link in {hrefs:?}"));
    let web_id = web
        .0
        .trim_start_matches("calls/")
        .trim_end_matches("/timeline");
    assert!(web.1.contains(web_id), "the web call's own page");
    let telnyx = opened
        .iter()
        .find(|(h, _)| h == &format!("calls/{telnyx_id}/timeline"))
        .unwrap_or_else(|| panic!("no Telnyx call link in {hrefs:?}"));
    assert!(telnyx.1.contains(telnyx_id), "the Telnyx call's own page");
}
