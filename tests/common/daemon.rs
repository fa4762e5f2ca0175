//! Runs the real `patterd` binary as a child process for tests: writes a config, starts it,
//! waits for its "serving" log line (JSON logs) and reads the bound address from it; signals,
//! log lines and a simulated Twilio call against it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use patterd_sim::deepgram::{FakeDeepgram, FakeDeepgramConfig};
use patterd_sim::elevenlabs::FakeElevenLabs;
use patterd_sim::hermes::FakeHermes;
use patterd_sim::twilio::SimTwilio;
use patterd_sim::twilio::call::{SimCall, SimCallConfig};
use patterd_sim::twilio::rest::FakeTwilioRest;
use patterd_sim::twilio::xml::parse_twiml;

pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    pub lines: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `patterd --config <file with config_text>`; `config_text` must use
    /// `listen = "127.0.0.1:0"` and `[log] format = "json"`.
    pub fn start(config_text: &str) -> Daemon {
        Self::start_with_env(config_text, &[])
    }

    /// [`Daemon::start`] with extra environment variables (e.g. systemd's `NOTIFY_SOCKET`).
    pub fn start_with_env(config_text: &str, env: &[(&str, &str)]) -> Daemon {
        Self::start_in(tempfile::tempdir().expect("tempdir"), config_text, env)
    }

    /// Starts `patterd` again with `config_text` on this daemon's data directory (its store,
    /// recordings), once this process is gone: killed here if it still runs.
    pub fn restart(mut self, config_text: &str) -> Daemon {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().expect("tempdir"));
        Self::start_in(dir, config_text, &[])
    }

    fn start_in(dir: tempfile::TempDir, config_text: &str, env: &[(&str, &str)]) -> Daemon {
        let path: PathBuf = dir.path().join("patter.toml");
        std::fs::write(&path, config_text).expect("write config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_patterd"))
            .arg("--config")
            .arg(&path)
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .envs(env.iter().copied())
            .env("PATTERD_SERVER__DATA_DIR", dir.path())
            // For configs that name it: data_dir = "${PATTERD_DATA_DIR}".
            .env("PATTERD_DATA_DIR", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn patterd");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("patterd did not report that it is serving");
            if line.contains("patterd is serving") {
                let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
                let listen = v["listen"].as_str().expect("listen field").to_string();
                break listen.parse().expect("listen address");
            }
        };
        Daemon {
            child,
            addr,
            lines: rx,
            _dir: dir,
        }
    }

    /// The daemon's `server.data_dir` (holds patterd.db); outlives the process.
    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The Twilio simulator, signing for this daemon (config from [`super::config_text`]).
    pub fn twilio(&self) -> SimTwilio {
        SimTwilio::new(
            &self.url(""),
            super::PUBLIC_URL,
            super::ACCOUNT_SID,
            super::AUTH_TOKEN,
        )
    }

    /// A whole inbound Twilio call to [`super::OUR_NUMBER`] from [`super::CALLER`] (config
    /// from [`super::config_text`]): signed webhook, TwiML, media stream opened.
    pub async fn call(&self) -> (String, SimCall) {
        let (call_sid, resp) = self
            .twilio()
            .incoming_call("/twilio/voice", super::CALLER, super::OUR_NUMBER)
            .await
            .expect("webhook request");
        let answer = parse_twiml(&resp.body).expect("TwiML parses");
        let cfg = SimCallConfig::new(
            &format!("ws://{}", self.addr),
            super::ACCOUNT_SID,
            &call_sid,
        );
        let sim = SimCall::from_answer(&answer, cfg)
            .await
            .expect("media stream opens");
        (call_sid, sim)
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    /// Waits for the process to exit, up to `timeout`; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for a log line containing `needle`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        self.wait_line_where(timeout, |l| l.contains(needle))
    }

    /// Waits for a log line for which `pred` holds (earlier lines are consumed).
    pub fn wait_line_where(
        &self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if pred(&l) => return Some(l),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fakes a child daemon talks to: Deepgram (hearing `transcripts` in order), ElevenLabs,
/// Hermes and Twilio's REST API.
pub struct Fakes {
    pub dg: FakeDeepgram,
    pub el: FakeElevenLabs,
    pub hermes: FakeHermes,
    pub rest: FakeTwilioRest,
}

impl Fakes {
    pub async fn start(transcripts: Vec<String>) -> Fakes {
        let dg = FakeDeepgram::start_with(FakeDeepgramConfig {
            api_key: super::DG_KEY.into(),
            transcripts,
            ..Default::default()
        })
        .await
        .expect("fake deepgram");
        Fakes {
            dg,
            el: FakeElevenLabs::start(super::EL_KEY)
                .await
                .expect("fake elevenlabs"),
            hermes: FakeHermes::start(super::HERMES_KEY)
                .await
                .expect("fake hermes"),
            rest: FakeTwilioRest::start(super::ACCOUNT_SID, super::AUTH_TOKEN)
                .await
                .expect("fake twilio rest"),
        }
    }

    /// [`super::config_text`] with the default options, pointing at these fakes.
    pub fn config_text(&self) -> String {
        super::config_text(
            &super::Opts::default(),
            &self.dg.base_url(),
            &self.el.base_url(),
            &self.hermes.base_url(),
            &self.rest.base_url,
            "",
        )
    }
}
