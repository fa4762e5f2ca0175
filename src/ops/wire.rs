//! `patterd wire NUMBER` / `patterd unwire NUMBER`: point a configured number's voice webhook
//! at `server.public_url` through its carrier's REST API, and put it back. Before the first
//! change the number's current settings are saved in the store (`store::wiring`); wiring again
//! keeps that first record, and `unwire` sends exactly the saved settings back, then forgets
//! them. `--dry-run` still reads the number (GET requests change nothing) but only prints the
//! writes it would send.

use std::path::Path;

use crate::carrier::CarrierError;
use crate::carrier::admin::{AdminRequest, Wiring};
use crate::config::Config;
use crate::store::{StoreError, wiring};
use crate::util::phone::normalize_e164;

/// Why a wire or unwire did not happen (messages say what to do).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0:?} is not a phone number; write it in E.164, e.g. +14155550100")]
    BadNumber(String),
    #[error("{0} is not in [[numbers]]; add it (with its carrier and agent) first")]
    NotConfigured(String),
    #[error("[carriers.{0}] (named by the number) is not in the config")]
    NoCarrier(String),
    #[error("[carriers.{account}] lacks {missing}; set the credentials first")]
    MissingCredentials { account: String, missing: String },
    #[error("{0} has no saved settings: it was not wired by patterd (or was already unwired)")]
    NotWired(String),
    #[error("the saved settings of {0} are unreadable ({1}); restore them in the carrier console")]
    BadRecord(String, String),
    #[error("{0}")]
    Carrier(#[from] CarrierError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// What `wire` or `unwire` did.
#[derive(Debug, Clone, PartialEq)]
pub enum WireOutcome {
    /// Printed, not sent.
    DryRun(Vec<AdminRequest>),
    /// Sent; `before` describes the settings that were saved.
    Wired {
        before: String,
        sent: usize,
    },
    AlreadyWired,
    Restored {
        sent: usize,
    },
}

fn number_and_account(config: &Config, number: &str) -> Result<(String, String), WireError> {
    let n = normalize_e164(number).ok_or_else(|| WireError::BadNumber(number.to_string()))?;
    let entry = config
        .number(&n)
        .ok_or_else(|| WireError::NotConfigured(crate::security::mask_number(&n)))?;
    Ok((n, entry.carrier.clone()))
}

fn admin_for(
    config: &Config,
    account: &str,
) -> Result<Box<dyn crate::carrier::admin::NumberAdmin>, WireError> {
    let c = config
        .carrier(account)
        .ok_or_else(|| WireError::NoCarrier(account.to_string()))?;
    let missing = c.missing_credentials();
    if !missing.is_empty() {
        return Err(WireError::MissingCredentials {
            account: account.to_string(),
            missing: missing.join(", "),
        });
    }
    Ok(c.admin()?)
}

/// Points `number` at `public_url`.
pub async fn wire(
    config: &Config,
    data_dir: &Path,
    number: &str,
    dry_run: bool,
) -> Result<WireOutcome, WireError> {
    let (number, account) = number_and_account(config, number)?;
    let admin = admin_for(config, &account)?;
    let public = config.server.public_url.trim();
    let current = admin.read_wiring(&number).await?;
    let plan = admin.wire_plan(&current, public)?;
    if dry_run {
        return Ok(WireOutcome::DryRun(plan));
    }
    let conn = wiring::open(data_dir)?;
    if current.points_at(&admin.inbound_url(public)) && wiring::get(&conn, &number)?.is_some() {
        return Ok(WireOutcome::AlreadyWired);
    }
    let record = serde_json::to_string(&current)
        .map_err(|e| WireError::BadRecord(number.clone(), e.to_string()))?;
    wiring::save(&conn, &number, &account, &record)?;
    let sent = plan.len();
    for req in plan {
        admin.send(req).await?;
    }
    Ok(WireOutcome::Wired {
        before: current.describe,
        sent,
    })
}

/// Restores the settings `number` had before `wire`.
pub async fn unwire(
    config: &Config,
    data_dir: &Path,
    number: &str,
    dry_run: bool,
) -> Result<WireOutcome, WireError> {
    let n = normalize_e164(number).ok_or_else(|| WireError::BadNumber(number.to_string()))?;
    let masked = crate::security::mask_number(&n);
    let conn = wiring::open(data_dir)?;
    let record = wiring::get(&conn, &n)?.ok_or_else(|| WireError::NotWired(masked.clone()))?;
    let previous: Wiring = serde_json::from_str(&record.previous)
        .map_err(|e| WireError::BadRecord(masked.clone(), e.to_string()))?;
    let admin = admin_for(config, &record.carrier_account)?;
    let plan = admin.restore_plan(&previous)?;
    if dry_run {
        return Ok(WireOutcome::DryRun(plan));
    }
    let sent = plan.len();
    for req in plan {
        admin.send(req).await?;
    }
    wiring::delete(&conn, &n)?;
    Ok(WireOutcome::Restored { sent })
}
