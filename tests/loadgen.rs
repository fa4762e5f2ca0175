//! Smoke test of `patterd-loadgen`: two calls for a few seconds against the patterd binary
//! built with the tests; the report must show both calls and answered turns. The real
//! benchmark (docs/BENCHMARKS.md) is never run by `cargo test`.

use std::process::Command;

#[test]
fn loadgen_runs_two_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("runs.json");
    let out = Command::new(env!("CARGO_BIN_EXE_patterd-loadgen"))
        .args(["--server", env!("CARGO_BIN_EXE_patterd")])
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
