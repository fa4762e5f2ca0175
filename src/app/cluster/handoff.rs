//! The drain hand-off: a new-call webhook (Twilio's voice webhook, Telnyx's incoming
//! `call.initiated`, Plivo's answer) that lands on an instance refusing it busy — draining
//! after SIGTERM, or at `max_calls` — is handed to a ready peer instead of refused, as long as
//! one exists. It is forwarded verbatim (method, path and query, headers with the carrier's
//! signature, body) to the peer's `internal_url` with `X-Patterd-Handed-By: <this instance>`,
//! and the peer's answer is relayed to the carrier as it is. Signatures still verify on the
//! peer: the carrier signed the shared `public_url` and the path, and neither changes. A
//! webhook carrying the header is never handed on again: a peer that is busy as well answers
//! 503 with `X-Patterd-Handoff-Refused`, and the handing instance tries its next peer, then
//! refuses the call itself with the carrier's busy answer.
//!
//! Peers are the `ready` instances with a fresh heartbeat, most free capacity first
//! (`store::postgres::handoff`); the next one is tried when a peer could not be connected to
//! (500 ms) or refused the webhook busy, never after a request went out unanswered (it may
//! have admitted the call). A
//! replay-guard key recorded here for the webhook (Plivo's nonce, Telnyx's event id) is
//! released before the first peer gets it and recorded again if no peer took it. Counted in
//! `patterd_cluster_handoffs_total{outcome}`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use tracing::{debug, info, warn};

use super::Cluster;
use crate::app::App;
use crate::app::metrics::HandoffOutcome;
use crate::carrier::port::{Arrived, Refusal};
use crate::net::http::Body;
use crate::store::postgres::handoff::{self as sql, Peer};

/// The header a handed-off webhook carries: the name of the instance that handed it on.
pub(crate) const HANDED_BY: &str = "x-patterd-handed-by";

/// Marks a peer's answer that refuses a handed-off webhook busy: the next peer is tried.
const REFUSED: &str = "x-patterd-handoff-refused";

/// Peers tried at most for one webhook.
const MAX_PEERS: usize = 3;

/// Why one peer did not take the webhook.
#[derive(Debug, thiserror::Error)]
enum HandoffError {
    /// Not connected: the next peer may be tried.
    #[error("cannot connect to {peer}: {source}")]
    Connect {
        peer: String,
        source: reqwest::Error,
    },
    /// The request went out (the peer may have admitted the call): stop here.
    #[error("{peer} did not answer: {source}")]
    Answer {
        peer: String,
        source: reqwest::Error,
    },
    #[error("the peer URL {0:?} is not usable")]
    Url(String),
    #[error("no HTTP client for hand-offs")]
    Client,
}

/// Hands `webhook`, refused here with `refusal`, to a ready peer; returns the peer's answer,
/// or `None` (refuse busy here) when there is no cluster, no ready peer exists or none took
/// it. A webhook a peer handed here gets [`refused_handed`]'s answer instead.
pub(crate) async fn hand_off(
    app: &App,
    refusal: Refusal,
    webhook: Arrived,
) -> Option<Response<Body>> {
    let cluster = app.cluster.as_ref()?;
    if !matches!(refusal, Refusal::Draining | Refusal::Full) {
        return None;
    }
    let path = crate::security::truncate_for_log(webhook.uri.path(), 64);
    if let Some(by) = webhook.headers.get(HANDED_BY) {
        // Never handed on again: the peer that handed it here tries its next peer, or refuses
        // the call itself. The replay key recorded here is released for that next peer.
        let by = crate::security::truncate_for_log(by.to_str().unwrap_or("?"), 64);
        info!(%path, handed_by = %by, ?refusal, "a handed-off new call refused here too");
        if let Some((scope, key)) = &webhook.seen
            && let Err(e) = sql::release_seen(&cluster.pool, scope, key).await
        {
            warn!(%path, error = %e, "cannot release the handed webhook's replay key");
        }
        return Some(refused_handed(refusal));
    }
    let count = |o| app.metrics.cluster_handoffs.inc(o);
    let peers = match sql::ready_peers(&cluster.pool, &cluster.name, cluster.timing.lease).await {
        Ok(p) => p,
        Err(e) => {
            warn!(%path, error = %e, "cannot read the ready peers; refusing the new call busy");
            count(HandoffOutcome::Failed);
            return None;
        }
    };
    if peers.is_empty() {
        info!(%path, ?refusal, "no ready peer to hand the new call to; refusing it busy");
        count(HandoffOutcome::NoPeer);
        return None;
    }
    if let Some((scope, key)) = &webhook.seen
        && let Err(e) = sql::release_seen(&cluster.pool, scope, key).await
    {
        // The peer's replay guard would take the webhook for a replay.
        warn!(%path, error = %e, "cannot release the webhook's replay key; refusing the new call busy");
        count(HandoffOutcome::Failed);
        return None;
    }
    let mut outcome = HandoffOutcome::Failed;
    for peer in peers.iter().take(MAX_PEERS) {
        let started = Instant::now();
        match forward(cluster, peer, &webhook).await {
            Ok(answer) if answer.headers().contains_key(REFUSED) => {
                info!(%path, peer = %peer.name, "the peer is busy too; trying the next ready peer");
                outcome = HandoffOutcome::PeersBusy;
            }
            Ok(answer) => {
                info!(
                    %path,
                    ?refusal,
                    peer = %peer.name,
                    status = answer.status().as_u16(),
                    ms = started.elapsed().as_millis() as u64,
                    "new call handed to a ready peer"
                );
                count(HandoffOutcome::Handed);
                return Some(answer);
            }
            Err(e @ HandoffError::Connect { .. }) => {
                warn!(%path, error = %e, "hand-off failed; trying the next ready peer");
            }
            Err(e) => {
                warn!(%path, error = %e, "hand-off failed; refusing the new call busy");
                break;
            }
        }
    }
    if let Some((scope, key)) = &webhook.seen {
        let ttl = Duration::from_secs(3600).as_secs_f64();
        if let Err(e) =
            crate::store::postgres::claim::first_seen(&cluster.pool, scope, key, ttl).await
        {
            debug!(error = %e, "the webhook's replay key was not recorded again");
        }
    }
    count(outcome);
    None
}

/// What a peer answers a handed-off webhook it refuses busy as well: not the carrier's busy
/// answer (the handing instance gives that, if no other peer takes the call) but a 503 marked
/// [`REFUSED`].
fn refused_handed(refusal: Refusal) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(format!(
        "busy here too ({refusal:?}); not handed on\n"
    ))));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut().insert(
        HeaderName::from_static(REFUSED),
        HeaderValue::from_static("busy"),
    );
    resp
}

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1), plus the
/// ones the client sets itself.
fn per_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// Sends `webhook` to `peer` as it arrived and turns the peer's answer into ours.
async fn forward(
    cluster: &Cluster,
    peer: &Peer,
    webhook: &Arrived,
) -> Result<Response<Body>, HandoffError> {
    let client = cluster.peers.api_client().ok_or(HandoffError::Client)?;
    let target = format!(
        "{}{}",
        peer.internal_url.trim_end_matches('/'),
        webhook
            .uri
            .path_and_query()
            .map_or(webhook.uri.path(), |p| p.as_str())
    );
    let url = reqwest::Url::parse(&target).map_err(|_| HandoffError::Url(target.clone()))?;
    let mut headers = HeaderMap::with_capacity(webhook.headers.len() + 1);
    for (name, value) in &webhook.headers {
        if !per_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let me = HeaderValue::from_str(&cluster.name)
        .map_err(|_| HandoffError::Url(format!("instance name {:?}", cluster.name)))?;
    headers.insert(HeaderName::from_static(HANDED_BY), me);
    let sent = client
        .request(webhook.method.clone(), url)
        .headers(headers)
        .body(webhook.body.clone())
        .timeout(cluster.timing.forward_timeout)
        .send()
        .await;
    let answer = match sent {
        Ok(a) => a,
        Err(source) if source.is_connect() => {
            return Err(HandoffError::Connect {
                peer: peer.name.clone(),
                source,
            });
        }
        Err(source) => {
            return Err(HandoffError::Answer {
                peer: peer.name.clone(),
                source,
            });
        }
    };
    let status = answer.status();
    let mut relayed = HeaderMap::with_capacity(answer.headers().len());
    for (name, value) in answer.headers() {
        if !per_hop(name) {
            relayed.append(name.clone(), value.clone());
        }
    }
    let body: Bytes = answer
        .bytes()
        .await
        .map_err(|source| HandoffError::Answer {
            peer: peer.name.clone(),
            source,
        })?;
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    *resp.headers_mut() = relayed;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_headers_are_not_forwarded_but_signatures_are() {
        for h in [
            "connection",
            "transfer-encoding",
            "host",
            "content-length",
            "te",
        ] {
            assert!(per_hop(&HeaderName::from_static(h)), "{h}");
        }
        for h in [
            "x-twilio-signature",
            "x-plivo-signature-v3",
            "x-plivo-signature-v3-nonce",
            "telnyx-signature-ed25519",
            "telnyx-timestamp",
            "content-type",
        ] {
            assert!(!per_hop(&HeaderName::from_static(h)), "{h}");
        }
    }
}
