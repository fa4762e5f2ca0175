//! A PostgreSQL server for tests: the one `PATTERD_TEST_DATABASE_URL` names, or else a throwaway
//! server of the machine's own PostgreSQL binaries (Debian's `postgresql` package, which
//! `tests/setup.sh` installs), started once per test process on a free loopback port in a temp
//! directory (no fsync: nothing in it outlives the run) and stopped by a watchdog when the test
//! process exits. Each test takes a fresh database of its own ([`TestDatabase`]), dropped when it
//! goes, so tests run in parallel and against a long-lived server alike. Without PostgreSQL the
//! callers skip with a one-line reason, unless `PATTERD_REQUIRE_POSTGRES=1`, which makes a
//! missing server a failure (CI sets it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server, once per process: `(admin URL, the psql to run)`, or why there is none.
fn server() -> &'static Result<Server, String> {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("PATTERD_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Ok(Server {
            admin_url: url,
            psql: find_bin("psql").unwrap_or_else(|| PathBuf::from("psql")),
        }),
        _ => start_throwaway(),
    })
}

struct Server {
    admin_url: String,
    psql: PathBuf,
}

/// A PostgreSQL binary: on `PATH`, or in the newest `/usr/lib/postgresql/N/bin`.
fn find_bin(name: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    });
    on_path.or_else(|| {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin").join(name);
                bin.is_file().then_some((v, bin))
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, b)| b)
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs `program args…`, as `nobody` when we are root (PostgreSQL refuses to run as root).
fn run_as_owner(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

fn start_throwaway() -> Result<Server, String> {
    let (Some(initdb), Some(pg_ctl), Some(psql)) =
        (find_bin("initdb"), find_bin("pg_ctl"), find_bin("psql"))
    else {
        return Err(
            "no PostgreSQL server binaries (initdb, pg_ctl): run tests/setup.sh, \
                    or set PATTERD_TEST_DATABASE_URL"
                .into(),
        );
    };
    let dir = std::env::temp_dir().join(format!("patterd-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if is_root() {
        let ok = Command::new("chown")
            .args(["nobody"])
            .arg(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err(format!("cannot chown {} to nobody", dir.display()));
        }
    }
    let data = dir.join("data");
    let data_s = data.display().to_string();
    let out = run_as_owner(
        &initdb,
        &[
            "-D",
            &data_s,
            "-U",
            "patterd",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ],
    )
    .stdout(Stdio::null())
    .output()
    .map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))?;
    let options = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off -c synchronous_commit=off \
         -c full_page_writes=off -c max_connections=300",
        dir.display()
    );
    let log = dir.join("log").display().to_string();
    let out = run_as_owner(
        &pg_ctl,
        &["-D", &data_s, "-l", &log, "-w", "-o", &options, "start"],
    )
    .stdout(Stdio::null())
    .output()
    .map_err(|e| format!("pg_ctl: {e}"))?;
    if !out.status.success() {
        let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        return Err(format!(
            "pg_ctl start failed: {}{log}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // The watchdog: once this test process is gone, stop the server and remove its files.
    let stop = format!(
        "{}'{}' -D '{data_s}' -m immediate stop",
        if is_root() {
            "runuser -u nobody -- "
        } else {
            ""
        },
        pg_ctl.display()
    );
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        dir = dir.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("watchdog: {e}"))?;
    Ok(Server {
        admin_url: format!("postgres://patterd@127.0.0.1:{port}/postgres"),
        psql,
    })
}

/// The admin URL with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = match base.rfind('/') {
        Some(i) if base[..i].contains("//") && i > base.find("//").unwrap_or(0) + 1 => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// A database of a test's own, dropped (with any connection still open) when this goes.
pub struct TestDatabase {
    /// The URL patterd's `[store] url` takes.
    pub url: String,
    name: String,
}

impl TestDatabase {
    /// A fresh, empty database, or `None` (after saying why) when no PostgreSQL is available;
    /// panics instead under `PATTERD_REQUIRE_POSTGRES=1`.
    pub fn create() -> Option<Self> {
        let server = match server() {
            Ok(s) => s,
            Err(why) => {
                assert!(
                    std::env::var("PATTERD_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                    "PATTERD_REQUIRE_POSTGRES=1 but no PostgreSQL: {why}"
                );
                eprintln!("SKIPPED: no PostgreSQL for this test ({why})");
                return None;
            }
        };
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "patterd_test_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        psql(
            server,
            &server.admin_url,
            &format!("CREATE DATABASE {name}"),
        );
        Some(Self {
            url: with_database(&server.admin_url, &name),
            name,
        })
    }

    /// Runs one SQL statement in this database and returns psql's unaligned output.
    pub fn query(&self, sql: &str) -> String {
        psql(server().as_ref().expect("a server"), &self.url, sql)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Ok(server) = server() {
            let _ = Command::new(&server.psql)
                .args(["-X", "-q", "-d", &server.admin_url, "-c"])
                .arg(format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .output();
        }
    }
}

/// Runs `sql` in the database at `url` (stopping at the first error) and returns psql's
/// unaligned, tuples-only output.
fn psql(server: &Server, url: &str, sql: &str) -> String {
    let out = Command::new(&server.psql)
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
        ])
        .arg(sql)
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql: {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced() {
        assert_eq!(
            with_database("postgres://u@127.0.0.1:5432/postgres", "t1"),
            "postgres://u@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_database("postgres://u:p@h/postgres?sslmode=disable", "t2"),
            "postgres://u:p@h/t2?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://u@h:1", "t3"),
            "postgres://u@h:1/t3"
        );
    }
}
