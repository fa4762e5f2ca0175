//! The `patterd` binary: parses the command line and runs the daemon or a subcommand. All the
//! work is in the library crate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use patterd::cli::{Cli, Command};
use patterd::config;

fn load(path: Option<&Path>) -> Result<config::LoadedConfig, String> {
    let path = path.ok_or_else(|| {
        "no configuration file given: pass --config FILE (start from config/patter.toml)"
            .to_string()
    })?;
    config::load(path).map_err(|e| e.to_string())
}

/// The multi-threaded async runtime (`worker_threads` threads, else one a core), or `None`
/// after saying why it cannot start.
fn runtime(worker_threads: Option<usize>) -> Option<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    match builder.enable_all().build() {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            None
        }
    }
}

/// `patterd wire` / `unwire`.
fn wire(config: Option<&Path>, number: &str, dry_run: bool, force: bool, unwire: bool) -> ExitCode {
    use patterd::ops::wire::{self, WireOutcome};
    let loaded = match load(config) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(runtime) = runtime(Some(2)) else {
        return ExitCode::from(1);
    };
    let cfg = &loaded.config;
    let data_dir = cfg.server.data_dir.clone();
    let result = runtime.block_on(async {
        if unwire {
            wire::unwire(cfg, &data_dir, number, dry_run).await
        } else {
            wire::wire(cfg, &data_dir, number, dry_run, force).await
        }
    });
    let masked = patterd::security::mask_number(number);
    match result {
        Ok(WireOutcome::DryRun(plan)) => {
            println!("dry run: {} request(s) would be sent:", plan.len());
            for r in plan {
                println!("{r}");
            }
            ExitCode::SUCCESS
        }
        Ok(WireOutcome::Wired { before, sent }) => {
            println!(
                "wired {masked} to {} ({sent} request(s)); saved its previous settings ({before}) \
                 for `patterd unwire`",
                cfg.server.public_url
            );
            ExitCode::SUCCESS
        }
        Ok(WireOutcome::AlreadyWired) => {
            println!("{masked} already points at {}", cfg.server.public_url);
            ExitCode::SUCCESS
        }
        Ok(WireOutcome::Restored { sent }) => {
            println!("restored {masked}'s previous settings ({sent} request(s))");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The `patterd phone-link` URL for `config`: `public_url` + `/phone?link=…`, bound to
/// `agent` or, when none is named, to the browser phone's default agent (the `agent` of a
/// `kind = "web"` carrier section, else the first `[agents.*]`), valid for `ttl_s` seconds
/// (1 to 24 h).
fn phone_link(
    config: &patterd::config::Config,
    agent: Option<&str>,
    ttl_s: u64,
) -> Result<String, String> {
    use patterd::security::link::{MAX_TTL_S, PhoneLinks, unix_now};
    if ttl_s == 0 || ttl_s > MAX_TTL_S {
        return Err(format!(
            "--ttl {ttl_s} is out of range: a phone link lives 1 to {MAX_TTL_S} seconds (24 h); \
             make a new link when it expires"
        ));
    }
    let web_default = config.carriers.values().find_map(|c| match c {
        patterd::carrier::CarrierConfig::Web(w) => w.agent.as_deref(),
        _ => None,
    });
    let agent = agent
        .or(web_default)
        .or_else(|| config.agents.keys().next().map(String::as_str))
        .ok_or("no [agents.*] is configured, so a phone link has nobody to call")?;
    if !config.agents.contains_key(agent) {
        let names: Vec<&str> = config.agents.keys().map(String::as_str).collect();
        return Err(format!(
            "no agent named {agent:?} in the configuration (configured: {})",
            names.join(", ")
        ));
    }
    let links = PhoneLinks::from_secret(config.server.api_token.expose()).ok_or_else(|| {
        "server.api_token is not set, so the daemon is local-only and needs no link: open \
         /phone on this machine (e.g. http://127.0.0.1:8080/phone), or set server.api_token"
            .to_string()
    })?;
    let (link, _) = links.mint(agent, unix_now().saturating_add(ttl_s));
    let page = patterd::carrier::public_request_url(&config.server.public_url, "/phone", None);
    Ok(format!("{page}?link={link}"))
}

/// `patterd try`: runs the trial call and prints what happened.
async fn try_call(
    loaded: config::LoadedConfig,
    agent: Option<String>,
    caller: patterd::app::trial::CallerAudio,
    out: Option<&Path>,
    timeout: u64,
) -> Result<(), String> {
    use patterd::call::{EventKind, Speaker};
    let app = patterd::app::App::new(loaded.config).map_err(|e| e.to_string())?;
    let trial = patterd::app::trial::run(
        &app,
        agent.as_deref(),
        caller,
        std::time::Duration::from_secs(timeout),
    )
    .await
    .map_err(|e| e.to_string())?;
    let _ = app.store.tx.flush().await;
    let rec = &trial.record;
    println!(
        "call {} (agent {}), ended: {}",
        rec.call_id, rec.agent, rec.ended_reason
    );
    println!("transcript:");
    for e in &rec.transcript {
        let who = match e.speaker {
            Speaker::Caller => "caller",
            Speaker::Agent => "agent ",
        };
        let heard = if e.speaker == Speaker::Agent && e.heard_text != e.text {
            format!("   [heard: {}]", e.heard_text)
        } else {
            String::new()
        };
        println!("  {who} {}{heard}", e.text);
    }
    println!("timings (ms since the call started):");
    println!("  caller audio       {} ms", trial.caller_audio_ms);
    let at = |k: EventKind| rec.events_of(k).next();
    for (k, label) in [
        (EventKind::SttConnected, "stt connected     "),
        (EventKind::SpeechStart, "caller speech start"),
        (EventKind::SpeechEnd, "caller speech end "),
        (EventKind::TurnEnd, "turn end          "),
        (EventKind::LlmRequest, "brain request     "),
        (EventKind::LlmDone, "brain done        "),
    ] {
        if let Some(e) = at(k) {
            println!("  {label} {:>6} {}", e.t_ms, e.detail);
        }
    }
    if let Some(e) = at(EventKind::GreetingFirstFrame) {
        println!(
            "  greeting first audio {} ms after the stream started",
            e.detail.parse::<u64>().unwrap_or(0) / 1000
        );
    }
    for e in rec.events_of(EventKind::ReplyFirstFrame) {
        println!(
            "  reply first audio  {} ms after the turn ended",
            e.detail.parse::<u64>().unwrap_or(0) / 1000
        );
    }
    for k in [
        EventKind::LlmError,
        EventKind::TtsError,
        EventKind::SttError,
    ] {
        for e in rec.events_of(k) {
            println!("  {} {}", k.as_str(), e.detail);
        }
    }
    let secs = trial.agent_audio.len() as f64 / 8000.0;
    match out {
        Some(path) => {
            std::fs::write(path, patterd::audio::wav::ulaw_to_wav(&trial.agent_audio))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("wrote {} ({secs:.2} s of agent audio)", path.display());
        }
        None => println!("agent audio: {secs:.2} s (pass --out FILE.wav to keep it)"),
    }
    Ok(())
}

/// `patterd check`: the effective configuration, its warnings, and whether it is valid.
fn check_cmd(config: Option<&Path>, strict: bool) -> ExitCode {
    match load(config) {
        Ok(loaded) => {
            print!("{}", config::render_effective(&loaded.config));
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            if strict && !loaded.warnings.is_empty() {
                eprintln!(
                    "error: {} warning(s) and --strict was given",
                    loaded.warnings.len()
                );
                return ExitCode::from(1);
            }
            eprintln!("configuration is valid");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `patterd doctor`: the checks that reach the outside world.
fn doctor_cmd(config: Option<&Path>, offline: bool, json: bool) -> ExitCode {
    let Some(path) = config else {
        eprintln!("error: pass --config FILE");
        return ExitCode::from(2);
    };
    let Some(runtime) = runtime(Some(2)) else {
        return ExitCode::from(1);
    };
    let opts = patterd::ops::doctor::Options { offline };
    let report = runtime.block_on(patterd::ops::doctor::run(path, opts));
    if json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    if report.worst() == patterd::ops::doctor::Level::Fail {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `patterd mcp --stdio`: MCP over stdio, bridged to a running daemon's REST API.
fn mcp_cmd(
    config: Option<&Path>,
    stdio: bool,
    url: Option<String>,
    token: Option<String>,
) -> ExitCode {
    if !stdio {
        eprintln!("error: pass --stdio (the daemon itself serves MCP over HTTP at /mcp)");
        return ExitCode::from(2);
    }
    let loaded = match (&url, config) {
        (Some(_), None) => None,
        (_, path) => match load(path) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("error: {e} (or pass --url and --token)");
                return ExitCode::from(1);
            }
        },
    };
    let base = url.unwrap_or_else(|| {
        let listen = loaded
            .as_ref()
            .map(|l| l.config.server.listen.clone())
            .unwrap_or_default();
        let listen = listen
            .replace("0.0.0.0:", "127.0.0.1:")
            .replace("[::]:", "[::1]:");
        format!("http://{listen}")
    });
    let token = token.unwrap_or_else(|| {
        loaded
            .as_ref()
            .map(|l| l.config.server.api_token.expose().to_string())
            .unwrap_or_default()
    });
    let Some(runtime) = runtime(Some(2)) else {
        return ExitCode::from(1);
    };
    match runtime.block_on(patterd::mcp::stdio::run(&base, &token)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `patterd healthcheck`: probes a running daemon's `/healthz`.
fn healthcheck_cmd(config: Option<&Path>, url: Option<String>, timeout: u64) -> ExitCode {
    let base = match url {
        Some(u) => u,
        None => match load(config) {
            Ok(l) if l.config.server.tls.is_some() => {
                eprintln!(
                    "error: server.tls is set and healthcheck speaks plain HTTP only; \
                     probe https://…/healthz with your orchestrator instead"
                );
                return ExitCode::from(1);
            }
            Ok(l) => patterd::ops::health_probe::target(&l.config.server.listen),
            Err(e) => {
                eprintln!("error: {e} (or pass --url)");
                return ExitCode::from(1);
            }
        },
    };
    let timeout = std::time::Duration::from_secs(timeout.max(1));
    match patterd::ops::health_probe::probe(&base, timeout) {
        Ok(()) => {
            println!("healthy: {base}/healthz answered 200");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("unhealthy: {e}");
            ExitCode::from(1)
        }
    }
}

/// `patterd try`: one call through the configured providers, no carrier.
fn try_cmd(
    config: Option<&Path>,
    agent: Option<String>,
    caller: (Option<String>, Option<PathBuf>),
    out: Option<PathBuf>,
    timeout: u64,
) -> ExitCode {
    let (say, wav) = caller;
    let loaded = match load(config) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let caller = match (say, wav) {
        (Some(text), _) => patterd::app::trial::CallerAudio::Say(text),
        (None, Some(path)) => match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| patterd::audio::wav::read_ulaw_8k(&b).map_err(|e| e.to_string()))
        {
            Ok(a) => patterd::app::trial::CallerAudio::Ulaw(a),
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                return ExitCode::from(1);
            }
        },
        (None, None) => {
            eprintln!("error: pass --say TEXT or --wav FILE");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = runtime(Some(2)) else {
        return ExitCode::from(1);
    };
    match runtime.block_on(try_call(loaded, agent, caller, out.as_deref(), timeout)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `patterd run` (the default): the daemon.
fn run_cmd(config: Option<PathBuf>) -> ExitCode {
    let loaded = match load(config.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    patterd::logging::init(&loaded.config.log);
    let Some(runtime) = runtime(None) else {
        return ExitCode::from(1);
    };
    let code = runtime.block_on(patterd::server::run(loaded, config));
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `--token` on the command line is visible to every user of the machine (`ps`, /proc).
    let token_in_argv = matches
        .subcommand_matches("mcp")
        .and_then(|m| m.value_source("token"))
        == Some(clap::parser::ValueSource::CommandLine);
    match cli.command.as_ref().cloned().unwrap_or(Command::Run) {
        Command::Check { strict } => check_cmd(cli.config.as_deref(), strict),
        Command::Doctor { offline, json } => doctor_cmd(cli.config.as_deref(), offline, json),
        Command::Wire {
            ref number,
            dry_run,
            force,
        } => wire(cli.config.as_deref(), number, dry_run, force, false),
        Command::Unwire {
            ref number,
            dry_run,
        } => wire(cli.config.as_deref(), number, dry_run, false, true),
        Command::Mcp { stdio, url, token } => {
            if token_in_argv {
                eprintln!(
                    "warning: --token is visible to every user of this machine (ps, \
                     /proc/PID/cmdline); pass the token in the environment variable \
                     PATTERD_API_TOKEN instead, or let patterd read server.api_token from \
                     --config"
                );
            }
            mcp_cmd(cli.config.as_deref(), stdio, url, token)
        }
        Command::Healthcheck { url, timeout } => {
            healthcheck_cmd(cli.config.as_deref(), url, timeout)
        }
        Command::Try {
            agent,
            say,
            wav,
            out,
            timeout,
        } => try_cmd(cli.config.as_deref(), agent, (say, wav), out, timeout),
        Command::PhoneLink { agent, ttl } => match load(cli.config.as_deref())
            .and_then(|l| phone_link(&l.config, agent.as_deref(), ttl))
        {
            Ok(url) => {
                println!("{url}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Run => run_cmd(cli.config.clone()),
    }
}
