//! The webhook outbox shared by a cluster: calls owned by three instances end while the
//! receiver is slow (every answer takes 200 ms) and each instance may have two attempts in
//! flight; every instance claims from the one outbox (`FOR UPDATE SKIP LOCKED`), so each
//! `call.ended` is acknowledged exactly once and more than one instance delivers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use patterd_sim::webhook_receiver::{Answer, FakeWebhookReceiver};

use crate::common::cluster::{ClusterSpec, TestCluster};
use crate::common::{Opts, WAIT};

const CALLS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_delivers_from_the_one_outbox_and_no_event_goes_twice() {
    let hooks = FakeWebhookReceiver::start().await.expect("receiver");
    for _ in 0..CALLS {
        hooks.push(Answer::status(200).delayed(Duration::from_millis(200)));
    }
    let Some(cluster) = TestCluster::start(ClusterSpec {
        opts: Opts {
            extra_config: format!(
                "\n[[webhooks]]\nurl = \"{}\"\nevents = [\"call.ended\"]\n\
                 secret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\"\n\
                 allow_loopback = true\n\n[webhook_delivery]\nconcurrency = 2\npoll_ms = 50\n\
                 retry_base_ms = 100\nretry_max_ms = 1000\n",
                hooks.url()
            ),
            ..Opts::default()
        },
        ..ClusterSpec::default()
    })
    .await
    else {
        return;
    };
    let mut sids = BTreeSet::new();
    let mut owners = BTreeSet::new();
    for _ in 0..CALLS {
        let c = cluster.call().await;
        c.sim.hang_up().await;
        owners.insert(c.owner);
        sids.insert(c.call_sid);
    }
    assert!(owners.len() > 1, "the front spread the calls: {owners:?}");
    let rec = hooks
        .wait_until("every call.ended acknowledged", WAIT * 2, |r| {
            r.acknowledged_ids().len() == CALLS
        })
        .await;
    let mut per_id: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &rec.deliveries {
        *per_id.entry(d.id()).or_default() += 1;
    }
    assert!(
        per_id.values().all(|n| *n == 1),
        "an event went twice: {per_id:?}"
    );
    let reported: BTreeSet<String> = rec
        .deliveries
        .iter()
        .map(|d| {
            d.json()["data"]["call"]["call_id"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(reported, sids);
    // Who delivered: each instance's own counter (counted once its answer came back).
    let api = cluster.api();
    let delivered = cluster
        .eventually("every delivery counted", WAIT, || async {
            let mut delivered = Vec::new();
            for i in 0..3 {
                let m = api
                    .get(cluster.direct(i, "/metrics"))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                let n: u64 = m
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("patterd_webhook_deliveries_total{outcome=\"delivered\"} ")
                    })
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                delivered.push(n);
            }
            (delivered.iter().sum::<u64>() == CALLS as u64).then_some(delivered)
        })
        .await;
    assert_eq!(delivered.iter().sum::<u64>(), CALLS as u64, "{delivered:?}");
    assert!(
        delivered.iter().filter(|n| **n > 0).count() > 1,
        "more than one instance delivered: {delivered:?}"
    );
}
