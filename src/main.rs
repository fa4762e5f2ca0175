//! The `patterd` binary: parses the command line and runs the daemon or a subcommand. All the
//! work is in the library crate.

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Check { strict } => match load(cli.config.as_deref()) {
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
        },
        Command::Mcp { stdio, url, token } => {
            if !stdio {
                eprintln!("error: pass --stdio (the daemon itself serves MCP over HTTP at /mcp)");
                return ExitCode::from(2);
            }
            let loaded = match (&url, cli.config.as_deref()) {
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
        Command::Healthcheck { url, timeout } => {
            let base = match url {
                Some(u) => u,
                None => match load(cli.config.as_deref()) {
                    Ok(l) if l.config.server.tls.is_some() => {
                        eprintln!(
                            "error: server.tls is set and healthcheck speaks plain HTTP only; \
                             probe https://…/healthz with your orchestrator instead"
                        );
                        return ExitCode::from(1);
                    }
                    Ok(l) => patterd::server::healthcheck::target(&l.config.server.listen),
                    Err(e) => {
                        eprintln!("error: {e} (or pass --url)");
                        return ExitCode::from(1);
                    }
                },
            };
            let timeout = std::time::Duration::from_secs(timeout.max(1));
            match patterd::server::healthcheck::probe(&base, timeout) {
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
        Command::Run => {
            let loaded = match load(cli.config.as_deref()) {
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
            let code = runtime.block_on(patterd::server::run(loaded));
            runtime.shutdown_timeout(std::time::Duration::from_millis(500));
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    }
}
