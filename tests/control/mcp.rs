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

const TOKEN: &str = "mcp-test-token-0123456789abcdefgh";

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

/// The MCP tools over the in-process `/mcp` backend (`Local`, what `/mcp` runs):
/// a live call, the tools' refusals as `isError` texts that say why, and the accepted actions
/// reaching the carrier (the `<Dial>` update, in-band DTMF the simulator decodes, speech).
fn mcp_of(stack: &Stack) -> patterd::mcp::PatterMcp {
    patterd::mcp::PatterMcp::new(std::sync::Arc::new(patterd::mcp::Local(
        std::sync::Arc::downgrade(&stack.server.app),
    )))
}

fn args(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[tokio::test]
async fn mcp_transfer_send_dtmf_and_say_act_on_a_live_call() {
    let stack = Stack::start(Opts {
        agent_extra: "transfer_allowed = [\"+1415555\"]".into(),
        ..Opts::default()
    })
    .await;
    let (id, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    let mcp = mcp_of(&stack);

    // Bad input: clear refusals, nothing at the carrier.
    let e = mcp
        .run_tool(
            "send_dtmf",
            args(serde_json::json!({"callId": id, "digits": "12x"})),
        )
        .await
        .expect_err("bad digits");
    assert!(e.contains("not a DTMF digit"), "{e}");
    let e = mcp
        .run_tool(
            "transfer_call",
            args(serde_json::json!({"callId": id, "to": "+19005550100"})),
        )
        .await
        .expect_err("disallowed number");
    assert!(e.contains("transfer_allowed"), "{e}");
    let e = mcp
        .run_tool(
            "transfer_call",
            args(serde_json::json!({"callId": id, "to": "the boss"})),
        )
        .await
        .expect_err("not a number");
    assert!(e.contains("not a phone number"), "{e}");
    let e = mcp
        .run_tool(
            "say",
            args(serde_json::json!({"callId": "CAnope", "text": "hi"})),
        )
        .await
        .expect_err("unknown call");
    assert!(e.contains("not found"), "{e}");
    assert!(stack.rest.requests().is_empty());

    // say: spoken on the call.
    let t = mcp
        .run_tool(
            "say",
            args(serde_json::json!({"callId": id, "text": "Your table is ready."})),
        )
        .await
        .expect("say");
    assert!(t.starts_with(&format!("Say on call {id}: ")), "{t}");
    let marks = sim.state().marks_echoed.len();
    sim.wait_for("the sentence played", WAIT, |s| {
        s.marks_echoed.len() > marks
    })
    .await
    .expect("said");
    assert!(stack.spoken().iter().any(|s| s == "Your table is ready."));

    // send_dtmf: Twilio has no command, the tones go in-band and the simulator hears them.
    let t = mcp
        .run_tool(
            "send_dtmf",
            args(serde_json::json!({"callId": id, "digits": "4*"})),
        )
        .await
        .expect("send_dtmf");
    assert!(t.contains("4*"), "{t}");
    sim.wait_for("digits heard", WAIT, |s| s.dtmf_heard == "4*")
        .await
        .expect("decoded");

    // transfer_call: the carrier gets the <Dial>; the record says transferred.
    let t = mcp
        .run_tool(
            "transfer_call",
            args(serde_json::json!({"callId": id, "to": "+14155550100"})),
        )
        .await
        .expect("transfer_call");
    assert!(t.contains("transferred to +14155550100"), "{t}");
    let reqs = stack.rest.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert!(
        reqs[0]
            .field("Twiml")
            .is_some_and(|x| x.contains(">+14155550100</Dial>"))
    );
    let rec = stack.finished(&id).await;
    assert_eq!(rec.ended_reason, "transferred to +14155550100");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_call_third_party_calls_with_the_task_and_returns_the_transcript() {
    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+1555".into()],
        transcripts: vec!["yes that works".into(); 4],
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Great, see you then."));
    let mcp = mcp_of(&stack);
    let task = "Confirm the table for two at seven tonight.";
    let text = tokio::select! {
        r = mcp.run_tool(
            "call_third_party",
            args(serde_json::json!({"to": "+15557654321", "task": task})),
        ) => r.expect("call_third_party"),
        _ = callee(&stack, 0) => panic!("the callee stopped answering"),
    };
    assert!(
        text.starts_with("Call to +15557654321 completed."),
        "{text}"
    );
    assert!(text.contains("[user] yes that works"), "{text}");
    assert!(text.contains("[assistant] Great, see you then."), "{text}");
    assert!(
        !text.contains("Call ID:"),
        "patter-mcp's layout has no call id: {text}"
    );
    // The voice agent was told to act for the user, with the task.
    let rec = stack.hermes.record();
    let system = rec.requests[0]
        .messages()
        .into_iter()
        .find(|(role, _)| role == "system")
        .map(|(_, c)| c)
        .unwrap_or_default();
    assert!(system.contains("on behalf of your user"), "{system}");
    assert!(system.ends_with(&format!("Task: {task}")), "{system}");
    // A disallowed destination is refused before the carrier.
    let e = mcp
        .run_tool(
            "call_third_party",
            args(serde_json::json!({"to": "+442071234567", "task": task})),
        )
        .await
        .expect_err("refused");
    assert!(e.starts_with("Third-party call failed:"), "{e}");
    assert!(
        stack
            .rest
            .created()
            .iter()
            .all(|c| c.field("To").as_deref() != Some("+442071234567"))
    );
}
