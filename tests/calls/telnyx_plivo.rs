//! Telnyx and Plivo checks that are not carrier-matrix scenarios: routes of an unconfigured
//! carrier answer 503, and a Telnyx webhook replayed inside its signature window is handled once.

use crate::common::*;

#[tokio::test]
async fn unconfigured_telnyx_and_plivo_answer_503() {
    let text = config_text(
        &Opts::default(),
        "ws://127.0.0.1:9",
        "http://127.0.0.1:9",
        "http://127.0.0.1:9/v1",
        "http://127.0.0.1:9",
        "",
    );
    let loaded = patterd::config::load_str_with_vars(&text, "test.toml", &[]).expect("loads");
    let server = patterd::server::bind(loaded.config).await.expect("binds");
    let base = format!("http://{}", server.local_addr);
    let client = reqwest::Client::new();
    for (method, path) in [
        ("POST", "/telnyx/webhook"),
        ("GET", "/telnyx/media/abc"),
        ("POST", "/plivo/answer"),
        ("POST", "/plivo/hangup"),
        ("GET", "/plivo/media/abc?t=x"),
    ] {
        let req = match method {
            "POST" => client.post(format!("{base}{path}")).body("{}"),
            _ => client.get(format!("{base}{path}")),
        };
        let r = req.send().await.expect("request");
        assert_eq!(r.status().as_u16(), 503, "{method} {path}");
    }
}

#[tokio::test]
async fn a_replayed_telnyx_webhook_is_handled_once() {
    let stack = Stack::start(Opts::default()).await;
    let body = stack
        .telnyx
        .initiated("v3:replayed-call", CALLER, TELNYX_NUMBER);
    for _ in 0..3 {
        let r = stack.telnyx.post(&body).await.expect("post");
        assert_eq!(r.status, 200);
    }
    // Admission (and so whether an answer is sent) is decided before each webhook is
    // answered: after three 200s, one call was accepted and only it spawned an answer.
    let accepted = stack.metric(|m| &m.calls_accepted);
    assert_eq!(accepted, 1);
    assert_eq!(stack.server.app.calls.len(), 1);
    stack
        .telnyx_rest
        .wait_until("answer", |r| !r.ok("answer").is_empty())
        .await;
    assert_eq!(stack.telnyx_rest.record().commands.len(), 1);
}
