//! Checks a configuration that deserialized cleanly but may still be wrong: cross-references
//! (agents → llm/stt/tts, numbers → carriers/agents), E.164 numbers, the listener and its API
//! token, URLs and limits. Every problem is collected, not just the first. Also the warnings
//! for unconfigured carriers and providers.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use super::error::{Problem, describe_key, suggest};
use super::schema::{AgentConfig, Config, LlmKind, VadEngineName};
use super::source::Locator;
use crate::util::phone::{is_e164, is_e164_prefix};

mod cluster;
mod local_tts;
mod providers;
mod turn_model;
mod webhooks;

use providers::{carriers, llms, stts, ttss};

fn path(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

struct Check<'a> {
    loc: &'a Locator,
    problems: Vec<Problem>,
}

impl Check<'_> {
    fn fail(&mut self, parts: &[&str], message: String) {
        let p = path(parts);
        self.problems
            .push(Problem::new(self.loc.locate(&p), message));
    }

    fn url(&mut self, parts: &[&str], value: &str, schemes: &[&str], example: &str) {
        let ok = url::Url::parse(value)
            .map(|u| schemes.contains(&u.scheme()) && u.host_str().is_some_and(|h| !h.is_empty()))
            .unwrap_or(false);
        if !ok {
            let key = describe_key(&path(parts));
            self.fail(
                parts,
                format!(
                    "{key} = {value:?} is not an absolute {} URL (e.g. {example})",
                    schemes.join("/")
                ),
            );
        }
    }

    fn at_least_one(&mut self, parts: &[&str], value: u64) {
        if value == 0 {
            let key = describe_key(&path(parts));
            self.fail(parts, format!("{key} must be at least 1"));
        }
    }

    fn reference<T>(
        &mut self,
        parts: &[&str],
        section: &str,
        name: &str,
        defined: &BTreeMap<String, T>,
    ) {
        if defined.contains_key(name) {
            return;
        }
        let key = describe_key(&path(parts));
        let mut m = format!("{key} = {name:?} names no [{section}.{name}] section; ");
        if defined.is_empty() {
            m.push_str(&format!("no [{section}.*] section is defined"));
        } else {
            let names: Vec<&str> = defined.keys().map(String::as_str).collect();
            m.push_str(&format!("defined {section}: {}", names.join(", ")));
            if let Some(s) = suggest(name, names.iter().copied()) {
                m.push_str(&format!("; did you mean `{s}`?"));
            }
        }
        self.fail(parts, m);
    }
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks `log.level`: a level, or a tracing filter with directives.
fn check_log_level(level: &str) -> Result<(), String> {
    let trimmed = level.trim();
    if trimmed.is_empty() {
        return Err("is empty".into());
    }
    let plain_word = trimmed
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain_word && !LEVELS.contains(&trimmed.to_ascii_lowercase().as_str()) {
        let mut m = format!("is not a level ({})", LEVELS.join(", "));
        if let Some(s) = suggest(&trimmed.to_ascii_lowercase(), LEVELS) {
            m.push_str(&format!("; did you mean `{s}`?"));
        }
        return Err(m);
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(trimmed)
        .map(|_| ())
        .map_err(|e| format!("is not a valid tracing filter ({e})"))
}

/// `[pricing.KIND.NAME]`: names a configured provider or carrier account; prices are finite
/// and not negative.
fn pricing(c: &mut Check<'_>, config: &Config) {
    let p = &config.pricing;
    // (section, name, names a configured entry, its prices by key)
    type Entry<'a> = (&'a str, &'a String, bool, Vec<(&'a str, f64)>);
    let mut entries: Vec<Entry<'_>> = Vec::new();
    for (n, v) in &p.stt {
        let known = config.stt.contains_key(n);
        entries.push(("stt", n, known, vec![("usd_per_minute", v.usd_per_minute)]));
    }
    for (n, v) in &p.tts {
        let known = config.tts.contains_key(n);
        let prices = vec![("usd_per_1k_characters", v.usd_per_1k_characters)];
        entries.push(("tts", n, known, prices));
    }
    for (n, v) in &p.llm {
        let known = config.llm.contains_key(n);
        let prices = vec![
            ("usd_per_1m_input_tokens", v.usd_per_1m_input_tokens),
            ("usd_per_1m_output_tokens", v.usd_per_1m_output_tokens),
        ];
        entries.push(("llm", n, known, prices));
    }
    for (n, v) in &p.carriers {
        let known = config.carriers.contains_key(n);
        entries.push((
            "carriers",
            n,
            known,
            vec![("usd_per_minute", v.usd_per_minute)],
        ));
    }
    for (kind, name, known, prices) in entries {
        if !known {
            c.fail(
                &["pricing", kind, name],
                format!(
                    "[pricing.{kind}.{name}] prices `{name}`, but there is no [{kind}.{name}]; \
                     use the name of a configured {kind} entry"
                ),
            );
        }
        for (key, v) in prices {
            if !v.is_finite() || v < 0.0 {
                c.fail(
                    &["pricing", kind, name, key],
                    format!(
                        "[pricing.{kind}.{name}] {key} = {v} must be a price in US dollars, 0 or more"
                    ),
                );
            }
        }
    }
}

/// `[telemetry]`: an absolute http(s) collector URL, a service name, limits of at least 1.
/// Nothing is checked while it is off (`otlp_endpoint` empty).
fn telemetry(c: &mut Check<'_>, t: &crate::config::schema::TelemetryConfig) {
    if !t.enabled() {
        return;
    }
    c.url(
        &["telemetry", "otlp_endpoint"],
        t.otlp_endpoint.trim(),
        &["http", "https"],
        "http://127.0.0.1:4318",
    );
    if t.service_name.trim().is_empty() {
        c.fail(
            &["telemetry", "service_name"],
            "`telemetry.service_name` is empty; name the service spans are reported under \
             (e.g. \"patterd\")"
                .into(),
        );
    }
    c.at_least_one(
        &["telemetry", "max_queued_spans"],
        t.max_queued_spans as u64,
    );
    c.at_least_one(&["telemetry", "export_interval_ms"], t.export_interval_ms);
    c.at_least_one(&["telemetry", "export_timeout_ms"], t.export_timeout_ms);
    for (name, value) in &t.headers {
        let valid = http::HeaderName::from_bytes(name.as_bytes()).is_ok()
            && http::HeaderValue::from_str(value.expose()).is_ok();
        if !valid {
            c.fail(
                &["telemetry", "headers", name],
                format!(
                    "`telemetry.headers` entry {name:?} is not a valid HTTP header (a token \
                     name and a value of visible ASCII)"
                ),
            );
        }
    }
}

/// Every problem with `config`, located through `loc`, section by section.
pub(crate) fn validate(config: &Config, loc: &Locator) -> Vec<Problem> {
    let mut c = Check {
        loc,
        problems: Vec::new(),
    };
    server(&mut c, config);
    limits(&mut c, config);
    pricing(&mut c, config);
    telemetry(&mut c, &config.telemetry);
    turn_model::check(&mut c, config);
    llms(&mut c, config);
    stts(&mut c, config);
    ttss(&mut c, config);
    carriers(&mut c, config);
    for (name, agent) in &config.agents {
        agent_providers(&mut c, name, agent, config);
        agent_turn_taking(&mut c, name, agent);
        agent_brain_outage(&mut c, name, agent);
    }
    // Tool keys (config::tools).
    for (name, agent) in &config.agents {
        for (keys, message) in super::tools::problems(name, agent, &config.llm) {
            let parts: Vec<&str> = keys.iter().map(String::as_str).collect();
            c.fail(&parts, message);
        }
    }
    numbers(&mut c, config);
    webhooks::check(&mut c, config);
    c.problems
}

/// `[server]`: the listener, its API token, the public URL, limits and TLS.
fn server(c: &mut Check, config: &Config) {
    let server = &config.server;
    match server.listen.trim().parse::<SocketAddr>() {
        Err(_) => c.fail(
            &["server", "listen"],
            format!(
                "[server] listen = {:?} is not a socket address; write IP:port, e.g. \
                 127.0.0.1:8080 or [::1]:8080",
                server.listen
            ),
        ),
        Ok(addr) if !addr.ip().is_loopback() && server.api_token.is_empty() => c.fail(
            &["server", "listen"],
            format!(
                "[server] listen = {:?} is reachable from the network but [server] api_token \
                 is empty, which would leave /v1 and /mcp open; set the environment variable \
                 PATTERD_API_TOKEN (the example configuration's api_token reads it; generate one \
                 with `openssl rand -hex 32`), or listen on 127.0.0.1",
                server.listen
            ),
        ),
        Ok(addr) if server.api_token.is_empty() && !server.api_is_local() => c.fail(
            &["server", "public_url"],
            format!(
                "[server] api_token is empty but public_url = {:?} is not a loopback address: \
                 behind a reverse proxy (listen = {:?}) /v1 and /mcp would be open to anyone \
                 who can reach {:?}; set server.api_token = \"${{PATTERD_API_TOKEN}}\" (and \
                 send `Authorization: Bearer <token>`), or use a loopback public_url for local \
                 development",
                server.public_url,
                addr.to_string(),
                server.public_url,
            ),
        ),
        Ok(_) => {}
    }
    let token_chars = server.api_token.expose().trim().chars().count();
    if !server.api_token.is_empty() && token_chars < MIN_API_TOKEN_CHARS && !server.api_is_local() {
        c.fail(
            &["server", "api_token"],
            format!(
                "[server] api_token has {token_chars} characters; the token of an API reachable \
                 from the network (listen or public_url is not loopback) needs at least \
                 {MIN_API_TOKEN_CHARS}: generate one with `openssl rand -hex 32`"
            ),
        );
    }
    api_tokens(c, server);
    c.url(
        &["server", "public_url"],
        &server.public_url,
        &["http", "https"],
        "https://voice.example.com",
    );
    if server.data_dir.as_os_str().is_empty() {
        c.fail(
            &["server", "data_dir"],
            "[server] data_dir is empty; give a writable directory".into(),
        );
    }
    c.at_least_one(&["server", "max_calls"], server.max_calls as u64);
    c.at_least_one(
        &["server", "max_connections"],
        server.max_connections as u64,
    );
    c.at_least_one(&["server", "max_body_bytes"], server.max_body_bytes as u64);
    c.at_least_one(&["server", "header_timeout_s"], server.header_timeout_s);
    if let Some(tls) = &server.tls {
        for (key, value) in [("cert", &tls.cert), ("key", &tls.key)] {
            if value.as_os_str().is_empty() {
                c.fail(
                    &["server", "tls", key],
                    format!("[server.tls] {key} is empty; give the path of a PEM file"),
                );
            }
        }
    }
}

/// `[store] backend = "postgres"` needs a PostgreSQL URL, a pool, and a build that has it.
fn store_backend(c: &mut Check, store: &crate::config::schema::StoreConfig) {
    use crate::config::schema::StoreBackend;
    if store.backend != StoreBackend::Postgres {
        return;
    }
    if !cfg!(feature = "postgres") {
        c.fail(
            &["store", "backend"],
            "[store] backend = \"postgres\" but this patterd was built without the `postgres` \
             feature; rebuild with default features, or use backend = \"sqlite\""
                .to_string(),
        );
    }
    match store.url.as_ref().map(|u| u.expose()) {
        None | Some("") => c.fail(
            &["store", "backend"],
            "[store] backend = \"postgres\" needs url = \"postgres://user:password@host:5432/db\" \
             (e.g. url = \"${PATTERD_DATABASE_URL}\")"
                .to_string(),
        ),
        Some(u) if !(u.starts_with("postgres://") || u.starts_with("postgresql://")) => c.fail(
            &["store", "url"],
            "[store] url must start with postgres:// or postgresql://".to_string(),
        ),
        Some(_) => {}
    }
    c.at_least_one(&["store", "pool"], u64::from(store.pool));
}

/// `[store]`, `[outbound]` and `[log]` limits.
fn limits(c: &mut Check, config: &Config) {
    c.at_least_one(&["store", "queue"], config.store.queue as u64);
    store_backend(c, &config.store);
    cluster::check(c, config);
    c.at_least_one(
        &["outbound", "max_concurrent"],
        config.outbound.max_concurrent as u64,
    );
    c.at_least_one(
        &["outbound", "ring_timeout_s"],
        u64::from(config.outbound.ring_timeout_s),
    );
    let max_chars = config.outbound.max_sms_chars;
    if !(1..=crate::carrier::messaging::MAX_SMS_CHARS).contains(&max_chars) {
        c.fail(
            &["outbound", "max_sms_chars"],
            format!(
                "[outbound] max_sms_chars = {max_chars} must be 1 to {} (the longest message \
                 every SMS carrier accepts)",
                crate::carrier::messaging::MAX_SMS_CHARS
            ),
        );
    }

    if let Err(why) = check_log_level(&config.log.level) {
        c.fail(
            &["log", "level"],
            format!("[log] level = {:?} {why}", config.log.level),
        );
    }
}

/// `[agents.NAME]`: the providers it names and their chains' timings.
fn agent_providers(c: &mut Check, name: &str, agent: &AgentConfig, config: &Config) {
    if agent.llm.names().is_empty() {
        c.fail(
            &["agents", name, "llm"],
            format!("[agents.{name}] llm = [] names no brain: give one name or a chain"),
        );
    }
    for llm in agent.llm.names() {
        c.reference(&["agents", name, "llm"], "llm", &llm, &config.llm);
    }
    if agent.stt.names().is_empty() {
        c.fail(
            &["agents", name, "stt"],
            format!("[agents.{name}] stt = [] names no [stt.NAME] section; name one or more"),
        );
    }
    for stt in agent.stt.names() {
        c.reference(&["agents", name, "stt"], "stt", &stt, &config.stt);
    }
    let ct = agent.stt_connect_timeout_ms;
    if !(100..=30_000).contains(&ct) {
        c.fail(
            &["agents", name, "stt_connect_timeout_ms"],
            format!("[agents.{name}] stt_connect_timeout_ms = {ct} is out of range 100 to 30000"),
        );
    }
    let cool = agent.stt_cooldown_s;
    if !cool.is_finite() || cool < 0.0 {
        c.fail(
            &["agents", name, "stt_cooldown_s"],
            format!("[agents.{name}] stt_cooldown_s = {cool} must be 0 or more seconds"),
        );
    }
    if agent.tts.names().is_empty() {
        c.fail(
            &["agents", name, "tts"],
            format!("[agents.{name}] tts = [] names no [tts.NAME] section; name one or more"),
        );
    }
    for t in agent.tts.names() {
        c.reference(&["agents", name, "tts"], "tts", t, &config.tts);
    }
    let fb = agent.tts_first_byte_timeout_ms;
    if !(100..=30_000).contains(&fb) {
        c.fail(
            &["agents", name, "tts_first_byte_timeout_ms"],
            format!(
                "[agents.{name}] tts_first_byte_timeout_ms = {fb} is out of range 100 to 30000"
            ),
        );
    }
    let cool = agent.tts_cooldown_s;
    if !cool.is_finite() || cool < 0.0 {
        c.fail(
            &["agents", name, "tts_cooldown_s"],
            format!("[agents.{name}] tts_cooldown_s = {cool} must be 0 or more seconds"),
        );
    }
}

/// Longest `brain_retry_s`: a caller kept waiting longer than this hears nothing useful.
const MAX_BRAIN_RETRY_S: f64 = 60.0;

/// `[agents.NAME]`: what a call does while its brain is down (`brain_retry_s`,
/// `brain_down_hangup_s`).
fn agent_brain_outage(c: &mut Check, name: &str, agent: &AgentConfig) {
    let retry = agent.brain_retry_s;
    if !retry.is_finite() || !(0.0..=MAX_BRAIN_RETRY_S).contains(&retry) {
        c.fail(
            &["agents", name, "brain_retry_s"],
            format!(
                "[agents.{name}] brain_retry_s = {retry} must be between 0 (no retries) and \
                 {MAX_BRAIN_RETRY_S} seconds"
            ),
        );
    }
    let hangup = agent.brain_down_hangup_s;
    if !hangup.is_finite() || hangup < 0.0 {
        c.fail(
            &["agents", name, "brain_down_hangup_s"],
            format!(
                "[agents.{name}] brain_down_hangup_s = {hangup} must be 0 (never hang up) or \
                 more seconds"
            ),
        );
    }
}

/// `[agents.NAME]`: turn-taking, barge-in, idle and transfer settings.
fn agent_turn_taking(c: &mut Check, name: &str, agent: &AgentConfig) {
    let after = agent.long_turn_message_after_s;
    if !after.is_finite() || after < 0.0 {
        c.fail(
            &["agents", name, "long_turn_message_after_s"],
            format!(
                "[agents.{name}] long_turn_message_after_s = {after} must be 0 or more seconds"
            ),
        );
    }
    c.at_least_one(&["agents", name, "max_duration_s"], agent.max_duration_s);
    for (j, dest) in agent.transfer_allowed.iter().enumerate() {
        if !is_e164_prefix(dest) {
            c.fail(
                &["agents", name, "transfer_allowed", &j.to_string()],
                format!(
                    "[agents.{name}] transfer_allowed contains {dest:?}, which is not an E.164 \
                     number or prefix (+ then 1 to 15 digits, e.g. +1555 or +15550001234)"
                ),
            );
        }
    }
    if agent.vad_engine == VadEngineName::Silero && !cfg!(feature = "silero") {
        c.fail(
            &["agents", name, "vad_engine"],
            format!(
                "[agents.{name}] vad_engine = \"silero\" needs a patterd built with the cargo \
                 feature `silero` (cargo build --release --features silero); use \"earshot\" \
                 or rebuild"
            ),
        );
    }
    let vad = agent.vad_threshold;
    if !(vad.is_finite() && vad > 0.0 && vad < 1.0) {
        c.fail(
            &["agents", name, "vad_threshold"],
            format!("[agents.{name}] vad_threshold = {vad} must be between 0 and 1, e.g. 0.5"),
        );
    }
    if let Some(country) = &agent.phone_country
        && !crate::util::phone::known_country(country)
    {
        c.fail(
            &["agents", name, "phone_country"],
            format!(
                "[agents.{name}] phone_country = \"{country}\" is not one patterd knows the \
                 phone numbers of; use one of US, CA, GB, IE, AU, NZ, DE, FR, ES, IT, NL, IN, or \
                 leave it out (NANP)"
            ),
        );
    }
    if let Some(n) = agent
        .expected_number_lengths
        .iter()
        .find(|n| !(1..=32).contains(*n))
    {
        c.fail(
            &["agents", name, "expected_number_lengths"],
            format!(
                "[agents.{name}] expected_number_lengths has {n}: each length must be 1-32 digits"
            ),
        );
    }
    let (min, max) = (agent.min_endpointing_ms, agent.max_endpointing_ms);
    if max < min || max > 30_000 {
        c.fail(
            &["agents", name, "max_endpointing_ms"],
            format!(
                "[agents.{name}] max_endpointing_ms = {max} must be at least min_endpointing_ms \
                 ({min}) and at most 30000"
            ),
        );
    }
    for (key, value, lo, hi) in [
        ("vad_stop_ms", agent.vad_stop_ms, 32, 2000),
        ("min_endpointing_ms", min, 0, 10_000),
        ("unfinished_hold_ms", agent.unfinished_hold_ms, 0, 30_000),
        ("stt_eou_override_ms", agent.stt_eou_override_ms, 0, 30_000),
        (
            "barge_in_min_speech_ms",
            agent.barge_in_min_speech_ms,
            32,
            3000,
        ),
        ("barge_in_hold_ms", agent.barge_in_hold_ms, 0, 3000),
        (
            "barge_in_confirm_ms",
            agent.barge_in_confirm_ms,
            100,
            10_000,
        ),
        ("hold_max_ms", agent.hold_max_ms, 200, 10_000),
        ("barge_in_min_words", agent.barge_in_min_words, 1, 20),
        ("idle_max_nudges", agent.idle_max_nudges, 0, 20),
        (
            "dtmf_inter_digit_ms",
            agent.dtmf_inter_digit_ms,
            100,
            10_000,
        ),
        ("dtmf_max_digits", agent.dtmf_max_digits, 1, 64),
        ("dtmf_max_per_s", agent.dtmf_max_per_s, 1, 50),
        ("max_history_turns", agent.max_history_turns, 1, 1000),
        (
            "max_history_bytes",
            agent.max_history_bytes,
            1024,
            16 * 1024 * 1024,
        ),
    ] {
        if !(lo..=hi).contains(&value) {
            c.fail(
                &["agents", name, key],
                format!("[agents.{name}] {key} = {value} must be between {lo} and {hi}"),
            );
        }
    }
    if agent.backchannel_words.iter().any(|w| w.trim().is_empty()) {
        c.fail(
            &["agents", name, "backchannel_words"],
            format!(
                "[agents.{name}] backchannel_words has an empty entry; list words such as \
                 [\"mm-hmm\", \"yeah\"]"
            ),
        );
    }
    let idle = agent.idle_nudge_after_s;
    if !idle.is_finite() || idle < 0.0 {
        c.fail(
            &["agents", name, "idle_nudge_after_s"],
            format!("[agents.{name}] idle_nudge_after_s = {idle} must be 0 (off) or more seconds"),
        );
    }
}

/// `[[numbers]]`: each number, its carrier and agent, its caller and destination lists.
fn numbers(c: &mut Check, config: &Config) {
    let loc = c.loc;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, number) in config.numbers.iter().enumerate() {
        let idx = i.to_string();
        let entry = format!("[[numbers]] entry {}", i + 1);
        if !is_e164(&number.number) {
            c.fail(
                &["numbers", &idx, "number"],
                format!(
                    "{entry} number = {:?} is not E.164: write + then the country code and \
                     number, 8 to 15 digits, e.g. +15550001234",
                    number.number
                ),
            );
        } else if let Some(first) = seen.insert(&number.number, i) {
            let first_at = loc
                .exact_line(&path(&["numbers", &first.to_string(), "number"]))
                .map(|l| format!(" (line {l})"))
                .unwrap_or_default();
            c.fail(
                &["numbers", &idx, "number"],
                format!(
                    "{entry} number {} is already configured by [[numbers]] entry {}{first_at}; \
                     each number may appear once",
                    number.number,
                    first + 1
                ),
            );
            // Keep pointing later duplicates at the first entry.
            seen.insert(&number.number, first);
        }
        c.reference(
            &["numbers", &idx, "carrier"],
            "carriers",
            &number.carrier,
            &config.carriers,
        );
        c.reference(
            &["numbers", &idx, "agent"],
            "agents",
            &number.agent,
            &config.agents,
        );
        for (j, caller) in number.allowed_callers.iter().enumerate() {
            if !is_e164(caller) {
                c.fail(
                    &["numbers", &idx, "allowed_callers", &j.to_string()],
                    format!(
                        "{entry} allowed_callers contains {caller:?}, which is not an E.164 \
                         number (e.g. +15550001234)"
                    ),
                );
            }
        }
        if number.sms
            && let Some(carrier) = config.carriers.get(&number.carrier)
            && let Some(why) = carrier.account().sms_problem()
        {
            c.fail(
                &["numbers", &idx, "sms"],
                format!(
                    "{entry} has sms = true, so its agent answers text messages through \
                     [carriers.{}] (kind {}), {why}; set sms = false or move the number to \
                     such an account",
                    number.carrier,
                    carrier.kind().as_str()
                ),
            );
        }
        if !number.allowed_destinations.is_empty()
            && let Some(carrier) = config.carriers.get(&number.carrier)
            && let Some(why) = carrier.outbound_problem()
        {
            c.fail(
                &["numbers", &idx, "allowed_destinations"],
                format!(
                    "{entry} may call out (allowed_destinations) through [carriers.{}], {why}",
                    number.carrier
                ),
            );
        }
        for (j, dest) in number.allowed_destinations.iter().enumerate() {
            if !is_e164_prefix(dest) {
                c.fail(
                    &["numbers", &idx, "allowed_destinations", &j.to_string()],
                    format!(
                        "{entry} allowed_destinations contains {dest:?}, which is not an E.164 \
                         number or prefix (+ then 1 to 15 digits, e.g. +1555 or +15550001234)"
                    ),
                );
            }
        }
    }
}

/// `[[server.api_tokens]]`: they need `api_token` (the operator's, from which phone links and
/// page cookies derive), a unique non-empty name, a token of their own that is long enough
/// on a daemon reachable from the network (a call token's shape is reserved).
fn api_tokens(c: &mut Check, server: &crate::config::ServerConfig) {
    if server.api_tokens.is_empty() {
        return;
    }
    if server.api_token.is_empty() {
        c.fail(
            &["server", "api_tokens"],
            "[[server.api_tokens]] needs [server] api_token as well (the operator token, from              which phone links and page cookies derive); set api_token =              \"${PATTERD_API_TOKEN}\""
                .to_string(),
        );
    }
    let mut names = std::collections::BTreeSet::new();
    let mut seen = vec![server.api_token.expose().trim().to_string()];
    for (i, t) in server.api_tokens.iter().enumerate() {
        let at = format!("[[server.api_tokens]] #{} ({:?})", i + 1, t.name);
        if t.name.trim().is_empty() || !names.insert(t.name.trim().to_string()) {
            c.fail(
                &["server", "api_tokens"],
                format!(
                    "{at}: every entry needs a name of its own (it names the holder in the logs)"
                ),
            );
        }
        let value = t.token.expose().trim();
        let chars = value.chars().count();
        if t.token.is_empty() {
            c.fail(
                &["server", "api_tokens"],
                format!("{at}: token is empty; set token = \"${{SOME_VARIABLE}}\""),
            );
        } else if chars < MIN_API_TOKEN_CHARS && !server.api_is_local() {
            c.fail(
                &["server", "api_tokens"],
                format!(
                    "{at}: token has {chars} characters; a token of an API reachable from the \
                     network needs at least {MIN_API_TOKEN_CHARS} (`openssl rand -hex 32`)"
                ),
            );
        } else if value.starts_with(crate::util::secret::CALL_TOKEN_PREFIX) {
            c.fail(
                &["server", "api_tokens"],
                format!(
                    "{at}: tokens starting with `pdc1.` are patterd's call tokens; pick another"
                ),
            );
        } else if seen.iter().any(|s| s == value) {
            c.fail(
                &["server", "api_tokens"],
                format!("{at}: this token is already api_token or another entry's; every token must differ"),
            );
        }
        seen.push(value.to_string());
    }
}

/// The shortest `server.api_token` accepted when the API is reachable from the network (a
/// shorter one on a loopback-only daemon is a warning).
pub const MIN_API_TOKEN_CHARS: usize = 32;

/// One line per carrier or provider that is present but lacks its credentials, and per weak
/// secret the configuration still accepts.
pub(crate) fn warnings(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let token_chars = config.server.api_token.expose().trim().chars().count();
    if !config.server.api_token.is_empty() && token_chars < MIN_API_TOKEN_CHARS {
        out.push(format!(
            "server.api_token has only {token_chars} characters: accepted because listen and \
             public_url are loopback, but a daemon reachable from the network refuses a token \
             under {MIN_API_TOKEN_CHARS} (generate one with `openssl rand -hex 32`)"
        ));
    }
    for (name, carrier) in &config.carriers {
        let missing = carrier.missing_credentials();
        if !missing.is_empty() {
            out.push(format!(
                "carriers.{name} is unconfigured ({} empty): its routes answer 503 until configured",
                missing.join(", ")
            ));
        }
    }
    for (name, llm) in &config.llm {
        if llm.api_key.is_empty() && llm.preset.is_none() {
            out.push(format!(
                "llm.{name} is unconfigured (api_key empty): requests to {} carry no bearer \
                 token and will be refused if the server requires one",
                llm.effective_base_url()
            ));
        }
    }
    for (name, llm) in &config.llm {
        if llm.session_key_from.is_some() && llm.session_key_secret.is_empty() {
            out.push(format!(
                "llm.{name} has session_key_from = \"caller_hash\" but no session_key_secret: \
                 no per-caller memory key is sent until one is set (e.g. \
                 session_key_secret = \"${{PATTERD_MEMORY_SECRET}}\" from `openssl rand -hex 32`)"
            ));
        }
    }
    for (name, stt) in &config.stt {
        if stt.api_key.is_empty() && !stt.kind.key_optional() {
            out.push(format!(
                "stt.{name} is unconfigured (api_key empty): calls to agents using it fail until configured"
            ));
        }
        let model = stt.model_path.trim();
        if stt.kind == crate::config::schema::SttKind::Whisper
            && !model.is_empty()
            && !std::path::Path::new(model).is_file()
        {
            out.push(format!(
                "stt.{name} model_path = {model:?} is not a file here: patterd will not start \
                 until it is (scripts/setup/whisper.sh makes it)"
            ));
        }
    }
    for (name, tts) in &config.tts {
        if tts.api_key.is_empty() && tts.kind.needs_key() {
            out.push(format!(
                "tts.{name} is unconfigured (api_key empty): calls to agents using it fail until configured"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels() {
        assert!(check_log_level("info").is_ok());
        assert!(check_log_level("DEBUG").is_ok());
        assert!(check_log_level("patterd=debug,hyper=warn").is_ok());
        assert!(check_log_level("").is_err());
        let e = check_log_level("infoo").unwrap_err();
        assert!(e.contains("did you mean `info`"), "{e}");
        assert!(check_log_level("patterd=loud").is_err());
    }
}
