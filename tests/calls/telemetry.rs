//! OpenTelemetry traces (`[telemetry]`) through the in-repo OTLP/HTTP collector
//! (`patterd_sim::otlp`, which decodes the official protobuf definitions): one trace per call,
//! the turn under the call and its stages under the turn in order, the `traceparent` the fake
//! brain, a consult and a webhook tool received equal to their spans' contexts; a collector
//! that is down or hangs costs the calls nothing but dropped spans, counted at `/metrics`;
//! without `[telemetry]` no `traceparent` is sent.

use std::sync::atomic::Ordering;

use serde_json::json;

use crate::common::*;
use patterd::app::metrics::SpanDrop;
use patterd_sim::hermes::{HermesReply, HermesRequest};
use patterd_sim::otlp::{CollectorMode, CollectorRecord, FakeCollector, ReceivedSpan};
use patterd_sim::tool_endpoint::{FakeToolEndpoint, ToolReply};

/// The stage spans of a turn, in order (`patterd::call::trace::STAGES`).
const STAGES: [&str; 5] = [
    "turn_end",
    "brain_request",
    "first_token",
    "first_audio",
    "first_frame",
];

fn telemetry(endpoint: &str, extra: &str) -> String {
    format!("\n[telemetry]\notlp_endpoint = \"{endpoint}\"\n{extra}\n")
}

async fn traced_stack(endpoint: &str, extra: &str, opts: Opts) -> Stack {
    Stack::start(Opts {
        extra_config: telemetry(endpoint, extra),
        ..opts
    })
    .await
}

/// A call: the greeting, one caller turn and the agent's answer (its mark), then the hang-up.
async fn call_with_one_turn(stack: &Stack, marks: usize) -> String {
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("the answer's mark", WAIT, |s| s.marks_echoed.len() >= marks)
        .await
        .unwrap();
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    call_sid
}

/// The call span of `call_sid` and every span of its trace.
fn trace_of<'a>(
    rec: &'a CollectorRecord,
    call_sid: &str,
) -> (&'a ReceivedSpan, Vec<&'a ReceivedSpan>) {
    let calls: Vec<&ReceivedSpan> = rec
        .named("call")
        .into_iter()
        .filter(|s| s.attribute("patterd.call_id") == Some(call_sid))
        .collect();
    assert_eq!(calls.len(), 1, "one call span for {call_sid}");
    let root = calls[0];
    let spans = rec
        .spans
        .iter()
        .filter(|s| s.trace_id == root.trace_id)
        .collect();
    (root, spans)
}

/// The Hermes request of `call_sid` (kind `hermes`: its session header names the call).
fn request_of<'a>(reqs: &'a [HermesRequest], call_sid: &str) -> Vec<&'a HermesRequest> {
    let session = format!("patter-call-{call_sid}");
    reqs.iter()
        .filter(|r| r.header("x-hermes-session-id") == Some(session.as_str()))
        .collect()
}

#[tokio::test]
async fn each_call_is_one_trace_with_its_turn_stages_in_order_and_the_brain_joins_the_turn() {
    let collector = FakeCollector::start().await.unwrap();
    let stack = traced_stack(&collector.endpoint(), "", Opts::default()).await;
    let first = call_with_one_turn(&stack, 2).await;
    let second = call_with_one_turn(&stack, 2).await;
    let rec = collector
        .wait_until("both calls' root spans", |r| r.named("call").len() == 2)
        .await;
    let reqs = stack.hermes.record().requests;
    let mut traces = Vec::new();
    for call_sid in [&first, &second] {
        let (root, spans) = trace_of(&rec, call_sid);
        traces.push(root.trace_id.clone());
        assert!(root.parent.is_empty(), "the call span is the root");
        let named = patterd::util::traceparent::TraceParent::for_call(call_sid);
        assert_eq!(
            root.traceparent(),
            named.header_value(),
            "named by its call id"
        );
        assert_eq!(root.service, "patterd");
        assert_eq!(root.scope, "patterd");
        assert_eq!(root.attribute("patterd.carrier"), Some("twilio"));
        assert_eq!(root.attribute("patterd.turns"), Some("1"));
        assert!(
            spans
                .iter()
                .all(|s| s.start_ns >= root.start_ns && s.end_ns <= root.end_ns),
            "every span within the call's"
        );
        // Everything but the root hangs from a span of the same trace.
        for s in &spans {
            assert!(
                s.parent.is_empty() || spans.iter().any(|p| p.span_id == s.parent),
                "{} has a parent in its trace",
                s.name
            );
        }
        let children = rec.children(&root.span_id);
        let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["greeting", "turn"], "{call_sid}");
        let turn = children[1];
        assert_eq!(turn.attribute("patterd.turn"), Some("1"));
        let stages = rec.children(&turn.span_id);
        let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, STAGES, "the stages under the turn, by start time");
        for w in stages.windows(2) {
            assert_eq!(
                w[0].end_ns, w[1].start_ns,
                "{} ends where {} starts",
                w[0].name, w[1].name
            );
        }
        assert!(stages[0].start_ns >= turn.start_ns && stages[4].end_ns <= turn.end_ns);
        // The brain's request carried the turn span's context.
        let asked = request_of(&reqs, call_sid);
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].traceparent(), Some(turn.traceparent().as_str()));
    }
    assert_ne!(traces[0], traces[1], "one trace per call");
    assert_eq!(
        rec.spans.len(),
        2 * (1 + 1 + 1 + STAGES.len()),
        "call, greeting, turn and its stages, per call: {:#?}",
        rec.spans
    );
    // Counted once the collector's answer is in.
    let n = rec.spans.len() as u64;
    until_counted(&stack, "the exported spans are counted", |m| {
        m.otel_spans_exported.load(Ordering::Relaxed) == n
    })
    .await;
    let m = &stack.server.app.metrics;
    assert_eq!(m.otel_spans_dropped.get(SpanDrop::QueueFull), 0);
    assert_eq!(m.otel_spans_dropped.get(SpanDrop::ExportFailed), 0);
}

const LOOKUP_SCHEMA: &str =
    r#"{ type = "object", properties = { order = { type = "string" } }, required = ["order"] }"#;

#[tokio::test]
async fn a_consult_and_a_webhook_tool_are_spans_of_their_turn_and_send_them_on() {
    let collector = FakeCollector::start().await.unwrap();
    let office = FakeToolEndpoint::start(ToolReply::json(json!({"answer": "It shipped."})))
        .await
        .unwrap();
    let hook = FakeToolEndpoint::start(ToolReply::json(json!({"status": "shipped"})))
        .await
        .unwrap();
    let agent_extra = format!(
        "[agents.front-desk.consult]\nurl = \"{}\"\nallow_loopback = true\n\
         reassurance = \"One moment.\"\n\n\
         [[agents.front-desk.webhook_tools]]\nname = \"lookup_order\"\n\
         description = \"Looks an order up.\"\nparameters = {LOOKUP_SCHEMA}\nurl = \"{}\"\n\
         allow_loopback = true\n",
        office.url(),
        hook.url()
    );
    let stack = traced_stack(
        &collector.endpoint(),
        "",
        Opts {
            llm: "compat".into(),
            agent_extra,
            ..Opts::default()
        },
    )
    .await;
    stack.hermes.push(HermesReply::tool_call(
        "call_c",
        "consult_agent",
        r#"{"request":"Where is order 42?"}"#,
    ));
    stack.hermes.push(HermesReply::tool_call(
        "call_w",
        "lookup_order",
        r#"{"order":"42"}"#,
    ));
    stack
        .hermes
        .push(HermesReply::text("Order 42 has shipped."));
    // Greeting, reassurance, answer.
    let call_sid = call_with_one_turn(&stack, 3).await;
    let rec = collector
        .wait_until("the call's root span", |r| !r.named("call").is_empty())
        .await;
    let (root, _) = trace_of(&rec, &call_sid);
    let turns: Vec<&ReceivedSpan> = rec
        .children(&root.span_id)
        .into_iter()
        .filter(|s| s.name == "turn")
        .collect();
    assert_eq!(turns.len(), 1);
    let turn = turns[0];
    let under: Vec<&ReceivedSpan> = rec.children(&turn.span_id);
    let tool = |name: &str| -> &ReceivedSpan {
        let found: Vec<&&ReceivedSpan> = under.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "{name} under the turn: {under:#?}");
        found[0]
    };
    let consult = tool("execute_tool consult_agent");
    let webhook = tool("execute_tool lookup_order");
    assert_eq!(consult.attribute("patterd.tool.kind"), Some("consult"));
    assert_eq!(consult.attribute("gen_ai.tool.call.id"), Some("call_c"));
    assert_eq!(webhook.attribute("patterd.tool.kind"), Some("webhook"));
    assert_eq!(consult.status, 1, "ok");
    assert!(
        consult.end_ns <= webhook.start_ns,
        "the consult, then the webhook"
    );
    // Each endpoint got its own tool span's context; every brain request of the turn the turn's.
    let asked = office.record().requests;
    assert_eq!(
        asked[0].header("traceparent"),
        Some(consult.traceparent().as_str())
    );
    let hooked = hook.record().requests;
    assert_eq!(
        hooked[0].header("traceparent"),
        Some(webhook.traceparent().as_str())
    );
    let reqs = stack.hermes.record().requests;
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.traceparent(), Some(turn.traceparent().as_str()));
    }
}

/// Polls the daemon's counter until `done` holds (the export task runs on its own time).
async fn until_counted(stack: &Stack, what: &str, done: impl Fn(&patterd::app::Metrics) -> bool) {
    let m = &stack.server.app.metrics;
    let until = tokio::time::Instant::now() + WAIT;
    while !done(m) {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn metrics_text(stack: &Stack) -> String {
    let r = stack
        .api_client()
        .get(format!("{}/metrics", stack.base))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(r.status(), 200);
    r.text().await.expect("body")
}

fn sample(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {key}"))
}

#[tokio::test]
async fn a_collector_that_is_down_costs_the_call_nothing_but_counted_spans() {
    let collector = FakeCollector::start().await.unwrap();
    let endpoint = collector.endpoint();
    collector.stop();
    let stack = traced_stack(&endpoint, "export_timeout_ms = 1000", Opts::default()).await;
    let call_sid = call_with_one_turn(&stack, 2).await;
    // The call went as ever, and was traced: the brain still got the turn's context.
    assert_eq!(stack.spoken()[0], GREETING);
    assert!(stack.spoken().len() >= 2, "{:?}", stack.spoken());
    let reqs = stack.hermes.record().requests;
    let tp = request_of(&reqs, &call_sid)[0]
        .traceparent()
        .expect("traceparent");
    assert!(
        patterd::util::traceparent::TraceParent::parse(tp).is_some(),
        "{tp}"
    );
    until_counted(&stack, "the call's spans are counted as dropped", |m| {
        m.otel_spans_dropped.get(SpanDrop::ExportFailed) >= 1 + 1 + 1 + STAGES.len() as u64
    })
    .await;
    let text = metrics_text(&stack).await;
    assert!(
        sample(
            &text,
            "patterd_otel_spans_dropped_total{reason=\"export_failed\"}"
        ) >= 8
    );
    assert_eq!(sample(&text, "patterd_otel_spans_exported_total"), 0);
    // The collector is back: the next call's trace reaches it.
    collector.start_again().await.unwrap();
    let next = call_with_one_turn(&stack, 2).await;
    let rec = collector
        .wait_until("the next call's root span", |r| !r.named("call").is_empty())
        .await;
    trace_of(&rec, &next);
    assert!(
        rec.named("call")
            .iter()
            .all(|s| s.attribute("patterd.call_id") != Some(call_sid.as_str())),
        "the first call's spans were dropped, not kept for later"
    );
}

#[tokio::test]
async fn a_collector_that_hangs_fills_the_queue_and_the_overflow_is_counted() {
    let collector = FakeCollector::start().await.unwrap();
    collector.set_mode(CollectorMode::Hang);
    let stack = traced_stack(
        &collector.endpoint(),
        "export_timeout_ms = 300\nmax_queued_spans = 2",
        Opts::default(),
    )
    .await;
    call_with_one_turn(&stack, 2).await;
    until_counted(&stack, "overflow and timed-out exports are counted", |m| {
        m.otel_spans_dropped.get(SpanDrop::QueueFull) > 0
            && m.otel_spans_dropped.get(SpanDrop::ExportFailed) > 0
    })
    .await;
    assert_eq!(collector.record().exports, 0);
    // The calls were not held up: another one goes through while the exporter waits.
    call_with_one_turn(&stack, 2).await;
}

#[tokio::test]
async fn without_telemetry_no_traceparent_is_sent() {
    let stack = Stack::start(Opts::default()).await;
    let call_sid = call_with_one_turn(&stack, 2).await;
    let reqs = stack.hermes.record().requests;
    let asked = request_of(&reqs, &call_sid);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].traceparent(), None);
    assert!(stack.server.app.telemetry.is_none());
}
