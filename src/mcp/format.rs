//! Text the MCP tools and resources return, built from the REST API's JSON. The layouts follow
//! patter-mcp so prompts written for it keep working: `Call to … completed.`,
//! `Call ID:`, `Outcome:`, `Status:`, `Duration: Ns`, `Transcript:` with `[role] text` lines.

use serde_json::Value;

use crate::store::now_ms;

pub(crate) fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn int_of(v: &Value, k: &str) -> Option<i64> {
    v.get(k).and_then(Value::as_i64)
}

/// Seconds: the stored duration, or the time since answer while live.
pub fn duration_s(v: &Value) -> i64 {
    match (int_of(v, "duration_ms"), int_of(v, "answered_at")) {
        (Some(d), _) => d / 1000,
        (None, Some(a)) => (now_ms() - a).max(0) / 1000,
        _ => 0,
    }
}

/// patter-mcp's status: answered and voicemail calls completed, the rest failed.
fn mcp_status(v: &Value) -> &'static str {
    match str_of(v, "outcome") {
        "answered" | "voicemail" => "completed",
        _ => "failed",
    }
}

/// `[role] text` lines (`user` is the other party, `assistant` the agent), or `(no transcript)`.
pub(crate) fn transcript_lines(v: &Value) -> String {
    let turns = v
        .get("transcript")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = String::new();
    for t in &turns {
        let agent = str_of(t, "speaker") == "agent";
        let heard = str_of(t, "heard_text");
        let text = if agent && !heard.is_empty() {
            heard
        } else {
            str_of(t, "text")
        };
        if text.trim().is_empty() {
            continue;
        }
        let role = if agent { "assistant" } else { "user" };
        out.push_str(&format!("[{role}] {text}"));
        if t.get("interrupted").and_then(Value::as_bool) == Some(true) {
            out.push_str(" (interrupted)");
        }
        out.push('\n');
    }
    if out.is_empty() {
        "(no transcript)\n".into()
    } else {
        out
    }
}

/// The result of a waited call (`make_call`; `call_third_party` without id and outcome).
pub(crate) fn call_result(v: &Value, with_id: bool) -> String {
    let status = mcp_status(v);
    let verb = if status == "completed" {
        "completed"
    } else {
        "ended"
    };
    let mut s = format!("Call to {} {verb}.\n", str_of(v, "to"));
    if with_id {
        s.push_str(&format!("Call ID: {}\n", str_of(v, "call_id")));
        s.push_str(&format!(
            "Outcome: {}\n",
            v.get("outcome").and_then(Value::as_str).unwrap_or("failed")
        ));
    }
    s.push_str(&format!("Status: {status}\n"));
    s.push_str(&format!("Duration: {}s\n", duration_s(v)));
    s.push_str("Transcript:\n");
    s.push_str(&transcript_lines(v));
    if with_id {
        s.push_str(&format!(
            "\nUse get_transcript with callId {} to see it again.",
            str_of(v, "call_id")
        ));
    }
    s
}

/// `make_call` with `wait: false`.
pub(crate) fn call_placed(v: &Value) -> String {
    format!(
        "Call to {} placed.\nCall ID: {}\nStatus: {}\nUse get_calls or get_transcript with this \
         call id to follow it; end_call hangs it up.",
        str_of(v, "to"),
        str_of(v, "call_id"),
        str_of(v, "status")
    )
}

/// `get_calls`.
pub(crate) fn calls_list(v: &Value) -> String {
    let calls = v
        .get("calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if calls.is_empty() {
        return "No calls yet. Use make_call to place one.".into();
    }
    let mut s = String::new();
    for c in &calls {
        let outbound = str_of(c, "direction") == "outbound";
        let dir = if outbound { "OUT" } else { "IN " };
        let (label, number) = if outbound {
            ("To", str_of(c, "to"))
        } else {
            ("From", str_of(c, "from"))
        };
        let live = c.get("ended_at").is_none_or(Value::is_null);
        let dur = if live {
            format!("{}s (ongoing)", duration_s(c))
        } else {
            format!("{}s", duration_s(c))
        };
        let cost = c.get("cost_usd").and_then(Value::as_f64).unwrap_or(0.0);
        s.push_str(&format!(
            "{dir} | {} | {}\n  {label}: {number} | Duration: {dur} | Cost: ${cost:.4} | Turns: {}\n",
            str_of(c, "status"),
            str_of(c, "call_id"),
            int_of(c, "turns").unwrap_or(0)
        ));
    }
    s
}

/// `get_transcript`.
pub fn transcript(v: &Value) -> String {
    let id = str_of(v, "call_id");
    let status = str_of(v, "status");
    if v.get("live").and_then(Value::as_bool) == Some(true)
        && matches!(status, "queued" | "ringing" | "in-progress")
    {
        let partial = transcript_lines(v);
        return format!(
            "Call {id} is still {status}; the transcript so far:\n{partial}Call get_transcript \
             again when it has ended."
        );
    }
    let turns = v
        .get("transcript")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if turns == 0 {
        return format!("Call {id} has no transcript (status {status}).");
    }
    let outbound = str_of(v, "direction") == "outbound";
    let party = if outbound {
        format!("To: {}", str_of(v, "to"))
    } else {
        format!("From: {}", str_of(v, "from"))
    };
    format!(
        "Call: {id}\nDirection: {}\n{party}\nDuration: {}s\nTurns: {turns}\n---\n{}",
        str_of(v, "direction"),
        duration_s(v),
        transcript_lines(v)
    )
}

fn metric_lines(m: &Value) -> String {
    let f = |k: &str| match m.get(k) {
        Some(Value::Number(n)) => n
            .as_f64()
            .map(|x| format!("{x:.0}"))
            .unwrap_or_else(|| n.to_string()),
        _ => "-".into(),
    };
    format!(
        "Calls: {} (answered {})\nTurns: {} (caller {}, agent {}, interrupted {})\n\
         Duration total: {}s\nResponse latency ms: avg {}, p50 {}, max {}\n\
         Greeting latency ms: avg {}\nFillers: {}\nErrors: llm {}, tts {}, stt {}\n\
         Cost: ${:.4}\n",
        f("calls"),
        f("answered"),
        f("turns"),
        f("caller_turns"),
        f("agent_turns"),
        f("interruptions"),
        f("duration_s_total"),
        f("response_latency_ms_avg"),
        f("response_latency_ms_p50"),
        f("response_latency_ms_max"),
        f("greeting_latency_ms_avg"),
        f("fillers"),
        f("llm_errors"),
        f("tts_errors"),
        f("stt_errors"),
        m.get("cost_usd_total")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
    )
}

/// `get_metrics`.
pub fn metrics(v: &Value) -> String {
    let m = v.get("metrics").cloned().unwrap_or(Value::Null);
    match v.get("call_id").and_then(Value::as_str) {
        Some(id) => format!("Metrics for call {id}:\n{}", metric_lines(&m)),
        None => format!(
            "Totals over stored calls (live now: {}):\n{}",
            int_of(v, "live_calls").unwrap_or(0),
            metric_lines(&m)
        ),
    }
}

/// `configure_inbound`.
pub fn inbound(v: &Value) -> String {
    let number = str_of(v, "number");
    let who = if number == "*" {
        "all numbers".to_string()
    } else {
        number.to_string()
    };
    let o = v.get("override").cloned().unwrap_or(Value::Null);
    let show = |k: &str| match o.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => "(configured default)".into(),
    };
    format!(
        "Inbound calls to {who} now use:\nSystem prompt: {}\nFirst message: {}\nVoice: {}\n\
         Enabled: {}\nThe change is saved and survives a restart.",
        show("systemPrompt"),
        show("firstMessage"),
        show("voice"),
        show("enabled")
    )
}

/// `patter://dashboard`.
pub fn dashboard(calls: &Value, metrics: &Value) -> String {
    let list = calls
        .get("calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let live: Vec<&Value> = list
        .iter()
        .filter(|c| c.get("ended_at").is_none_or(Value::is_null))
        .collect();
    let mut s = String::from("# patterd dashboard\n\n## Active calls\n\n");
    if live.is_empty() {
        s.push_str("None.\n");
    }
    for c in &live {
        s.push_str(&format!(
            "- {} {} → {} ({}, {}s)\n",
            str_of(c, "call_id"),
            str_of(c, "from"),
            str_of(c, "to"),
            str_of(c, "status"),
            duration_s(c)
        ));
    }
    s.push_str("\n## Recent calls\n\n| Call | Direction | From | To | Status | Outcome | Duration | Turns |\n|---|---|---|---|---|---|---|---|\n");
    for c in &list {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {}s | {} |\n",
            str_of(c, "call_id"),
            str_of(c, "direction"),
            str_of(c, "from"),
            str_of(c, "to"),
            str_of(c, "status"),
            c.get("outcome").and_then(Value::as_str).unwrap_or("-"),
            duration_s(c),
            int_of(c, "turns").unwrap_or(0)
        ));
    }
    s.push_str("\n## Totals\n\n");
    s.push_str(&metric_lines(
        &metrics.get("metrics").cloned().unwrap_or(Value::Null),
    ));
    s
}

/// `patter://call/{callId}`.
pub(crate) fn call_detail(v: &Value) -> String {
    let mut s = format!("# Call {}\n\n", str_of(v, "call_id"));
    for k in [
        "direction",
        "from",
        "to",
        "agent",
        "status",
        "outcome",
        "answered_by",
        "ended_reason",
    ] {
        if let Some(x) = v.get(k).and_then(Value::as_str) {
            s.push_str(&format!("- {k}: {x}\n"));
        }
    }
    s.push_str(&format!("- duration: {}s\n", duration_s(v)));
    s.push_str(&format!(
        "- cost: ${:.4}\n\n## Transcript\n\n",
        v.get("cost_usd").and_then(Value::as_f64).unwrap_or(0.0)
    ));
    s.push_str(&transcript_lines(v));
    s
}
