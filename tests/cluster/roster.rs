//! What an operator reads of the cluster: `GET /v1/cluster` lists every instance with its
//! state, lease and live calls, and `GET /v1/metrics` adds the cluster's live calls; a killed
//! instance reads `lost` once reaped and its calls leave the sum.

use std::time::Duration;

use serde_json::Value;

use crate::common::WAIT;
use crate::common::cluster::{ClusterCall, TestCluster};

async fn get(cluster: &TestCluster, i: usize, path: &str) -> Value {
    cluster
        .api()
        .get(cluster.direct(i, path))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json")
}

/// `(name, state, live, live_calls)` of each instance in a `GET /v1/cluster` body.
fn rows(v: &Value) -> Vec<(String, String, bool, i64)> {
    v["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or("").to_string(),
                        m["state"].as_str().unwrap_or("").to_string(),
                        m["live"].as_bool().unwrap_or(false),
                        m["live_calls"].as_i64().unwrap_or(-1),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_view_lists_instances_and_sums_their_live_calls() {
    let Some(mut cluster) = TestCluster::start(Default::default()).await else {
        return;
    };
    let mut calls: Vec<ClusterCall> = Vec::new();
    for _ in 0..3 {
        calls.push(cluster.call().await);
    }
    for c in &calls {
        c.sim
            .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .expect("greeting");
    }
    let victim = calls[0].owner;
    let on_victim = calls.iter().filter(|c| c.owner == victim).count() as i64;
    let watcher = (victim + 1) % 3;

    // Every instance live; the heartbeats carry each one's calls.
    let v = cluster
        .eventually(
            "three live instances carrying three calls",
            WAIT,
            || async {
                let v = get(&cluster, watcher, "/v1/cluster").await;
                let r = rows(&v);
                let all_live =
                    r.len() == 3 && r.iter().all(|(_, s, live, _)| s == "ready" && *live);
                let sum: i64 = r.iter().map(|row| row.3).sum();
                (all_live && sum == 3 && v["live_calls"] == 3).then_some(v)
            },
        )
        .await;
    assert_eq!(v["clustered"], true);
    assert_eq!(v["instance"], format!("p{watcher}"));
    let names: Vec<String> = rows(&v).into_iter().map(|r| r.0).collect();
    assert_eq!(names, ["p0", "p1", "p2"]);
    let m = get(&cluster, watcher, "/v1/metrics").await;
    assert_eq!(
        (&m["cluster"]["live_calls"], &m["cluster"]["instances_live"]),
        (&Value::from(3), &Value::from(3)),
        "{m}"
    );
    // Killed: reaped as lost, its calls out of the sum.
    cluster.kill(victim).await;
    let v = cluster
        .eventually(
            "the killed instance reads lost",
            Duration::from_secs(10),
            || async {
                let v = get(&cluster, watcher, "/v1/cluster").await;
                let lost = rows(&v)
                    .iter()
                    .any(|(n, s, live, _)| *n == format!("p{victim}") && s == "lost" && !live);
                (lost && v["live_calls"] == 3 - on_victim).then_some(v)
            },
        )
        .await;
    assert_eq!(
        rows(&v).iter().filter(|r| r.2).count(),
        2,
        "two live instances: {v}"
    );
}
