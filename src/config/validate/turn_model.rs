//! Checks of `[turn_model.NAME]` sections and the agents naming them: the feature compiled in,
//! the library and model files present, the numbers in range.

use super::Check;
use crate::config::schema::Config;

/// How an operator gets the files (docs/configuration.md, "Smart Turn").
const HOW_TO_GET: &str = "get them with `pip download --no-deps onnxruntime==1.32.0 \
     pipecat-ai==1.14.0` and unzip onnxruntime/capi/libonnxruntime.so.1.32.0 and \
     pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx (docs/configuration.md, \
     \"Smart Turn\"; tests/models/setup.sh does it)";

pub(super) fn check(c: &mut Check<'_>, config: &Config) {
    for (name, agent) in &config.agents {
        if let Some(model) = &agent.turn_model
            && !config.turn_model.contains_key(model)
        {
            let known: Vec<&str> = config.turn_model.keys().map(String::as_str).collect();
            c.fail(
                &["agents", name, "turn_model"],
                format!(
                    "[agents.{name}] turn_model = {model:?} names no [turn_model.{model}] section \
                     ({}); add one with kind = \"smart_turn\", library and model, or remove the key",
                    if known.is_empty() {
                        "there are none".to_string()
                    } else {
                        format!("known: {}", known.join(", "))
                    }
                ),
            );
        }
    }
    for (name, m) in &config.turn_model {
        if !cfg!(feature = "smart_turn") {
            c.fail(
                &["turn_model", name],
                format!(
                    "[turn_model.{name}] needs Smart Turn, which this patterd was built without; \
                     rebuild with `cargo build --release --features smart_turn`, or remove the \
                     section"
                ),
            );
            continue;
        }
        for (key, path) in [("library", &m.library), ("model", &m.model)] {
            if !path.is_file() {
                c.fail(
                    &["turn_model", name, key],
                    format!(
                        "[turn_model.{name}] {key} = {:?} is not a file; {HOW_TO_GET}",
                        path.display().to_string()
                    ),
                );
            }
        }
        if !(m.threshold > 0.0 && m.threshold < 1.0) {
            c.fail(
                &["turn_model", name, "threshold"],
                format!(
                    "[turn_model.{name}] threshold = {} must be between 0 and 1, e.g. 0.5",
                    m.threshold
                ),
            );
        }
        for (key, value, lo, hi) in [
            ("queue", m.queue, 1, 256),
            ("answer_timeout_ms", m.answer_timeout_ms, 10, 5000),
            ("finalize_grace_ms", m.finalize_grace_ms, 0, 5000),
            ("incomplete_hold_ms", m.incomplete_hold_ms, 0, 60000),
        ] {
            if !(lo..=hi).contains(&value) {
                c.fail(
                    &["turn_model", name, key],
                    format!("[turn_model.{name}] {key} = {value} must be {lo}–{hi}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::load_str_with_vars;

    fn errors(extra: &str) -> String {
        let text = format!(
            "[stt.e]\nkind = \"deepgram\"\napi_key = \"k\"\n[tts.v]\nkind = \"elevenlabs\"\n\
             api_key = \"k\"\nvoice_id = \"x\"\n[llm.b]\nkind = \"hermes\"\n\
             [agents.a]\nllm = \"b\"\nstt = \"e\"\ntts = \"v\"\n{extra}"
        );
        match load_str_with_vars(&text, "p.toml", &[]) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_agent_naming_no_section_is_told_what_to_add() {
        let e = errors("turn_model = \"smart_turn\"\n");
        assert!(
            e.contains("turn_model = \"smart_turn\" names no [turn_model.smart_turn] section"),
            "{e}"
        );
    }

    #[test]
    fn a_section_is_checked_against_the_build_and_the_files() {
        let e = errors(
            "turn_model = \"st\"\n[turn_model.st]\nkind = \"smart_turn\"\n\
             library = \"/nonexistent/libonnxruntime.so\"\nmodel = \"/nonexistent/m.onnx\"\n\
             threshold = 1.5\n",
        );
        if cfg!(feature = "smart_turn") {
            assert!(e.contains("library = \"/nonexistent/libonnxruntime.so\" is not a file; get them with `pip download"), "{e}");
            assert!(
                e.contains("model = \"/nonexistent/m.onnx\" is not a file"),
                "{e}"
            );
            assert!(e.contains("threshold = 1.5 must be between 0 and 1"), "{e}");
        } else {
            assert!(
                e.contains("rebuild with `cargo build --release --features smart_turn`"),
                "{e}"
            );
        }
        assert!(!e.contains("names no [turn_model"), "{e}");
    }
}
