//! The one shared test harness of the `wire`, `calls` and `control` test binaries: a whole
//! patterd stack on 127.0.0.1 ([`Stack`]) — fake Deepgram, ElevenLabs, Hermes and the Twilio,
//! Telnyx and Plivo REST APIs, patterd bound in-process on port 0 with one number per carrier,
//! and the three carrier simulators that sign webhooks and open media streams — plus the
//! carriers as a test parameter ([`carrier`]), a REST API client ([`api`]), the daemon as a
//! child process ([`daemon`]), headless Chromium for web pages ([`browser`]) and the fixture files
//! ([`fixtures`]).
#![allow(dead_code)]

pub mod api;
pub mod browser;
pub mod carrier;
pub mod cluster;
pub mod daemon;
pub mod fixtures;
pub mod k8s;

use std::time::Duration;

use patterd::call::CallRecord;
use patterd_sim::deepgram::{FakeDeepgram, FakeDeepgramConfig};
use patterd_sim::elevenlabs::{FakeElevenLabs, FakeElevenLabsConfig};
use patterd_sim::hermes::FakeHermes;
use patterd_sim::plivo::{FakePlivoRest, SimPlivo};
use patterd_sim::telnyx::{FakeTelnyxRest, SimTelnyx};
use patterd_sim::twilio::call::{SimCall, SimCallConfig};
use patterd_sim::twilio::rest::FakeTwilioRest;
use patterd_sim::twilio::xml::{TwimlAnswer, parse_twiml};
use patterd_sim::twilio::{SimTwilio, WebhookResponse};
use patterd_sim::vonage::{FakeVonageRest, SimVonage};

pub const ACCOUNT_SID: &str = "AC00000000000000000000000000000001";
pub const AUTH_TOKEN: &str = "twilio-test-auth-token";
pub const PUBLIC_URL: &str = "https://voice.example.test";
pub const OUR_NUMBER: &str = "+15550001234";
pub const TELNYX_NUMBER: &str = "+15550002000";
pub const PLIVO_NUMBER: &str = "+15550003000";
pub const VONAGE_NUMBER: &str = "+15550004000";
pub const VONAGE_APPLICATION_ID: &str = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab";
pub const VONAGE_SIGNATURE_SECRET: &str = "vonage-test-signature-secret";
/// The Vonage application's test key (a throwaway RSA key, PKCS#8 PEM).
pub const VONAGE_PRIVATE_KEY: &str = include_str!("../../src/carrier/vonage/test_key.pem");
pub const TELNYX_API_KEY: &str = "KEY0123456789ABCDEF_fake";
/// The Ed25519 seed of the vectors (`telnyx_ed25519.json`) and its public key.
pub const TELNYX_SEED_HEX: &str =
    "35e4d55fb5c09b8ed4291b65a005a3e7b327da3961eb0be8c887252e5fed7ed0";
pub const TELNYX_PUBLIC_KEY: &str = "9oVA42nmp6zkNZrZB8wuF6s6NkF0KtvUNRePpkjadWY=";
pub const PLIVO_AUTH_ID: &str = "MA0000000000000000AB";
pub const PLIVO_AUTH_TOKEN: &str = "plivo-test-auth-token";
pub const CALLER: &str = "+15557654321";
pub const HERMES_KEY: &str = "hermes-test-key";
pub const DG_KEY: &str = "dg-test-key";
pub const EL_KEY: &str = "el-test-key";
pub const GREETING: &str = "Hello, thanks for calling.";
pub const FILLER: &str = "One moment please.";
pub const LLM_ERROR: &str = "Sorry, something went wrong on my side.";
pub const SYSTEM_PROMPT: &str = "You are a test agent.";
pub const WAIT: Duration = Duration::from_secs(15);
/// `[server] api_token` of every stack unless a test sets its own: a `public_url` that is not
/// loopback needs one.
pub const API_TOKEN: &str = "patterd-test-api-token-0123456789";
/// `[llm.hermes] session_key_secret` of the test stacks.
pub const MEMORY_SECRET: &str = "patterd-test-memory-secret-0123456789";

/// A `reqwest` client that sends `Authorization: Bearer <token>` with every request.
pub fn api_client(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(v) = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")) {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("API client")
}

/// Knobs for a stack.
pub struct Opts {
    pub first_message: String,
    pub long_turn_after_s: f64,
    pub max_calls: usize,
    pub allowed_callers: Vec<String>,
    pub transcripts: Vec<String>,
    /// Overrides `[llm.hermes] base_url` (e.g. a closed port).
    pub llm_base_url: Option<String>,
    pub max_duration_s: u64,
    /// `[server] api_token` (default [`API_TOKEN`]; empty only loads with a loopback
    /// `public_url`).
    pub api_token: String,
    /// `allowed_destinations` of every number (empty: outbound refused).
    pub allowed_destinations: Vec<String>,
    pub outbound_max_concurrent: usize,
    pub outbound_max_per_day: u32,
    /// `[outbound] max_sms_per_day`.
    pub outbound_max_sms_per_day: u32,
    /// Extra `key = value` lines for `[agents.front-desk]`.
    pub agent_extra: String,
    /// Speech (μ-law) the fake ElevenLabs speaks with instead of a tone, and its pace.
    pub voice: Option<(Vec<u8>, u32)>,
    /// The agent's brain: `hermes`, or `compat` (kind `openai_compatible` on the same fake
    /// Hermes, which then gets the whole history every turn).
    pub llm: String,
    /// The agent's `tts` value as TOML (`"\"elevenlabs\""`, or a chain `["a", "b"]`).
    pub tts: String,
    /// The agent's ears: a `[stt.*]` table name (default `deepgram`, the fake Deepgram), or
    /// a chain as TOML (`["a", "b"]`).
    pub stt: String,
    /// Extra TOML tables (e.g. an `[stt.NAME]` pointing at another fake).
    pub extra_sections: String,
    /// Extra TOML appended at the end of the file (e.g. `[pricing.…]` tables).
    pub extra_config: String,
    /// The fake Deepgram transcribes from this word track instead of its transcript queue
    /// (the scenario suite, `tests/calls/suite.rs`).
    pub words: Option<std::sync::Arc<patterd_sim::words::WordTrack>>,
    /// With `words`: how long after its end the fake Deepgram reports a word.
    pub word_lag_ms: u64,
    /// `sms = true` on the Twilio, Telnyx and Plivo numbers (their agent answers texts).
    pub sms: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            first_message: GREETING.into(),
            long_turn_after_s: 4.0,
            max_calls: 50,
            allowed_callers: Vec::new(),
            transcripts: Vec::new(),
            llm_base_url: None,
            max_duration_s: 3600,
            api_token: API_TOKEN.into(),
            allowed_destinations: Vec::new(),
            outbound_max_concurrent: 5,
            outbound_max_per_day: 100,
            outbound_max_sms_per_day: 100,
            agent_extra: String::new(),
            voice: None,
            llm: "hermes".into(),
            tts: "\"elevenlabs\"".into(),
            stt: "deepgram".into(),
            extra_sections: String::new(),
            extra_config: String::new(),
            words: None,
            word_lag_ms: 0,
            sms: false,
        }
    }
}

pub struct Stack {
    pub dg: FakeDeepgram,
    pub el: FakeElevenLabs,
    pub hermes: FakeHermes,
    pub rest: FakeTwilioRest,
    pub telnyx_rest: FakeTelnyxRest,
    pub plivo_rest: FakePlivoRest,
    pub vonage_rest: FakeVonageRest,
    pub server: patterd::server::Running,
    pub twilio: SimTwilio,
    pub telnyx: SimTelnyx,
    pub plivo: SimPlivo,
    pub vonage: SimVonage,
    pub base: String,
    /// `server.data_dir` (holds patterd.db).
    pub data: tempfile::TempDir,
    /// `[server] api_token`.
    pub api_token: String,
}

pub fn telnyx_seed() -> [u8; 32] {
    hex::decode(TELNYX_SEED_HEX)
        .expect("hex")
        .try_into()
        .expect("32 bytes")
}

/// The inside of a TOML array of strings: `"a", "b"`.
fn toml_list(v: &[String]) -> String {
    v.iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `[carriers.vonage]` and its number, for [`config_text`]'s `extra_numbers`.
pub fn vonage_carrier(opts: &Opts, vonage_rest: &str) -> String {
    let callers = toml_list(&opts.allowed_callers);
    let destinations = toml_list(&opts.allowed_destinations);
    format!(
        r#"
[carriers.vonage]
kind = "vonage"
application_id = "{VONAGE_APPLICATION_ID}"
signature_secret = "{VONAGE_SIGNATURE_SECRET}"
private_key = """
{VONAGE_PRIVATE_KEY}"""
api_base_url = "{vonage_rest}"

[[numbers]]
number = "{VONAGE_NUMBER}"
carrier = "vonage"
agent = "front-desk"
allowed_callers = [{callers}]
allowed_destinations = [{destinations}]
"#
    )
}

/// `[carriers.telnyx]`, `[carriers.plivo]` and one number each, for [`config_text`]'s
/// `extra_numbers`.
pub fn other_carriers(opts: &Opts, telnyx_rest: &str, plivo_rest: &str) -> String {
    let callers = toml_list(&opts.allowed_callers);
    let destinations = toml_list(&opts.allowed_destinations);
    format!(
        r#"
[carriers.telnyx]
kind = "telnyx"
api_key = "{TELNYX_API_KEY}"
public_key = "{TELNYX_PUBLIC_KEY}"
connection_id = "1684641123236054244"
api_base_url = "{telnyx_rest}"

[carriers.plivo]
kind = "plivo"
auth_id = "{PLIVO_AUTH_ID}"
auth_token = "{PLIVO_AUTH_TOKEN}"
api_base_url = "{plivo_rest}"

[[numbers]]
number = "{TELNYX_NUMBER}"
carrier = "telnyx"
agent = "front-desk"
allowed_callers = [{callers}]
allowed_destinations = [{destinations}]
sms = {sms}

[[numbers]]
number = "{PLIVO_NUMBER}"
carrier = "plivo"
agent = "front-desk"
allowed_callers = [{callers}]
allowed_destinations = [{destinations}]
sms = {sms}
"#,
        sms = opts.sms,
    )
}

pub fn config_text(
    opts: &Opts,
    dg: &str,
    el: &str,
    hermes: &str,
    rest: &str,
    extra_numbers: &str,
) -> String {
    let destinations = toml_list(&opts.allowed_destinations);
    let callers = toml_list(&opts.allowed_callers);
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
public_url = "{PUBLIC_URL}"
max_calls = {max_calls}
drain_timeout_s = 30
api_token = "{api_token}"
data_dir = "${{PATTERD_DATA_DIR:-./data}}"

[outbound]
max_concurrent = {max_concurrent}
max_per_day = {max_per_day}
max_sms_per_day = {max_sms_per_day}
ring_timeout_s = 20

[log]
format = "json"
level = "info"

[llm.hermes]
kind = "hermes"
base_url = "{hermes}"
api_key = "{HERMES_KEY}"
model = "hermes-agent"
session_key_from = "caller_hash"
session_key_secret = "{MEMORY_SECRET}"
first_token_timeout_s = 20

[llm.compat]
kind = "openai_compatible"
base_url = "{hermes}"
api_key = "{HERMES_KEY}"
model = "compat-model"
first_token_timeout_s = 20

{sim_sections}
{extra_sections}

[agents.front-desk]
system_prompt = "{SYSTEM_PROMPT}"
first_message = "{first}"
llm = {llm}
stt = {stt}
tts = {tts}
long_turn_message = "{FILLER}"
long_turn_message_after_s = {after}
llm_error_message = "{LLM_ERROR}"
max_duration_s = {max_duration}
{agent_extra}

[[numbers]]
number = "{OUR_NUMBER}"
carrier = "twilio"
agent = "front-desk"
allowed_callers = [{callers}]
allowed_destinations = [{destinations}]
sms = {sms}
{extra_numbers}
{extra_config}
"#,
        extra_config = opts.extra_config,
        sms = opts.sms,
        max_calls = opts.max_calls,
        sim_sections = patterd_sim::config::SimSections {
            deepgram: (dg, DG_KEY),
            elevenlabs: (el, EL_KEY),
            twilio_rest: rest,
            account_sid: ACCOUNT_SID,
            auth_token: AUTH_TOKEN,
        }
        .toml(),
        api_token = opts.api_token,
        max_concurrent = opts.outbound_max_concurrent,
        max_per_day = opts.outbound_max_per_day,
        max_sms_per_day = opts.outbound_max_sms_per_day,
        first = opts.first_message,
        after = opts.long_turn_after_s,
        max_duration = opts.max_duration_s,
        agent_extra = opts.agent_extra,
        // A chain (`["hermes", "compat"]`) goes in as written; a name is quoted.
        llm = if opts.llm.starts_with('[') {
            opts.llm.clone()
        } else {
            format!("\"{}\"", opts.llm)
        },
        tts = opts.tts,
        stt = if opts.stt.starts_with('[') {
            opts.stt.clone()
        } else {
            format!("\"{}\"", opts.stt)
        },
        extra_sections = opts.extra_sections,
    )
}

impl Stack {
    /// The daemon's counter `which` picks from its metrics, now.
    pub fn metric(
        &self,
        which: impl FnOnce(&patterd::app::Metrics) -> &std::sync::atomic::AtomicU64,
    ) -> u64 {
        which(&self.server.app.metrics).load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for `call_sid` to finish with `reason` and for the carrier's leg to be hung up
    /// through the REST API (its first request); returns the REST requests so far.
    pub async fn ended_and_hung_up(
        &self,
        call_sid: &str,
        reason: &str,
    ) -> Vec<patterd_sim::twilio::rest::RecordedRequest> {
        let rec = self.finished(call_sid).await;
        assert_eq!(rec.ended_reason, reason);
        let reqs = self
            .rest
            .wait_for_requests(1, WAIT)
            .await
            .expect("REST hang-up");
        assert_eq!(reqs[0].call_sid(), Some(call_sid));
        reqs
    }

    pub async fn start(opts: Opts) -> Stack {
        let dg = FakeDeepgram::start_with(FakeDeepgramConfig {
            api_key: DG_KEY.into(),
            transcripts: opts.transcripts.clone(),
            words: opts.words.clone(),
            word_lag_ms: opts.word_lag_ms,
            ..Default::default()
        })
        .await
        .expect("fake deepgram");
        let mut el_cfg = FakeElevenLabsConfig {
            api_key: EL_KEY.into(),
            ..Default::default()
        };
        if let Some((voice, ms_per_char)) = &opts.voice {
            el_cfg.voice = Some(std::sync::Arc::new(voice.clone()));
            el_cfg.ms_per_char = *ms_per_char;
        }
        let el = FakeElevenLabs::start_with(el_cfg)
            .await
            .expect("fake elevenlabs");
        let hermes = FakeHermes::start(HERMES_KEY).await.expect("fake hermes");
        let rest = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN)
            .await
            .expect("fake twilio rest");
        let telnyx_rest = FakeTelnyxRest::start(TELNYX_API_KEY)
            .await
            .expect("fake telnyx rest");
        let plivo_rest = FakePlivoRest::start(PLIVO_AUTH_ID, PLIVO_AUTH_TOKEN)
            .await
            .expect("fake plivo rest");
        let vonage_rest = FakeVonageRest::start(VONAGE_APPLICATION_ID, VONAGE_PRIVATE_KEY)
            .await
            .expect("fake vonage rest");
        // The numbers each account may text from.
        rest.sms.modify(|l| l.senders.push(OUR_NUMBER.into()));
        telnyx_rest
            .sms
            .modify(|l| l.senders.push(TELNYX_NUMBER.into()));
        plivo_rest
            .sms
            .modify(|l| l.senders.push(PLIVO_NUMBER.into()));
        let hermes_url = opts
            .llm_base_url
            .clone()
            .unwrap_or_else(|| hermes.base_url());
        let api_token = opts.api_token.clone();
        let text = config_text(
            &opts,
            &dg.base_url(),
            &el.base_url(),
            &hermes_url,
            &rest.base_url,
            &format!(
                "{}{}",
                other_carriers(&opts, &telnyx_rest.base_url, &plivo_rest.base_url),
                vonage_carrier(&opts, &vonage_rest.base_url)
            ),
        );
        let data = tempfile::tempdir().expect("data dir");
        let data_path = data.path().display().to_string();
        let loaded = patterd::config::load_str_with_vars(
            &text,
            "test.toml",
            &[("PATTERD_DATA_DIR", &data_path)],
        )
        .expect("test config loads");
        let server = patterd::server::bind(loaded.config)
            .await
            .expect("patterd binds");
        let base = format!("http://{}", server.local_addr);
        let twilio = SimTwilio::new(&base, PUBLIC_URL, ACCOUNT_SID, AUTH_TOKEN);
        let telnyx = SimTelnyx::new(&base, PUBLIC_URL, telnyx_seed());
        let plivo = SimPlivo::new(&base, PUBLIC_URL, PLIVO_AUTH_TOKEN);
        let vonage = SimVonage::new(&base, VONAGE_SIGNATURE_SECRET);
        Stack {
            dg,
            el,
            hermes,
            rest,
            telnyx_rest,
            plivo_rest,
            vonage_rest,
            server,
            twilio,
            telnyx,
            plivo,
            vonage,
            base,
            data,
            api_token,
        }
    }

    /// A `reqwest` client that sends the stack's bearer token with every request.
    pub fn api_client(&self) -> reqwest::Client {
        api_client(&self.api_token)
    }

    pub fn ws_base(&self) -> String {
        format!("ws://{}", self.server.local_addr)
    }

    /// Posts a signed voice webhook for a new call from `from`.
    pub async fn ring_from(&self, from: &str) -> (String, WebhookResponse) {
        self.twilio
            .incoming_call("/twilio/voice", from, OUR_NUMBER)
            .await
            .expect("webhook request")
    }

    /// A whole inbound call: webhook, TwiML, media stream opened.
    pub async fn call(&self) -> (String, SimCall) {
        let (call_sid, resp) = self.ring_from(CALLER).await;
        assert_eq!(resp.status, 200, "webhook answered {resp:?}");
        let answer = parse_twiml(&resp.body).expect("TwiML parses");
        let sim = self.open(&call_sid, &answer).await;
        (call_sid, sim)
    }

    /// A call whose caller, after the greeting, says one turn (600 ms of speech) and hears the
    /// agent's one answer to it (its mark echoed).
    pub async fn call_and_one_answered_turn(&self) -> (String, SimCall) {
        let (call_sid, sim) = self.call().await;
        sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
            .await
            .unwrap();
        speak(&sim, 600);
        sim.wait_for("apology mark", WAIT, |s| s.marks_echoed.len() >= 2)
            .await
            .unwrap();
        (call_sid, sim)
    }

    pub async fn open(&self, call_sid: &str, answer: &TwimlAnswer) -> SimCall {
        SimCall::from_answer(
            answer,
            SimCallConfig::new(&self.ws_base(), ACCOUNT_SID, call_sid),
        )
        .await
        .expect("media stream opens")
    }

    /// Waits for a call to finish and returns its record.
    pub async fn finished(&self, call_sid: &str) -> CallRecord {
        tokio::time::timeout(WAIT, self.server.app.calls.wait_finished(call_sid))
            .await
            .expect("call finishes in time")
            .expect("call record")
    }

    /// Texts patterd asked ElevenLabs to speak.
    pub fn spoken(&self) -> Vec<String> {
        self.el.record().texts()
    }
}

/// Caller speech: a 440 Hz tone for `ms` (the fake Deepgram hears it as speech).
pub fn speak(sim: &SimCall, ms: u64) {
    sim.push_tone(440.0, ms, 8000);
}

/// The outbound calls' conversation (agent `first_message` "Hi, is this Bob?", system prompt
/// "Confirm the caller is Bob."): the greeting plays, the callee answers, the brain gets the
/// call's own system prompt, the reply plays. `who` labels failures.
pub async fn greeted_bob_and_one_turn(stack: &Stack, sim: &SimCall, who: &str) {
    sim.wait_for("greeting", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap_or_else(|e| panic!("{who}: greeting: {e}"));
    assert_eq!(stack.spoken()[0], "Hi, is this Bob?");
    speak(sim, 700);
    let rec = stack
        .hermes
        .wait_until("turn", |r| r.requests.len() == 1)
        .await;
    assert_eq!(
        rec.requests[0].messages()[0].1,
        "Confirm the caller is Bob."
    );
    sim.wait_for("reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap_or_else(|e| panic!("{who}: reply: {e}"));
}
