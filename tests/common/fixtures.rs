//! The files under `tests/fixtures/`: shared vectors (JSON), recorded media sessions (JSONL)
//! and speech clips (μ-law).

use std::path::PathBuf;

use serde_json::Value;

/// `tests/fixtures/<name>`.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fixture as text.
pub fn text(name: &str) -> String {
    let p = path(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// A JSON fixture.
pub fn json(name: &str) -> Value {
    serde_json::from_str(&text(name)).expect("fixture is JSON")
}

/// A speech clip, `tests/fixtures/speech/<name>.ulaw` (μ-law 8 kHz).
pub fn clip(name: &str) -> Vec<u8> {
    let p = path(&format!("speech/{name}.ulaw"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
