//! SIGKILL of one instance mid-call: a peer's reaper declares it lost within the lease and a
//! reaper pass, its calls read `failed` in the store with the instance named, their legs are
//! hung up at the fake Twilio REST API, its outbound slots are freed, the other instances' calls go on taking turns, and a
//! survivor's `/metrics` shows the lost instance.

use std::time::{Duration, Instant};

use crate::common::cluster::{ClusterCall, ClusterSpec, TestCluster};
use crate::common::{API_TOKEN, Opts, WAIT, speak};

/// The harness's lease (1 s) and reaper interval (200 ms), plus slack for a loaded machine.
const REAPED_WITHIN: Duration = Duration::from_millis(1000 + 200 + 3000);

/// The caller speaks and the agent replies: one more turn on `call`.
async fn one_more_turn(call: &ClusterCall, who: &str) {
    let before = call.sim.state().marks_echoed.len();
    speak(&call.sim, 700);
    call.sim
        .wait_for(who, WAIT, |s| s.marks_echoed.len() > before)
        .await
        .unwrap_or_else(|e| panic!("{who}: no reply: {e}"));
}

fn status(cluster: &TestCluster, call_sid: &str) -> String {
    // Call SIDs are `CA` and hex digits (the simulator's): safe in the statement.
    cluster.db.query(&format!(
        "SELECT status || '|' || COALESCE(ended_reason, '') FROM calls WHERE call_id = '{call_sid}'"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_calls_are_reaped_and_the_others_go_on() {
    let spec = ClusterSpec {
        opts: Opts {
            transcripts: vec!["hello there".into(); 40],
            allowed_destinations: vec!["+1555".into()],
            ..Opts::default()
        },
        ..ClusterSpec::default()
    };
    let Some(mut cluster) = TestCluster::start(spec).await else {
        return;
    };
    // Calls through the front until at least four, on at least two instances, one of which
    // owns two or more (the one killed).
    let mut calls: Vec<ClusterCall> = Vec::new();
    let per_owner = |calls: &[ClusterCall]| {
        let mut n = [0usize; 3];
        for c in calls {
            n[c.owner] += 1;
        }
        n
    };
    loop {
        let n = per_owner(&calls);
        if calls.len() >= 4
            && n.iter().filter(|&&k| k > 0).count() >= 2
            && n.iter().any(|&k| k >= 2)
        {
            break;
        }
        assert!(
            calls.len() < 9,
            "the front spreads calls over instances: {n:?}"
        );
        calls.push(cluster.call().await);
    }
    for c in &calls {
        c.sim
            .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .expect("greeting plays");
    }
    let n = per_owner(&calls);
    let victim = (0..3).max_by_key(|&i| n[i]).expect("an owner");
    let (dead, alive): (Vec<&ClusterCall>, Vec<&ClusterCall>) =
        calls.iter().partition(|c| c.owner == victim);
    let survivor = alive[0].owner;
    // The victim also holds an outbound slot: a dial it placed, held at the carrier.
    cluster.fakes.rest.hold_dials(true);
    let originate = {
        let (api, url) = (cluster.api(), cluster.direct(victim, "/v1/calls"));
        tokio::spawn(async move {
            let _ = api
                .post(url)
                .json(&serde_json::json!({"to": "+15557650001"}))
                .send()
                .await;
        })
    };
    cluster
        .fakes
        .rest
        .wait_for_dials_started(1, WAIT)
        .await
        .expect("the victim's dial reaches the carrier");
    let slots = |c: &TestCluster| {
        c.db.query(&format!(
            "SELECT count(*) FROM outbound_slots WHERE instance = '{}'",
            TestCluster::name(victim)
        ))
    };
    assert_eq!(slots(&cluster), "1");
    let before: Vec<String> = alive
        .iter()
        .map(|c| status(&cluster, &c.call_sid))
        .collect();
    for (c, s) in alive.iter().zip(&before) {
        assert!(
            s.ends_with('|'),
            "{} is live before the kill: {s}",
            c.call_sid
        );
    }

    let killed = Instant::now();
    cluster.kill(victim).await;
    let reason = format!(
        "failed|instance {} stopped before the call ended",
        TestCluster::name(victim)
    );
    for c in &dead {
        cluster
            .eventually(
                "the killed instance's call is failed",
                REAPED_WITHIN,
                || {
                    let done = status(&cluster, &c.call_sid) == reason;
                    async move { done.then_some(()) }
                },
            )
            .await;
    }
    let reaped_after = killed.elapsed();
    assert_eq!(slots(&cluster), "0", "the lost instance's slots are freed");
    originate.abort();
    cluster.fakes.rest.hold_dials(false);
    for c in &dead {
        cluster
            .eventually("its leg is hung up at the carrier", WAIT, || {
                let hung = cluster.fakes.rest.hung_up().contains(&c.call_sid);
                async move { hung.then_some(()) }
            })
            .await;
    }
    // The other instances' calls were not touched and keep taking turns.
    for (c, s) in alive.iter().zip(&before) {
        assert_eq!(
            &status(&cluster, &c.call_sid),
            s,
            "a survivor's call untouched"
        );
        assert!(!cluster.fakes.rest.hung_up().contains(&c.call_sid));
        one_more_turn(c, "a survivor's call").await;
    }
    // A survivor's metrics show the lost instance (read by its heartbeat task).
    let client = crate::common::api_client(API_TOKEN);
    let metrics_url = cluster.direct(survivor, "/metrics");
    cluster
        .eventually(
            "a survivor's /metrics shows one lost instance",
            WAIT,
            || {
                let (client, url) = (client.clone(), metrics_url.clone());
                async move {
                    let text = client.get(&url).send().await.ok()?.text().await.ok()?;
                    let lost = text.contains("patterd_cluster_instances{state=\"lost\"} 1");
                    let ready = text.contains("patterd_cluster_instances{state=\"ready\"} 2");
                    (lost && ready && text.contains("patterd_cluster_reaped_calls_total"))
                        .then_some(())
                }
            },
        )
        .await;
    let row = cluster.db.query(&format!(
        "SELECT state FROM instances WHERE name = '{}'",
        TestCluster::name(victim)
    ));
    assert_eq!(row, "lost");
    eprintln!(
        "killed {} with {} call(s): reaped within {} ms",
        TestCluster::name(victim),
        dead.len(),
        reaped_after.as_millis()
    );
}

/// A lone instance killed mid-call and started again under its name: no peer could reap it, so
/// its new incarnation closes the previous one's calls as it registers (before it is ready) and
/// hangs their legs up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_reaps_its_previous_incarnation_at_once() {
    let spec = ClusterSpec {
        instances: 1,
        ..ClusterSpec::default()
    };
    let Some(mut cluster) = TestCluster::start(spec).await else {
        return;
    };
    let call = cluster.call().await;
    call.sim
        .wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .expect("greeting plays");
    // The store writes in batches: wait until the answered call is committed as in progress
    // (under load that can trail the greeting), then kill.
    cluster
        .eventually("the call is stored in progress", WAIT, || {
            let s = status(&cluster, &call.call_sid);
            async move { (s == "in-progress|").then_some(()) }
        })
        .await;
    cluster.kill(0).await;
    assert_eq!(status(&cluster, &call.call_sid), "in-progress|");
    cluster.restart(0).await;
    // Registered before it serves: the call is closed by the time it is up.
    assert_eq!(
        status(&cluster, &call.call_sid),
        "failed|instance p0 stopped before the call ended"
    );
    cluster
        .eventually("its leg is hung up at the carrier", WAIT, || {
            let hung = cluster.fakes.rest.hung_up().contains(&call.call_sid);
            async move { hung.then_some(()) }
        })
        .await;
    assert_eq!(
        cluster
            .db
            .query("SELECT state FROM instances WHERE name = 'p0'"),
        "ready"
    );
}
