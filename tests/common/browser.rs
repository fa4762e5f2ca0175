//! Headless Chromium for the tests of patterd's web pages, driven over WebDriver: a
//! `chromedriver` child bound to a free port and a `fantoccini` session in headless Chromium.
//! [`Browser::start`] returns `None` (after saying why) when the browser is not installed, so a
//! developer without it can still run the rest; with `PATTERD_REQUIRE_BROWSER=1` (CI sets it) a
//! missing browser fails the test instead. `tests/browser/setup.sh` installs it.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A headless Chromium session; the driver process is killed when this is dropped.
pub struct Browser {
    pub client: Client,
    _driver: Child,
}

fn required() -> bool {
    std::env::var("PATTERD_REQUIRE_BROWSER").is_ok_and(|v| v == "1")
}

fn installed(cmd: &str) -> bool {
    std::process::Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with `extra_args` added to the defaults
    /// (e.g. the fake-microphone flags). `None` when the browser is not installed and not
    /// required.
    pub async fn start(extra_args: &[&str]) -> Option<Browser> {
        if !installed("chromium") || !installed("chromedriver") {
            assert!(
                !required(),
                "PATTERD_REQUIRE_BROWSER=1 but chromium/chromedriver are not installed: run tests/browser/setup.sh"
            );
            eprintln!(
                "SKIPPED: headless Chromium is not installed (run tests/browser/setup.sh); \
                 this browser test did not run"
            );
            return None;
        }
        let mut driver = Command::new("chromedriver")
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let stdout = driver.stdout.take().expect("chromedriver stdout");
        let mut lines = BufReader::new(stdout).lines();
        let port: u16 = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("read chromedriver") {
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').trim().parse().ok();
                }
            }
            None
        })
        .await
        .expect("chromedriver did not start within 30 s")
        .expect("chromedriver did not say which port it listens on");
        // Keep draining its output so the driver never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ];
        args.extend_from_slice(extra_args);
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "args": args }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("open a Chromium session through chromedriver");
        Some(Browser {
            client,
            _driver: driver,
        })
    }

    /// Evaluates `script` (a function body: use `return …`) in the page.
    pub async fn eval(&self, script: &str) -> serde_json::Value {
        self.client
            .execute(script, vec![])
            .await
            .expect("run a script in the page")
    }

    /// Waits until `script` (a function body returning a boolean) is true, checking every
    /// 50 ms, for at most `limit`; panics with `what` when it never becomes true.
    pub async fn wait_for(&self, script: &str, limit: Duration, what: &str) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.eval(script).await == serde_json::Value::Bool(true) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ends the browser session (the driver goes when `self` is dropped).
    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
