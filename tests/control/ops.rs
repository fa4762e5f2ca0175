//! The operator commands against the fakes: `patterd doctor` (every finding kind: config,
//! brains, credentials, public_url, numbers, allow-lists; `--offline`, `--json` and the exit
//! code through the binary) and `patterd wire` / `unwire` (a round trip on each carrier's fake
//! restores the exact previous settings; `--dry-run` writes nothing).

use std::path::Path;
use std::process::Command;

use patterd::ops::doctor::{self, Finding, Level, Options};
use patterd::ops::wire::{self, WireOutcome};
use patterd_sim::deepgram::{FakeDeepgram, FakeDeepgramConfig};
use patterd_sim::elevenlabs::FakeElevenLabs;
use patterd_sim::hermes::FakeHermes;
use patterd_sim::plivo::FakePlivoRest;
use patterd_sim::telnyx::FakeTelnyxRest;
use patterd_sim::twilio::rest::FakeTwilioRest;

use crate::common::daemon::{Daemon, Fakes};
use crate::common::*;

const ELSEWHERE: &str = "+15550001235";
const UNKNOWN: &str = "+15550009999";
const PLIVO_UNKNOWN: &str = "+15550009998";
const OTHER_URL: &str = "https://old.example.test/voice";
const TELNYX_APP: &str = "2000000000000000001";
const PLIVO_APP: &str = "30000000000000001";

/// Every fake doctor and wire talk to.
struct World {
    hermes: FakeHermes,
    keyless: FakeHermes,
    dg: FakeDeepgram,
    el: FakeElevenLabs,
    twilio: FakeTwilioRest,
    telnyx: FakeTelnyxRest,
    plivo: FakePlivoRest,
    dir: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let w = World {
            hermes: FakeHermes::start(HERMES_KEY).await.expect("hermes"),
            keyless: FakeHermes::start("").await.expect("keyless hermes"),
            dg: FakeDeepgram::start_with(FakeDeepgramConfig {
                api_key: DG_KEY.into(),
                ..Default::default()
            })
            .await
            .expect("deepgram"),
            el: FakeElevenLabs::start(EL_KEY).await.expect("elevenlabs"),
            twilio: FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN)
                .await
                .expect("twilio"),
            telnyx: FakeTelnyxRest::start(TELNYX_API_KEY).await.expect("telnyx"),
            plivo: FakePlivoRest::start(PLIVO_AUTH_ID, PLIVO_AUTH_TOKEN)
                .await
                .expect("plivo"),
            dir: tempfile::tempdir().expect("tempdir"),
        };
        // Twilio: one number wired to `public`, one elsewhere (a TwiML app on top).
        w.twilio.add_number(
            ELSEWHERE,
            &[
                ("voice_url", OTHER_URL),
                ("voice_method", "GET"),
                ("status_callback", "https://old.example.test/status"),
                (
                    "voice_application_sid",
                    "AP00000000000000000000000000000001",
                ),
            ],
        );
        // Telnyx: the number is on someone else's app; ours exists with another URL.
        w.telnyx.add_app("1000000000000000009", "legacy", OTHER_URL);
        w.telnyx
            .add_app(TELNYX_APP, "patterd-app", "https://stale.example.test/hook");
        w.telnyx.add_number(TELNYX_NUMBER, "1000000000000000009");
        // Plivo: the number's application answers elsewhere.
        w.plivo
            .add_app(PLIVO_APP, OTHER_URL, "https://old.example.test/hangup");
        w.plivo
            .add_number(PLIVO_NUMBER.trim_start_matches('+'), PLIVO_APP);
        w
    }

    /// A config with every service; `public` / `listen` for the public_url check.
    fn config(&self, listen: &str, public: &str, extra: &str) -> String {
        format!(
            r#"
[server]
listen = "{listen}"
public_url = "{public}"
api_token = "{API_TOKEN}"
data_dir = "{dir}"

[llm.hermes]
kind = "hermes"
base_url = "{hermes}"
api_key = "{HERMES_KEY}"
session_key_from = "caller_hash"

[llm.wrongkey]
kind = "openai_compatible"
base_url = "{hermes}"
api_key = "not-the-key"
model = "hermes-agent"

[llm.open]
kind = "hermes"
base_url = "{keyless}"
api_key = "whatever"
session_key_from = "caller_hash"

[stt.deepgram]
kind = "deepgram"
base_url = "{dg}"
api_key = "{DG_KEY}"

[stt.baddg]
kind = "deepgram"
base_url = "{dg}"
api_key = "wrong"

[tts.elevenlabs]
kind = "elevenlabs"
base_url = "{el}"
api_key = "{EL_KEY}"

[carriers.twilio]
kind = "twilio"
account_sid = "{ACCOUNT_SID}"
auth_token = "{AUTH_TOKEN}"
api_base_url = "{twilio}"

[carriers.twbad]
kind = "twilio"
account_sid = "{ACCOUNT_SID}"
auth_token = "wrong-token"
api_base_url = "{twilio}"

[carriers.telnyx]
kind = "telnyx"
api_key = "{TELNYX_API_KEY}"
public_key = "{TELNYX_PUBLIC_KEY}"
connection_id = "{TELNYX_APP}"
api_base_url = "{telnyx}"

[carriers.plivo]
kind = "plivo"
auth_id = "{PLIVO_AUTH_ID}"
auth_token = "{PLIVO_AUTH_TOKEN}"
api_base_url = "{plivo}"

[agents.a]
llm = "hermes"
stt = "deepgram"
tts = "elevenlabs"

[[numbers]]
number = "{ELSEWHERE}"
carrier = "twilio"
agent = "a"
allowed_destinations = ["+1555"]

[[numbers]]
number = "{TELNYX_NUMBER}"
carrier = "telnyx"
agent = "a"
allowed_destinations = ["+1"]

[[numbers]]
number = "{PLIVO_NUMBER}"
carrier = "plivo"
agent = "a"

[[numbers]]
number = "{UNKNOWN}"
carrier = "twilio"
agent = "a"
allowed_destinations = ["+1555"]

[[numbers]]
number = "{PLIVO_UNKNOWN}"
carrier = "plivo"
agent = "a"
allowed_destinations = ["+1555"]
{extra}
"#,
            dir = self.dir.path().display(),
            hermes = self.hermes.base_url(),
            keyless = self.keyless.base_url(),
            dg = self.dg.base_url(),
            el = self.el.base_url(),
            twilio = self.twilio.base_url,
            telnyx = self.telnyx.base_url,
            plivo = self.plivo.base_url,
        )
    }

    fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write config");
        p
    }
}

fn has(findings: &[Finding], pred: impl Fn(&Finding) -> bool) -> bool {
    findings.iter().any(pred)
}

fn dump(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("{} {}", f.level().as_str(), f.message()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A closed local port (bound, then released).
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    drop(l);
    a.to_string()
}

#[tokio::test]
async fn doctor_reports_every_check_against_the_fakes() {
    let w = World::start().await;
    let path = w.write(
        "doctor.toml",
        &w.config(&closed_port(), "http://doctor-test.invalid", ""),
    );
    let report = doctor::run(&path, Options::default()).await;
    let f = &report.findings;
    let d = dump(f);
    assert!(has(f, |x| matches!(x, Finding::ConfigValid { .. })), "{d}");
    // Brains.
    assert!(
        has(
            f,
            |x| matches!(x, Finding::HermesHealthy { llm, version } if llm == "hermes" && version == "0.19.0")
        ),
        "{d}"
    );
    assert!(
        has(
            f,
            |x| matches!(x, Finding::LlmKeyAccepted { llm, models } if llm == "hermes" && models == &["hermes-agent"])
        ),
        "{d}"
    );
    assert!(
        has(
            f,
            |x| matches!(x, Finding::LlmKeyRejected { llm, status: 401 } if llm == "wrongkey")
        ),
        "{d}"
    );
    assert!(
        has(
            f,
            |x| matches!(x, Finding::HermesWithoutKey { llm, session_key_used: true } if llm == "open")
        ),
        "{d}"
    );
    assert!(
        !has(
            f,
            |x| matches!(x, Finding::HermesWithoutKey { llm, .. } if llm == "hermes")
        ),
        "{d}"
    );
    // Credentials.
    for ok in [
        "[carriers.twilio]",
        "[carriers.telnyx]",
        "[carriers.plivo]",
        "[stt.deepgram]",
        "[tts.elevenlabs]",
    ] {
        assert!(
            has(
                f,
                |x| matches!(x, Finding::CredentialsAccepted { service, .. } if service.starts_with(ok))
            ),
            "{ok}: {d}"
        );
    }
    for bad in ["[carriers.twbad]", "[stt.baddg]"] {
        assert!(
            has(
                f,
                |x| matches!(x, Finding::CredentialsRejected { service, status: 401 } if service.starts_with(bad))
            ),
            "{bad}: {d}"
        );
    }
    // The Twilio account body carries the auth token; it must not leak into any finding.
    assert!(!report.json().contains(AUTH_TOKEN) && !report.text().contains(AUTH_TOKEN));
    // public_url does not resolve.
    assert!(
        has(f, |x| matches!(x, Finding::PublicUrlUnresolved { .. })),
        "{d}"
    );
    // Numbers: all three carriers elsewhere, one not on the account.
    for (n, c) in [
        (ELSEWHERE, "twilio"),
        (TELNYX_NUMBER, "telnyx"),
        (PLIVO_NUMBER, "plivo"),
    ] {
        assert!(
            has(
                f,
                |x| matches!(x, Finding::WebhookPointsElsewhere { number, carrier, .. } if number == n && carrier == c)
            ),
            "{n}: {d}"
        );
    }
    assert!(
        has(
            f,
            |x| matches!(x, Finding::WebhookPointsElsewhere { now, .. } if now.contains("TwiML app AP"))
        ),
        "{d}"
    );
    assert!(
        has(
            f,
            |x| matches!(x, Finding::NumberNotOnAccount { number, .. } if number == UNKNOWN)
        ),
        "{d}"
    );
    assert!(
        has(
            f,
            |x| matches!(x, Finding::NumberNotOnAccount { number, carrier } if number == PLIVO_UNKNOWN && carrier == "plivo")
        ),
        "{d}"
    );
    // Allow-lists.
    assert!(
        has(
            f,
            |x| matches!(x, Finding::OutboundRefused { number } if number == PLIVO_NUMBER)
        ),
        "{d}"
    );
    assert!(
        has(
            f,
            |x| matches!(x, Finding::DestinationsUnbounded { number, .. } if number == TELNYX_NUMBER)
        ),
        "{d}"
    );
    assert_eq!(report.worst(), Level::Fail);
    // The fixes are on the lines.
    assert!(
        report
            .text()
            .contains(&format!("fix: run `patterd wire {ELSEWHERE}`"))
    );

    // Wired numbers then point here.
    let cfg = patterd::config::load(&path).expect("config").config;
    for n in [ELSEWHERE, TELNYX_NUMBER, PLIVO_NUMBER] {
        wire::wire(&cfg, w.dir.path(), n, false, false)
            .await
            .expect("wire");
    }
    let report = doctor::run(&path, Options::default()).await;
    let f = &report.findings;
    for n in [ELSEWHERE, TELNYX_NUMBER, PLIVO_NUMBER] {
        assert!(
            has(
                f,
                |x| matches!(x, Finding::WebhookPointsHere { number, .. } if number == n)
            ),
            "{n}: {}",
            dump(f)
        );
    }
}

#[tokio::test]
async fn doctor_offline_checks_only_the_file_and_a_broken_file_is_the_only_finding() {
    let w = World::start().await;
    let path = w.write(
        "offline.toml",
        &w.config("127.0.0.1:0", "http://doctor-test.invalid", ""),
    );
    let report = doctor::run(&path, Options { offline: true }).await;
    let f = &report.findings;
    assert!(
        has(f, |x| matches!(x, Finding::NetworkSkipped)),
        "{}",
        dump(f)
    );
    assert!(has(f, |x| matches!(x, Finding::OutboundRefused { .. })));
    assert!(
        !has(f, |x| matches!(
            x,
            Finding::CredentialsAccepted { .. }
                | Finding::HermesHealthy { .. }
                | Finding::PublicUrlUnresolved { .. }
        )),
        "{}",
        dump(f)
    );
    assert_eq!(w.twilio.requests().len(), 0, "--offline sent a request");
    assert_eq!(w.hermes.record().health_checks, 0);
    assert_ne!(report.worst(), Level::Fail);

    let broken = w.write("broken.toml", "[server]\nlisten = 8080\n");
    let report = doctor::run(&broken, Options::default()).await;
    assert!(
        matches!(report.findings.as_slice(), [Finding::ConfigInvalid { error }] if error.contains("listen")),
        "{}",
        dump(&report.findings)
    );
}

#[tokio::test]
async fn doctor_follows_public_url_to_this_daemon_or_says_where_it_goes() {
    let w = World::start().await;
    let fakes = Fakes::start(vec![]).await;
    let daemon = Daemon::start(&fakes.config_text());
    let us = daemon.url("");
    let here = daemon.addr.to_string();
    // An in-process server: another patterd instance.
    let other_dir = tempfile::tempdir().expect("tempdir");
    let mut other = patterd::config::Config::default();
    other.server.listen = "127.0.0.1:0".into();
    other.server.data_dir = other_dir.path().to_path_buf();
    let other = patterd::server::bind(other).await.expect("bind");
    let other_addr = other.local_addr.to_string();

    type Case = (&'static str, String, String, fn(&Finding) -> bool);
    let cases: Vec<Case> = vec![
        ("reaches", here.clone(), us.clone(), |x| {
            matches!(x, Finding::PublicUrlReachesDaemon { .. })
        }),
        ("other", other_addr.clone(), us.clone(), |x| {
            matches!(x, Finding::PublicUrlOtherDaemon { .. })
        }),
        ("unconfirmed", closed_port(), us.clone(), |x| {
            matches!(x, Finding::PublicUrlUnconfirmed { .. })
        }),
        (
            "not patterd",
            here.clone(),
            w.hermes.base_url().trim_end_matches("/v1").to_string(),
            |x| {
                // The fake Hermes answers its 401 to an unknown path.
                matches!(x, Finding::PublicUrlNotPatterd { status: 401, .. })
            },
        ),
        (
            "unreachable",
            here.clone(),
            format!("http://{}", closed_port()),
            |x| matches!(x, Finding::PublicUrlUnreachable { .. }),
        ),
    ];
    for (name, listen, public, want) in cases {
        let path = w.write(
            &format!("{}.toml", name.replace(' ', "_")),
            &w.config(&listen, &public, ""),
        );
        let report = doctor::run(&path, Options::default()).await;
        assert!(
            has(&report.findings, want),
            "{name}: {}",
            dump(&report.findings)
        );
    }
    // /healthz without a nonce is what it was; a bad nonce is not echoed.
    patterd::util::init_tls();
    let plain = reqwest::get(daemon.url("/healthz")).await.expect("healthz");
    assert_eq!(plain.status(), 200);
    assert!(plain.headers().get("x-patterd-nonce").is_none());
    assert_eq!(plain.text().await.expect("body"), "ok\n");
    let bad = reqwest::get(daemon.url("/healthz?nonce=a%0Db"))
        .await
        .expect("healthz");
    assert!(bad.headers().get("x-patterd-nonce").is_none());
}

/// Runs the binary off the runtime thread (the fakes it talks to run on this runtime).
async fn patterd(args: &[&str], config: &Path) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_patterd"));
    cmd.args(args)
        .arg("--config")
        .arg(config)
        .env_remove("PATTERD_CONFIG");
    tokio::task::spawn_blocking(move || cmd.output().expect("run patterd"))
        .await
        .expect("join")
}

#[tokio::test]
async fn doctor_command_prints_lines_or_json_and_exits_non_zero_on_a_failure() {
    let w = World::start().await;
    let failing = w.write(
        "fail.toml",
        &w.config("127.0.0.1:0", "http://doctor-test.invalid", ""),
    );
    let out = patterd(&["doctor", "--offline"], &failing).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.lines().any(|l| l.starts_with("OK   config")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("WARN") && l.contains("fix:")),
        "{text}"
    );

    let out = patterd(&["doctor", "--json"], &failing).await;
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ok"], false);
    let findings = v["findings"].as_array().expect("findings");
    assert!(findings.iter().any(|f| f["kind"] == "credentials_rejected"
        && f["level"] == "fail"
        && f["fix"].as_str().is_some_and(|s| !s.is_empty())));
    assert!(findings.iter().all(|f| f["message"].is_string()));
}

/// Wires `number` and checks the fake's state, then unwires and checks it is back.
async fn round_trip<S: PartialEq + std::fmt::Debug>(
    w: &World,
    number: &str,
    state: impl Fn() -> S,
    is_wired: impl Fn(&S) -> bool,
    writes: impl Fn() -> usize,
) {
    let path = w.write("wire.toml", &w.config("127.0.0.1:0", PUBLIC_URL, ""));
    let cfg = patterd::config::load(&path).expect("config").config;
    let before = state();
    let writes_before = writes();

    let WireOutcome::DryRun(plan) = wire::wire(&cfg, w.dir.path(), number, true, false)
        .await
        .expect("dry run")
    else {
        panic!("not a dry run");
    };
    assert!(!plan.is_empty());
    assert!(
        plan.iter().any(|r| r.body.contains("voice.example.test")),
        "{plan:?}"
    );
    assert_eq!(writes(), writes_before, "--dry-run wrote");
    assert_eq!(state(), before);

    let out = wire::wire(&cfg, w.dir.path(), number, false, false)
        .await
        .expect("wire");
    assert!(
        matches!(out, WireOutcome::Wired { sent, .. } if sent == plan.len()),
        "{out:?}"
    );
    let wired = state();
    assert!(is_wired(&wired), "{wired:?}");
    // Wiring again changes nothing and keeps the first record.
    assert_eq!(
        wire::wire(&cfg, w.dir.path(), number, false, false)
            .await
            .expect("again"),
        WireOutcome::AlreadyWired
    );

    let writes_now = writes();
    let WireOutcome::DryRun(restore) = wire::unwire(&cfg, w.dir.path(), number, true)
        .await
        .expect("unwire dry run")
    else {
        panic!("not a dry run");
    };
    assert!(!restore.is_empty());
    assert_eq!(writes(), writes_now, "unwire --dry-run wrote");

    let out = wire::unwire(&cfg, w.dir.path(), number, false)
        .await
        .expect("unwire");
    assert!(matches!(out, WireOutcome::Restored { .. }), "{out:?}");
    assert_eq!(state(), before, "unwire did not restore the exact settings");
    assert!(matches!(
        wire::unwire(&cfg, w.dir.path(), number, false).await,
        Err(wire::WireError::NotWired(_))
    ));
}

#[tokio::test]
async fn wire_and_unwire_restore_twilio_exactly() {
    let w = World::start().await;
    round_trip(
        &w,
        ELSEWHERE,
        || w.twilio.number(ELSEWHERE).expect("number"),
        |n| {
            n["voice_url"] == "https://voice.example.test/twilio/voice"
                && n["status_callback"] == "https://voice.example.test/twilio/status"
                && n["voice_method"] == "POST"
                && n["voice_application_sid"] == ""
        },
        || w.twilio.writes().len(),
    )
    .await;
}

#[tokio::test]
async fn wire_and_unwire_restore_telnyx_exactly() {
    let w = World::start().await;
    // An application on the older webhook API: wired it speaks version 2, unwired it is back
    // on 1 (part of the exact state compared).
    w.telnyx
        .set_app_field(TELNYX_APP, "webhook_api_version", serde_json::json!("1"));
    round_trip(
        &w,
        TELNYX_NUMBER,
        || {
            let a = w.telnyx.account();
            (a.numbers, a.apps)
        },
        |(numbers, apps)| {
            numbers[0]["connection_id"] == TELNYX_APP
                && apps.iter().any(|a| {
                    a["id"] == TELNYX_APP
                        && a["webhook_event_url"] == "https://voice.example.test/telnyx/webhook"
                        && a["application_name"] == "patterd-app"
                        && a["webhook_api_version"] == "2"
                })
        },
        || {
            w.telnyx
                .record()
                .admin
                .iter()
                .filter(|(m, _, _)| m != "GET")
                .count()
        },
    )
    .await;
}

#[tokio::test]
async fn wire_and_unwire_restore_plivo_exactly() {
    let w = World::start().await;
    round_trip(
        &w,
        PLIVO_NUMBER,
        || w.plivo.account().apps,
        |apps| {
            apps[0]["answer_url"] == "https://voice.example.test/plivo/answer"
                && apps[0]["hangup_url"] == "https://voice.example.test/plivo/hangup"
                && apps[0]["answer_method"] == "POST"
        },
        || w.plivo.writes().len(),
    )
    .await;
}

#[tokio::test]
async fn wire_refuses_what_it_cannot_restore() {
    let w = World::start().await;
    w.twilio.add_number(
        "+15550004444",
        &[("trunk_sid", "TK00000000000000000000000000000001")],
    );
    w.plivo.add_number("15550005555", "");
    let extra = r#"
[[numbers]]
number = "+15550004444"
carrier = "twilio"
agent = "a"

[[numbers]]
number = "+15550005555"
carrier = "plivo"
agent = "a"
"#;
    let path = w.write("refuse.toml", &w.config("127.0.0.1:0", PUBLIC_URL, extra));
    let cfg = patterd::config::load(&path).expect("config").config;
    let trunk = wire::wire(&cfg, w.dir.path(), "+15550004444", false, false).await;
    assert!(
        matches!(&trunk, Err(e) if e.to_string().contains("SIP trunk")),
        "{trunk:?}"
    );
    let no_app = wire::wire(&cfg, w.dir.path(), "+15550005555", false, false).await;
    assert!(
        matches!(&no_app, Err(e) if e.to_string().contains("no application")),
        "{no_app:?}"
    );
    assert!(matches!(
        wire::wire(&cfg, w.dir.path(), "+15550006666", false, false).await,
        Err(wire::WireError::NotConfigured(_))
    ));
    assert!(w.twilio.writes().is_empty() && w.plivo.writes().is_empty());
}

/// A number on a Telnyx or Plivo application that routes numbers patterd does not serve: the
/// wire lists them (masked) and is refused without `--force`, writing nothing; `--force`
/// wires it, and the unwire restores the application exactly.
#[tokio::test]
async fn wire_refuses_a_shared_application_without_force() {
    let w = World::start().await;
    // Someone else's numbers on the applications the wires would rewrite.
    w.telnyx.add_number("+15550007001", TELNYX_APP);
    w.plivo.add_number("15550007002", PLIVO_APP);
    w.plivo.add_number("15550007003", PLIVO_APP);
    let path = w.write("shared.toml", &w.config("127.0.0.1:0", PUBLIC_URL, ""));
    let cfg = patterd::config::load(&path).expect("config").config;
    let telnyx_before = w.telnyx.account();
    let plivo_before = w.plivo.account();
    for (number, others) in [
        (TELNYX_NUMBER, vec!["+1555***7001"]),
        (PLIVO_NUMBER, vec!["+1555***7002", "+1555***7003"]),
    ] {
        for dry_run in [true, false] {
            let err = wire::wire(&cfg, w.dir.path(), number, dry_run, false)
                .await
                .expect_err("refused without --force");
            let text = err.to_string();
            assert!(
                matches!(&err, wire::WireError::SharedApp { count, .. } if *count == others.len()),
                "{text}"
            );
            for o in &others {
                assert!(text.contains(o), "{text}");
            }
            assert!(text.contains("--force"), "{text}");
            assert!(
                !text.contains("7001") || text.contains("***7001"),
                "masked: {text}"
            );
        }
    }
    assert!(w.plivo.writes().is_empty(), "nothing written");
    assert_eq!(w.telnyx.account().apps, telnyx_before.apps);
    for number in [TELNYX_NUMBER, PLIVO_NUMBER] {
        let out = wire::wire(&cfg, w.dir.path(), number, false, true)
            .await
            .expect("--force wires");
        assert!(matches!(out, WireOutcome::Wired { .. }), "{out:?}");
        let out = wire::unwire(&cfg, w.dir.path(), number, false)
            .await
            .expect("unwire");
        assert!(matches!(out, WireOutcome::Restored { .. }), "{out:?}");
    }
    let after = w.telnyx.account();
    assert_eq!(
        (after.numbers, after.apps),
        (telnyx_before.numbers, telnyx_before.apps)
    );
    assert_eq!(w.plivo.account().apps, plivo_before.apps);
}

/// Two of patterd's numbers on one application: the second wire keeps the application's
/// original record, the first unwire leaves the application to the number still wired, and
/// the last unwire restores it as it was before the first wire (not as the second wire found
/// it).
#[tokio::test]
async fn two_numbers_on_one_application_keep_one_restore_record() {
    let w = World::start().await;
    const SECOND_PLIVO: &str = "+15550003001";
    const SECOND_TELNYX: &str = "+15550002001";
    w.plivo
        .add_number(SECOND_PLIVO.trim_start_matches('+'), PLIVO_APP);
    w.telnyx.add_number(SECOND_TELNYX, "1000000000000000009");
    w.telnyx
        .set_app_field(TELNYX_APP, "webhook_api_version", serde_json::json!("1"));
    let extra = format!(
        r#"
[[numbers]]
number = "{SECOND_PLIVO}"
carrier = "plivo"
agent = "a"

[[numbers]]
number = "{SECOND_TELNYX}"
carrier = "telnyx"
agent = "a"
"#
    );
    let path = w.write("two.toml", &w.config("127.0.0.1:0", PUBLIC_URL, &extra));
    let cfg = patterd::config::load(&path).expect("config").config;
    let plivo_before = w.plivo.account().apps;
    let telnyx_before = w.telnyx.account();
    let plivo_answer = "https://voice.example.test/plivo/answer";
    let telnyx_hook = "https://voice.example.test/telnyx/webhook";
    for (first, second) in [(PLIVO_NUMBER, SECOND_PLIVO), (TELNYX_NUMBER, SECOND_TELNYX)] {
        // The other number is patterd's own ([[numbers]]): no refusal.
        for n in [first, second] {
            let out = wire::wire(&cfg, w.dir.path(), n, false, false)
                .await
                .expect("wire");
            assert!(matches!(out, WireOutcome::Wired { .. }), "{n}: {out:?}");
        }
        // The first unwire: the second number still reaches patterd.
        wire::unwire(&cfg, w.dir.path(), first, false)
            .await
            .expect("unwire the first");
    }
    let app = &w.plivo.account().apps[0];
    assert_eq!(
        app["answer_url"], plivo_answer,
        "the second number still wired"
    );
    let t = w.telnyx.account();
    let ours = t.apps.iter().find(|a| a["id"] == TELNYX_APP).expect("ours");
    assert_eq!(ours["webhook_event_url"], telnyx_hook);
    let second = t
        .numbers
        .iter()
        .find(|n| n["phone_number"] == SECOND_TELNYX)
        .expect("second");
    assert_eq!(second["connection_id"], TELNYX_APP);
    // The last unwire: the application as before the first wire.
    for second in [SECOND_PLIVO, SECOND_TELNYX] {
        wire::unwire(&cfg, w.dir.path(), second, false)
            .await
            .expect("unwire the second");
    }
    assert_eq!(w.plivo.account().apps, plivo_before);
    let after = w.telnyx.account();
    assert_eq!(
        after.apps, telnyx_before.apps,
        "webhook and API version as saved"
    );
    assert_eq!(after.numbers, telnyx_before.numbers);
}
