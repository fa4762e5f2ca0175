//! Checks that the code obeys the "Layers" section of `docs/ARCHITECTURE.md`: every
//! `crate::<module>` path outside comments in a top-level module names a module it may import.
//! A new import across layers fails this test until the table (and the doc) say it is allowed.

use std::collections::BTreeSet;
use std::path::Path;

/// Which top-level modules each top-level module may import (the doc's table).
const ALLOWED: &[(&str, &[&str])] = &[
    ("cli", &[]),
    ("logging", &["config", "security", "util"]),
    (
        "server",
        &["mcp", "api", "app", "carrier", "config", "net", "util"],
    ),
    ("mcp", &["api", "app", "config", "store", "net", "util"]),
    // `api` names the action contract of a live call (`call::action`) it hands to the actor.
    // Operator commands (doctor, wire): the config, the carriers' number administration
    // and the store's wiring records; never the daemon's live state.
    (
        "ops",
        &["carrier", "provider", "config", "store", "security", "util"],
    ),
    (
        "api",
        &[
            "app", "call", "carrier", "config", "store", "security", "util",
        ],
    ),
    (
        "app",
        &[
            "tools", "call", "store", "provider", "config", "carrier", "security", "net", "util",
        ],
    ),
    // Tools run on a call's behalf: actions through `call`, consults through `provider`.
    (
        "tools",
        &["call", "provider", "config", "security", "net", "util"],
    ),
    // `call` reports through its own `CallLog` port; the store implements it.
    (
        "call",
        &[
            "provider", "config", "carrier", "audio", "security", "net", "util",
        ],
    ),
    ("store", &["call", "config", "carrier", "util"]),
    ("provider", &["config", "audio", "net", "util"]),
    ("config", &["carrier", "net", "util"]),
    ("carrier", &["audio", "net", "security", "util"]),
    ("audio", &["util"]),
    ("net", &["util"]),
    ("security", &["util"]),
    ("util", &[]),
    // Test support (simulators, load generator): never the daemon's state.
    ("sim", &["carrier", "audio", "net", "security", "util"]),
    (
        "loadgen",
        &["sim", "carrier", "audio", "net", "security", "util"],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn modules_import_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap_or(&file);
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("")
            .trim_end_matches(".rs")
            .to_string();
        if matches!(top.as_str(), "lib" | "main" | "bin" | "layers") {
            continue;
        }
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| *m == top) else {
            violations.insert(format!("{top}: not in the layer table"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for part in code.split("crate::").skip(1) {
                let module: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !module.is_empty() && module != top && !allowed.contains(&module.as_str()) {
                    violations.insert(format!(
                        "{}:{}: {top} imports {module}",
                        rel.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the layers of docs/ARCHITECTURE.md:\n{}",
        violations.into_iter().collect::<Vec<_>>().join("\n")
    );
}
