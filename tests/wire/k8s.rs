//! The Kubernetes example (deploy/k8s) against the configuration loader: the ConfigMap's
//! patter.toml loads, with no warning, in the environment statefulset.yaml gives a pod, and
//! resolves to one cluster instance per pod (name, per-pod advertise URL, headless-Service
//! internal URL); the pod's grace period covers the ConfigMap's drain. The manifests' schemas
//! and cross-file rules are deploy/k8s/validate.sh's (CI), which needs Python and PyPI; this
//! test needs neither. tests/cluster/k8s_pod.rs runs the same file as a daemon.

use patterd::config::{self, StoreBackend};

use crate::common::k8s::{configmap_toml, pod_env, read};

const DB: &str = "postgres://patterd:pw@postgres.example.internal:5432/patterd";

/// `KEY: N` on a line of `text` (the first one), as a number.
fn yaml_number(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}"))
}

#[test]
fn the_configmap_loads_as_one_cluster_instance_per_pod() {
    let toml = configmap_toml();
    for pod in ["patterd-0", "patterd-5"] {
        let loaded =
            config::load_str_with_vars(&toml, "configmap.yaml patter.toml", &pod_env(pod, DB))
                .unwrap_or_else(|e| panic!("the ConfigMap's patter.toml must load:\n{e}"));
        // `patterd check --strict` would refuse a warning.
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = &loaded.config;
        assert_eq!(c.store.backend, StoreBackend::Postgres);
        assert_eq!(c.cluster.instance_name.as_deref(), Some(pod));
        assert_eq!(
            c.cluster.advertise_url.as_deref(),
            Some(format!("https://voice.example.com/i/{pod}").as_str())
        );
        assert_eq!(
            c.cluster.internal_url.as_deref(),
            Some(format!("http://{pod}.patterd-pods.voice.svc.cluster.local:8080").as_str())
        );
        assert_eq!(c.server.public_url, "https://voice.example.com");
        assert_eq!(c.server.listen, "0.0.0.0:8080");
        assert!(c.cluster.token.is_some());
    }
}

#[test]
fn the_configmap_needs_the_pods_secrets() {
    // Without the database URL from the Secret the pod does not start: the loader names it.
    let toml = configmap_toml();
    let env: Vec<_> = pod_env("patterd-0", DB)
        .into_iter()
        .filter(|(k, _)| *k != "PATTERD_DATABASE_URL")
        .collect();
    let err = config::load_str_with_vars(&toml, "patter.toml", &env)
        .expect_err("a missing database URL is an error")
        .to_string();
    assert!(err.contains("PATTERD_DATABASE_URL"), "{err}");
}

#[test]
fn the_grace_period_covers_the_drain() {
    let toml = configmap_toml();
    let loaded = config::load_str_with_vars(&toml, "patter.toml", &pod_env("patterd-0", DB))
        .unwrap_or_else(|e| panic!("{e}"));
    let drain = loaded.config.server.drain_timeout_s;
    let grace = yaml_number(&read("statefulset.yaml"), "terminationGracePeriodSeconds");
    assert!(
        grace >= drain + 30,
        "terminationGracePeriodSeconds {grace} < drain_timeout_s {drain} + 30"
    );
}
