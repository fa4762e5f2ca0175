//! The owner remembered per call (`app::cluster::owners`): after one forward, an instance
//! sends the next ones on that call straight to the owner without asking the database, and
//! still answers a dead owner fast (503 while its lease runs, 409 once it is declared lost).

use std::time::{Duration, Instant};

use serde_json::json;

use super::{greeted, metric, other_than, refused, register, send, spec};
use crate::common::cluster::TestCluster;
use crate::common::{API_TOKEN, Opts};

/// A `say` on `sid` through instance `via`: its status and error code.
async fn say(cluster: &TestCluster, via: usize, sid: &str) -> (u16, Option<String>) {
    let url = cluster.direct(via, &format!("/v1/calls/{sid}/say"));
    let (s, _, v) = send(
        reqwest::Method::POST,
        &url,
        API_TOKEN,
        None,
        Some(json!({"text": "hi"})),
    )
    .await;
    (s, v["error"]["code"].as_str().map(str::to_string))
}

/// The database is asked once per call and instance: with the call's row pointing at an
/// owner that does not exist, the instance that forwarded before still reaches the real
/// owner (200), while an instance that never forwarded on that call looks it up and reads
/// the call as over (409). Then the owner is killed: the remembering instance answers 503
/// `owner_unreachable` at once (the refused connection sends it back to the database, which
/// says the lease still runs), and 409 once the owner is declared lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_owner_is_reached_without_a_lookup_and_its_death_is_still_seen() {
    let Some(mut cluster) = TestCluster::start(spec(Opts::default())).await else {
        return;
    };
    register(&cluster);
    let call = cluster.call().await;
    greeted(&call).await;
    let (owner, other) = (call.owner, other_than(&call));
    let third = (owner + 2) % 3;
    let sid = call.call_sid.clone();

    assert_eq!(say(&cluster, other, &sid).await, (200, None));
    cluster.db.query(&format!(
        "UPDATE calls SET owner_id = 'nobody' WHERE call_id = '{sid}'"
    ));
    assert_eq!(say(&cluster, other, &sid).await, (200, None), "remembered");
    assert_eq!(
        say(&cluster, third, &sid).await,
        (409, Some("call_not_live".into())),
        "looked up"
    );
    cluster.db.query(&format!(
        "UPDATE calls SET owner_id = 'p{owner}' WHERE call_id = '{sid}'"
    ));

    cluster.node(owner).signal(libc::SIGKILL);
    refused(cluster.addrs[owner]).await;
    let started = Instant::now();
    assert_eq!(
        say(&cluster, other, &sid).await,
        (503, Some("owner_unreachable".into()))
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let unreachable = "patterd_cluster_forwards_total{outcome=\"unreachable\"}";
    assert_eq!(metric(&cluster, other, unreachable).await, 1.0);
    cluster.kill(owner).await;
    cluster.db.query(&format!(
        "UPDATE instances SET state = 'lost' WHERE name = 'p{owner}'"
    ));
    assert_eq!(
        say(&cluster, other, &sid).await,
        (409, Some("call_not_live".into()))
    );
}
