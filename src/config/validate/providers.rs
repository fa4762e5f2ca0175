//! The `[llm.*]`, `[stt.*]`, `[tts.*]` and `[carriers.*]` sections' checks: each entry's kind,
//! URLs, keys and limits, as the daemon will use them.

use super::*;
use crate::config::schema::{SttConfig, SttKind};

/// `[llm.NAME]`: the brains.
pub(super) fn llms(c: &mut Check, config: &Config) {
    for (name, llm) in &config.llm {
        c.url(
            &["llm", name, "base_url"],
            llm.effective_base_url(),
            &["http", "https"],
            "http://127.0.0.1:8642/v1",
        );
        if llm.effective_model().is_empty() {
            c.fail(
                &["llm", name, "model"],
                format!(
                    "[llm.{name}] needs a model: the name the server serves (e.g. \"llama3.2\" \
                     for Ollama, the model given to `vllm serve`, the identifier LM Studio shows)"
                ),
            );
        }
        if llm.preset.is_some() && llm.kind != LlmKind::OpenaiCompatible {
            c.fail(
                &["llm", name, "preset"],
                format!("[llm.{name}] preset is only for kind = \"openai_compatible\""),
            );
        }
        if llm.session_key.is_some() && llm.session_key_from.is_some() {
            c.fail(
                &["llm", name, "session_key"],
                format!(
                    "[llm.{name}] sets both session_key and session_key_from; keep one \
                     (a fixed key, or one derived from the caller)"
                ),
            );
        }
        let secret = llm.session_key_secret.expose().trim();
        if !secret.is_empty() && secret.chars().count() < 32 {
            c.fail(
                &["llm", name, "session_key_secret"],
                format!(
                    "[llm.{name}] session_key_secret is shorter than 32 characters; use a random \
                     one (e.g. `openssl rand -hex 32`): it keys every caller's memory scope"
                ),
            );
        }
        if let Some(t) = llm.timeout_s {
            c.at_least_one(&["llm", name, "timeout_s"], t);
        }
        c.at_least_one(
            &["llm", name, "first_token_timeout_s"],
            llm.first_token_timeout_s,
        );
        c.at_least_one(&["llm", name, "connect_timeout_s"], llm.connect_timeout_s);
    }
}

/// `[stt.NAME]`: speech-to-text.
pub(super) fn stts(c: &mut Check, config: &Config) {
    for (name, stt) in &config.stt {
        if stt.kind == SttKind::Whisper {
            whisper(c, name, stt);
            continue;
        }
        c.url(
            &["stt", name, "base_url"],
            stt.effective_base_url(),
            &["http", "https", "ws", "wss"],
            stt.kind.default_base_url(),
        );
        let range = |c: &mut Check, key: &str, v: Option<f64>, lo: f64, hi: f64| {
            if let Some(v) = v
                && !(lo..=hi).contains(&v)
            {
                c.fail(
                    &["stt", name, key],
                    format!("[stt.{name}] {key} = {v} is out of range {lo} to {hi}"),
                );
            }
        };
        range(
            c,
            "eot_threshold",
            stt.eot_threshold.map(f64::from),
            0.5,
            0.9,
        );
        range(
            c,
            "eager_eot_threshold",
            stt.eager_eot_threshold.map(f64::from),
            0.3,
            0.9,
        );
        range(
            c,
            "eot_timeout_ms",
            stt.eot_timeout_ms.map(f64::from),
            500.0,
            10000.0,
        );
        if let (Some(e), Some(t)) = (stt.eager_eot_threshold, stt.eot_threshold)
            && e > t
        {
            c.fail(
                &["stt", name, "eager_eot_threshold"],
                format!(
                    "[stt.{name}] eager_eot_threshold = {e} must not exceed eot_threshold = {t}"
                ),
            );
        }
        if stt.effective_model().is_empty() {
            c.fail(
                &["stt", name, "model"],
                format!(
                    "[stt.{name}] needs a model: the name the server knows it by (e.g. \
                     \"Systran/faster-whisper-small\" for speaches, \"whisper-1\" for OpenAI; \
                     whisper.cpp's server ignores it)"
                ),
            );
        }
    }
}

/// `[stt.NAME] kind = "whisper"`: in-process, so no URL, key or server model; a model file
/// and the decoder pool's bounds instead.
fn whisper(c: &mut Check, name: &str, stt: &SttConfig) {
    if !cfg!(feature = "whisper") {
        c.fail(
            &["stt", name, "kind"],
            format!(
                "[stt.{name}] kind = \"whisper\" needs a patterd built with the cargo feature \
                 `whisper` (cargo build --release --features whisper); use another kind or \
                 rebuild"
            ),
        );
    }
    if stt.model_path.trim().is_empty() {
        c.fail(
            &["stt", name, "model_path"],
            format!(
                "[stt.{name}] kind = \"whisper\" needs model_path: the ggml model file that \
                 scripts/setup/whisper.sh prints as PATTERD_WHISPER_MODEL"
            ),
        );
    }
    for (key, set) in [
        ("api_key", !stt.api_key.is_empty()),
        ("base_url", !stt.base_url.trim().is_empty()),
    ] {
        if set {
            c.fail(
                &["stt", name, key],
                format!("[stt.{name}] kind = \"whisper\" runs in-process and takes no {key}"),
            );
        }
    }
    if let Some(t) = stt.threads
        && !(1..=64).contains(&t)
    {
        c.fail(
            &["stt", name, "threads"],
            format!("[stt.{name}] threads = {t} is out of range 1 to 64 (unset: one per core)"),
        );
    }
    if let Some(q) = stt.queue
        && q > 1000
    {
        c.fail(
            &["stt", name, "queue"],
            format!("[stt.{name}] queue = {q} is out of range 0 to 1000"),
        );
    }
}

/// `[tts.NAME]`: text-to-speech.
pub(super) fn ttss(c: &mut Check, config: &Config) {
    for (name, tts) in &config.tts {
        super::local_tts::check(c, name, tts);
        if !tts.kind.is_local() {
            c.url(
                &["tts", name, "base_url"],
                &tts.base_url,
                &["http", "https", "ws", "wss"],
                tts.kind.default_base_url(),
            );
        }
        if let Some(l) = tts.optimize_streaming_latency
            && l > 4
        {
            c.fail(
                &["tts", name, "optimize_streaming_latency"],
                format!("[tts.{name}] optimize_streaming_latency = {l} is out of range 0 to 4"),
            );
        }
        if tts.transport == crate::config::schema::TtsTransport::Websocket
            && tts.kind != crate::config::schema::TtsKind::Elevenlabs
        {
            c.fail(
                &["tts", name, "transport"],
                format!(
                    "[tts.{name}] transport = \"websocket\" is for kind = \"elevenlabs\" only \
                     (remove it: this kind has one transport)"
                ),
            );
        }
    }
}

/// `[carriers.NAME]`: the accounts' REST roots.
pub(super) fn carriers(c: &mut Check, config: &Config) {
    for (name, carrier) in &config.carriers {
        if let Some(u) = carrier.api_base_url() {
            c.url(
                &["carriers", name, "api_base_url"],
                u,
                &["http", "https"],
                carrier.default_api_base(),
            );
        }
    }
}
