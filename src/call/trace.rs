//! A call's trace (`[telemetry]`): the OpenTelemetry spans of one call, made by the actor from
//! the times it already records on the timeline, so no span code runs per frame. One span per
//! call (the root; its context follows from the call id, [`CallTracing::call`]); under it the
//! greeting, one span per caller turn and the transfers; under a turn its stages — the
//! consecutive intervals `speech_end → turn_end → brain_request → first_token → first_audio →
//! first_frame` (see [`STAGES`]) —, its tool calls (consults and webhook tools included) and the
//! events worth a mark (retries, errors, fillers, barge-ins). A turn's span context is what the
//! brain request carries as `traceparent` ([`CallTrace::brain_request`]); a tool call's span is
//! the child the brain's client made for it ([`crate::provider::ToolCall::trace`]), so the tool's
//! own trace hangs under it. Finished spans leave through the [`SpanSink`] port (the exporter's
//! bounded queue: never waits). Pure state apart from that port: handed events and their times.
//! Caller words and phone numbers never go into a span.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use tokio::time::Instant;

use super::event::{EndReason, EventKind};
use crate::provider::ToolCall;
use crate::util::traceparent::TraceParent;

/// Where a call's finished spans go. Never blocks: a full queue drops the span and counts it.
pub trait SpanSink: Send + Sync {
    fn send(&self, span: SpanData);
}

/// What a call needs to be traced: where its spans go and its own span's context (derived
/// from the call id, [`TraceParent::for_call`], so whatever reports on the call — a webhook
/// about it — can name it too).
#[derive(Clone)]
pub struct CallTracing {
    pub sink: Arc<dyn SpanSink>,
    /// The call span's context: the call's trace id and the root span's id.
    pub call: TraceParent,
}

impl CallTracing {
    /// The trace of call `call_id`, whose spans go to `sink`.
    pub fn new(sink: Arc<dyn SpanSink>, call_id: &str) -> Self {
        Self {
            sink,
            call: TraceParent::for_call(call_id),
        }
    }
}

/// The stage spans of a turn in order: each runs from the point before it (the first from the
/// caller's speech end) to its own point.
pub const STAGES: [&str; 5] = [
    "turn_end",
    "brain_request",
    "first_token",
    "first_audio",
    "first_frame",
];

/// The instrumentation scope every span is reported under.
fn scope() -> InstrumentationScope {
    static SCOPE: OnceLock<InstrumentationScope> = OnceLock::new();
    SCOPE
        .get_or_init(|| {
            InstrumentationScope::builder("patterd")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build()
        })
        .clone()
}

/// Facts about the call that its span carries.
#[derive(Debug, Clone)]
pub(crate) struct CallFacts {
    pub call_id: String,
    pub carrier: &'static str,
    pub agent: String,
    pub outbound: bool,
}

/// A caller turn whose span is open.
#[derive(Debug)]
struct OpenTurn {
    ctx: TraceParent,
    /// The policy's turn number (1 for the first caller turn).
    number: u64,
    start: Instant,
    speech_end: Option<Instant>,
    turn_end: Option<Instant>,
    brain_request: Option<Instant>,
    first_token: Option<Instant>,
    first_audio: Option<Instant>,
    first_frame: Option<Instant>,
    /// The brain was started before the turn was committed (an eager end of turn).
    speculative: bool,
    /// The brain finished (or failed) this turn's reply.
    brain_done: bool,
    error: Option<&'static str>,
    events: Vec<Event>,
}

/// A tool call or transfer whose span is open.
#[derive(Debug)]
struct OpenSpan {
    ctx: TraceParent,
    parent: [u8; 8],
    name: Cow<'static, str>,
    start: Instant,
    attributes: Vec<KeyValue>,
    /// The tool call's id (tools only).
    id: String,
}

/// One call's spans in the making.
pub(crate) struct CallTrace {
    tracing: CallTracing,
    facts: CallFacts,
    /// The actor's clock against the wall clock, taken together at creation.
    anchor: (Instant, SystemTime),
    /// The caller's latest speech end not yet part of a turn.
    speech_end: Option<Instant>,
    /// The latest end of a caller turn not yet part of a turn span.
    turn_end: Option<Instant>,
    media_start: Option<Instant>,
    greeted: bool,
    turn: Option<OpenTurn>,
    tools: Vec<OpenSpan>,
    transfer: Option<OpenSpan>,
    turns: u64,
}

impl CallTrace {
    pub(crate) fn new(tracing: CallTracing, facts: CallFacts, now: Instant) -> Self {
        Self {
            tracing,
            facts,
            anchor: (now, SystemTime::now()),
            speech_end: None,
            turn_end: None,
            media_start: None,
            greeted: false,
            turn: None,
            tools: Vec::new(),
            transfer: None,
            turns: 0,
        }
    }

    /// The wall-clock time of actor time `t`.
    fn wall(&self, t: Instant) -> SystemTime {
        let (at, wall) = self.anchor;
        if t >= at {
            wall + t.duration_since(at)
        } else {
            wall.checked_sub(at.duration_since(t)).unwrap_or(wall)
        }
    }

    /// The span of the open turn, else the call's.
    fn parent_now(&self) -> [u8; 8] {
        self.turn
            .as_ref()
            .map_or(self.tracing.call.span_id, |t| t.ctx.span_id)
    }

    /// A timeline event at `now`; `agent_idle`: nothing of the agent's is queued, playing or
    /// waiting for its mark.
    pub(crate) fn on_event(&mut self, kind: EventKind, now: Instant, agent_idle: bool) {
        match kind {
            EventKind::MediaStart => {
                self.media_start.get_or_insert(now);
            }
            EventKind::GreetingFirstFrame if !self.greeted => {
                self.greeted = true;
                let start = self.media_start.unwrap_or(self.anchor.0);
                let span = self.span(
                    "greeting".into(),
                    self.tracing.call.child(),
                    Some(self.tracing.call.span_id),
                    (start, now),
                    Vec::new(),
                    Vec::new(),
                    Status::Unset,
                );
                self.tracing.sink.send(span);
            }
            EventKind::SpeechEnd => self.speech_end = Some(now),
            EventKind::TurnEnd => match self.turn.as_mut() {
                // The turn the brain already works on speculatively is the one that ended.
                Some(t) if t.speculative && t.turn_end.is_none() => t.turn_end = Some(now),
                _ => self.turn_end = Some(now),
            },
            // Not a turn after all: the next turn does not start from these.
            EventKind::BackchannelIgnored | EventKind::EchoIgnored => {
                self.turn_end = None;
            }
            EventKind::SpeculationCancelled => {
                if let Some(t) = self.turn.as_mut().filter(|t| t.speculative) {
                    // None of the speculative reply was used: the next request counts.
                    t.brain_request = None;
                    t.first_token = None;
                    self.mark("speculation_cancelled", now);
                }
            }
            EventKind::LlmFirstToken => {
                if let Some(t) = self.turn.as_mut()
                    && t.brain_request.is_some()
                {
                    t.first_token.get_or_insert(now);
                }
            }
            EventKind::TtsFirstAudio => {
                if let Some(t) = self.turn.as_mut()
                    && t.first_token.is_some()
                {
                    t.first_audio.get_or_insert(now);
                }
            }
            EventKind::ReplyFirstFrame => {
                if let Some(t) = self.turn.as_mut() {
                    t.first_frame.get_or_insert(now);
                }
            }
            EventKind::LlmDone => {
                if let Some(t) = self.turn.as_mut() {
                    t.brain_done = true;
                }
            }
            EventKind::LlmError => {
                if let Some(t) = self.turn.as_mut() {
                    t.brain_done = true;
                    t.error = Some("the brain failed this turn");
                }
                self.mark("llm_error", now);
            }
            EventKind::LlmRetry => self.mark("llm_retry", now),
            EventKind::Filler => self.mark("filler", now),
            EventKind::FirstFrameOfTurn => self.mark("first_frame_of_turn", now),
            EventKind::BargeInStop => self.mark("barge_in_stop", now),
            EventKind::BargeInCommit => self.mark("barge_in_commit", now),
            EventKind::BargeInResume => self.mark("barge_in_resume", now),
            EventKind::ToolProgress => self.mark("tool_progress", now),
            EventKind::Interrupted => {
                self.mark("interrupted", now);
                // The agent's reply is over: so is its turn.
                self.close_turn(now);
            }
            EventKind::TransferStart => {
                let parent = self.parent_now();
                self.end_transfer(now, Status::error("another transfer started"));
                self.transfer = Some(OpenSpan {
                    ctx: self.tracing.call.child(),
                    parent,
                    name: "transfer".into(),
                    start: now,
                    attributes: Vec::new(),
                    id: String::new(),
                });
            }
            EventKind::Transferred => self.end_transfer(now, Status::Ok),
            EventKind::TransferFailed => {
                self.end_transfer(now, Status::error("the carrier did not transfer the call"))
            }
            _ => {}
        }
        // The reply has played out: the turn is over.
        if matches!(kind, EventKind::MarkPlayed | EventKind::MarkCleared)
            && agent_idle
            && self.turn.as_ref().is_some_and(|t| t.brain_done)
        {
            self.close_turn(now);
        }
    }

    /// A span event on the open turn.
    fn mark(&mut self, name: &'static str, now: Instant) {
        let timestamp = self.wall(now);
        if let Some(t) = self.turn.as_mut() {
            t.events.push(Event::new(name, timestamp, Vec::new(), 0));
        }
    }

    /// The brain is asked at `now` for the policy's turn `number`: the turn's span context,
    /// which the request carries as `traceparent`. A number the open turn does not have opens
    /// a new turn (closing the open one); the same number is a retry of the open turn.
    /// `speculative`: the turn has not ended yet (an eager end of turn).
    pub(crate) fn brain_request(
        &mut self,
        number: u64,
        speculative: bool,
        now: Instant,
    ) -> TraceParent {
        if self.turn.as_ref().is_none_or(|t| t.number != number) {
            self.close_turn(now);
            let speech_end = self.speech_end.take();
            let turn_end = if speculative {
                None
            } else {
                self.turn_end.take()
            };
            let start = [speech_end, turn_end]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now)
                .min(now);
            self.turns += 1;
            self.turn = Some(OpenTurn {
                ctx: self.tracing.call.child(),
                number,
                start,
                speech_end,
                turn_end,
                brain_request: None,
                first_token: None,
                first_audio: None,
                first_frame: None,
                speculative,
                brain_done: false,
                error: None,
                events: Vec::new(),
            });
        }
        let turn = self.turn.as_mut().expect("a turn was just opened");
        // A retry keeps the first request: the stage shows the whole wait.
        turn.brain_request.get_or_insert(now);
        turn.brain_done = false;
        turn.ctx
    }

    /// The model called a tool: its span opens under the open turn (with the context the
    /// brain's client gave the call, which the tool sends on).
    pub(crate) fn tool_call(&mut self, call: &ToolCall, kind: &'static str, now: Instant) {
        let Some(ctx) = call.trace else {
            return;
        };
        let parent = self.parent_now();
        self.tools.push(OpenSpan {
            ctx,
            parent,
            name: format!("execute_tool {}", call.name).into(),
            start: now,
            attributes: vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", call.name.clone()),
                KeyValue::new("gen_ai.tool.call.id", call.id.clone()),
                KeyValue::new("patterd.tool.kind", kind),
            ],
            id: call.id.clone(),
        });
    }

    /// Tool call `id` finished (`ok`: it did its job).
    pub(crate) fn tool_result(&mut self, id: &str, ok: bool, now: Instant) {
        if let Some(i) = self.tools.iter().position(|t| t.id == id) {
            let open = self.tools.remove(i);
            let status = if ok {
                Status::Ok
            } else {
                Status::error("the tool failed")
            };
            self.end_open(open, now, status);
        }
    }

    fn end_transfer(&mut self, now: Instant, status: Status) {
        if let Some(open) = self.transfer.take() {
            self.end_open(open, now, status);
        }
    }

    fn end_open(&self, open: OpenSpan, now: Instant, status: Status) {
        let span = self.span(
            open.name,
            open.ctx,
            Some(open.parent),
            (open.start, now),
            open.attributes,
            Vec::new(),
            status,
        );
        self.tracing.sink.send(span);
    }

    /// Ends the open turn at `now`: its stage spans, its unfinished tool calls, then its own.
    fn close_turn(&mut self, now: Instant) {
        let Some(t) = self.turn.take() else {
            return;
        };
        for open in std::mem::take(&mut self.tools) {
            self.end_open(open, now, Status::error("unfinished when the turn ended"));
        }
        let points = [
            t.turn_end,
            t.brain_request,
            t.first_token,
            t.first_audio,
            t.first_frame,
        ];
        let mut before = t.speech_end;
        for (name, point) in STAGES.into_iter().zip(points) {
            let Some(end) = point else { continue };
            if let Some(start) = before.filter(|s| *s <= end) {
                let span = self.span(
                    name.into(),
                    t.ctx.child(),
                    Some(t.ctx.span_id),
                    (start, end),
                    vec![KeyValue::new("patterd.turn", t.number as i64)],
                    Vec::new(),
                    Status::Unset,
                );
                self.tracing.sink.send(span);
            }
            before = Some(end);
        }
        let status = match t.error {
            Some(why) => Status::error(why),
            None => Status::Unset,
        };
        let span = self.span(
            "turn".into(),
            t.ctx,
            Some(self.tracing.call.span_id),
            (t.start, now.max(t.start)),
            vec![
                KeyValue::new("patterd.turn", t.number as i64),
                KeyValue::new("patterd.turn.speculative", t.speculative),
            ],
            t.events,
            status,
        );
        self.tracing.sink.send(span);
    }

    /// The call ended at `now`: everything open ends, the call's own span last.
    pub(crate) fn finish(mut self, reason: &EndReason, now: Instant) {
        self.close_turn(now);
        for open in std::mem::take(&mut self.tools) {
            self.end_open(open, now, Status::error("unfinished when the call ended"));
        }
        self.end_transfer(now, Status::error("unfinished when the call ended"));
        let f = &self.facts;
        let attributes = vec![
            KeyValue::new("patterd.call_id", f.call_id.clone()),
            KeyValue::new("patterd.carrier", f.carrier),
            KeyValue::new("patterd.agent", f.agent.clone()),
            KeyValue::new(
                "patterd.direction",
                if f.outbound { "outbound" } else { "inbound" },
            ),
            KeyValue::new("patterd.turns", self.turns as i64),
            KeyValue::new("patterd.end_reason", reason.log_text().into_owned()),
        ];
        let span = self.span(
            "call".into(),
            self.tracing.call,
            None,
            (self.anchor.0, now),
            attributes,
            Vec::new(),
            Status::Unset,
        );
        self.tracing.sink.send(span);
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        name: Cow<'static, str>,
        ctx: TraceParent,
        parent: Option<[u8; 8]>,
        (start, end): (Instant, Instant),
        attributes: Vec<KeyValue>,
        events: Vec<Event>,
        status: Status,
    ) -> SpanData {
        let flags = if ctx.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(ctx.trace_id),
                SpanId::from_bytes(ctx.span_id),
                flags,
                false,
                TraceState::default(),
            ),
            parent_span_id: parent.map_or(SpanId::INVALID, SpanId::from_bytes),
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name,
            start_time: self.wall(start),
            end_time: self.wall(end.max(start)),
            attributes,
            dropped_attributes_count: 0,
            events: span_events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope(),
        }
    }
}

#[cfg(test)]
mod tests;
