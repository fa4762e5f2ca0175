//! The command line (clap): `patterd --config FILE` (same as `patterd run --config FILE`) runs
//! the daemon; `patterd check --config FILE` validates the configuration and prints it with
//! secrets redacted; `patterd mcp --stdio` serves the MCP tools on stdin/stdout against the
//! running daemon; `patterd doctor` checks an installation; `patterd wire` / `unwire` point a
//! number at the daemon and back; `patterd phone-link` prints a link to the browser phone. The
//! `--help` text is the short manual; nothing here touches sockets.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

const ABOUT: &str = "patterd gives an AI agent a phone line.";

const LONG_ABOUT: &str = "\
patterd gives an AI agent a phone line.

It answers Twilio, Telnyx and Plivo webhooks, terminates their media WebSockets, and runs one
actor per call that streams the caller's audio to speech-to-text, decides when the caller's turn
has ended (voice activity plus the transcript), sends each finished turn to the agent's brain (a
Hermes Agent or any OpenAI-compatible server) and speaks the streamed reply through
text-to-speech, letting the caller interrupt. It also places outbound calls, keeps every call's
transcript and events in SQLite (server.data_dir), and exposes all of it to agents through a REST
API (/v1) and MCP (/mcp on the same listener, or `patterd mcp --stdio`).

Everything is configured in one TOML file. Start from the documented example:

    patterd check --config config/patter.toml     # validate, print with secrets as ***
    patterd --config config/patter.toml           # run the daemon
    patterd doctor --config config/patter.toml    # check credentials, public_url, numbers
    patterd wire +14155550100 --config …          # point the number at public_url

Values may reference the environment: ${VAR} (required) or ${VAR:-default} (optional), and any
key can be overridden with PATTERD_<SECTION>__<KEY>, e.g. PATTERD_SERVER__LISTEN=0.0.0.0:8080.
A carrier or provider without credentials is a warning and its routes answer 503.

Signals: SIGTERM or SIGINT drains (readiness goes 503, new calls are refused as busy, live calls
run on for up to server.drain_timeout_s) and exits 0; a second signal exits at once. SIGHUP
re-reads the file for new calls (live calls keep theirs; an invalid file is refused and logged;
[server], [log], [store] and [carriers.*] need a restart). Under systemd (Type=notify) it sends
READY=1, WATCHDOG=1 and STOPPING=1.

Documentation: README.md and docs/ (operations.md, configuration.md, api.md, ARCHITECTURE.md)
in the source tree.";

#[derive(Debug, Parser)]
#[command(name = "patterd", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// The configuration file (TOML).
    #[arg(
        long,
        short,
        global = true,
        env = "PATTERD_CONFIG",
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the daemon (the default when no command is given).
    Run,
    /// Validate the configuration and print the effective configuration, secrets as ***.
    ///
    /// Exits 0 when the configuration is valid (warnings, such as a carrier without
    /// credentials, are printed to stderr), 1 when it is not.
    Check {
        /// Treat warnings (unconfigured carriers or providers) as errors.
        #[arg(long)]
        strict: bool,
    },
    /// Check this installation: config, brains, credentials, public_url, numbers, allow-lists.
    ///
    /// Prints one line per finding, OK / WARN / FAIL with the fix, and exits 1 when anything
    /// FAILs. Network checks make one cheap read-only request per service; --offline skips them.
    Doctor {
        /// Skip the network checks (config and allow-lists only).
        #[arg(long)]
        offline: bool,
        /// Print the findings as JSON ({"ok": bool, "findings": [...]}).
        #[arg(long)]
        json: bool,
    },
    /// Point NUMBER's voice webhook at server.public_url through its carrier's REST API.
    ///
    /// NUMBER must be in [[numbers]]. Its current settings are saved in the store first, so
    /// `patterd unwire NUMBER` restores exactly them.
    ///
    /// On Telnyx and Plivo the number's calls go through an application other numbers may
    /// share; when it routes numbers patterd did not wire, they are listed and the wire is
    /// refused unless --force.
    Wire {
        /// The number, E.164 (e.g. +14155550100).
        number: String,
        /// Read the number, print the requests that would change it, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Rewrite the number's application even when other numbers use it (their calls come
        /// to patterd too; `unwire` of the last wired number puts it back).
        #[arg(long)]
        force: bool,
    },
    /// Restore the voice webhook settings NUMBER had before `patterd wire`.
    Unwire {
        /// The number, E.164.
        number: String,
        /// Print the requests that would restore it, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Serve the MCP tools on stdin/stdout, talking to the running daemon's REST API.
    ///
    /// For agents that spawn their MCP servers (Hermes `mcp_servers` with `command`/`args`).
    /// The daemon must be running; its URL and token come from --url and PATTERD_API_TOKEN
    /// (or --token, visible in `ps`), else from the configuration (server.listen,
    /// server.api_token).
    Mcp {
        /// Speak MCP over stdin/stdout (the only transport of this subcommand; the daemon
        /// itself serves Streamable HTTP at /mcp).
        #[arg(long)]
        stdio: bool,
        /// The daemon's base URL, e.g. http://127.0.0.1:8080.
        #[arg(long, env = "PATTERD_URL")]
        url: Option<String>,
        /// The daemon's API token (server.api_token, or a [[server.api_tokens]] entry).
        /// Prefer the environment variable PATTERD_API_TOKEN: a token on the command line
        /// is visible to every user of the machine in `ps` (patterd warns).
        #[arg(long, env = "PATTERD_API_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// One call through the whole pipeline with the configured providers and no carrier.
    ///
    /// The caller's audio is --say TEXT (spoken by the agent's own TTS) or --wav FILE (8 kHz
    /// mono, 16-bit PCM or μ-law); it is sent after the greeting, the agent answers, and once
    /// it has gone quiet the call ends. Prints the transcript and per-stage timings; --out
    /// writes everything the agent said as a WAV (16-bit PCM, 8 kHz). The call is stored like
    /// any other (carrier `web`, account `try`).
    Try {
        /// The agent to call (default: the first [agents.*]).
        #[arg(long)]
        agent: Option<String>,
        /// What the caller says (synthesised by the agent's TTS).
        #[arg(long, conflicts_with = "wav", required_unless_present = "wav")]
        say: Option<String>,
        /// A recording of the caller (8 kHz mono WAV).
        #[arg(long)]
        wav: Option<PathBuf>,
        /// Where to write the agent's audio (WAV).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Print a short-lived, single-use link that opens the browser phone (/phone).
    ///
    /// The link is signed with a key derived from server.api_token (the daemon checks it
    /// with the same key), expires after --ttl seconds and opens exactly one call, to one
    /// agent. Without an api_token the daemon is local-only: open
    /// http://127.0.0.1:PORT/phone instead.
    PhoneLink {
        /// The agent the link calls (default: the browser phone's default agent — the
        /// `agent` of a `kind = "web"` carrier section, else the first [agents.*]).
        #[arg(long)]
        agent: Option<String>,
        /// Seconds until the link expires (at most 86400, 24 h).
        #[arg(long, default_value_t = 600)]
        ttl: u64,
    },
    /// Probe the running daemon's `/healthz`: exit 0 when it answers 200, 1 otherwise.
    ///
    /// For container HEALTHCHECKs and supervisors (no curl needed). The address is --url, else
    /// server.listen from the configuration (0.0.0.0 is asked on 127.0.0.1). Plain HTTP only.
    Healthcheck {
        /// The daemon's base URL, e.g. http://127.0.0.1:8080.
        #[arg(long)]
        url: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3, value_name = "SECONDS")]
        timeout: u64,
    },
}
