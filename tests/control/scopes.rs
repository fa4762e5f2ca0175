//! Issue 31 item 8 and the authentication parts of item 9, against the daemon on 127.0.0.1:
//! the scopes of API tokens (a call's own token, handed to its brain, reaches that call only;
//! a `read` token never acts; a reload rotates `[[server.api_tokens]]`), failed
//! authentications limited per peer, and token-less mode's `/metrics` `Host` check and phone
//! socket `Origin` check.

use std::time::Duration;

use patterd_sim::hermes::HermesReply;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::api::Api;
use crate::common::*;

/// The `read` token of [`READ_ENTRY`].
const READ_TOKEN: &str = "dashboard-read-token-0123456789abcdef";
const READ_ENTRY: &str = "\n[[server.api_tokens]]\nname = \"dashboard\"\nscope = \"read\"\n\
                          token = \"dashboard-read-token-0123456789abcdef\"\n";

/// A stack whose `[[server.api_tokens]]` has the `read` entry.
async fn stack_with_read_token() -> Stack {
    Stack::start(Opts {
        extra_config: READ_ENTRY.into(),
        ..Opts::default()
    })
    .await
}

/// One MCP session over `/mcp` with `token`: JSON-RPC requests, answers read from JSON or
/// from the SSE stream rmcp answers with.
struct McpSession {
    client: reqwest::Client,
    url: String,
    token: String,
    session: Option<String>,
    next_id: u64,
}

impl McpSession {
    async fn open(stack: &Stack, token: &str) -> Self {
        let mut s = Self {
            client: reqwest::Client::new(),
            url: format!("{}/mcp", stack.base),
            token: token.to_string(),
            session: None,
            next_id: 1,
        };
        let init = s
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "scopes-test", "version": "1"}
                }),
            )
            .await;
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        s.notify("notifications/initialized").await;
        s
    }

    fn post(&self, body: Value) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(id) = &self.session {
            r = r.header("Mcp-Session-Id", id);
        }
        r
    }

    async fn notify(&self, method: &str) {
        let r = self
            .post(json!({"jsonrpc": "2.0", "method": method}))
            .send()
            .await
            .expect("notify");
        assert!(r.status().is_success(), "{}", r.status());
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let r = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .send()
            .await
            .expect("MCP request");
        assert_eq!(r.status(), 200, "{method}");
        if let Some(s) = r.headers().get("mcp-session-id") {
            self.session = Some(s.to_str().expect("session id").to_string());
        }
        let text = r.text().await.expect("body");
        let json_text = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| d.starts_with('{'))
            .unwrap_or(&text);
        serde_json::from_str(json_text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    async fn tool_names(&mut self) -> Vec<String> {
        let v = self.request("tools/list", json!({})).await;
        v["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect()
    }

    /// A tool's text and whether it is an error.
    async fn call(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let v = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        let r = &v["result"];
        (
            r["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            r["isError"] == json!(true),
        )
    }
}

/// The mode "Hermes is the voice and holds patterd's MCP": each call's brain requests carry
/// that call's token, and with it a prompt-injected brain reaches its own call only — not
/// another caller's call, not the call list, not outbound calls or inbound settings — over
/// REST and MCP alike; the token dies with its call.
#[tokio::test]
async fn a_call_token_reaches_its_own_call_only() {
    let stack = Stack::start(Opts {
        transcripts: vec!["hello there".into()],
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Hi, how can I help?"));
    let (own, own_sim) = stack.call_and_one_answered_turn().await;
    let (other, other_sim) = stack.call().await;
    other_sim
        .wait_for("the other call's greeting", WAIT, |s| {
            !s.marks_echoed.is_empty()
        })
        .await
        .expect("greeting");
    let record = stack.hermes.record();
    let token = record
        .requests
        .iter()
        .find_map(|r| r.header("x-patterd-call-token"))
        .expect("the brain request carries X-Patterd-Call-Token")
        .to_string();
    assert!(token.starts_with("pdc1."), "{token}");

    let api = Api::new(&stack, Some(&token));
    // Its own call: read and act.
    let (s, v) = api.get(&format!("/v1/calls/{own}/transcript")).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = api
        .post(
            &format!("/v1/calls/{own}/say"),
            json!({"text": "One moment."}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    // Another caller's call: 403 with a message naming both calls.
    for (method, path, body) in [
        (
            Method::POST,
            format!("/v1/calls/{other}/say"),
            Some(json!({"text": "Hi"})),
        ),
        (
            Method::POST,
            format!("/v1/calls/{other}/dtmf"),
            Some(json!({"digits": "1"})),
        ),
        (
            Method::POST,
            format!("/v1/calls/{other}/hangup"),
            Some(json!({})),
        ),
        (Method::GET, format!("/v1/calls/{other}/transcript"), None),
        (Method::GET, format!("/v1/calls/{other}/events"), None),
    ] {
        let (s, v) = api.send(method, &path, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("forbidden_scope")),
            "{path}"
        );
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(m.contains(&own) && m.contains(&other), "{m}");
    }
    // Nothing across calls or about the daemon.
    for (method, path, body) in [
        (Method::GET, "/v1/calls".to_string(), None),
        (Method::GET, "/v1/metrics".to_string(), None),
        (
            Method::POST,
            "/v1/calls".to_string(),
            Some(json!({"to": "+15557654321"})),
        ),
        (
            Method::PUT,
            "/v1/inbound".to_string(),
            Some(json!({"enabled": false})),
        ),
    ] {
        let (s, v) = api.send(method, &path, body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("forbidden_scope")),
            "{path}"
        );
    }
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", stack.base))
        .bearer_auth(&token)
        .send()
        .await
        .expect("GET");
    assert_eq!(metrics.status(), 403);

    // MCP with the same token: only the tools of one call are offered, and they reach its
    // call only (callId defaults to it).
    let mut mcp = McpSession::open(&stack, &token).await;
    let names = mcp.tool_names().await;
    assert_eq!(
        names.join(","),
        "get_transcript,end_call,transfer_call,send_dtmf,say,get_metrics"
    );
    let (text, err) = mcp
        .call("say", json!({"callId": other, "text": "Hi"}))
        .await;
    assert!(err && text.contains("belongs to call"), "{text}");
    let (text, err) = mcp.call("end_call", json!({"callId": other})).await;
    assert!(err && text.contains("belongs to call"), "{text}");
    let (text, err) = mcp.call("get_calls", json!({})).await;
    assert!(err && text.contains("reaches only its own call"), "{text}");
    let (text, err) = mcp
        .call(
            "make_call",
            json!({"to": "+15557654321", "systemPrompt": "x"}),
        )
        .await;
    assert!(err && text.contains("reaches only its own call"), "{text}");
    let (text, err) = mcp.call("get_transcript", json!({})).await;
    assert!(!err && text.contains(&own), "{text}");
    assert!(
        stack.server.app.calls.get(&other).is_some(),
        "the other call lives on"
    );

    // Its call ends: the token is refused (401), the other call is untouched.
    let (s, _) = api
        .post(&format!("/v1/calls/{own}/hangup"), json!({}))
        .await;
    assert_eq!(s, 200);
    drop(own_sim);
    let (s, v) = api.get(&format!("/v1/calls/{own}/transcript")).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{v}"
    );
    assert!(stack.server.app.calls.get(&other).is_some());
}

/// A `read` token reads everything and acts on nothing, over REST, `/metrics` and MCP.
#[tokio::test]
async fn a_read_token_reads_but_never_acts() {
    let stack = stack_with_read_token().await;
    let (id, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    let api = Api::new(&stack, Some(READ_TOKEN));
    for path in [
        "/v1/calls".to_string(),
        format!("/v1/calls/{id}"),
        format!("/v1/calls/{id}/transcript"),
        format!("/v1/calls/{id}/events"),
        "/v1/metrics".to_string(),
        "/v1/inbound".to_string(),
    ] {
        let (s, v) = api.get(&path).await;
        assert_eq!(s, 200, "{path}: {v}");
    }
    let metrics = api_client(READ_TOKEN)
        .get(format!("{}/metrics", stack.base))
        .send()
        .await
        .expect("GET");
    assert_eq!(metrics.status(), 200);
    for (method, path, body) in [
        (
            Method::POST,
            format!("/v1/calls/{id}/say"),
            json!({"text": "Hi"}),
        ),
        (Method::POST, format!("/v1/calls/{id}/hangup"), json!({})),
        (
            Method::POST,
            "/v1/calls".to_string(),
            json!({"to": "+15557654321"}),
        ),
        (
            Method::PUT,
            "/v1/inbound".to_string(),
            json!({"enabled": false}),
        ),
    ] {
        let (s, v) = api.send(method, &path, Some(body)).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("forbidden_scope")),
            "{path}"
        );
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("`dashboard`") && m.contains("scope `read`"),
            "{m}"
        );
    }
    let mut mcp = McpSession::open(&stack, READ_TOKEN).await;
    assert_eq!(
        mcp.tool_names().await.join(","),
        "get_calls,get_transcript,get_metrics"
    );
    let (text, err) = mcp.call("end_call", json!({"callId": id})).await;
    assert!(err && text.contains("scope `read`"), "{text}");
    assert!(
        stack.server.app.calls.get(&id).is_some(),
        "the call lives on"
    );
    // Opening a browser call without a link is an operator's.
    let bearer = format!("Bearer {READ_TOKEN}");
    let e = patterd::net::ws_client::connect(
        &format!("{}/phone/socket", stack.ws_base()),
        &[("Authorization", &bearer)],
        WAIT,
    )
    .await
    .map(|_| ())
    .expect_err("a read token opens no browser call");
    assert!(e.to_string().contains("Invalid status code: 401"), "{e}");
    // The operator token still does everything.
    let (s, _) = Api::authed(&stack)
        .post(&format!("/v1/calls/{id}/hangup"), json!({}))
        .await;
    assert_eq!(s, 200);
}

/// A reload applies `[[server.api_tokens]]`: a removed token is refused at once, an added one
/// works, and nothing is reported as needing a restart.
#[tokio::test]
async fn a_reload_rotates_the_scoped_tokens() {
    let stack = stack_with_read_token().await;
    let app = stack.server.app.clone();
    let st = &stack;
    let status = |t: &'static str| async move { Api::new(st, Some(t)).get("/v1/calls").await.0 };
    assert_eq!(status(READ_TOKEN).await, 200);
    const ROTATED: &str = "dashboard-rotated-token-0123456789ab";
    let mut next = (*app.config()).clone();
    next.server.api_tokens[0].token = patterd::config::schema::Secret::new(ROTATED);
    let done = app.reload(next).expect("reload");
    assert!(done.tokens_changed && !done.token_rotated);
    assert!(done.needs_restart.is_empty(), "{:?}", done.needs_restart);
    assert_eq!(status(READ_TOKEN).await, 401);
    assert_eq!(status(ROTATED).await, 200);
    assert_eq!(status(API_TOKEN).await, 200);
}

/// Past 20 failed authentications in a minute a peer gets 429 with `Retry-After` — even with
/// the right token — while another peer's right token still works. Behind a proxy on this
/// machine the peer is the proxy's `X-Forwarded-For` client.
#[tokio::test]
async fn failed_authentications_are_limited_per_peer() {
    let stack = Stack::start(Opts::default()).await;
    let c = reqwest::Client::new();
    let from = |xff: &'static str, token: &'static str| {
        c.get(format!("{}/v1/calls", stack.base))
            .header("X-Forwarded-For", xff)
            .bearer_auth(token)
            .send()
    };
    for i in 0..20 {
        let r = from("203.0.113.9", "wrong-token").await.expect("GET");
        assert_eq!(r.status(), 401, "failure {i}");
    }
    let r = from("203.0.113.9", "wrong-token").await.expect("GET");
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("header")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&wait), "{wait}");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "too_many_failures");
    // The right token from the blocked peer is not even checked...
    let r = from("203.0.113.9", API_TOKEN).await.expect("GET");
    assert_eq!(r.status(), 429);
    // ...nor exchanged for a page cookie...
    let r = c
        .get(format!("{}/v1/calls?token={API_TOKEN}", stack.base))
        .header("Accept", "text/html")
        .header("X-Forwarded-For", "203.0.113.9")
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 429);
    // ...and /mcp is behind the same limit.
    let r = c
        .post(format!("{}/mcp", stack.base))
        .header("X-Forwarded-For", "203.0.113.9")
        .bearer_auth(API_TOKEN)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 429);
    // Other peers are not locked out.
    let r = from("198.51.100.7", API_TOKEN).await.expect("GET");
    assert_eq!(r.status(), 200);
    let (s, _) = Api::authed(&stack).get("/v1/calls").await;
    assert_eq!(s, 200);
}

/// A token-less daemon (both loopback), with no carriers.
async fn tokenless(extra: &str) -> (tempfile::TempDir, patterd::server::Running, String) {
    patterd::util::init_tls();
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\npublic_url = \"http://127.0.0.1:8080\"\n\
         data_dir = {:?}\n{extra}",
        dir.path().display().to_string()
    );
    let loaded = patterd::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
    let running = patterd::server::bind(loaded.config).await.expect("bind");
    let base = format!("http://{}", running.local_addr);
    (dir, running, base)
}

/// Token-less mode: `/metrics` takes the `Host` check `/v1` takes (a DNS-rebinding page
/// addresses us by its own name), and the local peer check unless `metrics_public`.
#[tokio::test]
async fn tokenless_metrics_check_the_host() {
    for public in ["", "metrics_public = true\n"] {
        let (_dir, _d, base) = tokenless(public).await;
        let c = reqwest::Client::new();
        let r = c.get(format!("{base}/metrics")).send().await.expect("GET");
        assert_eq!(r.status(), 200, "{public}");
        let r = c
            .get(format!("{base}/metrics"))
            .header("Host", "rebound.evil.example:8080")
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status(), 403, "{public}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["code"], "forbidden_host");
        let r = c
            .get(format!("{base}/metrics"))
            .header("X-Forwarded-For", "203.0.113.9")
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status(), if public.is_empty() { 403 } else { 200 });
    }
}

/// Token-less mode: the phone socket (ambient access for any local peer) takes only
/// `public_url`'s own origin, as `/v1` does; another local web server's page is refused.
#[tokio::test]
async fn tokenless_phone_socket_needs_our_own_origin() {
    let (_dir, d, _base) = tokenless("").await;
    let url = format!("ws://{}/phone/socket", d.local_addr);
    let open = |origin: &'static str| {
        let url = url.clone();
        async move {
            patterd::net::ws_client::connect(&url, &[("Origin", origin)], Duration::from_secs(5))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    for foreign in [
        "http://localhost:3000",
        "http://127.0.0.1:5173",
        "http://[::1]:8080",
    ] {
        let e = open(foreign).await.expect_err(foreign);
        assert!(e.contains("Invalid status code: 403"), "{foreign}: {e}");
    }
    // Our own origin passes the check (and meets the next one: no agent is configured).
    let e = open("http://127.0.0.1:8080").await.expect_err("no agent");
    assert!(e.contains("Invalid status code: 404"), "{e}");
}

/// `patterd mcp --stdio --token` warns that the token shows in `ps`; the environment does
/// not.
#[tokio::test]
async fn mcp_stdio_warns_about_a_token_on_the_command_line() {
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_patterd"));
        cmd.args(["mcp", "--stdio", "--url", "http://127.0.0.1:9"])
            .args(args)
            .env_remove("PATTERD_API_TOKEN")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(t) = env {
            cmd.env("PATTERD_API_TOKEN", t);
        }
        let out = cmd.output().expect("patterd runs");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let flag = run(&["--token", "visible-token-0123456789abcdef0123"], None);
    assert!(
        flag.contains("--token is visible") && flag.contains("PATTERD_API_TOKEN"),
        "{flag}"
    );
    assert!(
        !flag.contains("visible-token-0123"),
        "the warning never shows the token: {flag}"
    );
    let env = run(&[], Some("env-token-0123456789abcdef0123456"));
    assert!(!env.contains("--token is visible"), "{env}");
}
