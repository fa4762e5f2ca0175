//! MCP with a real client: the official Python `mcp` package (what Hermes uses) drives
//! patterd's Streamable HTTP endpoint `/mcp` and `patterd mcp --stdio` through
//! `tests/mcp/client.py`, while this test plays the called party through the Twilio simulator.
//! The Python environment comes from `tests/mcp/setup.sh` (CI runs it; see README). Without it
//! the test is skipped with a message, unless `PATTERD_REQUIRE_MCP_VENV` is set (CI), in which
//! case it fails.

use std::path::PathBuf;
use std::process::Stdio;

use crate::common::*;
use patterd_sim::hermes::HermesReply;
use patterd_sim::twilio::call::SimCall;
use patterd_sim::twilio::xml::parse_twiml;
use tokio::io::{AsyncBufReadExt, BufReader};

const TOKEN: &str = "mcp-test-token-0123456789";

fn venv_python() -> Option<PathBuf> {
    let dir = std::env::var("PATTERD_MCP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/.venv")));
    let py = dir.join("bin/python");
    py.exists().then_some(py)
}

/// Answers every call patterd places: +15557654321 talks and hangs up, +15557654322 stays on
/// the line until patterd ends it.
async fn callee(stack: &Stack, already: usize) {
    let mut handled = already;
    let mut live: Vec<SimCall> = Vec::new();
    loop {
        let Ok(created) = stack.rest.wait_for_created(handled + 1, WAIT * 4).await else {
            return;
        };
        let c = created[handled].clone();
        handled += 1;
        let sid = c.created_sid.clone().expect("sid");
        // patterd registers a placed call once Twilio's 201 is back, and this callee sees the
        // request before that answer is read (a real one answers seconds later): wait for the
        // call's actor, which pre-opens one STT session per call, before answering.
        stack
            .dg
            .wait_until("the placed call's STT session", |r| {
                r.connections.len() >= handled
            })
            .await;
        let answer = stack
            .twilio
            .answer_outbound(&c, Some("human"))
            .await
            .expect("answer");
        let sim = stack
            .open(&sid, &parse_twiml(&answer.body).expect("twiml"))
            .await;
        if c.field("To").as_deref() == Some("+15557654321") {
            sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
                .await
                .expect("greeting");
            speak(&sim, 700);
            sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
                .await
                .expect("reply");
            sim.hang_up().await;
            stack
                .twilio
                .outbound_status(&c, "completed", &[("CallDuration", "3")])
                .await
                .expect("status");
        } else {
            live.push(sim);
        }
    }
}

async fn run_client(stack: &Stack, args: &[String]) {
    let Some(py) = venv_python() else { return };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
    let mut child = tokio::process::Command::new(py)
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the Python MCP client");
    let stdout = child.stdout.take().expect("stdout");
    let already = stack.rest.created().len();
    let driver = async {
        callee(stack, already).await;
        std::future::pending::<()>().await
    };
    let mut lines = Vec::new();
    let reader = async {
        let mut r = BufReader::new(stdout).lines();
        while let Ok(Some(l)) = r.next_line().await {
            lines.push(l);
        }
    };
    tokio::select! {
        _ = driver => {}
        _ = tokio::time::timeout(std::time::Duration::from_secs(180), reader) => {}
    }
    let out = child.wait_with_output().await.expect("client exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && lines.last().is_some_and(|l| l.contains("\"done\"")),
        "MCP client failed ({:?}):\n{}\n--- stderr ---\n{stderr}",
        out.status,
        lines.join("\n")
    );
    // Session DELETE answered 200/204 (the client logs a warning otherwise).
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
    // The disallowed destination never reached the carrier.
    assert!(
        stack
            .rest
            .created()
            .iter()
            .all(|c| c.field("To").as_deref() != Some("+442071234567"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_mcp_client_over_http_and_stdio() {
    if venv_python().is_none() {
        if std::env::var_os("PATTERD_REQUIRE_MCP_VENV").is_some() {
            panic!("the MCP test venv is missing: run tests/mcp/setup.sh");
        }
        eprintln!(
            "SKIPPED python_mcp_client_over_http_and_stdio: no Python venv with `mcp`; run \
             tests/mcp/setup.sh to enable it"
        );
        return;
    }
    let stack = Stack::start(Opts {
        api_token: TOKEN.into(),
        allowed_destinations: vec!["+1555".into()],
        transcripts: vec!["yes that works".into(); 10],
        ..Opts::default()
    })
    .await;
    for _ in 0..8 {
        stack.hermes.push(HermesReply::text("Great, see you then."));
    }
    let http = format!("{}/mcp", stack.base);
    run_client(&stack, &["http".into(), http, TOKEN.into()]).await;
    run_client(
        &stack,
        &[
            "stdio".into(),
            env!("CARGO_BIN_EXE_patterd").into(),
            stack.base.clone(),
            TOKEN.into(),
        ],
    )
    .await;

    // /mcp without the token is refused before rmcp sees it.
    let r = reqwest::Client::new()
        .post(format!("{}/mcp", stack.base))
        .header("Accept", "application/json, text/event-stream")
        .json(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
}
