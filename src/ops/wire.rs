//! `patterd wire NUMBER` / `patterd unwire NUMBER`: point a configured number's voice webhook
//! at `server.public_url` through its carrier's REST API, and put it back. Before the first
//! change the number's current settings are saved in the store (`store::wiring`); wiring again
//! keeps that first record, and `unwire` sends exactly the saved settings back, then forgets
//! them. `--dry-run` still reads the number (GET requests change nothing) but only prints the
//! writes it would send.
//!
//! Telnyx and Plivo route numbers through an application several numbers may share, and wiring
//! rewrites it: a wire that would move other numbers' calls (the application points elsewhere
//! and routes numbers that are neither wired by patterd nor in its `[[numbers]]`) lists them
//! and is refused unless `--force`. The application's settings are kept once per application,
//! from before the first wire through it (a second number's wire does not replace them);
//! `unwire` restores the number's own settings, and the application only with the last number
//! wired through it.

use std::path::Path;

use crate::carrier::CarrierError;
use crate::carrier::admin::{AdminRequest, SharedApp, Wiring};
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
    #[error(
        "{app} routes {count} other number(s) as well ({listed}); wiring {number} would send \
         their calls to patterd too. Move {number} to an application of its own in the carrier \
         console, or run again with --force to rewrite the shared one"
    )]
    SharedApp {
        number: String,
        app: String,
        count: usize,
        /// The other numbers, masked (the first few).
        listed: String,
    },
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

/// The numbers listed in a [`WireError::SharedApp`].
const LISTED: usize = 5;

/// The saved number records of `account`, read back.
fn wired_numbers(
    conn: &rusqlite::Connection,
    account: &str,
) -> Result<Vec<(String, Wiring)>, WireError> {
    let mut out = Vec::new();
    for r in wiring::of_account(conn, account)? {
        let w: Wiring = serde_json::from_str(&r.previous).map_err(|e| {
            WireError::BadRecord(crate::security::mask_number(&r.number), e.to_string())
        })?;
        out.push((r.number, w));
    }
    Ok(out)
}

/// Points `number` at `public_url`. With `force`, also when the number's application is
/// shared with numbers patterd did not wire (see the module docs).
pub async fn wire(
    config: &Config,
    data_dir: &Path,
    number: &str,
    dry_run: bool,
    force: bool,
) -> Result<WireOutcome, WireError> {
    let (number, account) = number_and_account(config, number)?;
    let admin = admin_for(config, &account)?;
    let public = config.server.public_url.trim();
    let inbound = admin.inbound_url(public);
    let current = admin.read_wiring(&number).await?;
    let plan = admin.wire_plan(&current, public)?;
    let conn = wiring::open(data_dir)?;
    if let Some(app) = &current.app {
        let points_here = app.voice_url.trim_end_matches('/') == inbound.trim_end_matches('/');
        if !points_here && !force {
            // Numbers patterd wired or serves on this account are not moved against anyone's will.
            let mut ours: Vec<String> = wired_numbers(&conn, &account)?
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            ours.extend(
                config
                    .numbers
                    .iter()
                    .filter(|e| e.carrier == account)
                    .filter_map(|e| normalize_e164(&e.number)),
            );
            let others: Vec<String> = admin
                .app_numbers(app)
                .await?
                .into_iter()
                .filter(|n| *n != number && !ours.contains(n))
                .collect();
            if !others.is_empty() {
                let mut listed: Vec<String> = others
                    .iter()
                    .take(LISTED)
                    .map(|n| crate::security::mask_number(n))
                    .collect();
                if others.len() > LISTED {
                    listed.push(format!("and {} more", others.len() - LISTED));
                }
                return Err(WireError::SharedApp {
                    number: crate::security::mask_number(&number),
                    app: format!("application {}", app.id),
                    count: others.len(),
                    listed: listed.join(", "),
                });
            }
        }
    }
    if dry_run {
        return Ok(WireOutcome::DryRun(plan));
    }
    if current.points_at(&inbound) && wiring::get(&conn, &number)?.is_some() {
        return Ok(WireOutcome::AlreadyWired);
    }
    let record = serde_json::to_string(&current)
        .map_err(|e| WireError::BadRecord(number.clone(), e.to_string()))?;
    if let Some(app) = &current.app {
        // The application as it was before the first wire through it: a later wire (another
        // number on it, now pointing here) keeps that record.
        let saved = serde_json::to_string(app)
            .map_err(|e| WireError::BadRecord(number.clone(), e.to_string()))?;
        wiring::save_app(&conn, &account, &app.id, &saved)?;
    }
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
    let account = record.carrier_account.clone();
    let admin = admin_for(config, &account)?;
    let mut plan = admin.restore_plan(&previous)?;
    // The application goes back with the last number wired through it, as it was before the
    // first of them.
    let mut restored_app = None;
    if let Some(app) = &previous.app {
        let still_used = wired_numbers(&conn, &account)?
            .iter()
            .any(|(other, w)| *other != n && w.app.as_ref().is_some_and(|a| a.id == app.id));
        if !still_used {
            let saved: SharedApp = match wiring::get_app(&conn, &account, &app.id)? {
                Some(json) => serde_json::from_str(&json)
                    .map_err(|e| WireError::BadRecord(masked.clone(), e.to_string()))?,
                None => app.clone(),
            };
            plan.extend(admin.restore_app_plan(&saved)?);
            restored_app = Some(app.id.clone());
        }
    }
    if dry_run {
        return Ok(WireOutcome::DryRun(plan));
    }
    let sent = plan.len();
    for req in plan {
        admin.send(req).await?;
    }
    wiring::delete(&conn, &n)?;
    if let Some(id) = restored_app {
        wiring::delete_app(&conn, &account, &id)?;
    }
    Ok(WireOutcome::Restored { sent })
}
