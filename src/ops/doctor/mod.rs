//! `patterd doctor`: checks an installation and reports one [`Finding`] per line, `OK`,
//! `WARN` or `FAIL`, each with the fix. The config is loaded first (an invalid file is the only
//! finding); then, unless `--offline`, every network check runs concurrently: the brains
//! (`brains.rs`: Hermes `/health`, `/v1/models` with and without the key), the carriers' and
//! speech providers' credentials (`credentials.rs`), `public_url` (`public_url.rs`: DNS, then a
//! nonce round trip through `/healthz` compared with the local listener's instance id) and
//! where each number's webhook points (`numbers.rs`). Allow-lists (`allow_lists.rs`) are
//! checked offline. Findings are typed; the text and JSON renderings come from them.

mod allow_lists;
mod brains;
mod credentials;
mod numbers;
mod public_url;
mod store;

use std::path::Path;

use serde::Serialize;

use crate::carrier::registry::BoxFuture;
use crate::config::{self, Config};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

/// One thing doctor found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    ConfigValid {
        file: String,
    },
    ConfigWarning {
        message: String,
    },
    ConfigInvalid {
        error: String,
    },
    NetworkSkipped,
    HermesHealthy {
        llm: String,
        version: String,
    },
    HermesUnhealthy {
        llm: String,
        url: String,
        error: String,
    },
    LlmKeyAccepted {
        llm: String,
        models: Vec<String>,
    },
    LlmKeyRejected {
        llm: String,
        status: u16,
    },
    LlmModelUnlisted {
        llm: String,
        model: String,
        models: Vec<String>,
    },
    /// Hermes answers `/v1/models` without a key: it has no `API_SERVER_KEY`, so it refuses
    /// session headers with 403.
    HermesWithoutKey {
        llm: String,
        session_key_used: bool,
    },
    CredentialsAccepted {
        service: String,
        detail: String,
    },
    CredentialsRejected {
        service: String,
        status: u16,
    },
    CredentialsRefused {
        service: String,
        error: String,
    },
    /// Timeout, 5xx or network: could not verify (not a failure: the credentials may still be right).
    CredentialsUnverified {
        service: String,
        error: String,
    },
    PublicUrlUnresolved {
        url: String,
        error: String,
    },
    PublicUrlUnreachable {
        url: String,
        error: String,
    },
    /// Something answers at `public_url`, but not a patterd echoing our nonce.
    PublicUrlNotPatterd {
        url: String,
        status: u16,
    },
    /// A patterd answers at `public_url`, but not the one on `server.listen`.
    PublicUrlOtherDaemon {
        url: String,
    },
    /// A patterd echoes the nonce, but no daemon answers on `server.listen` to compare with.
    PublicUrlUnconfirmed {
        url: String,
        listen: String,
    },
    PublicUrlReachesDaemon {
        url: String,
    },
    WebhookPointsHere {
        number: String,
        carrier: String,
    },
    WebhookPointsElsewhere {
        number: String,
        carrier: String,
        now: String,
        want: String,
    },
    NumberNotOnAccount {
        number: String,
        carrier: String,
    },
    NumberUnchecked {
        number: String,
        carrier: String,
        reason: String,
    },
    OutboundRefused {
        number: String,
    },
    DestinationsUnbounded {
        number: String,
        entry: String,
    },
    NoNumbers,
    /// The PostgreSQL store answers; its schema is one this patterd can use.
    StoreReachable {
        url: String,
        server: String,
        schema: i64,
    },
    StoreUnreachable {
        url: String,
        error: String,
    },
    /// The database was migrated by a newer patterd: this one refuses to start on it.
    StoreSchemaTooNew {
        url: String,
        schema: i64,
        supported: i64,
    },
}

/// A [`Finding`] as printed (`--json`): its level, fields, message and fix.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    pub level: Level,
    #[serde(flatten)]
    pub finding: &'a Finding,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn masked(n: &str) -> String {
    crate::security::mask_number(n)
}

impl Finding {
    pub fn level(&self) -> Level {
        use Finding::*;
        match self {
            ConfigValid { .. }
            | HermesHealthy { .. }
            | LlmKeyAccepted { .. }
            | CredentialsAccepted { .. }
            | PublicUrlReachesDaemon { .. }
            | WebhookPointsHere { .. }
            | StoreReachable { .. } => Level::Ok,
            ConfigWarning { .. }
            | NetworkSkipped
            | LlmModelUnlisted { .. }
            | CredentialsUnverified { .. }
            | PublicUrlUnconfirmed { .. }
            | NumberUnchecked { .. }
            | OutboundRefused { .. }
            | DestinationsUnbounded { .. }
            | NoNumbers => Level::Warn,
            HermesWithoutKey {
                session_key_used, ..
            } => {
                if *session_key_used {
                    Level::Fail
                } else {
                    Level::Warn
                }
            }
            ConfigInvalid { .. }
            | HermesUnhealthy { .. }
            | LlmKeyRejected { .. }
            | CredentialsRejected { .. }
            | CredentialsRefused { .. }
            | PublicUrlUnresolved { .. }
            | PublicUrlUnreachable { .. }
            | PublicUrlNotPatterd { .. }
            | PublicUrlOtherDaemon { .. }
            | WebhookPointsElsewhere { .. }
            | NumberNotOnAccount { .. }
            | StoreUnreachable { .. }
            | StoreSchemaTooNew { .. } => Level::Fail,
        }
    }

    /// What was found, in one sentence.
    pub fn message(&self) -> String {
        use Finding::*;
        match self {
            ConfigValid { file } => format!("config {file} is valid"),
            ConfigWarning { message } => format!("config: {message}"),
            ConfigInvalid { error } => format!("config is invalid: {error}"),
            NetworkSkipped => "network checks skipped (--offline)".into(),
            HermesHealthy { llm, version } => {
                format!("[llm.{llm}] Hermes is up (version {version})")
            }
            HermesUnhealthy { llm, url, error } => {
                format!("[llm.{llm}] Hermes health check {url} failed: {error}")
            }
            LlmKeyAccepted { llm, models } => {
                format!(
                    "[llm.{llm}] api_key accepted; models: {}",
                    models.join(", ")
                )
            }
            LlmKeyRejected { llm, status } => {
                format!("[llm.{llm}] api_key rejected by /v1/models (HTTP {status})")
            }
            LlmModelUnlisted { llm, model, models } => format!(
                "[llm.{llm}] model {model:?} is not among the served models ({})",
                models.join(", ")
            ),
            HermesWithoutKey {
                llm,
                session_key_used,
            } => {
                if *session_key_used {
                    format!(
                        "[llm.{llm}] Hermes runs without an API key, so it answers 403 to the \
                         X-Hermes-Session-Key header this brain sends"
                    )
                } else {
                    format!("[llm.{llm}] Hermes answers /v1/models without an API key")
                }
            }
            CredentialsAccepted { service, detail } => {
                format!("{service} credentials accepted ({detail})")
            }
            CredentialsRejected { service, status } => {
                format!("{service} credentials rejected (HTTP {status})")
            }
            CredentialsRefused { service, error } => format!("{service}: {error}"),
            CredentialsUnverified { service, error } => {
                format!("{service} credentials could not be verified: {error}")
            }
            PublicUrlUnresolved { url, error } => {
                format!("public_url {url} does not resolve: {error}")
            }
            PublicUrlUnreachable { url, error } => {
                format!("public_url {url} is unreachable: {error}")
            }
            PublicUrlNotPatterd { url, status } => format!(
                "public_url {url} answers /healthz with HTTP {status} but does not echo the \
                 nonce: something other than patterd answers there"
            ),
            PublicUrlOtherDaemon { url } => format!(
                "public_url {url} reaches a patterd, but not the one listening on server.listen"
            ),
            PublicUrlUnconfirmed { url, listen } => format!(
                "public_url {url} reaches a patterd, but no daemon answers on {listen} to \
                 confirm it is this one"
            ),
            PublicUrlReachesDaemon { url } => {
                format!("public_url {url} reaches this daemon (nonce round trip)")
            }
            WebhookPointsHere { number, carrier } => {
                format!(
                    "{} ([carriers.{carrier}]) rings this daemon",
                    masked(number)
                )
            }
            WebhookPointsElsewhere {
                number,
                carrier,
                now,
                want,
            } => format!(
                "{} ([carriers.{carrier}]) points elsewhere: {now} (want {want})",
                masked(number)
            ),
            NumberNotOnAccount { number, carrier } => {
                format!("{} is not a number of [carriers.{carrier}]", masked(number))
            }
            NumberUnchecked {
                number,
                carrier,
                reason,
            } => format!(
                "{} ([carriers.{carrier}]) webhook not checked: {reason}",
                masked(number)
            ),
            OutboundRefused { number } => format!(
                "{}: agents can reach the API (api_token is set) but allowed_destinations is \
                 empty, so every outbound call from it is refused",
                masked(number)
            ),
            DestinationsUnbounded { number, entry } => format!(
                "{}: allowed_destinations entry {entry:?} lets agents call every number of a whole country-code zone",
                masked(number)
            ),
            NoNumbers => "no [[numbers]] configured: no call will be answered".into(),
            StoreReachable {
                url,
                server,
                schema,
            } => format!(
                "call store: PostgreSQL {server} at {url} answers (schema version {schema}{})",
                if *schema == 0 {
                    ", tables made at first start"
                } else {
                    ""
                }
            ),
            StoreUnreachable { url, error } => {
                format!("call store: PostgreSQL at {url} cannot be reached: {error}")
            }
            StoreSchemaTooNew {
                url,
                schema,
                supported,
            } => format!(
                "call store: the database at {url} has schema version {schema}, newer than this \
                 patterd knows ({supported}); it will refuse to start"
            ),
        }
    }

    /// How to fix it (none for OK findings).
    pub fn fix(&self) -> Option<String> {
        use Finding::*;
        Some(match self {
            ConfigValid { .. }
            | HermesHealthy { .. }
            | LlmKeyAccepted { .. }
            | CredentialsAccepted { .. }
            | PublicUrlReachesDaemon { .. }
            | WebhookPointsHere { .. }
            | StoreReachable { .. } => return None,
            StoreUnreachable { .. } => "check [store] url (host, port, user, password, database) \
                and that PostgreSQL is running and accepts connections from this host"
                .into(),
            StoreSchemaTooNew { .. } => "run the newer patterd, or point [store] url at another \
                database"
                .into(),
            ConfigWarning { .. } => {
                "see the message; `patterd check --strict` lists them all".into()
            }
            ConfigInvalid { .. } => {
                "correct the file at the line named, then run doctor again".into()
            }
            NetworkSkipped => {
                "run without --offline to check credentials, public_url and numbers".into()
            }
            HermesUnhealthy { llm, .. } => {
                format!("start Hermes with API_SERVER_ENABLED=true, or correct llm.{llm}.base_url")
            }
            LlmKeyRejected { llm, .. } => {
                format!("set llm.{llm}.api_key to the server's key (Hermes: API_SERVER_KEY)")
            }
            LlmModelUnlisted { llm, .. } => {
                format!("set llm.{llm}.model to one of the served models")
            }
            HermesWithoutKey { llm, .. } => {
                format!("set API_SERVER_KEY for Hermes and the same value as llm.{llm}.api_key")
            }
            CredentialsRejected { service, .. } | CredentialsRefused { service, .. } => {
                format!("correct the credentials of {service} in the config")
            }
            CredentialsUnverified { .. } => {
                "check network access to the service (or its base URL), then run doctor again"
                    .into()
            }
            PublicUrlUnresolved { .. } => {
                "create the DNS record, or correct server.public_url".into()
            }
            PublicUrlUnreachable { .. } => "start the daemon, and check the reverse proxy, \
                                            firewall and TLS in front of it"
                .into(),
            PublicUrlNotPatterd { .. } => {
                "route public_url (all paths) to server.listen in the reverse proxy".into()
            }
            PublicUrlOtherDaemon { .. } => {
                "public_url must reach this host's daemon: fix the proxy or DNS".into()
            }
            PublicUrlUnconfirmed { .. } => {
                "start the daemon (or run doctor on its host), then run doctor again".into()
            }
            WebhookPointsElsewhere { number, .. } => format!("run `patterd wire {number}`"),
            NumberNotOnAccount { number, carrier } => format!(
                "buy or port {} into the [carriers.{carrier}] account, or correct the \
                 [[numbers]] entry",
                masked(number)
            ),
            NumberUnchecked { .. } => "fix the carrier's credentials, then run doctor again".into(),
            OutboundRefused { .. } => "list the numbers or prefixes it may call in \
                                       allowed_destinations (ignore if it only answers calls)"
                .into(),
            DestinationsUnbounded { .. } => {
                "narrow allowed_destinations to the numbers or country prefixes needed".into()
            }
            NoNumbers => "add a [[numbers]] entry for each number patterd answers".into(),
        })
    }

    pub fn line(&self) -> Line<'_> {
        Line {
            level: self.level(),
            finding: self,
            message: self.message(),
            fix: self.fix(),
        }
    }
}

/// What doctor found, in order.
#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    /// The worst level found (OK when nothing was found).
    pub fn worst(&self) -> Level {
        self.findings
            .iter()
            .map(Finding::level)
            .max()
            .unwrap_or(Level::Ok)
    }

    /// One line per finding: `LEVEL message — fix`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let l = f.line();
            out.push_str(&format!("{:<4} {}", l.level.as_str(), l.message));
            if let Some(fix) = l.fix {
                out.push_str(&format!(" — fix: {fix}"));
            }
            out.push('\n');
        }
        let (w, x) = self
            .findings
            .iter()
            .fold((0, 0), |(w, x), f| match f.level() {
                Level::Warn => (w + 1, x),
                Level::Fail => (w, x + 1),
                Level::Ok => (w, x),
            });
        out.push_str(&format!(
            "{} checks: {x} failed, {w} warnings\n",
            self.findings.len()
        ));
        out
    }

    /// `{"ok": bool, "findings": [...]}`.
    pub fn json(&self) -> String {
        let lines: Vec<Line<'_>> = self.findings.iter().map(Finding::line).collect();
        serde_json::json!({"ok": self.worst() != Level::Fail, "findings": lines}).to_string()
    }
}

/// Options of `patterd doctor`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Skip every network check.
    pub offline: bool,
}

/// Runs every check on the configuration file at `path`.
pub async fn run(path: &Path, opts: Options) -> Report {
    let mut report = Report::default();
    let loaded = match config::load(path) {
        Ok(l) => l,
        Err(e) => {
            report.findings.push(Finding::ConfigInvalid {
                error: e.to_string(),
            });
            return report;
        }
    };
    report.findings.push(Finding::ConfigValid {
        file: path.display().to_string(),
    });
    for w in &loaded.warnings {
        report.findings.push(Finding::ConfigWarning {
            message: w.to_string(),
        });
    }
    let config = loaded.config;
    report.findings.extend(allow_lists::check(&config));
    if opts.offline {
        report.findings.push(Finding::NetworkSkipped);
        return report;
    }
    report.findings.extend(network(&config).await);
    report
}

/// The network checks, run concurrently; findings in a stable order.
async fn network(config: &Config) -> Vec<Finding> {
    let client = match crate::ops::http_client() {
        Ok(c) => c,
        Err(e) => {
            return vec![Finding::CredentialsUnverified {
                service: "every service".into(),
                error: e,
            }];
        }
    };
    let mut checks: Vec<BoxFuture<Vec<Finding>>> = Vec::new();
    checks.extend(brains::checks(config, &client));
    checks.extend(credentials::checks(config, &client));
    checks.push(public_url::check(config, &client));
    checks.extend(store::check(config));
    checks.extend(numbers::checks(config));
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in checks.into_iter().enumerate() {
        set.spawn(async move { (i, c.await) });
    }
    let mut out: Vec<(usize, Vec<Finding>)> = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(r) = r {
            out.push(r);
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().flat_map(|(_, f)| f).collect()
}
