//! `GET /v1/webhooks/deliveries` (operator): the webhook outbox — the newest deliveries, or
//! those in one `state` (`dead` is the dead-letter list), with the counts of what waits and
//! what was given up; `GET /v1/webhooks/deliveries/{id}`: one of them; and
//! `POST /v1/webhooks/deliveries/{id}/retry`: a dead letter back in the queue, due now, with a
//! new delivery window (same `webhook-id`, so a receiver that had it after all de-duplicates).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{ApiError, ErrorCode};
use crate::app::App;
use crate::store::outbox::STATES;

pub(super) async fn list(
    app: &Arc<App>,
    param: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Value, ApiError> {
    let limit = match param("limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=1000).contains(l))
            .ok_or_else(|| ApiError::bad_request("limit must be a number from 1 to 1000"))?,
        None => 50,
    };
    let state = param("state");
    if let Some(s) = &state
        && !STATES.contains(&s.as_str())
    {
        return Err(ApiError::bad_request(format!(
            "state must be one of {}",
            STATES.join(", ")
        )));
    }
    let deliveries = app.store.outbox_list(state, limit).await?;
    let counts = app.store.outbox_counts().await?;
    Ok(json!({
        "deliveries": deliveries,
        "pending": counts.pending,
        "held": counts.held,
        "dead": counts.dead,
    }))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        404,
        ErrorCode::NoDelivery,
        format!(
            "no webhook delivery `{}`; list them with GET /v1/webhooks/deliveries",
            id.escape_default()
        ),
    )
}

pub(super) async fn get(app: &Arc<App>, id: &str) -> Result<Value, ApiError> {
    let d = app
        .store
        .outbox_get(id)
        .await?
        .ok_or_else(|| not_found(id))?;
    Ok(json!(d))
}

pub(super) async fn retry(app: &Arc<App>, id: &str) -> Result<Value, ApiError> {
    if app.store.outbox_retry(id).await? {
        return get(app, id).await;
    }
    match app.store.outbox_get(id).await? {
        None => Err(not_found(id)),
        Some(d) => Err(ApiError::new(
            409,
            ErrorCode::DeliveryNotDead,
            format!(
                "webhook delivery `{}` is {}, not dead; only dead letters are retried by hand",
                id.escape_default(),
                d.state
            ),
        )),
    }
}
