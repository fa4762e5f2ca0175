//! The cluster credential on the receiving side. A request another instance forwarded to this
//! one (`crate::app::cluster::forward`) says so in `X-Patterd-Forwarded-By` and must carry the
//! cluster token (`[cluster] token`, compared in constant time); it then runs as
//! [`Scope::Peer`] — an operator's rights on calls, and never forwarded again — or, when it
//! hands on a caller's call token (`X-Patterd-Forwarded-Call-Token`), as that call token,
//! checked here where it was minted. The cluster token is accepted with that header only: a
//! request without it is an ordinary client's, checked against the configured tokens.
//!
//! The other half: a call token this instance did not mint, for a call it does not run, is not
//! refused outright in a cluster — its call's owner minted it — but becomes a
//! [`Scope::ForeignCall`] grant that only forwarding uses (`api::forward`).

use hyper::HeaderMap;

use super::ApiError;
use super::auth::{CallTokenCheck, Grant};
#[cfg(feature = "postgres")]
use super::{ErrorCode, auth::Scope};
use crate::app::App;

/// The bearer token of `headers`, if any.
#[cfg(feature = "postgres")]
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// A peer's forwarded request, checked: `Some((grant or refusal, whether a refusal counts
/// against the sending address))` when it carries `X-Patterd-Forwarded-By` and this instance
/// is in a cluster with a non-empty cluster token; `None` for any other request (checked as
/// usual). A wrong cluster token is a 401 that counts (a guess); a handed-on call token that
/// is not valid here is a 401 that does not (the peer is authenticated, the client failed, and
/// the peer counts it against the client).
pub(crate) fn forwarded(
    app: &App,
    headers: &HeaderMap,
    calls: CallTokenCheck<'_>,
) -> Option<(Result<Grant, ApiError>, bool)> {
    #[cfg(feature = "postgres")]
    {
        use crate::app::cluster::forward::{FORWARDED_BY, FORWARDED_CALL_TOKEN};
        let cluster = app.cluster.as_ref()?;
        let by = headers.get(FORWARDED_BY)?;
        let token = cluster.token.expose();
        if token.is_empty() {
            // Token-less local mode: the ordinary local check admits peers on this machine.
            return None;
        }
        let given = bearer(headers).unwrap_or("");
        if !crate::security::ct_eq(given.as_bytes(), token.as_bytes()) {
            let e = ApiError::new(
                401,
                ErrorCode::Unauthorized,
                "a forwarded request (X-Patterd-Forwarded-By) must carry the cluster token \
                 ([cluster] token, else server.api_token) as its bearer token",
            );
            return Some((Err(e), true));
        }
        let peer = super::auth::for_log(by.to_str().unwrap_or("?"), 64);
        if let Some(handed_on) = headers.get(FORWARDED_CALL_TOKEN) {
            let checked = handed_on.to_str().ok().and_then(calls);
            return Some((
                checked
                    .map(|call| Grant {
                        scope: Scope::Call(call),
                        name: format!("call token (through {peer})"),
                    })
                    .ok_or_else(|| {
                        ApiError::new(
                            401,
                            ErrorCode::Unauthorized,
                            "this call token is not valid: it was not minted by the call's \
                             instance, or its call has ended (a call token works only while its \
                             call is live)",
                        )
                    }),
                false,
            ));
        }
        Some((
            Ok(Grant {
                scope: Scope::Peer,
                name: format!("peer {peer}"),
            }),
            false,
        ))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (app, headers, calls);
        None
    }
}

/// `checked` (an ordinary request's verdict), except that a 401 for a call token becomes a
/// [`Scope::ForeignCall`] grant when this instance is in a cluster and does not run the call
/// the token names: that call's owner may have minted it, and will check it.
pub(crate) fn or_foreign_call_token(
    app: &App,
    headers: &HeaderMap,
    checked: Result<Grant, ApiError>,
) -> Result<Grant, ApiError> {
    #[cfg(feature = "postgres")]
    if let Err(e) = &checked
        && e.status == 401
        && app.cluster.is_some()
        && let Some(given) = bearer(headers)
        && crate::security::call_token::CallTokens::looks_like(given)
        && let Some(call) = crate::security::call_token::CallTokens::named_call(given)
        && app.calls.get(&call).is_none()
    {
        return Ok(Grant {
            scope: Scope::ForeignCall {
                call,
                token: crate::util::secret::Secret::new(given.to_string()),
            },
            name: "call token (another instance's)".into(),
        });
    }
    #[cfg(not(feature = "postgres"))]
    let _ = (app, headers);
    checked
}

#[cfg(test)]
mod tests {
    use super::super::auth::{Grant, Permission, Scope};
    use crate::util::secret::Secret;

    fn status(g: &Grant, p: Permission, call: Option<&str>) -> Result<(), u16> {
        g.permits(p, call).map_err(|e| e.status)
    }

    /// A peer reads and acts on any call and reads across calls, but places no calls and
    /// changes no settings.
    #[test]
    fn a_peer_has_an_operators_rights_on_calls_only() {
        let peer = Grant {
            scope: Scope::Peer,
            name: "peer p1".into(),
        };
        for p in [
            Permission::ReadAll,
            Permission::ReadCall,
            Permission::ActOnCall,
        ] {
            assert_eq!(status(&peer, p, Some("CA1")), Ok(()), "{p:?}");
            assert!(peer.may_use(p));
        }
        assert_eq!(status(&peer, Permission::Operator, None), Err(403));
        assert!(!peer.may_use(Permission::Operator));
        assert_eq!(peer.own_call(), None);
    }

    /// Another instance's call token reaches the call it names only, as a checked one does.
    #[test]
    fn a_foreign_call_token_reaches_the_call_it_names_only() {
        let g = Grant {
            scope: Scope::ForeignCall {
                call: "CA1".into(),
                token: Secret::new("pdc1.x.y"),
            },
            name: "call token (another instance's)".into(),
        };
        assert_eq!(status(&g, Permission::ReadCall, Some("CA1")), Ok(()));
        assert_eq!(status(&g, Permission::ActOnCall, Some("CA1")), Ok(()));
        assert_eq!(status(&g, Permission::ActOnCall, Some("CA2")), Err(403));
        assert_eq!(status(&g, Permission::ReadAll, None), Err(403));
        assert_eq!(status(&g, Permission::Operator, None), Err(403));
        assert_eq!(g.own_call(), Some("CA1"));
        // The token never shows in logs.
        assert!(!format!("{g:?}").contains("pdc1.x.y"));
    }
}
