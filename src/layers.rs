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
    // `mcp` makes its live-call tools from the action descriptors (`call::action`).
    (
        "mcp",
        &["api", "app", "call", "config", "store", "net", "util"],
    ),
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
    // The sim's tests build the daemon's own multipart upload to check the fake against it.
    (
        "sim",
        &["carrier", "provider", "audio", "net", "security", "util"],
    ),
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

/// The modules a line of code names through `prefix` (`crate::` inside the daemon,
/// `patterd::` in the workspace's other crates), outside comments.
fn named_modules<'a>(line: &'a str, prefix: &'a str) -> impl Iterator<Item = String> + 'a {
    let code = line.split("//").next().unwrap_or("");
    code.split(prefix).skip(1).filter_map(|part| {
        let module: String = part
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        (!module.is_empty()).then_some(module)
    })
}

/// Checks every file under `dir` as module `top` (or, for `None`, as the top-level module its
/// path starts with) against [`ALLOWED`], adding what it may not import to `violations`.
fn check_tree(
    dir: &Path,
    top: Option<&str>,
    prefixes: &[(&str, Option<&str>)],
    violations: &mut BTreeSet<String>,
) {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    for file in files {
        let rel = file.strip_prefix(dir).unwrap_or(&file);
        let top = match top {
            Some(t) => t.to_string(),
            None => rel
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .unwrap_or("")
                .trim_end_matches(".rs")
                .to_string(),
        };
        if matches!(top.as_str(), "lib" | "main" | "bin" | "layers") {
            continue;
        }
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| *m == top) else {
            violations.insert(format!("{top}: not in the layer table"));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            for (prefix, whole) in prefixes {
                for module in named_modules(line, prefix) {
                    // A path into another workspace crate names that crate as a whole.
                    let module = whole.map(str::to_string).unwrap_or(module);
                    if module != top && !allowed.contains(&module.as_str()) {
                        violations.insert(format!(
                            "{}:{}: {top} imports {module}",
                            file.display(),
                            n + 1
                        ));
                    }
                }
            }
        }
    }
}

#[test]
fn modules_import_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut violations = BTreeSet::new();
    check_tree(
        &root.join("src"),
        None,
        &[("crate::", None)],
        &mut violations,
    );
    // The simulators and the load generator reach the daemon only through its lower layers.
    let daemon = ("patterd::", None);
    let sim = ("patterd_sim::", Some("sim"));
    check_tree(
        &root.join("crates/patterd-sim/src"),
        Some("sim"),
        &[daemon],
        &mut violations,
    );
    check_tree(
        &root.join("crates/patterd-loadgen/src"),
        Some("loadgen"),
        &[daemon, sim],
        &mut violations,
    );
    assert!(
        violations.is_empty(),
        "imports against the layers of docs/ARCHITECTURE.md:\n{}",
        violations.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_layer_check_sees_the_other_crates() {
    // A path the sim may not take is caught, one it may take is not.
    let mut seen: Vec<String> =
        named_modules("use patterd::app::App; // crate::call", "patterd::").collect();
    assert_eq!(seen, ["app"]);
    seen = named_modules("let x = patterd::audio::g711::decode_ulaw(b);", "patterd::").collect();
    assert_eq!(seen, ["audio"]);
    let sim = ALLOWED.iter().find(|(m, _)| *m == "sim").map(|(_, a)| *a);
    assert!(sim.is_some_and(|a| a.contains(&"carrier") && !a.contains(&"app")));
}
