//! Control reaches the call's owner (issue 32 item 4): actions and live reads sent to an
//! instance that does not run the call are forwarded to the one that does, and the caller
//! hears them; forwarded requests need the cluster token and are never forwarded again; a
//! caller's call token works on any instance; a dead owner is answered fast (503, then 409),
//! never with a hang.
//!
//! Until membership (h/member) lands, nothing in the daemon writes `instances` rows, so
//! [`register`] stands in for it: one row per instance with a heartbeat an hour ahead. Where
//! membership wrote the rows already it changes nothing.

mod cache;
mod reach;

use std::time::{Duration, Instant};

use patterd_sim::hermes::HermesReply;
use serde_json::{Value, json};

use crate::common::cluster::{ClusterCall, ClusterSpec, TestCluster};
use crate::common::{API_TOKEN, Opts, WAIT, speak};

/// `[cluster] token` of these tests: not the API token, so each is told from the other.
const CLUSTER_TOKEN: &str = "patterd-test-cluster-token-0123456789";
const FORWARDED_BY: &str = "x-patterd-forwarded-by";

fn spec(opts: Opts) -> ClusterSpec {
    ClusterSpec {
        opts,
        cluster_extra: format!("token = \"{CLUSTER_TOKEN}\"\n"),
        ..ClusterSpec::default()
    }
}

/// Stands in for membership until it lands: an `instances` row for each running instance
/// (its bound address as `internal_url`), its lease fresh for an hour. A no-op for instances
/// that registered themselves.
fn register(cluster: &TestCluster) {
    for (i, addr) in cluster.addrs.iter().enumerate() {
        if cluster.nodes[i].is_none() {
            continue;
        }
        cluster.db.query(&format!(
            "INSERT INTO instances (name, incarnation, internal_url, advertise_url, state, \
             version, max_calls, heartbeat_at) VALUES ('p{i}', 'test', 'http://{addr}', \
             'http://{addr}', 'ready', 'test', 100, now() + interval '1 hour') \
             ON CONFLICT (name) DO NOTHING"
        ));
    }
}

/// Instance `i` heartbeated just now (as if it died right after a heartbeat; it ends the
/// stand-in's hour ahead): its lease runs out `lease_ms` from here, so a test acting at once
/// is within the lease even when a real reaper runs.
fn last_heartbeat_now(cluster: &TestCluster, i: usize) {
    cluster.db.query(&format!(
        "UPDATE instances SET heartbeat_at = now() WHERE name = 'p{i}'"
    ));
}

/// Waits until nothing accepts connections at `addr` (a killed instance is gone).
async fn refused(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "{addr} still accepts");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A request with `token` (and `X-Patterd-Forwarded-By` when `forwarded_by` is set) straight
/// to `url`: its status, `Retry-After` and JSON body.
async fn send(
    method: reqwest::Method,
    url: &str,
    token: &str,
    forwarded_by: Option<&str>,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let mut r = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(token)
        .timeout(Duration::from_secs(20));
    if let Some(by) = forwarded_by {
        r = r.header(FORWARDED_BY, by);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("request");
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let v = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, retry, v)
}

/// The value of the metric line `line` (e.g. `name{label="x"}`) on instance `i`, 0 if absent.
async fn metric(cluster: &TestCluster, i: usize, line: &str) -> f64 {
    let text = cluster
        .api()
        .get(cluster.direct(i, "/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// An instance that does not own `call`.
fn other_than(call: &ClusterCall) -> usize {
    (call.owner + 1) % 3
}

async fn greeted(call: &ClusterCall) {
    call.sim
        .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
}

/// (a)+(b) Calls spread over the instances; `say`, `dtmf` and reads sent to a non-owner
/// reach the owner — the caller hears the words and the digit — and a hang-up sent to a
/// non-owner ends the call. Every hop is counted on the forwarding instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_sent_to_a_non_owner_reaches_the_caller() {
    let Some(cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let mut calls = Vec::new();
    for _ in 0..4 {
        calls.push(cluster.call().await);
    }
    let owners: std::collections::BTreeSet<usize> = calls.iter().map(|c| c.owner).collect();
    assert!(owners.len() >= 2, "calls spread over instances: {owners:?}");
    let call = &calls[0];
    let sid = &call.call_sid;
    let other = other_than(call);
    greeted(call).await;
    let api = cluster.api();
    let on = |path: &str| cluster.direct(other, &format!("/v1/calls/{sid}{path}"));

    // (b) A live read on the non-owner: the owner's answer, `live: true`.
    let v: Value = api.get(on("")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (v["call_id"].as_str(), &v["live"]),
        (Some(sid.as_str()), &json!(true)),
        "{v}"
    );
    let r = api.get(on("/transcript")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // (a) `say` through the non-owner: the caller receives the words' audio.
    let before = call.sim.state().agent_audio_bytes;
    let r = api
        .post(on("/say"))
        .json(&json!({"text": "Still here."}))
        .send()
        .await
        .unwrap();
    let (s, v): (u16, Value) = (r.status().as_u16(), r.json().await.unwrap());
    assert_eq!((s, v["outcome"].as_str()), (200, Some("done")), "{v}");
    call.sim
        .wait_for("the said words' audio", WAIT, |s| {
            s.agent_audio_bytes > before
        })
        .await
        .expect("audio after say");
    assert!(
        cluster
            .fakes
            .el
            .record()
            .texts()
            .iter()
            .any(|t| t.contains("Still here.")),
        "the owner spoke the words"
    );
    // A digit through the non-owner is heard in the call's audio.
    let r = api
        .post(on("/dtmf"))
        .json(&json!({"digits": "7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    call.sim
        .wait_for("7 heard", WAIT, |s| s.dtmf_heard == "7")
        .await
        .expect("the caller hears the digit");
    // An error of the owner comes back as it was sent.
    let r = api
        .post(on("/dtmf"))
        .json(&json!({"digits": "9".repeat(33)}))
        .send()
        .await
        .unwrap();
    let (s, v): (u16, Value) = (r.status().as_u16(), r.json().await.unwrap());
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (422, Some("action_refused")),
        "{v}"
    );

    // A hang-up sent to the non-owner ends the call.
    let r = api
        .post(on("/hangup"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let (s, v): (u16, Value) = (r.status().as_u16(), r.json().await.unwrap());
    assert_eq!((s, &v["live"]), (200, &json!(false)), "{v}");
    call.sim.wait_closed(WAIT).await.expect("the call ends");
    // Ended: the store answers on any instance; actions are refused as over.
    let v: Value = api.get(on("")).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["live"], json!(false), "{v}");
    let r = api
        .post(on("/say"))
        .json(&json!({"text": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);

    let relayed = "patterd_cluster_forwards_total{outcome=\"relayed\"}";
    assert!(metric(&cluster, other, relayed).await >= 6.0);
    assert!(metric(&cluster, other, "patterd_cluster_forward_seconds_count").await >= 6.0);
    assert_eq!(metric(&cluster, call.owner, relayed).await, 0.0);
}

/// (c) A request carrying `X-Patterd-Forwarded-By` needs the cluster token (a forged one, or
/// a client's API token, is 401), the cluster token is not accepted without the header, and a
/// forwarded request for a call not run here is answered here (409), never forwarded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_need_the_cluster_token_and_go_no_further() {
    let Some(cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let other = other_than(&call);
    let sid = &call.call_sid;
    let url = |i: usize, verb: &str| cluster.direct(i, &format!("/v1/calls/{sid}/{verb}"));
    let post = reqwest::Method::POST;
    let digits = || Some(json!({"digits": "5"}));
    for token in ["patterd-forged-cluster-token-000000000", API_TOKEN] {
        let (s, _, v) = send(
            post.clone(),
            &url(other, "dtmf"),
            token,
            Some("p9"),
            digits(),
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{v}"
        );
    }
    let (s, _, v) = send(
        post.clone(),
        &url(other, "dtmf"),
        CLUSTER_TOKEN,
        None,
        digits(),
    )
    .await;
    assert_eq!(s, 401, "the cluster token alone is no client token: {v}");
    // With the cluster token, on a non-owner: answered there, not forwarded again.
    let (s, _, v) = send(
        post.clone(),
        &url(other, "dtmf"),
        CLUSTER_TOKEN,
        Some("p9"),
        digits(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("call_not_live")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("not forwarded again"),
        "{v}"
    );
    let any = "patterd_cluster_forwards_total{outcome=\"relayed\"}";
    assert_eq!(
        metric(&cluster, other, any).await,
        0.0,
        "nothing was forwarded"
    );
    // A forwarded read on a non-owner comes from the store, as this instance sees it.
    let (s, _, v) = send(
        reqwest::Method::GET,
        &cluster.direct(other, &format!("/v1/calls/{sid}")),
        CLUSTER_TOKEN,
        Some("p9"),
        None,
    )
    .await;
    assert_eq!((s, &v["live"]), (200, &json!(false)), "{v}");
    // On the owner the peer's request runs: the caller hears the digit.
    let (s, _, v) = send(
        post,
        &url(call.owner, "dtmf"),
        CLUSTER_TOKEN,
        Some("p9"),
        digits(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    call.sim
        .wait_for("5 heard", WAIT, |s| s.dtmf_heard == "5")
        .await
        .expect("the digit the peer sent");
    // A peer may not place calls or change settings.
    let (s, _, v) = send(
        reqwest::Method::PUT,
        &cluster.direct(other, "/v1/inbound"),
        CLUSTER_TOKEN,
        Some("p9"),
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("forbidden_scope")),
        "{v}"
    );
}

/// A call's own token (minted by its owner, handed to its brain) works on any instance: a
/// non-owner hands it on to the owner, which checks it; a forged one is refused there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_token_works_through_a_non_owner() {
    let opts = Opts {
        transcripts: vec!["hello there".into()],
        ..Opts::default()
    };
    let Some(cluster) = TestCluster::start(spec(opts)).await else {
        return;
    };
    register(&cluster);
    cluster
        .fakes
        .hermes
        .push(HermesReply::text("Hi, how can I help?"));
    let call = cluster.call().await;
    greeted(&call).await;
    speak(&call.sim, 600);
    call.sim
        .wait_for("the reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .expect("one answered turn");
    let token = cluster
        .fakes
        .hermes
        .record()
        .requests
        .iter()
        .find_map(|r| r.header("x-patterd-call-token"))
        .expect("the brain request carries X-Patterd-Call-Token")
        .to_string();
    let other = other_than(&call);
    let sid = &call.call_sid;
    let url = |verb: &str| cluster.direct(other, &format!("/v1/calls/{sid}{verb}"));
    let (s, _, v) = send(
        reqwest::Method::GET,
        &url("/transcript"),
        &token,
        None,
        None,
    )
    .await;
    assert_eq!((s, v["call_id"].as_str()), (200, Some(sid.as_str())), "{v}");
    let (s, _, v) = send(
        reqwest::Method::POST,
        &url("/dtmf"),
        &token,
        None,
        Some(json!({"digits": "3"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    call.sim
        .wait_for("3 heard", WAIT, |s| s.dtmf_heard.contains('3'))
        .await
        .expect("the caller hears it");
    // Not beyond its call: the list stays closed.
    let (s, _, _) = send(
        reqwest::Method::GET,
        &cluster.direct(other, "/v1/calls"),
        &token,
        None,
        None,
    )
    .await;
    assert_eq!(s, 403);
    // A forged token naming the call: the owner refuses it.
    let (body, _tag) = token.rsplit_once('.').expect("a tag");
    let forged = format!("{body}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    let (s, _, v) = send(
        reqwest::Method::POST,
        &url("/dtmf"),
        &forged,
        None,
        Some(json!({"digits": "4"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{v}"
    );
    // Nothing renders locally on a token nobody here can check: not the timeline page.
    let (s, _, _) = send(reqwest::Method::GET, &url("/timeline"), &forged, None, None).await;
    assert_eq!(s, 401);
}

/// (d) The owner is killed: an action sent to a survivor while the owner's lease runs gets
/// 503 `owner_unreachable` with `Retry-After: 2` at once — no hang; once the owner is declared
/// lost, 409 `call_not_live`. (The mark `lost` is written here, as the reaper would; with
/// the reaper merged it may have closed the call already, which is a 409 too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_is_answered_fast() {
    let Some(mut cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let (owner, other) = (call.owner, other_than(&call));
    let sid = call.call_sid.clone();
    // Killed, and asked the moment its port refuses connections: well within its lease (the
    // harness's is 1 s; a real reaper closes the call soon after).
    cluster.node(owner).signal(libc::SIGKILL);
    refused(cluster.addrs[owner]).await;
    let url = cluster.direct(other, &format!("/v1/calls/{sid}/say"));
    let started = Instant::now();
    let (s, retry, v) = send(
        reqwest::Method::POST,
        &url,
        API_TOKEN,
        None,
        Some(json!({"text": "hi"})),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("owner_unreachable")),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("2"));
    assert!(took < Duration::from_secs(2), "answered in {took:?}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("nothing was done"), "{v}");
    let unreachable = "patterd_cluster_forwards_total{outcome=\"unreachable\"}";
    assert!(metric(&cluster, other, unreachable).await >= 1.0);
    cluster.kill(owner).await;

    cluster.db.query(&format!(
        "UPDATE instances SET state = 'lost' WHERE name = 'p{owner}'"
    ));
    let (s, _, v) = send(
        reqwest::Method::POST,
        &url,
        API_TOKEN,
        None,
        Some(json!({"text": "hi"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("call_not_live")),
        "{v}"
    );
}

/// A paused owner (SIGSTOP: its socket still accepts, nothing answers) costs the forward
/// timeout, then 503 `owner_unreachable`; resumed, it takes the next action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_costs_the_forward_timeout_then_503() {
    let mut spec = spec(Opts::default());
    spec.cluster_extra.push_str("forward_timeout_ms = 300\n");
    let Some(cluster) = TestCluster::start(spec).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let (owner, other) = (call.owner, other_than(&call));
    let url = cluster.direct(other, &format!("/v1/calls/{}/dtmf", call.call_sid));
    let digits = |d: &str| Some(json!({ "digits": d }));
    cluster.node(owner).signal(libc::SIGSTOP);
    let started = Instant::now();
    let answer = send(reqwest::Method::POST, &url, API_TOKEN, None, digits("1")).await;
    let took = started.elapsed();
    cluster.node(owner).signal(libc::SIGCONT);
    let (s, retry, v) = answer;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("owner_unreachable")),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("2"));
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("may have reached it"), "{v}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "answered in {took:?}"
    );
    let (s, _, v) = send(reqwest::Method::POST, &url, API_TOKEN, None, digits("2")).await;
    assert_eq!(s, 200, "{v}");
    call.sim
        .wait_for("2 heard", WAIT, |s| s.dtmf_heard.contains('2'))
        .await
        .expect("the resumed owner acts");
}

/// (d, with the reaper) The same without writing `lost` by hand: within lease + reaper the
/// action reads 409 (membership's reaper).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_reads_over_once_reaped() {
    let Some(mut cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let (owner, other) = (call.owner, other_than(&call));
    let sid = call.call_sid.clone();
    cluster.kill(owner).await;
    last_heartbeat_now(&cluster, owner);
    let url = cluster.direct(other, &format!("/v1/calls/{sid}/say"));
    let v = cluster
        .eventually("409 once reaped", Duration::from_secs(5), || async {
            let (s, _, v) = send(
                reqwest::Method::POST,
                &url,
                API_TOKEN,
                None,
                Some(json!({"text": "hi"})),
            )
            .await;
            assert!(s == 503 || s == 409, "{s} {v}");
            (s == 409).then_some(v)
        })
        .await;
    assert_eq!(v["error"]["code"].as_str(), Some("call_not_live"), "{v}");
}
