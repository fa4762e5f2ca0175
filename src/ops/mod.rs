//! The operator's commands that talk to the outside world without running the daemon:
//! `patterd doctor` (`doctor/`: what is wrong with this installation, one finding per line)
//! and `patterd wire` / `unwire` (`wire.rs`: point a number's voice webhook at `public_url`
//! and back), and `patterd healthcheck` (`health_probe.rs`: a blocking `GET /healthz` of a
//! running daemon, for container health checks). They use the carriers' number administration
//! (`carrier::admin`), the config and the store's wiring records; never the daemon's live state
//! (the probe only asks the daemon over HTTP).

pub mod doctor;
pub mod health_probe;
pub mod wire;

use std::time::Duration;

/// The HTTP client of the operator commands: no redirects (credentials travel in headers),
/// 5 s per request.
pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    crate::util::init_tls();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}
