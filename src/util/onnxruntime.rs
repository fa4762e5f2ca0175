//! onnxruntime, loaded once per process from the operator's `libonnxruntime.so` (`ort` with
//! `load-dynamic`: nothing is linked or downloaded at build time). Every model patterd runs on
//! it (Smart Turn under feature `smart_turn`, Piper voices under feature `piper`) shares the one
//! library and its [`Environment`]: the first path loaded wins, and a second, different path is
//! refused rather than silently ignored.

use std::path::Path;
use std::sync::OnceLock;

use ort::environment::Environment;

/// The library could not be loaded, or another one already was.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OnnxRuntimeError {
    #[error("cannot load onnxruntime from {path}: {message}")]
    Load { path: String, message: String },
    #[error("onnxruntime was loaded from {loaded}, not {path}: one library per process")]
    OtherLibrary { path: String, loaded: String },
}

/// The library loaded into this process and its environment.
static LOADED: OnceLock<Result<(String, Environment), String>> = OnceLock::new();

/// The process's onnxruntime environment, loading the library at `path` on first use.
pub fn environment(path: &Path) -> Result<&'static Environment, OnnxRuntimeError> {
    let shown = path.display().to_string();
    let loaded = LOADED.get_or_init(|| {
        let env = ort::init_from(path)
            .map_err(|e| e.to_string())?
            .with_name("patterd")
            .build()
            .map_err(|e| e.to_string())?;
        Ok((shown.clone(), env))
    });
    match loaded {
        Ok((p, env)) if *p == shown => Ok(env),
        Ok((p, _)) => Err(OnnxRuntimeError::OtherLibrary {
            path: shown,
            loaded: p.clone(),
        }),
        Err(message) => Err(OnnxRuntimeError::Load {
            path: shown,
            message: message.clone(),
        }),
    }
}
