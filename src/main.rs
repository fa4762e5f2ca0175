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
        Command::Run => {
            let loaded = match load(cli.config.as_deref()) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
            };
            patterd::logging::init(&loaded.config.log);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            let code = runtime.block_on(patterd::server::run(loaded));
            runtime.shutdown_timeout(std::time::Duration::from_millis(500));
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    }
}
