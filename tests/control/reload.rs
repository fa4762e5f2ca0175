//! Reload without dropping calls, against the real binary: SIGHUP re-reads the file; a live
//! call keeps the system prompt it started with while the next call gets the new one; a
//! broken file is refused (logged, counted) and changes nothing. A rotated `api_token` is in
//! force at once (bearer, phone links, page cookies), and a rotated carrier secret, which needs
//! a restart, is named in a warning.

use std::time::Duration;

use patterd_sim::hermes::HermesReply;

use crate::common::daemon::{Daemon, Fakes};
use crate::common::{API_TOKEN, AUTH_TOKEN, Opts, SYSTEM_PROMPT, Stack, WAIT, api_client, speak};

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

const NEW_TOKEN: &str = "patterd-rotated-api-token-0123456789";

/// The status of `GET /v1/calls` with `token`.
async fn calls_status(d: &Daemon, token: &str) -> u16 {
    api_client(token)
        .get(d.url("/v1/calls"))
        .send()
        .await
        .expect("GET /v1/calls")
        .status()
        .as_u16()
}

#[tokio::test]
async fn sighup_rotates_the_api_token_and_names_a_changed_carrier_secret() {
    let fakes = Fakes::start(Vec::new()).await;
    let text = fakes.config_text();
    assert!(text.contains(API_TOKEN) && text.contains(AUTH_TOKEN));
    let d = Daemon::start(&text);
    let path = d.data_dir().join("patter.toml");
    assert_eq!(calls_status(&d, API_TOKEN).await, 200);
    assert_eq!(calls_status(&d, NEW_TOKEN).await, 401);

    let new_auth = "twilio-rotated-auth-token-0123";
    std::fs::write(
        &path,
        text.replace(API_TOKEN, NEW_TOKEN)
            .replace(AUTH_TOKEN, new_auth),
    )
    .expect("rewrite");
    d.signal(libc::SIGHUP);
    // The carrier secret needs a restart: a warning names the key, never the value.
    let (warned, d) = line(d, "carriers.twilio.auth_token changed").await;
    let warned = warned.expect("no warning naming carriers.twilio.auth_token");
    assert!(warned.contains("restart"), "{warned}");
    assert!(
        !warned.contains(new_auth) && !warned.contains(AUTH_TOKEN),
        "{warned}"
    );
    let (rotated, d) = line(d, "server.api_token changed").await;
    assert!(
        rotated.is_some_and(|l| !l.contains(NEW_TOKEN)),
        "no rotation line"
    );
    let (found, d) = line(d, "configuration reloaded").await;
    assert!(found.is_some(), "no reload log line");

    // The new token is in force at once; the old one is refused.
    assert_eq!(calls_status(&d, NEW_TOKEN).await, 200);
    assert_eq!(calls_status(&d, API_TOKEN).await, 401);
    // The carrier keeps the credentials it started with: a webhook signed with the old
    // auth token still opens a call.
    let (_, call) = d.call().await;
    call.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("a call under the running carrier credentials");
}

/// The phone-link key and the page cookie derive from the token in force: after a rotation,
/// links and cookies made with the old token are refused and the new token's work. The
/// configuration, providers, tools and link key a reader gets are always of one reload.
#[tokio::test]
async fn a_rotated_token_invalidates_old_links_and_page_cookies() {
    use patterd::security::link::unix_now;
    let stack = Stack::start(Opts::default()).await;
    let app = stack.server.app.clone();
    let old_link = app
        .phone_links()
        .expect("link key")
        .mint("front-desk", unix_now() + 60)
        .0;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let page = |q: String, cookie: Option<String>| {
        let mut r = client
            .get(format!("{}/v1/calls{q}", stack.base))
            .header("Accept", "text/html");
        if let Some(c) = cookie {
            r = r.header("Cookie", c);
        }
        r.send()
    };
    let exchanged = page(format!("?token={API_TOKEN}"), None)
        .await
        .expect("GET");
    assert_eq!(exchanged.status(), 303);
    let old_cookie = exchanged.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        page(String::new(), Some(old_cookie.clone()))
            .await
            .expect("GET")
            .status(),
        200
    );

    let mut rotated = (*app.config()).clone();
    rotated.server.api_token = patterd::config::schema::Secret::new(NEW_TOKEN);
    let done = app.reload(rotated).expect("reload");
    assert!(done.token_rotated);
    assert!(done.needs_restart.is_empty(), "{:?}", done.needs_restart);
    let generation = app.current();
    assert_eq!(generation.config.server.api_token.expose(), NEW_TOKEN);
    assert_eq!(
        generation.tools.keys().collect::<Vec<_>>(),
        generation.config.agents.keys().collect::<Vec<_>>()
    );

    // The old link, cookie and token are refused; the new token's work.
    let phone = |link: String| {
        client
            .get(format!("{}/phone?link={link}", stack.base))
            .send()
    };
    assert_eq!(phone(old_link).await.expect("GET").status(), 403);
    let new_link = app
        .phone_links()
        .expect("link key")
        .mint("front-desk", unix_now() + 60)
        .0;
    assert_eq!(phone(new_link).await.expect("GET").status(), 200);
    assert_ne!(
        page(String::new(), Some(old_cookie))
            .await
            .expect("GET")
            .status(),
        200
    );
    assert_eq!(
        page(format!("?token={API_TOKEN}"), None)
            .await
            .expect("GET")
            .status(),
        401
    );
    let exchanged = page(format!("?token={NEW_TOKEN}"), None)
        .await
        .expect("GET");
    assert_eq!(exchanged.status(), 303);
    let bearer = |t: &str| {
        client
            .get(format!("{}/v1/calls", stack.base))
            .header("Authorization", format!("Bearer {t}"))
            .send()
    };
    assert_eq!(bearer(API_TOKEN).await.expect("GET").status(), 401);
    assert_eq!(bearer(NEW_TOKEN).await.expect("GET").status(), 200);
}
