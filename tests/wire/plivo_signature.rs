//! Plivo webhook signatures on the wire: the first use of a V3 signature
//! is served; the same nonce again is a replay and refused (403); a V2-only signature is
//! refused.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use patterd::carrier::plivo::signature::compute_v3;
use patterd_sim::plivo::answer_params;

use crate::common::*;

/// The Plivo answer webhook: the first use of a V3 signature is served; the same request again
/// (same nonce) is a replay and refused; a V2-only signature — valid for Plivo's SDK, but
/// covering neither the body nor the query — is refused.
#[tokio::test]
async fn plivo_replayed_v3_and_v2_signatures_are_refused() {
    let stack = Stack::start(Opts::default()).await;
    let url = format!("{PUBLIC_URL}/plivo/answer");
    let params = answer_params("5b9a3a5e-0000-4000-8000-0000000000a1", CALLER, PLIVO_NUMBER);
    let nonce = "31582164297135082964";
    let sig = compute_v3(PLIVO_AUTH_TOKEN, "POST", &url, &params, nonce);
    let headers = [
        ("X-Plivo-Signature-V3", sig.as_str()),
        ("X-Plivo-Signature-V3-Nonce", nonce),
    ];
    let first = stack
        .plivo
        .post_with("/plivo/answer", &params, &headers)
        .await
        .expect("answer webhook");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.body.contains("<Stream"), "{first:?}");
    let forbidden_before = stack
        .server
        .app
        .metrics
        .webhooks_forbidden
        .load(std::sync::atomic::Ordering::Relaxed);

    let replay = stack
        .plivo
        .post_with("/plivo/answer", &params, &headers)
        .await
        .expect("replayed webhook");
    assert_eq!(
        replay.status, 403,
        "a replayed V3 nonce was served: {replay:?}"
    );
    // The replay also fails on another path (the hangup callback) with the same nonce.
    let hangup_url = format!("{PUBLIC_URL}/plivo/hangup");
    let hangup_sig = compute_v3(PLIVO_AUTH_TOKEN, "POST", &hangup_url, &params, nonce);
    let replay = stack
        .plivo
        .post_with(
            "/plivo/hangup",
            &params,
            &[
                ("X-Plivo-Signature-V3", hangup_sig.as_str()),
                ("X-Plivo-Signature-V3-Nonce", nonce),
            ],
        )
        .await
        .expect("replayed hangup");
    assert_eq!(replay.status, 403, "{replay:?}");

    // V2: HMAC-SHA256(auth token, URL without query + nonce), as Plivo's SDK builds it.
    let v2_params = answer_params("5b9a3a5e-0000-4000-8000-0000000000a2", CALLER, PLIVO_NUMBER);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, PLIVO_AUTH_TOKEN.as_bytes());
    let v2 = STANDARD.encode(ring::hmac::sign(&key, format!("{url}77777").as_bytes()));
    let v2_only = stack
        .plivo
        .post_with(
            "/plivo/answer",
            &v2_params,
            &[
                ("X-Plivo-Signature-V2", v2.as_str()),
                ("X-Plivo-Signature-V2-Nonce", "77777"),
            ],
        )
        .await
        .expect("V2 webhook");
    assert_eq!(
        v2_only.status, 403,
        "a V2 signature was accepted: {v2_only:?}"
    );
    let forbidden = stack
        .server
        .app
        .metrics
        .webhooks_forbidden
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(forbidden - forbidden_before, 3, "every refusal is counted");

    // A fresh V3 request still works.
    let fresh = stack
        .plivo
        .post(
            "/plivo/answer",
            &answer_params("5b9a3a5e-0000-4000-8000-0000000000a3", CALLER, PLIVO_NUMBER),
        )
        .await
        .expect("fresh webhook");
    assert_eq!(fresh.status, 200, "{fresh:?}");
}
