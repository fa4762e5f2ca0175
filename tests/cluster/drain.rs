//! SIGTERM drains with no call cut and no new call refused: the draining instance k keeps its
//! live call's turns; new-call webhooks that still reach k straight (a load balancer that has
//! not yet seen k's `/readyz` 503) are handed to a ready peer, verbatim and still signed, and
//! the carrier gets the peer's answer — its stream URL names the peer, which owns the call (a
//! ready peer that cannot be reached is skipped); k exits 0 once its call ends.

use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::call::{SimCall, SimCallConfig};
use patterd_sim::twilio::xml::parse_twiml;

use crate::common::cluster::{ClusterSpec, TestCluster};
use crate::common::{
    ACCOUNT_SID, API_TOKEN, AUTH_TOKEN, CALLER, OUR_NUMBER, Opts, PLIVO_AUTH_TOKEN, PLIVO_NUMBER,
    PUBLIC_URL, TELNYX_API_KEY, TELNYX_NUMBER, WAIT, other_carriers, speak,
};

/// Each instance's row as membership would keep it, when no membership wrote one yet: `ready`,
/// its internal URL, a heartbeat that stays fresh for the test. (With membership the rows
/// exist and are kept fresh by the heartbeats; this then changes nothing.)
fn ensure_instance_rows(cluster: &TestCluster) {
    for (i, addr) in cluster.addrs.iter().enumerate() {
        let name = TestCluster::name(i);
        cluster.db.query(&format!(
            "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state, version,
               max_calls, live_calls, heartbeat_at)
             VALUES ('{name}', 'test', 'http://{addr}', 'http://{addr}', 'ready', 'test', 500, 0,
               now() + interval '1 hour')
             ON CONFLICT (name) DO NOTHING"
        ));
    }
}

/// The `host:port` a TwiML answer's stream URL names.
fn stream_host(body: &str) -> String {
    let answer = parse_twiml(body).unwrap_or_else(|e| panic!("TwiML: {e:?}: {body}"));
    let url = answer
        .stream_url
        .unwrap_or_else(|| panic!("a <Stream> url: {body}"));
    url.split_once("://")
        .map(|(_, r)| r.split('/').next().unwrap_or(r).to_string())
        .unwrap_or_else(|| panic!("absolute stream url {url}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_new_calls_to_peers_and_finishes_its_own() {
    let Some(mut cluster) = TestCluster::start(ClusterSpec::default()).await else {
        return;
    };
    ensure_instance_rows(&cluster);
    let live = cluster.call().await;
    let k = live.owner;
    live.sim
        .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");

    cluster.terminate(k);
    let client = reqwest::Client::new();
    let readyz = cluster.direct(k, "/readyz");
    cluster
        .eventually("k's /readyz answers 503", WAIT, || {
            let r = client.get(&readyz).send();
            async move { r.await.ok().filter(|r| r.status() == 503).map(|_| ()) }
        })
        .await;

    let state = format!(
        "SELECT state FROM instances WHERE name = '{}'",
        TestCluster::name(k)
    );
    cluster
        .eventually("k is marked draining", WAIT, || {
            let s = cluster.db.query(&state);
            async move { (s.trim() == "draining").then_some(()) }
        })
        .await;

    // A ready peer nobody can reach, first in the choice (the most room): skipped at connect.
    cluster.db.query(
        "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state, version,
           max_calls, live_calls, heartbeat_at)
         VALUES ('p9', 'test', 'http://127.0.0.1:9', 'http://127.0.0.1:9', 'ready', 'test',
           100000, 0, now() + interval '1 hour')",
    );

    // New calls sent straight to the draining k, signed for the shared URL as Twilio signs.
    let straight = SimTwilio::new(&cluster.direct(k, ""), PUBLIC_URL, ACCOUNT_SID, AUTH_TOKEN);
    let mut handed = Vec::new();
    for _ in 0..3 {
        let (sid, resp) = straight
            .incoming_call("/twilio/voice", CALLER, OUR_NUMBER)
            .await
            .expect("webhook to k");
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert!(!resp.body.contains("<Reject"), "refused: {}", resp.body);
        let host = stream_host(&resp.body);
        let peer = cluster
            .index_of(&host)
            .unwrap_or_else(|| panic!("the stream URL names no instance: {host}"));
        assert_ne!(peer, k, "the draining instance took a new call");
        let owner = cluster.db.query(&format!(
            "SELECT owner_id FROM calls WHERE call_id = '{sid}'"
        ));
        assert_eq!(owner.trim(), TestCluster::name(peer), "the peer owns it");
        handed.push((sid, resp.body, host));
    }

    // A handed call is a whole call on its peer: the media stream opens there, the greeting plays.
    let (sid, body, host) = &handed[0];
    let answer = parse_twiml(body).expect("TwiML");
    let cfg = SimCallConfig::new(&format!("ws://{host}"), ACCOUNT_SID, sid);
    let on_peer = SimCall::from_answer(&answer, cfg)
        .await
        .expect("media stream opens on the peer");
    on_peer
        .wait_for("greeting on the peer", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting on the peer");

    // k's own call keeps its turns while k drains.
    speak(&live.sim, 600);
    live.sim
        .wait_for("a reply during the drain", WAIT, |s| {
            s.marks_echoed.len() >= 2
        })
        .await
        .expect("reply during drain");
    let metrics = client
        .get(cluster.direct(k, "/metrics"))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("patterd_cluster_handoffs_total{outcome=\"handed\"} 3"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("handoffs"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        cluster.nodes[k]
            .as_mut()
            .expect("k")
            .child
            .try_wait()
            .expect("try_wait")
            .is_none(),
        "k exited with a live call"
    );

    // k's caller hangs up: k exits 0. The handed call is untouched on its peer.
    live.sim.hang_up().await;
    assert_eq!(cluster.wait_exit(k, WAIT).await, Some(0), "k exits 0");
    let status = cluster.db.query(&format!(
        "SELECT ended_at IS NULL FROM calls WHERE call_id = '{sid}'"
    ));
    assert_eq!(
        status.trim(),
        "t",
        "the handed call is still live on its peer"
    );
    on_peer.hang_up().await;
}

/// At `max_calls` (1 here) a cluster instance hands new calls of every carrier to a peer the
/// same way: Twilio's voice webhook and Telnyx's `call.initiated` (its event id released for
/// the peer) go to a peer with room — a peer that is full as well answers "refused" and the
/// next one is tried — and only when every peer is full is the call refused busy here (Plivo's
/// answer, last). A webhook a peer handed here is never handed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_instance_hands_new_calls_of_every_carrier_to_a_peer_with_room() {
    let telnyx_rest = patterd_sim::telnyx::FakeTelnyxRest::start(TELNYX_API_KEY)
        .await
        .expect("fake Telnyx REST");
    let mut opts = Opts {
        max_calls: 1,
        ..Opts::default()
    };
    opts.extra_config = other_carriers(&opts, &telnyx_rest.base_url, "http://127.0.0.1:9");
    let Some(cluster) = TestCluster::start(ClusterSpec {
        opts,
        ..ClusterSpec::default()
    })
    .await
    else {
        return;
    };
    ensure_instance_rows(&cluster);
    let live = cluster.call().await;
    let k = live.owner;
    let owner_of = |id: &str| {
        let o = cluster.db.query(&format!(
            "SELECT owner_id FROM calls WHERE call_id = '{id}'"
        ));
        o.trim().to_string()
    };

    // Twilio, straight to the full k: a peer answers.
    let twilio = SimTwilio::new(&cluster.direct(k, ""), PUBLIC_URL, ACCOUNT_SID, AUTH_TOKEN);
    let (sid, resp) = twilio
        .incoming_call("/twilio/voice", CALLER, OUR_NUMBER)
        .await
        .expect("twilio webhook");
    assert_eq!(resp.status, 200, "{}", resp.body);
    let a = cluster
        .index_of(&stream_host(&resp.body))
        .expect("an instance");
    assert_ne!(a, k);
    assert_eq!(owner_of(&sid), TestCluster::name(a));

    // A webhook handed here by a peer is not handed on: k refuses it busy.
    let (_, resp) = SimTwilioWith::handed_by(&cluster.direct(k, ""), "p9")
        .incoming_call("/twilio/voice", CALLER, OUR_NUMBER)
        .await
        .expect("handed twilio webhook");
    assert_eq!(resp.status, 503, "{}", resp.body);

    // Telnyx: a now full peer refuses, the other takes it and answers the call over REST.
    let telnyx = patterd_sim::telnyx::SimTelnyx::new(
        &cluster.direct(k, ""),
        PUBLIC_URL,
        crate::common::telnyx_seed(),
    );
    let (id, resp) = telnyx
        .incoming_call(CALLER, TELNYX_NUMBER)
        .await
        .expect("telnyx webhook");
    assert_eq!(resp.status, 200, "{}", resp.body);
    let b = (0..3)
        .find(|i| *i != k && *i != a)
        .expect("a third instance");
    assert_eq!(
        owner_of(&id),
        TestCluster::name(b),
        "the peer with room owns it"
    );
    telnyx_rest
        .wait_until("the peer answers the Telnyx call", |r| {
            r.ok("answer").iter().any(|c| c.call_control_id == id)
        })
        .await;
    assert!(
        telnyx_rest.record().ok("reject").is_empty(),
        "nobody rejected it"
    );

    // Plivo, with every instance full: refused busy by k itself.
    let plivo =
        patterd_sim::plivo::SimPlivo::new(&cluster.direct(k, ""), PUBLIC_URL, PLIVO_AUTH_TOKEN);
    let (uuid, resp) = plivo
        .incoming_call(CALLER, PLIVO_NUMBER)
        .await
        .expect("plivo webhook");
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(resp.body.contains("busy"), "refused busy: {}", resp.body);
    assert_eq!(owner_of(&uuid), "", "nobody claimed it");

    let metrics = reqwest::Client::new()
        .get(cluster.direct(k, "/metrics"))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    for line in [
        "patterd_cluster_handoffs_total{outcome=\"handed\"} 2",
        "patterd_cluster_handoffs_total{outcome=\"peers_busy\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}");
    }
    live.sim.hang_up().await;
}

/// Twilio's voice webhook, signed for the shared URL, carrying `X-Patterd-Handed-By` as a
/// peer's hand-off does.
struct SimTwilioWith {
    base: String,
    by: String,
}

impl SimTwilioWith {
    fn handed_by(base: &str, by: &str) -> Self {
        Self {
            base: base.to_string(),
            by: by.to_string(),
        }
    }

    async fn incoming_call(
        &self,
        path: &str,
        from: &str,
        to: &str,
    ) -> Result<(String, patterd_sim::twilio::WebhookResponse), reqwest::Error> {
        let sid = patterd_sim::twilio::new_sid("CA");
        let params = patterd_sim::twilio::voice_webhook_params(ACCOUNT_SID, &sid, from, to);
        let url = patterd_sim::twilio::signed_url(PUBLIC_URL, path);
        let sig = patterd_sim::twilio::sign_request(AUTH_TOKEN, &url, &params);
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .header("X-Twilio-Signature", sig)
            .header("X-Patterd-Handed-By", &self.by)
            .form(&params)
            .send()
            .await?;
        Ok((sid, patterd_sim::twilio::WebhookResponse::read(resp).await?))
    }
}
