//! The Kubernetes example's configuration run as a pod runs it: a real `patterd` with
//! deploy/k8s/configmap.yaml's patter.toml, a pod's environment (the downward API's name and
//! namespace, the Secret's variables) and a real PostgreSQL. Only what cannot be real here is
//! moved: the listener to loopback, and the providers and Twilio's REST API to the fakes
//! (`PATTERD_…` overrides). A Twilio call's answer names the pod's own route,
//! wss://voice.example.com/i/patterd-0/twilio/media; the media socket opened on that path — as
//! the example Ingress passes it, unrewritten — carries the greeting, and the call is recorded
//! as the pod's.

use std::time::Duration;

use patterd_sim::postgres::TestDatabase;
use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::call::{SimCall, SimCallConfig};
use patterd_sim::twilio::xml::parse_twiml;

use crate::common::daemon::{Daemon, Fakes};
use crate::common::k8s::{PUBLIC_HOST, configmap_toml, pod_env};
use crate::common::{ACCOUNT_SID, API_TOKEN, AUTH_TOKEN, CALLER, OUR_NUMBER, WAIT};

const POD: &str = "patterd-0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_the_configmap_and_its_calls_use_the_pods_route() {
    patterd::util::init_tls();
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let fakes = Fakes::start(Vec::new()).await;
    let moved = [
        ("PATTERD_SERVER__LISTEN", "127.0.0.1:0".to_string()),
        ("PATTERD_STT__DEEPGRAM__BASE_URL", fakes.dg.base_url()),
        ("PATTERD_TTS__ELEVENLABS__BASE_URL", fakes.el.base_url()),
        ("PATTERD_TTS__ELEVENLABS__VOICE_ID", "voice123".to_string()),
        ("PATTERD_HERMES_URL", fakes.hermes.base_url()),
        (
            "PATTERD_CARRIERS__TWILIO__API_BASE_URL",
            fakes.rest.base_url.clone(),
        ),
    ];
    let env: Vec<(String, String)> = pod_env(POD, &db.url)
        .into_iter()
        .filter(|(k, _)| moved.iter().all(|(m, _)| m != k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(moved.iter().map(|(k, v)| (k.to_string(), v.clone())))
        .collect();
    let toml = configmap_toml();
    let daemon = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Daemon::start_with_env(&toml, &env)
    })
    .await
    .expect("daemon start");

    // The probes of statefulset.yaml, and the per-pod route as the Ingress passes it.
    let client = reqwest::Client::new();
    for path in ["/readyz", "/healthz", &format!("/i/{POD}/healthz")] {
        let r = client
            .get(daemon.url(path))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r.status(), 200, "{path}");
    }

    // A new call's webhook on the shared URL; the answer points the media at this pod.
    let public = format!("https://{PUBLIC_HOST}");
    let twilio = SimTwilio::new(&daemon.url(""), &public, ACCOUNT_SID, AUTH_TOKEN);
    let (call_sid, resp) = twilio
        .incoming_call("/twilio/voice", CALLER, OUR_NUMBER)
        .await
        .expect("webhook request");
    assert_eq!(resp.status, 200, "{}", resp.body);
    let answer = parse_twiml(&resp.body).expect("TwiML parses");
    let stream = answer.stream_url.clone().expect("a <Stream url>");
    assert!(
        stream.starts_with(&format!("wss://{PUBLIC_HOST}/i/{POD}/twilio/media")),
        "{stream}"
    );

    // The socket on that path (host mapped to the daemon, path unchanged), signed over the
    // advertised URL as Twilio signs it.
    let mut cfg = SimCallConfig::new(&format!("ws://{}", daemon.addr), ACCOUNT_SID, &call_sid);
    cfg.auth_token = Some(AUTH_TOKEN.to_string());
    let sim = SimCall::from_answer(&answer, cfg)
        .await
        .expect("the media socket opens on the per-pod path");
    sim.wait_for("the greeting", WAIT, |s| s.agent_audio_bytes > 0)
        .await
        .expect("the caller hears the greeting");

    let owner = db.query(&format!(
        "SELECT owner_id FROM calls WHERE call_id = '{call_sid}'"
    ));
    assert_eq!(owner.trim(), POD, "the call is the pod's");
    let r = client
        .get(daemon.url(&format!("/v1/calls/{call_sid}")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .expect("GET call");
    assert_eq!(r.status(), 200);
    sim.hang_up().await;
}
