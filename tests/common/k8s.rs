//! The Kubernetes example (deploy/k8s) as tests read it: the ConfigMap's `patter.toml` and the
//! environment statefulset.yaml gives a pod (stand-in secrets of a valid shape).

/// The directory of the example manifests.
pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/k8s");

/// One manifest's text.
pub fn read(name: &str) -> String {
    std::fs::read_to_string(format!("{DIR}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The `patter.toml: |` block scalar of configmap.yaml, its indentation removed.
pub fn configmap_toml() -> String {
    let text = read("configmap.yaml");
    let mut lines = text.lines().skip_while(|l| l.trim() != "patter.toml: |");
    assert!(
        lines.next().is_some(),
        "configmap.yaml has a patter.toml key"
    );
    let body: Vec<&str> = lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .collect();
    assert!(body.len() > 10, "patter.toml is a block under the key");
    body.iter()
        .map(|l| l.strip_prefix("    ").unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The public host of the example (statefulset.yaml's PATTERD_PUBLIC_HOST).
pub const PUBLIC_HOST: &str = "voice.example.com";

/// What a pod's environment holds for the configuration: the downward API and the Secret's
/// variables as statefulset.yaml sets them, plus deploy/Dockerfile's own. `database_url`
/// stands in for the Secret's `database-url`.
pub fn pod_env<'a>(pod: &'a str, database_url: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("POD_NAME", pod),
        ("POD_NAMESPACE", "voice"),
        ("PATTERD_PUBLIC_HOST", PUBLIC_HOST),
        ("PATTERD_DATABASE_URL", database_url),
        ("PATTERD_API_TOKEN", super::API_TOKEN),
        (
            "PATTERD_CLUSTER_TOKEN",
            "k8s-test-cluster-token-0123456789ab",
        ),
        ("API_SERVER_KEY", super::HERMES_KEY),
        ("DEEPGRAM_API_KEY", super::DG_KEY),
        ("ELEVENLABS_API_KEY", super::EL_KEY),
        ("TWILIO_ACCOUNT_SID", super::ACCOUNT_SID),
        ("TWILIO_AUTH_TOKEN", super::AUTH_TOKEN),
        ("PATTERD_SERVER__LISTEN", "0.0.0.0:8080"),
        ("PATTERD_DATA_DIR", "/var/lib/patterd"),
    ]
}
