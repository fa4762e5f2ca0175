//! An MCP session continues on another instance: initialized on p0, its `Mcp-Session-Id`
//! works on p1 (rmcp's session store on `mcp_sessions`: p1 replays the handshake), an unknown
//! id is refused everywhere, and `DELETE /mcp` forgets the session for the whole cluster.

use serde_json::{Value, json};

use crate::common::API_TOKEN;
use crate::common::cluster::{ClusterSpec, TestCluster};

/// JSON-RPC over `/mcp` with the API token; answers read from JSON or rmcp's SSE stream.
struct Mcp {
    client: reqwest::Client,
    next_id: u64,
}

impl Mcp {
    fn post(&self, url: &str, session: Option<&str>, body: Value) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .post(url)
            .bearer_auth(API_TOKEN)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(id) = session {
            r = r.header("Mcp-Session-Id", id);
        }
        r
    }

    /// Sends a request; returns the HTTP status, the session id header and the JSON answer.
    async fn request(
        &mut self,
        url: &str,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> (u16, Option<String>, Value) {
        let id = self.next_id;
        self.next_id += 1;
        let r = self
            .post(
                url,
                session,
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
            )
            .send()
            .await
            .expect("MCP request");
        let status = r.status().as_u16();
        let sid = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let text = r.text().await.expect("body");
        let json_text = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| d.starts_with('{'))
            .unwrap_or(&text);
        (
            status,
            sid,
            serde_json::from_str(json_text).unwrap_or(Value::Null),
        )
    }

    /// Opens a session on `url`; returns its id.
    async fn open(&mut self, url: &str) -> String {
        let (status, sid, init) = self
            .request(
                url,
                None,
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "cluster-test", "version": "1"}
                }),
            )
            .await;
        assert_eq!(status, 200, "initialize: {init}");
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        let sid = sid.expect("Mcp-Session-Id on the initialize answer");
        let r = self
            .post(
                url,
                Some(&sid),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )
            .send()
            .await
            .expect("initialized");
        assert!(r.status().is_success(), "initialized: {}", r.status());
        sid
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_continues_on_another_instance() {
    let Some(cluster) = TestCluster::start(ClusterSpec::default()).await else {
        return;
    };
    let mut mcp = Mcp {
        client: reqwest::Client::new(),
        next_id: 1,
    };
    let (p0, p1, p2) = (
        cluster.direct(0, "/mcp"),
        cluster.direct(1, "/mcp"),
        cluster.direct(2, "/mcp"),
    );
    let sid = mcp.open(&p0).await;
    let stored = cluster.db.query(&format!(
        "SELECT count(*) FROM mcp_sessions WHERE session_id = '{sid}'"
    ));
    assert_eq!(stored.trim(), "1", "the session is in the shared store");

    // The same session on p1, which never saw its handshake.
    let (status, _, tools) = mcp.request(&p1, Some(&sid), "tools/list", json!({})).await;
    assert_eq!(status, 200, "tools/list on p1: {tools}");
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("tools on p1: {tools}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"get_calls"), "{names:?}");
    let (status, _, calls) = mcp
        .request(
            &p1,
            Some(&sid),
            "tools/call",
            json!({"name": "get_calls", "arguments": {}}),
        )
        .await;
    assert_eq!(status, 200, "get_calls on p1: {calls}");
    assert!(calls["result"]["content"][0]["text"].is_string(), "{calls}");
    assert_ne!(calls["result"]["isError"], json!(true), "{calls}");
    // And still on p0.
    let (status, _, _) = mcp.request(&p0, Some(&sid), "tools/list", json!({})).await;
    assert_eq!(status, 200);

    // A session id nobody issued is refused on every instance.
    for url in [&p0, &p1, &p2] {
        let (status, _, _) = mcp
            .request(url, Some("no-such-session"), "tools/list", json!({}))
            .await;
        assert_eq!(status, 404, "unknown session on {url}");
    }

    // The client ends the session on p1: the cluster forgets it (p2 never held it).
    let r = mcp
        .client
        .delete(&p1)
        .bearer_auth(API_TOKEN)
        .header("Mcp-Session-Id", &sid)
        .send()
        .await
        .expect("DELETE /mcp");
    assert!(r.status().is_success(), "DELETE: {}", r.status());
    let stored = cluster.db.query(&format!(
        "SELECT count(*) FROM mcp_sessions WHERE session_id = '{sid}'"
    ));
    assert_eq!(stored.trim(), "0", "the session's row is deleted");
    let (status, _, _) = mcp.request(&p2, Some(&sid), "tools/list", json!({})).await;
    assert_eq!(status, 404, "an ended session is not restored elsewhere");
}
