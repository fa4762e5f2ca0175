//! Self-fencing and the states an instance writes: an instance that cannot renew its heartbeat
//! for `lease − 2 × heartbeat` answers `/readyz` 503 and refuses new calls, and admits again
//! once a heartbeat is renewed; one whose row reads `lost` or another incarnation's exits
//! non-zero; SIGTERM writes `draining` at once, a clean exit `stopped`, and a stopped instance
//! is never reaped.

use std::time::Duration;

use crate::common::cluster::{ClusterSpec, TestCluster};
use crate::common::{CALLER, OUR_NUMBER, WAIT};

async fn readyz(cluster: &TestCluster, i: usize) -> Option<(u16, String)> {
    let r = reqwest::Client::new()
        .get(cluster.direct(i, "/readyz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_renew_its_heartbeat_fences_itself_until_it_can() {
    let spec = ClusterSpec {
        instances: 1,
        ..ClusterSpec::default()
    };
    let Some(cluster) = TestCluster::start(spec).await else {
        return;
    };
    assert_eq!(readyz(&cluster, 0).await.map(|r| r.0), Some(200));
    // The heartbeat's statement fails while its table is away.
    cluster
        .db
        .query("ALTER TABLE instances RENAME TO instances_away");
    cluster
        .eventually("/readyz says fenced", WAIT, || async {
            readyz(&cluster, 0)
                .await
                .filter(|r| r.0 == 503 && r.1.contains("fenced"))
        })
        .await;
    // The front sends nothing to a backend that is not ready: post to the instance itself.
    let direct = patterd_sim::twilio::SimTwilio::new(
        &cluster.direct(0, ""),
        crate::common::PUBLIC_URL,
        crate::common::ACCOUNT_SID,
        crate::common::AUTH_TOKEN,
    );
    let (_, busy) = direct
        .incoming_call("/twilio/voice", CALLER, OUR_NUMBER)
        .await
        .expect("webhook");
    assert!(busy.body.contains(r#"reason="busy""#), "{}", busy.body);
    cluster
        .db
        .query("ALTER TABLE instances_away RENAME TO instances");
    cluster
        .eventually("/readyz is 200 again", WAIT, || async {
            readyz(&cluster, 0).await.filter(|r| r.0 == 200)
        })
        .await;
    // Fenced is not lost: the instance kept its row and runs on.
    assert_eq!(
        cluster
            .db
            .query("SELECT state FROM instances WHERE name = 'p0'"),
        "ready"
    );
    assert!(
        cluster.front.wait_ready(1, WAIT).await,
        "the front sees it ready"
    );
    let call = cluster.call().await;
    call.sim
        .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("a new call is admitted again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_writes_draining_at_once_and_a_clean_exit_stopped_which_is_never_reaped() {
    let spec = ClusterSpec {
        instances: 2,
        ..ClusterSpec::default()
    };
    let Some(mut cluster) = TestCluster::start(spec).await else {
        return;
    };
    // A live call holds p1 in its drain.
    let mut call = cluster.call().await;
    while call.owner != 1 {
        call = cluster.call().await;
    }
    call.sim
        .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting");
    let state = |c: &TestCluster| c.db.query("SELECT state FROM instances WHERE name = 'p1'");
    cluster.terminate(1);
    // Well within one heartbeat of the harness (200 ms) plus the signal's way.
    cluster
        .eventually("p1 reads draining", Duration::from_millis(400), || {
            let s = state(&cluster);
            async move { (s == "draining").then_some(()) }
        })
        .await;
    call.sim.hang_up().await;
    assert_eq!(cluster.wait_exit(1, WAIT).await, Some(0));
    assert_eq!(state(&cluster), "stopped");
    // Past a lease and several reaper passes, the stopped instance is still stopped.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(state(&cluster), "stopped");
    assert_eq!(
        cluster
            .db
            .query("SELECT count(*) FROM instances WHERE state = 'lost'"),
        "0"
    );
}

/// An instance whose row reads `lost` (a peer reaped it) or names another incarnation (another
/// process took the name) exits non-zero at its next heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_declared_lost_or_replaced_exits_non_zero() {
    let spec = ClusterSpec {
        instances: 2,
        ..ClusterSpec::default()
    };
    let Some(mut cluster) = TestCluster::start(spec).await else {
        return;
    };
    cluster
        .db
        .query("UPDATE instances SET state = 'lost' WHERE name = 'p0'");
    cluster
        .db
        .query("UPDATE instances SET incarnation = 'someone-else' WHERE name = 'p1'");
    let lost = cluster.wait_exit(0, WAIT).await;
    let replaced = cluster.wait_exit(1, WAIT).await;
    assert_eq!((lost, replaced), (Some(3), Some(3)));
}
