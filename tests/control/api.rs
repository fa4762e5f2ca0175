//! The REST API (`/v1`) and outbound calls against the in-process stack: bearer auth, JSON
//! errors, list filters, transcripts and events from the store, originate through the fake
//! Twilio REST API with the simulator answering, outcomes from status callbacks and machine
//! detection, and policy refusals that never reach the carrier.

use crate::common::api::Api;
use crate::common::carrier::{Carrier, Carriers};
use crate::common::*;
use patterd_sim::hermes::HermesReply;
use patterd_sim::twilio::xml::parse_twiml;
use serde_json::{Value, json};

const TOKEN: &str = "test-api-token-0123456789abcdefgh";

fn ids(v: &Value) -> Vec<String> {
    v["calls"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["call_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn auth_filters_transcript_and_events() {
    let stack = Stack::start(Opts {
        api_token: TOKEN.into(),
        transcripts: vec!["what are your hours".into()],
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("We open at nine."));

    // No token, a wrong token: 401 with a JSON error; no token with a public Host also fails.
    let (s, v) = Api::new(&stack, None).get("/v1/calls").await;
    assert_eq!(s, 401);
    assert_eq!(v["error"]["code"], "unauthorized");
    assert!(v["error"]["message"].as_str().unwrap().contains("Bearer"));
    let (s, _) = Api::new(&stack, Some("nope")).get("/v1/calls").await;
    assert_eq!(s, 401);
    let api = Api::new(&stack, Some(TOKEN));
    let (s, v) = api.get("/v1/calls").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["calls"], json!([]));

    // One inbound call with a turn.
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 700);
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    // Live: listed as in progress.
    let (_, v) = api.get(&format!("/v1/calls/{call_sid}")).await;
    assert_eq!(v["live"], true);
    assert_eq!(v["status"], "in-progress");
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    stack.server.app.store.tx.flush().await.unwrap();

    let (_, v) = api.get("/v1/calls?direction=inbound").await;
    assert_eq!(ids(&v), vec![call_sid.clone()]);
    let c = &v["calls"][0];
    assert_eq!(c["from"], CALLER);
    assert_eq!(c["to"], OUR_NUMBER);
    assert_eq!(c["status"], "completed");
    assert_eq!(c["outcome"], "answered");
    assert_eq!(c["turns"], 3);
    assert_eq!(
        ids(&api.get("/v1/calls?direction=outbound").await.1).len(),
        0
    );
    assert_eq!(ids(&api.get("/v1/calls?status=completed").await.1).len(), 1);
    assert_eq!(ids(&api.get("/v1/calls?status=failed").await.1).len(), 0);
    // Numbers are normalised before matching.
    assert_eq!(
        ids(&api.get("/v1/calls?number=%2B1%20555%20765%204321").await.1).len(),
        1
    );
    assert_eq!(
        ids(&api.get("/v1/calls?number=%2B15550009999").await.1).len(),
        0
    );
    assert_eq!(ids(&api.get("/v1/calls?since=1h&limit=1").await.1).len(), 1);
    let future = patterd::store::now_ms() + 60_000;
    assert_eq!(
        ids(&api.get(&format!("/v1/calls?since={future}")).await.1).len(),
        0
    );
    let (s, v) = api.get("/v1/calls?limit=0").await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["code"], "invalid_request");
    let (s, _) = api.get("/v1/calls?direction=sideways").await;
    assert_eq!(s, 400);

    let (s, v) = api.get(&format!("/v1/calls/{call_sid}/transcript")).await;
    assert_eq!(s, 200);
    let turns: Vec<(String, String)> = v["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["speaker"].as_str().unwrap().to_string(),
                t["heard_text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        vec![
            ("agent".to_string(), GREETING.to_string()),
            ("caller".to_string(), "what are your hours".to_string()),
            ("agent".to_string(), "We open at nine.".to_string()),
        ]
    );
    assert!(v["transcript"][1]["response_latency_ms"].is_number(), "{v}");
    let (_, v) = api.get(&format!("/v1/calls/{call_sid}/events")).await;
    let kinds: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"media_start") && kinds.last() == Some(&"call_end"),
        "{kinds:?}"
    );
    let (_, v) = api.get(&format!("/v1/calls/{call_sid}/metrics")).await;
    assert_eq!(v["metrics"]["caller_turns"], 1);

    let (s, v) = api.get("/v1/calls/CAnope").await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["code"], "not_found");
    let (s, v) = api
        .post(&format!("/v1/calls/{call_sid}/hangup"), json!({}))
        .await;
    assert_eq!(s, 409, "{v}");
    let (s, _) = api.get("/v1/nothing").await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn outbound_refused_by_policy_never_reaches_the_carrier() {
    // No allowed_destinations: outbound is off.
    let stack = Stack::start(Opts::default()).await;
    let api = Api::authed(&stack);
    let (s, v) = api.post("/v1/calls", json!({"to": "+15557654321"})).await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(v["error"]["code"], "outbound_disabled");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allowed_destinations")
    );
    assert!(stack.rest.requests().is_empty());
    drop(stack);

    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+1555".into()],
        outbound_max_concurrent: 1,
        ..Opts::default()
    })
    .await;
    let api = Api::authed(&stack);
    let (s, v) = api.post("/v1/calls", json!({"to": "+442071234567"})).await;
    assert_eq!(s, 403);
    assert_eq!(v["error"]["code"], "destination_not_allowed");
    let (s, v) = api
        .post(
            "/v1/calls",
            json!({"to": "+442071234567", "from": OUR_NUMBER}),
        )
        .await;
    assert_eq!(s, 403);
    assert_eq!(v["error"]["code"], "destination_not_allowed");
    let (s, v) = api.post("/v1/calls", json!({"to": "call me maybe"})).await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["code"], "invalid_number");
    let (s, v) = api
        .post(
            "/v1/calls",
            json!({"to": "+15557654321", "from": "+15550000000"}),
        )
        .await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["code"], "unknown_number");
    let (s, v) = api
        .post("/v1/calls", json!({"to": "+15557654321", "bogus": 1}))
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        stack.rest.requests().is_empty(),
        "a refused call reached the carrier"
    );

    // The concurrent cap: the first call is placed, the second refused.
    let (s, v) = api
        .post("/v1/calls", json!({"to": "+1 555 765 4321"}))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["to"], "+15557654321");
    let (s, v) = api.post("/v1/calls", json!({"to": "+15557654322"})).await;
    assert_eq!(s, 429);
    assert_eq!(v["error"]["code"], "concurrent_limit");
    assert_eq!(stack.rest.created().len(), 1);

    // The carrier failing is reported as such.
    let created = &stack.rest.created()[0];
    let sid = created.created_sid.clone().unwrap();
    stack
        .twilio
        .outbound_status(created, "no-answer", &[])
        .await
        .unwrap();
    stack.finished(&sid).await;
    stack.server.app.store.tx.flush().await.unwrap();
    let (_, v) = api.get(&format!("/v1/calls/{sid}")).await;
    assert_eq!(v["status"], "no-answer");
    assert_eq!(v["outcome"], "no_answer");
    stack.rest.fail_with(Some(500));
    let (s, v) = api.post("/v1/calls", json!({"to": "+15557654321"})).await;
    assert_eq!(s, 502);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Failed to place call")
    );
}

#[tokio::test]
async fn originate_answer_talk_and_hang_up() {
    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+15557654321".into()],
        transcripts: vec!["yes this is Bob".into()],
        ..Opts::default()
    })
    .await;
    stack.hermes.push(HermesReply::text("Great, thanks Bob."));
    let api = Api::authed(&stack);
    let (s, v) = api
        .post(
            "/v1/calls",
            json!({"to": "+15557654321", "first_message": "Hi, is this Bob?",
                   "system_prompt": "Confirm the caller is Bob.", "machine_detection": true}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let sid = v["call_id"].as_str().unwrap().to_string();
    assert_eq!(v["direction"], "outbound");
    assert_eq!(v["status"], "queued");
    let created = stack.rest.created();
    let c = &created[0];
    assert_eq!(c.created_sid.as_deref(), Some(sid.as_str()));
    assert_eq!(c.field("To").as_deref(), Some("+15557654321"));
    assert_eq!(c.field("From").as_deref(), Some(OUR_NUMBER));
    assert_eq!(c.field("MachineDetection").as_deref(), Some("Enable"));
    assert_eq!(c.field("Timeout").as_deref(), Some("20"));
    assert_eq!(
        c.field("StatusCallback").as_deref(),
        Some(format!("{PUBLIC_URL}/twilio/status").as_str())
    );
    assert_eq!(
        c.field("Url").as_deref(),
        Some(format!("{PUBLIC_URL}/twilio/outbound").as_str())
    );

    let answer = stack
        .twilio
        .answer_outbound(c, Some("human"))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let sim = stack.open(&sid, &parse_twiml(&answer.body).unwrap()).await;
    greeted_bob_and_one_turn(&stack, &sim, "Twilio").await;

    // Hang up through the API: the carrier is told.
    let (s, v) = api
        .post(&format!("/v1/calls/{sid}/hangup"), json!({}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["live"], false);
    assert_eq!(v["outcome"], "answered");
    assert_eq!(v["status"], "completed");
    stack.wait_rest_hang_up(Carrier::Twilio, &sid).await;
    let (_, v) = api.get(&format!("/v1/calls/{sid}/transcript")).await;
    assert_eq!(v["transcript"][1]["text"], "yes this is Bob");
    assert_eq!(v["transcript"][2]["heard_text"], "Great, thanks Bob.");
}

/// A machine on a call without a voicemail message is hung up on (the message itself:
/// `voicemail.rs`).
#[tokio::test]
async fn machine_without_a_message_is_hung_up_on_and_busy_is_an_outcome() {
    let stack = Stack::start(Opts {
        allowed_destinations: vec!["+1555".into()],
        ..Opts::default()
    })
    .await;
    let api = Api::authed(&stack);
    let (s, v) = api
        .post(
            "/v1/calls",
            json!({"to": "+15557654321", "machine_detection": true, "wait": false}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let sid = v["call_id"].as_str().unwrap().to_string();
    let created = stack.rest.created();
    let answer = stack
        .twilio
        .answer_outbound(&created[0], Some("machine_end_beep"))
        .await
        .unwrap();
    let twiml = parse_twiml(&answer.body).unwrap();
    assert!(twiml.stream_url.is_none(), "{}", answer.body);
    assert!(answer.body.contains("<Hangup/>"), "{}", answer.body);
    stack.finished(&sid).await;
    stack
        .twilio
        .outbound_status(&created[0], "completed", &[("CallDuration", "7")])
        .await
        .unwrap();
    stack.server.app.store.tx.flush().await.unwrap();
    let (_, v) = api.get(&format!("/v1/calls/{sid}")).await;
    assert_eq!(v["outcome"], "voicemail");
    assert_eq!(v["answered_by"], "machine_end_beep");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["carrier_duration_s"], 7);

    // Busy, with wait: the request returns when the carrier says so.
    let api2 = Api::authed(&stack);
    let waiter = tokio::spawn(async move {
        api2.post("/v1/calls", json!({"to": "+15557654321", "wait": true}))
            .await
    });
    let created = stack
        .rest
        .wait_for_created(2, WAIT)
        .await
        .expect("second call created");
    stack
        .twilio
        .outbound_status(&created[1], "busy", &[])
        .await
        .unwrap();
    let (s, v) = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["outcome"], "busy");
    assert_eq!(v["status"], "busy");
    assert_eq!(v["transcript"], json!([]));
}

#[tokio::test]
async fn inbound_overrides_apply_and_persist() {
    let stack = Stack::start(Opts::default()).await;
    let api = Api::authed(&stack);
    let (s, v) = api
        .send(
            reqwest::Method::PUT,
            "/v1/inbound",
            Some(json!({"number": OUR_NUMBER, "firstMessage": "Welcome back."})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["override"]["firstMessage"], "Welcome back.");
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    assert_eq!(stack.spoken()[0], "Welcome back.");
    sim.hang_up().await;
    stack.finished(&call_sid).await;

    let (s, _) = api
        .send(
            reqwest::Method::PUT,
            "/v1/inbound",
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, resp) = stack.ring_from(CALLER).await;
    assert!(resp.body.contains(r#"reason="rejected""#), "{}", resp.body);
    let saved = stack
        .server
        .app
        .store
        .setting(patterd::api::inbound::SETTING_KEY)
        .await
        .unwrap()
        .expect("persisted");
    assert!(
        saved.contains("Welcome back.") && saved.contains("\"enabled\":false"),
        "{saved}"
    );
    let (s, v) = api
        .send(
            reqwest::Method::PUT,
            "/v1/inbound",
            Some(json!({"voice": "nope"})),
        )
        .await;
    assert_eq!(s, 400, "{v}");
}

/// `POST /v1/calls/{id}/transfer | dtmf | say`: the same actions and policies as the MCP tools
/// and the brain's tools, over HTTP, with errors that say what to send.
#[tokio::test]
async fn call_actions_over_rest() {
    let stack = Stack::start(Opts {
        agent_extra: "transfer_allowed = [\"+1415555\"]".into(),
        ..Opts::default()
    })
    .await;
    let api = Api::authed(&stack);
    let (sid, sim) = stack.call().await;
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    let path = |verb: &str| format!("/v1/calls/{sid}/{verb}");

    let (s, v) = api.post(&path("dtmf"), json!({})).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`digits`"),
        "{v}"
    );
    let (s, v) = api
        .post(&path("dtmf"), json!({"digits": "9".repeat(33)}))
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (422, Some("action_refused")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 32"),
        "{v}"
    );
    let (s, v) = api
        .post(&path("transfer"), json!({"to": "+442071234567"}))
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (422, Some("action_refused")),
        "{v}"
    );
    let (s, v) = api
        .post("/v1/calls/CAnope/say", json!({"text": "hello"}))
        .await;
    assert_eq!(s, 404, "{v}");
    assert!(
        stack.rest.requests().is_empty(),
        "refusals never reach the carrier"
    );

    let (s, v) = api.post(&path("say"), json!({"text": "Still here."})).await;
    assert_eq!((s, v["outcome"].as_str()), (200, Some("done")), "{v}");
    let (s, v) = api.post(&path("dtmf"), json!({"digits": "7"})).await;
    assert_eq!((s, v["action"].as_str()), (200, Some("dtmf")), "{v}");
    sim.wait_for("7 heard", WAIT, |s| s.dtmf_heard == "7")
        .await
        .unwrap();
    let (s, v) = api
        .post(&path("transfer"), json!({"to": "+14155550199"}))
        .await;
    assert_eq!(s, 200, "{v}");
    let rec = stack.finished(&sid).await;
    assert_eq!(rec.ended_reason, "transferred to +14155550199");
    let (s, v) = api.post(&path("say"), json!({"text": "hello"})).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("call_not_live")),
        "{v}"
    );
}
