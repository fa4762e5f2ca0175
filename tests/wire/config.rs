//! Integration tests for configuration loading: every error message is checked for what the
//! user needs (file, line, key, suggestion, variable name); environments are injected, never
//! taken from the process.

use patterd::config::{self, ConfigError, LoadedConfig};

const ORIGIN: &str = "patter.toml";

/// A small valid configuration; tests append to it or replace parts.
const BASE: &str = r#"[server]
listen = "127.0.0.1:8080"
public_url = "https://voice.example.com"
api_token = "wire-test-api-token-0123456789abcdef"

[llm.hermes]
kind = "hermes"
api_key = "k"

[stt.deepgram]
kind = "deepgram"
api_key = "k"

[tts.elevenlabs]
kind = "elevenlabs"
api_key = "k"

[carriers.twilio]
kind = "twilio"
account_sid = "AC123"
auth_token = "tok"

[agents.front-desk]
llm = "hermes"
stt = "deepgram"
tts = "elevenlabs"

[[numbers]]
number = "+15550001234"
carrier = "twilio"
agent = "front-desk"
"#;

fn load(text: &str) -> Result<LoadedConfig, ConfigError> {
    config::load_str_with_vars(text, ORIGIN, &[])
}

fn load_err(text: &str) -> String {
    match load(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn load_err_env(text: &str, vars: &[(&str, &str)]) -> String {
    match config::load_str_with_vars(text, ORIGIN, vars) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{needle:?} not in text"))
}

#[test]
fn base_loads_without_warnings() {
    let loaded = load(BASE).expect("base config loads");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.config.number("+15550001234").is_some());
    assert!(loaded.config.agent("front-desk").is_some());
}

#[test]
fn unknown_key_suggests_nearest_with_line() {
    let text = "[server]\nlisen = \"127.0.0.1:8080\"\n";
    let err = load_err(text);
    assert_eq!(
        err,
        "patter.toml:2: unknown key `lisen` in [server]; did you mean `listen`?"
    );
}

#[test]
fn unknown_key_in_agent_table() {
    let text = BASE.replace(
        "tts = \"elevenlabs\"\n",
        "tts = \"elevenlabs\"\nfirst_mesage = \"hi\"\n",
    );
    let err = load_err(&text);
    let line = line_of(&text, "first_mesage");
    assert!(
        err.contains(&format!(
            "patter.toml:{line}: unknown key `first_mesage` in [agents.front-desk]"
        )),
        "{err}"
    );
    assert!(err.contains("did you mean `first_message`?"), "{err}");
}

#[test]
fn unknown_key_in_numbers_entry() {
    let text = format!(
        "{BASE}\n[[numbers]]\nnumber = \"+15550009999\"\ncarrier = \"twilio\"\nagnet = \"front-desk\"\n"
    );
    let err = load_err(&text);
    let line = line_of(&text, "agnet");
    assert!(
        err.contains(&format!(
            "patter.toml:{line}: unknown key `agnet` in [[numbers]] entry 2"
        )),
        "{err}"
    );
    assert!(err.contains("did you mean `agent`?"), "{err}");
}

#[test]
fn unknown_key_in_nested_tls_table() {
    let text = BASE.replace(
        "[llm.hermes]",
        "[server.tls]\ncert = \"c.pem\"\nkye = \"k.pem\"\n\n[llm.hermes]",
    );
    let err = load_err(&text);
    let line = line_of(&text, "kye");
    assert!(
        err.contains(&format!(
            "patter.toml:{line}: unknown key `kye` in [server.tls]; did you mean `key`?"
        )),
        "{err}"
    );
}

#[test]
fn unknown_section_at_top_level() {
    let text = format!("{BASE}\n[sever]\nx = 1\n");
    let err = load_err(&text);
    let line = line_of(&text, "[sever]");
    assert!(
        err.contains(&format!(
            "patter.toml:{line}: unknown key `sever` at the top level; did you mean `server`?"
        )),
        "{err}"
    );
}

#[test]
fn invalid_enum_value_lists_allowed_values() {
    let text = BASE.replace("kind = \"hermes\"", "kind = \"hermez\"");
    let err = load_err(&text);
    let line = line_of(&text, "hermez");
    assert!(
        err.starts_with(&format!("patter.toml:{line}: [llm.hermes] kind")),
        "{err}"
    );
    assert!(err.contains("`openai_compatible`"), "{err}");
    assert!(err.contains("did you mean `hermes`?"), "{err}");
}

#[test]
fn wrong_type_names_key_and_line() {
    let text = BASE.replace(
        "public_url = \"https://voice.example.com\"",
        "public_url = \"https://voice.example.com\"\nmax_calls = \"lots\"",
    );
    let err = load_err(&text);
    let line = line_of(&text, "max_calls");
    assert!(
        err.starts_with(&format!("patter.toml:{line}: [server] max_calls: expected")),
        "{err}"
    );
    assert!(err.contains("\"lots\""), "{err}");
}

#[test]
fn missing_required_key_points_at_table_header() {
    let text = BASE.replace("stt = \"deepgram\"\n", "");
    let err = load_err(&text);
    let line = line_of(&text, "[agents.front-desk]");
    assert_eq!(
        err,
        format!("patter.toml:{line}: [agents.front-desk] is missing the required key `stt`")
    );
}

#[test]
fn syntax_error_has_line_and_column() {
    let text = "[server]\nlisten = \"127.0.0.1:8080\n";
    let err = load_err(text);
    assert!(err.starts_with("patter.toml:2:"), "{err}");
    assert!(err.contains("TOML syntax error"), "{err}");
}

#[test]
fn missing_variable_names_variable_key_and_line() {
    let text = BASE.replace(
        "api_key = \"k\"\n\n[stt",
        "api_key = \"${API_SERVER_KEY}\"\n\n[stt",
    );
    let err = load_err(&text);
    let line = line_of(&text, "API_SERVER_KEY");
    assert_eq!(
        err,
        format!(
            "patter.toml:{line}: [llm.hermes] api_key needs environment variable \
             API_SERVER_KEY, which is not set (use ${{API_SERVER_KEY:-}} to make it optional)"
        )
    );
}

#[test]
fn variable_default_is_used_when_unset() {
    let text = BASE.replace(
        "public_url = \"https://voice.example.com\"",
        "public_url = \"${PUBLIC:-https://default.example.com}\"\ndata_dir = \"${DIR:-}x\"",
    );
    let loaded = load(&text).expect("loads");
    assert_eq!(
        loaded.config.server.public_url,
        "https://default.example.com"
    );
    assert_eq!(loaded.config.server.data_dir.to_str(), Some("x"));
}

#[test]
fn variable_present_is_substituted() {
    let text = BASE
        .replace(
            "api_key = \"k\"\n\n[stt",
            "api_key = \"${API_SERVER_KEY}\"\n\n[stt",
        )
        .replace(
            "public_url = \"https://voice.example.com\"",
            "public_url = \"https://${HOST:-nowhere.example}/voice\"",
        );
    let loaded = config::load_str_with_vars(
        &text,
        ORIGIN,
        &[("API_SERVER_KEY", "s3cret"), ("HOST", "v.example.org")],
    )
    .expect("loads");
    assert_eq!(loaded.config.llm["hermes"].api_key.expose(), "s3cret");
    assert_eq!(
        loaded.config.server.public_url,
        "https://v.example.org/voice"
    );
}

#[test]
fn substitution_only_through_injected_lookup() {
    let text = BASE.replace(
        "api_key = \"k\"\n\n[stt",
        "api_key = \"${ONLY_HERE}\"\n\n[stt",
    );
    let env = |k: &str| (k == "ONLY_HERE").then(|| "v".to_string());
    let loaded = config::load_str(&text, ORIGIN, &env).expect("loads");
    assert_eq!(loaded.config.llm["hermes"].api_key.expose(), "v");
}

#[test]
fn env_override_applies_and_wins_over_file() {
    let text = BASE.to_string();
    let loaded = config::load_str_with_vars(
        &text,
        ORIGIN,
        &[
            ("PATTERD_SERVER__LISTEN", "0.0.0.0:9000"),
            ("PATTERD_LOG__LEVEL", "debug"),
            ("PATTERD_SERVER__MAX_CALLS", "7"),
            ("PATTERD_LLM__HERMES__MODEL", "other"),
            ("PATTERD_API_TOKEN", "not-an-override"),
        ],
    )
    .expect("loads");
    assert_eq!(loaded.config.server.listen, "0.0.0.0:9000");
    assert_eq!(loaded.config.log.level, "debug");
    assert_eq!(loaded.config.server.max_calls, 7);
    assert_eq!(loaded.config.llm["hermes"].model, "other");
}

#[test]
fn env_override_error_names_the_variable() {
    let err = load_err_env(BASE, &[("PATTERD_SERVER__MAX_CALLS", "lots")]);
    assert!(
        err.starts_with("environment variable PATTERD_SERVER__MAX_CALLS: [server] max_calls"),
        "{err}"
    );
    let err = load_err_env(BASE, &[("PATTERD_SERVER__MAX_CALLS", "0")]);
    assert!(
        err.contains("PATTERD_SERVER__MAX_CALLS") && err.contains("at least 1"),
        "{err}"
    );
    let err = load_err_env(BASE, &[("PATTERD_SERVER__LISEN", "x")]);
    assert!(
        err.contains("PATTERD_SERVER__LISEN") && err.contains("did you mean `listen`?"),
        "{err}"
    );
}

#[test]
fn agent_naming_undefined_stt_is_reported() {
    let text = BASE.replace("stt = \"deepgram\"", "stt = \"whisper\"");
    let err = load_err(&text);
    let line = line_of(&text, "whisper");
    assert!(
        err.starts_with(&format!(
            "patter.toml:{line}: [agents.front-desk] stt = \"whisper\""
        )),
        "{err}"
    );
    assert!(err.contains("defined stt: deepgram"), "{err}");
}

#[test]
fn number_not_e164_is_named() {
    let text = BASE.replace("\"+15550001234\"", "\"555-1234\"");
    let err = load_err(&text);
    let line = line_of(&text, "555-1234");
    assert!(
        err.starts_with(&format!(
            "patter.toml:{line}: [[numbers]] entry 1 number = \"555-1234\" is not E.164"
        )),
        "{err}"
    );
}

#[test]
fn allowed_callers_and_destinations_are_validated() {
    let text = BASE.replace(
        "agent = \"front-desk\"\n",
        "agent = \"front-desk\"\nallowed_callers = [\"+15550002222\", \"5550003333\"]\nallowed_destinations = [\"+1555\", \"1800\"]\n",
    );
    let err = load_err(&text);
    let callers = line_of(&text, "allowed_callers");
    let dests = line_of(&text, "allowed_destinations");
    assert!(
        err.contains(&format!(
            "patter.toml:{callers}: [[numbers]] entry 1 allowed_callers contains \"5550003333\""
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "patter.toml:{dests}: [[numbers]] entry 1 allowed_destinations contains \"1800\""
        )),
        "{err}"
    );
    assert!(
        !err.contains("+1555\""),
        "a prefix is a valid destination: {err}"
    );
}

#[test]
fn telnyx_outbound_needs_a_connection_id() {
    let text = format!(
        "{BASE}\n[carriers.tx]\nkind = \"telnyx\"\napi_key = \"k\"\npublic_key = \"p\"\n\n\
         [[numbers]]\nnumber = \"+15550002000\"\ncarrier = \"tx\"\nagent = \"front-desk\"\n\
         allowed_destinations = [\"+1555\"]\n"
    );
    let err = load_err(&text);
    let line = line_of(&text, "allowed_destinations = [\"+1555\"]");
    assert!(
        err.contains(&format!(
            "patter.toml:{line}: [[numbers]] entry 2 may call out (allowed_destinations) through \
             [carriers.tx], which has no connection_id"
        )),
        "{err}"
    );
    let ok = text.replace(
        "public_key = \"p\"\n",
        "public_key = \"p\"\nconnection_id = \"123\"\n",
    );
    if let Err(e) = load(&ok) {
        assert!(!e.to_string().contains("connection_id"), "{e}");
    }
}

#[test]
fn sms_needs_a_carrier_that_can_text() {
    let text = format!(
        "{BASE}\n[carriers.web]\nkind = \"web\"\n\n\
         [[numbers]]\nnumber = \"+15550002000\"\ncarrier = \"web\"\nagent = \"front-desk\"\n\
         sms = true\n"
    );
    let err = load_err(&text);
    let line = line_of(&text, "sms = true");
    assert!(
        err.contains(&format!(
            "patter.toml:{line}: [[numbers]] entry 2 has sms = true, so its agent answers text \
             messages through [carriers.web] (kind web), whose kind cannot send text messages"
        )),
        "{err}"
    );
    // The same number on the Twilio account loads.
    let ok = text.replace("carrier = \"web\"", "carrier = \"twilio\"");
    load(&ok).expect("sms on a twilio number loads");
    let too_long = format!("{BASE}\n[outbound]\nmax_sms_chars = 1601\n");
    let err = load_err(&too_long);
    assert!(
        err.contains("[outbound] max_sms_chars = 1601 must be 1 to 1600"),
        "{err}"
    );
}

#[test]
fn duplicate_numbers_are_reported() {
    let text = format!(
        "{BASE}\n[[numbers]]\nnumber = \"+15550001234\"\ncarrier = \"twilio\"\nagent = \"front-desk\"\n"
    );
    let err = load_err(&text);
    let first = line_of(&text, "+15550001234");
    let second = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("+15550001234"))
        .map(|(i, _)| i + 1)
        .nth(1)
        .expect("two lines");
    assert!(err.starts_with(&format!("patter.toml:{second}: [[numbers]] entry 2 number +15550001234 is already configured by [[numbers]] entry 1 (line {first})")), "{err}");
}

#[test]
fn number_naming_undefined_carrier() {
    let text = BASE.replace("carrier = \"twilio\"", "carrier = \"telnyx\"");
    let err = load_err(&text);
    let line = line_of(&text, "carrier = \"telnyx\"");
    assert!(err.starts_with(&format!("patter.toml:{line}: [[numbers]] entry 1 carrier = \"telnyx\" names no [carriers.telnyx] section")), "{err}");
    assert!(err.contains("defined carriers: twilio"), "{err}");
}

#[test]
fn non_loopback_listen_needs_api_token() {
    let text = BASE
        .replace("127.0.0.1:8080", "0.0.0.0:8080")
        .replace("api_token = \"wire-test-api-token-0123456789abcdef\"\n", "");
    let err = load_err(&text);
    assert!(
        err.starts_with("patter.toml:2: [server] listen = \"0.0.0.0:8080\""),
        "{err}"
    );
    assert!(err.contains("api_token"), "{err}");
    // With a token it loads.
    let ok = text.replace(
        "listen = \"0.0.0.0:8080\"",
        "listen = \"0.0.0.0:8080\"\napi_token = \"${TOKEN}\"",
    );
    let token = ("TOKEN", "abc0123456789abcdef0123456789abcdef");
    config::load_str_with_vars(&ok, ORIGIN, &[token]).expect("loads with a token");
}

/// The README's deployment: loopback `listen` behind a reverse proxy, public `public_url`.
/// Without a token the proxy would forward anyone to /v1 and /mcp: refused at load.
#[test]
fn exposed_public_url_needs_api_token() {
    let text = BASE.replace("api_token = \"wire-test-api-token-0123456789abcdef\"\n", "");
    let err = load_err(&text);
    assert_eq!(
        err,
        "patter.toml:3: [server] api_token is empty but public_url = \"https://voice.example.com\" \
         is not a loopback address: behind a reverse proxy (listen = \"127.0.0.1:8080\") /v1 and \
         /mcp would be open to anyone who can reach \"https://voice.example.com\"; set \
         server.api_token = \"${PATTERD_API_TOKEN}\" (and send `Authorization: Bearer <token>`), \
         or use a loopback public_url for local development"
    );
    // Both loopback: local development runs without a token.
    let local = text.replace("https://voice.example.com", "http://127.0.0.1:8080");
    load(&local).expect("loopback listen and public_url load without a token");
    let local = text.replace("https://voice.example.com", "http://localhost:8080");
    load(&local).expect("localhost public_url loads without a token");
    // A token fixes it.
    load(BASE).expect("loads with a token");
}

#[test]
fn listen_must_be_a_socket_address() {
    let text = BASE.replace("127.0.0.1:8080", "localhost");
    let err = load_err(&text);
    assert!(
        err.starts_with("patter.toml:2: [server] listen = \"localhost\" is not a socket address"),
        "{err}"
    );
}

#[test]
fn bad_public_url_is_reported() {
    let text = BASE.replace("https://voice.example.com", "voice.example.com");
    let err = load_err(&text);
    assert!(err.starts_with("patter.toml:3: [server] public_url = \"voice.example.com\" is not an absolute http/https URL"), "{err}");
    let text = BASE.replace("https://voice.example.com", "ftp://voice.example.com");
    assert!(load_err(&text).contains("public_url"));
}

#[test]
fn a_short_api_token_is_refused_when_reachable_and_a_warning_on_loopback() {
    let text = BASE.replace("wire-test-api-token-0123456789abcdef", "short-token");
    let err = load_err(&text);
    assert!(err.contains("api_token has 11 characters"), "{err}");
    assert!(err.contains("openssl rand -hex 32"), "{err}");
    assert!(!err.contains("short-token"), "the token is printed: {err}");
    let local = text.replace("https://voice.example.com", "http://127.0.0.1:8080");
    let loaded = load(&local).expect("a short token on loopback loads");
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.starts_with("server.api_token has only 11 characters")),
        "{:?}",
        loaded.warnings
    );
}

#[test]
fn a_short_session_key_secret_is_refused() {
    let text = BASE.replace(
        "api_key = \"k\"\n\n[stt",
        "api_key = \"k\"\nsession_key_from = \"caller_hash\"\nsession_key_secret = \"short\"\n\n[stt",
    );
    assert_ne!(text, BASE);
    let err = load_err(&text);
    assert!(
        err.contains("session_key_secret is shorter than 32"),
        "{err}"
    );
}

#[test]
fn several_errors_are_reported_together() {
    let text = BASE
        .replace("127.0.0.1:8080", "0.0.0.0:8080")
        .replace("api_token = \"wire-test-api-token-0123456789abcdef\"\n", "")
        .replace("https://voice.example.com", "nope")
        .replace("stt = \"deepgram\"", "stt = \"whisper\"")
        .replace("\"+15550001234\"", "\"555-1234\"")
        .replace(
            "api_key = \"k\"\n\n[stt",
            "api_key = \"k\"\nsession_key = \"a\"\nsession_key_from = \"caller_hash\"\n\n[stt",
        )
        + "\n[log]\nlevel = \"loud\"\n";
    let err = load_err(&text);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 6, "{err}");
    for needle in [
        "listen",
        "public_url",
        "whisper",
        "555-1234",
        "session_key",
        "[log] level",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(needle)),
            "{needle} missing in {err}"
        );
    }
    assert!(lines.iter().all(|l| l.starts_with("patter.toml:")), "{err}");
    let log_line = line_of(&text, "loud");
    assert!(
        err.contains(&format!("patter.toml:{log_line}: [log] level = \"loud\"")),
        "{err}"
    );
}

#[test]
fn max_calls_zero_is_an_error() {
    let text = BASE.replace(
        "public_url = \"https://voice.example.com\"",
        "public_url = \"https://voice.example.com\"\nmax_calls = 0",
    );
    let err = load_err(&text);
    assert_eq!(err, "patter.toml:4: [server] max_calls must be at least 1");
}

#[test]
fn unconfigured_carrier_is_a_warning() {
    let text = BASE.replace(
        "account_sid = \"AC123\"\nauth_token = \"tok\"\n",
        "account_sid = \"${SID:-}\"\n",
    );
    let loaded = load(&text).expect("loads");
    assert_eq!(
        loaded.warnings,
        vec![
            "carriers.twilio is unconfigured (account_sid, auth_token empty): its routes answer 503 until configured"
                .to_string()
        ]
    );
}

#[test]
fn empty_provider_keys_warn() {
    let text = BASE.replace("api_key = \"k\"\n", "");
    let loaded = load(&text).expect("loads");
    assert_eq!(loaded.warnings.len(), 3, "{:?}", loaded.warnings);
    for prefix in ["llm.hermes", "stt.deepgram", "tts.elevenlabs"] {
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.starts_with(prefix) && w.contains("api_key")),
            "{prefix}: {:?}",
            loaded.warnings
        );
    }
}

#[test]
fn render_effective_redacts_secrets() {
    let secrets = [
        ("API_KEY", "sk-live-9f8e7d6c5b4a3210"),
        ("SID", "AC0123456789abcdef0123456789abcdef"),
        ("TOKEN", "b6d1f0e3c2a94758aa11bb22cc33dd44"),
        ("API_TOKEN", "ptd_4f5e6d7c8b9a0f1e2d3c4b5a69788796"),
    ];
    let text = BASE
        .replace("api_key = \"k\"", "api_key = \"${API_KEY}\"")
        .replace("account_sid = \"AC123\"", "account_sid = \"${SID}\"")
        .replace("auth_token = \"tok\"", "auth_token = \"${TOKEN}\"")
        .replace(
            "api_token = \"wire-test-api-token-0123456789abcdef\"",
            "api_token = \"${API_TOKEN}\"",
        );
    let loaded = config::load_str_with_vars(&text, ORIGIN, &secrets).expect("loads");
    assert_eq!(
        loaded.config.server.api_token.expose(),
        "ptd_4f5e6d7c8b9a0f1e2d3c4b5a69788796"
    );
    let out = config::render_effective(&loaded.config);
    for (_, secret) in secrets {
        assert!(!out.contains(secret), "secret {secret} leaked:\n{out}");
    }
    assert!(out.contains("api_key = \"***\""), "{out}");
    assert!(out.contains("api_token = \"***\""), "{out}");
    assert!(out.contains("listen = \"127.0.0.1:8080\""), "{out}");
    // The rendering is itself a loadable configuration once the redacted api_token (`***`,
    // too short for an API reachable from the network) is given a real one again.
    let out = out.replace(
        "api_token = \"***\"",
        &format!("api_token = \"{}\"", "x".repeat(32)),
    );
    let reloaded = load(&out).expect("rendered config loads");
    assert_eq!(reloaded.config.numbers.len(), 1);
}

/// The container image (deploy/Dockerfile) runs the example with `PATTERD_SERVER__LISTEN=
/// 0.0.0.0:8080`: without `PATTERD_API_TOKEN` it refuses in one line that names the variable to
/// set; with it, it loads.
#[test]
fn container_defaults_need_the_api_token_variable() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/patter.toml");
    let text = std::fs::read_to_string(path).expect("config/patter.toml exists");
    let image_env = [
        ("PATTERD_SERVER__LISTEN", "0.0.0.0:8080"),
        ("PATTERD_DATA_DIR", "/var/lib/patterd"),
    ];
    let err = match config::load_str_with_vars(&text, "/etc/patterd/patter.toml", &image_env) {
        Ok(_) => panic!("the image's defaults must refuse to start without a token"),
        Err(e) => e.to_string(),
    };
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("set the environment variable PATTERD_API_TOKEN"),
        "{err}"
    );
    let secret = "s3cret-0123456789abcdef0123456789ab";
    let with_token = [image_env[0], image_env[1], ("PATTERD_API_TOKEN", secret)];
    let loaded = config::load_str_with_vars(&text, "/etc/patterd/patter.toml", &with_token)
        .unwrap_or_else(|e| panic!("loads with the token: {e}"));
    assert_eq!(loaded.config.server.listen, "0.0.0.0:8080");
    assert_eq!(loaded.config.server.api_token.expose(), secret);
}

#[test]
fn shipped_example_loads_with_empty_environment() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/patter.toml");
    let text = std::fs::read_to_string(path).expect("config/patter.toml exists");
    let loaded = config::load_str_with_vars(&text, "config/patter.toml", &[])
        .unwrap_or_else(|e| panic!("example must load:\n{e}"));
    let c = &loaded.config;
    assert_eq!(c.server.listen, "127.0.0.1:8080");
    assert!(c.llm.contains_key("hermes"));
    assert!(c.stt.contains_key("deepgram"));
    assert!(c.tts.contains_key("elevenlabs"));
    for carrier in ["twilio", "telnyx", "plivo"] {
        assert!(c.carriers.contains_key(carrier), "{carrier}");
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.starts_with(&format!("carriers.{carrier} is unconfigured"))),
            "{:?}",
            loaded.warnings
        );
    }
    assert!(c.agent("front-desk").is_some());
    assert_eq!(c.numbers.len(), 1);
    assert_eq!(c.numbers[0].carrier, "twilio");
    assert_eq!(c.server.data_dir.to_str(), Some("./data"));
    // Only warnings: 3 carriers + llm hermes and openclaw + hermes' caller_hash without its
    // session_key_secret + the two Deepgram stt examples, AssemblyAI and OpenAI Realtime + 3
    // tts (elevenlabs, openai, cartesia); the self-hosted `openai_compatible` stt, the
    // `ollama` preset and kokoro need no key.
    assert_eq!(loaded.warnings.len(), 13, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings.iter().any(
            |w| w.starts_with("llm.hermes has session_key_from") && w.contains("no per-caller")
        ),
        "{:?}",
        loaded.warnings
    );
    assert_eq!(c.stt["assemblyai"].kind, config::SttKind::Assemblyai);
    assert_eq!(
        c.stt["openai_realtime"].kind,
        config::SttKind::OpenaiRealtime
    );
    // The example agent listens through an STT chain.
    assert_eq!(
        c.agent("front-desk").map(|a| a.stt.names()),
        Some(vec!["deepgram".to_string(), "assemblyai".to_string()])
    );
    assert_eq!(
        c.agent("front-desk").map(|a| a.tts.names().to_vec()),
        Some(vec!["elevenlabs".to_string(), "kokoro".to_string()])
    );
    assert_eq!(c.tts["openai"].model, "gpt-4o-mini-tts");
    assert_eq!(c.tts["kokoro"].base_url, "http://127.0.0.1:8880/v1");
}

#[test]
fn number_lookup_normalizes() {
    let loaded = load(BASE).expect("loads");
    assert!(loaded.config.number("+1 555 000 1234").is_some());
    assert!(loaded.config.number("15550001234").is_some());
    assert!(loaded.config.number("+15550009999").is_none());
    let n = loaded.config.number("+15550001234").expect("number");
    assert!(n.allows_caller("+14155550100"));
    assert!(!n.allows_destination("+14155550100"));
}

#[test]
fn read_error_names_the_file() {
    let err = config::load(std::path::Path::new("/nonexistent/patter.toml"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with("/nonexistent/patter.toml: cannot read"),
        "{err}"
    );
}

/// BASE with `lines` added to `[agents.front-desk]`.
fn with_agent_lines(lines: &str) -> String {
    BASE.replace(
        "tts = \"elevenlabs\"\n\n[[numbers]]",
        &format!("tts = \"elevenlabs\"\n{lines}\n\n[[numbers]]"),
    )
}

#[test]
fn conversation_keys_out_of_range_name_the_key_and_line() {
    // (lines added to the agent, the key the error names, text the message contains)
    let cases: &[(&str, &str, &str)] = &[
        ("vad_threshold = 1.5", "vad_threshold", "between 0 and 1"),
        ("vad_threshold = 0.0", "vad_threshold", "between 0 and 1"),
        ("vad_stop_ms = 5", "vad_stop_ms", "between 32 and 2000"),
        (
            "min_endpointing_ms = 20000\nmax_endpointing_ms = 25000",
            "min_endpointing_ms",
            "between 0 and 10000",
        ),
        (
            "min_endpointing_ms = 800\nmax_endpointing_ms = 500",
            "max_endpointing_ms",
            "at least min_endpointing_ms (800)",
        ),
        (
            "max_endpointing_ms = 60000",
            "max_endpointing_ms",
            "at most 30000",
        ),
        (
            "stt_eou_override_ms = 40000",
            "stt_eou_override_ms",
            "between 0 and 30000",
        ),
        (
            "unfinished_hold_ms = 40000",
            "unfinished_hold_ms",
            "between 0 and 30000",
        ),
        (
            "barge_in_min_speech_ms = 10",
            "barge_in_min_speech_ms",
            "between 32 and 3000",
        ),
        (
            "barge_in_confirm_ms = 50",
            "barge_in_confirm_ms",
            "between 100 and 10000",
        ),
        (
            "barge_in_min_words = 0",
            "barge_in_min_words",
            "between 1 and 20",
        ),
        ("hold_max_ms = 50", "hold_max_ms", "between 200 and 10000"),
        (
            "phone_country = \"XX\"",
            "phone_country",
            "not one patterd knows",
        ),
        (
            "expected_number_lengths = [8, 0]",
            "expected_number_lengths",
            "1-32 digits",
        ),
        (
            "idle_nudge_after_s = -1.0",
            "idle_nudge_after_s",
            "0 (off) or more seconds",
        ),
        (
            "idle_max_nudges = 50",
            "idle_max_nudges",
            "between 0 and 20",
        ),
        (
            "backchannel_words = [\"mm-hmm\", \"  \"]",
            "backchannel_words",
            "empty",
        ),
    ];
    for (lines, key, message) in cases {
        let text = with_agent_lines(lines);
        let err = load_err(&text);
        let line = line_of(&text, &format!("{key} ="));
        assert!(
            err.starts_with(&format!("patter.toml:{line}: [agents.front-desk] {key}")),
            "{lines}: {err}"
        );
        assert!(err.contains(message), "{lines}: {err}");
    }
}

#[test]
fn conversation_keys_of_the_wrong_type_name_the_key_and_line() {
    let cases: &[(&str, &str)] = &[
        ("vad_threshold = \"high\"", "vad_threshold"),
        ("vad_stop_ms = -5", "vad_stop_ms"),
        ("min_endpointing_ms = 1.5", "min_endpointing_ms"),
        ("max_endpointing_ms = \"3s\"", "max_endpointing_ms"),
        ("barge_in = [true]", "barge_in"),
        (
            "greeting_interruptible = \"sometimes\"",
            "greeting_interruptible",
        ),
        ("barge_in_min_words = \"two\"", "barge_in_min_words"),
        ("backchannel_words = \"yeah\"", "backchannel_words"),
        ("idle_nudge_after_s = \"soon\"", "idle_nudge_after_s"),
        ("idle_nudge_message = 3", "idle_nudge_message"),
        ("idle_goodbye_message = [\"bye\"]", "idle_goodbye_message"),
    ];
    for (lines, key) in cases {
        let text = with_agent_lines(lines);
        let err = load_err(&text);
        let line = line_of(&text, &format!("{key} ="));
        assert!(
            err.starts_with(&format!("patter.toml:{line}: [agents.front-desk] {key}: ")),
            "{lines}: {err}"
        );
        assert!(err.contains("expected"), "{lines}: {err}");
    }
}

#[test]
fn conversation_keys_in_range_load() {
    let text = with_agent_lines(
        "vad_threshold = 0.7\nvad_stop_ms = 200\nmin_endpointing_ms = 250\n\
         max_endpointing_ms = 2500\nbarge_in = false\ngreeting_interruptible = false\n\
         barge_in_min_speech_ms = 150\nbarge_in_confirm_ms = 900\nbarge_in_min_words = 3\n\
         backchannel_words = [\"sure\"]\nidle_nudge_after_s = 0\nidle_max_nudges = 1\n\
         idle_nudge_message = \"Hello?\"\nidle_goodbye_message = \"Bye.\"\n\
         barge_in_echo_check = false",
    );
    let loaded = load(&text).expect("loads");
    let agent = loaded.config.agent("front-desk").expect("agent");
    assert!(!agent.barge_in && !agent.greeting_interruptible);
    assert!(!agent.barge_in_echo_check);
    let default = load(&with_agent_lines("")).expect("loads");
    assert!(
        default
            .config
            .agent("front-desk")
            .expect("agent")
            .barge_in_echo_check,
        "the echo check is on by default"
    );
    assert_eq!(agent.max_endpointing_ms, 2500);
    assert_eq!(agent.backchannel_words, vec!["sure".to_string()]);
}

/// BASE with `extra` lines in `[agents.front-desk]` and `tables` appended at the end.
fn with_tools(extra: &str, tables: &str) -> String {
    format!(
        "{}\n{tables}",
        BASE.replace(
            "tts = \"elevenlabs\"\n",
            &format!("tts = \"elevenlabs\"\n{extra}\n")
        )
    )
}

#[test]
fn tool_keys_load_when_valid() {
    let text = with_tools(
        "tools = [\"end_call\", \"send_dtmf\"]\nmax_tool_rounds = 3",
        "[agents.front-desk.consult]\nllm = \"hermes\"\n\n\
         [[agents.front-desk.webhook_tools]]\nname = \"lookup_order\"\ndescription = \"d\"\n\
         url = \"https://tools.example.com/lookup\"\n\
         parameters = { type = \"object\", properties = { order = { type = \"string\" } } }\n",
    );
    let loaded = load(&text).expect("loads");
    let agent = &loaded.config.agents["front-desk"];
    assert_eq!(agent.max_tool_rounds, 3);
    assert_eq!(
        agent.webhook_tools[0].parameters["properties"]["order"]["type"],
        "string"
    );
}

#[test]
fn unknown_builtin_tool_name_lists_the_built_ins() {
    let text = with_tools("tools = [\"end_call\", \"hang_up\"]", "");
    let err = load_err(&text);
    assert!(err.contains("hang_up"), "{err}");
    assert!(
        err.contains("end_call") && err.contains("transfer_call"),
        "{err}"
    );
    let line = line_of(&text, "hang_up");
    assert!(err.starts_with(&format!("patter.toml:{line}")), "{err}");
}

#[test]
fn bad_webhook_tool_schema_name_and_url_are_reported() {
    let text = with_tools(
        "",
        "[[agents.front-desk.webhook_tools]]\nname = \"look up\"\ndescription = \"d\"\n\
         url = \"http://169.254.169.254/latest\"\n\
         parameters = { type = \"object\", properties = { order = { type = \"strin\" } } }\n",
    );
    let err = load_err(&text);
    assert!(err.contains("name must be 1-64 letters"), "{err}");
    assert!(err.contains("not a valid JSON Schema"), "{err}");
    assert!(err.contains("link-local"), "{err}");
    let text = with_tools(
        "",
        "[[agents.front-desk.webhook_tools]]\nname = \"x\"\ndescription = \"d\"\n\
         url = \"https://tools.example.com/\"\nparameters = { type = \"array\" }\n",
    );
    assert!(load_err(&text).contains("type = \"object\""));
}

#[test]
fn consult_needs_one_target_and_a_known_llm_and_loopback_is_opt_in() {
    let both = with_tools(
        "",
        "[agents.front-desk.consult]\nllm = \"hermes\"\nurl = \"https://office.example.com\"\n",
    );
    assert!(load_err(&both).contains("exactly one of `url`"));
    let unknown = with_tools("", "[agents.front-desk.consult]\nllm = \"hermez\"\n");
    let err = load_err(&unknown);
    assert!(
        err.contains("names no [llm.hermez] section") && err.contains("hermes"),
        "{err}"
    );
    let local = with_tools(
        "",
        "[agents.front-desk.consult]\nurl = \"http://127.0.0.1:9000/consult\"\n",
    );
    let err = load_err(&local);
    assert!(
        err.contains("loopback") && err.contains("allow_loopback"),
        "{err}"
    );
    let allowed = with_tools(
        "",
        "[agents.front-desk.consult]\nurl = \"http://127.0.0.1:9000/consult\"\nallow_loopback = true\n",
    );
    load(&allowed).expect("loopback allowed when asked for");
}

#[test]
fn duplicate_tool_names_are_reported() {
    let text = with_tools(
        "tools = [\"end_call\"]",
        "[agents.front-desk.consult]\nllm = \"hermes\"\ntool_name = \"end_call\"\n",
    );
    assert!(load_err(&text).contains("two tools named `end_call`"));
}

/// The three examples of docs/agents.md load with an empty environment and have their tools.
#[test]
fn agent_examples_load_with_empty_environment() {
    for (file, agent) in [
        ("agent-hermes-voice.toml", "concierge"),
        ("agent-hermes-mcp.toml", "caller"),
        ("agent-consult.toml", "front-desk"),
    ] {
        let path = format!("{}/config/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("example exists");
        let loaded = config::load_str_with_vars(&text, &path, &[])
            .unwrap_or_else(|e| panic!("{file} must load:\n{e}"));
        let a = loaded.config.agent(agent).expect("agent");
        match file {
            "agent-hermes-voice.toml" => assert!(a.system_prompt.contains("{call_id}")),
            "agent-hermes-mcp.toml" => assert_eq!(a.tools.len(), 2),
            _ => {
                assert_eq!(
                    a.consult.as_ref().and_then(|c| c.llm.as_deref()),
                    Some("hermes")
                );
                assert_eq!(a.webhook_tools.len(), 1);
            }
        }
    }
}

#[test]
fn tts_chains_name_existing_sections_and_kinds_fill_their_own_defaults() {
    let chain = BASE.replace(
        "tts = \"elevenlabs\"",
        "tts = [\"elevenlabs\", \"local\"]\ntts_first_byte_timeout_ms = 800",
    ) + "\n[tts.local]\nkind = \"openai_compatible\"\n";
    let loaded = load(&chain).expect("a chain loads");
    let c = &loaded.config;
    let a = c.agent("front-desk").expect("agent");
    assert_eq!(
        a.tts.names(),
        ["elevenlabs".to_string(), "local".to_string()]
    );
    assert_eq!(a.tts_first_byte_timeout_ms, 800);
    assert_eq!(c.tts["local"].base_url, "http://127.0.0.1:8880/v1");
    assert_eq!(c.tts["local"].voice_id, "af_heart");
    assert_eq!(c.tts["elevenlabs"].model, "eleven_flash_v2_5");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);

    let typo = BASE.replace(
        "tts = \"elevenlabs\"",
        "tts = [\"elevenlabs\", \"elevenlab\"]",
    );
    let e = load_err(&typo);
    assert!(
        e.contains("names no [tts.elevenlab] section") && e.contains("did you mean `elevenlabs`"),
        "{e}"
    );
    let empty = BASE.replace("tts = \"elevenlabs\"", "tts = []");
    assert!(load_err(&empty).contains("name one or more"));
    let slow = BASE.replace(
        "tts = \"elevenlabs\"",
        "tts = \"elevenlabs\"\ntts_first_byte_timeout_ms = 50",
    );
    assert!(load_err(&slow).contains("tts_first_byte_timeout_ms = 50 is out of range"));
}

#[test]
fn brain_presets_and_openclaw_defaults() {
    let text = format!(
        "{BASE}\n[llm.local]\nkind = \"openai_compatible\"\npreset = \"ollama\"\nmodel = \"llama3.2\"\n\n\
         [llm.vllm]\nkind = \"openai_compatible\"\npreset = \"vllm\"\nmodel = \"Qwen/Qwen2.5-7B-Instruct\"\n\n\
         [llm.studio]\nkind = \"openai_compatible\"\npreset = \"lm_studio\"\nmodel = \"qwen2.5-7b-instruct\"\n\n\
         [llm.claw]\nkind = \"openclaw\"\napi_key = \"gw\"\n"
    );
    let loaded = load(&text).expect("presets load");
    let llm = |n: &str| loaded.config.llm[n].resolved();
    assert_eq!(llm("local").base_url, "http://127.0.0.1:11434/v1");
    assert_eq!(llm("vllm").base_url, "http://127.0.0.1:8000/v1");
    assert_eq!(llm("studio").base_url, "http://127.0.0.1:1234/v1");
    assert_eq!(llm("claw").base_url, "http://127.0.0.1:18789/v1");
    assert_eq!(llm("claw").model, "openclaw:main");
    assert_eq!(llm("hermes").base_url, "http://127.0.0.1:8642/v1");
    assert_eq!(llm("hermes").model, "hermes-agent");
    // A local preset needs no key: no warning for it.
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);

    let err = load_err(&format!(
        "{BASE}\n[llm.local]\nkind = \"openai_compatible\"\npreset = \"ollama\"\n"
    ));
    assert!(err.contains("[llm.local] needs a model"), "{err}");
    let err = load_err(&format!(
        "{BASE}\n[llm.x]\nkind = \"hermes\"\npreset = \"vllm\"\n"
    ));
    assert!(
        err.contains("preset is only for kind = \"openai_compatible\""),
        "{err}"
    );
    let err = load_err(&format!(
        "{BASE}\n[stt.flux]\nkind = \"deepgram_flux\"\napi_key = \"k\"\neot_threshold = 0.6\neager_eot_threshold = 0.8\n"
    ));
    assert!(
        err.contains("eager_eot_threshold = 0.8 must not exceed eot_threshold = 0.6"),
        "{err}"
    );
    let err = load_err(&format!("{BASE}\n[stt.w]\nkind = \"openai_compatible\"\n"));
    assert!(err.contains("[stt.w] needs a model"), "{err}");
}

/// `[pricing]` names configured entries and holds prices of 0 or more; a typo or a negative
/// price is an error naming the table and line.
#[test]
fn pricing_names_configured_entries_with_sane_prices() {
    let good = format!(
        "{BASE}\n[pricing.stt.deepgram]\nusd_per_minute = 0.0043\n[pricing.llm.hermes]\nusd_per_1m_input_tokens = 2.5\n"
    );
    let loaded = load(&good).expect("pricing loads");
    assert_eq!(loaded.config.pricing.stt["deepgram"].usd_per_minute, 0.0043);
    assert_eq!(
        loaded.config.pricing.llm["hermes"].usd_per_1m_output_tokens,
        0.0
    );

    let typo = format!("{BASE}\n[pricing.tts.elevenlab]\nusd_per_1k_characters = 0.18\n");
    let err = load_err(&typo);
    assert!(
        err.contains("[pricing.tts.elevenlab]") && err.contains("no [tts.elevenlab]"),
        "{err}"
    );
    assert!(
        err.contains(&format!(":{}", line_of(&typo, "[pricing.tts.elevenlab]"))),
        "{err}"
    );

    let negative = format!("{BASE}\n[pricing.carriers.twilio]\nusd_per_minute = -1.0\n");
    let err = load_err(&negative);
    assert!(err.contains("usd_per_minute = -1 must be a price"), "{err}");

    let unknown = format!("{BASE}\n[pricing.stt.deepgram]\nusd_per_second = 1.0\n");
    assert!(load_err(&unknown).contains("usd_per_second"));
}

#[test]
fn transfer_allowed_entries_must_be_e164_numbers_or_prefixes() {
    let text = with_agent_lines("transfer_allowed = [\"+1415555\", \"1900\", \"+1 415\"]");
    let err = load_err(&text);
    let line = line_of(&text, "transfer_allowed");
    for bad in ["\"1900\"", "\"+1 415\""] {
        assert!(
            err.contains(&format!(
                "patter.toml:{line}: [agents.front-desk] transfer_allowed contains {bad}, which is \
                 not an E.164 number or prefix"
            )),
            "{err}"
        );
    }
    assert!(!err.contains("\"+1415555\""), "a prefix is fine: {err}");
    // An empty list (no transfers) and a handoff line load.
    let ok = with_agent_lines("transfer_allowed = []\ntransfer_message = \"Hold on.\"");
    patterd::config::load_str_with_vars(&ok, "patter.toml", &[]).expect("valid");
}

#[test]
fn elevenlabs_transport_websocket_loads_and_other_kinds_refuse_it() {
    let ws = BASE.replace(
        "[tts.elevenlabs]\n",
        "[tts.elevenlabs]\ntransport = \"websocket\"\n",
    );
    let loaded = load(&ws).expect("websocket transport loads");
    assert_eq!(
        loaded.config.tts["elevenlabs"].transport,
        patterd::config::schema::TtsTransport::Websocket
    );
    let bad =
        format!("{BASE}\n[tts.local]\nkind = \"openai_compatible\"\ntransport = \"websocket\"\n");
    let e = load_err(&bad);
    assert!(
        e.contains("transport = \"websocket\" is for kind = \"elevenlabs\" only"),
        "{e}"
    );
    let typo = BASE.replace(
        "[tts.elevenlabs]\n",
        "[tts.elevenlabs]\ntransport = \"socket\"\n",
    );
    let e = load_err(&typo);
    assert!(e.contains("websocket"), "{e}");
}

#[test]
fn stt_chains_load_and_unknown_names_in_them_are_reported() {
    // A list loads; a single string still does (BASE).
    let text = BASE.replace(
        "stt = \"deepgram\"",
        "stt = [\"deepgram\", \"backup\"]\nstt_connect_timeout_ms = 1500",
    ) + "\n[stt.backup]\nkind = \"openai_realtime\"\napi_key = \"k\"\n";
    let c = load(&text).expect("chain loads").config;
    let a = &c.agents["front-desk"];
    assert_eq!(a.stt.names(), ["deepgram", "backup"]);
    assert_eq!(a.stt_connect_timeout_ms, 1500);
    assert_eq!(c.stt["backup"].kind, config::SttKind::OpenaiRealtime);
    assert_eq!(c.stt["backup"].effective_model(), "gpt-4o-transcribe");
    assert!(load(BASE).is_ok());

    let text = BASE.replace("stt = \"deepgram\"", "stt = [\"deepgram\", \"deepgrm\"]");
    let err = load_err(&text);
    let line = line_of(&text, "deepgrm");
    assert!(
        err.starts_with(&format!(
            "patter.toml:{line}: [agents.front-desk] stt = \"deepgrm\" names no [stt.deepgrm] section"
        )),
        "{err}"
    );
    assert!(err.contains("did you mean `deepgram`?"), "{err}");

    let err = load_err(&BASE.replace("stt = \"deepgram\"", "stt = []"));
    assert!(
        err.contains("stt = [] names no [stt.NAME] section"),
        "{err}"
    );
    let err = load_err(&BASE.replace(
        "stt = \"deepgram\"",
        "stt = \"deepgram\"\nstt_connect_timeout_ms = 50",
    ));
    assert!(
        err.contains("stt_connect_timeout_ms = 50 is out of range 100 to 30000"),
        "{err}"
    );
}

#[test]
fn vad_engine_loads_earshot_and_names_the_feature_silero_needs() {
    let earshot = with_agent_lines("vad_engine = \"earshot\"");
    let loaded = load(&earshot).expect("earshot loads");
    assert_eq!(
        loaded.config.agents["front-desk"].vad_engine,
        patterd::config::VadEngineName::Earshot
    );
    let silero = with_agent_lines("vad_engine = \"silero\"");
    if cfg!(feature = "silero") {
        load(&silero).expect("silero loads in a build with the feature");
    } else {
        let e = load_err(&silero);
        assert!(
            e.contains("vad_engine") && e.contains("--features silero"),
            "{e}"
        );
    }
    let e = load_err(&with_agent_lines("vad_engine = \"webrtc\""));
    assert!(e.contains("vad_engine"), "{e}");
}

#[test]
fn a_whisper_stt_needs_the_feature_and_a_model_file_and_takes_no_url_or_key() {
    let table = |lines: &str| {
        BASE.replace("stt = \"deepgram\"", "stt = \"local\"")
            + &format!("\n[stt.local]\nkind = \"whisper\"\n{lines}")
    };
    let ok = table("model_path = \"/models/ggml-tiny.en.bin\"\nthreads = 2\nqueue = 0\n");
    if cfg!(feature = "whisper") {
        let loaded = load(&ok).expect("whisper loads in a build with the feature");
        let c = &loaded.config;
        assert_eq!(c.stt["local"].kind, config::SttKind::Whisper);
        assert_eq!(c.stt["local"].threads, Some(2));
        assert_eq!(c.stt["local"].queue, Some(0));
        // No key is no "unconfigured" warning; a model file not there (yet) is one.
        assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
        assert!(
            loaded.warnings[0].contains("model_path = \"/models/ggml-tiny.en.bin\" is not a file")
                && loaded.warnings[0].contains("scripts/setup/whisper.sh"),
            "{:?}",
            loaded.warnings
        );
        let here = table(&format!(
            "model_path = \"{}/Cargo.toml\"\n",
            env!("CARGO_MANIFEST_DIR")
        ));
        assert!(load(&here).expect("loads").warnings.is_empty());
    } else {
        let e = load_err(&ok);
        assert!(
            e.contains("[stt.local] kind = \"whisper\"") && e.contains("--features whisper"),
            "{e}"
        );
    }
    let e = load_err(&table(""));
    assert!(
        e.contains("needs model_path") && e.contains("scripts/setup/whisper.sh"),
        "{e}"
    );
    for (lines, says) in [
        (
            "model_path = \"/m.bin\"\nthreads = 0\n",
            "threads = 0 is out of range 1 to 64",
        ),
        (
            "model_path = \"/m.bin\"\nqueue = 5000\n",
            "queue = 5000 is out of range 0 to 1000",
        ),
        (
            "model_path = \"/m.bin\"\napi_key = \"k\"\n",
            "takes no api_key",
        ),
        (
            "model_path = \"/m.bin\"\nbase_url = \"http://127.0.0.1:1\"\n",
            "takes no base_url",
        ),
    ] {
        let e = load_err(&table(lines));
        assert!(e.contains(says), "{lines}: {e}");
    }
}

#[test]
fn a_postgres_store_needs_a_postgres_url() {
    let err = load_err(&format!("{BASE}\n[store]\nbackend = \"postgres\"\n"));
    assert!(
        err.contains("[store] backend") && err.contains("needs url"),
        "{err}"
    );
    let err = load_err(&format!(
        "{BASE}\n[store]\nbackend = \"postgres\"\nurl = \"mysql://db/x\"\n"
    ));
    assert!(
        err.contains("[store] url") && err.contains("postgres://"),
        "{err}"
    );
    let err = load_err(&format!("{BASE}\n[store]\nbackend = \"mongodb\"\n"));
    assert!(err.contains("backend"), "{err}");
    let ok = load(&format!(
        "{BASE}\n[store]\nbackend = \"postgres\"\nurl = \"${{DB}}\"\npool = 2\n"
    ));
    // `${DB}` is unset here: the error is about the variable, not the store.
    if let Err(e) = ok {
        assert!(e.to_string().contains("DB"), "{e}");
    }
    let loaded = load_err_env(
        &format!("{BASE}\n[store]\nbackend = \"postgres\"\nurl = \"${{DB}}\"\npool = 0\n"),
        &[("DB", "postgres://u:p@h/db")],
    );
    assert!(loaded.contains("pool"), "{loaded}");
}

/// `[[server.api_tokens]]`: a read and an operator entry load; a `call` scope (minted, never
/// configured), a short token, a duplicate name or token, a call token's shape and entries
/// without `api_token` are refused, never printing a token.
#[test]
fn scoped_api_tokens_load_and_bad_entries_are_refused() {
    let entry = |name: &str, token: &str, scope: &str| {
        format!(
            "\n[[server.api_tokens]]\nname = \"{name}\"\ntoken = \"{token}\"\nscope = \"{scope}\"\n"
        )
    };
    let read = entry("grafana", "grafana-read-token-0123456789abcdef", "read");
    let ops = entry("ops", "ops-operator-token-0123456789abcdef", "operator");
    let loaded = load(&format!("{BASE}{read}{ops}")).expect("two entries load");
    let tokens = &loaded.config.server.api_tokens;
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0].scope, config::TokenScope::Read);
    assert_eq!(tokens[1].scope, config::TokenScope::Operator);

    let call = load_err(&format!(
        "{BASE}{}",
        entry("x", "call-scope-token-0123456789abcdefgh", "call")
    ));
    assert!(call.contains("call") && call.contains("operator"), "{call}");
    let short = load_err(&format!("{BASE}{}", entry("x", "short-secret", "read")));
    assert!(short.contains("token has 12 characters"), "{short}");
    assert!(
        !short.contains("short-secret"),
        "the token is printed: {short}"
    );
    let twice = load_err(&format!("{BASE}{read}{read}"));
    assert!(twice.contains("name of its own"), "{twice}");
    let same = load_err(&format!(
        "{BASE}{}",
        entry("x", "wire-test-api-token-0123456789abcdef", "read")
    ));
    assert!(same.contains("already api_token"), "{same}");
    let shaped = load_err(&format!(
        "{BASE}{}",
        entry("x", "pdc1.Q0ExMjM0NTY3ODkw.abcdefghijklmnop", "read")
    ));
    assert!(shaped.contains("pdc1."), "{shaped}");
    let local = BASE
        .replace("https://voice.example.com", "http://127.0.0.1:8080")
        .replace("api_token = \"wire-test-api-token-0123456789abcdef\"", "");
    let alone = load_err(&format!("{local}{read}"));
    assert!(alone.contains("needs [server] api_token"), "{alone}");
}

/// The brain outage keys: defaults 8 s and 30 s, a retry budget past a minute or below zero and
/// a negative hang-up are refused at their line.
#[test]
fn brain_outage_keys_have_defaults_and_bounds() {
    let loaded = load(BASE).expect("base loads");
    let agent = &loaded.config.agents["front-desk"];
    assert_eq!(agent.brain_retry_s, 8.0);
    assert_eq!(agent.brain_down_hangup_s, 30.0);
    assert!(!agent.brain_down_message.trim().is_empty());
    for (line, key) in [
        ("brain_retry_s = 61", "brain_retry_s"),
        ("brain_retry_s = -1", "brain_retry_s"),
        ("brain_down_hangup_s = -5", "brain_down_hangup_s"),
    ] {
        let text = BASE.replace(
            "tts = \"elevenlabs\"\n",
            &format!("tts = \"elevenlabs\"\n{line}\n"),
        );
        let err = load_err(&text);
        let at = line_of(&text, line);
        assert!(
            err.contains(&format!("patter.toml:{at}")) && err.contains(key),
            "{line}: {err}"
        );
    }
    let text = BASE.replace(
        "tts = \"elevenlabs\"\n",
        "tts = \"elevenlabs\"\nbrain_retry_s = 0\nbrain_down_hangup_s = 0\n",
    );
    assert!(load(&text).is_ok(), "0 turns each off");
}

#[test]
fn the_instance_name_is_checked() {
    let ok = load(&format!(
        "{BASE}\n[cluster]\ninstance_name = \"patterd-0.eu_1\"\n"
    ))
    .expect("a plain name loads");
    assert_eq!(ok.config.cluster.instance_name(), "patterd-0.eu_1");
    let defaulted = load(BASE).expect("base loads");
    assert!(
        !defaulted.config.cluster.instance_name().is_empty(),
        "the host name"
    );
    for bad in ["", "two words", "a/b", &"x".repeat(64)] {
        let err = load_err(&format!("{BASE}\n[cluster]\ninstance_name = {bad:?}\n"));
        assert!(err.contains("[cluster] instance_name"), "{bad:?}: {err}");
    }
}

#[test]
fn the_cluster_keys_are_checked() {
    let pg = "\n[store]\nbackend = \"postgres\"\nurl = \"postgres://u:p@db:5432/patterd\"\n";
    let ok = load(&format!(
        "{BASE}{pg}\n[cluster]\nadvertise_url = \"https://voice.example.com/i/p-0\"\n\
         internal_url = \"http://10.0.0.7:8080\"\nheartbeat_ms = 500\nlease_ms = 1500\n"
    ))
    .expect("a cluster loads");
    assert_eq!(ok.config.cluster.heartbeat_ms, 500);
    assert_eq!(ok.config.cluster.lease_ms, 1500);
    let auto = load(&format!(
        "{BASE}{pg}\n[cluster]\nadvertise_url = \"auto\"\n"
    ));
    assert!(auto.is_ok(), "auto is the bound address");
    for (text, needle) in [
        (
            format!("{BASE}\n[cluster]\nadvertise_url = \"https://a.example\"\n"),
            "only applies to instances sharing a PostgreSQL store",
        ),
        (
            format!("{BASE}{pg}\n[cluster]\ninternal_url = \"10.0.0.7:8080\"\n"),
            "[cluster] internal_url = \"10.0.0.7:8080\" is not an absolute http/https URL",
        ),
        (
            format!("{BASE}{pg}\n[cluster]\nheartbeat_ms = 2000\nlease_ms = 3000\n"),
            "at least 3 × heartbeat_ms",
        ),
        (
            format!("{BASE}{pg}\n[cluster]\nreaper_ms = 0\n"),
            "[cluster] reaper_ms = 0",
        ),
        (
            format!("{BASE}{pg}\n[cluster]\nheartbeat_mz = 500\n"),
            "unknown key `heartbeat_mz` in [cluster]; did you mean `heartbeat_ms`?",
        ),
    ] {
        let err = load_err(&text);
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

/// `[[webhooks]]`: the SSRF guard on the URL (loopback only with `allow_loopback`), each URL
/// once, a Standard Webhooks secret, known events and agents, a sane retry schedule — each
/// error on its line, all reported together.
#[test]
fn webhooks_are_validated() {
    const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    let ok = format!(
        "{BASE}\n[[webhooks]]\nurl = \"http://127.0.0.1:9000/hooks\"\nsecret = \"{SECRET}\"\n\
         allow_loopback = true\nagents = [\"front-desk\"]\n"
    );
    let loaded = load(&ok).expect("a loopback receiver with allow_loopback loads");
    let w = &loaded.config.webhooks[0];
    assert_eq!(
        w.events,
        [config::WebhookEvent::CallEnded],
        "the default events"
    );
    assert_eq!(loaded.config.webhook_delivery.retry_base_ms, 5_000);

    let bad = format!(
        "{BASE}
[[webhooks]]
url = \"http://127.0.0.1:9000/hooks\"
secret = \"short\"
agents = [\"front-dsk\"]

[[webhooks]]
url = \"http://169.254.169.254/latest\"
secret = \"whsec_not base64!\"
allow_loopback = true
events = []

[[webhooks]]
url = \"https://hooks.example.com/a\"
secret = \"{SECRET}\"

[[webhooks]]
url = \"https://hooks.example.com/a\"
secret = \"{SECRET}\"

[webhook_delivery]
retry_base_ms = 10000
retry_max_ms = 1000
concurrency = 0
"
    );
    let err = load_err(&bad);
    for (needle, on) in [
        (
            "loopback address and is not called",
            "url = \"http://127.0.0.1:9000/hooks\"",
        ),
        ("24 to 64", "secret = \"short\""),
        ("did you mean `front-desk`?", "agents = [\"front-dsk\"]"),
        ("link-local", "url = \"http://169.254.169.254/latest\""),
        ("not base64", "secret = \"whsec_not base64!\""),
        ("events is empty", "events = []"),
        ("concurrency = 0 must be 1 to 256", "concurrency = 0"),
        ("below retry_base_ms", "retry_max_ms = 1000"),
    ] {
        let line = line_of(&bad, on);
        assert!(
            err.lines()
                .any(|l| l.contains(needle) && l.starts_with(&format!("patter.toml:{line}:"))),
            "{needle:?} on line {line}:\n{err}"
        );
    }
    assert!(err.contains("is already [[webhooks]] entry 3"), "{err}");
    assert!(
        err.contains("allow_loopback = true"),
        "the hint names the key:\n{err}"
    );

    let unknown = format!(
        "{BASE}\n[[webhooks]]\nurl = \"https://hooks.example.com/a\"\nsecret = \"{SECRET}\"\n\
         events = [\"call.endd\"]\n"
    );
    let err = load_err(&unknown);
    assert!(
        err.contains("call.ended"),
        "the known events are listed:\n{err}"
    );
}

/// `[agents.X.summary]`: its brain must exist and its schema must be an object schema.
#[test]
fn a_summary_needs_a_known_brain_and_an_object_schema() {
    let ok = BASE.replace(
        "tts = \"elevenlabs\"\n",
        "tts = \"elevenlabs\"\nsummary = { llm = \"hermes\", schema = { type = \"object\" } }\n",
    );
    let loaded = load(&ok).expect("loads");
    let s = loaded.config.agents["front-desk"]
        .summary
        .as_ref()
        .expect("summary");
    assert_eq!((s.llm.as_str(), s.timeout_s), ("hermes", 60));
    let bad = BASE.replace(
        "tts = \"elevenlabs\"\n",
        "tts = \"elevenlabs\"\n\n[agents.front-desk.summary]\nllm = \"hermez\"\nschema = { type = \"string\" }\ntimeout_s = 0\n",
    );
    let err = load_err(&bad);
    for (needle, on) in [
        ("did you mean `hermes`?", "llm = \"hermez\""),
        ("type = \"object\"", "schema = { type = \"string\" }"),
        ("at least 1", "timeout_s = 0"),
    ] {
        let line = line_of(&bad, on);
        assert!(
            err.lines()
                .any(|l| l.contains(needle) && l.starts_with(&format!("patter.toml:{line}:"))),
            "{needle:?} on line {line}:\n{err}"
        );
    }
}

#[test]
fn telemetry_is_off_by_default_and_its_keys_are_checked_when_on() {
    let loaded = load(BASE).expect("loads");
    assert!(!loaded.config.telemetry.enabled());
    let on = format!(
        "{BASE}\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\nheaders = {{ \"x-api-key\" = \"${{OTLP_KEY}}\" }}\n"
    );
    let loaded = config::load_str_with_vars(&on, ORIGIN, &[("OTLP_KEY", "secret-key")])
        .expect("loads with a collector");
    let t = &loaded.config.telemetry;
    assert!(t.enabled());
    assert_eq!(t.service_name, "patterd");
    assert_eq!(t.headers["x-api-key"].expose(), "secret-key");
    // A typo'd key is still an error while the section is off.
    let typo = format!("{BASE}\n[telemetry]\notlp_endpiont = \"http://127.0.0.1:4318\"\n");
    assert!(
        load_err(&typo).contains("did you mean `otlp_endpoint`?"),
        "{}",
        load_err(&typo)
    );
    for (extra, needle) in [
        (
            "otlp_endpoint = \"collector:4318\"",
            "`telemetry.otlp_endpoint` = \"collector:4318\" is not an absolute http/https URL",
        ),
        (
            "otlp_endpoint = \"http://c:4318\"\nservice_name = \" \"",
            "`telemetry.service_name` is empty",
        ),
        (
            "otlp_endpoint = \"http://c:4318\"\nmax_queued_spans = 0",
            "`telemetry.max_queued_spans` must be at least 1",
        ),
        (
            "otlp_endpoint = \"http://c:4318\"\nexport_timeout_ms = 0",
            "`telemetry.export_timeout_ms` must be at least 1",
        ),
        (
            "otlp_endpoint = \"http://c:4318\"\nheaders = { \"bad header\" = \"v\" }",
            "is not a valid HTTP header",
        ),
    ] {
        let text = format!("{BASE}\n[telemetry]\n{extra}\n");
        let err = load_err(&text);
        assert!(err.contains(needle), "{needle}: {err}");
        assert!(err.starts_with("patter.toml:"), "located: {err}");
    }
}

/// The base with a `[tts.local]` table of `lines`.
fn with_local_tts(lines: &str) -> String {
    BASE.replace(
        "[carriers.twilio]",
        &format!("[tts.local]\n{lines}\n\n[carriers.twilio]"),
    )
}

#[test]
fn kind_piper_names_the_feature_and_the_files_it_needs() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("none.onnx");
    let text = with_local_tts(&format!(
        "kind = \"piper\"\nvoice_path = \"{}\"\nlibrary = \"{}\"",
        missing.display(),
        dir.path().join("libonnxruntime.so").display()
    ));
    let e = load_err(&text);
    if cfg!(feature = "piper") {
        assert!(
            e.contains("voice_path") && e.contains("scripts/setup/piper.sh"),
            "{e}"
        );
        assert!(e.contains("library") && e.contains("onnxruntime"), "{e}");
        // The voice without its settings file beside it.
        std::fs::write(&missing, b"onnx").expect("write");
        let e = load_err(&text);
        assert!(e.contains("none.onnx.json"), "{e}");
    } else {
        assert!(
            e.contains("kind = \"piper\"") && e.contains("--features piper"),
            "{e}"
        );
    }
    // Piper's and flite's keys on a vendor's kind are refused, as is a URL for a local one.
    let e = load_err(&BASE.replace(
        "kind = \"elevenlabs\"\napi_key = \"k\"",
        "kind = \"elevenlabs\"\napi_key = \"k\"\nvoice_path = \"/v.onnx\"\nworkers = 2",
    ));
    assert!(e.contains("voice_path is for kind = \"piper\""), "{e}");
    assert!(e.contains("workers is for kind"), "{e}");
}

#[test]
fn kind_flite_takes_a_built_in_voice_and_never_a_url() {
    let e = load_err(&with_local_tts(
        "kind = \"flite\"\nvoice_id = \"http://example.com/evil.flitevox\"",
    ));
    assert!(e.contains("voice_id") && e.contains("rms"), "{e}");
    let e = load_err(&with_local_tts(
        "kind = \"flite\"\nprogram = \"/nonexistent/flite\"\nspeed = 9.0\nbase_url = \"http://x\"",
    ));
    assert!(e.contains("apt-get install flite"), "{e}");
    assert!(e.contains("speed = 9 must be 0.5–2.0"), "{e}");
    assert!(e.contains("has no base_url"), "{e}");
    if patterd::util::find_program("flite").is_some() {
        let loaded = load(&with_local_tts("kind = \"flite\"\nvoice_id = \"slt\"")).expect("loads");
        let t = &loaded.config.tts["local"];
        assert_eq!((t.voice_id.as_str(), t.base_url.as_str()), ("slt", ""));
        assert!(
            loaded.warnings.is_empty(),
            "no key needed: {:?}",
            loaded.warnings
        );
    }
}
