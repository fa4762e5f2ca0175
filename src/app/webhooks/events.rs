//! One call's webhook events ([`CallHooks`], held by the call's `CallObserver`): which
//! `[[webhooks]]` entries want which events of this call's agent (fixed when the call starts,
//! like the rest of its configuration), and the outbox rows each report makes — one per
//! receiver, each with its own `webhook-id`. `turn.completed` goes once per transcript entry,
//! when the entry is final: a caller turn as it ends, an agent turn once a later entry begins or
//! the call ends (the agent's entry grows as the caller hears it).

use std::sync::Mutex;

use serde_json::{Value, json};

use crate::call::{CallSetup, EndReason, Speaker, TranscriptEntry};
use crate::config::{Config, WebhookEvent};
use crate::store::outbox::{envelope, new_id};
use crate::store::{OutboxBody, OutboxEvent, now_ms};

/// The receivers of one call's events.
pub(crate) struct CallHooks {
    /// Each interested entry's URL and the events it wants.
    targets: Vec<(String, Vec<WebhookEvent>)>,
    call_id: String,
    /// The payloads' common part (`call_id`, `agent`, …).
    who: Value,
    recording_url: String,
    /// The transcript entry not reported yet, and the next sequence number to report.
    turns: Mutex<Turns>,
}

#[derive(Default)]
struct Turns {
    /// Entries below this are reported.
    next: usize,
    /// The latest state of entry `next` (an agent entry still being heard).
    open: Option<TranscriptEntry>,
}

impl CallHooks {
    /// The hooks of a call set up as `setup` under `config`; `None` when no entry wants any
    /// event of its agent.
    pub(crate) fn new(config: &Config, setup: &CallSetup) -> Option<Self> {
        let agent = &setup.agent_name;
        let targets: Vec<(String, Vec<WebhookEvent>)> = config
            .webhooks
            .iter()
            .filter_map(|w| {
                let events: Vec<WebhookEvent> = WebhookEvent::ALL
                    .iter()
                    .copied()
                    .filter(|e| w.wants(*e, agent))
                    .collect();
                (!events.is_empty()).then(|| (w.url.trim().to_string(), events))
            })
            .collect();
        if targets.is_empty() {
            return None;
        }
        let base = config.server.public_url.trim_end_matches('/');
        Some(Self {
            targets,
            call_id: setup.call_id.clone(),
            who: json!({
                "call_id": setup.call_id,
                "agent": agent,
                "carrier": setup.carrier.as_str(),
                "carrier_account": setup.carrier_account,
                "direction": if setup.outbound { "outbound" } else { "inbound" },
                "from": setup.from,
                "to": setup.to,
            }),
            recording_url: format!(
                "{base}/v1/calls/{}/recording",
                percent_encoding::utf8_percent_encode(
                    &setup.call_id,
                    percent_encoding::NON_ALPHANUMERIC
                )
            ),
            turns: Mutex::new(Turns::default()),
        })
    }

    /// Whether any receiver wants `event`.
    fn wanted(&self, event: WebhookEvent) -> bool {
        self.targets.iter().any(|(_, e)| e.contains(&event))
    }

    /// One row per receiver of `event`, all with `body` (made only if someone wants it).
    fn rows(
        &self,
        event: WebhookEvent,
        body: impl FnOnce(i64) -> OutboxBody,
        out: &mut Vec<OutboxEvent>,
    ) {
        if !self.wanted(event) {
            return;
        }
        let at = now_ms();
        let body = body(at);
        for (url, events) in &self.targets {
            if events.contains(&event) {
                out.push(OutboxEvent {
                    id: new_id(),
                    url: url.clone(),
                    event,
                    call_id: self.call_id.clone(),
                    at,
                    body: body.clone(),
                    held: false,
                });
            }
        }
    }

    /// `who` with `extra`'s keys added.
    fn data(&self, extra: Value) -> Value {
        let mut v = self.who.clone();
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    }

    /// The call's media started: `call.started`.
    pub(crate) fn started(&self) -> Vec<OutboxEvent> {
        let mut out = Vec::new();
        self.rows(
            WebhookEvent::CallStarted,
            |at| {
                OutboxBody::Ready(envelope(
                    WebhookEvent::CallStarted,
                    at,
                    self.data(json!({})),
                ))
            },
            &mut out,
        );
        out
    }

    fn turn_rows(&self, seq: usize, e: &TranscriptEntry, out: &mut Vec<OutboxEvent>) {
        self.rows(
            WebhookEvent::TurnCompleted,
            |at| {
                let speaker = match e.speaker {
                    Speaker::Caller => "caller",
                    Speaker::Agent => "agent",
                };
                OutboxBody::Ready(envelope(
                    WebhookEvent::TurnCompleted,
                    at,
                    self.data(json!({
                        "seq": seq,
                        "speaker": speaker,
                        "text": e.text,
                        "heard_text": e.heard_text,
                        "interrupted": e.interrupted,
                        "start_ms": e.start_ms,
                        "end_ms": e.end_ms,
                    })),
                ))
            },
            out,
        );
    }

    /// Transcript entry `seq` was written (inserted or updated): the `turn.completed` rows of
    /// the entries this makes final.
    pub(crate) fn turn(&self, seq: usize, entry: &TranscriptEntry) -> Vec<OutboxEvent> {
        let mut out = Vec::new();
        if !self.wanted(WebhookEvent::TurnCompleted) {
            return out;
        }
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        if seq < t.next {
            // Already reported (the end of the call writes every entry again).
            return out;
        }
        if seq > t.next {
            // A later entry began: the open one is final.
            if let Some(open) = t.open.take() {
                self.turn_rows(t.next, &open, &mut out);
            }
            t.next = seq;
        }
        match entry.speaker {
            // A caller turn is written once, complete.
            Speaker::Caller => {
                self.turn_rows(seq, entry, &mut out);
                t.next = seq + 1;
                t.open = None;
            }
            Speaker::Agent => t.open = Some(entry.clone()),
        }
        out
    }

    /// The call ended for `reason`: the last open entry's `turn.completed`, `call.transferred`
    /// when it was transferred, then `call.ended` (its body made by the store in the
    /// transaction that ends the call; `held` until the call's summary is stored).
    pub(crate) fn ended(&self, reason: &EndReason, held: bool) -> Vec<OutboxEvent> {
        let mut out = Vec::new();
        {
            let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(open) = t.open.take() {
                let seq = t.next;
                t.next += 1;
                drop(t);
                self.turn_rows(seq, &open, &mut out);
            }
        }
        if let EndReason::Transferred(to) = reason {
            self.rows(
                WebhookEvent::CallTransferred,
                |at| {
                    OutboxBody::Ready(envelope(
                        WebhookEvent::CallTransferred,
                        at,
                        self.data(json!({"transferred_to": to})),
                    ))
                },
                &mut out,
            );
        }
        let from = out.len();
        self.rows(WebhookEvent::CallEnded, |_| OutboxBody::CallEnded, &mut out);
        for e in &mut out[from..] {
            e.held = held;
        }
        out
    }

    /// The call's recording is complete: `recording.ready`.
    pub(crate) fn recording_ready(&self, bytes: u64) -> Vec<OutboxEvent> {
        let mut out = Vec::new();
        self.rows(
            WebhookEvent::RecordingReady,
            |at| {
                OutboxBody::Ready(envelope(
                    WebhookEvent::RecordingReady,
                    at,
                    self.data(json!({
                        "bytes": bytes,
                        "content_type": "audio/wav",
                        "url": self.recording_url,
                    })),
                ))
            },
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WebhookConfig;
    use crate::util::secret::Secret;

    fn hooks(events: Vec<WebhookEvent>, agents: Vec<String>) -> Option<CallHooks> {
        let mut config = Config::default();
        config.server.public_url = "https://voice.example.test/".into();
        for (n, url) in ["https://a.example.test/h", "https://b.example.test/h"]
            .iter()
            .enumerate()
        {
            config.webhooks.push(WebhookConfig {
                url: (*url).into(),
                // The second entry wants only the end.
                events: if n == 0 {
                    events.clone()
                } else {
                    vec![WebhookEvent::CallEnded]
                },
                secret: Secret::new("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="),
                previous_secret: None,
                agents: agents.clone(),
                allow_loopback: false,
            });
        }
        let agent: std::sync::Arc<crate::config::AgentConfig> = std::sync::Arc::new(
            toml::from_str("llm = \"b\"\nstt = \"e\"\ntts = \"v\"\n").expect("agent"),
        );
        let providers = crate::provider::AgentProviders {
            stt: std::sync::Arc::new(crate::provider::memory::ScriptedStt::new(&[], 300)),
            tts: std::sync::Arc::new(crate::provider::memory::MeteredTts::new(
                vec![0xff; 160],
                1,
                std::time::Duration::from_millis(1),
            )),
            llm: std::sync::Arc::new(crate::provider::memory::ScriptedBrain::new(Vec::new())),
        };
        let setup = crate::call::driver::memory_setup("CA 1", "tw", agent, providers);
        CallHooks::new(&config, &setup)
    }

    fn entry(speaker: Speaker, heard: &str) -> TranscriptEntry {
        TranscriptEntry {
            speaker,
            text: heard.into(),
            heard_text: heard.into(),
            interrupted: false,
            start_ms: 0,
            end_ms: 1,
        }
    }

    fn data(e: &OutboxEvent) -> Value {
        match &e.body {
            OutboxBody::Ready(b) => serde_json::from_str::<Value>(b).expect("json")["data"].clone(),
            OutboxBody::CallEnded => Value::Null,
        }
    }

    #[test]
    fn an_agent_filter_that_excludes_the_call_makes_no_hooks() {
        assert!(hooks(vec![WebhookEvent::CallEnded], vec!["someone-else".into()]).is_none());
        assert!(hooks(vec![WebhookEvent::CallEnded], vec![]).is_some());
    }

    #[test]
    fn each_receiver_gets_its_own_row_and_id() {
        let h = hooks(
            vec![WebhookEvent::CallEnded, WebhookEvent::CallStarted],
            vec![],
        )
        .unwrap();
        let started = h.started();
        assert_eq!(started.len(), 1, "only the first entry wants call.started");
        assert_eq!(data(&started[0])["call_id"], "CA 1");
        let ended = h.ended(&EndReason::CallerHungUp, false);
        assert_eq!(ended.len(), 2);
        assert_ne!(ended[0].id, ended[1].id);
        assert!(
            ended
                .iter()
                .all(|e| matches!(e.body, OutboxBody::CallEnded))
        );
    }

    #[test]
    fn turns_are_reported_once_each_when_final() {
        let h = hooks(vec![WebhookEvent::TurnCompleted], vec![]).unwrap();
        // The greeting grows as it is heard: nothing until the caller's turn begins.
        assert!(h.turn(0, &entry(Speaker::Agent, "Hello")).is_empty());
        assert!(h.turn(0, &entry(Speaker::Agent, "Hello there")).is_empty());
        let out = h.turn(1, &entry(Speaker::Caller, "hi"));
        let got: Vec<(Value, Value)> = out
            .iter()
            .map(|e| (data(e)["seq"].clone(), data(e)["heard_text"].clone()))
            .collect();
        assert_eq!(
            got,
            [(json!(0), json!("Hello there")), (json!(1), json!("hi"))]
        );
        assert!(h.turn(2, &entry(Speaker::Agent, "Sure")).is_empty());
        // The end of the call writes every entry again: only the open one is reported.
        assert!(h.turn(0, &entry(Speaker::Agent, "Hello there")).is_empty());
        assert!(h.turn(1, &entry(Speaker::Caller, "hi")).is_empty());
        assert!(h.turn(2, &entry(Speaker::Agent, "Sure, bye")).is_empty());
        let end = h.ended(&EndReason::Transferred("+15550009999".into()), false);
        let kinds: Vec<WebhookEvent> = end.iter().map(|e| e.event).collect();
        assert_eq!(
            kinds,
            [WebhookEvent::TurnCompleted, WebhookEvent::CallEnded],
            "the first entry wants turns, the second the end"
        );
        assert_eq!(data(&end[0])["heard_text"], "Sure, bye");
    }

    #[test]
    fn a_transfer_and_a_recording_carry_their_details() {
        let h = hooks(
            vec![WebhookEvent::CallTransferred, WebhookEvent::RecordingReady],
            vec![],
        )
        .unwrap();
        let end = h.ended(&EndReason::Transferred("+15550009999".into()), false);
        assert_eq!(end[0].event, WebhookEvent::CallTransferred);
        assert_eq!(data(&end[0])["transferred_to"], "+15550009999");
        let rec = h.recording_ready(4044);
        assert_eq!(data(&rec[0])["bytes"], 4044);
        assert_eq!(
            data(&rec[0])["url"],
            "https://voice.example.test/v1/calls/CA%201/recording"
        );
    }
}
