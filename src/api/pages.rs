//! The operator's web pages as HTML strings, each one self-contained file (inline CSS, no
//! scripts, no external assets): the list of recent calls, and a call's timeline (the caller's
//! and the agent's speech as lanes on a time axis, each turn's stage latencies as bars,
//! barge-ins, fillers, tool calls, transfers and errors as marks), from the call store. The
//! HTTP edge (`server::rest`) decides when a page is asked for and how a browser is let in.

use std::fmt::Write as _;
use std::sync::Arc;

use super::ApiError;
use crate::app::App;
use crate::store::{CallFilter, CallRow, EventRow, TurnRow};

/// The recent calls page.
pub(crate) async fn calls_html(app: &Arc<App>) -> Result<String, ApiError> {
    let calls = app
        .store
        .calls(CallFilter {
            limit: 100,
            ..CallFilter::default()
        })
        .await?;
    Ok(calls_page(&calls))
}

/// The timeline page of call `id`.
pub(crate) async fn timeline_html(app: &Arc<App>, id: &str) -> Result<String, ApiError> {
    let call = app
        .store
        .call(id)
        .await?
        .ok_or_else(|| ApiError::not_found(id))?;
    let turns = app.store.turns(id).await?;
    let events = app.store.events(id).await?;
    Ok(timeline_page(&call, &turns, &events))
}

/// A page saying what went wrong.
pub(crate) fn error_html(e: &ApiError) -> String {
    shell("Error", &format!("<p>{}</p>", esc(&e.body().to_string())))
}

/// HTML-escapes `s`.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = r#"
body{font:14px system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px} .sub{color:#5a6472;margin-bottom:16px}
table{border-collapse:collapse} td,th{padding:4px 10px;border-bottom:1px solid #e3e6ea;text-align:left}
.axis{position:relative;height:18px;margin-left:90px;border-bottom:1px solid #9aa3ad;font-size:11px;color:#5a6472}
.tick{position:absolute;top:0;transform:translateX(-50%)}
.lane{position:relative;height:34px;margin:6px 0 6px 90px;background:#f4f6f8;border-radius:4px}
.lane-label{position:absolute;left:-90px;width:84px;top:9px;font-weight:600;font-size:12px}
.seg{position:absolute;top:5px;height:24px;border-radius:3px;min-width:2px;overflow:hidden;white-space:nowrap;font-size:11px;color:#fff;padding:0 2px;box-sizing:border-box}
.seg.caller{background:#2b7bd6} .seg.agent{background:#e0672b} .seg.agent.interrupted{background:repeating-linear-gradient(45deg,#e0672b,#e0672b 6px,#b94d18 6px,#b94d18 12px)}
.mark{position:absolute;top:3px;width:4px;height:28px;border-radius:2px;transform:translateX(-2px)}
.mark.barge_in_commit{background:#c81e3c} .mark.barge_in_resume{background:#8a5cd6} .mark.filler{background:#d6a90f}
.mark.tool{background:#1e9a6a} .mark.transfer{background:#0f8fa6} .mark.error{background:#000}
.latency{margin:18px 0} .turn{display:flex;align-items:center;margin:6px 0} .row{display:flex;width:100%;margin:1px 0}
.turn-label{width:90px;flex:none;font-size:12px;font-weight:600} .rows{flex:1}
.bar{height:14px;border-radius:2px;margin-right:2px;min-width:2px}
.bar[data-stage=stt_final_to_brain_request]{background:#7aa6d9} .bar[data-stage=brain_first_token]{background:#4c9a52}
.bar[data-stage=tts_first_audio]{background:#c9862a} .bar[data-stage=reply_first_frame]{background:#6d4aa6}
.ms{font-size:11px;color:#5a6472;margin-left:6px}
.legend span{display:inline-block;margin-right:14px;font-size:12px} .sw{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px;vertical-align:middle}
"#;

fn shell(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · patterd</title>\
         <style>{STYLE}</style></head><body>{body}</body></html>\n",
        esc(title)
    )
}

/// What a call id must have escaped to be one path segment of a link in an HTML attribute:
/// everything but RFC 3986's unreserved characters and `:` / `@` (allowed in a segment that is
/// not the first of a relative reference; web call ids have `-`, Telnyx's `v3:`). The server
/// decodes the segment before matching it (`server::pages::page_for`).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'@');

/// `id` as one path segment.
pub(crate) fn encode_segment(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, SEGMENT).to_string()
}

fn calls_page(calls: &[CallRow]) -> String {
    let mut b = String::from(
        "<h1>Recent calls</h1><div class=\"sub\">Newest first; open a call for its timeline.</div>\
         <table id=\"calls\"><tr><th>Call</th><th>Direction</th><th>From</th><th>To</th><th>Agent</th>\
         <th>Status</th><th>Duration</th><th>Turns</th><th>Cost</th></tr>",
    );
    for c in calls {
        let id = esc(&c.call_id);
        let href = format!("calls/{}/timeline", encode_segment(&c.call_id));
        let _ = write!(
            b,
            "<tr class=\"call\"><td><a href=\"{href}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.direction),
            esc(&crate::security::mask_number(&c.from)),
            esc(&crate::security::mask_number(&c.to)),
            esc(&c.agent),
            esc(&c.status),
            c.duration_ms
                .map_or("-".into(), |d| format!("{:.1} s", d as f64 / 1000.0)),
            c.turns,
            c.cost_usd.map_or("-".into(), |x| format!("${x:.4}")),
        );
    }
    b.push_str("</table>");
    shell("Recent calls", &b)
}

/// A mark's class for an event kind shown on the marks lane.
fn mark_class(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "barge_in_commit" => "barge_in_commit",
        "barge_in_resume" => "barge_in_resume",
        "filler" => "filler",
        "tool_progress" => "tool",
        "stt_error" | "llm_error" | "tts_error" => "error",
        k if k.contains("tool") => "tool",
        k if k.contains("transfer") => "transfer",
        k if k.ends_with("_error") => "error",
        _ => return None,
    })
}

/// One caller turn's stages (ms), from the events between its turn end and the next.
struct TurnStages {
    stages: Vec<(&'static str, f64)>,
}

fn stages(events: &[EventRow]) -> Vec<TurnStages> {
    let mut out: Vec<TurnStages> = Vec::new();
    let mut turn_end: Option<i64> = None;
    // When the open turn's first token arrived (ms): its reply's synthesis is requested after.
    let mut first_token_at: Option<f64> = None;
    let us = |e: &EventRow| e.detail.parse::<f64>().ok().map(|v| v / 1000.0);
    for e in events {
        match e.kind.as_str() {
            "turn_end" => turn_end = Some(e.t_ms),
            "llm_request" => {
                first_token_at = None;
                let mut s = Vec::new();
                if let Some(t) = turn_end.take() {
                    s.push(("stt_final_to_brain_request", (e.t_ms - t).max(0) as f64));
                }
                out.push(TurnStages { stages: s });
            }
            "llm_first_token" => {
                if let (Some(t), Some(ms)) = (out.last_mut(), us(e))
                    && !t.stages.iter().any(|s| s.0 == "brain_first_token")
                {
                    t.stages.push(("brain_first_token", ms));
                    first_token_at = Some(e.t_ms as f64);
                }
            }
            "tts_first_audio" => {
                // A synthesis requested before the first token (the greeting's, a filler's) is
                // not this reply's; event times are whole ms, hence the 1 ms slack.
                if let (Some(t), Some(ms), Some(token)) = (out.last_mut(), us(e), first_token_at)
                    && e.t_ms as f64 - ms + 1.0 >= token
                    && !t.stages.iter().any(|s| s.0 == "tts_first_audio")
                {
                    t.stages.push(("tts_first_audio", ms));
                }
            }
            "reply_first_frame" => {
                if let (Some(t), Some(ms)) = (out.last_mut(), us(e))
                    && !t.stages.iter().any(|s| s.0 == "reply_first_frame")
                {
                    t.stages.push(("reply_first_frame", ms));
                }
            }
            _ => {}
        }
    }
    out
}

/// Where a time falls on the page's axis.
struct Scale {
    /// The last time shown (ms from the call's start; at least 1).
    end_t: i64,
}

impl Scale {
    fn pct(&self, t: i64) -> f64 {
        (t.clamp(0, self.end_t) as f64) * 100.0 / self.end_t as f64
    }
}

fn timeline_page(call: &CallRow, turns: &[TurnRow], events: &[EventRow]) -> String {
    let answered_t = events
        .iter()
        .find(|e| e.kind == "media_start")
        .map_or(0, |e| e.t_ms);
    let end_t = events
        .iter()
        .map(|e| e.t_ms)
        .chain(turns.iter().map(|t| answered_t + t.end_ms))
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = Scale { end_t };
    let mut b = String::new();
    timeline_header(&mut b, call);
    timeline_axis(&mut b, &scale);
    timeline_lanes(&mut b, &scale, turns, answered_t);
    timeline_marks(&mut b, &scale, events);
    turn_latencies(&mut b, events);
    shell(&format!("Call {}", call.call_id), &b)
}

/// The call's title line and the colours' legend.
fn timeline_header(b: &mut String, call: &CallRow) {
    let _ = write!(
        b,
        "<h1>Call {}</h1><div class=\"sub\">{} · {} → {} · agent {} · {} · {} turns{}</div>",
        esc(&call.call_id),
        esc(&call.direction),
        esc(&crate::security::mask_number(&call.from)),
        esc(&crate::security::mask_number(&call.to)),
        esc(&call.agent),
        esc(call.ended_reason.as_deref().unwrap_or(&call.status)),
        call.turns,
        call.cost_usd
            .map_or(String::new(), |c| format!(" · ${c:.4}")),
    );
    b.push_str(
        "<div class=\"legend\"><span><i class=\"sw\" style=\"background:#2b7bd6\"></i>caller</span>\
         <span><i class=\"sw\" style=\"background:#e0672b\"></i>agent</span>\
         <span><i class=\"sw\" style=\"background:#c81e3c\"></i>barge-in (committed)</span>\
         <span><i class=\"sw\" style=\"background:#8a5cd6\"></i>barge-in (resumed)</span>\
         <span><i class=\"sw\" style=\"background:#d6a90f\"></i>filler</span>\
         <span><i class=\"sw\" style=\"background:#1e9a6a\"></i>tool</span>\
         <span><i class=\"sw\" style=\"background:#0f8fa6\"></i>transfer</span>\
         <span><i class=\"sw\" style=\"background:#000\"></i>error</span></div>",
    );
}

/// The time axis: about ten ticks on round seconds.
fn timeline_axis(b: &mut String, scale: &Scale) {
    b.push_str("<div class=\"axis\" id=\"axis\">");
    let step_ms = [
        100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000, 300_000,
    ]
    .into_iter()
    .find(|s| scale.end_t / s <= 10)
    .unwrap_or(600_000);
    let mut t = 0;
    while t <= scale.end_t {
        let _ = write!(
            b,
            "<span class=\"tick\" style=\"left:{:.3}%\">{:.1} s</span>",
            scale.pct(t),
            t as f64 / 1000.0
        );
        t += step_ms;
    }
    b.push_str("</div>");
}

/// The caller's and the agent's lanes, one segment per transcript entry.
fn timeline_lanes(b: &mut String, scale: &Scale, turns: &[TurnRow], answered_t: i64) {
    for (lane, label) in [("caller", "Caller"), ("agent", "Agent")] {
        let _ = write!(
            b,
            "<div class=\"lane\" id=\"lane-{lane}\"><span class=\"lane-label\">{label}</span>"
        );
        for t in turns.iter().filter(|t| t.speaker == lane) {
            let (s, e) = (
                answered_t + t.start_ms,
                answered_t + t.end_ms.max(t.start_ms),
            );
            let text = if lane == "agent" {
                &t.heard_text
            } else {
                &t.text
            };
            let _ = write!(
                b,
                "<div class=\"seg {lane}{}\" data-seq=\"{}\" style=\"left:{:.3}%;width:{:.3}%\" title=\"{}\">{}</div>",
                if t.interrupted { " interrupted" } else { "" },
                t.seq,
                scale.pct(s),
                (scale.pct(e) - scale.pct(s)).max(0.2),
                esc(&t.text),
                esc(text),
            );
        }
        b.push_str("</div>");
    }
}

/// The events' lane: a mark for each event worth showing.
fn timeline_marks(b: &mut String, scale: &Scale, events: &[EventRow]) {
    b.push_str("<div class=\"lane\" id=\"lane-marks\"><span class=\"lane-label\">Events</span>");
    for e in events {
        if let Some(class) = mark_class(&e.kind) {
            let _ = write!(
                b,
                "<div class=\"mark {class}\" data-kind=\"{}\" style=\"left:{:.3}%\" title=\"{} at {:.2} s: {}\"></div>",
                esc(&e.kind),
                scale.pct(e.t_ms),
                esc(&e.kind),
                e.t_ms as f64 / 1000.0,
                esc(&e.detail),
            );
        }
    }
    b.push_str("</div>");
}

/// Per-turn stage latencies, on one scale.
fn turn_latencies(b: &mut String, events: &[EventRow]) {
    let turns_stages = stages(events);
    let widest = turns_stages
        .iter()
        .flat_map(|t| {
            let parts: f64 = t
                .stages
                .iter()
                .filter(|s| s.0 != "reply_first_frame")
                .map(|s| s.1)
                .sum();
            let whole = t
                .stages
                .iter()
                .find(|s| s.0 == "reply_first_frame")
                .map(|s| s.1);
            [Some(parts), whole].into_iter().flatten()
        })
        .fold(1.0, f64::max);
    b.push_str(
        "<div class=\"latency\" id=\"latency\"><h2 style=\"font-size:15px\">Turn latencies</h2>\
         <div class=\"legend\"><span><i class=\"sw\" style=\"background:#7aa6d9\"></i>turn end → brain request</span>\
         <span><i class=\"sw\" style=\"background:#4c9a52\"></i>brain first token</span>\
         <span><i class=\"sw\" style=\"background:#c9862a\"></i>TTS first audio</span>\
         <span><i class=\"sw\" style=\"background:#6d4aa6\"></i>turn end → reply first frame</span></div>",
    );
    for (i, t) in turns_stages.iter().enumerate() {
        let _ = write!(
            b,
            "<div class=\"turn\" data-turn=\"{}\"><span class=\"turn-label\">Turn {}</span><div class=\"rows\">",
            i + 1,
            i + 1
        );
        // The parts in sequence on the first row; the whole (turn end → reply first frame)
        // under them on the same scale.
        for row in [false, true] {
            b.push_str("<div class=\"row\">");
            for (stage, ms) in t
                .stages
                .iter()
                .filter(|s| (s.0 == "reply_first_frame") == row)
            {
                let _ = write!(
                    b,
                    "<div class=\"bar\" data-stage=\"{stage}\" data-ms=\"{ms:.1}\" style=\"width:{:.2}%\" title=\"{stage}: {ms:.0} ms\"></div>",
                    ms * 80.0 / widest
                );
            }
            b.push_str("</div>");
        }
        b.push_str("</div>");
        let reply = t
            .stages
            .iter()
            .find(|s| s.0 == "reply_first_frame")
            .map_or("-".into(), |s| format!("reply after {:.0} ms", s.1));
        let _ = write!(b, "<span class=\"ms\">{reply}</span></div>");
    }
    b.push_str("</div>");
}
