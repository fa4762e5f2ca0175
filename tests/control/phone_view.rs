//! What the browser phone's socket shows (issue 31 item 3): a caller with a phone link gets
//! the transcript, the agent's state and the turn latencies, never a tool's arguments or
//! result (a webhook tool's raw JSON holds back-office data) nor provider errors; a page
//! opened with the API token gets the whole timeline.

use std::time::Duration;

use patterd::net::ws_client::{ClientSocket, connect};
use patterd::net::ws_pump::{self, WsIn};
use patterd::security::link::unix_now;
use patterd_sim::hermes::HermesReply;
use patterd_sim::tool_endpoint::{FakeToolEndpoint, ToolReply};
use serde_json::{Value, json};

use crate::common::*;

/// In the webhook tool's answer: back-office data the caller must never see.
const SECRET: &str = "BACK-OFFICE-SECRET-7731";
/// In the model's tool call arguments.
const ARGUMENT: &str = "ORDER-ARGUMENT-4242";
const REPLY: &str = "Your order ships tomorrow.";

const SCHEMA: &str = r#"{ type = "object", properties = { order = { type = "string" } }, required = ["order"], additionalProperties = false }"#;

/// The model calls the tool, then answers.
fn script(stack: &Stack) {
    stack.hermes.push(HermesReply::tool_call(
        "call_1",
        "lookup_order",
        &json!({ "order": ARGUMENT }).to_string(),
    ));
    stack.hermes.push(HermesReply::text(REPLY));
}

/// What a page does, minus the page: speaks a tone once the greeting's mark came back (20 ms
/// frames in real time, then silence), acknowledges every mark at once and collects the
/// call's progress until the agent's transcript entry `REPLY` has been heard.
async fn speak_until_the_reply(ws: ClientSocket) -> Vec<Value> {
    let (mut rx, tx, _guard) = ws_pump::split(ws);
    tx.text(&json!({"event": "start"}).to_string())
        .await
        .expect("start");
    let mut progress: Vec<Value> = Vec::new();
    let mut marks = 0;
    let tone = patterd::audio::g711::ulaw_tone(440.0, 600, 8000);
    let silence = [0xFFu8; 160];
    let mut frames = tokio::time::interval(Duration::from_millis(20));
    let mut sent = 0usize;
    let deadline = tokio::time::Instant::now() + WAIT;
    let heard = |p: &[Value]| {
        p.iter()
            .any(|v| v["type"] == "transcript" && v["speaker"] == "agent" && v["heard"] == REPLY)
    };
    while !heard(&progress) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reply was not heard: {progress:?}"
        );
        tokio::select! {
            _ = frames.tick() => {
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
                        _ => {}
                    }
                }
                other => panic!("socket ended: {other:?}"),
            }
        }
    }
    let _ = tx.text(&json!({"event": "stop"}).to_string()).await;
    progress
}

fn kinds(progress: &[Value]) -> Vec<String> {
    progress
        .iter()
        .filter(|v| v["type"] == "event")
        .filter_map(|v| v["kind"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_caller_sees_the_transcript_not_the_tools_and_the_operator_sees_all() {
    let hook = FakeToolEndpoint::start(ToolReply::json(
        json!({"status": "shipped", "internal_note": SECRET}),
    ))
    .await
    .unwrap();
    let stack = Stack::start(Opts {
        llm: "compat".into(),
        agent_extra: format!(
            "[[agents.front-desk.webhook_tools]]\nname = \"lookup_order\"\n\
             description = \"Looks an order up.\"\nparameters = {SCHEMA}\nurl = \"{}\"\n\
             allow_loopback = true\ntimeout_s = 5\n",
            hook.url()
        ),
        ..Opts::default()
    })
    .await;

    // A caller with a phone link.
    script(&stack);
    let links = stack.server.app.phone_links().expect("link key");
    let (link, _) = links.mint("front-desk", unix_now() + 60);
    let url = format!("{}/phone/socket?link={link}", stack.ws_base());
    let (ws, _) = connect(&url, &[], WAIT).await.expect("opens");
    let progress = speak_until_the_reply(ws).await;
    assert_eq!(hook.record().requests.len(), 1, "the tool ran");
    let seen: String = progress.iter().map(Value::to_string).collect();
    assert!(
        !seen.contains(SECRET),
        "the tool's result reached the caller: {seen}"
    );
    assert!(
        !seen.contains(ARGUMENT),
        "the tool's arguments reached the caller: {seen}"
    );
    let caller_kinds = kinds(&progress);
    for hidden in ["tool_call", "tool_result", "tool_progress", "heard"] {
        assert!(
            !caller_kinds.iter().any(|k| k == hidden),
            "{hidden} in {caller_kinds:?}"
        );
    }
    for shown in ["turn_end", "llm_request", "llm_done", "first_frame_of_turn"] {
        assert!(
            caller_kinds.iter().any(|k| k == shown),
            "{shown} missing: {caller_kinds:?}"
        );
    }
    assert!(
        progress
            .iter()
            .any(|v| v["type"] == "transcript" && v["speaker"] == "agent" && v["text"] == REPLY),
        "the transcript reaches the caller: {progress:?}"
    );
    // A state change carries no detail; a latency is a number.
    for v in progress.iter().filter(|v| v["type"] == "event") {
        let detail = v["detail"].as_str().unwrap_or("");
        assert!(
            detail.is_empty() || detail.bytes().all(|b| b.is_ascii_digit()),
            "{v}"
        );
    }

    // The operator, with the API token: the whole timeline.
    script(&stack);
    let url = format!("{}/phone/socket", stack.ws_base());
    let bearer = format!("Bearer {API_TOKEN}");
    let (ws, _) = connect(&url, &[("Authorization", bearer.as_str())], WAIT)
        .await
        .expect("opens with the token");
    let progress = speak_until_the_reply(ws).await;
    let seen: String = progress.iter().map(Value::to_string).collect();
    let full_kinds = kinds(&progress);
    for shown in ["tool_call", "tool_result", "turn_end"] {
        assert!(
            full_kinds.iter().any(|k| k == shown),
            "{shown} missing: {full_kinds:?}"
        );
    }
    assert!(seen.contains(SECRET) && seen.contains(ARGUMENT), "{seen}");
}
