//! How much of a call's history a brain request carries: [`bound`] trims the chat messages of
//! one request to the agent's [`HistoryLimits`] (`max_history_turns`, `max_history_bytes`)
//! before it is sent. The history is cut only between caller turns — a turn is a `user`
//! message and everything after it up to the next one (the reply, an assistant message with
//! `tool_calls` and its `role: tool` results) — so the oldest turns go first, a tool call never
//! loses its result (which OpenAI-compatible servers refuse), the leading `system` messages
//! (the system prompt) always stay, and the newest turn is always sent.

use serde_json::Value;

/// The most history one brain request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Caller turns at most.
    pub max_turns: usize,
    /// Bytes of the serialised messages at most (the newest turn is sent even if larger).
    pub max_bytes: usize,
}

impl Default for HistoryLimits {
    /// The defaults of `[agents.X] max_history_turns` and `max_history_bytes`.
    fn default() -> Self {
        Self {
            max_turns: 40,
            max_bytes: 64 * 1024,
        }
    }
}

impl HistoryLimits {
    /// The limits of an agent's configuration.
    pub fn of(agent: &crate::config::AgentConfig) -> Self {
        Self {
            max_turns: usize::try_from(agent.max_history_turns).unwrap_or(usize::MAX),
            max_bytes: usize::try_from(agent.max_history_bytes).unwrap_or(usize::MAX),
        }
    }
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

/// `messages` (chat-completions messages: leading `system` ones, then the conversation)
/// trimmed to `limits`: whole caller turns are dropped, oldest first, until at most
/// `max_turns` remain and the messages serialise to at most `max_bytes` (or only the newest
/// turn is left). Anything before the first `user` message goes with the first drop.
pub fn bound(messages: Vec<Value>, limits: HistoryLimits) -> Vec<Value> {
    let pinned = messages.iter().take_while(|m| role(m) == "system").count();
    // Where each droppable unit starts: the preamble (if any), then each caller turn.
    let mut starts: Vec<usize> = Vec::new();
    for (i, m) in messages.iter().enumerate().skip(pinned) {
        if i == pinned || role(m) == "user" {
            starts.push(i);
        }
    }
    let turns = starts
        .iter()
        .filter(|&&i| role(&messages[i]) == "user")
        .count();
    let size = |m: &Value| serde_json::to_string(m).map_or(0, |s| s.len() + 1);
    let mut bytes: usize = messages.iter().map(size).sum();
    let mut turns_left = turns;
    let mut cut = 0; // units dropped
    while cut + 1 < starts.len()
        && (turns_left > limits.max_turns.max(1) || bytes > limits.max_bytes)
    {
        let (start, end) = (starts[cut], starts[cut + 1]);
        bytes -= messages[start..end].iter().map(size).sum::<usize>();
        if role(&messages[start]) == "user" {
            turns_left -= 1;
        }
        cut += 1;
    }
    if cut == 0 {
        return messages;
    }
    let from = starts[cut];
    let mut out = messages;
    out.drain(pinned..from);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn user(n: usize) -> Value {
        json!({"role": "user", "content": format!("question {n}")})
    }
    fn reply(n: usize) -> Value {
        json!({"role": "assistant", "content": format!("answer {n}")})
    }
    fn contents(m: &[Value]) -> Vec<String> {
        m.iter()
            .map(|m| match m["content"].as_str() {
                Some(c) => c.to_string(),
                None => format!("<{}>", role(m)),
            })
            .collect()
    }
    fn conversation(turns: usize) -> Vec<Value> {
        let mut m = vec![json!({"role": "system", "content": "You are the front desk."})];
        for n in 0..turns {
            m.push(user(n));
            m.push(reply(n));
        }
        m
    }

    #[test]
    fn the_oldest_turns_go_first_and_the_system_prompt_stays() {
        let limits = HistoryLimits {
            max_turns: 3,
            max_bytes: 1 << 20,
        };
        let out = bound(conversation(10), limits);
        assert_eq!(
            contents(&out),
            [
                "You are the front desk.",
                "question 7",
                "answer 7",
                "question 8",
                "answer 8",
                "question 9",
                "answer 9"
            ]
        );
        // Within the limits nothing changes.
        assert_eq!(bound(conversation(3), limits), conversation(3));
    }

    #[test]
    fn a_tool_call_keeps_its_result() {
        let mut m = conversation(0);
        m.push(user(0));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ]}));
        m.push(json!({"role": "tool", "tool_call_id": "c1", "content": "x".repeat(300)}));
        m.push(reply(0));
        m.push(user(1));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ]}));
        m.push(json!({"role": "tool", "tool_call_id": "c2", "content": "short"}));
        let whole: usize = m.iter().map(|v| v.to_string().len() + 1).sum();
        // A cap that forces one cut: the whole first turn goes, tool call and result together.
        let out = bound(
            m,
            HistoryLimits {
                max_turns: 40,
                max_bytes: whole - 10,
            },
        );
        assert_eq!(
            contents(&out),
            [
                "You are the front desk.",
                "question 1",
                "<assistant>",
                "short"
            ]
        );
        assert_eq!(out[2]["tool_calls"][0]["id"], "c2");
        assert_eq!(out[3]["tool_call_id"], "c2");
        // Every tool result follows the assistant message that called it.
        for (i, msg) in out.iter().enumerate() {
            if role(msg) == "tool" {
                assert!(
                    out[..i]
                        .iter()
                        .any(|a| a["tool_calls"][0]["id"] == msg["tool_call_id"])
                );
            }
        }
    }

    #[test]
    fn the_byte_cap_drops_old_turns_but_never_the_newest() {
        let mut m = conversation(50);
        let out = bound(
            m.clone(),
            HistoryLimits {
                max_turns: 1000,
                max_bytes: 400,
            },
        );
        let bytes: usize = out.iter().map(|v| v.to_string().len() + 1).sum();
        assert!(bytes <= 400, "{bytes} bytes");
        assert_eq!(out[0]["role"], "system");
        assert_eq!(out[1]["role"], "user", "it starts with a caller turn");
        assert_eq!(contents(&out).last().map(String::as_str), Some("answer 49"));
        // A newest turn larger than the cap is still sent, with the system prompt.
        m.push(json!({"role": "user", "content": "9".repeat(2000)}));
        let out = bound(
            m,
            HistoryLimits {
                max_turns: 1000,
                max_bytes: 400,
            },
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["role"], "system");
        assert_eq!(out[1]["content"].as_str().map(str::len), Some(2000));
    }

    #[test]
    fn a_preamble_before_the_first_caller_turn_goes_first() {
        let mut m = conversation(0);
        m.push(json!({"role": "assistant", "content": "Hello, how can I help?"}));
        for n in 0..3 {
            m.push(user(n));
            m.push(reply(n));
        }
        let limits = HistoryLimits {
            max_turns: 3,
            max_bytes: 1 << 20,
        };
        assert_eq!(bound(m.clone(), limits), m, "within the limits");
        let out = bound(
            m,
            HistoryLimits {
                max_turns: 2,
                ..limits
            },
        );
        assert_eq!(
            contents(&out),
            [
                "You are the front desk.",
                "question 1",
                "answer 1",
                "question 2",
                "answer 2"
            ]
        );
    }
}
