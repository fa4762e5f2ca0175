//! The call's span tree from event sequences, on the paused clock: parents, stage order and
//! times, speculation, retries, tools, transfers and what the call's end closes.

use std::sync::Mutex;
use std::time::Duration;

use super::*;

#[derive(Default)]
struct Captured(Mutex<Vec<SpanData>>);

impl SpanSink for Captured {
    fn send(&self, span: SpanData) {
        self.0.lock().expect("lock").push(span);
    }
}

impl Captured {
    fn spans(&self) -> Vec<SpanData> {
        self.0.lock().expect("lock").clone()
    }
}

fn trace() -> (CallTrace, Arc<Captured>, Instant) {
    let sink = Arc::new(Captured::default());
    let now = Instant::now();
    let t = CallTrace::new(
        CallTracing::new(sink.clone(), "CA1"),
        CallFacts {
            call_id: "CA1".into(),
            carrier: "twilio",
            agent: "desk".into(),
            outbound: false,
        },
        now,
    );
    (t, sink, now)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name}: {:?}", names(spans));
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

fn at(s: &SystemTime, t0: SystemTime) -> u64 {
    s.duration_since(t0).unwrap_or_default().as_millis() as u64
}

/// One ordinary turn: speech end, turn end, request, first token, first audio, first frame.
fn ordinary_turn(t: &mut CallTrace, t0: Instant, number: u64) -> TraceParent {
    t.on_event(EventKind::SpeechEnd, t0 + ms(1000), true);
    t.on_event(EventKind::TurnEnd, t0 + ms(1300), true);
    let ctx = t.brain_request(number, false, t0 + ms(1301));
    t.on_event(EventKind::LlmRequest, t0 + ms(1301), true);
    t.on_event(EventKind::LlmFirstToken, t0 + ms(1500), false);
    t.on_event(EventKind::TtsFirstAudio, t0 + ms(1600), false);
    t.on_event(EventKind::ReplyFirstFrame, t0 + ms(1610), false);
    t.on_event(EventKind::LlmDone, t0 + ms(1700), false);
    ctx
}

#[tokio::test(start_paused = true)]
async fn a_turn_has_its_stages_in_order_under_it_and_the_call_is_the_root() {
    let (mut t, sink, t0) = trace();
    let call = t.tracing.call;
    t.on_event(EventKind::MediaStart, t0 + ms(100), true);
    t.on_event(EventKind::GreetingFirstFrame, t0 + ms(400), false);
    let ctx = ordinary_turn(&mut t, t0, 1);
    // A mark while more is queued does not end the turn; the last one does.
    t.on_event(EventKind::MarkPlayed, t0 + ms(2000), false);
    assert!(named(&sink.spans(), "turn").is_empty());
    t.on_event(EventKind::MarkPlayed, t0 + ms(2500), true);
    t.finish(&EndReason::CallerHungUp, t0 + ms(3000));

    let spans = sink.spans();
    assert!(
        spans
            .iter()
            .all(|s| s.span_context.trace_id() == TraceId::from_bytes(call.trace_id)),
        "one trace"
    );
    let root = one(&spans, "call");
    assert_eq!(root.parent_span_id, SpanId::INVALID);
    assert_eq!(call, TraceParent::for_call("CA1"), "named by the call id");
    assert_eq!(
        root.span_context.span_id(),
        SpanId::from_bytes(call.span_id)
    );
    assert_eq!(spans.last().map(|s| s.name.as_ref()), Some("call"));
    let wall0 = root.start_time;
    assert_eq!(at(&root.end_time, wall0), 3000);

    let greeting = one(&spans, "greeting");
    assert_eq!(greeting.parent_span_id, root.span_context.span_id());
    assert_eq!(
        (
            at(&greeting.start_time, wall0),
            at(&greeting.end_time, wall0)
        ),
        (100, 400)
    );

    let turn = one(&spans, "turn");
    assert_eq!(turn.parent_span_id, root.span_context.span_id());
    assert_eq!(turn.span_context.span_id(), SpanId::from_bytes(ctx.span_id));
    assert_eq!(ctx.trace_id, call.trace_id);
    assert_eq!(
        (at(&turn.start_time, wall0), at(&turn.end_time, wall0)),
        (1000, 2500),
        "from the speech end to the reply's last mark"
    );

    let mut stages: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.parent_span_id == turn.span_context.span_id())
        .collect();
    stages.sort_by_key(|s| s.start_time);
    let got: Vec<(&str, u64, u64)> = stages
        .iter()
        .map(|s| {
            (
                s.name.as_ref(),
                at(&s.start_time, wall0),
                at(&s.end_time, wall0),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("turn_end", 1000, 1300),
            ("brain_request", 1300, 1301),
            ("first_token", 1301, 1500),
            ("first_audio", 1500, 1600),
            ("first_frame", 1600, 1610),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_stays_in_its_turn_and_a_new_number_opens_the_next() {
    let (mut t, sink, t0) = trace();
    let first = t.brain_request(1, false, t0 + ms(10));
    // The brain was unavailable: asked again for the same turn.
    t.on_event(EventKind::LlmRetry, t0 + ms(20), false);
    assert_eq!(t.brain_request(1, false, t0 + ms(500)), first);
    t.on_event(EventKind::LlmFirstToken, t0 + ms(700), false);
    let second = t.brain_request(2, false, t0 + ms(2000));
    assert_ne!(second.span_id, first.span_id);
    assert_eq!(second.trace_id, first.trace_id);
    t.finish(&EndReason::CallerHungUp, t0 + ms(3000));
    let spans = sink.spans();
    let turns = named(&spans, "turn");
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0].events.len(), 1, "the retry is marked on its turn");
    assert_eq!(turns[0].events[0].name, "llm_retry");
    let token = one(&spans, "first_token");
    let wall0 = one(&spans, "call").start_time;
    assert_eq!(
        (at(&token.start_time, wall0), at(&token.end_time, wall0)),
        (10, 700),
        "the first request to the first token: the retry's wait included"
    );
    // The first turn ended when the second opened.
    assert_eq!(at(&turns[0].end_time, wall0), 2000);
}

#[tokio::test(start_paused = true)]
async fn a_speculative_request_belongs_to_the_turn_it_ends() {
    let (mut t, sink, t0) = trace();
    t.on_event(EventKind::SpeechEnd, t0 + ms(1000), true);
    // The eager end of turn: the brain starts before the turn is committed.
    let ctx = t.brain_request(1, true, t0 + ms(1100));
    t.on_event(EventKind::SpeculationStart, t0 + ms(1100), true);
    t.on_event(EventKind::LlmFirstToken, t0 + ms(1200), true);
    t.on_event(EventKind::TurnEnd, t0 + ms(1400), true);
    t.on_event(EventKind::SpeculationUsed, t0 + ms(1400), true);
    t.on_event(EventKind::TtsFirstAudio, t0 + ms(1450), false);
    t.on_event(EventKind::ReplyFirstFrame, t0 + ms(1460), false);
    t.finish(&EndReason::CallerHungUp, t0 + ms(2000));
    let spans = sink.spans();
    let turn = one(&spans, "turn");
    assert_eq!(turn.span_context.span_id(), SpanId::from_bytes(ctx.span_id));
    assert!(
        turn.attributes
            .iter()
            .any(|kv| kv.key.as_str() == "patterd.turn.speculative"
                && kv.value == opentelemetry::Value::Bool(true))
    );
    // No `brain_request` stage: the request came before the turn ended.
    let stage_names: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == turn.span_context.span_id())
        .map(|s| s.name.as_ref())
        .collect();
    assert_eq!(
        stage_names,
        ["turn_end", "first_token", "first_audio", "first_frame"]
    );
}

#[tokio::test(start_paused = true)]
async fn tools_and_transfers_are_children_of_the_turn_with_their_status() {
    let (mut t, sink, t0) = trace();
    let ctx = t.brain_request(1, false, t0 + ms(10));
    let webhook = ToolCall {
        id: "call_a".into(),
        name: "lookup".into(),
        arguments: "{}".into(),
        trace: Some(ctx.child()),
    };
    let consult = ToolCall {
        id: "call_b".into(),
        name: "consult_agent".into(),
        arguments: "{}".into(),
        trace: Some(ctx.child()),
    };
    t.tool_call(&webhook, "webhook", t0 + ms(100));
    t.tool_result("call_a", true, t0 + ms(300));
    t.tool_call(&consult, "consult", t0 + ms(310));
    t.tool_result("call_b", false, t0 + ms(900));
    // An untraced call (no context from the client) makes no span.
    t.tool_call(
        &ToolCall {
            trace: None,
            ..webhook.clone()
        },
        "webhook",
        t0 + ms(950),
    );
    t.on_event(EventKind::TransferStart, t0 + ms(1000), true);
    t.on_event(EventKind::TransferFailed, t0 + ms(1200), true);
    t.on_event(EventKind::TransferStart, t0 + ms(1300), true);
    t.finish(&EndReason::CallerHungUp, t0 + ms(2000));
    let spans = sink.spans();
    let turn_id = SpanId::from_bytes(ctx.span_id);
    let lookup = one(&spans, "execute_tool lookup");
    assert_eq!(lookup.parent_span_id, turn_id);
    assert_eq!(
        lookup.span_context.span_id(),
        SpanId::from_bytes(webhook.trace.expect("ctx").span_id),
        "the span the tool sent on as its traceparent"
    );
    assert_eq!(lookup.status, Status::Ok);
    let c = one(&spans, "execute_tool consult_agent");
    assert!(matches!(c.status, Status::Error { .. }));
    assert!(
        c.attributes
            .iter()
            .any(|kv| kv.key.as_str() == "patterd.tool.kind" && kv.value.as_str() == "consult")
    );
    let transfers = named(&spans, "transfer");
    assert_eq!(transfers.len(), 2);
    assert!(transfers.iter().all(|s| s.parent_span_id == turn_id));
    assert!(
        transfers
            .iter()
            .all(|s| matches!(s.status, Status::Error { .. })),
        "one failed, one never finished"
    );
}

#[tokio::test(start_paused = true)]
async fn ignored_words_do_not_start_a_turn_and_an_interruption_ends_one() {
    let (mut t, sink, t0) = trace();
    ordinary_turn(&mut t, t0, 1);
    // A backchannel over the reply: a turn end that was not a turn.
    t.on_event(EventKind::SpeechEnd, t0 + ms(1800), false);
    t.on_event(EventKind::TurnEnd, t0 + ms(1900), false);
    t.on_event(EventKind::BackchannelIgnored, t0 + ms(1900), false);
    t.on_event(EventKind::Interrupted, t0 + ms(2100), false);
    let spans = sink.spans();
    let turn = one(&spans, "turn");
    let wall0 = turn.start_time - ms(1000);
    assert_eq!(at(&turn.end_time, wall0), 2100);
    assert_eq!(
        turn.events.last().map(|e| e.name.as_ref()),
        Some("interrupted")
    );
    // The next turn starts from its own speech end, not the ignored words' turn end.
    t.on_event(EventKind::SpeechEnd, t0 + ms(3000), true);
    t.on_event(EventKind::TurnEnd, t0 + ms(3200), true);
    t.brain_request(2, false, t0 + ms(3200));
    t.finish(&EndReason::CallerHungUp, t0 + ms(4000));
    let spans = sink.spans();
    let second = named(&spans, "turn")[1];
    assert_eq!(at(&second.start_time, wall0), 3000);
    let first_stage = spans
        .iter()
        .find(|s| s.parent_span_id == second.span_context.span_id())
        .expect("a stage");
    assert_eq!(first_stage.name, "turn_end");
    assert_eq!(
        (
            at(&first_stage.start_time, wall0),
            at(&first_stage.end_time, wall0)
        ),
        (3000, 3200)
    );
}
