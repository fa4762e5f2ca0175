//! Outbound calls through each carrier, against the in-process stack and the carriers' REST
//! fakes: originate through the API (the carrier's own dial request), the simulated carrier
//! answers (Twilio's answer webhook, Telnyx's `call.answered` webhooks, Plivo fetching the
//! answer URL), a conversation over that carrier's media stream, a hang-up through the API that
//! reaches the carrier's REST API; a destination outside the allow-list makes no carrier
//! request; busy and no-answer outcomes; a carrier refusing the call; cancelling a call that
//! still rings (machine detection and the voicemail message: `voicemail.rs`).

use crate::common::api::Api;
use crate::common::carrier::{ALL, Carrier, Carriers};
use crate::common::*;
use patterd_sim::hermes::HermesReply;
use patterd_sim::plivo::PlivoAnswer;
use patterd_sim::stream::SimCall;
use patterd_sim::twilio::xml::parse_twiml;
use serde_json::{Value, json};

const CALLEE: &str = "+15557654321";

/// Every request any carrier's REST fake received.
fn carrier_requests(stack: &Stack) -> usize {
    stack.rest.requests().len()
        + stack.telnyx_rest.record().commands.len()
        + stack.telnyx_rest.record().refused.len()
        + stack.plivo_rest.record().requests.len()
        + stack.vonage_rest.record().requests.len()
}

/// Waits for the `n`th (1-based) placed call at `carrier` and returns our call id for it.
async fn placed(stack: &Stack, carrier: Carrier, n: usize) -> String {
    match carrier {
        Carrier::Twilio => {
            let c = stack.rest.wait_for_created(n, WAIT).await.expect("created");
            c[n - 1].created_sid.clone().expect("sid")
        }
        Carrier::Telnyx => stack.telnyx_rest.wait_for_dialled(n).await[n - 1]
            .call_control_id
            .clone(),
        Carrier::Plivo => stack.plivo_rest.wait_for_created(n).await[n - 1]
            .request_uuid
            .clone()
            .expect("request_uuid"),
        Carrier::Vonage => stack.vonage_rest.wait_for_created(n).await[n - 1]
            .uuid
            .clone()
            .expect("uuid"),
    }
}

/// The carrier answers the `n`th placed call (a person); returns the carrier's leg id and
/// the media stream.
async fn answer(stack: &Stack, carrier: Carrier, n: usize) -> (String, SimCall) {
    match carrier {
        Carrier::Twilio => {
            let created = stack.rest.created();
            let c = &created[n - 1];
            let sid = c.created_sid.clone().expect("sid");
            let r = stack
                .twilio
                .answer_outbound(c, Some("human"))
                .await
                .expect("answer webhook");
            assert_eq!(r.status, 200, "{r:?}");
            let twiml = parse_twiml(&r.body).expect("TwiML");
            (sid.clone(), stack.open(&sid, &twiml).await)
        }
        Carrier::Telnyx => {
            let d = stack.telnyx_rest.dialled()[n - 1].clone();
            let sim = stack
                .telnyx
                .answer_outbound(&stack.telnyx_rest, &d, &stack.ws_base(), Some("human"))
                .await
                .expect("telnyx answers")
                .expect("a stream");
            (d.call_control_id, sim)
        }
        Carrier::Plivo => {
            let c = stack.plivo_rest.created()[n - 1].clone();
            let (uuid, r) = stack
                .plivo
                .answer_outbound(&c, Some(false))
                .await
                .expect("answer URL");
            assert_eq!(r.status, 200, "{r:?}");
            let a = PlivoAnswer::parse(&r.body).expect("Plivo XML");
            assert!(a.bidirectional, "{}", r.body);
            let sim = stack
                .plivo
                .open_stream(&a, &stack.ws_base(), &uuid)
                .await
                .expect("stream opens");
            (uuid, sim)
        }
        Carrier::Vonage => {
            let c = stack.vonage_rest.created()[n - 1].clone();
            let (uuid, r) = stack
                .vonage
                .answer_outbound(&c)
                .await
                .expect("answer webhook");
            assert_eq!(r.status, 200, "{r:?}");
            let a = patterd_sim::vonage::VonageAnswer::parse(&r.body).expect("NCCO");
            let sim = stack
                .vonage
                .open_stream(&a, &stack.ws_base(), &uuid)
                .await
                .expect("stream opens");
            (uuid, sim)
        }
    }
}

/// The carrier reports the `n`th placed call unanswered: `busy` or `no_answer`.
async fn unanswered(stack: &Stack, carrier: Carrier, n: usize, outcome: &str) {
    match carrier {
        Carrier::Twilio => {
            let created = stack.rest.created();
            let status = if outcome == "busy" {
                "busy"
            } else {
                "no-answer"
            };
            stack
                .twilio
                .outbound_status(&created[n - 1], status, &[])
                .await
                .expect("status callback");
        }
        Carrier::Telnyx => {
            let d = stack.telnyx_rest.dialled()[n - 1].clone();
            let cause = if outcome == "busy" {
                "user_busy"
            } else {
                "no_answer"
            };
            let r = stack
                .telnyx
                .hang_up(&d.call_control_id, cause)
                .await
                .expect("call.hangup");
            assert_eq!(r.status, 200);
        }
        Carrier::Plivo => {
            let c = stack.plivo_rest.created()[n - 1].clone();
            let cause = if outcome == "busy" {
                "USER_BUSY"
            } else {
                "NO_ANSWER"
            };
            let r = stack
                .plivo
                .hangup_outbound(&c, None, cause, 0)
                .await
                .expect("hangup callback");
            assert_eq!(r.status, 204);
        }
        Carrier::Vonage => {
            let uuid = stack.vonage_rest.created()[n - 1]
                .uuid
                .clone()
                .expect("uuid");
            let status = if outcome == "busy" { "busy" } else { "timeout" };
            let r = stack
                .vonage
                .event(&uuid, status)
                .await
                .expect("event webhook");
            assert_eq!(r.status, 204);
        }
    }
}

fn opts() -> Opts {
    Opts {
        allowed_destinations: vec![CALLEE.into()],
        transcripts: vec!["yes this is Bob".into()],
        ..Opts::default()
    }
}

#[tokio::test]
async fn originate_talk_and_hang_up_on_every_carrier() {
    for carrier in ALL {
        let stack = Stack::start(opts()).await;
        stack.hermes.push(HermesReply::text("Great, thanks Bob."));
        let (s, v) = Api::authed(&stack)
            .post(
                "/v1/calls",
                json!({"to": "+1 (555) 765-4321", "from": carrier.number(),
                   "first_message": "Hi, is this Bob?",
                   "system_prompt": "Confirm the caller is Bob."}),
            )
            .await;
        assert_eq!(s, 201, "{carrier:?}: {v}");
        let id = v["call_id"].as_str().expect("call_id").to_string();
        assert_eq!(v["direction"], "outbound");
        assert_eq!(v["status"], "queued");
        assert_eq!(placed(&stack, carrier, 1).await, id, "{carrier:?}");
        match carrier {
            Carrier::Twilio => {}
            Carrier::Telnyx => {
                let d = &stack.telnyx_rest.dialled()[0];
                assert_eq!(d.body["connection_id"], "1684641123236054244");
                assert_eq!(d.body["to"], CALLEE);
                assert_eq!(d.body["from"], TELNYX_NUMBER);
                assert_eq!(d.body["timeout_secs"], 20);
                assert_eq!(
                    d.body["webhook_url"],
                    format!("{PUBLIC_URL}/telnyx/webhook")
                );
                assert!(d.body.get("answering_machine_detection").is_none());
            }
            Carrier::Plivo => {
                let c = &stack.plivo_rest.created()[0];
                assert_eq!(
                    c.path,
                    format!("/v1/Account/{PLIVO_AUTH_ID}/Call/"),
                    "trailing slash"
                );
                assert_eq!(c.field("to"), Some("15557654321"));
                assert_eq!(c.field("from"), Some("15550003000"));
                assert_eq!(
                    c.field("answer_url"),
                    Some(format!("{PUBLIC_URL}/plivo/answer").as_str())
                );
                assert_eq!(
                    c.field("hangup_url"),
                    Some(format!("{PUBLIC_URL}/plivo/hangup").as_str())
                );
                assert_eq!(c.body["ring_timeout"], 20);
                assert!(c.body.get("machine_detection").is_none());
            }
            Carrier::Vonage => {
                let c = &stack.vonage_rest.created()[0];
                assert_eq!(c.path, "/v1/calls");
                assert_eq!(c.body["to"][0]["number"], "15557654321");
                assert_eq!(c.body["from"]["number"], "15550004000");
                assert_eq!(
                    c.body["answer_url"][0],
                    format!("{PUBLIC_URL}/vonage/answer")
                );
                assert_eq!(c.body["event_url"][0], format!("{PUBLIC_URL}/vonage/event"));
                assert_eq!(c.body["ringing_timer"], 20);
            }
        }

        let (leg, sim) = answer(&stack, carrier, 1).await;
        greeted_bob_and_one_turn(&stack, &sim, &format!("{carrier:?}")).await;

        let (s, v) = Api::authed(&stack)
            .post(&format!("/v1/calls/{id}/hangup"), json!({}))
            .await;
        assert_eq!(s, 200, "{carrier:?}: {v}");
        assert_eq!(v["live"], false);
        assert_eq!(v["outcome"], "answered", "{carrier:?}: {v}");
        assert_eq!(v["status"], "completed");
        assert_eq!(v["carrier"], format!("{carrier:?}").to_lowercase());
        stack.wait_rest_hang_up(carrier, &leg).await;
        let (_, v) = Api::authed(&stack)
            .get(&format!("/v1/calls/{id}/transcript"))
            .await;
        assert_eq!(v["transcript"][1]["text"], "yes this is Bob", "{carrier:?}");
        assert_eq!(v["transcript"][2]["heard_text"], "Great, thanks Bob.");
    }
}

#[tokio::test]
async fn a_destination_outside_the_allow_list_reaches_no_carrier() {
    let stack = Stack::start(opts()).await;
    for carrier in ALL {
        let (s, v) = Api::authed(&stack)
            .post(
                "/v1/calls",
                json!({"to": "+442071234567", "from": carrier.number()}),
            )
            .await;
        assert_eq!(s, 403, "{carrier:?}: {v}");
        assert_eq!(v["error"]["code"], "destination_not_allowed");
    }
    assert_eq!(
        carrier_requests(&stack),
        0,
        "a refused call reached a carrier"
    );
}

#[tokio::test]
async fn busy_and_no_answer_are_outcomes_on_every_carrier() {
    for carrier in ALL {
        let stack = Stack::start(opts()).await;
        // Busy, with wait: the request returns when the carrier says so.
        let base = stack.base.clone();
        let from = carrier.number();
        let client = stack.api_client();
        let waiter = tokio::spawn(async move {
            let resp = client
                .post(format!("{base}/v1/calls"))
                .json(&json!({"to": CALLEE, "from": from, "wait": true}))
                .send()
                .await
                .expect("API request");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        });
        let id = placed(&stack, carrier, 1).await;
        unanswered(&stack, carrier, 1, "busy").await;
        let (s, v) = tokio::time::timeout(WAIT, waiter)
            .await
            .expect("originate returns")
            .expect("task");
        assert_eq!(s, 200, "{carrier:?}: {v}");
        assert_eq!(v["call_id"], id.as_str());
        assert_eq!(v["outcome"], "busy", "{carrier:?}: {v}");
        assert_eq!(v["status"], "busy");
        assert_eq!(v["transcript"], json!([]));

        // No answer, without wait.
        let (s, v) = Api::authed(&stack)
            .post("/v1/calls", json!({"to": CALLEE, "from": carrier.number()}))
            .await;
        assert_eq!(s, 201, "{carrier:?}: {v}");
        let id = v["call_id"].as_str().expect("call_id").to_string();
        unanswered(&stack, carrier, 2, "no_answer").await;
        stack.finished(&id).await;
        stack.server.app.store.tx.flush().await.expect("flush");
        let (_, v) = Api::authed(&stack).get(&format!("/v1/calls/{id}")).await;
        assert_eq!(v["outcome"], "no_answer", "{carrier:?}: {v}");
        assert_eq!(v["status"], "no-answer");
    }
}

#[tokio::test]
async fn cancelling_an_unanswered_call_reaches_the_carrier() {
    for carrier in [Carrier::Telnyx, Carrier::Plivo] {
        let stack = Stack::start(opts()).await;
        let (s, v) = Api::authed(&stack)
            .post("/v1/calls", json!({"to": CALLEE, "from": carrier.number()}))
            .await;
        assert_eq!(s, 201, "{carrier:?}: {v}");
        let id = v["call_id"].as_str().expect("call_id").to_string();
        let (s, v) = Api::authed(&stack)
            .post(&format!("/v1/calls/{id}/hangup"), json!({}))
            .await;
        assert_eq!(s, 200, "{carrier:?}: {v}");
        assert_eq!(v["outcome"], "failed");
        match carrier {
            Carrier::Telnyx => assert_eq!(stack.telnyx_rest.hung_up(), vec![id.clone()]),
            _ => assert_eq!(stack.plivo_rest.cancelled(), vec![id.clone()]),
        }
    }
}

#[tokio::test]
async fn a_carrier_refusing_the_call_is_a_carrier_error() {
    let stack = Stack::start(opts()).await;
    stack.rest.fail_with(Some(500));
    stack.telnyx_rest.fail_dial_with(Some(500));
    stack.plivo_rest.fail_create_with(Some(500));
    stack.vonage_rest.fail_create_with(Some(500));
    for carrier in ALL {
        let (s, v) = Api::authed(&stack)
            .post("/v1/calls", json!({"to": CALLEE, "from": carrier.number()}))
            .await;
        assert_eq!(s, 502, "{carrier:?}: {v}");
        assert_eq!(v["error"]["code"], "carrier_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Failed to place call")),
            "{v}"
        );
    }
    assert_eq!(stack.server.app.outbound_live(), 0);
}
