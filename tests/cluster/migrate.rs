//! Three instances started at the same moment on an empty database: the migrations run once
//! (sqlx's advisory lock), every instance serves, and each registers under its own name.

use std::time::Duration;

use crate::common::cluster::{ClusterSpec, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_migrate_an_empty_database_once() {
    let Some(cluster) = TestCluster::start(ClusterSpec::default()).await else {
        return;
    };
    let versions = cluster
        .db
        .query("SELECT version, count(*) FROM _sqlx_migrations GROUP BY version ORDER BY version");
    let rows: Vec<&str> = versions.lines().collect();
    assert!(rows.len() >= 2, "migrations: {versions}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            *row,
            format!("{}|1", i + 1),
            "each version once: {versions}"
        );
    }
    // Every instance answers through the front and on its own address.
    let client = reqwest::Client::new();
    for i in 0..3 {
        let r = client
            .get(cluster.direct(i, "/healthz"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("healthz");
        assert_eq!(r.status(), 200);
    }
    assert_eq!(cluster.front.ready().len(), 3);
}
