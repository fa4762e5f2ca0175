//! Doctor's number check: for each `[[numbers]]` entry whose carrier account has
//! credentials, where the carrier sends its calls now (read through the carrier's REST API)
//! compared with this daemon's inbound URL under `public_url`.

use super::Finding;
use crate::carrier::CarrierError;
use crate::carrier::registry::BoxFuture;
use crate::config::Config;

pub(super) fn checks(config: &Config) -> Vec<BoxFuture<Vec<Finding>>> {
    let public = config.server.public_url.trim().to_string();
    config
        .numbers
        .iter()
        .map(|n| {
            let number = n.number.clone();
            let carrier = n.carrier.clone();
            let account = config.carrier(&n.carrier).cloned();
            let public = public.clone();
            Box::pin(async move {
                let unchecked = |reason: String| Finding::NumberUnchecked {
                    number: number.clone(),
                    carrier: carrier.clone(),
                    reason,
                };
                let Some(account) = account else {
                    return vec![unchecked("no such carrier account".into())];
                };
                let missing = account.missing_credentials();
                if !missing.is_empty() {
                    return vec![unchecked(format!("missing {}", missing.join(", ")))];
                }
                let admin = match account.admin() {
                    Ok(a) => a,
                    Err(e) => return vec![unchecked(e.to_string())],
                };
                let want = admin.inbound_url(&public);
                vec![match admin.read_wiring(&number).await {
                    Ok(w) if w.points_at(&want) => Finding::WebhookPointsHere { number, carrier },
                    Ok(w) => Finding::WebhookPointsElsewhere {
                        number,
                        carrier,
                        now: w.describe,
                        want,
                    },
                    Err(CarrierError::NotFound { .. }) => {
                        Finding::NumberNotOnAccount { number, carrier }
                    }
                    Err(e) => unchecked(e.to_string()),
                }]
            }) as BoxFuture<_>
        })
        .collect()
}
