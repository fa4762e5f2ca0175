//! Control reaches the call's owner. In a cluster (`[store] backend = "postgres"`) a call runs
//! on the instance that admitted it; a request on that call may land on any instance (the
//! shared `public_url` balances). Before [`super::dispatch`] runs a call-scoped route here, it
//! asks [`elsewhere`]: when the call is not in this instance's registry, one owner lookup
//! (`store::postgres::owner`) decides —
//!
//! - no such call, or ended, or this instance's own (it just ended): run here; the shared
//!   store answers reads, actions get 404 / 409 `call_not_live` as on a single instance;
//! - live on a peer (lease fresh, or stale but not yet declared lost): forwarded to its
//!   `internal_url` (`app::cluster::forward`) and the owner's status and body relayed as they
//!   are, so 422 `action_refused`, 502 `action_failed`, 409 `call_busy` mean what they mean
//!   locally; no answer within the bounds (connect 500 ms, `forward_timeout_ms`) → 503
//!   `owner_unreachable` with `Retry-After: 2`, never a hang;
//! - its owner stopped or was declared lost while the call was open: actions get 409
//!   `call_not_live` ("the instance that ran this call stopped; the call is over"), reads the
//!   store's record.
//!
//! A request that a peer forwarded ([`Scope::Peer`]) is never forwarded again: it is answered
//! from this instance's state and the store (the loop guard; a call that just ended → 409).
//!
//! **Call tokens.** A call token is minted by the call's owner under a key only that process
//! holds, so no other instance can check it. A non-owner therefore treats a call token it
//! cannot verify, naming a call it does not run, as [`Scope::ForeignCall`]: it may reach that
//! call only, and only through the owner — the request is forwarded with the cluster token
//! (which authenticates the hop) and the caller's token handed on in
//! `X-Patterd-Forwarded-Call-Token`; the owner checks it as if the caller had come straight to
//! it and narrows the request to that call (`api::peer`). Nothing is ever answered locally on
//! the strength of an unchecked token: when the call is not live on a peer (ended, lost,
//! unknown) the answer is the 401 a dead call's token gets anywhere. A token the owner refuses
//! (401) counts against the client at the instance it reached, not against the peer.
//!
//! Recordings are on the disk of the instance that recorded them (the call's owner):
//! [`recording`] streams them from there when they are not here.

// Without the PostgreSQL store there is no cluster: only the local answers are used.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::sync::Arc;

use hyper::Method;
use serde_json::Value;

use super::auth::{Grant, Scope};
use super::{ApiError, ErrorCode};
use crate::app::App;
#[cfg(feature = "postgres")]
use crate::app::cluster::forward::ForwardError;

/// What a call-scoped route does, for forwarding: a read of the call, or an action on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Act,
}

/// The call and kind of a [`super::dispatch`] route that forwarding applies to (`None`: a
/// route not on one call).
pub(crate) fn call_route<'a>(method: &Method, segments: &[&'a str]) -> Option<(&'a str, Kind)> {
    use crate::call::action::ActionSpec;
    match (method.clone(), segments) {
        (Method::GET, ["calls", id] | ["calls", id, "transcript" | "events" | "metrics"]) => {
            Some((id, Kind::Read))
        }
        (Method::POST, ["calls", id, "hangup"]) => Some((id, Kind::Act)),
        (Method::POST, ["calls", id, verb]) if ActionSpec::by_verb(verb).is_some() => {
            Some((id, Kind::Act))
        }
        _ => None,
    }
}

/// The request as it came (path under `/v1`, still percent-encoded, and its raw query).
pub(crate) struct Incoming<'a> {
    pub(crate) method: &'a Method,
    pub(crate) path: &'a str,
    pub(crate) query: &'a str,
    pub(crate) body: Option<&'a Value>,
}

/// The 401 of a call token that cannot be honoured (the same words as a dead call's token).
pub(crate) fn call_token_refused() -> ApiError {
    ApiError::new(
        401,
        ErrorCode::Unauthorized,
        "this call token is not valid: it was not minted by this daemon, or its call has ended \
         (a call token works only while its call is live)",
    )
}

/// The answer to a request on call `id` from its owner elsewhere in the cluster; `None` when
/// it runs here (see the module documentation for which is which).
pub(crate) async fn elsewhere(
    app: &Arc<App>,
    grant: &Grant,
    req: &Incoming<'_>,
    id: &str,
    kind: Kind,
) -> Option<Result<(u16, Value), ApiError>> {
    let foreign = match &grant.scope {
        Scope::ForeignCall { token, .. } => Some(token),
        _ => None,
    };
    if app.calls.get(id).is_some() {
        // A token this instance minted for its own live call would have been checked.
        return foreign.map(|_| Err(call_token_refused()));
    }
    #[cfg(feature = "postgres")]
    {
        use crate::store::postgres::owner::{Owner, owner_of};
        let Some(cluster) = app.cluster.as_ref() else {
            return foreign.map(|_| Err(call_token_refused()));
        };
        if grant.scope == Scope::Peer {
            return not_forwarded_again(app, &cluster.name, id, kind).await;
        }
        let path_and_query = if req.query.is_empty() {
            format!("/v1{}", req.path)
        } else {
            format!("/v1{}?{}", req.path, req.query)
        };
        let out = crate::app::cluster::forward::Outgoing {
            method: req.method,
            path_and_query: &path_and_query,
            body: req.body,
            call_token: foreign,
        };
        // An owner remembered from an earlier forward: straight to it, no lookup. If it
        // cannot be reached (nothing was sent), the database says whether it is still the
        // owner's lease that runs or the call that is over.
        let mut refused_by = None;
        if let Some(peer) = cluster.owners.get(id) {
            match attempt(app, cluster, &peer, &out).await {
                Err(ForwardError::Unreachable {
                    maybe_delivered: false,
                    ..
                }) => {
                    cluster.owners.forget(id);
                    refused_by = Some(peer);
                }
                answer => return Some(finish(app, cluster, &peer, id, answer)),
            }
        }
        let lease_ms = u64::try_from(cluster.timing.lease.as_millis()).unwrap_or(u64::MAX);
        let owner = match owner_of(&cluster.pool, &cluster.name, id, lease_ms).await {
            Ok(o) => o,
            Err(e) => return Some(Err(lookup_failed(id, &e))),
        };
        let (peer, fresh) = match owner {
            Owner::Peer(p) => (p, true),
            Owner::PeerStale(p) => (p, false),
            _ if foreign.is_some() => return Some(Err(call_token_refused())),
            Owner::Lost { name } if kind == Kind::Act => {
                app.metrics
                    .cluster_forwards
                    .inc(crate::app::metrics::ForwardOutcome::OwnerLost);
                tracing::info!(call = %id, instance = %name, "action on a call whose instance stopped");
                return Some(Err(owner_lost()));
            }
            _ => return None,
        };
        if refused_by.is_some_and(|r| r.internal_url == peer.internal_url) {
            // The same owner at the same address refused the connection a moment ago.
            let refused = Err(ForwardError::Unreachable {
                peer: peer.name.clone(),
                url: peer.internal_url.clone(),
                reason: "connection failed".to_string(),
                maybe_delivered: false,
            });
            return Some(finish(app, cluster, &peer, id, refused));
        }
        let answer = attempt(app, cluster, &peer, &out).await;
        if fresh && answer.is_ok() {
            cluster.owners.put(id, &peer);
        }
        Some(finish(app, cluster, &peer, id, answer))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (req, kind);
        foreign.map(|_| Err(call_token_refused()))
    }
}

/// 409 `call_not_live` for an action on a call whose owner stopped before it ended.
pub(crate) fn owner_lost() -> ApiError {
    ApiError::new(
        409,
        ErrorCode::CallNotLive,
        "the instance that ran this call stopped; the call is over",
    )
}

/// The loop guard: a forwarded request on a call not live here runs here (reads from the
/// store), and an action on a call whose row exists gets 409 — the call ended between the
/// sender's lookup and now, or the sender's view is wrong; either way it goes no further.
#[cfg(feature = "postgres")]
async fn not_forwarded_again(
    app: &Arc<App>,
    me: &str,
    id: &str,
    kind: Kind,
) -> Option<Result<(u16, Value), ApiError>> {
    if kind == Kind::Read {
        return None;
    }
    match app.store.call(id).await {
        Ok(Some(_)) => Some(Err(ApiError::new(
            409,
            ErrorCode::CallNotLive,
            format!(
                "call {} is not live on instance `{me}` (it has ended); a forwarded request is \
                 not forwarded again",
                id.escape_default()
            ),
        ))),
        Ok(None) => None,
        Err(e) => Some(Err(e.into())),
    }
}

/// 503 when the owner cannot be looked up (the store is down): retry shortly.
#[cfg(feature = "postgres")]
fn lookup_failed(id: &str, e: &sqlx_core::Error) -> ApiError {
    tracing::warn!(call = %id, error = %e, "the owner of a call could not be looked up");
    let mut err = ApiError::new(
        503,
        ErrorCode::StoreError,
        "the instance running this call could not be looked up (the store did not answer); \
         retry in a few seconds",
    );
    err.retry_after_s = Some(2);
    err
}

/// 503 `owner_unreachable`, `Retry-After: 2`; says whether the request may have reached the
/// owner (a timeout after sending: an action's outcome is unknown) or not (nothing was done).
fn owner_unreachable(id: &str, peer: &str, lease_s: u64, maybe_delivered: bool) -> ApiError {
    let what = if maybe_delivered {
        "did not answer in time (the request may have reached it: read the call before \
         repeating an action)"
    } else {
        "could not be reached (nothing was done)"
    };
    let mut e = ApiError::new(
        503,
        ErrorCode::OwnerUnreachable,
        format!(
            "call {} runs on instance `{}`, which {what}; retry in 2 s (if that instance is \
             gone, the call is closed within {lease_s} s and then reads as over)",
            id.escape_default(),
            peer.escape_default()
        ),
    );
    e.retry_after_s = Some(2);
    e
}

/// Sends the request to `peer` (timed in `patterd_cluster_forward_seconds`).
#[cfg(feature = "postgres")]
async fn attempt(
    app: &App,
    cluster: &crate::app::cluster::Cluster,
    peer: &crate::store::postgres::owner::PeerRef,
    out: &crate::app::cluster::forward::Outgoing<'_>,
) -> Result<crate::app::cluster::forward::Answer, ForwardError> {
    let started = std::time::Instant::now();
    let answer = cluster.peers.send(peer, out).await;
    app.metrics
        .cluster_forward_seconds
        .observe((), started.elapsed());
    answer
}

/// The owner's answer relayed (or why none came), counted; an owner that did not answer, or
/// answered that the call is not live there, is forgotten (`app::cluster::owners`).
#[cfg(feature = "postgres")]
fn finish(
    app: &App,
    cluster: &crate::app::cluster::Cluster,
    peer: &crate::store::postgres::owner::PeerRef,
    id: &str,
    answer: Result<crate::app::cluster::forward::Answer, ForwardError>,
) -> Result<(u16, Value), ApiError> {
    use crate::app::metrics::ForwardOutcome;
    let lease_s = cluster.timing.lease.as_secs().max(1);
    match answer {
        Ok(a) => {
            app.metrics.cluster_forwards.inc(ForwardOutcome::Relayed);
            let relayed = relay(a.status, a.body, a.retry_after_s);
            if matches!(&relayed, Err(e) if e.status == 404 || e.code == ErrorCode::CallNotLive) {
                cluster.owners.forget(id);
            }
            relayed
        }
        Err(e @ (ForwardError::Unreachable { .. } | ForwardError::Client(_))) => {
            cluster.owners.forget(id);
            app.metrics
                .cluster_forwards
                .inc(ForwardOutcome::Unreachable);
            tracing::warn!(call = %id, error = %e, "a call's owner did not answer a forwarded request");
            let maybe = matches!(
                e,
                ForwardError::Unreachable {
                    maybe_delivered: true,
                    ..
                }
            );
            Err(owner_unreachable(id, &peer.name, lease_s, maybe))
        }
        Err(e @ ForwardError::BadAnswer { .. }) => {
            cluster.owners.forget(id);
            app.metrics.cluster_forwards.inc(ForwardOutcome::BadAnswer);
            tracing::warn!(call = %id, error = %e, "a call's owner answered a forwarded request oddly");
            Err(ApiError::new(
                502,
                ErrorCode::RemoteError,
                format!(
                    "call {} runs on instance `{}`, whose answer was not patterd's JSON; check \
                     what listens at its internal_url",
                    id.escape_default(),
                    peer.name.escape_default()
                ),
            ))
        }
    }
}

/// The owner's answer as ours: a success as it is; an error as the [`ApiError`] its body
/// names, so REST renders the same body and MCP the same `isError` text. An error code this
/// version does not know (a newer peer mid-upgrade) keeps its status and message under
/// `remote_error`.
pub(crate) fn relay(
    status: u16,
    body: Value,
    retry_after_s: Option<u64>,
) -> Result<(u16, Value), ApiError> {
    if status < 400 {
        return Ok((status, body));
    }
    let err = body.get("error");
    let code = err
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .and_then(|c| ErrorCode::ALL.into_iter().find(|k| k.as_str() == c))
        .unwrap_or(ErrorCode::RemoteError);
    let message = err
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map_or_else(|| body.to_string(), str::to_string);
    let mut e = ApiError::new(status, code, message);
    e.retry_after_s = retry_after_s;
    Err(e)
}

/// A recording relayed from the instance that recorded it: its status, headers that
/// describe the body, and the body as it arrives.
#[cfg(feature = "postgres")]
pub(crate) struct Download {
    pub(crate) status: u16,
    pub(crate) content_type: Option<hyper::header::HeaderValue>,
    pub(crate) content_length: Option<u64>,
    pub(crate) body: crate::app::cluster::forward::RelayBody,
}

/// `GET /v1/calls/{id}/recording` for a recording that is not on this instance: streamed from
/// the instance that recorded it (the call's owner) while that instance runs; `None` when this
/// instance should answer itself (no cluster, a forwarded request, no such call, recorded
/// here); an error when the recorder is gone (404 with the reason) or does not answer (503).
#[cfg(feature = "postgres")]
pub(crate) async fn recording(
    app: &Arc<App>,
    grant: &Grant,
    id: &str,
    path_and_query: &str,
) -> Option<Result<Download, ApiError>> {
    use crate::app::metrics::ForwardOutcome;
    use crate::store::postgres::owner::{Owner, Ran, owner_of};
    let cluster = app.cluster.as_ref()?;
    let foreign = match &grant.scope {
        Scope::ForeignCall { token, .. } => Some(token),
        Scope::Peer => return None,
        _ => None,
    };
    let lease_ms = u64::try_from(cluster.timing.lease.as_millis()).unwrap_or(u64::MAX);
    let owner = match owner_of(&cluster.pool, &cluster.name, id, lease_ms).await {
        Ok(o) => o,
        Err(e) => return Some(Err(lookup_failed(id, &e))),
    };
    let peer = match owner {
        Owner::Peer(p) | Owner::PeerStale(p) | Owner::Ended { by: Ran::Peer(p) } => p,
        _ if foreign.is_some() => return Some(Err(call_token_refused())),
        Owner::Ended {
            by: Ran::Gone(name),
        }
        | Owner::Lost { name } => {
            return Some(Err(ApiError::new(
                404,
                ErrorCode::NoRecording,
                format!(
                    "call `{}` was recorded (if at all) on instance `{}`, which is no longer \
                     running; its recordings are on that instance's disk",
                    id.escape_default(),
                    name.escape_default()
                ),
            )));
        }
        _ => return None,
    };
    let out = crate::app::cluster::forward::Outgoing {
        method: &Method::GET,
        path_and_query,
        body: None,
        call_token: foreign,
    };
    let started = std::time::Instant::now();
    let opened = cluster.peers.open(&peer, &out).await;
    app.metrics
        .cluster_forward_seconds
        .observe((), started.elapsed());
    match opened {
        Ok(resp) => {
            app.metrics.cluster_forwards.inc(ForwardOutcome::Relayed);
            let status = resp.status().as_u16();
            let content_type = resp.headers().get(hyper::header::CONTENT_TYPE).cloned();
            let content_length = resp.content_length();
            Some(Ok(Download {
                status,
                content_type,
                content_length,
                body: crate::app::cluster::forward::relay_body(resp),
            }))
        }
        Err(e) => {
            app.metrics
                .cluster_forwards
                .inc(ForwardOutcome::Unreachable);
            tracing::warn!(call = %id, error = %e, "the instance holding a recording did not answer");
            let lease_s = cluster.timing.lease.as_secs().max(1);
            let maybe = matches!(
                e,
                crate::app::cluster::forward::ForwardError::Unreachable {
                    maybe_delivered: true,
                    ..
                }
            );
            Some(Err(owner_unreachable(id, &peer.name, lease_s, maybe)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn owner_errors_come_back_as_they_were_sent() {
        assert_eq!(
            relay(200, json!({"outcome": "done"}), None),
            Ok((200, json!({"outcome": "done"})))
        );
        let refused = ApiError::new(422, ErrorCode::ActionRefused, "not on the allow-list");
        let e = relay(422, refused.body(), None).expect_err("422");
        assert_eq!(e, refused);
        assert_eq!(e.body(), refused.body());
        let e = relay(
            429,
            json!({"error": {"code": "too_many_failures", "message": "wait"}}),
            Some(7),
        )
        .expect_err("429");
        assert_eq!(
            (e.status, e.code, e.retry_after_s),
            (429, ErrorCode::TooManyFailures, Some(7))
        );
        // A code from a newer peer keeps its status and message.
        let e = relay(
            418,
            json!({"error": {"code": "brand_new", "message": "m"}}),
            None,
        )
        .expect_err("418");
        assert_eq!(
            (e.status, e.code, e.message.as_str()),
            (418, ErrorCode::RemoteError, "m")
        );
    }

    #[test]
    fn call_routes_are_the_reads_and_actions_of_one_call() {
        let seg = |p: &'static str| p.split('/').collect::<Vec<_>>();
        let route =
            |m: Method, p: &'static str| call_route(&m, &seg(p)).map(|(id, k)| (id.to_string(), k));
        assert_eq!(
            route(Method::GET, "calls/CA1"),
            Some(("CA1".into(), Kind::Read))
        );
        assert_eq!(
            route(Method::GET, "calls/CA1/transcript"),
            Some(("CA1".into(), Kind::Read))
        );
        assert_eq!(
            route(Method::POST, "calls/CA1/hangup"),
            Some(("CA1".into(), Kind::Act))
        );
        assert_eq!(
            route(Method::POST, "calls/CA1/say"),
            Some(("CA1".into(), Kind::Act))
        );
        assert_eq!(route(Method::POST, "calls/CA1/nope"), None);
        assert_eq!(route(Method::GET, "calls"), None);
        assert_eq!(route(Method::POST, "calls"), None);
    }
}
