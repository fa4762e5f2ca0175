//! More ways control reaches the owner: MCP tools on a non-owner (the in-process MCP server
//! runs the same API functions), a recording streamed from the instance that recorded it
//! (404 with the reason once that instance is gone), and the added latency of a forwarded
//! request, measured.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{greeted, other_than, register, send, spec};
use crate::common::cluster::TestCluster;
use crate::common::{API_TOKEN, Opts, WAIT};

/// One MCP session on `url` (`/mcp` of one instance), as a client would open it.
struct Mcp {
    client: reqwest::Client,
    url: String,
    session: Option<String>,
    next_id: u64,
}

impl Mcp {
    async fn open(url: String) -> Self {
        let mut m = Self {
            client: reqwest::Client::new(),
            url,
            session: None,
            next_id: 1,
        };
        let init = m
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "cluster-test", "version": "1"}
                }),
            )
            .await;
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        let r = m
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
            .await
            .expect("notify");
        assert!(r.status().is_success(), "{}", r.status());
        m
    }

    fn post(&self, body: Value) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .post(&self.url)
            .bearer_auth(API_TOKEN)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(id) = &self.session {
            r = r.header("Mcp-Session-Id", id);
        }
        r
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let r = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .send()
            .await
            .expect("MCP request");
        assert_eq!(r.status(), 200, "{method}");
        if let Some(s) = r.headers().get("mcp-session-id") {
            self.session = Some(s.to_str().expect("session id").to_string());
        }
        let text = r.text().await.expect("body");
        let json_text = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| d.starts_with('{'))
            .unwrap_or(&text);
        serde_json::from_str(json_text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// A tool's text and whether it is an error.
    async fn call(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let v = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        let r = &v["result"];
        (
            r["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            r["isError"] == json!(true),
        )
    }
}

/// MCP tools on an instance that does not run the call act on it through its owner: the
/// caller hears the digit, and `end_call` ends the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_on_a_non_owner_reach_the_call() {
    let Some(cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let other = other_than(&call);
    let sid = call.call_sid.as_str();
    let mut mcp = Mcp::open(cluster.direct(other, "/mcp")).await;
    let (text, error) = mcp
        .call("send_dtmf", json!({"callId": sid, "digits": "8"}))
        .await;
    assert!(!error, "{text}");
    call.sim
        .wait_for("8 heard", WAIT, |s| s.dtmf_heard == "8")
        .await
        .expect("the caller hears the digit sent over MCP");
    // An owner's refusal is the tool's error text, as on the owner.
    let (text, error) = mcp
        .call(
            "send_dtmf",
            json!({"callId": sid, "digits": "9".repeat(33)}),
        )
        .await;
    assert!(error && text.contains("at most 32"), "{text}");
    let (text, error) = mcp.call("end_call", json!({"callId": sid})).await;
    assert!(!error, "{text}");
    call.sim.wait_closed(WAIT).await.expect("the call ends");
}

/// A recording is on the disk of the instance that recorded it: another instance streams it
/// from there, byte for byte; once that instance is gone, 404 `no_recording` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_is_served_by_any_instance_while_its_recorder_runs() {
    let opts = Opts {
        agent_extra: "record = true".into(),
        ..Opts::default()
    };
    let Some(mut cluster) = TestCluster::start(spec(opts)).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    call.sim.hang_up().await;
    let (owner, other) = (call.owner, other_than(&call));
    let sid = call.call_sid.clone();
    let path = format!("/v1/calls/{sid}/recording");
    let api = cluster.api();
    let on_owner = cluster
        .eventually("the recording on its owner", WAIT, || {
            let (api, url) = (api.clone(), cluster.direct(owner, &path));
            async move {
                let r = api.get(url).send().await.ok()?;
                if r.status() != 200 {
                    return None;
                }
                r.bytes().await.ok()
            }
        })
        .await;
    let r = api.get(cluster.direct(other, &path)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "audio/wav");
    assert_eq!(
        r.headers()["content-length"],
        on_owner.len().to_string().as_str()
    );
    let relayed = r.bytes().await.unwrap();
    assert!(relayed.len() > 44 && relayed == on_owner, "the same WAV");
    // Unauthenticated: refused before anything is forwarded.
    let anon = reqwest::Client::new()
        .get(cluster.direct(other, &path))
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 401);

    cluster.kill(owner).await;
    cluster.db.query(&format!(
        "UPDATE instances SET state = 'lost', heartbeat_at = LEAST(heartbeat_at, now()) \
         WHERE name = 'p{owner}'"
    ));
    let (s, _, v) = send(
        reqwest::Method::GET,
        &cluster.direct(other, &path),
        API_TOKEN,
        None,
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("no_recording")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no longer running"),
        "{v}"
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The hop's cost: the same read on the owner and through a non-owner, one after the other,
/// on kept-alive connections. Printed for docs/BENCHMARKS.md; asserted loosely (a debug build
/// on a shared 2-core box), with the p50 target of the issue (≤ 1 ms) checked in release runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarding_hop_adds_little_latency() {
    let Some(cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let other = other_than(&call);
    let path = format!("/v1/calls/{}", call.call_sid);
    let api = cluster.api();
    let (direct_url, forwarded_url) = (
        cluster.direct(call.owner, &path),
        cluster.direct(other, &path),
    );
    let mut direct = Vec::new();
    let mut forwarded = Vec::new();
    for round in 0..220 {
        for (url, out) in [(&direct_url, &mut direct), (&forwarded_url, &mut forwarded)] {
            let started = Instant::now();
            let r = api.get(url.as_str()).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await.unwrap();
            if round >= 20 {
                out.push(started.elapsed());
            }
        }
    }
    direct.sort();
    forwarded.sort();
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    let (f50, f99) = (percentile(&forwarded, 0.5), percentile(&forwarded, 0.99));
    let added50 = f50.saturating_sub(d50);
    let added99 = f99.saturating_sub(d99);
    eprintln!(
        "forwarded GET /v1/calls/{{id}} ({} samples): direct p50 {d50:?} p99 {d99:?}; through a \
         non-owner p50 {f50:?} p99 {f99:?}; added p50 {added50:?} p99 {added99:?}",
        direct.len()
    );
    assert!(added50 < Duration::from_millis(25), "added p50 {added50:?}");
    if !cfg!(debug_assertions) {
        assert!(added50 <= Duration::from_millis(1), "added p50 {added50:?}");
    }
}
