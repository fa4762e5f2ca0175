//! The checks of a `session.update` (the GA transcription shape), field by field as the
//! service makes them: the first unknown key is `unknown_parameter` with its path, a bad value
//! `invalid_value` naming its `param`.

use serde_json::{Map, Value, json};

const MODELS: &[&str] = &[
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
    "gpt-transcribe",
    "whisper-1",
];

/// The input settings `session.update` chose.
#[derive(Debug, Clone)]
pub(super) struct Input {
    pub(super) pcmu: bool,
    /// `None`: no server VAD (the client commits).
    pub(super) silence_ms: Option<u64>,
}

/// An `error` event's inner object for a client event.
pub(super) fn invalid(code: &str, message: &str, param: &str, event_id: &Value) -> Value {
    json!({
        "type": "invalid_request_error", "code": code, "message": message,
        "param": param, "event_id": event_id,
    })
}

/// Checks `keys` of `obj` against `allowed`; the first unknown one as an error.
fn unknown_key(obj: &Map<String, Value>, allowed: &[&str], path: &str) -> Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("{path}.{k}")),
        None => Ok(()),
    }
}

/// A refused `session.update`: (code, message, param).
pub(super) type Refusal = (String, String, String);

fn unknown(p: String) -> Refusal {
    (
        "unknown_parameter".to_string(),
        format!("Unknown parameter: '{p}'."),
        p,
    )
}

fn bad(p: &str, m: &str) -> Refusal {
    ("invalid_value".to_string(), m.to_string(), p.to_string())
}

/// Validates a `session.update`'s `session` (GA transcription shape); the error is
/// (code, message, param).
pub(super) fn check_session(session: &Value) -> Result<Input, Refusal> {
    let Some(s) = session.as_object() else {
        return Err((
            "missing_required_parameter".into(),
            "Missing required parameter: 'session'.".into(),
            "session".into(),
        ));
    };
    unknown_key(s, &["type", "audio", "include"], "session").map_err(unknown)?;
    match s.get("type").and_then(Value::as_str) {
        Some("transcription") => {}
        None => {
            return Err((
                "missing_required_parameter".into(),
                "Missing required parameter: 'session.type'.".into(),
                "session.type".into(),
            ));
        }
        Some(_) => {
            return Err(bad(
                "session.type",
                "this endpoint (intent=transcription) takes session.type 'transcription'",
            ));
        }
    }
    let empty = Map::new();
    let audio = s.get("audio").and_then(Value::as_object).unwrap_or(&empty);
    unknown_key(audio, &["input"], "session.audio").map_err(unknown)?;
    let input = audio
        .get("input")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    unknown_key(
        input,
        &[
            "format",
            "transcription",
            "turn_detection",
            "noise_reduction",
        ],
        "session.audio.input",
    )
    .map_err(unknown)?;
    let pcmu = match input.get("format") {
        Some(f) => check_format(f)?,
        None => false,
    };
    if let Some(t) = input.get("transcription").filter(|t| !t.is_null()) {
        check_transcription(t)?;
    }
    let silence_ms = match input.get("turn_detection") {
        Some(td) => check_turn_detection(td)?,
        None => Some(500),
    };
    if let Some(n) = input.get("noise_reduction").filter(|n| !n.is_null()) {
        let ok = n.as_object().is_some_and(|o| {
            o.len() == 1
                && matches!(
                    o.get("type").and_then(Value::as_str),
                    Some("near_field" | "far_field")
                )
        });
        if !ok {
            return Err(bad(
                "session.audio.input.noise_reduction.type",
                "noise_reduction.type must be near_field or far_field",
            ));
        }
    }
    Ok(Input { pcmu, silence_ms })
}

/// `session.audio.input.format`; whether it is `audio/pcmu`.
fn check_format(f: &Value) -> Result<bool, Refusal> {
    let fo = f.as_object().ok_or_else(|| {
        bad(
            "session.audio.input.format",
            "format must be an object with a type",
        )
    })?;
    unknown_key(fo, &["type", "rate"], "session.audio.input.format").map_err(unknown)?;
    match (
        fo.get("type").and_then(Value::as_str),
        fo.get("rate").and_then(Value::as_u64),
    ) {
        (Some("audio/pcm"), Some(24000)) => Ok(false),
        (Some("audio/pcm"), _) => Err(bad(
            "session.audio.input.format.rate",
            "audio/pcm takes rate 24000",
        )),
        (Some("audio/pcmu" | "audio/pcma"), None) => Ok(fo["type"] == "audio/pcmu"),
        (Some("audio/pcmu" | "audio/pcma"), Some(_)) => {
            Err(unknown("session.audio.input.format.rate".into()))
        }
        _ => Err(bad(
            "session.audio.input.format.type",
            "Invalid value: supported values are 'audio/pcm', 'audio/pcmu' and 'audio/pcma'.",
        )),
    }
}

/// `session.audio.input.transcription` (not null).
fn check_transcription(t: &Value) -> Result<(), Refusal> {
    let to = t.as_object().ok_or_else(|| {
        bad(
            "session.audio.input.transcription",
            "transcription must be an object",
        )
    })?;
    unknown_key(
        to,
        &[
            "model",
            "language",
            "prompt",
            "languages",
            "keywords",
            "delay",
        ],
        "session.audio.input.transcription",
    )
    .map_err(unknown)?;
    match to.get("model").and_then(Value::as_str) {
        Some(m) if MODELS.contains(&m) => {}
        _ => {
            return Err(bad(
                "session.audio.input.transcription.model",
                "Invalid transcription model.",
            ));
        }
    }
    if let Some(l) = to.get("language") {
        let ok = l
            .as_str()
            .is_some_and(|l| l.len() == 2 && l.chars().all(|c| c.is_ascii_lowercase()));
        if !ok {
            return Err(bad(
                "session.audio.input.transcription.language",
                "language must be an ISO-639-1 code such as 'en'",
            ));
        }
    }
    if to.get("prompt").is_some_and(|p| !p.is_string()) {
        return Err(bad(
            "session.audio.input.transcription.prompt",
            "prompt must be a string",
        ));
    }
    Ok(())
}

const TURN_DETECTION: &str = "session.audio.input.turn_detection";

/// `session.audio.input.turn_detection`; the silence that ends a turn (`None`: null, no VAD).
fn check_turn_detection(td: &Value) -> Result<Option<u64>, Refusal> {
    const P: &str = TURN_DETECTION;
    if td.is_null() {
        return Ok(None);
    }
    let o = td
        .as_object()
        .ok_or_else(|| bad(P, "turn_detection must be an object or null"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("server_vad") => check_server_vad(o).map(Some),
        Some("semantic_vad") => {
            unknown_key(
                o,
                &["type", "eagerness", "create_response", "interrupt_response"],
                P,
            )
            .map_err(unknown)?;
            let e = o.get("eagerness").and_then(Value::as_str).unwrap_or("auto");
            match e {
                "high" => Ok(Some(300)),
                "medium" | "auto" => Ok(Some(600)),
                "low" => Ok(Some(1000)),
                _ => Err(bad(
                    &format!("{P}.eagerness"),
                    "eagerness must be low, medium, high or auto",
                )),
            }
        }
        _ => Err(bad(
            &format!("{P}.type"),
            "turn_detection.type must be server_vad or semantic_vad",
        )),
    }
}

/// A `server_vad` turn detection; its `silence_duration_ms` (default 500).
fn check_server_vad(o: &Map<String, Value>) -> Result<u64, Refusal> {
    const P: &str = TURN_DETECTION;
    unknown_key(
        o,
        &[
            "type",
            "threshold",
            "prefix_padding_ms",
            "silence_duration_ms",
            "idle_timeout_ms",
            "create_response",
            "interrupt_response",
        ],
        P,
    )
    .map_err(unknown)?;
    if o.get("threshold")
        .is_some_and(|t| !t.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t)))
    {
        return Err(bad(
            &format!("{P}.threshold"),
            "threshold must be between 0 and 1",
        ));
    }
    for k in ["prefix_padding_ms", "silence_duration_ms"] {
        if o.get(k).is_some_and(|v| v.as_u64().is_none()) {
            return Err(bad(&format!("{P}.{k}"), "must be a non-negative integer"));
        }
    }
    if o.get("idle_timeout_ms")
        .is_some_and(|v| !v.as_u64().is_some_and(|v| (5000..=30000).contains(&v)))
    {
        return Err(bad(
            &format!("{P}.idle_timeout_ms"),
            "idle_timeout_ms must be between 5000 and 30000",
        ));
    }
    Ok(o.get("silence_duration_ms")
        .and_then(Value::as_u64)
        .unwrap_or(500))
}
