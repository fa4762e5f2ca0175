//! Doctor's allow-list check (offline): numbers agents cannot call out from although the API
//! is open to them, and destination entries so short they allow a whole country-code zone.

use super::Finding;
use crate::config::Config;

pub(super) fn check(config: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    if config.numbers.is_empty() {
        out.push(Finding::NoNumbers);
    }
    let agents_can_dial = !config.server.api_token.is_empty();
    for n in &config.numbers {
        if agents_can_dial && n.allowed_destinations.is_empty() {
            out.push(Finding::OutboundRefused {
                number: n.number.clone(),
            });
        }
        for d in &n.allowed_destinations {
            // "+" and one digit: a whole country-code zone (+1 is all of North America).
            if d.trim().trim_start_matches('+').len() <= 1 {
                out.push(Finding::DestinationsUnbounded {
                    number: n.number.clone(),
                    entry: d.clone(),
                });
            }
        }
    }
    out
}
