//! Reload without dropping calls, against the real binary: SIGHUP re-reads the file; a live
//! call keeps the system prompt it started with while the next call gets the new one; a
//! broken file is refused (logged, counted) and changes nothing.

use std::time::Duration;

use patterd_sim::hermes::HermesReply;

use crate::common::daemon::{Daemon, Fakes};
use crate::common::{API_TOKEN, SYSTEM_PROMPT, WAIT, api_client, speak};

const NEW_PROMPT: &str = "You are the reloaded agent.";

/// Waits (off the runtime thread) for a log line containing `needle`.
async fn line(d: Daemon, needle: &'static str) -> (Option<String>, Daemon) {
    tokio::task::spawn_blocking(move || (d.wait_line(needle, WAIT), d))
        .await
        .expect("join")
}

/// The system prompt of the Hermes request number `i` (0-based).
fn prompt_of(fakes: &Fakes, i: usize) -> String {
    let r = fakes.hermes.record();
    let body = &r.requests[i].body;
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "system"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

async fn reloads(d: &Daemon) -> String {
    let text = api_client(API_TOKEN)
        .get(d.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    text.lines()
        .filter(|l| l.starts_with("patterd_config_reloads_total{"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn sighup_applies_to_new_calls_live_calls_keep_theirs_and_a_broken_file_changes_nothing() {
    let fakes = Fakes::start(vec![
        "one".into(),
        "two".into(),
        "three".into(),
        "four".into(),
    ])
    .await;
    for r in ["First.", "Second.", "Third.", "Fourth."] {
        fakes.hermes.push(HermesReply::text(r));
    }
    let text = fakes.config_text();
    assert!(text.contains(SYSTEM_PROMPT));
    let d = Daemon::start(&text);
    let path = d.data_dir().join("patter.toml");

    // A live call takes a turn with the first prompt.
    let (_, live) = d.call().await;
    live.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    speak(&live, 700);
    fakes
        .hermes
        .wait_until("turn 1", |r| !r.requests.is_empty())
        .await;
    live.wait_for("reply 1", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("reply 1");
    assert!(prompt_of(&fakes, 0).contains(SYSTEM_PROMPT));

    // Reload with a new prompt.
    std::fs::write(&path, text.replace(SYSTEM_PROMPT, NEW_PROMPT)).expect("rewrite");
    d.signal(libc::SIGHUP);
    let (found, d) = line(d, "configuration reloaded").await;
    assert!(found.is_some(), "no reload log line");

    // The live call keeps its prompt.
    speak(&live, 700);
    fakes
        .hermes
        .wait_until("turn 2", |r| r.requests.len() >= 2)
        .await;
    assert!(
        prompt_of(&fakes, 1).contains(SYSTEM_PROMPT),
        "{}",
        prompt_of(&fakes, 1)
    );

    // The next call gets the new one.
    let (_, next) = d.call().await;
    next.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting 2");
    speak(&next, 700);
    fakes
        .hermes
        .wait_until("turn 3", |r| r.requests.len() >= 3)
        .await;
    assert!(
        prompt_of(&fakes, 2).contains(NEW_PROMPT),
        "{}",
        prompt_of(&fakes, 2)
    );
    assert!(reloads(&d).await.contains("result=\"applied\"} 1"));

    // A broken file is refused; the new prompt stays in force.
    std::fs::write(&path, "[agents.front-desk]\nllm = 12\n").expect("break");
    d.signal(libc::SIGHUP);
    let (found, d) = line(d, "configuration reload refused").await;
    assert!(found.is_some_and(|l| l.contains("llm")), "no refusal line");
    let counts = reloads(&d).await;
    assert!(
        counts.contains("result=\"applied\"} 1") && counts.contains("result=\"refused\"} 1"),
        "{counts}"
    );
    let (_, third) = d.call().await;
    third
        .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting 3");
    speak(&third, 700);
    fakes
        .hermes
        .wait_until("turn 4", |r| r.requests.len() >= 4)
        .await;
    assert!(
        prompt_of(&fakes, 3).contains(NEW_PROMPT),
        "{}",
        prompt_of(&fakes, 3)
    );
    // The live calls are still up.
    assert!(
        live.wait_for("still up", Duration::from_millis(1), |s| !s.is_closed())
            .await
            .is_ok()
    );
    drop(d);
}
