//! Smoke test of `patterd-loadgen`: two calls for a few seconds against the patterd binary
//! built with the tests; the report must show both calls and answered turns. The real
//! benchmark (docs/BENCHMARKS.md) is never run by `cargo test`.
//!
//! The patterd binary is the one `cargo test` at the workspace root builds next to this
//! package's binary (the root package's integration tests need it); Cargo has no stable way
//! to name another package's binary here, so the test looks for it in the same directory.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/patterd`, beside `patterd-loadgen`.
fn patterd_binary() -> PathBuf {
    let loadgen = PathBuf::from(env!("CARGO_BIN_EXE_patterd-loadgen"));
    let patterd = loadgen.with_file_name(format!("patterd{}", std::env::consts::EXE_SUFFIX));
    assert!(
        patterd.exists(),
        "{} is missing: run `cargo test` at the workspace root (or `cargo build -p patterd` first)",
        patterd.display()
    );
    patterd
}

#[test]
fn loadgen_runs_two_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("runs.json");
    let out = Command::new(env!("CARGO_BIN_EXE_patterd-loadgen"))
        .arg("--server")
        .arg(patterd_binary())
        .args(["--calls", "2", "--hold-s", "3", "--speech-ms", "400"])
        .arg("--json")
        .arg(&json)
        .arg("--log-dir")
        .arg(dir.path())
        .output()
        .expect("run patterd-loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| patterd | 2 |"), "table: {stdout}");
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json");
    let r = &runs[0];
    assert_eq!(r["completed_calls"], 2, "{r:#}");
    assert_eq!(r["failed_calls"], 0, "{r:#}");
    assert!(r["turns_answered"].as_u64().unwrap_or(0) >= 2, "{r:#}");
    assert!(r["added_ms"]["n"].as_u64().unwrap_or(0) >= 2, "{r:#}");
    assert!(
        r["server"]["cold_start_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "{r:#}"
    );
    assert!(
        r["server"]["idle_rss_mib"].as_f64().unwrap_or(0.0) > 0.0,
        "{r:#}"
    );
}
