//! Agents answering text messages (`[[numbers]] sms = true`): one conversation per pair of
//! numbers, run by one task at a time that takes the pair's messages in order from a small
//! bounded mailbox (a flood past it is stored but not answered) and ends when idle. Each
//! message is one brain turn: the agent's system prompt (with `{caller}` the sender) and a note
//! that the answer goes out as a text message, the pair's stored messages as history, and the
//! conversation's own session id (`sms-<our digits>-<their digits>`, so Hermes keeps one
//! session per conversation; with `session_key_from = "caller_hash"` the sender's memory is
//! the one their calls use). The answer is sent back by text message through the same account
//! ([`super::send`], under the caps).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{SendRequest, Sender};
use crate::app::App;
use crate::provider::{ChatMessage, ChatTurn, LlmEvent, Role};
use crate::security::mask_number;
use crate::store::MessageFilter;

/// Messages one conversation holds unanswered at most.
const MAILBOX: usize = 4;
/// Conversations running at once at most; a message for another is stored, not answered.
const MAX_CONVERSATIONS: usize = 256;
/// How long a conversation's task waits for the pair's next message before it ends.
const IDLE: Duration = Duration::from_secs(120);
/// The longest one answer may take (the brain's own deadlines apply first).
const TURN_LIMIT: Duration = Duration::from_secs(120);
/// Stored messages of the pair a turn carries at most.
const HISTORY: usize = 40;

/// One inbound message for its agent to answer.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// The `[carriers.NAME]` account the message came through (the answer goes out through it).
    pub(crate) account: String,
    /// Our number (texted).
    pub(crate) ours: String,
    /// The sender (E.164).
    pub(crate) theirs: String,
    pub(crate) agent: String,
    pub(crate) message_id: String,
}

type Key = (String, String);

/// The running conversations, by (our number, theirs).
#[derive(Default)]
pub(crate) struct Conversations {
    map: Mutex<HashMap<Key, mpsc::Sender<Turn>>>,
}

impl Conversations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, mpsc::Sender<Turn>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `turn` to its conversation, starting one when none runs.
    pub(crate) fn deliver(&self, app: &Arc<App>, mut turn: Turn) {
        let key: Key = (turn.ours.clone(), turn.theirs.clone());
        let mut map = self.lock();
        if let Some(tx) = map.get(&key) {
            match tx.try_send(turn) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(t)) => {
                    warn!(
                        message_id = %t.message_id,
                        from = %mask_number(&t.theirs),
                        "text message not answered: its conversation already has {MAILBOX} waiting"
                    );
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(t)) => {
                    map.remove(&key);
                    turn = t;
                }
            }
        }
        if map.len() >= MAX_CONVERSATIONS {
            warn!(
                message_id = %turn.message_id,
                "text message not answered: {MAX_CONVERSATIONS} conversations are running"
            );
            return;
        }
        let (tx, rx) = mpsc::channel(MAILBOX);
        let _ = tx.try_send(turn);
        map.insert(key.clone(), tx);
        tokio::spawn(run(app.clone(), key, rx));
    }
}

/// One conversation's task: its messages in order, until it is idle.
async fn run(app: Arc<App>, key: Key, mut rx: mpsc::Receiver<Turn>) {
    while let Ok(Some(turn)) = tokio::time::timeout(IDLE, rx.recv()).await {
        answer(&app, turn).await;
    }
    rx.close();
    while let Some(turn) = rx.recv().await {
        answer(&app, turn).await;
    }
    let mut map = app.conversations.lock();
    if map.get(&key).is_some_and(|tx| tx.is_closed()) {
        map.remove(&key);
    }
}

/// The conversation's id, from which Hermes' session id derives.
pub(crate) fn conversation_id(ours: &str, theirs: &str) -> String {
    let digits = |n: &str| n.chars().filter(char::is_ascii_digit).collect::<String>();
    format!("sms-{}-{}", digits(ours), digits(theirs))
}

/// What the agent is told about answering by text.
fn sms_note(max_chars: usize) -> String {
    format!(
        "You are answering a text message (SMS), not a phone call. Reply in plain text, briefly \
         (at most {max_chars} characters), without markdown."
    )
}

/// Answers one message: a brain turn, then the answer by text message.
async fn answer(app: &Arc<App>, turn: Turn) {
    let generation = app.current();
    let config = &generation.config;
    let Some(agent) = config
        .agent(&turn.agent)
        .map(|a| crate::app::inbound::effective(app, &turn.ours).apply(a))
    else {
        warn!(agent = %turn.agent, "text message not answered: the agent is not configured");
        return;
    };
    let Some(providers) = generation.providers.for_agent(&agent) else {
        warn!(agent = %turn.agent, "text message not answered: the agent's brain is not available");
        return;
    };
    let stored = match app
        .store
        .messages(MessageFilter {
            pair: Some((turn.ours.clone(), turn.theirs.clone())),
            limit: HISTORY,
            ..MessageFilter::default()
        })
        .await
    {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "text message not answered: the conversation could not be read");
            return;
        }
    };
    let history: Vec<ChatMessage> = stored
        .iter()
        .rev()
        .filter(|m| m.direction == "inbound" || m.status == "sent")
        .map(|m| ChatMessage {
            role: if m.direction == "inbound" {
                Role::User
            } else {
                Role::Assistant
            },
            content: m.body.clone(),
        })
        .collect();
    if history.last().is_none_or(|m| m.role != Role::User) {
        return;
    }
    let id = conversation_id(&turn.ours, &turn.theirs);
    let max_chars = config.outbound.max_sms_chars;
    let prompt = crate::call::render_prompt(
        &agent.system_prompt,
        &[
            ("call_id", &id),
            ("caller", &turn.theirs),
            ("callee", &turn.ours),
            ("agent", &turn.agent),
        ],
    );
    let chat = ChatTurn {
        call_id: id,
        caller: crate::util::phone::known_number(&turn.theirs),
        system_prompt: format!("{prompt}\n\n{}", sms_note(max_chars)),
        history,
        history_limits: crate::provider::history::HistoryLimits::of(&agent),
        tools: None,
        call_token: None,
        trace: None,
    };
    let mut stream = providers.llm.stream(chat);
    let collect = async {
        let mut text = String::new();
        while let Some(event) = stream.events.recv().await {
            match event {
                LlmEvent::Delta(d) => text.push_str(&d),
                LlmEvent::Done => return Ok(text),
                LlmEvent::Error(e) => return Err(e),
                LlmEvent::Unavailable { message, .. } => return Err(message),
                _ => {}
            }
        }
        Ok(text)
    };
    let reply = match tokio::time::timeout(TURN_LIMIT, collect).await {
        Ok(Ok(t)) => t.trim().to_string(),
        Ok(Err(e)) => {
            warn!(message_id = %turn.message_id, error = %crate::security::truncate_for_log(&e, 200), "text message not answered: the brain failed");
            return;
        }
        Err(_) => {
            warn!(message_id = %turn.message_id, "text message not answered: the brain took too long");
            return;
        }
    };
    if reply.is_empty() {
        info!(message_id = %turn.message_id, "the agent answered nothing; no text message sent");
        return;
    }
    let body: String = if reply.chars().count() > max_chars {
        let mut b: String = reply.chars().take(max_chars.saturating_sub(1)).collect();
        b.push('…');
        b
    } else {
        reply
    };
    let sent = super::send(
        app,
        SendRequest {
            to: turn.theirs.clone(),
            body,
            sender: Sender::Reply {
                account: turn.account.clone(),
                ours: turn.ours.clone(),
                agent: turn.agent.clone(),
            },
        },
    )
    .await;
    if let Err(e) = sent {
        warn!(message_id = %turn.message_id, error = %e, "the agent's answer was not sent");
    }
}
