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

/// `patterd wire` / `unwire`.
fn wire(config: Option<&Path>, number: &str, dry_run: bool, unwire: bool) -> ExitCode {
    use patterd::ops::wire::{self, Outcome};
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
            wire::wire(cfg, &data_dir, number, dry_run).await
        }
    });
    let masked = patterd::security::mask_number(number);
    match result {
        Ok(Outcome::DryRun(plan)) => {
            println!("dry run: {} request(s) would be sent:", plan.len());
            for r in plan {
                println!("{r}");
            }
            ExitCode::SUCCESS
        }
        Ok(Outcome::Wired { before, sent }) => {
            println!(
                "wired {masked} to {} ({sent} request(s)); saved its previous settings ({before}) \
                 for `patterd unwire`",
                cfg.server.public_url
            );
            ExitCode::SUCCESS
        }
        Ok(Outcome::AlreadyWired) => {
            println!("{masked} already points at {}", cfg.server.public_url);
            ExitCode::SUCCESS
        }
        Ok(Outcome::Restored { sent }) => {
            println!("restored {masked}'s previous settings ({sent} request(s))");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.as_ref().cloned().unwrap_or(Command::Run) {
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
        Command::Doctor { offline, json } => {
            let Some(path) = cli.config.as_deref() else {
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
        Command::Wire {
            ref number,
            dry_run,
        }
        | Command::Unwire {
            ref number,
            dry_run,
        } => {
            let unwire = matches!(cli.command, Some(Command::Unwire { .. }));
            wire(cli.config.as_deref(), number, dry_run, unwire)
        }
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
            let path = cli.config.clone();
            let code = runtime.block_on(patterd::server::run(loaded, path));
            runtime.shutdown_timeout(std::time::Duration::from_millis(500));
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    }
}
