//! `[agents.X.summary]`: after a call, its `[llm.NAME]` reads the transcript and writes a
//! summary — and, with a `schema`, fills it (structured extraction: the model answers one
//! JSON object, `data` checked against the operator's JSON Schema). The result is stored with
//! the call (`calls.summary`: `{"text", "data", "llm", "error"}`) by a [`Write::Summary`], which
//! also releases the call's `call.ended` deliveries the outbox held for it; a summary that fails
//! or times out is stored with its `error`, and the deliveries go all the same. The
//! [`SummaryJob`] keeps the call's transcript as the call reports it (the store is write-only
//! from here), so nothing is read back.
//!
//! [`Write::Summary`]: crate::store::Write::Summary

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tracing::{info, warn};

use crate::call::{CallSetup, Speaker, TranscriptEntry};
use crate::config::SummaryConfig;
use crate::provider::{ChatMessage, ChatTurn, LlmEvent, LlmProvider, Providers, Role};
use crate::store::StoreTx;

/// The longest reply read from the summary's brain.
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// One call's summary, to write once it ends.
pub(crate) struct SummaryJob {
    cfg: SummaryConfig,
    llm_name: String,
    llm: Arc<dyn LlmProvider>,
    agent: String,
    transcript: Mutex<BTreeMap<usize, TranscriptEntry>>,
}

impl SummaryJob {
    /// The job of a call of an agent with `[agents.X.summary]` (its brain built).
    pub(crate) fn new(providers: &Providers, setup: &CallSetup) -> Option<Arc<Self>> {
        let cfg = setup.agent.summary.clone()?;
        let Some(llm) = providers.llm.get(&cfg.llm).cloned() else {
            // Validation names an existing [llm.NAME]; a reload may have removed it since.
            warn!(llm = %cfg.llm, "the agent's summary brain is not configured; no summary");
            return None;
        };
        Some(Arc::new(Self {
            llm_name: cfg.llm.clone(),
            cfg,
            llm,
            agent: setup.agent_name.clone(),
            transcript: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Transcript entry `seq` as it stands now.
    pub(crate) fn turn(&self, seq: usize, entry: &TranscriptEntry) {
        self.transcript
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(seq, entry.clone());
    }

    /// Whether there is anything to summarise.
    pub(crate) fn has_transcript(&self) -> bool {
        !self
            .transcript
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Writes the summary of the ended call `call_id` on its own task and stores it.
    pub(crate) fn spawn(self: &Arc<Self>, call_id: &str, store: StoreTx) {
        let job = self.clone();
        let call_id = call_id.to_string();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            store.summary(
                &call_id,
                job.stored(None, Some("no runtime to run it on".into())),
            );
            return;
        };
        rt.spawn(async move {
            let summary = job.write(&call_id).await;
            match summary["error"].as_str() {
                None => info!(%call_id, llm = %job.llm_name, "call summarised"),
                Some(e) => warn!(%call_id, llm = %job.llm_name, error = %e, "call summary failed; call.ended goes without it"),
            }
            store.summary(&call_id, summary);
        });
    }

    fn stored(&self, parsed: Option<(String, Option<Value>)>, error: Option<String>) -> Value {
        let (text, data) = parsed.unwrap_or_default();
        json!({
            "text": (!text.is_empty()).then_some(text),
            "data": data,
            "llm": self.llm_name,
            "error": error,
        })
    }

    /// Asks the brain, within `timeout_s`, and reads its answer.
    async fn write(&self, call_id: &str) -> Value {
        let transcript: Vec<TranscriptEntry> = self
            .transcript
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let turn = ChatTurn {
            call_id: format!("summary-{call_id}"),
            caller: None,
            system_prompt: system_prompt(&self.cfg),
            history: vec![ChatMessage {
                role: Role::User,
                content: transcript_text(&self.agent, &transcript),
            }],
            history_limits: Default::default(),
            tools: None,
            call_token: None,
            trace: None,
        };
        let limit = Duration::from_secs(self.cfg.timeout_s.max(1));
        let reply = match tokio::time::timeout(limit, ask(self.llm.as_ref(), turn)).await {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return self.stored(None, Some(e)),
            Err(_) => {
                return self.stored(
                    None,
                    Some(format!("no answer within {} s", limit.as_secs())),
                );
            }
        };
        match parse(&self.cfg, &reply) {
            Ok((text, data, None)) => self.stored(Some((text, data)), None),
            Ok((text, data, Some(why))) => self.stored(Some((text, data)), Some(why)),
            Err(why) => self.stored(None, Some(why)),
        }
    }
}

/// The whole reply text of one turn.
async fn ask(llm: &dyn LlmProvider, turn: ChatTurn) -> Result<String, String> {
    let mut stream = llm.stream(turn);
    let mut text = String::new();
    while let Some(ev) = stream.events.recv().await {
        match ev {
            LlmEvent::Delta(d) => {
                if text.len() + d.len() > MAX_REPLY_BYTES {
                    return Err("the reply is larger than 64 KiB".into());
                }
                text.push_str(&d);
            }
            LlmEvent::Done => break,
            LlmEvent::Error(e) | LlmEvent::Unavailable { message: e, .. } => return Err(e),
            _ => {}
        }
    }
    Ok(text)
}

/// The instructions: the operator's prompt, then the answer's shape.
fn system_prompt(cfg: &SummaryConfig) -> String {
    match &cfg.schema {
        None => format!(
            "{}\n\nAnswer with one JSON object and nothing else: {{\"summary\": \"<the summary>\"}}",
            cfg.prompt.trim()
        ),
        Some(schema) => format!(
            "{}\n\nAlso extract the facts the schema below asks for. Answer with one JSON object \
             and nothing else: {{\"summary\": \"<the summary>\", \"data\": <an object that \
             matches the schema>}}. Leave out what the call did not say.\nSchema: {schema}",
            cfg.prompt.trim()
        ),
    }
}

/// The transcript as the brain reads it: one line per entry, what the caller heard of the agent.
fn transcript_text(agent: &str, transcript: &[TranscriptEntry]) -> String {
    let mut s = format!("Transcript of a phone call answered by the voice agent `{agent}`:\n");
    for e in transcript {
        let (who, text) = match e.speaker {
            Speaker::Caller => ("caller", e.text.as_str()),
            Speaker::Agent => ("agent", e.heard_text.as_str()),
        };
        if text.trim().is_empty() {
            continue;
        }
        let cut = if e.interrupted { " [interrupted]" } else { "" };
        s.push_str(&format!("{who}: {}{cut}\n", text.trim()));
    }
    s
}

/// The first JSON object in `reply` (a model may wrap it in a code fence or a sentence).
fn json_object(reply: &str) -> Option<Value> {
    let t = reply.trim();
    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(t) {
        return Some(v);
    }
    let (start, end) = (t.find('{')?, t.rfind('}')?);
    match serde_json::from_str::<Value>(t.get(start..=end)?) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// The summary text, the extracted data (when a schema asks for it) and why the data was
/// refused, if it was; an error when the reply has no summary at all.
type Parsed = (String, Option<Value>, Option<String>);

fn parse(cfg: &SummaryConfig, reply: &str) -> Result<Parsed, String> {
    let Some(v) = json_object(reply) else {
        // No JSON: the plain text is the summary (no data can be read from it).
        let text = reply.trim().to_string();
        if text.is_empty() {
            return Err("the brain gave an empty answer".into());
        }
        let why = cfg
            .schema
            .as_ref()
            .map(|_| "the answer is not JSON, so no data was extracted".to_string());
        return Ok((text, None, why));
    };
    let text = v["summary"].as_str().unwrap_or_default().trim().to_string();
    let Some(schema) = &cfg.schema else {
        if text.is_empty() {
            return Err("the answer has no `summary`".into());
        }
        return Ok((text, None, None));
    };
    let data = v.get("data").cloned().unwrap_or(Value::Null);
    let validator = crate::config::tools::compile_schema(schema)?;
    let refused = validator
        .iter_errors(&data)
        .next()
        .map(|e| format!("the extracted data does not match the schema: {e}"));
    match refused {
        None => Ok((text, Some(data), None)),
        Some(why) => Ok((text, None, Some(why))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(schema: Option<Value>) -> SummaryConfig {
        SummaryConfig {
            llm: "b".into(),
            prompt: "Summarise.".into(),
            schema,
            timeout_s: 5,
        }
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"party_size": {"type": "integer"}},
               "required": ["party_size"]})
    }

    #[test]
    fn a_fenced_answer_is_read_and_its_data_checked() {
        let reply = "Here you go:\n```json\n{\"summary\": \"Booked a table.\", \"data\": {\"party_size\": 2}}\n```";
        assert_eq!(
            parse(&cfg(Some(schema())), reply),
            Ok((
                "Booked a table.".into(),
                Some(json!({"party_size": 2})),
                None
            ))
        );
        let (text, data, why) = parse(
            &cfg(Some(schema())),
            r#"{"summary": "x", "data": {"party_size": "two"}}"#,
        )
        .expect("a summary");
        assert_eq!((text.as_str(), data), ("x", None));
        assert!(why.is_some_and(|w| w.contains("does not match the schema")));
    }

    #[test]
    fn without_a_schema_only_the_summary_is_kept_and_plain_text_will_do() {
        assert_eq!(
            parse(
                &cfg(None),
                r#"{"summary": "A short call.", "data": {"x": 1}}"#
            ),
            Ok(("A short call.".into(), None, None))
        );
        assert_eq!(
            parse(&cfg(None), "The caller asked for opening hours."),
            Ok(("The caller asked for opening hours.".into(), None, None))
        );
        assert!(parse(&cfg(None), "  ").is_err());
        assert!(parse(&cfg(None), r#"{"other": 1}"#).is_err());
    }

    #[test]
    fn the_prompt_carries_the_schema_and_the_heard_transcript() {
        assert!(system_prompt(&cfg(Some(schema()))).contains("\"party_size\""));
        let t = transcript_text(
            "front-desk",
            &[
                TranscriptEntry {
                    speaker: Speaker::Agent,
                    text: "Hello, how can I help you today?".into(),
                    heard_text: "Hello, how".into(),
                    interrupted: true,
                    start_ms: 0,
                    end_ms: 1,
                },
                TranscriptEntry {
                    speaker: Speaker::Caller,
                    text: "a table for two".into(),
                    heard_text: "a table for two".into(),
                    interrupted: false,
                    start_ms: 2,
                    end_ms: 3,
                },
            ],
        );
        assert!(
            t.contains("agent: Hello, how [interrupted]\ncaller: a table for two\n"),
            "{t}"
        );
    }
}
