//! The checks of `[[webhooks]]`, `[webhook_delivery]` and `[agents.X.summary]`: a URL the SSRF
//! guard lets through (loopback and private ones only with `allow_loopback`), each URL once, at
//! least one event, a signing secret the Standard Webhooks libraries can use, agents that
//! exist, a retry schedule that makes sense; a summary's brain that exists and a schema that
//! compiles.

use std::collections::HashMap;

use super::Check;
use crate::config::Config;
use crate::net::{ssrf, webhook_sign};

pub(super) fn check(c: &mut Check, config: &Config) {
    let mut urls: HashMap<&str, usize> = HashMap::new();
    for (i, w) in config.webhooks.iter().enumerate() {
        let idx = i.to_string();
        let at = format!("[[webhooks]] entry {}", i + 1);
        if let Err(e) = ssrf::check_url(&w.url, w.allow_loopback) {
            c.fail(
                &["webhooks", &idx, "url"],
                format!("{at} url = {:?}: {e}", w.url),
            );
        } else if let Some(first) = urls.insert(w.url.trim(), i) {
            c.fail(
                &["webhooks", &idx, "url"],
                format!(
                    "{at} url {:?} is already [[webhooks]] entry {}; each URL may appear once \
                     (list every event and agent it wants in one entry)",
                    w.url,
                    first + 1
                ),
            );
            urls.insert(w.url.trim(), first);
        }
        if w.events.is_empty() {
            c.fail(
                &["webhooks", &idx, "events"],
                format!("{at} events is empty; name what it wants, e.g. events = [\"call.ended\"]"),
            );
        }
        if let Err(e) = webhook_sign::key(w.secret.expose()) {
            c.fail(&["webhooks", &idx, "secret"], format!("{at} secret {e}"));
        }
        if let Some(previous) = &w.previous_secret
            && let Err(e) = webhook_sign::key(previous.expose())
        {
            c.fail(
                &["webhooks", &idx, "previous_secret"],
                format!("{at} previous_secret {e}"),
            );
        }
        for (j, agent) in w.agents.iter().enumerate() {
            c.reference(
                &["webhooks", &idx, "agents", &j.to_string()],
                "agents",
                agent,
                &config.agents,
            );
        }
    }
    for (name, agent) in &config.agents {
        let Some(sm) = &agent.summary else { continue };
        c.reference(
            &["agents", name, "summary", "llm"],
            "llm",
            &sm.llm,
            &config.llm,
        );
        if let Some(schema) = &sm.schema
            && let Err(e) = crate::config::tools::compile_schema(schema)
        {
            c.fail(
                &["agents", name, "summary", "schema"],
                format!("[agents.{name}.summary] schema: {e}"),
            );
        }
        c.at_least_one(&["agents", name, "summary", "timeout_s"], sm.timeout_s);
    }
    let d = &config.webhook_delivery;
    c.at_least_one(&["webhook_delivery", "timeout_s"], d.timeout_s);
    c.at_least_one(&["webhook_delivery", "retry_base_ms"], d.retry_base_ms);
    c.at_least_one(&["webhook_delivery", "give_up_after_s"], d.give_up_after_s);
    c.at_least_one(&["webhook_delivery", "poll_ms"], d.poll_ms);
    if !(1..=256).contains(&d.concurrency) {
        c.fail(
            &["webhook_delivery", "concurrency"],
            format!(
                "[webhook_delivery] concurrency = {} must be 1 to 256",
                d.concurrency
            ),
        );
    }
    if d.retry_max_ms < d.retry_base_ms {
        c.fail(
            &["webhook_delivery", "retry_max_ms"],
            format!(
                "[webhook_delivery] retry_max_ms = {} is below retry_base_ms = {}; the longest \
                 wait between attempts cannot be shorter than the first",
                d.retry_max_ms, d.retry_base_ms
            ),
        );
    }
}
