//! Text messages and number lookups through every SMS carrier's simulator (Twilio, Telnyx,
//! Plivo; each checks the request byte for byte against the official SDK's encoding): `POST
//! /v1/messages` and `GET /v1/numbers/{e164}/lookup`, the stored messages, the refusals that
//! never reach a carrier (allow-list, body, number), `[outbound] max_sms_per_day`, inbound
//! messages (signed per carrier, stored once, forged ones refused with nothing stored)
//! answered by the number's agent by text message, MCP's `send_sms` and `lookup_number`, and
//! the in-call `send_sms` tool texting the caller.

use serde_json::{Value, json};

use crate::common::carrier::Carrier;
use crate::common::*;
use patterd_sim::hermes::HermesReply;
use patterd_sim::sms::{Line, SmsLedger};

/// The three SMS carriers with their account names and numbers.
const SMS_CARRIERS: [(Carrier, &str); 3] = [
    (Carrier::Twilio, "twilio"),
    (Carrier::Telnyx, "telnyx"),
    (Carrier::Plivo, "plivo"),
];

const BODY: &str = "Your table is booked: 12 Main St & 5th, 7 pm — à bientôt \"chef\" 👍";

fn ledger(stack: &Stack, c: Carrier) -> SmsLedger {
    match c {
        Carrier::Twilio => stack.rest.sms.snapshot(),
        Carrier::Telnyx => stack.telnyx_rest.sms.snapshot(),
        Carrier::Plivo => stack.plivo_rest.sms.snapshot(),
        Carrier::Vonage => unreachable!("no SMS through Vonage"),
    }
}

async fn wait_sent(stack: &Stack, c: Carrier, n: usize) -> SmsLedger {
    let what = "messages sent";
    match c {
        Carrier::Twilio => stack.rest.sms.wait_until(what, |l| l.sent.len() >= n).await,
        Carrier::Telnyx => {
            stack
                .telnyx_rest
                .sms
                .wait_until(what, |l| l.sent.len() >= n)
                .await
        }
        Carrier::Plivo => {
            stack
                .plivo_rest
                .sms
                .wait_until(what, |l| l.sent.len() >= n)
                .await
        }
        Carrier::Vonage => unreachable!(),
    }
}

/// No messaging or lookup request reached any carrier.
fn nothing_reached_a_carrier(stack: &Stack) {
    for (c, _) in SMS_CARRIERS {
        let l = ledger(stack, c);
        assert!(
            l.sent.is_empty() && l.refused.is_empty() && l.lookups.is_empty(),
            "{c:?}: {l:?}"
        );
    }
}

async fn post(stack: &Stack, path: &str, body: Value) -> (u16, Value) {
    let r = stack
        .api_client()
        .post(format!("{}/v1{path}", stack.base))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn get(stack: &Stack, path: &str) -> (u16, Value) {
    let r = stack
        .api_client()
        .get(format!("{}/v1{path}", stack.base))
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn stack_opts(destinations: &[&str]) -> Opts {
    Opts {
        allowed_destinations: destinations.iter().map(|d| d.to_string()).collect(),
        ..Opts::default()
    }
}

#[tokio::test]
async fn messages_and_lookups_through_every_sms_carrier() {
    let stack = Stack::start(stack_opts(&["+1555"])).await;
    for (i, (c, account)) in SMS_CARRIERS.into_iter().enumerate() {
        let (status, v) = post(
            &stack,
            "/messages",
            json!({"to": CALLER, "from": c.number(), "body": BODY}),
        )
        .await;
        assert_eq!(status, 201, "{c:?}: {v}");
        assert_eq!(v["status"], "sent", "{c:?}");
        assert_eq!(v["carrier_account"], account);
        let l = wait_sent(&stack, c, 1).await;
        assert_eq!(l.sent.len(), 1, "{c:?}: {l:?}");
        assert!(l.refused.is_empty(), "{c:?}: {:?}", l.refused);
        let sent = &l.sent[0];
        assert_eq!(sent.body, BODY, "{c:?}");
        assert_eq!(v["carrier_message_id"], sent.id.as_str(), "{c:?}");
        // Plivo writes numbers as digits.
        let (to, from) = match c {
            Carrier::Plivo => (&CALLER[1..], &c.number()[1..]),
            _ => (CALLER, c.number()),
        };
        assert_eq!((sent.to.as_str(), sent.from.as_str()), (to, from), "{c:?}");

        // Stored, newest first.
        let (_, list) = get(&stack, &format!("/messages?number={}", c.number())).await;
        let stored = &list["messages"][0];
        assert_eq!(stored["status"], "sent", "{list}");
        assert_eq!(stored["carrier_message_id"], sent.id.as_str());
        assert_eq!(stored["source"], "api");
        let (_, all) = get(&stack, "/messages").await;
        assert_eq!(all["messages"].as_array().map(Vec::len), Some(i + 1));

        // Lookups through the carrier's API: the line type folded from its own word.
        for (number, line_type) in [
            ("+15557654321", "mobile"),
            ("+15550000006", "landline"),
            ("+15550000008", "voip"),
            ("+18005550109", "toll_free"),
        ] {
            let (status, v) = get(
                &stack,
                &format!(
                    "/numbers/{}/lookup?account={account}",
                    number.replace('+', "%2B")
                ),
            )
            .await;
            assert_eq!(status, 200, "{c:?} {number}: {v}");
            assert_eq!(v["line_type"], line_type, "{c:?} {number}: {v}");
            assert_eq!(v["valid"], true, "{c:?}");
            assert_eq!(v["country"], "US", "{c:?}");
            assert_eq!(v["number"], number, "{c:?}");
            assert_eq!(v["carrier_account"], account);
            assert!(v["carrier"].as_str().is_some_and(|n| !n.is_empty()), "{v}");
        }
        // A number the carrier finds invalid is an answer, not an error.
        let invalid = "+15550000011";
        let set = |l: &mut SmsLedger| {
            l.lines.insert(
                invalid.into(),
                Line {
                    valid: false,
                    kind: "unknown",
                    carrier: "",
                },
            );
        };
        match c {
            Carrier::Twilio => stack.rest.sms.modify(set),
            Carrier::Telnyx => stack.telnyx_rest.sms.modify(set),
            _ => stack.plivo_rest.sms.modify(set),
        }
        let (status, v) = get(
            &stack,
            &format!("/numbers/{invalid}/lookup?account={account}"),
        )
        .await;
        assert_eq!((status, &v["valid"]), (200, &json!(false)), "{c:?}: {v}");
        assert_eq!(v["line_type"], "unknown");
        assert_eq!(ledger(&stack, c).lookups.len(), 5, "{c:?}");
        assert!(ledger(&stack, c).refused.is_empty(), "{c:?}");
    }
    // Without `account`, the first number's (Twilio here).
    let (status, v) = get(&stack, "/numbers/+15557654321/lookup").await;
    assert_eq!(
        (status, &v["carrier_account"]),
        (200, &json!("twilio")),
        "{v}"
    );
}

#[tokio::test]
async fn refusals_never_reach_a_carrier() {
    // No allowed_destinations: every text refused.
    let stack = Stack::start(stack_opts(&[])).await;
    for (c, _) in SMS_CARRIERS {
        let (status, v) = post(
            &stack,
            "/messages",
            json!({"to": CALLER, "from": c.number(), "body": "hi"}),
        )
        .await;
        assert_eq!(status, 403, "{c:?}: {v}");
        assert_eq!(v["error"]["code"], "outbound_disabled");
    }
    let (status, v) = post(&stack, "/messages", json!({"to": CALLER, "body": "hi"})).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (403, &json!("outbound_disabled"))
    );
    nothing_reached_a_carrier(&stack);
    assert!(
        get(&stack, "/messages").await.1["messages"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );

    let stack = Stack::start(stack_opts(&["+1555"])).await;
    let long = "x".repeat(1601);
    let cases = [
        (
            json!({"to": "+442071234567", "from": OUR_NUMBER, "body": "hi"}),
            403,
            "destination_not_allowed",
        ),
        (
            json!({"to": "+442071234567", "body": "hi"}),
            403,
            "outbound_disabled",
        ),
        (
            json!({"to": "555", "from": OUR_NUMBER, "body": "hi"}),
            400,
            "invalid_number",
        ),
        (
            json!({"to": CALLER, "from": OUR_NUMBER, "body": "  "}),
            400,
            "invalid_request",
        ),
        (
            json!({"to": CALLER, "from": OUR_NUMBER, "body": long}),
            400,
            "body_too_long",
        ),
        (
            json!({"to": CALLER, "from": "+15559999999", "body": "hi"}),
            400,
            "unknown_number",
        ),
        (
            json!({"to": CALLER, "from": VONAGE_NUMBER, "body": "hi"}),
            422,
            "messaging_unsupported",
        ),
        (
            json!({"to": CALLER, "body": "hi", "media": "x"}),
            400,
            "invalid_request",
        ),
        (json!({"to": CALLER}), 400, "invalid_request"),
    ];
    for (body, status, code) in cases {
        let (s, v) = post(&stack, "/messages", body.clone()).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {v}"
        );
    }
    let (s, v) = get(&stack, "/numbers/555/lookup").await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid_number")),
        "{v}"
    );
    let (s, v) = get(&stack, "/numbers/+15557654321/lookup?account=vonage").await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (422, Some("messaging_unsupported")),
        "{v}"
    );
    nothing_reached_a_carrier(&stack);
}

#[tokio::test]
async fn the_daily_cap_refuses_before_the_carrier() {
    let stack = Stack::start(Opts {
        outbound_max_sms_per_day: 2,
        ..stack_opts(&["+1555"])
    })
    .await;
    // A carrier's refusal does not count toward the day.
    stack.telnyx_rest.sms.modify(|l| l.senders.clear());
    let (status, v) = post(
        &stack,
        "/messages",
        json!({"to": CALLER, "from": TELNYX_NUMBER, "body": "hi"}),
    )
    .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (502, &json!("carrier_error")),
        "{v}"
    );
    for (c, _) in [SMS_CARRIERS[0], SMS_CARRIERS[2]] {
        let (status, v) = post(
            &stack,
            "/messages",
            json!({"to": CALLER, "from": c.number(), "body": "hi"}),
        )
        .await;
        assert_eq!(status, 201, "{v}");
    }
    let (status, v) = post(
        &stack,
        "/messages",
        json!({"to": CALLER, "from": OUR_NUMBER, "body": "one more"}),
    )
    .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (429, &json!("sms_daily_limit")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_sms_per_day"))
    );
    let l = ledger(&stack, Carrier::Twilio);
    assert_eq!(
        (l.sent.len(), l.refused.len()),
        (1, 0),
        "the refused message reached Twilio"
    );
}

#[tokio::test]
async fn a_carrier_refusal_is_stored_as_failed() {
    let stack = Stack::start(stack_opts(&["+1555"])).await;
    stack.rest.sms.modify(|l| l.senders.clear());
    let (status, v) = post(
        &stack,
        "/messages",
        json!({"to": CALLER, "from": OUR_NUMBER, "body": "hi"}),
    )
    .await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (502, &json!("carrier_error")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("21606")),
        "{v}"
    );
    let (_, list) = get(&stack, "/messages").await;
    assert_eq!(list["messages"][0]["status"], "failed", "{list}");
    assert!(
        list["messages"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("21606"))
    );
}

/// An inbound message to a number with `sms = true`, through `carrier`'s simulator, from
/// `from`: (the carrier's message id, patterd's answer).
async fn text_in(stack: &Stack, c: Carrier, from: &str, body: &str) -> (String, u16) {
    let (id, r) = match c {
        Carrier::Twilio => stack.twilio.incoming_sms(from, OUR_NUMBER, body).await,
        Carrier::Telnyx => stack.telnyx.incoming_sms(from, TELNYX_NUMBER, body).await,
        Carrier::Plivo => stack.plivo.incoming_message(from, PLIVO_NUMBER, body).await,
        Carrier::Vonage => unreachable!(),
    }
    .expect("webhook");
    (id, r.status)
}

#[tokio::test]
async fn inbound_messages_are_answered_by_the_agent_by_text() {
    // No allowed_destinations: an answer goes back to whoever texted all the same.
    let stack = Stack::start(Opts {
        sms: true,
        ..stack_opts(&[])
    })
    .await;
    for (i, (c, _)) in SMS_CARRIERS.into_iter().enumerate() {
        let reply = format!("We are at 12 Main St ({c:?}).");
        stack.hermes.push(HermesReply::text(&reply));
        let (id, status) = text_in(&stack, c, CALLER, "What is your address?").await;
        assert_eq!(status, 200, "{c:?}");
        let l = wait_sent(&stack, c, 1).await;
        assert_eq!(l.sent[0].body, reply, "{c:?}");
        let rec = stack
            .hermes
            .wait_until("the turn", |r| r.requests.len() > i)
            .await;
        let req = &rec.requests[i];
        let ours = c.number();
        assert_eq!(
            req.header("x-hermes-session-id"),
            Some(format!("patter-call-sms-{}-{}", &ours[1..], &CALLER[1..]).as_str()),
            "{c:?}"
        );
        let messages = req.messages();
        assert_eq!(messages[0].0, "system");
        assert!(messages[0].1.starts_with(SYSTEM_PROMPT), "{messages:?}");
        assert!(messages[0].1.contains("text message (SMS)"), "{messages:?}");
        assert_eq!(
            messages.last().map(|m| m.1.as_str()),
            Some("What is your address?")
        );
        // Caller memory: the sender's key, as their calls have.
        assert!(
            req.header("x-hermes-session-key")
                .is_some_and(|k| k.starts_with("patter-caller-"))
        );

        let (_, list) = get(&stack, &format!("/messages?number={ours}")).await;
        let rows = list["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(rows.len(), 2, "{list}");
        assert_eq!(rows[1]["direction"], "inbound");
        assert_eq!(rows[1]["status"], "received");
        assert_eq!(rows[1]["carrier_message_id"], id.as_str());
        assert_eq!(rows[1]["body"], "What is your address?");
        assert_eq!(rows[0]["direction"], "outbound");
        assert_eq!(rows[0]["source"], "agent");
        assert_eq!(rows[0]["to"], CALLER);
    }
    // A second message continues the conversation: the history carries the first exchange.
    stack.hermes.push(HermesReply::text("Open until 10."));
    text_in(&stack, Carrier::Twilio, CALLER, "Until when?").await;
    wait_sent(&stack, Carrier::Twilio, 2).await;
    let rec = stack.hermes.record();
    assert_eq!(rec.requests.len(), 4);
    // Hermes keeps the session: only the newest message travels.
    assert_eq!(
        rec.requests[3].messages().last().map(|m| m.1.clone()),
        Some("Until when?".into())
    );
}

#[tokio::test]
async fn inbound_messages_are_stored_once_and_forged_ones_refused() {
    let stack = Stack::start(Opts {
        sms: true,
        ..stack_opts(&[])
    })
    .await;
    // Forged: a wrong signature for each carrier; 403 and nothing stored or answered.
    let params =
        patterd_sim::twilio::sms_webhook_params(ACCOUNT_SID, "SM1", CALLER, OUR_NUMBER, "hi");
    let r = stack
        .twilio
        .post_form_with_signature("/twilio/sms", &params, "bm90IGEgc2lnbmF0dXJl")
        .await
        .expect("webhook");
    assert_eq!(r.status, 403);
    let body = stack
        .telnyx
        .message_received("m1", CALLER, TELNYX_NUMBER, "hi");
    let r = stack
        .telnyx
        .post_signed_to("/telnyx/sms", &body, Some("AAAA"), Some("1"))
        .await
        .expect("webhook");
    assert_eq!(r.status, 403);
    let params = patterd_sim::plivo::SimPlivo::message_params("u1", CALLER, PLIVO_NUMBER, "hi");
    let r = stack
        .plivo
        .post_with(
            "/plivo/message",
            &params,
            &[
                ("X-Plivo-Signature-V2", "bm9wZQ=="),
                ("X-Plivo-Signature-V2-Nonce", "123"),
            ],
        )
        .await
        .expect("webhook");
    assert_eq!(r.status, 403);
    // A V2 signature over another path (the answer URL) does not sign the message URL.
    let (sig, nonce) = stack.plivo.v2_headers("/plivo/answer");
    let r = stack
        .plivo
        .post_with(
            "/plivo/message",
            &params,
            &[
                ("X-Plivo-Signature-V2", &sig),
                ("X-Plivo-Signature-V2-Nonce", &nonce),
            ],
        )
        .await
        .expect("webhook");
    assert_eq!(r.status, 403);
    let (_, list) = get(&stack, "/messages").await;
    assert_eq!(list["messages"], json!([]), "forged messages were stored");
    assert!(stack.hermes.record().requests.is_empty());

    // A replay: the same signed Plivo request twice (its nonce is spent) and the same Twilio
    // message twice (same MessageSid): stored and answered once.
    stack.hermes.push(HermesReply::text("Hello!"));
    stack.hermes.push(HermesReply::text("Hello again!"));
    let (sig, nonce) = stack.plivo.v2_headers("/plivo/message");
    let params = patterd_sim::plivo::SimPlivo::message_params("u2", CALLER, PLIVO_NUMBER, "hi");
    let headers = [
        ("X-Plivo-Signature-V2", sig.as_str()),
        ("X-Plivo-Signature-V2-Nonce", nonce.as_str()),
    ];
    let first = stack
        .plivo
        .post_with("/plivo/message", &params, &headers)
        .await
        .expect("webhook");
    let again = stack
        .plivo
        .post_with("/plivo/message", &params, &headers)
        .await
        .expect("webhook");
    assert_eq!((first.status, again.status), (200, 403));
    let params =
        patterd_sim::twilio::sms_webhook_params(ACCOUNT_SID, "SM2", CALLER, OUR_NUMBER, "hi");
    for _ in 0..2 {
        let r = stack
            .twilio
            .post_form("/twilio/sms", &params)
            .await
            .expect("webhook");
        assert_eq!(r.status, 200);
        assert!(
            r.content_type
                .as_deref()
                .is_some_and(|t| t.starts_with("text/xml"))
        );
        assert!(r.body.ends_with("<Response/>"), "{}", r.body);
    }
    wait_sent(&stack, Carrier::Plivo, 1).await;
    wait_sent(&stack, Carrier::Twilio, 1).await;
    let (_, list) = get(&stack, "/messages?direction=inbound").await;
    assert_eq!(list["messages"].as_array().map(Vec::len), Some(2), "{list}");
    assert_eq!(stack.hermes.record().requests.len(), 2);

    // Delivery reports on the messaging webhook are acknowledged, not stored.
    let body = patterd_sim::telnyx::envelope_json(
        "message.finalized",
        "e9",
        json!({"id": "x", "direction": "outbound"}),
        "https://voice.example.test/telnyx/sms",
    );
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let sig =
        patterd_sim::telnyx::sign_webhook(&telnyx_seed(), ts, body.as_bytes()).unwrap_or_default();
    let r = stack
        .telnyx
        .post_signed_to("/telnyx/sms", &body, Some(&sig), Some(&ts.to_string()))
        .await
        .expect("webhook");
    assert_eq!(r.status, 200);
    let (_, list) = get(&stack, "/messages?direction=inbound").await;
    assert_eq!(list["messages"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn a_number_without_sms_only_stores_messages() {
    let stack = Stack::start(stack_opts(&[])).await;
    let (_, status) = text_in(&stack, Carrier::Telnyx, CALLER, "hello?").await;
    assert_eq!(status, 200);
    let (_, list) = get(&stack, "/messages").await;
    assert_eq!(list["messages"][0]["status"], "received", "{list}");
    assert_eq!(list["messages"][0]["agent"], "front-desk");
    // The decision is taken before the webhook is answered: no turn was started.
    assert!(stack.hermes.record().requests.is_empty());
    nothing_reached_a_carrier(&stack);
}

#[tokio::test]
async fn mcp_send_sms_and_lookup_number() {
    let stack = Stack::start(stack_opts(&["+1555"])).await;
    let mcp = patterd::mcp::PatterMcp::new(std::sync::Arc::new(patterd::mcp::Local(
        std::sync::Arc::downgrade(&stack.server.app),
    )));
    let args = |v: Value| v.as_object().cloned().unwrap_or_default();
    let out = mcp
        .run_tool(
            "send_sms",
            args(json!({"to": CALLER, "body": "See you at 7."})),
        )
        .await
        .expect("send_sms");
    assert!(
        out.starts_with(&format!("Text message sent to {CALLER} from {OUR_NUMBER}.")),
        "{out}"
    );
    assert_eq!(
        wait_sent(&stack, Carrier::Twilio, 1).await.sent[0].body,
        "See you at 7."
    );
    let out = mcp
        .run_tool("lookup_number", args(json!({"number": "+15550000008"})))
        .await
        .expect("lookup_number");
    assert!(
        out.contains("Valid: yes") && out.contains("Line type: voip"),
        "{out}"
    );
    let e = mcp
        .run_tool(
            "send_sms",
            args(json!({"to": "+442071234567", "body": "x"})),
        )
        .await
        .expect_err("refused");
    assert!(
        e.starts_with("Text message not sent:") && e.contains("allowed_destinations"),
        "{e}"
    );
}

#[tokio::test]
async fn the_in_call_tool_texts_the_caller_only() {
    let stack = Stack::start(Opts {
        llm: "compat".into(),
        agent_extra: "tools = [\"send_sms\"]".into(),
        ..stack_opts(&[])
    })
    .await;
    stack.hermes.push(HermesReply::tool_call(
        "call_s1",
        "send_sms",
        r#"{"body":"12 Main St, 7 pm"}"#,
    ));
    stack.hermes.push(HermesReply::tool_call(
        "call_s2",
        "send_sms",
        r#"{"body":"to someone else","to":"+15550000001"}"#,
    ));
    stack.hermes.push(HermesReply::text("I sent it."));
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    let l = wait_sent(&stack, Carrier::Twilio, 1).await;
    assert_eq!(
        (
            l.sent[0].to.as_str(),
            l.sent[0].from.as_str(),
            l.sent[0].body.as_str()
        ),
        (CALLER, OUR_NUMBER, "12 Main St, 7 pm")
    );
    let rec = stack
        .hermes
        .wait_until("the tool rounds", |r| r.requests.len() >= 3)
        .await;
    assert_eq!(rec.requests[0].tool_names(), vec!["send_sms"]);
    let told = rec.requests[1].tool_messages();
    assert_eq!(told[0].1, format!("The text message was sent to {CALLER}."));
    // The follow-up after the second round carries both answers.
    let told = rec.requests[2].tool_messages();
    assert_eq!(told.len(), 2, "{told:?}");
    assert_eq!(told[1].0, "call_s2");
    let told = &told[1..];
    assert!(
        told[0].1.starts_with("The text message was not sent:")
            && told[0].1.contains("allowed_destinations"),
        "{told:?}"
    );
    sim.hang_up().await;
    stack.finished(&call_sid).await;
    // Only the caller was texted; the other number never reached the carrier.
    let l = ledger(&stack, Carrier::Twilio);
    assert_eq!((l.sent.len(), l.refused.len()), (1, 0), "{l:?}");
    let (_, list) = get(&stack, "/messages").await;
    assert_eq!(list["messages"][0]["call_id"], call_sid.as_str());
    assert_eq!(list["messages"][0]["source"], "call");
}
