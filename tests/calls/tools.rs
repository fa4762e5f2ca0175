//! Tools during a live Twilio call (docs/agents.md), the brain being the fake Hermes
//! as an `openai_compatible` server that streams `delta.tool_calls` as OpenAI does
//! shows: the consult round trip (by URL and by `llm = "hermes"`) with its reassurance, the
//! consult timing out or failing (the fallback line, and the model told), a webhook tool with
//! argument validation, retries and the circuit breaker opening, and the rounds capped at
//! `max_tool_rounds`. The time from the model's tool call to the first audio frame of the
//! reply after the consult is printed (`--nocapture`) for docs/BENCHMARKS.md.

use serde_json::{Value, json};

use crate::common::*;
use patterd::call::{CallRecord, EventKind};
use patterd::tools::consult::FALLBACK_LINE;
use patterd_sim::hermes::HermesReply;
use patterd_sim::tool_endpoint::{FakeToolEndpoint, ToolReply};

const REASSURANCE: &str = "Let me ask the office, one moment.";
const ANSWER: &str = "Good news, order 42 ships tomorrow.";

fn consult_by_url(url: &str, timeout_s: u64) -> String {
    format!(
        "[agents.front-desk.consult]\nurl = \"{url}\"\nallow_loopback = true\ntimeout_s = {timeout_s}\n\
         reassurance = \"{REASSURANCE}\"\nheaders = {{ Authorization = \"Bearer back-office\" }}\n"
    )
}

async fn stack(agent_extra: String) -> Stack {
    Stack::start(Opts {
        llm: "compat".into(),
        agent_extra,
        ..Opts::default()
    })
    .await
}

/// Starts a call, waits for the greeting, speaks one turn; returns after `marks` marks.
async fn one_turn(stack: &Stack, marks: usize) -> (String, patterd_sim::twilio::call::SimCall) {
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("the turn's speech", WAIT, |s| s.marks_echoed.len() >= marks)
        .await
        .unwrap();
    (call_sid, sim)
}

async fn end(stack: &Stack, call_sid: &str, sim: patterd_sim::twilio::call::SimCall) -> CallRecord {
    sim.hang_up().await;
    stack.finished(call_sid).await
}

fn detail(rec: &CallRecord, kind: EventKind) -> Vec<Value> {
    rec.events_of(kind)
        .map(|e| serde_json::from_str(&e.detail).unwrap_or(Value::Null))
        .collect()
}

/// The follow-up request carries the assistant message with its `tool_calls` and the tool's
/// answer as a `role: tool` message.
fn assert_follow_up(req: &patterd_sim::hermes::HermesRequest, id: &str, content: &str) {
    let messages = req.body["messages"].as_array().expect("messages");
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], id);
    assert_eq!(assistant["tool_calls"][0]["type"], "function");
    assert_eq!(
        req.tool_messages(),
        vec![(id.to_string(), content.to_string())]
    );
}

#[tokio::test]
async fn consult_by_url_round_trip_mid_call() {
    let office = FakeToolEndpoint::start(ToolReply::json(
        json!({"message": "not this", "answer": "Order 42 ships tomorrow."}),
    ))
    .await
    .unwrap();
    let stack = stack(consult_by_url(&office.url(), 30)).await;
    stack.hermes.push(HermesReply::tool_call(
        "call_c1",
        "consult_agent",
        r#"{"request":"When does order 42 ship?"}"#,
    ));
    stack.hermes.push(HermesReply::text(ANSWER));
    let (call_sid, sim) = one_turn(&stack, 3).await;
    assert_eq!(stack.spoken(), vec![GREETING, REASSURANCE, ANSWER]);

    let asked = office.record().requests;
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].body,
        json!({"request": "When does order 42 ship?", "call_id": call_sid, "caller": CALLER, "callee": OUR_NUMBER})
    );
    assert_eq!(asked[0].header("authorization"), Some("Bearer back-office"));

    let reqs = stack.hermes.record().requests;
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].tool_names(), vec!["consult_agent"]);
    assert_follow_up(&reqs[1], "call_c1", "Order 42 ships tomorrow.");

    let rec = end(&stack, &call_sid, sim).await;
    let calls = detail(&rec, EventKind::ToolCall);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["name"], "consult_agent");
    assert_eq!(calls[0]["turn"], 1);
    let results = detail(&rec, EventKind::ToolResult);
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[0]["content"], "Order 42 ships tomorrow.");
    let us: Vec<u64> = rec
        .events_of(EventKind::ToolReplyFirstFrame)
        .map(|e| e.detail.parse().unwrap())
        .collect();
    assert_eq!(us.len(), 1, "{:?}", rec.events);
    println!(
        "BENCH tool call -> consult reply first audio frame (zero-latency fakes): {} us",
        us[0]
    );
}

#[tokio::test]
async fn consult_through_the_hermes_llm_entry_uses_a_per_call_consult_session() {
    let stack = stack(format!(
        "[agents.front-desk.consult]\nllm = \"hermes\"\nreassurance = \"{REASSURANCE}\"\n"
    ))
    .await;
    stack.hermes.push(HermesReply::tool_call(
        "call_h1",
        "consult_agent",
        r#"{"request":"When does order 42 ship?"}"#,
    ));
    stack
        .hermes
        .push(HermesReply::text("Order 42 ships tomorrow."));
    stack.hermes.push(HermesReply::text(ANSWER));
    let (call_sid, sim) = one_turn(&stack, 3).await;
    assert_eq!(stack.spoken(), vec![GREETING, REASSURANCE, ANSWER]);
    let reqs = stack.hermes.record().requests;
    assert_eq!(reqs.len(), 3);
    // The consult: Hermes headers, a consult session of its own for this call, no tools.
    assert_eq!(
        reqs[1].header("x-hermes-session-id"),
        Some(format!("patter-call-consult-{call_sid}").as_str())
    );
    assert!(reqs[1].header("x-hermes-session-key").is_some());
    assert!(reqs[1].tool_names().is_empty());
    let last = reqs[1].messages().pop().unwrap();
    assert_eq!(last.0, "user");
    assert!(last.1.contains("When does order 42 ship?"), "{last:?}");
    assert!(last.1.contains(&call_sid), "{last:?}");
    // The voice brain is stateless: no Hermes headers, and it gets the consult's answer.
    assert!(reqs[0].header("x-hermes-session-id").is_none());
    assert_follow_up(&reqs[2], "call_h1", "Order 42 ships tomorrow.");
    end(&stack, &call_sid, sim).await;
}

/// The consult endpoint answers `reply` late or badly: the caller hears the reassurance, then
/// the fallback line, and the model is told the consult failed (and answers).
async fn consult_fails(reply: ToolReply, timeout_s: u64, why: &str) {
    let office = FakeToolEndpoint::start(reply).await.unwrap();
    let stack = stack(consult_by_url(&office.url(), timeout_s)).await;
    stack.hermes.push(HermesReply::tool_call(
        "call_f1",
        "consult_agent",
        r#"{"request":"When does order 42 ship?"}"#,
    ));
    stack
        .hermes
        .push(HermesReply::text("Can I help with anything else?"));
    let (call_sid, sim) = one_turn(&stack, 4).await;
    assert_eq!(
        stack.spoken(),
        vec![
            GREETING,
            REASSURANCE,
            FALLBACK_LINE,
            "Can I help with anything else?"
        ]
    );
    let reqs = stack.hermes.record().requests;
    let told = &reqs[1].tool_messages()[0].1;
    assert!(told.starts_with("The consult failed"), "{told}");
    assert!(told.contains(why), "{told}");
    let rec = end(&stack, &call_sid, sim).await;
    assert_eq!(detail(&rec, EventKind::ToolResult)[0]["ok"], false);
}

#[tokio::test]
async fn consult_timeout_speaks_the_fallback_and_tells_the_model() {
    consult_fails(
        ToolReply::json(json!({"reply": "too late"})).delayed(std::time::Duration::from_secs(5)),
        1,
        "timed out",
    )
    .await;
}

#[tokio::test]
async fn consult_500_speaks_the_fallback_and_tells_the_model() {
    consult_fails(ToolReply::status(500), 30, "HTTP 500").await;
}

const LOOKUP_SCHEMA: &str = r#"{ type = "object", properties = { order = { type = "string" } }, required = ["order"], additionalProperties = false }"#;

fn webhook_tool(url: &str, retries: u32, breaker: u32) -> String {
    format!(
        "[[agents.front-desk.webhook_tools]]\nname = \"lookup_order\"\ndescription = \"Looks an order up.\"\n\
         parameters = {LOOKUP_SCHEMA}\nurl = \"{url}\"\nallow_loopback = true\ntimeout_s = 5\n\
         retries = {retries}\nbreaker_failures = {breaker}\nbreaker_reset_s = 600\n"
    )
}

#[tokio::test]
async fn webhook_tool_validates_arguments_retries_and_opens_its_breaker() {
    let hook = FakeToolEndpoint::start(ToolReply::status(503))
        .await
        .unwrap();
    let stack = stack(webhook_tool(&hook.url(), 1, 2)).await;
    let call = |id: &str, args: &str| HermesReply::tool_call(id, "lookup_order", args);
    // Round 1: arguments that break the schema (never sent); rounds 2 and 3: two attempts each,
    // failing; round 4: the breaker is open (never sent); then the model answers.
    stack.hermes.push(call("call_1", r#"{"order": 42}"#));
    stack.hermes.push(call("call_2", r#"{"order": "42"}"#));
    stack.hermes.push(call("call_3", r#"{"order": "42"}"#));
    stack.hermes.push(call("call_4", r#"{"order": "42"}"#));
    stack
        .hermes
        .push(HermesReply::text("The order system is down."));
    // The filler covers the first tool call (webhook tools have no reassurance of their own).
    let (call_sid, sim) = one_turn(&stack, 3).await;
    let reqs = stack
        .hermes
        .wait_until("five requests", |r| r.requests.len() == 5)
        .await
        .requests;
    let told: Vec<String> = reqs[4].tool_messages().into_iter().map(|m| m.1).collect();
    assert_eq!(told.len(), 4, "{told:?}");
    assert!(
        told[0].contains("do not match the tool's parameters"),
        "{told:?}"
    );
    assert!(told[1].contains("HTTP 503"), "{told:?}");
    assert!(told[3].contains("unavailable"), "{told:?}");
    let sent = hook.record().requests;
    let attempts: Vec<u64> = sent
        .iter()
        .map(|r| r.body["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, vec![1, 2, 1, 2]);
    assert_eq!(
        sent[0].body,
        json!({"tool": "lookup_order", "arguments": {"order": "42"}, "call_id": call_sid,
               "caller": CALLER, "callee": OUR_NUMBER, "attempt": 1})
    );
    assert_eq!(
        stack.spoken(),
        vec![GREETING, FILLER, "The order system is down."]
    );
    end(&stack, &call_sid, sim).await;
}

#[tokio::test]
async fn webhook_tool_reply_goes_back_to_the_model_and_rounds_are_capped() {
    let hook = FakeToolEndpoint::start(ToolReply::json(json!({"status": "shipped"})))
        .await
        .unwrap();
    let stack = stack(format!(
        "max_tool_rounds = 2\n{}",
        webhook_tool(&hook.url(), 0, 0)
    ))
    .await;
    for i in 1..=3 {
        stack.hermes.push(HermesReply::tool_call(
            &format!("call_{i}"),
            "lookup_order",
            r#"{"order": "42"}"#,
        ));
    }
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    let reqs = stack
        .hermes
        .wait_until("three requests", |r| r.requests.len() == 3)
        .await
        .requests;
    assert_eq!(reqs[0].tool_names(), vec!["lookup_order"]);
    assert_eq!(reqs[1].tool_names(), vec!["lookup_order"]);
    assert!(
        reqs[2].tool_names().is_empty(),
        "no tools after max_tool_rounds"
    );
    assert_eq!(reqs[2].tool_messages().len(), 2);
    assert_eq!(reqs[1].tool_messages()[0].1, r#"{"status":"shipped"}"#);
    let rec = end(&stack, &call_sid, sim).await;
    assert_eq!(hook.record().requests.len(), 2);
    assert_eq!(rec.events_of(EventKind::ToolCall).count(), 2);
    assert_eq!(stack.hermes.record().requests.len(), 3);
}

/// The model says goodbye and calls `end_call` in the same response: the sentence is spoken
/// whole, then the call is hung up through the carrier, with the reason on the record.
#[tokio::test]
async fn end_call_tool_mid_reply_finishes_the_sentence_then_hangs_up() {
    let stack = stack("tools = [\"end_call\"]\n".into()).await;
    stack.hermes.push(HermesReply::Stream(vec![
        patterd_sim::hermes::HermesStep::Text("Goodbye and take care.".into()),
        patterd_sim::hermes::HermesStep::ToolCall {
            index: 0,
            id: "call_e1".into(),
            name: "end_call".into(),
            arguments: r#"{"reason":"the caller is done"}"#.into(),
            parts: 4,
        },
    ]));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    let rec = stack.finished(&call_sid).await;
    assert_eq!(stack.spoken(), vec![GREETING, "Goodbye and take care."]);
    assert!(
        sim.state().marks_echoed.len() >= 2,
        "the goodbye played before the hang-up"
    );
    assert!(
        rec.ended_reason.text().contains("the caller is done"),
        "{:?}",
        rec.ended_reason
    );
    assert!(stack.rest.wait_for_hang_up(&call_sid, WAIT).await.is_ok());
    let tools = stack.hermes.record().requests[0].tool_names();
    assert_eq!(tools, vec!["end_call"]);
}

/// A caller tries prompt injection and the fake brain obeys: the transfer to a number outside
/// `transfer_allowed` is refused before the carrier, the model is told why, the call goes on.
#[tokio::test]
async fn injected_transfer_to_a_premium_number_is_refused_and_the_model_told() {
    let stack = stack("tools = [\"transfer_call\"]\ntransfer_allowed = [\"+1555\"]\n".into()).await;
    stack.hermes.push(HermesReply::tool_call(
        "call_t1",
        "transfer_call",
        r#"{"to":"+1 900 555 0123"}"#,
    ));
    stack
        .hermes
        .push(HermesReply::text("I can't transfer you there."));
    let (call_sid, sim) = one_turn(&stack, 3).await;
    let reqs = stack.hermes.record().requests;
    assert_eq!(reqs.len(), 2);
    let told = &reqs[1].tool_messages()[0].1;
    assert!(!told.is_empty());
    let rec = end(&stack, &call_sid, sim).await;
    let results = detail(&rec, EventKind::ToolResult);
    assert_eq!(results[0]["ok"], false, "{results:?}");
    assert!(!rec.ended_reason.text().contains("transferred"));
    // The only carrier request is the hang-up at the end: no transfer reached Twilio.
    for r in stack.rest.requests() {
        assert!(
            r.field("Twiml").is_none(),
            "a call update reached the carrier: {r:?}"
        );
    }
}
